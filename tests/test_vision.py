"""Tests for step 4a: picture preprocessing and the vision tower (ViT + resampler) that makes `input_vit`."""

import math
import struct
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn

from qwenvl_lab.modeling import QWEN_VL_CHAT_VISUAL
from qwenvl_lab.vision import (
    CLIP_MEAN,
    CLIP_STD,
    Resampler,
    VisionTransformer,
    VisualAttention,
    interpolate_pos_embed,
    load_image,
    preprocess_images,
    sincos_pos_embed_2d,
)

SIZE = 28


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def normalised(rgb) -> torch.Tensor:
    """CLIP-normalised value of each channel of a pure-colour picture, from the reference's constants."""
    mean = (0.48145466, 0.4578275, 0.40821073)
    std = (0.26862954, 0.26130258, 0.27577711)
    return torch.tensor([(v / 255 - m) / s for v, m, s in zip(rgb, mean, std)], dtype=torch.float64)


def solid(mode: str, colour, size=(20, 20)) -> Image.Image:
    return Image.new(mode, size, colour)


def palette_image(rgb) -> Image.Image:
    img = Image.new("P", (20, 20), 3)
    palette = [0] * 768
    palette[9:12] = rgb  # index 3
    img.putpalette(palette)
    return img


@pytest.mark.parametrize(
    "picture, rgb",
    [
        (solid("RGB", (255, 0, 128)), (255, 0, 128)),
        (solid("RGBA", (10, 200, 30, 0)), (10, 200, 30)),  # alpha is dropped, not blended
        (solid("L", 77), (77, 77, 77)),
        (palette_image((5, 250, 100)), (5, 250, 100)),
        (solid("CMYK", (0, 255, 255, 0)), (255, 0, 0)),  # pure red in CMYK
        (solid("RGB", (0, 0, 0), size=(90, 33)), (0, 0, 0)),  # not square
        (solid("RGB", (255, 255, 255), size=(7, 40)), (255, 255, 255)),
    ],
    ids=["rgb", "rgba", "l", "p", "cmyk", "wide", "tall"],
)
def test_pure_colour_pictures_normalise_to_clip_values(picture, rgb):
    pixels = preprocess_images([picture], SIZE)
    assert pixels.shape == (1, 3, SIZE, SIZE) and pixels.dtype == torch.float32
    expected = normalised(rgb).float()[:, None, None].expand(3, SIZE, SIZE)
    torch.testing.assert_close(pixels[0], expected, rtol=0, atol=1e-6)


def test_clip_constants_are_the_references():
    assert CLIP_MEAN == (0.48145466, 0.4578275, 0.40821073)
    assert CLIP_STD == (0.26862954, 0.26130258, 0.27577711)


def test_mixed_modes_and_sizes_batch(image_files):
    pictures = [
        solid("RGBA", (1, 2, 3, 4), (50, 10)),
        solid("L", 9),
        palette_image((1, 2, 3)),
        solid("CMYK", (10, 20, 30, 40), (11, 64)),
        image_files["noise"],
    ]
    pixels = preprocess_images(pictures, SIZE)
    assert pixels.shape == (5, 3, SIZE, SIZE)
    assert torch.equal(pixels[4], preprocess_images([image_files["noise"]], SIZE)[0])


def test_resize_is_bicubic_without_keeping_the_aspect(image_files):
    path = image_files["gradient"]  # 50 × 64, a vertical gradient
    with Image.open(path) as img:
        resized = np.asarray(img.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BICUBIC), dtype=np.float32)
    expected = (
        torch.from_numpy(resized / 255.0).permute(2, 0, 1) - torch.tensor(CLIP_MEAN)[:, None, None]
    ) / torch.tensor(CLIP_STD)[:, None, None]
    torch.testing.assert_close(preprocess_images([path], SIZE)[0], expected, rtol=0, atol=1e-6)


def test_paths_and_pil_images_give_the_same_pixels(image_files):
    path = image_files["noise"]
    with Image.open(path) as img:
        from_pil = preprocess_images([img.copy()], SIZE)
    assert torch.equal(preprocess_images([path], SIZE), from_pil)
    assert torch.equal(preprocess_images([str(path)], SIZE), from_pil)


def test_one_picture_needs_no_list(image_files):
    path = image_files["red"]
    expected = preprocess_images([path], SIZE)
    assert torch.equal(preprocess_images(path, SIZE), expected)
    assert torch.equal(preprocess_images(str(path), SIZE), expected)
    assert preprocess_images(solid("RGB", (1, 2, 3)), SIZE).shape == (1, 3, SIZE, SIZE)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "no-such-picture.png"
    with pytest.raises(FileNotFoundError, match="no-such-picture.png"):
        preprocess_images([missing], SIZE)


def test_directory_is_not_an_image(tmp_path):
    with pytest.raises(IsADirectoryError, match=r"is a directory"):
        load_image(tmp_path)
    with pytest.raises(IsADirectoryError, match=r"is a directory"):
        preprocess_images([str(tmp_path)], SIZE)


@pytest.mark.parametrize("image", [None, 3, ["a.png"]])
def test_image_of_a_wrong_type(image):
    with pytest.raises(TypeError, match="path .* or a PIL image"):
        load_image(image)
    with pytest.raises(ValueError, match="cannot read the 5 bytes given as an image"):
        load_image(b"a.png")  # bytes are a file's content, not its name


def test_non_image_file_is_a_clear_value_error(tmp_path):
    fake = tmp_path / "notes.png"
    fake.write_text("not a picture")
    with pytest.raises(ValueError, match=r"cannot read .*notes.png.* as an image"):
        preprocess_images([fake], SIZE)


def test_picture_too_large_to_decode(tmp_path):
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)  # 100,000 × 100,000 RGB
    (tmp_path / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
    with pytest.raises(ValueError, match=r"cannot read .*bomb.png.* as an image \(Image size \(10000000000 pixels\)"):
        load_image(tmp_path / "bomb.png")


def test_no_pictures():
    with pytest.raises(ValueError, match="no images given"):
        preprocess_images([], SIZE)


@pytest.fixture
def grey8() -> np.ndarray:
    """An 8-bit greyscale picture [H, W] with every level from black to white."""
    return np.random.default_rng(5).permutation(np.arange(256, dtype=np.uint8).repeat(3)).reshape(24, 32)


def test_16_bit_png_gives_the_pixels_of_its_8_bit_version(grey8, tmp_path):
    low_bits = np.random.default_rng(6).integers(0, 129, grey8.shape)  # below half an 8-bit step
    grey16 = np.minimum(grey8.astype(np.int64) * 257 + low_bits, 65535).astype(np.uint16)
    Image.fromarray(grey16).save(tmp_path / "g16.png")
    Image.fromarray(grey8).save(tmp_path / "g8.png")
    with Image.open(tmp_path / "g16.png") as img:
        assert img.mode == "I;16"
    expected = preprocess_images(tmp_path / "g8.png", SIZE)
    torch.testing.assert_close(preprocess_images(tmp_path / "g16.png", SIZE), expected, rtol=0, atol=1e-6)
    assert load_image(tmp_path / "g16.png").getextrema() == ((0, 255),) * 3  # not all white


def test_16_bit_pgm_read_in_mode_i(grey8, tmp_path):
    header = f"P5 {grey8.shape[1]} {grey8.shape[0]} 65535\n".encode()
    (tmp_path / "g.pgm").write_bytes(header + (grey8.astype(">u2") * 257).tobytes())
    with Image.open(tmp_path / "g.pgm") as img:
        assert img.mode == "I"
    assert np.array_equal(np.asarray(load_image(tmp_path / "g.pgm"))[..., 0], grey8)


def test_float_picture_is_read_from_0_to_1(grey8):
    picture = Image.fromarray(grey8.astype(np.float32) / 255.0, mode="F")
    torch.testing.assert_close(
        preprocess_images(picture, SIZE), preprocess_images(Image.fromarray(grey8), SIZE), rtol=0, atol=1e-6
    )
    out_of_range = Image.fromarray(np.array([[-0.5, 2.0]], dtype=np.float32), mode="F")
    assert np.asarray(load_image(out_of_range))[0, :, 0].tolist() == [0, 255]  # clipped
    with pytest.raises(ValueError, match="float picture holds NaN or infinite pixels"):
        load_image(Image.fromarray(np.array([[0.5, np.nan]], dtype=np.float32), mode="F"))


@pytest.fixture
def sideways_jpeg(tmp_path):
    """A 40 × 20 JPEG stored sideways, with EXIF orientation 6 (display it turned 90° clockwise)."""
    picture = Image.fromarray(np.random.default_rng(7).integers(0, 256, (20, 40, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    picture.save(tmp_path / "sideways.jpg", exif=exif, quality=95)
    return tmp_path / "sideways.jpg"


def test_exif_orientation_is_ignored_unless_asked(sideways_jpeg):
    with Image.open(sideways_jpeg) as img:
        assert img.getexif()[0x0112] == 6
        stored = img.convert("RGB")
    upright = stored.transpose(Image.Transpose.ROTATE_270)
    assert load_image(sideways_jpeg).size == (40, 20)  # as stored, like Qwen-VL
    assert load_image(sideways_jpeg, exif_transpose=True).size == (20, 40)
    assert torch.equal(preprocess_images(sideways_jpeg, SIZE), preprocess_images(stored, SIZE))
    turned = preprocess_images([sideways_jpeg], SIZE, exif_transpose=True)
    assert torch.equal(turned, preprocess_images(upright, SIZE))
    assert not torch.allclose(turned, preprocess_images(stored, SIZE), atol=0.1)
    with Image.open(sideways_jpeg) as img:  # a PIL image with its EXIF is turned the same way
        assert torch.equal(preprocess_images(img, SIZE, exif_transpose=True), turned)


def test_encode_takes_exif_transpose(tiny_model, sideways_jpeg):
    visual = tiny_model.transformer.visual
    with torch.no_grad():
        turned = visual.encode([sideways_jpeg], exif_transpose=True)
        assert torch.equal(turned, visual(preprocess_images([sideways_jpeg], visual.image_size, exif_transpose=True)))
        assert not torch.allclose(turned, visual.encode([sideways_jpeg]), atol=1e-3)


# attention layout: q|k|v interleaved per head


def manual_attention(x, weight, bias, out_proj, heads, interleaved):
    """Reference ViT self-attention over x [S, B, W], computed head by head."""
    seq, batch, width = x.shape
    hd = width // heads
    qkv = x @ weight.T + bias  # [S, B, 3W]
    outs = []
    for h in range(heads):
        if interleaved:  # [h0: q k v, h1: q k v, …]
            q, k, v = (qkv[..., h * 3 * hd + p * hd : h * 3 * hd + (p + 1) * hd] for p in range(3))
        else:  # [Q; K; V] blocks
            q, k, v = (qkv[..., p * width + h * hd : p * width + (h + 1) * hd] for p in range(3))
        scores = torch.einsum("sbd,tbd->bst", q, k) / math.sqrt(hd)
        outs.append(torch.einsum("bst,tbd->sbd", scores.softmax(-1), v))
    return out_proj(torch.cat(outs, dim=-1))


def test_visual_attention_interleaves_q_k_v_per_head():
    torch.manual_seed(0)
    attn = VisualAttention(width=12, heads=3)
    x = torch.randn(5, 2, 12, generator=seeded(1))  # [S, B, W]
    with torch.no_grad():
        out = attn(x)
        interleaved = manual_attention(x, attn.in_proj.weight, attn.in_proj.bias, attn.out_proj, 3, True)
        block = manual_attention(x, attn.in_proj.weight, attn.in_proj.bias, attn.out_proj, 3, False)
    torch.testing.assert_close(out, interleaved, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, block, atol=1e-3)  # the two layouts really differ


def test_visual_attention_equals_multihead_attention_with_rows_regrouped():
    torch.manual_seed(0)
    width, heads = 8, 2
    hd = width // heads
    attn = VisualAttention(width, heads)
    mha = nn.MultiheadAttention(width, heads)
    # block row p*W + h*hd + d  ←  interleaved row h*3hd + p*hd + d
    order = [h * 3 * hd + p * hd + d for p in range(3) for h in range(heads) for d in range(hd)]
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.in_proj.weight[order])
        mha.in_proj_bias.copy_(attn.in_proj.bias[order])
        mha.out_proj.load_state_dict(attn.out_proj.state_dict())
        x = torch.randn(6, 3, width, generator=seeded(2))
        torch.testing.assert_close(attn(x), mha(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5)


# positional embeddings


def mae_row(dim: int, row: int, col: int) -> list[float]:
    """MAE's 2-D sin-cos embedding of grid cell (row, col): [sin(col ω), cos(col ω), sin(row ω), cos(row ω)]."""
    quarter = dim // 4
    omega = [1.0 / 10000 ** (i / quarter) for i in range(quarter)]
    return (
        [math.sin(col * w) for w in omega]
        + [math.cos(col * w) for w in omega]
        + [math.sin(row * w) for w in omega]
        + [math.cos(row * w) for w in omega]
    )


def test_sincos_pos_embed_follows_the_mae_formula():
    dim, grid = 16, 5
    pos = sincos_pos_embed_2d(dim, grid)
    assert pos.shape == (grid * grid, dim) and pos.dtype == torch.float32
    for row, col in [(0, 0), (0, 1), (1, 0), (2, 3), (4, 4)]:
        expected = torch.tensor(mae_row(dim, row, col))
        torch.testing.assert_close(pos[row * grid + col], expected, rtol=0, atol=1e-6)
    assert pos[0].tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    # moving along a row changes only the first (column) half; moving down changes only the second half
    assert torch.equal(pos[1, 8:], pos[0, 8:]) and not torch.equal(pos[1, :8], pos[0, :8])
    assert torch.equal(pos[grid, :8], pos[0, :8]) and not torch.equal(pos[grid, 8:], pos[0, 8:])


def test_sincos_pos_embed_qwen_vl_size():
    pos = sincos_pos_embed_2d(4096, 16)  # the resampler's pos_embed [256, 4096]
    assert pos.shape == (256, 4096)
    torch.testing.assert_close(pos[17], torch.tensor(mae_row(4096, 1, 1)), rtol=0, atol=1e-6)
    assert pos.abs().max() <= 1.0


def test_interpolate_pos_embed():
    pos = torch.randn(256, 6, generator=seeded(3))
    assert torch.equal(interpolate_pos_embed(pos, 256), pos)  # identity at the same size
    assert interpolate_pos_embed(pos, 1024).shape == (1024, 6)  # 16×16 → 32×32 (448 px / 14)
    assert interpolate_pos_embed(pos, 16).shape == (16, 6)
    half = interpolate_pos_embed(pos.half(), 64)
    assert half.dtype == torch.float16 and half.shape == (64, 6)
    constant = interpolate_pos_embed(torch.full((256, 3), 0.25), 49)
    torch.testing.assert_close(constant, torch.full((49, 3), 0.25))
    expected = (
        F.interpolate(pos.reshape(1, 16, 16, 6).permute(0, 3, 1, 2), size=(4, 4), mode="bicubic", align_corners=False)
        .permute(0, 2, 3, 1)
        .reshape(16, 6)
    )
    torch.testing.assert_close(interpolate_pos_embed(pos, 16), expected)


def test_interpolate_pos_embed_needs_square_grids():
    with pytest.raises(ValueError, match="square grids"):
        interpolate_pos_embed(torch.zeros(256, 4), 200)
    with pytest.raises(ValueError, match="square grids"):
        interpolate_pos_embed(torch.zeros(250, 4), 256)


# the resampler


def test_resampler_matches_a_manual_cross_attention():
    torch.manual_seed(0)
    embed_dim, kv_dim, n_queries, patches = 8, 6, 4, 9
    resampler = Resampler(embed_dim, kv_dim, n_queries)
    with torch.no_grad():
        resampler.query.normal_(generator=seeded(4))
        resampler.ln_q.weight.uniform_(0.5, 1.5, generator=seeded(5))
        resampler.ln_kv.bias.uniform_(-0.5, 0.5, generator=seeded(6))
        x = torch.randn(2, patches, kv_dim, generator=seeded(7))  # [B, P, kv_dim]
        out = resampler(x)
        assert out.shape == (2, n_queries, embed_dim)
        pos = sincos_pos_embed_2d(embed_dim, 2)  # [4, D]
        key_pos = interpolate_pos_embed(pos, patches)  # [9, D]
        q = F.layer_norm(resampler.query, (embed_dim,), resampler.ln_q.weight, resampler.ln_q.bias, 1e-6) + pos
        kv = F.layer_norm(
            x @ resampler.kv_proj.weight.T, (embed_dim,), resampler.ln_kv.weight, resampler.ln_kv.bias, 1e-6
        )
        wq, wk, wv = resampler.attn.in_proj_weight.chunk(3)  # nn.MultiheadAttention: [Wq; Wk; Wv]
        bq, bk, bv = resampler.attn.in_proj_bias.chunk(3)
        scores = (q @ wq.T + bq) @ ((kv + key_pos) @ wk.T + bk).transpose(1, 2) / math.sqrt(embed_dim)
        expected = resampler.attn.out_proj(scores.softmax(-1) @ (kv @ wv.T + bv))  # values carry no position
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_resampler_heads_and_fixed_pos_embed():
    with torch.device("meta"):
        big = Resampler(4096, 1664)
    assert big.attn.num_heads == 32 and big.query.shape == (256, 4096) and big.kv_proj.weight.shape == (4096, 1664)
    small = Resampler(128, 64)
    assert small.attn.num_heads == 1
    assert not small.pos_embed.requires_grad
    assert torch.equal(small.pos_embed, sincos_pos_embed_2d(128, 16))


# the whole tower (weights of the tiny checkpoint)


def test_qwen_vl_chat_tower_shapes():
    with torch.device("meta"):
        tower = VisionTransformer(**QWEN_VL_CHAT_VISUAL)
    assert tower.conv1.weight.shape == (1664, 3, 14, 14)
    assert tower.positional_embedding.shape == (256, 1664)
    assert len(tower.transformer.resblocks) == 48
    assert tower.transformer.resblocks[0].mlp.c_fc.weight.shape == (8192, 1664)  # int(1664 × 4.9231)
    assert tower.transformer.resblocks[0].attn.in_proj.weight.shape == (3 * 1664, 1664)
    assert tower.proj.shape == (4096, 4096)


def test_tower_output_shape_and_encode(tiny_model, image_files):
    visual = tiny_model.transformer.visual
    paths = [image_files["red"], image_files["noise"]]
    with torch.no_grad():
        input_vit = visual.encode(paths)
        direct = visual(preprocess_images(paths, visual.image_size))
    assert input_vit.shape == (2, 256, tiny_model.config.visual["output_dim"])
    assert torch.equal(input_vit, direct)
    assert not torch.allclose(input_vit[0], input_vit[1], atol=1e-3)  # the picture matters
    assert torch.equal(visual.attn_pool.pos_embed, sincos_pos_embed_2d(128, 16))  # fixed, not learned


def test_tower_batch_consistency(tiny_model, image_files):
    visual = tiny_model.transformer.visual
    with torch.no_grad():
        alone = visual.encode([image_files["noise"]])
        batched = visual.encode([image_files["red"], image_files["noise"], image_files["gradient"]])
    torch.testing.assert_close(batched[1], alone[0], rtol=1e-5, atol=1e-5)


def test_tower_rejects_wrong_pixels(tiny_model):
    visual = tiny_model.transformer.visual
    with pytest.raises(ValueError, match=r"expected pixels \[B, 3, 56, 56\].*preprocess_images"):
        visual(torch.zeros(1, 3, 448, 448))
    with pytest.raises(ValueError, match="expected pixels"):
        visual(torch.zeros(3, 56, 56))


@pytest.mark.parametrize(
    "name, match",
    [
        ("x" * 252 + ".png", "a name in it is 256 bytes long, more than a file system allows"),
        ("图" * 90 + ".png", "a name in it is 274 bytes long"),  # 90 characters of 3 bytes each
        ("/".join(["d" * 200] * 25) + "/x.png", "more than this system allows: use a shorter path"),
    ],
    ids=["a 256-byte name", "a name of 90 CJK characters", "a 5,000-byte path"],
)
def test_a_path_the_system_cannot_look_at_is_named_with_what_to_change(name, match, tmp_path):
    """The system refuses to look (a name longer than 255 bytes was a raw `OSError: [Errno 36]`): a ValueError that
    says why, from the one picture reader, so from every way of asking."""
    with pytest.raises(ValueError, match=f"cannot use the image path .*: .*{match}"):
        load_image(tmp_path / name)
    with pytest.raises(ValueError, match="cannot use the image path"):
        preprocess_images([str(tmp_path / name)], SIZE)

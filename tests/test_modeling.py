"""Tests for step 6a: the QWen language model, its pieces, and the golden parity of the two image paths."""

import math

import pytest
import torch
import torch.nn.functional as F

from qwenvl_lab.checkpoint import TINY_CONFIG
from qwenvl_lab.fake_ids import make_fake_prompt_ids, replace_image_spans
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.modeling import (
    QWEN_VL_CHAT_VISUAL,
    QWenMLP,
    QWenVLConfig,
    RMSNorm,
    apply_rope,
    attention_bias,
    rope_cos_sin,
)
from qwenvl_lab.prompt_table import per_request_tables, ptuning_setup
from qwenvl_lab.tokenizing import ENDOFTEXT_ID, MODEL_VOCAB_SIZE, decode_image_path, make_context

NEW_TOKENS = 4


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# config


def test_config_defaults_are_qwen_vl_chat():
    config = QWenVLConfig()
    expected = dict(
        vocab_size=151936,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        intermediate_size=22016,
        kv_channels=128,
        rotary_pct=1.0,
        rotary_emb_base=10000,
        seq_length=2048,
        max_position_embeddings=8192,
        layer_norm_epsilon=1e-6,
        use_dynamic_ntk=True,
        use_logn_attn=True,
        no_bias=True,
        tie_word_embeddings=False,
        model_type="qwen",
        architectures=["QWenLMHeadModel"],
    )
    assert {k: getattr(config, k) for k in expected} == expected
    assert config.visual == dict(
        heads=16,
        image_size=448,
        image_start_id=151857,
        layers=48,
        mlp_ratio=4.9231,
        output_dim=4096,
        patch_size=14,
        width=1664,
    )
    assert config.visual == QWEN_VL_CHAT_VISUAL and config.visual is not QWEN_VL_CHAT_VISUAL  # a copy


def test_config_round_trip(tmp_path):
    config = QWenVLConfig(**TINY_CONFIG, rotary_pct=0.5, use_logn_attn=False)
    config.save_pretrained(tmp_path)
    loaded = QWenVLConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert loaded.visual == TINY_CONFIG["visual"] and loaded.rotary_pct == 0.5 and loaded.use_logn_attn is False


def test_config_checks_sizes():
    with pytest.raises(ValueError, match="kv_channels 64 × heads 3 must equal hidden_size 128"):
        QWenVLConfig(**{**TINY_CONFIG, "num_attention_heads": 3})
    with pytest.raises(ValueError, match="visual output_dim 64 must equal hidden_size 128"):
        QWenVLConfig(**{**TINY_CONFIG, "visual": {**TINY_CONFIG["visual"], "output_dim": 64}})


@pytest.mark.parametrize(
    "changes, error, match",
    [
        ({"hidden_size": "128"}, TypeError, "hidden_size must be an int, got str '128'"),
        ({"num_hidden_layers": 2.0}, TypeError, "num_hidden_layers must be an int, got float 2.0"),
        ({"num_attention_heads": 0}, ValueError, "num_attention_heads must be an int >= 1, got 0"),
        ({"vocab_size": True}, TypeError, "vocab_size must be an int, got bool"),
        ({"layer_norm_epsilon": 0.0}, ValueError, "layer_norm_epsilon must be a finite number > 0, got 0.0"),
        ({"layer_norm_epsilon": float("nan")}, ValueError, "layer_norm_epsilon must be a finite number > 0, got nan"),
        ({"layer_norm_epsilon": "1e-6"}, TypeError, "layer_norm_epsilon must be a number, got str"),
        ({"rotary_emb_base": -10000}, ValueError, "rotary_emb_base must be a finite number > 0"),
        ({"rotary_emb_base": float("inf")}, ValueError, "rotary_emb_base must be a finite number > 0"),
        ({"rotary_pct": 1.5}, ValueError, "rotary_pct must be a finite number > 0 and <= 1"),
        ({"rotary_pct": 0.01}, ValueError, "gives 0 rotary dims per head; RoPE needs an even number >= 2"),
        ({"use_logn_attn": "false"}, TypeError, "use_logn_attn must be true or false, got str"),
        ({"visual": [1, 2]}, TypeError, "visual must be a dict"),
        ({"visual": {"heads": 2}}, ValueError, r"visual lacks \['image_size', 'image_start_id'"),
    ],
)
def test_config_checks_types_and_values(changes, error, match):
    with pytest.raises(error, match=match):
        QWenVLConfig(**{**TINY_CONFIG, **changes})


@pytest.mark.parametrize(
    "changes, error, match",
    [
        ({"heads": "2"}, TypeError, "visual.heads must be an int, got str '2'"),
        ({"width": 64.0}, TypeError, "visual.width must be an int, got float"),
        ({"layers": -1}, ValueError, "visual.layers must be an int >= 1"),
        ({"mlp_ratio": float("nan")}, ValueError, "visual.mlp_ratio must be a finite number > 0"),
        ({"mlp_ratio": "2"}, TypeError, "visual.mlp_ratio must be a number, got str"),
        ({"image_start_id": None}, TypeError, "visual.image_start_id must be an int, got NoneType"),
        ({"heads": 3}, ValueError, "visual.width 64 must be a multiple of visual.heads 3"),
        ({"patch_size": 60}, ValueError, "visual.patch_size 60 exceeds visual.image_size 56"),
    ],
)
def test_config_checks_the_visual_fields(changes, error, match):
    with pytest.raises(error, match=match):
        QWenVLConfig(**{**TINY_CONFIG, "visual": {**TINY_CONFIG["visual"], **changes}})


def test_config_checks_the_resampler_heads():
    # output_dim 260 → 2 resampler heads of 130: fine; 388 → 3 heads do not divide it
    with pytest.raises(ValueError, match=r"visual.output_dim 388 must be a multiple of 4 .* resampler's 3 heads"):
        QWenVLConfig(
            **{
                **TINY_CONFIG,
                "hidden_size": 388,
                "kv_channels": 194,
                "visual": {**TINY_CONFIG["visual"], "output_dim": 388},
            }
        )
    assert (
        QWenVLConfig(
            **{
                **TINY_CONFIG,
                "hidden_size": 260,
                "kv_channels": 130,
                "visual": {**TINY_CONFIG["visual"], "output_dim": 260},
            }
        ).hidden_size
        == 260
    )


# RMSNorm, RoPE, MLP, mask


def test_rmsnorm():
    norm = RMSNorm(6, eps=1e-6)
    x = torch.randn(3, 6, generator=seeded(0)) * 5
    y = norm(x)
    torch.testing.assert_close(y.pow(2).mean(-1), torch.ones(3))  # unit root-mean-square
    torch.testing.assert_close(norm(x * 7.5), y)  # scale invariant
    with torch.no_grad():
        norm.weight.copy_(torch.arange(6.0))
    torch.testing.assert_close(norm(x), y * torch.arange(6.0))
    torch.testing.assert_close(norm(x), x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.arange(6.0))


def test_rmsnorm_computes_in_float32():
    norm = RMSNorm(4, eps=1e-6).half()
    x = torch.tensor([[300.0, -200.0, 100.0, 50.0]], dtype=torch.float16)  # x² overflows in float16
    y = norm(x)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), norm.float()(x.float()), rtol=1e-3, atol=1e-3)


def test_rope_position_zero_is_identity_and_rotation_keeps_the_norm():
    dim = 8
    x = torch.randn(2, 3, 5, dim, generator=seeded(1))  # [B, heads, L, hd]
    positions = torch.tensor([[0, 1, 2, 7, 100], [0, 0, 5, 6, 2047]])
    cos, sin = rope_cos_sin(positions, dim, 10000, torch.float32)
    assert cos.shape == sin.shape == (2, 1, 5, dim)
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])  # position 0
    torch.testing.assert_close(y[1, :, 1], x[1, :, 1])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    assert not torch.allclose(y[:, :, 2:], x[:, :, 2:])


def test_rope_is_neox_rotate_half():
    dim, base, pos = 4, 10000, 3
    x = torch.tensor([[[[1.0, 2.0, 3.0, 4.0]]]])
    cos, sin = rope_cos_sin(torch.tensor([[pos]]), dim, base, torch.float32)
    angles = [pos / base ** (0 / dim), pos / base ** (2 / dim)]  # pairs (x0, x2) and (x1, x3)
    expected = [
        1 * math.cos(angles[0]) - 3 * math.sin(angles[0]),
        2 * math.cos(angles[1]) - 4 * math.sin(angles[1]),
        3 * math.cos(angles[0]) + 1 * math.sin(angles[0]),
        4 * math.cos(angles[1]) + 2 * math.sin(angles[1]),
    ]
    torch.testing.assert_close(apply_rope(x, cos, sin).flatten(), torch.tensor(expected))


def test_rope_scores_depend_on_relative_position_only():
    dim = 8
    q, k = torch.randn(dim, generator=seeded(2)), torch.randn(dim, generator=seeded(3))

    def score(m, n):
        cos, sin = rope_cos_sin(torch.tensor([[m, n]]), dim, 10000, torch.float32)
        rotated = apply_rope(torch.stack([q, k])[None, None], cos, sin)[0, 0]
        return rotated[0] @ rotated[1]

    torch.testing.assert_close(score(5, 2), score(13, 10))
    torch.testing.assert_close(score(0, 0), q @ k)


def test_partial_rope_leaves_the_other_dims():
    x = torch.randn(1, 1, 3, 8, generator=seeded(4))
    cos, sin = rope_cos_sin(torch.tensor([[0, 4, 9]]), 4, 10000, torch.float32)
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    torch.testing.assert_close(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1))


def make_mlp() -> QWenMLP:
    torch.manual_seed(5)
    return QWenMLP(QWenVLConfig(**TINY_CONFIG))


def test_mlp_width_is_half_the_intermediate_size_and_has_no_bias():
    mlp = make_mlp()
    assert mlp.w1.weight.shape == mlp.w2.weight.shape == (256, 128)
    assert mlp.c_proj.weight.shape == (128, 256)
    assert mlp.w1.bias is None and mlp.w2.bias is None and mlp.c_proj.bias is None


def test_mlp_w2_is_the_gate():
    mlp = make_mlp()
    x = torch.randn(4, 128, generator=seeded(6))
    with torch.no_grad():
        expected = (x @ mlp.w1.weight.T * F.silu(x @ mlp.w2.weight.T)) @ mlp.c_proj.weight.T
        torch.testing.assert_close(mlp(x), expected)
        swapped = (F.silu(x @ mlp.w1.weight.T) * (x @ mlp.w2.weight.T)) @ mlp.c_proj.weight.T
        assert not torch.allclose(mlp(x), swapped, atol=1e-4)
        mlp.w1.weight.zero_()  # no up projection: nothing comes out whatever the gate says
        assert not mlp(x).any()


def test_attention_bias_is_causal_and_masks_padding():
    lowest = torch.finfo(torch.float32).min
    bias = attention_bias(None, 3, 0, torch.float32, "cpu")
    assert bias.shape == (1, 1, 3, 3)
    assert (bias[0, 0] == 0).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert (bias[bias != 0] == lowest).all()
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    bias = attention_bias(mask, 2, 2, torch.float32, "cpu")  # 2 new tokens after 2 cached ones
    assert bias.shape == (2, 1, 2, 4)
    assert (bias[0, 0] == 0).tolist() == [[False, True, True, False], [False, True, True, True]]
    assert (bias[1, 0] == 0).tolist() == [[True, True, True, False], [True, True, True, True]]


# the model: both image paths


def chat_ids(tokenizer, content) -> torch.Tensor:
    """Context ids of a one-turn chat built the official way (from_list_format + make_context)."""
    _, context_tokens = make_context(tokenizer, tokenizer.from_list_format(content))
    return torch.tensor([context_tokens])


def prompt_table_inputs(model, ids: torch.Tensor, attention_mask=None):
    """TensorRT-LLM's inputs for the same prompt: fake ids + (prompt_table, tasks, task_vocab_size) from visual.encode."""
    img_pos = locate_img_pos(ids)
    paths = [decode_image_path(ids[i, a + 1 : b]) for i, a, b in img_pos.tolist()]
    input_vit = model.transformer.visual.encode(paths)  # [N, 256, H]
    fake_ids = replace_image_spans(ids, img_pos, make_fake_prompt_ids(model.config.vocab_size, len(paths)))
    prompt_table, tasks, task_vocab_size = ptuning_setup(
        input_vit, model.dtype, model.config.hidden_size, input_ids=fake_ids
    )
    return fake_ids, dict(prompt_table=prompt_table, tasks=tasks, task_vocab_size=task_vocab_size)


def left_pad(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded batch of [1, L_i] rows and its attention_mask."""
    length = max(r.shape[1] for r in rows)
    ids = torch.full((len(rows), length), ENDOFTEXT_ID)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, length - r.shape[1] :] = r[0]
        mask[i, length - r.shape[1] :] = 1
    return ids, mask


def greedy(model, ids, **kwargs) -> torch.Tensor:
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=ENDOFTEXT_ID, **kwargs)
    return out[:, ids.shape[1] :]


@pytest.fixture(scope="module")
def one_image(tokenizer, image_files):
    return chat_ids(tokenizer, [{"image": str(image_files["noise"])}, {"text": "What is in the picture?"}])


@pytest.fixture(scope="module")
def two_images(tokenizer, image_files):
    return chat_ids(
        tokenizer,
        [{"image": str(image_files["red"])}, {"image": str(image_files["gradient"])}, {"text": "Which one is red?"}],
    )


def test_golden_one_image_same_logits_and_greedy_tokens(tiny_model, one_image):
    assert one_image.shape[1] > 258 and (one_image == 151857).sum() == 1
    with torch.no_grad():
        original = tiny_model(one_image).logits  # reads the picture named in the span
        fake_ids, table = prompt_table_inputs(tiny_model, one_image)
        assert fake_ids.max() >= MODEL_VOCAB_SIZE
        via_table = tiny_model(fake_ids, **table).logits
        assert original.shape == via_table.shape == (*one_image.shape, MODEL_VOCAB_SIZE)
        assert original.dtype == torch.float32
        assert (via_table - original).abs().max() < 1e-4  # (assert_close is slow on 40 M logits)
        # the picture really entered the sequence: embedding the path bytes as text gives other logits
        as_text = tiny_model(inputs_embeds=tiny_model.transformer.wte(one_image), logits_to_keep=1).logits
        assert not torch.allclose(as_text[:, -1], original[:, -1], atol=1e-3)
        assert torch.equal(greedy(tiny_model, fake_ids, **table), greedy(tiny_model, one_image))


def test_golden_two_images_in_one_prompt(tiny_model, two_images):
    assert (two_images == 151857).sum() == 2
    with torch.no_grad():
        fake_ids, table = prompt_table_inputs(tiny_model, two_images)
        assert table["prompt_table"].shape == (512, 128)
        original, _ = tiny_model.transformer(two_images)
        via_table, _ = tiny_model.transformer(fake_ids, **table)
        torch.testing.assert_close(via_table, original, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(
            tiny_model(fake_ids, logits_to_keep=8, **table).logits,
            tiny_model(two_images, logits_to_keep=8).logits,
            rtol=1e-4,
            atol=1e-4,
        )
        assert torch.equal(greedy(tiny_model, fake_ids, **table), greedy(tiny_model, two_images))


def test_golden_left_padded_batch_matches_unpadded_rows(tiny_model, one_image, two_images):
    rows = [one_image, two_images]
    ids, mask = left_pad(rows)
    pad = [ids.shape[1] - r.shape[1] for r in rows]
    assert pad[0] > 0 and pad[1] == 0
    with torch.no_grad():
        fake_ids, table = prompt_table_inputs(tiny_model, ids)
        assert table["prompt_table"].shape == (3 * 256, 128)
        batch_original, _ = tiny_model.transformer(ids, attention_mask=mask)
        batch_table, _ = tiny_model.transformer(fake_ids, attention_mask=mask, **table)
        for i, row in enumerate(rows):
            alone, _ = tiny_model.transformer(row)
            torch.testing.assert_close(batch_original[i, pad[i] :], alone[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(batch_table[i, pad[i] :], alone[0], rtol=1e-4, atol=1e-4)
        alone_tokens = torch.cat([greedy(tiny_model, row) for row in rows])
        assert torch.equal(greedy(tiny_model, ids, attention_mask=mask), alone_tokens)
        assert torch.equal(greedy(tiny_model, fake_ids, attention_mask=mask, **table), alone_tokens)


def test_per_request_tables_through_the_model(tiny_model, one_image, two_images):
    """In-flight-batching convention (ids restart per request, tasks = position in the batch) gives the same hidden states."""
    ids, mask = left_pad([one_image, two_images])
    with torch.no_grad():
        _, single = prompt_table_inputs(tiny_model, ids)
        input_vit = single["prompt_table"].reshape(3, 256, -1)
        fake_ids, prompt_table, tasks, rows = per_request_tables(ids, input_vit, MODEL_VOCAB_SIZE)
        assert rows == 512 and tasks.tolist() == [0, 1]
        expected, _ = tiny_model.transformer(ids, attention_mask=mask)
        hidden, _ = tiny_model.transformer(
            fake_ids, attention_mask=mask, prompt_table=prompt_table, tasks=tasks, task_vocab_size=rows
        )
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)


def test_beam_search_with_a_prompt_table(tiny_model, one_image):
    seen = []

    def record(module, args, kwargs):
        if kwargs.get("prompt_table") is not None:
            seen.append((kwargs["prompt_table"].shape, kwargs["tasks"].shape))

    with torch.no_grad():
        fake_ids, table = prompt_table_inputs(tiny_model, one_image)
        handle = tiny_model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            via_table = tiny_model.generate(
                fake_ids, max_new_tokens=NEW_TOKENS, num_beams=3, do_sample=False, pad_token_id=ENDOFTEXT_ID, **table
            )
        finally:
            handle.remove()
        original = tiny_model.generate(
            one_image, max_new_tokens=NEW_TOKENS, num_beams=3, do_sample=False, pad_token_id=ENDOFTEXT_ID
        )
    assert torch.equal(via_table[:, fake_ids.shape[1] :], original[:, one_image.shape[1] :])
    assert via_table.shape == (1, fake_ids.shape[1] + NEW_TOKENS)
    # every step saw the one shared table (not copied per beam) and one task per beam
    assert seen and all(shape == (256, 128) and tasks == (3,) for shape, tasks in seen)


def test_sampling_with_a_prompt_table_draws_the_same_tokens(tiny_model, one_image):
    with torch.no_grad():
        fake_ids, table = prompt_table_inputs(tiny_model, one_image)
        sampled = []
        for ids, kwargs in ((fake_ids, table), (one_image, {})):
            torch.manual_seed(3)
            out = tiny_model.generate(
                ids,
                max_new_tokens=NEW_TOKENS,
                do_sample=True,
                top_k=0,
                top_p=0.9,
                temperature=2.0,
                pad_token_id=ENDOFTEXT_ID,
                **kwargs,
            )
            sampled.append(out[:, ids.shape[1] :])
    assert torch.equal(sampled[0], sampled[1])


def test_incremental_decoding_matches_the_full_forward(tiny_model, one_image):
    with torch.no_grad():
        fake_ids, table = prompt_table_inputs(tiny_model, one_image)
        full = tiny_model(fake_ids, logits_to_keep=6, **table).logits
        split = fake_ids.shape[1] - 6  # the image span lies in the first part
        first = tiny_model(fake_ids[:, :split], use_cache=True, logits_to_keep=1, **table)
        second = tiny_model(fake_ids[:, split:], cache=first.cache, use_cache=True, **table)
    torch.testing.assert_close(second.logits, full, rtol=1e-4, atol=1e-4)
    assert second.cache.get_seq_length() == fake_ids.shape[1]


def test_fake_ids_without_a_table_are_an_error(tiny_model):
    ids = torch.tensor([[1, 2, MODEL_VOCAB_SIZE + 3]])
    with pytest.raises(ValueError, match="fake prompt ids .* no prompt_table was given.*ptuning_setup"):
        tiny_model(ids)


def test_fake_id_past_the_table_is_an_error(tiny_model):
    table, tasks, task_vocab_size = ptuning_setup(torch.zeros(1, 256, 128), "float32", 128, input_ids=[[1]])
    with pytest.raises(ValueError, match="reads prompt-table row 256, but the table has 256 rows"):
        tiny_model(
            torch.tensor([[1, MODEL_VOCAB_SIZE + 256]]),
            prompt_table=table,
            tasks=tasks,
            task_vocab_size=task_vocab_size,
        )


def test_sequence_longer_than_seq_length_is_an_error(tiny_model):
    assert tiny_model.config.seq_length == 2048
    with torch.no_grad():
        assert tiny_model(torch.ones(1, 2048, dtype=torch.long), logits_to_keep=1).logits.shape == (1, 1, 151936)
        with pytest.raises(ValueError, match="2049 tokens exceed seq_length 2048"):
            tiny_model(torch.ones(1, 2049, dtype=torch.long))

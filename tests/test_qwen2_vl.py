"""transformers' Qwen2-VL, run for real beside the course: its ids, span lengths, merge and M-RoPE positions, and the
four injections (prompt table, TensorRT-LLM's PyTorch backend, vLLM, transformers) giving bit-identical embeddings."""

import pytest
import torch
from PIL import Image
from transformers import Qwen2VLConfig

from qwenvl_lab.chat import answer_text
from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.engine import ModelRunner
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.placeholder_merge import (
    TLLM_SENTINEL_OFFSET,
    fuse_input_embeds,
    merge_multimodal_embeddings,
    span_mask,
    vllm_qwen_vl_ids,
    write_placeholders,
)
from qwenvl_lab.prompt_table import per_request_tables, prompt_tuning_embedding, single_table_batch
from qwenvl_lab.qwen2_vl import (
    IMAGE_TOKEN_ID,
    QWEN2_VL_SPECIAL_IDS,
    VISION_END_ID,
    VISION_START_ID,
    image_inputs,
    image_token_count,
    merged_input_embeds,
    qwen2_vl_decode,
    qwen2_vl_prompt,
    rope_positions,
    tiny_qwen2_vl,
)
from qwenvl_lab.tokenizing import IM_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, make_context
from qwenvl_lab.toy import DATA_DIR, TOY_DIR

IMAGES = DATA_DIR / "images"


@pytest.fixture(scope="module")
def toy():
    return load_checkpoint(TOY_DIR, dtype=torch.float32).requires_grad_(False)


@pytest.fixture(scope="module")
def qwen2_vl(toy):
    """A tiny random Qwen2VLModel whose word embedding is the toy model's."""
    return tiny_qwen2_vl(toy.transformer.wte.weight)


def test_the_special_ids_are_transformers_qwen2vlconfig_defaults():
    config = Qwen2VLConfig()
    assert (config.vision_start_token_id, config.vision_end_token_id, config.image_token_id) == (
        VISION_START_ID,
        VISION_END_ID,
        IMAGE_TOKEN_ID,
    )
    assert config.video_token_id == QWEN2_VL_SPECIAL_IDS["<|video_pad|>"]
    assert config.text_config.bos_token_id == QWEN2_VL_SPECIAL_IDS["<|endoftext|>"]
    assert config.text_config.eos_token_id == QWEN2_VL_SPECIAL_IDS["<|im_end|>"] == IM_END_ID


@pytest.mark.parametrize(
    "size, grid, tokens",
    [
        ((224, 224), (1, 16, 16), 64),
        ((448, 448), (1, 32, 32), 256),
        ((640, 360), (1, 26, 46), 299),
        ((112, 112), (1, 8, 8), 16),
    ],
)
def test_the_span_follows_the_picture_size_in_transformers_image_processor(size, grid, tokens, qwen2_vl):
    inputs = image_inputs([Image.new("RGB", size, (200, 30, 30))])
    assert tuple(inputs["image_grid_thw"][0].tolist()) == grid
    assert image_token_count(inputs["image_grid_thw"][0]) == tokens
    with torch.inference_mode():  # the vision tower gives as many rows as the prompt holds placeholders
        rows = qwen2_vl.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
    assert [tuple(r.shape) for r in rows] == [(tokens, qwen2_vl.config.text_config.hidden_size)]


def test_the_prompt_is_chatml_with_a_vision_block_before_the_question(tokenizer):
    ids = qwen2_vl_prompt(tokenizer, "图片里是什么？", [64, 3])
    plain = make_context(tokenizer, "图片里是什么？")[1]
    block = [
        VISION_START_ID,
        *[IMAGE_TOKEN_ID] * 64,
        VISION_END_ID,
        VISION_START_ID,
        *[IMAGE_TOKEN_ID] * 3,
        VISION_END_ID,
    ]
    at = (
        len(make_context(tokenizer, "")[1]) - 5
    )  # the empty question's ids end with <|im_end|> \n <|im_start|> assistant \n
    assert ids == plain[:at] + block + plain[at:]
    text = qwen2_vl_decode(tokenizer, ids)
    assert (
        "<|im_start|>user\n<|vision_start|><|image_pad|>" in text and "<|vision_end|>图片里是什么？<|im_end|>" in text
    )
    assert qwen2_vl_decode(tokenizer, [151654, 9370]) == "<|id_151654|>" + tokenizer.decode([9370])


def four_ways(wte, qwen2_vl, ids, start_id, features):
    """Input embeddings [B, L, H] of (a) the prompt table, (b) TensorRT-LLM's sentinel, (c) vLLM's <imgpad> mask,
    (d) transformers' image_token_id merge, for the same ids outside the image positions (`start_id`: the id opening
    each image span, closed by start_id + 1)."""
    vocab = wte.num_embeddings
    is_image = span_mask(ids, locate_img_pos(ids, start_id, span=None))
    fake, table, tasks, size = single_table_batch(ids, features, vocab, image_start_id=start_id)
    a = prompt_tuning_embedding(fake, wte.weight, table, tasks, size, vocab)
    sentinel = write_placeholders(ids, is_image, vocab + TLLM_SENTINEL_OFFSET)
    _, b = fuse_input_embeds(wte, sentinel.reshape(-1), features)
    padded = write_placeholders(ids, is_image, IMAGE_PAD_ID)
    c = merge_multimodal_embeddings(padded, wte(padded).clone(), features, IMAGE_PAD_ID)
    d = merged_input_embeds(qwen2_vl, write_placeholders(ids, is_image, IMAGE_TOKEN_ID), features)
    return {"prompt table": a, "TensorRT-LLM PyTorch": b.reshape(a.shape), "vLLM": c, "transformers": d}


def chat(tokenizer, pictures, question):
    query = tokenizer.from_list_format([*({"image": str(p)} for p in pictures), {"text": question}])
    return make_context(tokenizer, query)[1]


@torch.inference_mode()
def test_four_injections_give_the_toy_model_identical_embeddings_and_answers(toy, qwen2_vl, tokenizer):
    pictures = [IMAGES / "red_circle.png", IMAGES / "blue_square.png", IMAGES / "green_triangle.png"]
    rows = [chat(tokenizer, pictures[:1], "图片里是什么？"), chat(tokenizer, pictures[1:], "What is in the pictures?")]
    width = max(map(len, rows))
    ids = torch.tensor([[151643] * (width - len(r)) + r for r in rows])  # [2, L], left padded
    img_pos = locate_img_pos(ids)
    input_vit = toy.transformer.visual.encode(pictures)  # [3, 256, H]
    ways = four_ways(toy.transformer.wte, qwen2_vl, ids, IMAGE_START_ID, list(input_vit))
    reference = ways.pop("prompt table")
    assert reference.dtype == torch.float32
    assert {name: torch.equal(e, reference) for name, e in ways.items()} == dict.fromkeys(ways, True)
    assert torch.equal(reference[span_mask(ids, img_pos)], input_vit.reshape(-1, input_vit.shape[-1]))
    # (a) is the course's run.py table, and (c)'s ids are what vLLM makes of the course's prompt
    fake = single_table_batch(ids, input_vit, toy.config.vocab_size)[0]
    assert torch.equal(fake, single_table_batch(ids, list(input_vit), 151936)[0])
    assert vllm_qwen_vl_ids(ids[0]) == write_placeholders(ids, span_mask(ids, img_pos), IMAGE_PAD_ID)[0].tolist()
    # the same answer: greedy decoding from each injection's embeddings (request 0)
    answers = set()
    for embeds in [reference, *ways.values()]:
        new = toy.generate(
            inputs_embeds=embeds[:1, width - len(rows[0]) :],
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=IM_END_ID,
            pad_token_id=IM_END_ID,
        )
        answers.add(answer_text(tokenizer, new[0]))
    assert answers == {"一个红色的圆形。"}


@torch.inference_mode()
def test_four_injections_agree_on_random_tables_with_spans_of_different_lengths(tokenizer):
    gen = torch.Generator().manual_seed(3)
    wte = torch.nn.Embedding(151936, 16).requires_grad_(False)
    wte.weight.copy_(torch.randn(151936, 16, generator=gen))
    rows = [
        qwen2_vl_prompt(tokenizer, "图片里是什么？", [64]),
        qwen2_vl_prompt(tokenizer, "两张图有什么不同？", [299, 64]),
    ]
    width = max(map(len, rows))
    ids = torch.tensor([[151643] * (width - len(r)) + r for r in rows])  # two spans of 64 and one of 299 ids
    features = [torch.randn(n, 16, generator=gen) for n in (64, 299, 64)]
    ways = four_ways(wte, tiny_qwen2_vl(wte.weight), ids, VISION_START_ID, features)
    reference = ways.pop("prompt table")
    assert all(torch.equal(e, reference) for e in ways.values())
    assert torch.equal(reference[1, ids[1] == IMAGE_TOKEN_ID], torch.cat(features[1:]))  # in order within a row


def test_mrope_gives_image_tokens_a_grid_and_the_text_after_it_a_short_step(qwen2_vl, tokenizer):
    ids = torch.tensor([qwen2_vl_prompt(tokenizer, "图片里是什么？", [64])])
    first = int((ids[0] == IMAGE_TOKEN_ID).nonzero()[0])
    positions, delta = rope_positions(qwen2_vl, ids, [[1, 16, 16]])  # a 224×224 picture: an 8×8 grid after merging
    t, h, w = positions[:, 0, first : first + 64]
    assert set(t.tolist()) == {first}  # one moment (a picture, not a video)
    assert h.tolist() == [first + r for r in range(8) for _ in range(8)] and w.tolist() == [
        first + c for _ in range(8) for c in range(8)
    ]
    assert positions[:, 0, first - 1].tolist() == [first - 1] * 3  # <|vision_start|>: an ordinary 1-D position
    assert positions[:, 0, first + 64].tolist() == [first + 8] * 3  # <|vision_end|>: 8 steps on, not 64
    assert int(delta) == 8 - 64  # the sequence is 56 positions shorter than it is long


BAD_INPUT = [
    (
        lambda m, t: merged_input_embeds(m, [[1, IMAGE_TOKEN_ID, 2]], [torch.zeros(3, 128)]),
        ValueError,
        "Image features and image tokens do not match",
    ),  # transformers' own check
    (lambda m, t: tiny_qwen2_vl(torch.zeros(3)), ValueError, "vocab_embedding must be"),
    (lambda m, t: qwen2_vl_prompt(t, "?", [0]), ValueError, "image tokens must be an int >= 1"),
    (lambda m, t: qwen2_vl_prompt(t, 5, [4]), TypeError, "query must be a str"),
    (lambda m, t: image_inputs([]), ValueError, "at least one picture"),
    (lambda m, t: image_inputs(["no-such-picture.png"]), FileNotFoundError, "no-such-picture.png"),
    (lambda m, t: image_token_count([16, 16]), ValueError, "grid_thw must be"),
]


@pytest.mark.parametrize("call, error, message", BAD_INPUT)
def test_bad_input_is_refused_with_what_to_do(call, error, message, qwen2_vl, tokenizer):
    with pytest.raises(error, match=message):
        call(qwen2_vl, tokenizer)


def test_one_picture_needs_no_list():
    picture = Image.new("RGB", (224, 224))
    assert torch.equal(image_inputs(picture)["image_grid_thw"], image_inputs([picture])["image_grid_thw"])


@torch.inference_mode()
@pytest.mark.parametrize("convention", [per_request_tables, single_table_batch], ids=lambda f: f.__name__)
def test_spans_of_different_lengths_through_the_engine_equal_transformers_qwen2_vl_merge(
    convention, tiny_engine, tokenizer, monkeypatch
):
    """Two requests in one batch, pictures whose spans hold 40, 97 and 40 ids (Qwen2-VL's way: the span follows the
    picture), go through the course's table builder and the engine's own lookup; the embeddings the engine decodes
    from equal, bit for bit in float32, what transformers' Qwen2-VL merge writes for the same features."""
    runner = ModelRunner.from_dir(tiny_engine)
    wte = runner.engine.vocab_embedding  # [V, H] float32
    rows = [
        qwen2_vl_prompt(tokenizer, "图片里是什么？", [40]),
        qwen2_vl_prompt(tokenizer, "两张图有什么不同？", [97, 40]),
    ]
    width = max(map(len, rows))
    ids = torch.tensor([[151643] * (width - len(r)) + r for r in rows])  # [2, L], left padded
    gen = torch.Generator().manual_seed(5)
    features = [torch.randn(n, wte.shape[1], generator=gen) for n in (40, 97, 40)]
    fake, table, tasks, task_vocab_size = convention(ids, features, runner.vocab_size, image_start_id=VISION_START_ID)
    seen = []
    embed = runner._embed
    monkeypatch.setattr(runner, "_embed", lambda *args: seen.append(embed(*args)) or seen[-1])
    runner.generate(
        [fake[r, width - len(row) :] for r, row in enumerate(rows)],
        prompt_table=table,
        prompt_tasks=tasks,
        task_vocab_size=torch.tensor([task_vocab_size]),
        max_new_tokens=1,
        end_id=IM_END_ID,
        pad_id=IM_END_ID,
    )
    qwen2_vl = tiny_qwen2_vl(wte)
    merged = merged_input_embeds(qwen2_vl, torch.where(fake >= runner.vocab_size, IMAGE_TOKEN_ID, ids), features)
    assert [e.dtype for e in seen] == [torch.float32] * 2
    for r, row in enumerate(rows):
        assert torch.equal(seen[r], merged[r, width - len(row) :]), f"request {r}"

"""QWenInfer.qwen_infer: pictures and a question in, the answer out — the same answer the original Qwen-VL path gives."""

import threading
from pathlib import Path

import pytest
import torch

from qwenvl_lab.engine import BuildConfig, ModelRunner
from qwenvl_lab.infer import QWenInfer
from qwenvl_lab.tokenizing import IM_END_ID, make_context

NEW_TOKENS = 5
IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"


@pytest.fixture(scope="module")
def infer(tiny_engine):
    return QWenInfer.from_dir(tiny_engine)


def original_answer(model, tokenizer, query, history):
    """Qwen-VL's own way: the model reads the pictures from the paths in the ids, then greedy decoding."""
    ids = torch.tensor([make_context(tokenizer, query, history=history)[1]])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=IM_END_ID,
            pad_token_id=IM_END_ID,
        )
    return tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


def test_answers_like_the_original_model_with_history(infer, tiny_model, tokenizer, image_files):
    pictures = [str(image_files["red"])]
    response, history = infer.qwen_infer(pictures, "What differs?", max_new_tokens=NEW_TOKENS)
    query = tokenizer.from_list_format([{"image": p} for p in pictures] + [{"text": "What differs?"}])
    assert response == original_answer(tiny_model, tokenizer, query, [])
    assert history == [(query, response)]
    # second turn: a new picture; the history's picture stays in the context (two image spans in all)
    second, history2 = infer.qwen_infer(
        [str(image_files["gradient"])], "And this one?", history=history, max_new_tokens=NEW_TOKENS
    )
    query2 = tokenizer.from_list_format([{"image": str(image_files["gradient"])}, {"text": "And this one?"}])
    assert second == original_answer(tiny_model, tokenizer, query2, history)
    assert len(history2) == 2 and history2[0] == history[0]
    text_only, _ = infer.qwen_infer(None, "Hello", max_new_tokens=NEW_TOKENS)
    assert text_only == original_answer(tiny_model, tokenizer, "Hello", [])


def test_beam_search_answer(infer, tiny_model, tokenizer, image_files):
    runner = ModelRunner.from_dir(infer.runner.engine_dir)
    beams = QWenInfer(runner, infer.vision, tokenizer)
    response, _ = beams.qwen_infer([str(image_files["red"])], "Hi", max_new_tokens=NEW_TOKENS, num_beams=3)
    ids = torch.tensor(
        [make_context(tokenizer, tokenizer.from_list_format([{"image": str(image_files["red"])}, {"text": "Hi"}]))[1]]
    )
    with torch.inference_mode():
        out = tiny_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            num_beams=3,
            do_sample=False,
            eos_token_id=IM_END_ID,
            pad_token_id=IM_END_ID,
        )
    assert response == tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True)


def test_needs_a_vision_part(tiny_model):

    runner = ModelRunner.from_model(tiny_model, BuildConfig(max_input_len=64, max_seq_len=64))
    with pytest.raises(ValueError, match="give the vision tower"):
        QWenInfer(runner)


def test_threads_sharing_one_runner_each_get_their_own_answer(toy_chat):
    runner, tower, tokenizer = toy_chat
    infer = QWenInfer(runner, tower, tokenizer)
    pictures = [IMAGES / name for name in ("red_circle.png", "blue_square.png", "green_triangle.png")]
    alone = [infer.qwen_infer([p], "图片里是什么？", max_new_tokens=12)[0] for p in pictures]
    assert len(set(alone)) == 3

    def ask(picture, start, answers):
        start.wait()
        answers[picture] = infer.qwen_infer([picture], "图片里是什么？", max_new_tokens=12)[0]

    for _ in range(3):
        start, answers = threading.Barrier(len(pictures)), {}
        threads = [threading.Thread(target=ask, args=(p, start, answers)) for p in pictures]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert [answers.get(p) for p in pictures] == alone


def test_while_a_stream_is_open_other_threads_are_refused_and_then_served(toy_chat):
    runner, tower, tokenizer = toy_chat
    ids = torch.tensor(make_context(tokenizer, "What is in the picture?")[1])
    stream = runner.generate([ids], max_new_tokens=4, streaming=True)
    next(stream)
    refused = []

    def other():
        try:
            runner.generate([ids], max_new_tokens=2)
        except RuntimeError as err:
            refused.append(str(err))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(60)
    assert refused and "a streaming generation still holds this runner" in refused[0]
    stream.close()
    assert not runner.busy and runner.generate([ids], max_new_tokens=2).shape[-1] == len(ids) + 2

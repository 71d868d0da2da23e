"""QWenInfer.qwen_infer: pictures and a question in, the answer out — the same answer the original Qwen-VL path gives."""

import pytest
import torch

from qwenvl_lab.engine import ModelRunner, QWenInfer
from qwenvl_lab.tokenizing import IM_END_ID, make_context

NEW_TOKENS = 5


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
    from qwenvl_lab.engine import BuildConfig

    runner = ModelRunner.from_model(tiny_model, BuildConfig(max_input_len=64, max_seq_len=64))
    with pytest.raises(ValueError, match="give the vision tower"):
        QWenInfer(runner)

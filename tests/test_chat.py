"""The chat: one question through any runner, a conversation on the engine (pictures encoded once, history kept,
answers streamed as they are generated), Qwen-VL-Chat's stop words and generation_config.json defaults."""

import json
from pathlib import Path

import pytest
import torch

from qwenvl_lab import chat
from qwenvl_lab.chat import Conversation, GenerationSettings, ModelAsRunner, TextStream
from qwenvl_lab.files import CheckpointError
from qwenvl_lab.tokenizing import IM_END_ID, IM_START_ID
from qwenvl_lab.toy import TOY_DIR

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"


@pytest.fixture(scope="module")
def toy(toy_chat):
    return toy_chat


class CountingVision:
    """A vision tower that records which pictures it was asked to encode."""

    def __init__(self, tower):
        self.tower, self.calls = tower, []

    def encode(self, pictures):
        self.calls.append([str(p) for p in pictures])
        return self.tower.encode(pictures)


GREEDY = GenerationSettings(max_new_tokens=16)


def test_a_second_turn_reuses_the_first_pictures_features(toy):
    runner, tower, tokenizer = toy
    vision = CountingVision(tower)
    talk = Conversation(runner, vision, tokenizer, settings=GREEDY)
    assert talk.ask("What is in the picture?", [IMAGES / "red_circle.png"]) == "A red circle."
    assert talk.ask("How many shapes are there?") == "One."  # the first turn's picture, not encoded again
    assert talk.ask("What color is the circle?") == "Red."
    assert vision.calls == [[str(IMAGES / "red_circle.png")]]
    talk.ask("Which picture has a blue square?", [IMAGES / "blue_square.png"])  # a second picture, a later turn
    assert vision.calls == [[str(IMAGES / "red_circle.png")], [str(IMAGES / "blue_square.png")]]  # each picture once
    assert len(talk.history) == 4 and len(talk.features) == 2
    talk.clear()
    assert talk.history == [] and talk.features == {}


def test_streamed_answer_equals_the_one_shot_answer_token_for_token(toy):
    runner, tower, tokenizer = toy
    for question in ("图片里是什么？", "What is in the picture?"):
        pieces = list(
            Conversation(runner, tower, tokenizer, settings=GREEDY).stream(question, [IMAGES / "three_shapes.png"])
        )
        one_shot, _ = chat.ask(runner, tower, tokenizer, [IMAGES / "three_shapes.png"], question, max_new_tokens=16)
        assert len(pieces) > 1 and "".join(pieces) == one_shot  # text arrives in pieces, and adds up


def test_text_stream_keeps_characters_whole(tokenizer):
    text = "一个红色的圆形。🦜 <ref>x</ref>"
    ids = tokenizer.encode(text) + [151851]  # a special token after the text
    stream = TextStream(tokenizer)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == chat.answer_text(tokenizer, ids) == text + "<ref>"
    assert "" in pieces[:-1]  # a character split over tokens waited for its last byte
    assert all("\ufffd" not in piece for piece in pieces)


def test_stop_strings_end_the_answer_and_are_never_shown(toy):
    runner, tower, tokenizer = toy
    full = Conversation(runner, tower, tokenizer, settings=GREEDY).ask(
        "What is in the picture?", [IMAGES / "three_shapes.png"]
    )
    word = full.split()[2]  # a word in the middle of the answer
    talk = Conversation(runner, tower, tokenizer, settings=GenerationSettings(max_new_tokens=16, stop=(word,)))
    pieces = list(talk.stream("What is in the picture?", [IMAGES / "three_shapes.png"]))
    assert "".join(pieces) == full[: full.index(word)] and talk.history[-1][1] == "".join(pieces)
    assert not runner.busy  # the stream was closed when the stop string came


def test_a_stream_closed_early_frees_the_engine_and_keeps_what_was_shown(toy):
    runner, tower, tokenizer = toy
    talk = Conversation(runner, tower, tokenizer, settings=GREEDY)
    stream = talk.stream("What is in the picture?", [IMAGES / "red_circle.png"])
    first = next(stream)
    stream.close()
    assert not runner.busy and talk.history[-1][1] == first
    assert talk.ask("How many shapes are there?") == "One."


def test_im_start_and_im_end_are_stop_words(tokenizer):
    assert chat.STOP_IDS == (IM_END_ID, IM_START_ID)
    ids = tokenizer.encode("Blue.") + [IM_START_ID] + tokenizer.encode("user")
    assert chat.answer_text(tokenizer, ids) == "Blue."


def test_generation_settings_come_from_generation_config(tmp_path):
    toy = GenerationSettings.from_dir(TOY_DIR)
    assert (toy.do_sample, toy.top_k, toy.top_p, toy.max_new_tokens) == (True, 0, 0.3, 512)  # Qwen-VL-Chat's
    assert toy.sampling() == dict(top_k=0, top_p=0.3, temperature=1.0, repetition_penalty=1.0)
    greedy = GenerationSettings.from_dir(TOY_DIR, do_sample=False)
    assert greedy.sampling() == dict(top_k=1, repetition_penalty=1.0)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": "0.3"}))
    with pytest.raises(CheckpointError, match="'top_p' must be a finite number > 0, found '0.3'"):
        GenerationSettings.from_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.1, "do_sample": False}))
    assert GenerationSettings.from_dir(tmp_path).sampling() == dict(top_k=1, repetition_penalty=1.1)
    with pytest.raises(ValueError, match="top_p must be a number in"):
        GenerationSettings(top_p=2.0)


def test_the_engine_directory_keeps_the_checkpoints_generation_config(toy):
    runner = toy[0]
    assert GenerationSettings.from_dir(runner.engine_dir) == GenerationSettings.from_dir(TOY_DIR)


def test_sampled_answers_follow_the_seed_and_can_differ(toy):
    runner, tower, tokenizer = toy
    settings = GenerationSettings(max_new_tokens=8, do_sample=True, temperature=3.0)
    answers = [
        chat.ask(
            runner,
            tower,
            tokenizer,
            [IMAGES / "red_circle.png"],
            "What is in the picture?",
            max_new_tokens=8,
            **settings.sampling(),
            random_seed=seed,
        )[0]
        for seed in (1, 1, 2, 3, 4)
    ]
    assert answers[0] == answers[1] and len(set(answers)) > 1


def test_model_as_runner_answers_like_the_engine(toy, tokenizer):
    from qwenvl_lab.toy import load_course_model

    runner, tower, _ = toy
    model = load_course_model()
    question = ([IMAGES / "green_triangle.png"], "图片里是什么？")
    eager = chat.ask_batch(ModelAsRunner(model), model.transformer.visual, tokenizer, [question])
    assert eager == chat.ask_batch(runner, tower, tokenizer, [question]) == ["一个绿色的三角形。"]
    with torch.inference_mode():  # the original way: no prompt table, the model reads the picture from the span
        assert chat.ask_batch(ModelAsRunner(model), None, tokenizer, [question]) == eager

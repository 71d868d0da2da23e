"""The chat: one question through any runner, a conversation on the engine (pictures encoded once, history kept,
answers streamed as they are generated), Qwen-VL-Chat's stop words and generation_config.json defaults."""

import itertools
import json
import random
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from PIL import Image

from qwenvl_lab import chat
from qwenvl_lab.chat import Conversation, GenerationSettings, ModelAsRunner, TextStream
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_vision_tower
from qwenvl_lab.files import CheckpointError
from qwenvl_lab.infer import QWenInfer
from qwenvl_lab.pictures import load_image
from qwenvl_lab.requests import OneGeneration, Runner
from qwenvl_lab.tokenizing import IM_END_ID, IM_START_ID, IMAGE_START_ID, IMG_TOKEN_SPAN, load_tokenizer, make_context
from qwenvl_lab.toy import TOY_DIR, load_course_model

IMAGES = Path(__file__).resolve().parents[1] / "data" / "images"


@pytest.fixture(scope="module")
def toy(toy_chat):
    return toy_chat


class CountingVision:
    """A vision tower that records how many pictures each call encoded."""

    def __init__(self, tower):
        self.tower, self.calls = tower, []

    def encode(self, pictures):
        self.calls.append(len(pictures))
        return self.tower.encode(pictures)


GREEDY = GenerationSettings(max_new_tokens=16)


def test_a_second_turn_reuses_the_first_pictures_features(toy):
    runner, tower, tokenizer = toy
    vision = CountingVision(tower)
    talk = Conversation(runner, vision, tokenizer, settings=GREEDY)
    assert talk.ask("What is in the picture?", [IMAGES / "red_circle.png"]) == "A red circle."
    assert talk.ask("How many shapes are there?") == "One."  # the first turn's picture, not encoded again
    assert talk.ask("What color is the circle?") == "Red."
    assert vision.calls == [1]
    talk.ask("Which picture has a blue square?", [IMAGES / "blue_square.png"])  # a second picture, a later turn
    assert vision.calls == [1, 1]  # each picture once
    talk.ask("And now?", [load_image(IMAGES / "red_circle.png")])  # the first picture again, as an image
    assert vision.calls == [1, 1] and len(talk.history) == 5 and len(talk.features) == 2
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


def test_im_start_and_im_end_end_an_answer(tokenizer):
    for stop in (IM_END_ID, IM_START_ID):  # the end of the model's turn, or the start of another
        ids = tokenizer.encode("Blue.") + [stop] + tokenizer.encode("user")
        assert chat.answer_text(tokenizer, ids) == "Blue."
    assert chat.answer_text(tokenizer, tokenizer.encode("Blue.") + [151643]) == "Blue.<|endoftext|>"  # not a stop


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
    with pytest.raises(ValueError, match="top_p must be a finite number >= 0 and <= 1"):
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

    runner, tower, _ = toy
    model = load_course_model()
    question = ([IMAGES / "green_triangle.png"], "图片里是什么？")
    eager = chat.ask_batch(ModelAsRunner(model), model.transformer.visual, tokenizer, [question])
    assert eager == chat.ask_batch(runner, tower, tokenizer, [question]) == ["一个绿色的三角形。"]
    with torch.inference_mode():  # the original way: no prompt table, the model reads the picture from the span
        assert chat.ask_batch(ModelAsRunner(model), None, tokenizer, [question]) == eager


@pytest.fixture(scope="module")
def batch_engine(tmp_path_factory):
    """(runner, vision tower, tokenizer) of the toy model built for batches of 3 requests of up to 3 pictures each."""

    config = BuildConfig(max_batch_size=3, max_input_len=1400, max_seq_len=1500, max_prompt_embedding_table_size=2304)
    engine = build_engine(TOY_DIR, tmp_path_factory.mktemp("toy-batch") / "engine", config)
    return ModelRunner.from_dir(engine), load_engine_vision_tower(engine), load_tokenizer(engine)


@pytest.mark.parametrize("as_images", [False, True], ids=["paths", "PIL images"])
def test_a_batch_answers_each_request_as_it_would_be_answered_alone(batch_engine, as_images):
    runner, tower, tokenizer = batch_engine

    def picture(name):
        return load_image(IMAGES / name) if as_images else IMAGES / name

    def alone(pictures, question, history, earlier):
        """The answer to one request, its pictures' features given in span order: the history's, then its own."""
        with torch.inference_mode():
            input_vit = tower.encode(earlier + pictures) if earlier + pictures else None
        return chat.ask_batch(runner, None, tokenizer, [(pictures, question)], history, input_vit=input_vit)[0]

    first = picture("red_circle.png")
    _, history = chat.ask(runner, tower, tokenizer, [first], "What is in the picture?")
    cases = {
        "a history with a picture, requests of 2, 0 and 1 pictures": (
            [
                ([picture("blue_square.png"), picture("green_triangle.png")], "How many shapes are there?"),
                ([], "What color is the circle?"),
                ([picture("yellow_circle.png")], "What is in the picture?"),
            ],
            history,
            [first],
        ),
        "fewer pictures than questions": (
            [([], "图片里是什么？"), ([picture("green_triangle.png")], "图片里是什么？"), ([], "What is it?")],
            [],
            [],
        ),
    }
    for case, (questions, turns, earlier) in cases.items():
        batched = chat.ask_batch(runner, tower, tokenizer, questions, turns)
        assert batched == [alone(pictures, question, turns, earlier) for pictures, question in questions], case
    assert batched[1] == "一个绿色的三角形。"


def test_pictures_given_as_images_need_a_vision_encoder(batch_engine):
    runner, _, tokenizer = batch_engine
    with pytest.raises(ValueError, match="picture 1 is an image, not a file: give a vision encoder"):
        chat.ask_batch(runner, None, tokenizer, [([load_image(IMAGES / "red_circle.png")], "What is it?")])


def test_a_picture_whose_file_changed_is_encoded_again(toy, tmp_path):
    runner, tower, tokenizer = toy
    picture = tmp_path / "photo.png"
    shutil.copyfile(IMAGES / "red_circle.png", picture)
    talk = Conversation(runner, tower, tokenizer, settings=GREEDY)
    assert talk.ask("What is in the picture?", [picture]) == "A red circle."
    shutil.copyfile(IMAGES / "blue_square.png", picture)  # the same path, another picture
    answer = talk.ask("Which picture has a blue square?", [picture])

    def with_features(*names):  # the same turn, its pictures' features given
        with torch.inference_mode():
            input_vit = tower.encode([IMAGES / name for name in names])
        question = ([picture], "Which picture has a blue square?")
        return chat.ask_batch(runner, None, tokenizer, [question], talk.history[:1], input_vit=input_vit)[0]

    assert (
        answer
        == with_features("red_circle.png", "blue_square.png")
        != with_features("red_circle.png", "red_circle.png")
    )
    assert len(talk.features) == 2


def test_a_refused_turn_changes_nothing(toy, tmp_path):
    runner, tower, tokenizer = toy  # the engine holds up to 4 pictures per request
    talk = Conversation(runner, tower, tokenizer, settings=GREEDY)
    talk.ask("What is in the picture?", [IMAGES / "red_circle.png"])
    before = (list(talk.history), list(talk.pictures), dict(talk.features))
    (tmp_path / "notes.png").write_text("not a picture")
    for pictures in ([IMAGES / "blue_square.png"] * 5, [IMAGES / "blue_square.png", tmp_path / "notes.png"]):
        with pytest.raises(ValueError):
            talk.ask("What are these?", pictures)
        assert (talk.history, talk.pictures, talk.features) == before and not runner.busy
    assert talk.ask("How many shapes are there?") == "One."


def test_the_oldest_turns_are_left_out_when_the_conversation_outgrows_the_engine(toy):
    runner, tower, tokenizer = toy  # 4 pictures and 1400 ids per request
    talk = Conversation(runner, tower, tokenizer, settings=GREEDY)
    pairs = [("red_circle.png", "blue_square.png"), ("green_triangle.png", "yellow_circle.png")]
    for pair in pairs:
        talk.ask("How many shapes are there?", [IMAGES / name for name in pair])
    assert talk.left_out == 0
    answer = talk.ask("What is in the picture?", [IMAGES / "three_shapes.png"])  # 5 pictures would not fit
    assert answer and talk.left_out == 1 and len(talk.history) == 3
    assert talk.ask("How many shapes are there?") and talk.left_out == 1


class ScriptedRunner(Runner):
    """A runner of an engine's limits (640 ids, 2 pictures a request) that answers from a script and records each
    request it gets (ids and prompt table): the chat's bookkeeping, without a model."""

    def __init__(self, tokenizer, answers):
        self.build_config = BuildConfig(
            max_batch_size=1, max_input_len=640, max_seq_len=704, max_prompt_embedding_table_size=512
        )
        self.vocab_size, self.hidden_size, self.dtype = 151936, 4, torch.float32
        self.max_input_len, self.max_seq_len, self.max_request_rows = 640, 704, 512
        self.turn, self.answers, self.tokenizer, self.requests = OneGeneration(), answers, tokenizer, []

    def steps(self, request, max_new_tokens, sampling, streaming):
        table = None if request.table is None else request.table[::IMG_TOKEN_SPAN, 0].tolist()  # a row a picture
        self.requests.append(([int(i) for i in request.ids[0]], table))
        answer = [*self.tokenizer.encode(next(self.answers)), IM_END_ID][:max_new_tokens]
        yield torch.tensor(answer).view(1, 1, -1), torch.full((1, 1), len(answer))


class RedVision:
    """A vision encoder whose features of a picture are its first pixel's red value (so a table names its pictures)."""

    def encode(self, pictures):
        reds = [float(load_image(p).getpixel((0, 0))[0]) for p in pictures]
        return torch.tensor(reds).view(-1, 1, 1).expand(-1, IMG_TOKEN_SPAN, 4).clone()  # [N, 256, 4]


def fit_as_before(talk, question, pictures, window):
    """The prompt (ids) and left_out the chat had before it kept track of turns: every first turn from the oldest on,
    until a prompt fits the runner; a ValueError when none does."""
    most_ids, most_rows = chat.prompt_limits(talk.runner)
    names = [chat.picture_name(p, len(talk.pictures) + k + 1) for k, p in enumerate(pictures)]
    for start in range(len(talk.history) + 1):
        _, ids = chat.make_prompt(talk.tokenizer, question, pictures, talk.history[start:], talk.system, window, names)
        if len(ids) <= most_ids and ids.count(IMAGE_START_ID) * IMG_TOKEN_SPAN <= most_rows:
            return ids, len(talk.history) - (ids.count(IM_START_ID) - 3) // 2
    raise ValueError("no prompt fits")


def spans_out(ids) -> list:
    """Context ids with each image span's 256 ids (a path, or fake ids once the table is made) left out."""
    kept, k = [], 0
    while k < len(ids):
        kept.append(ids[k])
        k += 1 + IMG_TOKEN_SPAN * (ids[k] == IMAGE_START_ID)
    return kept


@pytest.fixture(scope="module")
def colour_files(tmp_path_factory):
    """Three small pictures whose first pixels' red values are 10, 20 and 30."""
    folder = tmp_path_factory.mktemp("colours")
    for red in (10, 20, 30):
        Image.new("RGB", (8, 8), (red, 0, 0)).save(folder / f"r{red}.png")
    return [folder / f"r{red}.png" for red in (10, 20, 30)]


@pytest.mark.parametrize("seed", range(4))
def test_a_long_chat_sends_the_prompts_it_sent_before(seed, tokenizer, colour_files):
    """Random chats (questions of 1 to ~200 ids, 0 to 3 pictures, answers with and without grounding tags, a small
    max_window_size now and then) on a 640-id engine: each turn sends the prompt and the pictures the earlier search
    sent, leaves out the same turns, and is refused when that one was."""
    rng = random.Random(seed)
    words = ["shape", "red", "circle", "图片", "where", "<ref>the circle</ref><box>(1,2),(30,40)</box>", "?"]
    answers = iter(lambda: " ".join(rng.choices(words, k=rng.randint(0, 60))), None)
    talk = Conversation(ScriptedRunner(tokenizer, answers), RedVision(), tokenizer, settings=GREEDY)
    for turn in range(60):
        question = " ".join(rng.choices(words, k=rng.choice([1, 3, 10, 90])))
        pictures = rng.sample(colour_files, k=rng.choice([0, 0, 0, 1, 1, 2, 3]))
        window = rng.choice([6144, 6144, 6144, 300])
        try:
            expected = fit_as_before(talk, question, pictures, window)
        except ValueError:
            expected = None
        sent = len(talk.runner.requests)
        try:
            talk.ask(question, pictures, max_window_size=window)
        except ValueError as err:
            assert expected is None and "per question" in str(err), (turn, err)
            continue
        ids, table = talk.runner.requests[sent]
        assert expected is not None and (spans_out(ids), talk.left_out) == (spans_out(expected[0]), expected[1]), turn
        shown = [
            p
            for query, _ in talk.history[len(talk.history) - 1 - (ids.count(IM_START_ID) - 3) // 2 :]
            for p in query.pictures
        ]
        assert table == ([float(load_image(p).getpixel((0, 0))[0]) for p in shown] or None), turn


def test_a_turn_costs_as_much_after_1600_turns_as_after_50(tokenizer, monkeypatch, colour_files):
    """`cat questions.txt | qwenvl-lab chat`: the ids encoded for one more turn stay the same from 50 turns of history
    to 1600 on a 640-id engine (the earlier search encoded 43,596 ids at 50 turns and 901,014 at 200), and the
    features kept are those of pictures a prompt can still show."""
    encoded = [0]
    encode = tokenizer.encode

    def counted(text):
        ids = encode(text)
        encoded[0] += len(ids)
        return ids

    monkeypatch.setattr(tokenizer, "encode", counted)
    talk = Conversation(ScriptedRunner(tokenizer, itertools.repeat("A red circle.")), RedVision(), tokenizer)
    work, kept = {}, 0
    for turn in range(1, 1601):
        before = encoded[0]
        talk.ask(
            f"Question {turn:04d}: what is in the picture?", colour_files[turn % 3 : turn % 3 + 1] * (turn % 10 == 0)
        )
        kept = max(kept, len(talk.features))
        if turn in (50, 200, 400, 800, 1600):
            work[turn] = encoded[0] - before
    assert max(work.values()) / min(work.values()) <= 1.01, work
    assert talk.left_out > 1500 and len(talk.history) == 1600 and kept <= 2


class RecordingVision:
    """A vision tower that records the content (picture_key) of every picture it encodes."""

    def __init__(self, tower):
        self.tower, self.seen = tower, []

    def encode(self, pictures):
        self.seen.append([chat.picture_key(load_image(p)) for p in pictures])
        return self.tower.encode(pictures)


def test_a_stateless_history_shows_its_pictures_as_they_were_read(toy, tmp_path):
    """qwen_infer(history=…) and chat.ask: a history turn brings the picture it showed, not what its file holds now
    (the history used to re-read the path), as a Conversation does."""
    runner, tower, tokenizer = toy
    picture = tmp_path / "photo.png"
    shutil.copyfile(IMAGES / "red_circle.png", picture)
    red, blue = (chat.picture_key(load_image(IMAGES / n)) for n in ("red_circle.png", "blue_square.png"))
    vision = RecordingVision(tower)
    infer = QWenInfer(runner, vision, tokenizer)
    answer, history = infer.qwen_infer([picture], "What is in the picture?", max_new_tokens=16)
    assert answer == "A red circle." and str(picture) in history[0][0]  # the span still names the path
    shutil.copyfile(IMAGES / "blue_square.png", picture)  # the same path, another picture
    infer.qwen_infer([picture], "Which picture has a blue square?", history=history, max_new_tokens=16)
    assert vision.seen == [[red], [red, blue]]


def test_an_empty_batch_is_refused_in_words(toy):
    runner, tower, tokenizer = toy
    with pytest.raises(ValueError, match=r"no questions: give at least one \(pictures, question\) pair"):
        chat.ask_batch(runner, tower, tokenizer, [])


def image_tags_as_text(tokenizer, toy):
    """Every way a string holding <img>…</img> reaches a prompt as plain text."""
    runner, tower, _ = toy
    query = tokenizer.from_list_format([{"image": str(IMAGES / "red_circle.png")}, {"text": "What is it?"}])
    text = query.strip()  # a str operation on a Query gives plain text: Qwen-VL's query string
    return {
        "make_context's query": lambda: make_context(tokenizer, text),
        "make_context's history": lambda: make_context(tokenizer, "And now?", history=[(text, "A red circle.")]),
        "make_prompt's question": lambda: chat.make_prompt(tokenizer, text),
        "ask_batch's question": lambda: chat.ask_batch(runner, tower, tokenizer, [([], text)], max_new_tokens=2),
        "a Conversation's question": lambda: Conversation(runner, tower, tokenizer, settings=GREEDY).ask(text),
        "qwen_infer's question": lambda: QWenInfer(runner, tower, tokenizer).qwen_infer([], text, max_new_tokens=2),
    }


@pytest.mark.parametrize(
    "way",
    [
        "make_context's query",
        "make_context's history",
        "make_prompt's question",
        "ask_batch's question",
        "a Conversation's question",
        "qwen_infer's question",
    ],
)
def test_a_picture_written_as_plain_text_is_not_dropped_without_a_word(way, tokenizer, toy):
    with pytest.warns(UserWarning, match=r"holds <img>…</img> as plain text: typed text never makes an image span"):
        image_tags_as_text(tokenizer, toy)[way]()


def test_text_without_a_whole_image_tag_or_a_query_warns_of_nothing(tokenizer):
    query = tokenizer.from_list_format([{"image": "a.png"}, {"text": "What is it?"}])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for text in ("an <img> tag", "</img> before <img>", "<img" * 1000, query, query + " <img>b.png</img>"):
            make_context(tokenizer, text)

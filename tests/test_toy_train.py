"""Training the toy model: its chats and batches, the compact-vocabulary loss, the probes, resuming, where it saves."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from qwenvl_lab.chat import make_prompt
from qwenvl_lab.checkpoint import load_checkpoint
from qwenvl_lab.grounding import to_list_format
from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.prompt_table import single_table_batch
from qwenvl_lab.tokenizing import IM_END_ID
from qwenvl_lab.toy import TOY_DIR
from qwenvl_lab.toy import batches as toy_batches
from qwenvl_lab.toy import evaluate as toy_evaluate
from qwenvl_lab.toy import train as toy_train
from qwenvl_lab.toy.shapes import (
    COLORS,
    KINDS,
    LANGS,
    Scene,
    Shape,
    make_dataset,
    no_picture,
    question,
    random_scene,
)


@pytest.fixture(scope="module")
def token_sets(tokenizer):
    return toy_batches.used_token_ids(tokenizer)


def pair(color, kind):
    return COLORS.index(color) * len(KINDS) + KINDS.index(kind)


def test_compact_loss_equals_full_vocabulary_cross_entropy(tiny_model, token_sets):
    vocab = toy_train.CompactVocab(tiny_model, *token_sets)
    torch.manual_seed(0)
    hidden = torch.randn(5, tiny_model.config.hidden_size)
    targets = torch.tensor(random.Random(0).choices(token_sets[1], k=5))
    full_head = torch.zeros(tiny_model.config.vocab_size, tiny_model.config.hidden_size)
    full_head[token_sets[1]] = vocab.head.detach()
    per_token = F.cross_entropy(hidden @ full_head.T, targets, reduction="none")
    assert torch.allclose(vocab.loss(hidden, targets), per_token.mean(), atol=1e-5)
    weights = torch.tensor([1.0, 2.0, 1.0, 2.0, 1.0])
    assert torch.allclose(vocab.loss(hidden, targets, weights), (per_token * weights).sum() / 7, atol=1e-5)
    with pytest.raises(ValueError, match="outside the compact vocabulary"):
        vocab.loss(hidden[:1], torch.tensor([5000]))  # an id no answer holds


def test_write_back_keeps_trained_rows_and_zeroes_the_rest(tiny_checkpoint, token_sets):

    model = load_checkpoint(tiny_checkpoint)
    vocab = toy_train.CompactVocab(model, *token_sets)
    vocab.write_back(model)
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert torch.equal(wte[token_sets[0]], vocab.wte.detach())
    assert torch.equal(head[token_sets[1]], vocab.head.detach())
    unused = torch.ones(wte.shape[0], dtype=torch.bool)
    unused[token_sets[0]] = False
    assert not wte[unused].any() and (head.abs().sum(1) > 0).sum() == len(token_sets[1])


def test_token_sets_cover_every_answer_and_prompt(tokenizer, token_sets):
    inputs, outputs = map(set, token_sets)
    assert IM_END_ID in outputs
    examples = make_dataset(3, 60)
    turns = [[toy_batches.Turn(tuple(e.images), e.question, e.answer)] for e in examples]
    turns += [[toy_batches.Turn((), e.question, no_picture(e.lang))] for e in examples[:10]]
    for conversation in turns:
        ids, [(start, stop)] = toy_batches.encode_conversation(tokenizer, conversation)
        assert set(ids[start:stop]) <= outputs, conversation[0].answer
        context = torch.tensor(ids[:start])
        for _, a, b in locate_img_pos(context).tolist():
            context[a + 1 : b] = -1
        assert set(context.tolist()) - {-1} <= inputs


def test_conversations_ask_what_the_templates_allow():
    rng = random.Random(1)
    for _ in range(30):
        turns = toy_batches.make_conversation(rng, 0)
        assert 1 <= len(turns) <= 2 and all(not t.pictures for t in turns)
        assert {t.answer for t in turns} <= {no_picture(lang) for lang in LANGS}

        turns = toy_batches.make_conversation(rng, 1)
        [scene] = turns[0].pictures
        assert all(not t.pictures for t in turns[1:])
        pairs = [(s.color, s.kind) for s in scene.shapes]
        once = {p for p in pairs if pairs.count(p) == 1}
        asked = [t for t in turns if "<box>" in t.answer]
        assert len(asked) == min(2, len(once))  # "where" only about a shape that appears once
        for t in asked:
            [element] = to_list_format(t.answer)
            [shape] = [s for s in scene.shapes if s.grid_box() == tuple(element["box"][0])]
            assert (shape.color, shape.kind) in once
        assert len({t.question for t in turns}) == len(turns)

        turns = toy_batches.make_conversation(rng, 2)
        assert len(turns[0].pictures) == 2 and all(
            t.answer in {"Picture 1.", "Picture 2.", "第一张图片。", "第二张图片。"} for t in turns
        )


def test_a_conversation_extends_the_single_question_prompt(tokenizer):

    example = make_dataset(2, 1)[0]
    first = toy_batches.Turn(tuple(example.images), example.question, example.answer)
    ids, spans = toy_batches.encode_conversation(tokenizer, [first, toy_batches.Turn((), question("count"), "Two.")])
    _, context = make_prompt(tokenizer, example.question, [f"picture{k + 1}.png" for k in range(len(example.images))])
    assert ids[: spans[0][0]] == context  # the chat's first prompt is the one the course asks with
    assert tokenizer.decode(ids[spans[1][0] : spans[1][1]]) == "Two.<|im_end|>"


def test_make_batch_labels_every_answer_position(tokenizer):
    conversations = [toy_batches.make_conversation(random.Random(seed), n) for seed, n in ((5, 1), (6, 0), (7, 2))]
    batch = toy_batches.make_batch(tokenizer, conversations, image_size=56)
    assert batch["pixels"].shape == (3, 3, 56, 56) and batch["pictures"].tolist() == [1, 0, 2]
    assert len(locate_img_pos(batch["ids"])) == 3
    start = 0
    for row, turns in enumerate(conversations):
        n = int(batch["target_mask"][row].sum())
        text = tokenizer.decode(batch["targets"][start : start + n].tolist())
        assert text == "".join(t.answer + "<|im_end|>" for t in turns)
        start += n
    asked, box, digit, target = batch["asked"], batch["box"], batch["digit"], batch["target_mask"]
    assert (box[1] == -100).all() and (digit[1] == -100).all()  # no box without a picture
    assert torch.equal(asked[2] >= 0, target[2])  # every position of a "which" answer knows the pair asked
    # at every position of a "where" answer: the pair asked and the box's bins; the digits where they are predicted
    where = [t for t in conversations[0] if "<box>" in t.answer]
    where_rows = box[0, :, 0] >= 0
    assert where and int(where_rows.sum()) == sum(len(tokenizer.encode(t.answer)) + 1 for t in where)
    assert bool((asked[0][where_rows] >= 0).all())
    bins = {tuple(toy_batches.box_bins(to_list_format(t.answer)[0]["box"][0])) for t in where}
    assert {tuple(row) for row in box[0][where_rows].tolist()} == bins
    digits = digit[0] >= 0
    assert [tokenizer.decode([int(i)]) for i in batch["ids"][0, 1:][digits[:-1]]] == [
        str(d) for d in digit[0][digits].tolist()
    ]  # the digit label at a position is the token that follows it
    assert "".join(map(str, digit[0][digits].tolist())) == "".join(c for t in where for c in t.answer if c.isdigit())
    held = batch["held"]
    assert held.shape == (3, 12) and held.sum(1).tolist() == [
        len({(s.color, s.kind) for s in sc.shapes})
        for sc in (conversations[0][0].pictures + conversations[2][0].pictures)
    ]


def test_step_batches_are_a_function_of_seed_stage_and_step(tokenizer):
    data = toy_batches.StepBatches(seed=3, stage="whole", steps=10, batch_size=4, image_size=56)
    first, again, other = data[3], data[3], data[4]  # two steps of one picture
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert first["ids"].shape != other["ids"].shape or not torch.equal(first["ids"], other["ids"])
    assert data[2]["pictures"].tolist() == [2, 2, 2, 2]  # every third step has two pictures
    assert data[0]["pictures"].tolist() == [1, 0, 1, 1]  # one chat in no_picture_every without a picture
    vision = toy_batches.StepBatches(seed=3, stage="vision", steps=2, batch_size=3, image_size=56)
    assert vision[1]["pixels"].shape == (3, 3, 56, 56)


def test_patch_labels_mark_each_shape_its_rank_and_its_box():
    scene = Scene((Shape("triangle", "green", (0.6, 0.1, 0.9, 0.4)), Shape("circle", "red", (0.05, 0.5, 0.45, 0.9))))
    shape, rank, bins = toy_batches.patch_labels(scene)
    assert shape.shape == rank.shape == (256,) and bins.shape == (256, 4)
    grid = lambda x, y: int(y * 16) * 16 + int(x * 16)  # noqa: E731 - query index of a point
    red, green = grid(0.25, 0.7), grid(0.75, 0.3)
    assert shape[red] == 1 + pair("red", "circle") and rank[red] == 1
    assert shape[green] == 1 + pair("green", "triangle") and rank[green] == 2
    assert bins[red].tolist() == toy_batches.box_bins(scene.shapes[1].grid_box())
    assert bins[green].tolist() == toy_batches.box_bins(scene.shapes[0].grid_box())
    assert shape[grid(0.02, 0.02)] == 0 and rank[grid(0.02, 0.02)] == 0 and (bins[grid(0.02, 0.02)] == -100).all()
    assert set(rank.tolist()) == {0, 1, 2}
    assert toy_batches.box_bins((0, 19, 20, 1000)) == [0, 0, 1, toy_batches.BOX_BINS - 1]


def test_patch_probe_counts_the_queries_on_a_shape_twice_and_their_boxes(tokenizer):
    torch.manual_seed(0)
    conversations = [[toy_batches.Turn((random_scene(random.Random(k)),), "", "")] for k in range(2)]
    batch = toy_batches.make_batch(tokenizer, conversations, image_size=56)
    probe = toy_train.PatchProbe(16)
    input_vit = torch.randn(2, 256, 16)
    rows = input_vit.reshape(-1, 16)
    shape, rank = batch["patch_shape"].reshape(-1), batch["patch_rank"].reshape(-1)
    on = shape > 0
    expected = sum(
        F.cross_entropy(head(rows), labels) + F.cross_entropy(head(rows)[on], labels[on])
        for head, labels in ((probe.shape, shape), (probe.rank, rank))
    )
    assert 0 < on.sum() < len(on)
    assert torch.allclose(probe.loss(input_vit, batch, box_weight=0.0), expected)
    boxes = F.cross_entropy(probe.box(rows[on]).view(-1, 50), batch["patch_box"].reshape(-1, 4)[on].reshape(-1))
    assert torch.allclose(probe.loss(input_vit, batch, box_weight=2.0), expected + 2 * boxes)


def test_answer_and_where_probes_read_the_middle_layer(tiny_model, tokenizer):
    probe, where = (
        toy_train.AnswerProbe(tiny_model.config.hidden_size),
        toy_train.WhereProbe(tiny_model.config.hidden_size),
    )
    for head in (probe.tag, probe.inventory, probe.count, probe.asked, where.box, where.digit):
        head.weight.data.zero_()
        head.bias.data.zero_()
    probe.tag.bias.data = torch.tensor([0.0, 50.0])  # always says "picture 2": right on exactly half the tagged tokens
    tap = toy_train.LayerTap(tiny_model, [1])
    hidden, vocab_size = tiny_model.config.hidden_size, tiny_model.config.vocab_size
    chance = math.log(2) + math.log(3)  # inventory (binary, logit 0) + count (three classes, equal logits)
    for pictures, seed in ((2, 3), (1, 4)):
        conversations = [toy_batches.make_conversation(random.Random(seed + k), pictures) for k in range(2)]
        batch = toy_batches.make_batch(tokenizer, conversations, image_size=56)
        fake_ids, table, tasks, span = single_table_batch(
            batch["ids"], torch.zeros(2 * pictures, 256, hidden), vocab_size
        )
        with torch.no_grad():
            tiny_model(fake_ids, attention_mask=batch["mask"], prompt_table=table, tasks=tasks, task_vocab_size=span)
        middle = tap.hidden[1]
        assert middle.shape == (*fake_ids.shape, hidden)  # the first block's output was captured
        loss = probe.loss(middle, fake_ids, vocab_size, batch)
        # two pictures: tags 50 on picture 1's tokens, 0 on picture 2's; the pair asked at chance (12 classes)
        expected = chance + math.log(12) + (25.0 if pictures == 2 else 0.0)
        assert torch.isclose(loss, torch.tensor(expected), atol=1e-3)
        if pictures == 1:  # box bins and digits at chance
            assert torch.isclose(where.box_loss(middle, batch), torch.tensor(math.log(50)), atol=1e-4)
            assert torch.isclose(where.digit_loss(middle, batch), torch.tensor(math.log(10)), atol=1e-4)
    tap.remove()
    assert not tiny_model.transformer.h[0]._forward_hooks


SHORT = toy_train.Recipe(seed=7, batch_size=2, vision_steps=2, steps=3, sharpen_steps=2, digit_probe=1.0)


@pytest.mark.slow
def test_training_is_deterministic(tmp_path):
    for run in ("a", "b"):
        toy_train.train(SHORT, tmp_path / run, eval_every=0)
    first, second = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert first["lm_head.weight"].dtype == torch.bfloat16  # stored like Qwen-VL-Chat


@pytest.mark.slow
def test_a_paused_run_resumes_where_it_stopped(tmp_path, capsys):
    state = tmp_path / "state"
    assert toy_train.train(SHORT, tmp_path / "model", eval_every=0, state_dir=state, time_limit=0) is None
    assert "paused at stage 1: the vision tower, step 1 of 2" in capsys.readouterr().out
    saved = toy_train.read_state(state)
    assert (saved["stage"], saved["step"]) == (0, 1) and saved["recipe"]["steps"] == 3
    # resumed with other settings: the run keeps the recipe it started with, and ends like an uninterrupted run
    model = toy_train.train(toy_train.Recipe(), tmp_path / "model", eval_every=0, state_dir=state)
    toy_train.train(SHORT, tmp_path / "straight", eval_every=0)
    resumed, straight = (load_file(tmp_path / d / "model.safetensors") for d in ("model", "straight"))
    assert model is not None and toy_train.read_state(state)["stage"] == 3
    assert all(torch.allclose(resumed[k].float(), straight[k].float(), atol=0.05) for k in straight)


def test_training_refuses_a_folder_it_must_not_write_before_it_trains(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "file").write_text("")
    cases = [
        (tmp_path / "ckpt", False, FileExistsError, "is not empty: name a new folder, or pass overwrite=True"),
        (tmp_path / "mine", True, FileExistsError, r"holds more than a checkpoint \(notes.txt\) and is not replaced"),
        (tmp_path / "file", False, NotADirectoryError, "is a file, not a folder"),
    ]
    for out, overwrite, error, message in cases:
        with pytest.raises(error, match=message):
            toy_train.train(SHORT, out, eval_every=0, overwrite=overwrite)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(SystemExit):
        toy_train.main(["--time-limit", "5"])  # a pause needs somewhere to save


def test_the_default_output_is_a_folder_of_its_own(monkeypatch, tmp_path):

    monkeypatch.setenv("QWENVL_LAB_OUTPUT", str(tmp_path))
    assert toy_train.default_output_dir() == tmp_path / "toy-qwen-vl" != TOY_DIR


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
def test_training_on_cuda_runs_its_held_out_checks_there(tmp_path, capsys):
    """`--device cuda`: the model trains on the GPU with workers making the batches, and the held-out check it prints
    every eval_every steps runs there."""
    model = toy_train.train(SHORT, tmp_path, device="cuda", eval_every=3, workers=2)
    assert "stage 2: the whole model, step 3: loss" in capsys.readouterr().out
    assert (tmp_path / "model.safetensors").exists() and model.device.type == "cpu"  # saved and returned on the CPU


@pytest.mark.slow
def test_evaluate_command_prints_every_question_kind(tiny_checkpoint, capsys):
    toy_evaluate.main(["--checkpoint", str(tiny_checkpoint), "--seed", "2", "--n", "10"])
    out = capsys.readouterr().out
    for key in ("what/en", "color/zh", "count/en", "which/zh", "where/en", "none/zh", "overall", "table zeroed"):
        assert key in out

"""Training the toy model: the compact-vocabulary loss, the token sets, determinism, the evaluation command."""

import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from qwenvl_lab.img_pos import locate_img_pos
from qwenvl_lab.tokenizing import IM_END_ID
from qwenvl_lab.toy import evaluate as toy_evaluate
from qwenvl_lab.toy import train as toy_train
from qwenvl_lab.toy.shapes import COLORS, KINDS, make_dataset


@pytest.fixture(scope="module")
def token_sets(tokenizer):
    return toy_train.used_token_ids(tokenizer)


def test_compact_loss_equals_full_vocabulary_cross_entropy(tiny_model, token_sets):
    vocab = toy_train.CompactVocab(tiny_model, *token_sets)
    torch.manual_seed(0)
    hidden = torch.randn(5, tiny_model.config.hidden_size)
    targets = torch.tensor(random.Random(0).choices(token_sets[1], k=5))
    full_head = torch.zeros(tiny_model.config.vocab_size, tiny_model.config.hidden_size)
    full_head[token_sets[1]] = vocab.head.detach()
    expected = F.cross_entropy(hidden @ full_head.T, targets)
    assert torch.allclose(vocab.loss(hidden, targets), expected, atol=1e-5)


def test_write_back_keeps_trained_rows_and_zeroes_the_rest(tiny_checkpoint, token_sets):
    from qwenvl_lab.checkpoint import load_checkpoint

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
    for example in make_dataset(3, 48):
        context, answer = toy_train.encode_example(tokenizer, example)
        assert set(answer) <= outputs, example.answer
        ids = torch.tensor(context)
        for _, a, b in locate_img_pos(ids).tolist():
            ids[a + 1 : b] = -1
        assert set(ids.tolist()) - {-1} <= inputs


def test_make_batch_targets_are_the_answers_of_every_turn(tokenizer):
    rng = random.Random(5)
    conversations = [toy_train.make_conversation(rng, pictures) for pictures in (1, 1, 2)]
    ids, mask, target_mask, targets, pixels, asked = toy_train.make_batch(tokenizer, conversations)
    assert pixels.shape[0] == 4
    start = 0
    for row, (_, turns) in enumerate(conversations):
        n = int(target_mask[row].sum())
        assert tokenizer.decode(targets[start : start + n].tolist()) == "".join(a + "<|im_end|>" for _, a in turns)
        start += n
    assert len(locate_img_pos(ids)) == 4
    # the pair asked sits where the answers of two-picture questions are predicted, and only there
    assert (asked[:2] == -100).all() and torch.equal(asked[2] >= 0, target_mask[2])
    _, turns = conversations[2]
    starts = (target_mask[2] & ~target_mask[2].roll(1)).nonzero()[:, 0]  # the first position of each answer
    assert [int(asked[2, c]) for c in starts.tolist()] == [toy_train.WHICH_ASKED[q] for q, _ in turns]
    assert toy_train.WHICH_ASKED["哪张图片里有蓝色的正方形？"] == COLORS.index("blue") * len(KINDS) + KINDS.index(
        "square"
    )


def test_conversations_ask_what_the_templates_allow(tokenizer):
    rng = random.Random(1)
    for _ in range(20):
        scenes, turns = toy_train.make_conversation(rng, 1)
        assert 2 <= len(turns) <= 3 and len({q for q, _ in turns}) == len(turns)
        scenes, turns = toy_train.make_conversation(rng, 2)
        assert len(scenes) == 2 and all(
            a in {"Picture 1.", "Picture 2.", "第一张图片。", "第二张图片。"} for _, a in turns
        )


def test_a_conversation_extends_the_single_question_prompt(tokenizer):
    example = make_dataset(2, 1)[0]
    context, answer = toy_train.encode_example(tokenizer, example)
    ids, spans = toy_train.encode_conversation(
        tokenizer, 1, [(example.question, example.answer), ("How many shapes are there?", "Two.")]
    )
    assert ids[: len(context) + len(answer)] == context + answer
    assert tokenizer.decode(ids[spans[1][0] : spans[1][1]]) == "Two.<|im_end|>"


@pytest.mark.slow
def test_training_is_deterministic(tmp_path):
    for run in ("a", "b"):
        toy_train.train(
            steps=2, batch_size=2, seed=7, output_dir=tmp_path / run, eval_every=0, vision_steps=2, sharpen_steps=2
        )
    first, second = (load_file(tmp_path / run / "model.safetensors") for run in ("a", "b"))
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert first["lm_head.weight"].dtype == torch.bfloat16  # stored like Qwen-VL-Chat


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
def test_training_on_cuda_runs_its_held_out_checks_there(tmp_path, capsys):
    """`--device cuda`: the model trains on the GPU and the held-out check it prints every eval_every steps runs there."""
    model = toy_train.train(
        steps=2, batch_size=2, seed=7, output_dir=tmp_path, eval_every=2, vision_steps=2, sharpen_steps=2, device="cuda"
    )
    assert "stage 2: the whole model, step 2: loss" in capsys.readouterr().out
    assert (tmp_path / "model.safetensors").exists() and model.device.type == "cpu"  # saved and returned on the CPU


def test_evaluate_command_prints_every_question_kind(tiny_checkpoint, capsys):
    toy_evaluate.main(["--checkpoint", str(tiny_checkpoint), "--seed", "2", "--n", "8"])
    out = capsys.readouterr().out
    for key in ("what/en", "color/zh", "count/en", "which/zh", "overall", "table zeroed"):
        assert key in out


def test_patch_labels_mark_each_shape_and_its_rank():
    from qwenvl_lab.toy.shapes import COLORS, KINDS, Scene, Shape

    scene = Scene((Shape("triangle", "green", (0.6, 0.1, 0.9, 0.4)), Shape("circle", "red", (0.05, 0.5, 0.45, 0.9))))
    shape, rank = toy_train.patch_labels(scene)
    assert shape.shape == rank.shape == (256,)
    grid = lambda x, y: int(y * 16) * 16 + int(x * 16)  # noqa: E731 - patch index of a point
    assert shape[grid(0.25, 0.7)] == 1 + COLORS.index("red") * 3 + KINDS.index("circle") and rank[grid(0.25, 0.7)] == 1
    assert (
        shape[grid(0.75, 0.3)] == 1 + COLORS.index("green") * 3 + KINDS.index("triangle") and rank[grid(0.75, 0.3)] == 2
    )
    assert shape[grid(0.02, 0.02)] == 0 and rank[grid(0.02, 0.02)] == 0
    assert set(rank.tolist()) == {0, 1, 2}


def test_patch_probe_adds_the_loss_over_the_queries_on_a_shape():
    from qwenvl_lab.toy.shapes import random_scene

    torch.manual_seed(0)
    scenes = [random_scene(random.Random(k)) for k in range(2)]
    probe = toy_train.PatchProbe(16)
    input_vit = torch.randn(2, 256, 16)
    shape, rank = (torch.cat(t) for t in zip(*map(toy_train.patch_labels, scenes)))
    rows, on = input_vit.reshape(-1, 16), shape > 0
    expected = sum(
        F.cross_entropy(head(rows), labels) + F.cross_entropy(head(rows)[on], labels[on])
        for head, labels in ((probe.shape, shape), (probe.rank, rank))
    )
    assert 0 < on.sum() < len(on)
    assert torch.allclose(probe.loss(input_vit, scenes), expected)


def test_picture_probe_tags_every_image_token_and_summarises_at_image_end(tiny_model, tokenizer):
    import math

    from qwenvl_lab.prompt_table import single_table_batch

    probe = toy_train.PictureProbe(tiny_model, layer=1)
    for head in (probe.tag, probe.inventory, probe.count, probe.asked):
        head.weight.data.zero_()
        head.bias.data.zero_()
    probe.tag.bias.data = torch.tensor([0.0, 50.0])  # always says "picture 2": right on exactly half the tagged tokens
    rng = random.Random(3)
    hidden, vocab_size = tiny_model.config.hidden_size, tiny_model.config.vocab_size
    chance = math.log(2) + math.log(3)  # inventory (binary, logit 0) + count (three classes, equal logits)
    # two pictures: tags 50 on picture 1's tokens, 0 on picture 2's, and the pair asked at chance (12 classes)
    for pictures, two_picture_loss in ((2, 25.0 + math.log(12)), (1, 0.0)):
        conversations = [toy_train.make_conversation(rng, pictures) for _ in range(2)]
        ids, mask, *_, asked = toy_train.make_batch(tokenizer, conversations)
        fake_ids, table, tasks, span = single_table_batch(ids, torch.zeros(2 * pictures, 256, hidden), vocab_size)
        with torch.no_grad():
            tiny_model(fake_ids, attention_mask=mask, prompt_table=table, tasks=tasks, task_vocab_size=span)
        assert probe.hidden.shape == (*ids.shape, hidden)  # the first block's output was captured
        loss = probe.loss(fake_ids, vocab_size, [s for scenes, _ in conversations for s in scenes], asked)
        assert torch.isclose(loss, torch.tensor(two_picture_loss + chance), atol=1e-3)
    probe.hook.remove()

"""`python -m qwenvl_lab.toy.train` — train the toy Qwen-VL on shape pictures from random weights and save it.

Images enter exactly as at inference: the vision tower's `input_vit` becomes the prompt table and the image spans hold
fake prompt ids, read by the package's prompt-table lookup. The vocabulary keeps its real size (151936), but only the
rows the data uses are trained; every other row of `wte` and `lm_head` stays zero, which keeps the shipped
checkpoint small. The loss is the full-vocabulary cross-entropy all the same: the zero rows give logit 0, so they
enter the softmax as one extra column of logit log(#zero rows).

Three stages (docs/toy-model.md gives the recipe and its reasons):
1. The vision tower alone, through a throw-away probe on `input_vit`: for each image query, the shape under its grid
   cell (colour and kind), its left-to-right rank and its box.
2. The whole model on multi-turn chats about zero, one or two pictures (every question the templates allow, languages
   mixed). The patch probe keeps training, and a throw-away probe on a middle layer asks each `</img>` what its
   picture holds, each image token of a two-picture chat which picture it belongs to, and each position that
   predicts a "which" or "where" answer which (colour, kind) pair was asked and, for "where", the box.
3. Sharpening: the same chats at 0.3 × the learning rate on a schedule of its own.
The probes are not part of the model and are not saved.

A run can stop after a time limit and resume where it stopped (`--state DIR`): a training step's batch depends only
on (seed, stage, step), and the state holds the weights, probes, optimizer and schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import files, options
from ..checkpoint import check_checkpoint_target, save_checkpoint
from ..checks.values import check_path, is_int, is_number
from ..modeling import QWenLMHeadModel, QWenVLConfig
from ..options import Parser
from ..prompt_table import prompt_tuning_embedding, single_table_batch
from ..resources import output_dir
from ..tokenizing import IMAGE_END_ID, IMAGE_START_ID, load_tokenizer
from .batches import BOX_BINS, StepBatches, used_token_ids
from .course import TOY_CONFIG
from .evaluate import evaluate
from .shapes import COLORS, KINDS, MAX_SHAPES

STEPS, VISION_STEPS, SHARPEN_STEPS, EVAL_EVERY = 7000, 1500, 1000, 1000
PAIRS = len(COLORS) * len(KINDS)


@dataclass(frozen=True)
class Recipe:
    """The settings of a training run that decide its weights (the defaults are the shipped model's)."""

    seed: int = 0
    batch_size: int = 32
    lr: float = 1e-3
    vision_steps: int = VISION_STEPS
    steps: int = STEPS
    sharpen_steps: int = SHARPEN_STEPS
    image_size: int = TOY_CONFIG["visual"]["image_size"]  # the vision tower's input, pixels a side
    picture_probe: float = 1.0  # weight of the middle-layer probe
    probe_layer: int = 2
    box_probe: float = 1.0  # weight of the box heads: on image queries, and on "where" answers at `box_layer`
    box_layer: int = 3
    digit_probe: float = 1.0  # weight of a head that predicts each box digit at `digit_layer`
    digit_layer: int = 3
    where_weight: float = 2.0  # weight of the answer loss at "where" answers' tokens
    no_picture_every: int = 8  # one chat in N of a one-picture step has no picture

    def stages(self) -> list[tuple[str, str, int, float, int, int]]:
        """(name, progress label, steps, learning rate, batch size, two pictures every N steps) of each stage."""
        return [
            ("vision", "stage 1: the vision tower", self.vision_steps, 2 * self.lr, 2 * self.batch_size, 0),
            ("whole", "stage 2: the whole model", self.steps, self.lr, self.batch_size, 3),
            ("sharpen", "stage 3: sharpening", self.sharpen_steps, 0.3 * self.lr, self.batch_size, 2),
        ]

    def model_config(self) -> dict:
        """The model's config: the toy architecture with this recipe's vision input."""
        return {**TOY_CONFIG, "visual": {**TOY_CONFIG["visual"], "image_size": self.image_size}}


class PatchProbe(torch.nn.Module):
    """Throw-away head on `input_vit`: per image query, the shape under its grid cell, its rank and its box."""

    def __init__(self, hidden: int):
        super().__init__()
        self.shape = torch.nn.Linear(hidden, 1 + PAIRS)
        self.rank = torch.nn.Linear(hidden, 1 + MAX_SHAPES)
        self.box = torch.nn.Linear(hidden, 4 * BOX_BINS)

    def loss(self, input_vit, batch, box_weight: float) -> torch.Tensor:
        """Cross-entropy of the shape and rank heads over every query, plus over the queries on a shape alone (most
        are background), plus the box head's over the queries on a shape."""
        rows = input_vit.reshape(-1, input_vit.shape[-1]).float()  # [N*256, H]
        shape, rank = batch["patch_shape"].reshape(-1), batch["patch_rank"].reshape(-1)  # [N*256] each
        on = shape > 0
        total = rows.new_zeros(())
        for head, labels in ((self.shape, shape), (self.rank, rank)):
            logits = head(rows)
            total = total + F.cross_entropy(logits, labels) + F.cross_entropy(logits[on], labels[on])
        if box_weight:
            boxes = self.box(rows[on]).view(-1, BOX_BINS)  # [on*4, bins]
            total = total + box_weight * F.cross_entropy(boxes, batch["patch_box"].reshape(-1, 4)[on].reshape(-1))
        return total


class LayerTap:
    """The outputs of some of the model's decoder layers in its last forward (forward hooks)."""

    def __init__(self, model, layers):
        self.hidden = {}
        self.hooks = [
            model.transformer.h[layer - 1].register_forward_hook(
                lambda module, args, out, layer=layer: self.hidden.__setitem__(layer, out)
            )
            for layer in sorted(set(layers))
        ]

    def remove(self):
        """Take the hooks off the model."""
        for hook in self.hooks:
            hook.remove()


class AnswerProbe(torch.nn.Module):
    """Throw-away heads on a middle layer's output: at each image token and `</img>` of a two-picture chat, which
    picture it belongs to; at each `</img>`, the (colour, kind) pairs its picture holds and how many shapes; at each
    position that predicts a "which" or "where" answer, the pair asked (one class of 12: the question's colour and
    kind together, which the answer has to match against the pictures)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.tag = torch.nn.Linear(hidden, 2)
        self.inventory = torch.nn.Linear(hidden, PAIRS)
        self.count = torch.nn.Linear(hidden, MAX_SHAPES)
        self.asked = torch.nn.Linear(hidden, PAIRS)

    def loss(self, hidden, fake_ids, vocab_size: int, batch) -> torch.Tensor:
        """The heads' losses on `hidden` [B, L, H] of the prompts `fake_ids` [B, L]."""
        hidden = hidden.float()
        ends = fake_ids == IMAGE_END_ID  # [B, L], one per picture, in the order of the batch's pictures
        summary = hidden[ends]  # [N, H]
        total = F.binary_cross_entropy_with_logits(self.inventory(summary), batch["held"])
        total = total + F.cross_entropy(self.count(summary), batch["shapes"])
        two = (batch["pictures"] == 2)[:, None]  # [B, 1]
        tagged = ((fake_ids >= vocab_size) | ends) & two  # [B, L]
        if tagged.any():
            index = (fake_ids == IMAGE_START_ID).cumsum(dim=1) - 1  # [B, L]: the picture each token follows
            total = total + F.cross_entropy(self.tag(hidden[tagged]), index[tagged])
        asked = batch["asked"] >= 0  # [B, L]
        if asked.any():
            total = total + F.cross_entropy(self.asked(hidden[asked]), batch["asked"][asked])
        return total


class WhereProbe(torch.nn.Module):
    """Throw-away heads for "where" answers: at each position that predicts one, the box's four bins; at each that
    predicts a coordinate digit, that digit."""

    def __init__(self, hidden: int):
        super().__init__()
        self.box = torch.nn.Linear(hidden, 4 * BOX_BINS)
        self.digit = torch.nn.Linear(hidden, 10)

    def box_loss(self, hidden, batch) -> torch.Tensor:
        """Cross-entropy of the box bins at the positions that predict a "where" answer ([B, L, H] in)."""
        where = batch["box"][..., 0] >= 0  # [B, L]
        if not where.any():
            return hidden.new_zeros((), dtype=torch.float32)
        boxes = self.box(hidden[where].float()).view(-1, BOX_BINS)  # [W*4, bins]
        return F.cross_entropy(boxes, batch["box"][where].reshape(-1))

    def digit_loss(self, hidden, batch) -> torch.Tensor:
        """Cross-entropy of the digit at the positions that predict a box's coordinate digit ([B, L, H] in)."""
        digits = batch["digit"] >= 0  # [B, L]
        if not digits.any():
            return hidden.new_zeros((), dtype=torch.float32)
        return F.cross_entropy(self.digit(hidden[digits].float()), batch["digit"][digits])


class CompactVocab(torch.nn.Module):
    """Trainable rows of `wte` and `lm_head` for the ids the data uses (all other rows stay zero)."""

    def __init__(self, model, input_ids_used, output_ids_used):
        super().__init__()
        vocab_size = model.config.vocab_size
        self.register_buffer("remap", torch.full((vocab_size,), -1, dtype=torch.long))
        self.remap[torch.tensor(input_ids_used)] = torch.arange(len(input_ids_used))
        self.register_buffer("head_remap", torch.full((vocab_size,), -1, dtype=torch.long))
        self.head_remap[torch.tensor(output_ids_used)] = torch.arange(len(output_ids_used))
        self.input_ids_used, self.output_ids_used = input_ids_used, output_ids_used
        self.wte = torch.nn.Parameter(model.transformer.wte.weight.data[input_ids_used].clone())
        self.head = torch.nn.Parameter(model.lm_head.weight.data[output_ids_used].clone())
        self.log_zero_rows = math.log(vocab_size - len(output_ids_used))

    def embed(self, ids, prompt_table, tasks, task_vocab_size, vocab_size):
        """The prompt-table lookup over the compact vocabulary."""
        fake = ids >= vocab_size
        compact = torch.where(
            fake, ids - vocab_size + len(self.input_ids_used), self.remap[ids.clamp(max=vocab_size - 1)]
        )
        if (compact < 0).any():
            raise ValueError("a training sequence holds a token outside the compact vocabulary")
        return prompt_tuning_embedding(
            compact, self.wte, prompt_table, tasks, task_vocab_size, len(self.input_ids_used)
        )

    def loss(self, hidden, targets, weights=None):
        """Full-vocabulary cross-entropy (weighted per token by `weights`): trained rows + the zero rows as one column
        of logit log(count)."""
        logits = hidden.float() @ self.head.T  # [T, U]
        logits = torch.cat([logits, logits.new_full((logits.shape[0], 1), self.log_zero_rows)], dim=1)
        index = self.head_remap[targets]
        if (index < 0).any():
            raise ValueError("a training answer holds a token outside the compact vocabulary")
        if weights is None:
            return F.cross_entropy(logits, index)
        return (F.cross_entropy(logits, index, reduction="none") * weights).sum() / weights.sum()

    def write_back(self, model):
        """Copy the trained rows into the full-size matrices, zeroing every other row."""
        with torch.no_grad():
            model.transformer.wte.weight.zero_()
            model.transformer.wte.weight[self.input_ids_used] = self.wte
            model.lm_head.weight.zero_()
            model.lm_head.weight[self.output_ids_used] = self.head


def optimizer(params, lr: float, steps: int, no_decay=()):
    """AdamW with a one-cycle schedule (5 % warm-up); `no_decay` parameters (embedding rows) are not decayed."""
    opt = torch.optim.AdamW(
        [{"params": list(params), "weight_decay": 0.01}, {"params": list(no_decay), "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=max(steps, 1), pct_start=0.05)


class Trainer:
    """The model, its compact vocabulary and the probes of one run, with what a resumed run needs to continue."""

    def __init__(self, recipe: Recipe, device):
        self.recipe, self.device = recipe, torch.device(device)
        torch.manual_seed(recipe.seed)
        self.tokenizer = load_tokenizer()
        self.model = QWenLMHeadModel(QWenVLConfig(**recipe.model_config())).to(self.device)
        self.vocab = CompactVocab(self.model, *used_token_ids(self.tokenizer)).to(self.device)
        hidden = self.model.config.hidden_size
        self.patch_probe = PatchProbe(hidden).to(self.device)
        self.answer_probe = AnswerProbe(hidden).to(self.device)
        self.where_probe = WhereProbe(hidden).to(self.device)
        self.tap = LayerTap(self.model, [recipe.probe_layer, recipe.box_layer, recipe.digit_layer])
        self.stage, self.step, self.seconds = 0, 0, 0.0  # where the run stands; seconds of training so far
        self.model.train()

    MODULES = ("vocab", "patch_probe", "answer_probe", "where_probe")

    def modules(self) -> dict:
        """The trained modules by name (the model without its two vocabulary matrices, which `vocab` holds)."""
        return {name: getattr(self, name) for name in self.MODULES}

    def body(self) -> list:
        """The model's parameters outside its vocabulary matrices."""
        return [p for n, p in self.model.named_parameters() if not n.endswith(("wte.weight", "lm_head.weight"))]

    def stage_optimizer(self, name: str, steps: int, lr: float):
        """The optimizer and schedule of a stage: the vision tower and the patch probe, or everything."""
        if name == "vision":
            return optimizer([*self.model.transformer.visual.parameters(), *self.patch_probe.parameters()], lr, steps)
        probes = [*self.patch_probe.parameters(), *self.answer_probe.parameters(), *self.where_probe.parameters()]
        return optimizer([*self.body(), *probes], lr, steps, no_decay=self.vocab.parameters())

    def vision_loss(self, batch) -> torch.Tensor:
        """Stage 1's loss: the patch probe on the vision tower's output alone."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            input_vit = self.model.transformer.visual(batch["pixels"])  # [N, 256, H]
            return self.patch_probe.loss(input_vit, batch, self.recipe.box_probe)

    def chat_loss(self, batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Stages 2 and 3: (answer loss, probes' loss) of a batch of chats; (NaN, None) once the vision tower's output
        is no longer finite (its weights diverged), which the prompt table would refuse."""
        r, vocab_size = self.recipe, self.model.config.vocab_size
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            input_vit = self.model.transformer.visual(batch["pixels"])  # [N, 256, H]
            if not torch.isfinite(input_vit).all():
                return input_vit.new_full((), math.nan, dtype=torch.float32), None
            fake_ids, table, tasks, task_vocab_size = single_table_batch(batch["ids"], input_vit.float(), vocab_size)
            embeds = self.vocab.embed(fake_ids, table, tasks, task_vocab_size, vocab_size)  # [B, L, H]
            hidden, _ = self.model.transformer(inputs_embeds=embeds, attention_mask=batch["mask"])
            target_mask = batch["target_mask"]
            weights = None
            if r.where_weight != 1.0:
                weights = 1.0 + (r.where_weight - 1.0) * (batch["box"][..., 0][target_mask] >= 0).float()  # [T]
            loss = self.vocab.loss(hidden[target_mask], batch["targets"], weights)
            aux = self.patch_probe.loss(input_vit, batch, r.box_probe)
            if r.picture_probe:
                middle = self.tap.hidden[r.probe_layer]
                aux = aux + r.picture_probe * self.answer_probe.loss(middle, fake_ids, vocab_size, batch)
            if r.box_probe:
                aux = aux + r.box_probe * self.where_probe.box_loss(self.tap.hidden[r.box_layer], batch)
            if r.digit_probe:
                aux = aux + r.digit_probe * self.where_probe.digit_loss(self.tap.hidden[r.digit_layer], batch)
        return loss, aux

    def evaluate(self, seed: int, n: int) -> dict:
        """Held-out accuracy of the model as it stands (its vocabulary rows written back)."""
        self.vocab.write_back(self.model)
        self.model.eval()
        try:
            return evaluate(self.model, self.tokenizer, seed=seed, n=n)
        finally:
            self.model.train()

    def state(self, opt, sched) -> dict:
        """Everything a resumed run needs."""
        return {
            "recipe": dataclasses.asdict(self.recipe),
            "stage": self.stage,
            "step": self.step,
            "seconds": self.seconds,
            "model": {
                k: v for k, v in self.model.state_dict().items() if not k.endswith(("wte.weight", "lm_head.weight"))
            },
            **{name: module.state_dict() for name, module in self.modules().items()},
            "optimizer": opt.state_dict(),
            "schedule": sched.state_dict(),
        }

    def load(self, state: dict) -> dict:
        """Take the weights and progress of a saved state; returns its optimizer and schedule states."""
        missing = self.model.load_state_dict(state["model"], strict=False).missing_keys
        if set(missing) - {"transformer.wte.weight", "lm_head.weight"}:
            raise ValueError(f"the training state lacks weights of the model: {sorted(missing)[:3]} …")
        for name, module in self.modules().items():
            module.load_state_dict(state[name])
        self.stage, self.step, self.seconds = state["stage"], state["step"], state["seconds"]
        return {"optimizer": state["optimizer"], "schedule": state["schedule"]}


STATE_FILE = "state.pt"
STATE_WRITER = files.writer("training state", "a training state (state.pt)")


def model_sizes(recipe: Recipe) -> tuple[int, int]:
    """(all weights, weights outside the two vocabulary matrices) of the model `recipe` trains, counted without
    making it."""
    with torch.device("meta"):
        model = QWenLMHeadModel(QWenVLConfig(**recipe.model_config()))
    total = sum(p.numel() for p in model.parameters())
    return total, total - model.transformer.wte.weight.numel() - model.lm_head.weight.numel()


def state_bytes(recipe: Recipe) -> int:
    """About how many bytes a training state takes: the weights outside the vocabulary matrices in float32, twice
    more for the optimizer's two moments, and room for the compact vocabulary and the probes."""
    return 3 * 4 * model_sizes(recipe)[1] + 64 * 2**20


def is_state(path) -> bool:
    """True for a training state this package saved (a torch file of a dict with the run's recipe and progress; its
    tensors are mapped, not read)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 — anything torch cannot read as a state is not one
        return False
    return isinstance(state, dict) and {"recipe", "stage", "step"} <= set(state)


def save_state(state_dir, state: dict, need_bytes: int = 0) -> None:
    """Write the training state as state_dir/state.pt (the folder made if needed), replacing the run's earlier one
    (a file that is not a training state is refused) only once the new one is complete."""
    with files.writing_file(
        Path(state_dir) / STATE_FILE, STATE_WRITER, need_bytes=need_bytes, parents=True, made=is_state
    ) as part:
        torch.save(state, part)


def read_state(state_dir) -> dict | None:
    """The training state saved in `state_dir`, or None when there is none yet; a ValueError naming the file when it
    holds something else (another program's file, a damaged state, a state of other settings)."""
    path = check_path("state_dir", state_dir) / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 — any file can lie there: whatever torch.load makes of it, it is not ours
        raise ValueError(foreign_state(path, f"torch.load cannot read it: {type(err).__name__} {err}")) from None
    keys = {"recipe", "stage", "step", "seconds", "model", "optimizer", "schedule", *Trainer.MODULES}
    if not isinstance(state, dict) or not keys <= set(state) or not isinstance(state["recipe"], dict):
        raise ValueError(foreign_state(path))
    if set(state["recipe"]) != set(RECIPE_OPTIONS):
        raise ValueError(
            foreign_state(path, f"its recipe has other settings: {sorted(set(state['recipe']) ^ set(RECIPE_OPTIONS))}")
        )
    for key, value in state["recipe"].items():
        try:
            RECIPE_OPTIONS[key](str(value) if is_number(value) else "")  # the command line's own check of it
        except argparse.ArgumentTypeError as err:
            raise ValueError(foreign_state(path, f"its recipe's {key} {err}")) from None
    if not all(is_int(state[k]) and state[k] >= 0 for k in ("stage", "step")):
        raise ValueError(foreign_state(path, f"stage {state['stage']!r}, step {state['step']!r}"))
    return state


def foreign_state(path: Path, reason: str = "") -> str:
    """What to say about a file in a --state folder that is not a training state this run can resume."""
    reason = " ".join(reason.split())[:200]
    return (
        f"--state: {path} is not a training state that qwenvl-lab train can resume"
        + (f" ({reason})" if reason else "")
        + ": give --state a folder of its own (a new or empty one starts afresh), or move that file away"
    )


def resume(trainer: Trainer, saved_state: dict | None, state_dir) -> dict | None:
    """`trainer.load` of a saved state (None: nothing to resume); a ValueError naming the file when its weights do not
    fit this model."""
    if saved_state is None:
        return None
    try:
        return trainer.load(saved_state)
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise ValueError(foreign_state(Path(state_dir) / STATE_FILE, str(err))) from None


def diverged(loss: torch.Tensor, recipe: Recipe, label: str, step: int) -> str:
    """What to say when training reaches a loss that is not a finite number: the weights have diverged."""
    return (
        f"training diverged at {label}, step {step}: the loss is {loss.item()}, so the weights are no longer finite "
        f"numbers: most likely the learning rate is too large (--lr {recipe.lr:g}): try a smaller one (the default "
        f"is {Recipe().lr:g}); nothing of this run was saved as a model"
    )


def _loader(dataset, start: int, workers: int, pin: bool):
    """The batches of `dataset` from step `start` on, made by `workers` processes ahead of the training loop."""
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        sampler=range(start, len(dataset)),
        num_workers=workers,
        prefetch_factor=4 if workers else None,
        pin_memory=pin,
    )


def train(  # noqa: PLR0913 — the training command line's options, one argument each
    recipe: Recipe = Recipe(),
    output_dir=None,
    device="cpu",
    eval_every: int = EVAL_EVERY,
    state_dir=None,
    time_limit: float | None = None,
    save_every: float = 300.0,
    workers: int = 0,
    overwrite: bool = False,
):
    """Train the toy model and save it in Qwen-VL-Chat's layout into `output_dir` (a new or empty folder; overwrite:
    replace the checkpoint there); returns the model on the CPU. With `state_dir` the run resumes from the state saved
    there and saves its own every `save_every` seconds; past `time_limit` seconds it saves and returns None."""
    started = time.monotonic()
    saved_state = read_state(state_dir) if state_dir is not None else None
    if saved_state is not None:
        recipe = Recipe(**saved_state["recipe"])  # a resumed run keeps the recipe it started with
    output_dir = check_path("output_dir", output_dir) if output_dir is not None else default_output_dir()
    # refused now, not after the training: what is there, the folders' rights and their room for what will be saved
    check_checkpoint_target(output_dir, overwrite, need_bytes=2 * model_sizes(recipe)[0] + 2**20)
    need_state = state_bytes(recipe)
    if state_dir is not None:
        files.check_destination(
            Path(state_dir) / STATE_FILE,
            STATE_WRITER,
            folder=False,
            need_bytes=need_state,
            parents=True,
            made=is_state,
        )
    trainer = Trainer(recipe, device)
    resumed = resume(trainer, saved_state, state_dir)
    last_save = time.monotonic()
    for index, (name, label, steps, lr, batch_size, two_every) in enumerate(recipe.stages()):
        if index < trainer.stage or steps == 0:
            continue
        opt, sched = trainer.stage_optimizer(name, steps, lr)
        if resumed is not None and trainer.step > 0:  # paused inside this stage
            opt.load_state_dict(resumed["optimizer"])
            sched.load_state_dict(resumed["schedule"])
        resumed = None
        dataset = StepBatches(
            recipe.seed,
            name,
            steps,
            batch_size,
            recipe.image_size,
            two_pictures_every=max(two_every, 1),
            no_picture_every=recipe.no_picture_every,
        )
        bar = tqdm(
            _loader(dataset, trainer.step, workers, trainer.device.type == "cuda"),
            desc=label,
            initial=trainer.step,
            total=steps,
        )
        params = [p for group in opt.param_groups for p in group["params"]]
        for batch in bar:
            tick = time.monotonic()
            batch = batch.to(trainer.device)
            if name == "vision":
                loss, aux = trainer.vision_loss(batch), None
            else:
                loss, aux = trainer.chat_loss(batch)
            if not torch.isfinite((loss if aux is None else loss + aux).detach()):
                bar.close()
                raise ValueError(diverged(loss if aux is None else loss + aux, recipe, label, trainer.step + 1))
            opt.zero_grad(set_to_none=True)
            (loss if aux is None else loss + aux).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            trainer.step += 1
            trainer.seconds += time.monotonic() - tick
            bar.set_postfix(loss=f"{loss.item():.4f}", **({} if aux is None else {"probe": f"{aux.item():.3f}"}))
            if name != "vision" and eval_every and (trainer.step % eval_every == 0 or trainer.step == steps):
                accuracy = trainer.evaluate(seed=10_000 + trainer.step, n=48)["overall"]
                print(f"{label}, step {trainer.step}: loss {loss.item():.4f}; held-out accuracy {accuracy:.3f}")
            out_of_time = time_limit is not None and time.monotonic() - started > time_limit
            if state_dir is not None and (out_of_time or time.monotonic() - last_save > save_every):
                save_state(state_dir, trainer.state(opt, sched), need_state)
                last_save = time.monotonic()
            if out_of_time and trainer.step < steps:
                bar.close()
                print(f"paused at {label}, step {trainer.step} of {steps}: resume with --state {state_dir}")
                trainer.tap.remove()
                return None
        print(f"{label}: {steps} steps, {trainer.seconds:.0f} s of training so far")
        trainer.stage, trainer.step = index + 1, 0
        if state_dir is not None:
            save_state(state_dir, trainer.state(opt, sched), need_state)
    trainer.tap.remove()  # the probes are thrown away: the model keeps no hook
    trainer.vocab.write_back(trainer.model)
    model = trainer.model.eval().to("cpu", torch.bfloat16)
    save_checkpoint(model, output_dir, max_shard_size="100MB", overwrite=overwrite)
    return model.float()


def default_output_dir() -> Path:
    """Where training saves the model unless told otherwise: a folder of its own among the course outputs."""
    return output_dir() / "toy-qwen-vl"


# what each setting of the recipe accepts on the command line (a new setting needs its line here)
RECIPE_OPTIONS = {
    "seed": options.whole(0, options.SEED_MAX),
    "batch_size": options.whole(1, 65536),
    "lr": options.real(0, above=True),
    "vision_steps": options.whole(0),
    "steps": options.whole(0),
    "sharpen_steps": options.whole(0),
    "image_size": options.whole(14, 14 * 96, multiple=14),  # whole patches of 14 pixels
    "picture_probe": options.real(0),
    "probe_layer": options.whole(1, TOY_CONFIG["num_hidden_layers"]),
    "box_probe": options.real(0),
    "box_layer": options.whole(1, TOY_CONFIG["num_hidden_layers"]),
    "digit_probe": options.real(0),
    "digit_layer": options.whole(1, TOY_CONFIG["num_hidden_layers"]),
    "where_weight": options.real(0),
    "no_picture_every": options.whole(1),
}


def parser() -> Parser:
    """`qwenvl-lab train`'s options: where the run goes, and every setting of the recipe."""

    def check(parser, args):
        if args.state is None and args.time_limit is not None:
            parser.error("--time-limit needs --state DIR, where the run saves what it needs to resume")

    defaults = Recipe()
    parser = Parser(prog="qwenvl-lab train", description=__doc__.splitlines()[0], check=check)
    parser.add_argument(
        "--out",
        type=options.output_folder,
        default=None,
        help="a new or empty folder for the model (default: course-output/toy-qwen-vl)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the checkpoint already in --out")
    parser.add_argument("--device", type=options.device, default="cpu", help="cpu or cuda (default: %(default)s)")
    parser.add_argument(
        "--workers",
        type=options.whole(0, 256),
        default=None,
        help="processes that make the batches (default: 0 on a CPU, up to 8 on a GPU)",
    )
    parser.add_argument(
        "--state",
        type=options.output_folder,
        default=None,
        help="a folder for the training state: saved every --save-every seconds, resumed from when there",
    )
    parser.add_argument(
        "--time-limit", type=options.real(0, above=True), default=None, help="save the state and stop after S seconds"
    )
    parser.add_argument(
        "--save-every",
        type=options.real(0, above=True),
        default=300.0,
        help="seconds between saved states (default: 300)",
    )
    parser.add_argument(
        "--eval-every",
        type=options.whole(0),
        default=EVAL_EVERY,
        help="print a small held-out accuracy every N steps (0: never)",
    )
    for field in dataclasses.fields(Recipe):
        parser.add_argument(
            f"--{field.name.replace('_', '-')}",
            type=RECIPE_OPTIONS[field.name],
            default=getattr(defaults, field.name),
            help="(default: %(default)s)",
        )
    return parser


def main(argv=None):
    """Command line: python -m qwenvl_lab.toy.train [--device cuda] [--out DIR] [--state DIR --time-limit S] …"""
    args = parser().parse_args(argv)
    recipe = Recipe(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Recipe)})
    workers = (
        args.workers
        if args.workers is not None
        else (min(8, (os.cpu_count() or 2) - 1) if args.device.startswith("cuda") else 0)
    )
    model = train(
        recipe,
        args.out,
        args.device,
        args.eval_every,
        args.state,
        args.time_limit,
        args.save_every,
        workers,
        args.overwrite,
    )
    if model is not None:
        print(f"saved to {args.out or default_output_dir()}")


if __name__ == "__main__":
    main()

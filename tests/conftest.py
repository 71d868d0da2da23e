"""Shared test fixtures: the tiny random Qwen-VL checkpoint, its model, the tokenizer and small pictures."""

import os
import signal
from contextlib import contextmanager

# Without an NVIDIA driver the engine's Triton kernels run through Triton's interpreter: this must be set before
# triton is first imported (torch may import it), so before torch
if not os.path.exists("/proc/driver/nvidia/version"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest
import torch
from hypothesis import HealthCheck, settings
from PIL import Image

from qwenvl_lab.checkpoint import load_checkpoint, make_tiny_checkpoint
from qwenvl_lab.engine import BuildConfig, ModelRunner, build_engine, load_engine_vision_tower
from qwenvl_lab.tokenizing import load_tokenizer
from qwenvl_lab.toy import TOY_DIR

# The test models are tiny: on the shared 2-core machine extra intra-op threads only add contention (10-100x slower)
torch.set_num_threads(1)

# Hypothesis: the default ("ci", what make test, make unit and CI run) draws the same examples on every machine and
# every run (derandomize: a seed from each test's name; no example database), with no time limits (a slow machine
# must not fail); "fuzz" (make fuzz, HYPOTHESIS_PROFILE=fuzz) draws 10,000 new random examples per property
_NO_TIMING = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, **_NO_TIMING)
settings.register_profile("fuzz", max_examples=10_000, **_NO_TIMING)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """Directory of a small random checkpoint in Qwen-VL-Chat's layout (real vocab size, qwen.tiktoken)."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen-vl"))


@pytest.fixture(scope="session")
def tiny_model(tiny_checkpoint):
    """The tiny checkpoint loaded once (eval, no grad); shared — never modify its weights."""
    return load_checkpoint(tiny_checkpoint).requires_grad_(False)


@pytest.fixture(scope="session")
def tokenizer():
    """The real Qwen-VL tokenizer (qwen.tiktoken from dashscope)."""
    return load_tokenizer()


@pytest.fixture(scope="session")
def image_files(tmp_path_factory):
    """Small distinct pictures on disk: {name: path} (short paths, so they fit in an image span)."""
    folder = tmp_path_factory.mktemp("img")
    pictures = {
        "red": Image.new("RGB", (40, 30), (220, 20, 60)),
        "noise": Image.fromarray(np.random.default_rng(0).integers(0, 256, (36, 36, 3), dtype=np.uint8)),
        "gradient": Image.linear_gradient("L").resize((50, 64)).convert("RGB"),
    }
    paths = {}
    for name, picture in pictures.items():
        paths[name] = folder / f"{name}.png"
        picture.save(paths[name])
    return paths


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint built into an engine directory (fp32; 8 requests of up to 2 pictures, 3 beams)."""

    config = BuildConfig(
        max_batch_size=8,
        max_input_len=768,
        max_seq_len=800,
        max_prompt_embedding_table_size=256 * 2 * 8,
        dtype="float32",
        max_beam_width=3,
    )
    return build_engine(tiny_checkpoint, tmp_path_factory.mktemp("tiny-engine"), config)


@pytest.fixture(scope="session")
def toy_chat(tmp_path_factory):
    """(runner, vision tower, tokenizer) of the shipped toy model built as an engine: one request of up to 4 pictures."""

    config = BuildConfig(max_batch_size=1, max_input_len=1400, max_seq_len=1500, max_prompt_embedding_table_size=1024)
    engine = build_engine(TOY_DIR, tmp_path_factory.mktemp("toy-engine"), config)
    return ModelRunner.from_dir(engine), load_engine_vision_tower(engine), load_tokenizer(engine)


@pytest.fixture
def assert_verdict():
    """Check an exercise check's verdict: a right answer is 'correct'; a wrong one is refused with a hint (or 'not
    attempted yet') that holds every one of `words` and none of `secrets` (what would give the answer away)."""

    def verdict(result, ok: bool, words=(), secrets=()):
        assert bool(result) is ok, result
        if ok:
            assert result.message == "correct", result
            return
        assert result.message.startswith(("not yet — ", "not attempted yet")), result
        missing = [word for word in words if word not in result.message]
        assert not missing, f"the hint lacks {missing}: {result}"
        shown = [str(secret) for secret in secrets if str(secret) in result.message]
        assert not shown, f"the hint gives the answer away ({shown}): {result}"

    return verdict


@contextmanager
def time_limit(seconds: int):
    """Fail what runs longer than `seconds` inside the block (a hang, or work that grows faster than its input)."""

    def stop(signum, frame):
        raise AssertionError(f"ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pythonpath(*first, env=os.environ) -> str:
    """A PYTHONPATH for a test's subprocess: the folders `first`, then what `env` already holds."""
    return os.pathsep.join(filter(None, [*map(str, first), env.get("PYTHONPATH")]))


def refuse_writes_in(monkeypatch, folder) -> None:
    """Make `folder` read-only for this test: creating a file or a folder directly in it is refused (as root, a
    chmod would not stop the test process)."""
    real_mkdir, real_open = os.mkdir, os.open

    def refuse(call):
        def inner(path, *args, **kwargs):
            if os.path.dirname(os.path.abspath(path)) == str(folder):
                raise PermissionError(13, "Permission denied", str(path))
            return call(path, *args, **kwargs)

        return inner

    monkeypatch.setattr(os, "mkdir", refuse(real_mkdir))
    monkeypatch.setattr(os, "open", refuse(real_open))


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The course's engine (notebook 06's `course()`), built into a temporary output folder, with its vision part,
    tokenizer and eager model; a module that needs another `course` defines its own."""
    from qwenvl_lab.course.exercises import nb06  # noqa: PLC0415 — only the modules that ask for it pay the import

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("QWENVL_LAB_OUTPUT", str(tmp_path_factory.mktemp("course-output")))
        nb06.course.cache_clear()
        yield nb06.course()
    nb06.course.cache_clear()

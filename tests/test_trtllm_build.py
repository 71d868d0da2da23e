"""Tests for step 10: the trtllm-build command line made from our engine's BuildConfig, and running it."""

import json
import shlex

import pytest
import torch

from qwenvl_lab.limits import BuildConfig
from qwenvl_lab.trtllm.build_command import prompt_table_size, run_trtllm_build, trtllm_build_command
from qwenvl_lab.trtllm.gpu import GPUStackError, missing_gpu_stack
from qwenvl_lab.trtllm.mpi_world import USER_MPI_VARS

README = BuildConfig(
    max_batch_size=8, max_input_len=2048, max_seq_len=3072, max_prompt_embedding_table_size=2048, dtype="float16"
)  # TensorRT-LLM's Qwen-VL README build


def flags(command: list[str]) -> dict[str, str]:
    assert command[0] == "trtllm-build" and len(command) % 2 == 1
    return dict(zip(command[1::2], command[2::2]))


def test_the_readme_build_command(tmp_path):
    command = trtllm_build_command(tmp_path / "ckpt", tmp_path / "engine", README)
    assert flags(command) == {
        "--checkpoint_dir": str(tmp_path / "ckpt"),
        "--output_dir": str(tmp_path / "engine"),
        "--gemm_plugin": "float16",
        "--gpt_attention_plugin": "float16",
        "--max_batch_size": "8",
        "--max_beam_width": "1",
        "--max_input_len": "2048",
        "--max_seq_len": "3072",
        "--max_prompt_embedding_table_size": "2048",
        "--remove_input_padding": "enable",
    }


@pytest.mark.parametrize("batch, images, rows", [(1, 1, 256), (8, 1, 2048), (4, 2, 2048), (2, 3, 1536)])
def test_table_size_is_256_per_image_per_request_slot(tmp_path, batch, images, rows):
    config = BuildConfig(
        max_batch_size=batch,
        max_input_len=1024,
        max_seq_len=1100,
        max_prompt_embedding_table_size=rows,
        dtype="bfloat16",
    )
    assert prompt_table_size(config, images) == rows
    command = flags(trtllm_build_command(tmp_path / "c", tmp_path / "e", config, images_per_request=images))
    assert command["--max_prompt_embedding_table_size"] == str(rows)
    assert command["--gemm_plugin"] == command["--gpt_attention_plugin"] == "bfloat16"


def test_a_torch_dtype_is_named_like_trtllm_build_wants(tmp_path):
    config = BuildConfig(max_prompt_embedding_table_size=2048, dtype=torch.float32)
    assert flags(trtllm_build_command(tmp_path / "c", tmp_path / "e", config))["--gemm_plugin"] == "float32"


def test_mismatches_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match=r"is 0, .*#1300"):
        trtllm_build_command(tmp_path / "c", tmp_path / "e", BuildConfig())  # the default: no prompt table
    with pytest.raises(ValueError, match=r"256 × 2 × 8 = 4096"):
        trtllm_build_command(tmp_path / "c", tmp_path / "e", README, images_per_request=2)
    with pytest.raises(ValueError, match="images_per_request must be an int >= 1"):
        trtllm_build_command(tmp_path / "c", tmp_path / "e", README, images_per_request=0)
    small = BuildConfig(max_batch_size=1, max_input_len=300, max_seq_len=400, max_prompt_embedding_table_size=512)
    with pytest.raises(ValueError, match="max_input_len 300 cannot hold 2 image"):
        trtllm_build_command(tmp_path / "c", tmp_path / "e", small, images_per_request=2)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"dtype": "float32"}))
    with pytest.raises(ValueError, match="checkpoint in .* is float32 but build_config.dtype is float16"):
        trtllm_build_command(tmp_path / "c", tmp_path / "e", README)


def test_run_trtllm_build_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="argument list made by trtllm_build_command"):
        run_trtllm_build(["make", "engine"])
    with pytest.raises(FileNotFoundError, match="run convert_to_trtllm_checkpoint"):
        run_trtllm_build(trtllm_build_command(tmp_path / "c", tmp_path / "e", README))


@pytest.mark.skipif(
    not missing_gpu_stack("tensorrt_llm", "cuda"),
    reason="tensorrt_llm and a GPU are present: the GPU tests run the build",
)
def test_without_trtllm_build_the_error_prints_the_command(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"dtype": "float16"}))
    command = trtllm_build_command(tmp_path / "c", tmp_path / "e", README)
    with pytest.raises(GPUStackError, match="building the engine needs") as err:
        run_trtllm_build(command)
    assert shlex.join(command) in str(err.value)
    assert not (tmp_path / "e").exists()


STAND_IN_BUILD = '''"""A stand-in for tensorrt_llm.commands.build (tests only): main() records the arguments it was run with."""
import json
import os
import sys


def main():
    with open(os.environ["STAND_IN_ARGV_FILE"], "w") as f:
        json.dump(dict(argv=sys.argv[1:], mpi=sorted(k for k in os.environ if k.startswith(("OMPI_", "PMI_")))), f)


if __name__ == "__main__":
    main()
'''


@pytest.mark.standin
def test_the_build_runs_through_this_interpreter_without_trtllm_build_on_path(tmp_path, monkeypatch):
    """An environment's Python run without activating it (make trtllm TRT_PY=…) has no trtllm-build on PATH: the build
    goes through `python -m tensorrt_llm.commands.build`, found as an importable package."""
    stand_in = tmp_path / "stand_in"
    (stand_in / "tensorrt_llm" / "commands").mkdir(parents=True)
    (stand_in / "tensorrt_llm" / "__init__.py").write_text("")
    (stand_in / "tensorrt_llm" / "commands" / "__init__.py").write_text("")
    (stand_in / "tensorrt_llm" / "commands" / "build.py").write_text(STAND_IN_BUILD)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps({"dtype": "float16"}))
    monkeypatch.syspath_prepend(str(stand_in))  # importable here (the presence check) ...
    monkeypatch.setenv("PYTHONPATH", str(stand_in))  # ... and in the build's process
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no trtllm-build anywhere on PATH
    monkeypatch.setenv("STAND_IN_ARGV_FILE", str(tmp_path / "argv.json"))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")  # as under mpirun: the build must not join the rank's MPI job
    for name in USER_MPI_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_MCA_plm", "^rsh")  # ... but keeps the user's own settings
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert missing_gpu_stack("tensorrt_llm", "cuda") == []
    command = trtllm_build_command(tmp_path / "c", tmp_path / "e", README)
    saved = json.loads(json.dumps(command))  # the GPU stage reads the command the prepare stage saved
    assert run_trtllm_build(saved) == tmp_path / "e"
    assert json.loads((tmp_path / "argv.json").read_text()) == dict(argv=command[1:], mpi=["OMPI_MCA_plm"])

"""Notebook 12's exercises: the trtllm-build command for given limits, and a weight's TensorRT-LLM name."""

from pathlib import Path

from ...layout import trtllm_name
from ...limits import BuildConfig, prompt_table_size
from ...trtllm.build_command import trtllm_build_command
from . import exercise
from .selfcheck import Question, right, wrong

COMMAND_BUILD = BuildConfig(  # exercise 12.1: float16, 4 requests of up to 2 pictures, 1024 / 2048 ids, one beam
    max_batch_size=4,
    max_input_len=1024,
    max_seq_len=2048,
    max_prompt_embedding_table_size=prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=2),
    dtype="float16",
)
COMMAND_PICTURES = 2
CHECKPOINT_FOLDER, ENGINE_FOLDER = "trtllm_checkpoint", "my_engine"  # 12.1: the folders of WORK it reads and writes


def command_flags(command) -> dict | str:
    """A trtllm-build argument list as {flag: value}, or a hint when it is not one."""
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(p, str) for p in command):
        return "give the list of strings trtllm_build_command returns"
    if command[0] != "trtllm-build" or len(command) % 2 == 0:
        return "give the whole list trtllm_build_command returns: 'trtllm-build', then flag and value pairs"
    flags = dict(zip(command[1::2], command[2::2]))
    if len(flags) != len(command) // 2 or not all(flag.startswith("--") for flag in flags):
        return "give the whole list trtllm_build_command returns: each flag once, each followed by its value"
    return flags


@exercise("12.1", "the trtllm-build command for float16, 4 requests of up to 2 pictures, 1024 input / 2048 total ids")
def check_command(command):
    """The check of exercise 12.1: None when the answer is right, else a hint."""
    flags = command_flags(command)
    if isinstance(flags, str):
        return flags
    expected = command_flags(
        trtllm_build_command(CHECKPOINT_FOLDER, ENGINE_FOLDER, COMMAND_BUILD, images_per_request=COMMAND_PICTURES)
    )
    if Path(flags.get("--checkpoint_dir", "")).name != CHECKPOINT_FOLDER:
        return f"read the converted checkpoint, trt_checkpoint (WORK / {CHECKPOINT_FOLDER!r}): --checkpoint_dir"
    if Path(flags.get("--output_dir", "")).name != ENGINE_FOLDER:
        return f"write the engine to WORK / {ENGINE_FOLDER!r}: --output_dir"
    for flag in ("--gemm_plugin", "--max_batch_size", "--max_input_len", "--max_seq_len", "--max_beam_width"):
        if flags.get(flag) != expected[flag]:
            return f"{flag} is {flags.get(flag)!r}: check the BuildConfig's limits and dtype against the question"
    table, rows = flags.get("--max_prompt_embedding_table_size", ""), expected["--max_prompt_embedding_table_size"]
    if table != rows:
        amount = "too few rows" if not table.isdigit() or int(table) < int(rows) else "more rows than needed"
        return f"the table holds {amount}: tell trtllm_build_command how many pictures a request may bring"
    missing = [flag for flag in expected if flag not in flags]
    if missing:
        return f"the command leaves out {', '.join(missing)}: let trtllm_build_command write the whole list"
    differ = [
        flag for flag in expected if flags[flag] != expected[flag] and flag not in ("--checkpoint_dir", "--output_dir")
    ]
    if differ or len(flags) != len(expected):
        extra = [flag for flag in flags if flag not in expected]
        return (
            f"{', '.join(differ + extra)} differ from what trtllm_build_command writes for this BuildConfig: build "
            "the list with it rather than by hand"
        )
    return None


@exercise("12.2", "the TensorRT-LLM checkpoint name of Qwen-VL-Chat's transformer.h.1.mlp.w2.weight")
def check_weight_name(name):
    """The check of exercise 12.2: None when the answer is right, else a hint."""
    if not isinstance(name, str):
        return "answer with the weight's name, a str"
    if name == trtllm_name("transformer.h.1.mlp.w2.weight"):
        return None
    if ".h.1." in name:
        return "TensorRT-LLM names the blocks transformer.layers.N, not transformer.h.N"
    if name == trtllm_name("transformer.h.1.mlp.w1.weight"):
        return "that is where w1 goes; w2 is the input the activation is applied to (section 3)"
    return "rename the block as TensorRT-LLM does, then the MLP input as section 3's swap says"


def SELF_CHECK():
    """Notebook 12's self-check."""
    return (
        Question(
            "Which TensorRT-LLM does the course's TensorRT route (ONNX, plan, checkpoint, `trtllm-build`) run on?",
            (
                wrong("today's main branch", "main removed the TensorRT-engine workflow in June–July 2026"),
                right(
                    "the 1.2.x line, pinned in requirements-trtllm.txt",
                    "the last line with `trtllm-build`, `ModelRunnerCpp` and the prompt-table engine input",
                ),
                wrong("the PyTorch backend", "it takes Hugging Face checkpoints and has no `trtllm-build` step"),
            ),
        ),
        Question(
            "An engine is built without `--max_prompt_embedding_table_size`, as article 2's command does. What "
            "happens to a picture?",
            (
                wrong("it is read as usual", "the engine has no prompt-table input at all"),
                right(
                    "the picture never reaches the engine",
                    "its fake ids go to the plain word-embedding lookup, past its last row (TensorRT-LLM issue #1300)",
                ),
                wrong("the table grows to fit it", "the table's size is fixed at build; nothing grows at run time"),
            ),
        ),
        Question(
            "Why does Qwen's `mlp.w2` become TensorRT-LLM's `mlp.fc`, and `w1` its `gate`?",
            (
                right(
                    "the activation is on w2 in Qwen and on fc in TensorRT-LLM's gated MLP",
                    "`c_proj(w1(x) * silu(w2(x)))` against `proj(silu(fc(x)) * gate(x))`",
                ),
                wrong("a typo kept for compatibility", "the two computations are the same only with the swap"),
                wrong("fc is TensorRT-LLM's name for every second weight", "the names follow the roles, not the order"),
            ),
        ),
    )

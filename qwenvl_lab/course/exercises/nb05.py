"""Exercises of notebook 05 (building the engine): the table size, the trtllm-build command, weight names, `tasks`."""

from pathlib import Path

from ...layout import trtllm_name
from ...limits import BuildConfig, prompt_table_size
from ...trtllm.build_command import trtllm_build_command
from . import exercise, int_list, whole_number
from .selfcheck import Question, right, wrong

PACKED = ((0, 287), (1, 289))  # exercise 05.4: (batch position, prompt ids) of the two packed requests
STEP_BEAMS = ((0, 3), (1, 1))  # exercise 05.5: (batch position, beams) in a generation step


TABLE_BUILD = BuildConfig(max_batch_size=4)  # exercise 05.1: 4 requests of up to 3 pictures each
TABLE_PICTURES = 3
COMMAND_BUILD = BuildConfig(  # exercise 05.2: float16, 4 requests of up to 2 pictures, 1024 / 2048 ids, one beam
    max_batch_size=4,
    max_input_len=1024,
    max_seq_len=2048,
    max_prompt_embedding_table_size=prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=2),
    dtype="float16",
)
COMMAND_PICTURES = 2
CHECKPOINT_FOLDER, ENGINE_FOLDER = "trtllm_checkpoint", "my_engine"  # 05.2: the folders of WORK it reads and writes


@exercise("05.1", "the smallest --max_prompt_embedding_table_size for up to 4 requests of up to 3 pictures each")
def check_table_size(size):
    """The check of exercise 05.1: None when the answer is right, else a hint."""
    if whole_number(size) is None:
        return "answer with an int, a number of table rows"
    size = whole_number(size)
    smallest = prompt_table_size(TABLE_BUILD, images_per_request=TABLE_PICTURES)
    if size == smallest:
        return None
    if size == prompt_table_size(BuildConfig(max_batch_size=1), images_per_request=TABLE_PICTURES):
        return "that is one request's share; the engine holds a block for every request it may run at once"
    if size == prompt_table_size(TABLE_BUILD, images_per_request=1):
        return "that holds one picture per request; each request may bring three"
    if size > smallest and size % (TABLE_BUILD.max_batch_size * 256) == 0:
        return (
            "that works, but holds more rows than needed: the smallest is the rows one picture fills × the "
            "pictures one request may bring × the requests at once"
        )
    return "count the rows one picture fills, then the pictures of one request, then the requests"


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


@exercise("05.2", "the trtllm-build command for float16, 4 requests of up to 2 pictures, 1024 input / 2048 total ids")
def check_command(command):
    """The check of exercise 05.2: None when the answer is right, else a hint."""
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


@exercise("05.3", "the TensorRT-LLM checkpoint name of Qwen-VL-Chat's transformer.h.1.mlp.w2.weight")
def check_weight_name(name):
    """The check of exercise 05.3: None when the answer is right, else a hint."""
    if not isinstance(name, str):
        return "answer with the weight's name, a str"
    if name == trtllm_name("transformer.h.1.mlp.w2.weight"):
        return None
    if ".h.1." in name:
        return "TensorRT-LLM names the blocks transformer.layers.N, not transformer.h.N"
    if name == trtllm_name("transformer.h.1.mlp.w1.weight"):
        return "that is where w1 goes; w2 is the input the activation is applied to (section 2)"
    return "rename the block as TensorRT-LLM does, then the MLP input as section 2's swap says"


@exercise("05.4", "the engine's tasks input for a packed context step of 287 and 289 prompt ids")
def check_packed_tasks(tasks):
    """The check of exercise 05.4: None when the answer is right, else a hint."""
    tasks = int_list(tasks)
    if tasks is None:
        return "answer with a list of ints"
    expected = [position for position, tokens in PACKED for _ in range(tokens)]
    if tasks == expected:
        return None
    if tasks == [position for position, _ in PACKED]:
        return (
            "that is one task per request, what generate takes; the engine's input has one per token of the "
            "packed batch"
        )
    if len(tasks) != len(expected):
        return f"{len(tasks)} values: the packed batch has {len(expected)} tokens, and tasks one value for each"
    return "each token carries the batch position of the request it belongs to, in the packed order"


@exercise("05.5", "the engine's tasks input for a generation step: position 0 with 3 beams, position 1 greedy")
def check_step_tasks(tasks):
    """The check of exercise 05.5: None when the answer is right, else a hint."""
    tasks = int_list(tasks)
    if tasks is None:
        return "answer with a list of ints"
    expected = [position for position, beams in STEP_BEAMS for _ in range(beams)]
    if tasks == expected:
        return None
    if tasks == [position for position, _ in STEP_BEAMS]:
        return "in a generation step every beam feeds a token of its own"
    return "a generation step feeds one token per beam of each request, in batch order"


def SELF_CHECK():
    """Notebook 05's self-check: its right options computed by the package's build limits."""
    size = prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=2)
    return (
        Question(
            "What must `--max_prompt_embedding_table_size` be for up to 4 requests of up to 2 pictures each?",
            (
                wrong(str(2 * 256), "that is one request's block; the engine holds a block for every batch position"),
                wrong(str(4 * 256), "that holds one picture per request"),
                right(str(size), "256 rows × 2 pictures × 4 requests: each position of a step's batch gets a block"),
                wrong("8", "the flag counts table rows, not pictures"),
            ),
        ),
        Question(
            "With `remove_input_padding`, what does the engine's `tasks` input hold in a context step?",
            (
                wrong("one task per request", "that is what `generate` takes; the engine's input is packed"),
                right(
                    "one value per token of the packed batch: its request's position in the batch",
                    "the batch manager repeats each request's position over its tokens",
                ),
                wrong("the fake ids of each picture", "the fake ids are in `input_ids`; `tasks` picks their block"),
            ),
        ),
        Question(
            "An engine is built without `--max_prompt_embedding_table_size`, as article 2's command does. What "
            "happens to a picture?",
            (
                wrong("it is read as usual", "the engine has no prompt-table input at all"),
                right(
                    "the picture never reaches the engine: TensorRT-LLM's has no table input; this package's refuses",
                    "its fake ids go to the plain word-embedding lookup, past its last row (a user report of an image "
                    "not being read: TensorRT-LLM issue #1300); the package's engine says why instead",
                ),
                wrong("the table grows to fit it", "the table's size is fixed at build; nothing grows at run time"),
            ),
        ),
        Question(
            "Two requests ask 图片里是什么？ about two different pictures under in-flight batching. Their `input_ids`…",
            (
                right(
                    "are equal: both number their fake ids from `vocab_size`",
                    "so KV-cache reuse must tell them apart with `input_token_extra_ids`",
                ),
                wrong("differ in their fake ids", "under in-flight batching every request's ids start at `vocab_size`"),
                wrong("differ in their span's path bytes", "the path bytes were replaced by fake ids"),
            ),
        ),
    )

"""Exercises of notebook 05 (building the engine): the table size, the trtllm-build command, weight names, `tasks`."""

from ..layout import trtllm_name
from ..limits import BuildConfig, prompt_table_size
from . import exercise, int_list, whole_number
from .selfcheck import Question, right, wrong

PACKED = ((0, 287), (1, 289))  # exercise 05.4: (batch position, prompt ids) of the two packed requests
STEP_BEAMS = ((0, 3), (1, 1))  # exercise 05.5: (batch position, beams) in a generation step


@exercise("05.1", "--max_prompt_embedding_table_size for up to 4 requests of up to 3 pictures each")
def check_table_size(size):
    """The check of exercise 05.1: None when the answer is right, else a hint."""
    if whole_number(size) is None:
        return "answer with an int, a number of table rows"
    size = whole_number(size)
    if size == prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=3):
        return None
    if size == prompt_table_size(BuildConfig(max_batch_size=1), images_per_request=3):
        return "that is one request's share; the engine holds a block for every request it may run at once"
    if size == prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=1):
        return "that holds one picture per request; each request may bring three"
    return "count the rows one picture fills, then the pictures of one request, then the requests"


@exercise("05.2", "the trtllm-build command for float16, 4 requests of up to 2 pictures, 1024 input / 2048 total ids")
def check_command(command):
    """The check of exercise 05.2: None when the answer is right, else a hint."""
    if not isinstance(command, (list, tuple)) or not command or not all(isinstance(p, str) for p in command):
        return "give the list of strings trtllm_build_command returns"
    if command[0] != "trtllm-build" or len(command) % 2 == 0:
        return "give the whole list trtllm_build_command returns: 'trtllm-build', then flag and value pairs"
    flags = dict(zip(command[1::2], command[2::2]))
    wanted = {"--gemm_plugin": "float16", "--max_batch_size": "4", "--max_input_len": "1024", "--max_seq_len": "2048"}
    for flag, value in wanted.items():
        if flags.get(flag) != value:
            return f"{flag} is {flags.get(flag)!r}: check the BuildConfig's limits and dtype against the question"
    table = str(prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=2))
    if flags.get("--max_prompt_embedding_table_size") != table:
        return "the table holds too few rows: tell trtllm_build_command how many pictures a request may bring"
    if not flags.get("--output_dir", "").endswith("my_engine"):
        return "write the engine to WORK / 'my_engine'"
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
                    "TensorRT-LLM answers from the text alone; this package's engine refuses the request",
                    "a real user report, TensorRT-LLM issue #1300; the package says why instead",
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

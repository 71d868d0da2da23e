"""Exercises of notebook 05 (building the engine): the table size, and the limits an engine is built with."""

from ...limits import BuildConfig, prompt_table_size
from ...tokenizing import IMG_TOKEN_SPAN
from . import exercise, whole_number
from .selfcheck import Question, right, wrong

TABLE_BUILD = BuildConfig(max_batch_size=4)  # exercise 05.1: 4 requests of up to 3 pictures each
TABLE_PICTURES = 3


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
    if size > smallest and size % prompt_table_size(TABLE_BUILD, images_per_request=1) == 0:
        return (
            "that works, but holds more rows than needed: the smallest is the rows one picture fills × the "
            "pictures one request may bring × the requests at once"
        )
    return "count the rows one picture fills, then the pictures of one request, then the requests"


SERVICE = dict(requests=2, pictures=3, prompt_ids=900, answer_tokens=100)  # exercise 05.2: what the engine serves


def service_build() -> BuildConfig:
    """The smallest limits that serve SERVICE, in float32 with one beam."""
    return BuildConfig(
        max_batch_size=SERVICE["requests"],
        max_input_len=SERVICE["prompt_ids"],
        max_seq_len=SERVICE["prompt_ids"] + SERVICE["answer_tokens"],
        max_prompt_embedding_table_size=prompt_table_size(
            BuildConfig(max_batch_size=SERVICE["requests"]), images_per_request=SERVICE["pictures"]
        ),
    )


def table_hint(rows: int, expected: BuildConfig) -> str:
    """What is wrong with a table of `rows` rows for SERVICE's engine (not the smallest that serves it)."""
    one_request = prompt_table_size(BuildConfig(max_batch_size=1), images_per_request=SERVICE["pictures"])
    if rows == 0:
        return "an engine built without a table has no prompt-table input: it cannot see a picture"
    if rows == one_request:
        return "that table holds one request's pictures; the engine holds a block for every request it may run at once"
    if rows == prompt_table_size(BuildConfig(max_batch_size=SERVICE["requests"]), images_per_request=1):
        return "that table holds one picture per request; each request may bring three"
    if rows > expected.max_prompt_embedding_table_size:
        return "that table serves it, but holds more rows than needed: give the smallest"
    return "the table holds too few rows: count the rows of a picture, the pictures of a request, the requests"


@exercise(
    "05.2",
    "the BuildConfig (float32) with the smallest limits for up to 2 requests at a time, each with up to 3 pictures, "
    "prompts of up to 900 ids and answers of up to 100 new tokens",
)
def check_build_config(build):
    """The check of exercise 05.2: None when the answer is right, else a hint."""
    if not isinstance(build, BuildConfig):
        return f"give a BuildConfig(…) (from qwenvl_lab.engine), not a {type(build).__name__}"
    expected = service_build()
    if build == expected:
        return None
    if build.max_batch_size != expected.max_batch_size:
        return "max_batch_size counts the requests the engine answers together"
    if build.max_prompt_embedding_table_size != expected.max_prompt_embedding_table_size:
        return table_hint(build.max_prompt_embedding_table_size, expected)
    if build.max_input_len != expected.max_input_len:
        return "max_input_len bounds one prompt's ids: the longest prompt must fit, and nothing more is needed"
    if build.max_seq_len == expected.max_input_len or build.max_seq_len == SERVICE["answer_tokens"]:
        return "max_seq_len counts a request's prompt and its answer together"
    if build.max_seq_len != expected.max_seq_len:
        return "max_seq_len: the longest prompt plus the longest answer, no more"
    if build.dtype != expected.dtype:
        return f"the question asks for float32, got {build.dtype}"
    return "max_beam_width: the service decodes one beam per request"


def SELF_CHECK():
    """Notebook 05's self-check: its right options computed by the package's build limits."""
    size = prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=2)
    one_request = prompt_table_size(BuildConfig(max_batch_size=1), images_per_request=2)
    one_picture_each = prompt_table_size(BuildConfig(max_batch_size=4), images_per_request=1)
    return (
        Question(
            "What must `--max_prompt_embedding_table_size` be for up to 4 requests of up to 2 pictures each?",
            (
                wrong(str(one_request), "that is one request's share; the engine holds rows for every request at once"),
                wrong(str(one_picture_each), "that holds one picture per request"),
                right(str(size), f"{IMG_TOKEN_SPAN} rows × 2 pictures × 4 requests"),
                wrong("8", "the flag counts table rows, not pictures"),
            ),
        ),
        Question(
            "Article 1's `PromptTable` doubles its capacity when pictures no longer fit. What does an engine built with "
            "a 2048-row table do with a request that needs 2304 rows?",
            (
                wrong("it doubles the table to 4096 rows", "an engine's sizes are fixed when it is built"),
                right(
                    "it refuses the request: the table input was compiled for at most 2048 rows",
                    "more pictures need a rebuild with a larger `max_prompt_embedding_table_size`",
                ),
                wrong("it drops the last picture", "nothing is dropped silently; the request is refused"),
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
    )

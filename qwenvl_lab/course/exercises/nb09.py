"""Notebook 09's exercises: TensorRT-LLM's PyTorch-backend merge, Qwen2-VL's span lengths, ids and M-RoPE."""

from functools import lru_cache

import torch
from PIL import Image
from torch import nn

from ...placeholder_merge import TLLM_SENTINEL_OFFSET, fuse_input_embeds
from ...qwen2_vl import (
    IMAGE_TOKEN_ID,
    VISION_END_ID,
    VISION_START_ID,
    image_inputs,
    image_token_count,
    qwen2_vl_prompt,
    rope_positions,
    tiny_qwen2_vl,
)
from ...tokenizing import load_tokenizer
from . import exercise
from .nb03 import NOT_ATTEMPTED, number_hint, whole_number
from .selfcheck import Question, right, wrong

V = 50  # the cases' small vocabulary: ids 0 … 49 are text
PICTURE_SIZE = (896, 448)  # width × height of exercise 09.2's picture
COUNT_PICTURE_SIZE = (1280, 720)  # exercise 09.3's picture
ROPE_PICTURE_SIZE = (640, 360)  # exercise 09.4's picture
ARTICLE_IDS = (151652, 151653, 151654, 151655)  # the first ids of article 1's example sequence (§2.2)


def fuse_cases():
    """(description, embedding_layer, input_ids, mm_embeds, mm_token_ids) to compare a learner's merge on."""
    layer = nn.Embedding(V, 4).requires_grad_(False)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(V, 4, generator=torch.Generator().manual_seed(9)))
    gen = torch.Generator().manual_seed(10)
    sentinel = V + TLLM_SENTINEL_OFFSET
    return [
        (
            "one request, TensorRT-LLM's sentinel vocab_size + 1 at the image positions",
            layer,
            torch.tensor([3, sentinel, sentinel, sentinel, 4, 5]),
            [torch.randn(3, 4, generator=gen)],
            None,
        ),
        (
            "two requests packed, fake ids vocab_size, vocab_size + 1, … as LLaVA-NeXT's attach path writes them",
            layer,
            torch.tensor([7, V, V + 1, 8, 9, V + 2, V + 3, V + 4, 1]),
            [torch.randn(2, 4, generator=gen), torch.randn(3, 4, generator=gen)],
            None,
        ),
        (
            "in-vocabulary placeholders (id 12) named by mm_token_ids",
            layer,
            torch.tensor([2, 12, 12, 6, 12, 3]),
            [torch.randn(3, 4, generator=gen)],
            torch.tensor([12]),
        ),
    ]


FUSE_FAILURES = {  # a case's name → what a function that raises on it has missed (never the function's own message)
    "one request": (
        "your function raised an error on one request with the sentinel vocab_size + 1 at its image positions: mark "
        "the positions whose id has no row in the embedding layer, and write the feature rows there in order"
    ),
    "two requests packed": (
        "your function raised an error on two packed requests whose image positions hold fake ids vocab_size, "
        "vocab_size + 1, … (not one sentinel) and whose features come as two blocks: every id >= vocab_size is "
        "multimodal, and the blocks go in one after the other (torch.cat(mm_embeds))"
    ),
    "in-vocabulary placeholders": (
        "your function raised an error when mm_token_ids is given (a tensor of ids the vocabulary has): the image "
        "positions are then the ids found in mm_token_ids (torch.isin), and only the other positions are embedded"
    ),
}


def fuse_failure(name: str) -> str:
    """What a function that raised on the fuse case `name` has missed."""
    return next(hint for start, hint in FUSE_FAILURES.items() if name.startswith(start))


def fuse_hint(case, result) -> str | None:
    """None when `result` is what the package's fuse_input_embeds returns on `case`; else what is wrong."""
    name, layer, ids, mm_embeds, mm_token_ids = case
    _, expected = fuse_input_embeds(layer, ids, mm_embeds, mm_token_ids)  # [T, H]
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return f"return a pair (None, input_embeds), as TensorRT-LLM's fuse_input_embeds does ({name})"
    embeds = result[1]
    if result[0] is not None or not isinstance(embeds, torch.Tensor):
        return f"with features to fuse, return (None, input_embeds [T, H]) ({name})"
    if tuple(embeds.shape) != tuple(expected.shape):
        return f"input_embeds must hold one vector per id, [T, H] = {tuple(expected.shape)} ({name})"
    if embeds.dtype != expected.dtype:
        return f"input_embeds go on to the language model in the embedding layer's dtype, {expected.dtype} ({name})"
    image = torch.isin(ids, mm_token_ids) if mm_token_ids is not None else ids >= V
    if not torch.equal(embeds[~image], expected[~image]):
        return f"text positions take their row of the embedding layer ({name})"
    if not torch.equal(embeds[image], expected[image]):
        if mm_token_ids is not None and torch.equal(embeds[image], layer(ids[image])):
            return (
                f"with mm_token_ids given, the image positions are those ids (torch.isin), although they are in the "
                f"vocabulary ({name})"
            )
        rows = torch.cat(mm_embeds)
        if torch.equal(embeds[image], rows.flip(0)) or set(map(tuple, embeds[image].tolist())) == set(
            map(tuple, rows.tolist())
        ):
            return f"the feature rows go in order: the first row at the first image position ({name})"
        return f"the image positions take the feature rows, concatenated over the pictures in order ({name})"
    return None


@exercise(
    "09.1",
    "Write TensorRT-LLM's fuse_input_embeds(embedding_layer, input_ids, mm_embeds, mm_token_ids=None) for packed ids",
)
def check_fuse_input_embeds(my_fuse):
    """Compare the learner's merge with the package's on a sentinel, fake ids from vocab_size and mm_token_ids; no
    features must give the ids back, and more feature rows than positions an error."""
    if not callable(my_fuse):
        return f"pass your function itself (my_fuse_input_embeds), not a {type(my_fuse).__name__}"
    for case in fuse_cases():
        name, layer, ids, mm_embeds, mm_token_ids = case
        given = ids.clone()
        try:
            result = my_fuse(layer, given, [e.clone() for e in mm_embeds], mm_token_ids)
        except IndexError:
            return (
                f"an id the embedding layer has no row for reached it ({name}): embed only the text positions, and "
                "remember that the id vocab_size itself is already out of the vocabulary"
            )
        except Exception:  # any error: named by the case it met, never by its own message
            return fuse_failure(name)
        if result is None:
            return NOT_ATTEMPTED
        if not torch.equal(given, ids):
            return f"your function changed input_ids ({name}); leave them as they are"
        hint = fuse_hint(case, result)
        if hint is not None:
            return hint
    layer, ids = fuse_cases()[0][1], torch.tensor([1, 2])
    try:
        result = my_fuse(layer, ids.clone(), [], None)
    except Exception:  # torch.cat([]) and the like: the empty case was not handled first
        result = None
    if (
        not isinstance(result, (tuple, list))
        or len(result) != 2
        or result[1] is not None
        or not isinstance(result[0], torch.Tensor)
        or not torch.equal(result[0], ids)
    ):
        return (
            "with no features (mm_embeds empty) return (input_ids, None), before touching the features: the ids go "
            "on to the embedding layer"
        )
    name, layer, ids, mm_embeds, mm_token_ids = fuse_cases()[0]
    try:
        my_fuse(layer, ids.clone(), [torch.cat([mm_embeds[0], mm_embeds[0][:1]])], mm_token_ids)
    except Exception:  # any error will do: TensorRT-LLM raises a ValueError, a plain assignment fails
        return None
    return (
        "given 4 feature rows for 3 multimodal positions your function returned an answer: TensorRT-LLM raises "
        '("Multimodal token count mismatch") rather than drop or repeat rows silently'
    )


@lru_cache(maxsize=1)
def picture_tokens() -> int:
    """The `<|image_pad|>` ids transformers' image processor gives exercise 09.2's picture."""
    grid = image_inputs([Image.new("RGB", PICTURE_SIZE)])["image_grid_thw"][0]
    return image_token_count(grid)


@exercise("09.2", "how many <|image_pad|> ids Qwen2-VL's prompt holds for a picture 896 pixels wide and 448 high")
def check_picture_tokens(answer):
    """image_grid_thw's patches over merge_size² for an 896 × 448 picture."""
    tokens = picture_tokens()
    return number_hint(
        answer,
        tokens,
        {
            tokens * 4: "that is the number of 14 × 14 patches; 2 × 2 of them merge into one token",
            tokens * 2: "merge_size is 2 in each direction: 2 × 2 patches make one token",
            tokens + 2: "count the <|image_pad|> ids only, not <|vision_start|> and <|vision_end|>",
            256: "256 is Qwen-VL's fixed span; Qwen2-VL's follows the picture's size",
            PICTURE_SIZE[0]: "that is a side in pixels: count the tokens of the whole grid",
            PICTURE_SIZE[0] // 28: "that is one side of the token grid: a token for every row and column of it",
            PICTURE_SIZE[1] // 28: "that is one side of the token grid: a token for every row and column of it",
        },
    )


@lru_cache(maxsize=1)
def article_id_counts() -> dict:
    """How often each of ARTICLE_IDS appears in a Qwen2-VL prompt with one picture of COUNT_PICTURE_SIZE, its span as
    long as transformers' image processor makes it."""
    tokens = image_token_count(image_inputs([Image.new("RGB", COUNT_PICTURE_SIZE)])["image_grid_thw"][0])
    ids = qwen2_vl_prompt(load_tokenizer(), "图片里是什么？", [tokens])
    return {i: ids.count(i) for i in ARTICLE_IDS}


def id_counts(answer) -> dict | None:
    """`answer` as {id: count} over ARTICLE_IDS (ids it leaves out count 0), or None when it is not such a dict."""
    if not isinstance(answer, dict):
        return None
    counts = {}
    for key, value in answer.items():
        key, value = whole_number(key), whole_number(value)
        if key is None or value is None or key not in ARTICLE_IDS:
            return None
        counts[key] = value
    return {i: counts.get(i, 0) for i in ARTICLE_IDS}


@exercise(
    "09.3",
    "how often each of article 1's ids 151652, 151653, 151654 and 151655 appears in a Qwen2-VL prompt with one "
    "1280 × 720 picture: answer {id: count}",
)
def check_article_ids(answer):
    """{id: count} of the article's first four ids in qwen2_vl_prompt for a 1280 × 720 picture."""
    expected = article_id_counts()
    counts = id_counts(answer)
    if counts is None:
        return "give a dict {id: count} whose keys are among 151652, 151653, 151654 and 151655"
    if counts == expected:
        return None
    start, end, pad = VISION_START_ID, VISION_END_ID, IMAGE_TOKEN_ID
    if counts[end] > 1:
        return "the article reads 151653 as an image patch; in Qwen2-VL it is <|vision_end|>, once per picture"
    if counts[151654] != expected[151654]:
        return "151654 is none of the picture's ids in Qwen2VLConfig (vision_start, vision_end, image_token)"
    if counts[start] != expected[start] or counts[end] != expected[end]:
        return "one <|vision_start|> and one <|vision_end|> around each picture"
    if counts[pad] == 256:
        return "256 is Qwen-VL's fixed span; Qwen2-VL's follows the picture's size: measure it with image_inputs"
    if counts[pad] == expected[pad] * 4:
        return "that counts the 14 × 14 patches; 2 × 2 of them merge into one <|image_pad|>"
    return "the <|image_pad|> count is the picture's: image_token_count of its image_grid_thw"


@lru_cache(maxsize=1)
def vision_end_position() -> tuple[int, int, int, tuple]:
    """(position of the first <|image_pad|>, M-RoPE position of <|vision_end|>, the picture's <|image_pad|> ids, its
    image_grid_thw) in exercise 09.4's prompt: one picture of ROPE_PICTURE_SIZE."""
    grid = image_inputs([Image.new("RGB", ROPE_PICTURE_SIZE)])["image_grid_thw"][0]
    tokens = image_token_count(grid)
    ids = torch.tensor([qwen2_vl_prompt(load_tokenizer(), "图片里是什么？", [tokens])])
    first = int((ids[0] == IMAGE_TOKEN_ID).nonzero()[0])
    positions, _ = rope_positions(tiny_qwen2_vl(), ids, [grid.tolist()])
    return first, int(positions[0, 0, first + tokens]), tokens, tuple(grid.tolist())


@exercise(
    "09.4",
    "with M-RoPE, the position of <|vision_end|> after a 640 × 360 picture in qwen2_vl_prompt(tokenizer, "
    '"图片里是什么？", [299])',
)
def check_vision_end_position(answer):
    """transformers' get_rope_index: text after the picture continues max(h, w) / merge_size positions on."""
    first, expected, tokens, (_, h, w) = vision_end_position()
    return number_hint(
        answer,
        expected,
        {
            first + tokens: "that is 1-D RoPE, one position per token; M-RoPE lays the tokens out on their grid",
            first + tokens + 1: "that is 1-D RoPE, one position per token; M-RoPE lays the tokens out on their grid",
            expected - 1: "that is the last image token's column; the next id takes one step more",
            first + max(h, w): "image_grid_thw counts 14-pixel patches; the tokens' grid is 2 × 2 patches coarser",
            first + min(h, w) // 2: "the text resumes after the longer side of the tokens' grid, not the shorter",
            first: "that is where the picture's grid starts; the text resumes after it",
            first + 8: "that is the 224 × 224 picture's answer (an 8 × 8 grid); this picture's grid is another",
            tokens: "that is how many image tokens there are, not a position",
            first + h // 2 + w // 2: "the rows and columns are not added: the text resumes after the longer side",
        },
    )


def SELF_CHECK():
    """Notebook 09's self-check; the span length is measured with transformers' image processor."""
    from transformers import Qwen2VLConfig  # noqa: PLC0415 — transformers' Qwen2-VL loads for this self-check only

    grid = image_inputs([Image.new("RGB", (640, 360))])["image_grid_thw"][0]
    tokens, patches = image_token_count(grid), int(grid.prod())
    config = Qwen2VLConfig()
    return [
        Question(
            "Every image position of a request holds the same sentinel, vocab_size + 1. How does TensorRT-LLM's "
            "`fuse_input_embeds` decide which feature row goes where?",
            (
                right("by order: the k-th multimodal position takes the k-th row", "the id only marks the position"),
                wrong("by the id minus vocab_size, as in the prompt table", "every position has the same id here"),
                wrong("by `tasks` and `task_vocab_size`", "those belong to the prompt table; this merge has no table"),
                wrong("by a hash of the picture", "hashes key the KV cache; the rows go in order"),
            ),
        ),
        Question(
            "How many `<|image_pad|>` ids does Qwen2-VL's prompt hold for a 640 × 360 picture?",
            (
                wrong("256", "that is Qwen-VL's fixed span; Qwen2-VL's follows the picture"),
                right(str(tokens), f"{tuple(grid.tolist())}: {patches} patches, merged 2 × 2"),
                wrong(str(patches), "that is the 14 × 14 patches before the 2 × 2 merge"),
                wrong(str(tokens + 2), "that counts <|vision_start|> and <|vision_end|> too"),
            ),
        ),
        Question(
            "Whose numbering does article 1's example sequence `[151652, 151653, 151654, 151655, …, 151848]` follow?",
            (
                wrong(
                    "Qwen2-VL's: 151652 is its `vision_start_token_id`",
                    f"the first id is ({config.vision_start_token_id}), but in Qwen2-VL the next one closes a picture, "
                    "where the article reads a patch",
                ),
                wrong("Qwen-VL's: 151652 is `<img>`", "Qwen-VL's <img> is 151857; 151652 is its unused <|extra_6|>"),
                right(
                    "neither: only its first id plays the same part in Qwen2-VL",
                    "Qwen2-VL marks every image position with one id; the article gives each patch its own",
                ),
                wrong("fake ids counted from 151643", "fake ids start at the model's vocab_size, 151936"),
            ),
        ),
        Question(
            "Where does Qwen2-VL's prompt keep the picture's path?",
            (
                wrong("as bytes between the vision tags", "that is Qwen-VL's <img>path</img> span"),
                right(
                    "nowhere: the picture travels beside the ids, as pixel_values with its image_grid_thw",
                    "the ids hold only placeholders",
                ),
                wrong(
                    "in the embedding row of <|image_pad|>",
                    "that row is overwritten by the merge, and is the same for every picture",
                ),
            ),
        ),
        Question(
            "Two in-flight requests ask about different pictures. Why does KV-cache reuse need "
            "`input_token_extra_ids` with the prompt table?",
            (
                right(
                    "their fake ids are the same (each request's start at vocab_size), so ids alone cannot tell "
                    "the pictures apart",
                    "extra ids > 0, one per table, make the keys differ",
                ),
                wrong("fake ids are too large for the cache", "the cache stores keys and values, not ids' rows"),
                wrong("the table is stored in the cache", "the table is an input; the cache holds attention's keys"),
            ),
        ),
    ]

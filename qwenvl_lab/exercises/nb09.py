"""Notebook 09's exercises: TensorRT-LLM's PyTorch-backend merge, Qwen2-VL's span lengths, ids and M-RoPE."""

from functools import lru_cache

import torch
from PIL import Image
from torch import nn

from ..placeholder_merge import TLLM_SENTINEL_OFFSET, fuse_input_embeds
from ..qwen2_vl import IMAGE_TOKEN_ID, image_inputs, image_token_count, qwen2_vl_prompt, rope_positions, tiny_qwen2_vl
from ..tokenizing import load_tokenizer
from . import exercise
from .nb03 import NOT_ATTEMPTED, number_hint, whole_number

V = 50  # the cases' small vocabulary: ids 0 … 49 are text
PICTURE_SIZE = (896, 448)  # width × height of exercise 09.2's picture
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
    """Compare the learner's merge with the package's on a sentinel, fake ids from vocab_size, and mm_token_ids."""
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
        if result is None:
            return NOT_ATTEMPTED
        if not torch.equal(given, ids):
            return f"your function changed input_ids ({name}); leave them as they are"
        hint = fuse_hint(case, result)
        if hint is not None:
            return hint
    result = my_fuse(fuse_cases()[0][1], torch.tensor([1, 2]), [], None)
    if not isinstance(result, (tuple, list)) or len(result) != 2 or result[1] is not None:
        return "with no features (mm_embeds empty) return (input_ids, None): the ids go on to the embedding layer"
    return None


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
        },
    )


def three_ids(answer) -> tuple | None:
    """`answer` as three whole numbers, or None."""
    if isinstance(answer, torch.Tensor):
        answer = answer.reshape(-1).tolist()
    if hasattr(answer, "tolist"):  # numpy
        answer = answer.tolist()
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        return None
    values = tuple(whole_number(a) for a in answer)
    return None if None in values else values


@exercise(
    "09.3",
    "which of article 1's ids 151652, 151653, 151654, 151655 Qwen2-VL reads as <|vision_start|>, <|vision_end|> and "
    "<|image_pad|>: answer (start, end, pad)",
)
def check_article_ids(answer):
    """(vision_start_token_id, vision_end_token_id, image_token_id) of transformers' Qwen2VLConfig."""
    from transformers import Qwen2VLConfig

    config = Qwen2VLConfig()
    expected = (config.vision_start_token_id, config.vision_end_token_id, config.image_token_id)
    values = three_ids(answer)
    if values is None:
        return f"give three ids as a tuple (start, end, pad), not {answer!r}"
    if values == expected:
        return None
    if values == (151857, 151858, 151859):
        return "those are Qwen-VL's <img>, </img>, <imgpad>; the article's ids are Qwen2-VL's, read them in its config"
    if values[:2] == expected[:2]:
        return "the start and end are right; the image placeholder is Qwen2VLConfig's image_token_id"
    if not set(values) <= set(ARTICLE_IDS):
        return "pick the three among the article's first four ids, the ones the question lists"
    return "read vision_start_token_id, vision_end_token_id and image_token_id off transformers' Qwen2VLConfig()"


@lru_cache(maxsize=1)
def vision_end_position() -> tuple[int, int]:
    """(position of the first <|image_pad|>, M-RoPE position of <|vision_end|>) in exercise 09.4's prompt."""
    ids = torch.tensor([qwen2_vl_prompt(load_tokenizer(), "图片里是什么？", [64])])
    first = int((ids[0] == IMAGE_TOKEN_ID).nonzero()[0])
    positions, _ = rope_positions(tiny_qwen2_vl(), ids, [[1, 16, 16]])  # 224 × 224: an 8 × 8 grid of tokens
    return first, int(positions[0, 0, first + 64])


@exercise(
    "09.4",
    "with M-RoPE, the position of <|vision_end|> after a 224 × 224 picture in qwen2_vl_prompt(tokenizer, "
    '"图片里是什么？", [64])',
)
def check_vision_end_position(answer):
    """transformers' get_rope_index: text after the picture continues max(h, w) / merge_size positions on."""
    first, expected = vision_end_position()
    return number_hint(
        answer,
        expected,
        {
            first + 64: "that is 1-D RoPE, one position per token; M-RoPE gives the 64 tokens an 8 × 8 grid",
            first + 65: "that is 1-D RoPE, one position per token; M-RoPE gives the 64 tokens an 8 × 8 grid",
            expected - 1: "that is the last image token's row and column; the next id takes one step more",
            first: "that is where the picture's grid starts; the grid spans 8 rows and 8 columns",
        },
    )


def SELF_CHECK():
    """Notebook 09's self-check; the span length is measured with transformers' image processor."""
    from transformers import Qwen2VLConfig

    from .selfcheck import Question, right, wrong

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
            "Which model's numbering does article 1's example sequence `[151652, 151653, …]` follow?",
            (
                right(
                    "Qwen2-VL's: 151652 is its `vision_start_token_id`",
                    f"Qwen2VLConfig: vision_start_token_id {config.vision_start_token_id}",
                ),
                wrong("Qwen-VL's: 151652 is `<img>`", "Qwen-VL's <img> is 151857; 151652 is its unused <|extra_6|>"),
                wrong("neither: they are fake ids from 151643", "fake ids start at the model's vocab_size, 151936"),
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

"""Notebook 09 — transformers' Qwen2-VL, run for real: its special ids, its image processor's span lengths, its
embedding merge and its M-RoPE positions, on a tiny random model beside the course's tokenizer and toy model.

Nothing is downloaded: the image processor is built with its defaults and the model from a tiny `Qwen2VLConfig`. The
class and method names are those of transformers 5.24 (`transformers/models/qwen2_vl/`); without torchvision,
`Qwen2VLImageProcessor` falls back to `Qwen2VLImageProcessorPil`, which is named here directly.
"""

import os
from functools import lru_cache

import torch
from PIL import Image

from .checks.tensors import as_batch
from .checks.values import check_int
from .pictures import load_image
from .tokenizing import IM_END_ID, IM_START_ID, QWenTokenizer, make_context

# Qwen2-VL's special ids (they follow the 151,643 BPE ranks, like Qwen-VL's); tests/test_qwen2_vl.py checks the ones
# transformers' Qwen2VLConfig holds against its defaults. 151644 and the token strings are not in Qwen2VLConfig.
QWEN2_VL_SPECIAL_IDS = {
    "<|endoftext|>": 151643,  # Qwen2VLTextConfig.bos_token_id
    "<|im_start|>": IM_START_ID,  # 151644, as in Qwen-VL
    "<|im_end|>": IM_END_ID,  # 151645, Qwen2VLTextConfig.eos_token_id
    "<|vision_start|>": 151652,  # Qwen2VLConfig.vision_start_token_id
    "<|vision_end|>": 151653,  # Qwen2VLConfig.vision_end_token_id
    "<|image_pad|>": 151655,  # Qwen2VLConfig.image_token_id
    "<|video_pad|>": 151656,  # Qwen2VLConfig.video_token_id
}
VISION_START_ID = QWEN2_VL_SPECIAL_IDS["<|vision_start|>"]
VISION_END_ID = QWEN2_VL_SPECIAL_IDS["<|vision_end|>"]
IMAGE_TOKEN_ID = QWEN2_VL_SPECIAL_IDS["<|image_pad|>"]
SYSTEM = "You are a helpful assistant."


@lru_cache(maxsize=1)
def image_processor():
    """transformers' Qwen2-VL image processor with its defaults (PIL backend), built locally."""
    from transformers import Qwen2VLImageProcessorPil  # noqa: PLC0415 — transformers' Qwen2-VL loads when it runs (seconds)

    return Qwen2VLImageProcessorPil()


def image_inputs(pictures):
    """transformers' `pixel_values` [patches, 1176] and `image_grid_thw` [N, 3] for pictures (PIL images or paths)."""
    if isinstance(pictures, (str, os.PathLike, Image.Image)):
        pictures = [pictures]
    pictures = [load_image(p) for p in pictures]
    if not pictures:
        raise ValueError("give at least one picture")
    return image_processor()(images=pictures, return_tensors="pt")


def image_token_count(grid_thw) -> int:
    """`<|image_pad|>` ids of one picture: its grid's patches over merge_size², as `Qwen2VLProcessor` expands them."""
    grid = torch.as_tensor(grid_thw).reshape(-1)
    if grid.numel() != 3:
        raise ValueError(f"grid_thw must be (t, h, w), got {grid.tolist()}")
    return int(grid.prod()) // image_processor().merge_size ** 2


def qwen2_vl_prompt(tokenizer: QWenTokenizer, question: str, image_tokens=(), system: str = SYSTEM) -> list[int]:
    """Qwen2-VL chat ids from the course's tokenizer: chatml, each picture `<|vision_start|>` + n × `<|image_pad|>` +
    `<|vision_end|>` before the question (n from `image_tokens`)."""
    ids = make_context(tokenizer, question, system=system)[1]
    user = [IM_START_ID, *tokenizer.encode("user"), *tokenizer.encode("\n")]
    starts = [k for k in range(len(ids)) if ids[k : k + len(user)] == user]
    at = starts[-1] + len(user)  # the current turn's content starts here
    block = []
    for n in image_tokens:
        block += [VISION_START_ID, *[IMAGE_TOKEN_ID] * check_int("image tokens", n, 1), VISION_END_ID]
    return ids[:at] + block + ids[at:]


def qwen2_vl_decode(tokenizer: QWenTokenizer, ids) -> str:
    """Text of Qwen2-VL ids: the special ids by their names, ids below 151643 from the shared BPE pieces, any other id
    as `<|id_N|>` (its name is not known offline)."""
    names = {i: s for s, i in QWEN2_VL_SPECIAL_IDS.items()}
    out, run = [], []
    for token in [int(i) for i in torch.as_tensor(ids).reshape(-1).tolist()] + [None]:
        if token is not None and 0 <= token < QWEN2_VL_SPECIAL_IDS["<|endoftext|>"]:
            run.append(token)
            continue
        out.append(tokenizer.decode(run))
        run = []
        if token is not None:
            out.append(names.get(token, f"<|id_{token}|>"))
    return "".join(out)


def rope_sections(head_dim: int) -> list[int]:
    """M-RoPE's split of a head's rotary frequencies into (t, h, w) sections, in Qwen2-VL's 16 : 24 : 24 proportion."""
    half = head_dim // 2
    t = half // 4
    return [t, (half - t) // 2, half - t - (half - t) // 2]


def tiny_qwen2_vl(vocab_embedding: torch.Tensor | None = None, vocab_size: int = 32, hidden_size: int = 32, seed=0):
    """A `Qwen2VLModel` with a tiny random config (1 text layer, a 1-block vision tower); its word embedding is
    `vocab_embedding` [V, H] when given (shared, not copied), so its text positions embed as another model's do."""
    from transformers import Qwen2VLConfig, Qwen2VLModel  # noqa: PLC0415 — transformers' Qwen2-VL loads when it runs (seconds)

    if vocab_embedding is not None:
        if not isinstance(vocab_embedding, torch.Tensor) or vocab_embedding.dim() != 2:
            raise ValueError("vocab_embedding must be a [vocab rows, hidden] tensor, such as a model's wte.weight")
        vocab_size, hidden_size = vocab_embedding.shape
    heads = 2
    ends = {k: v if v < vocab_size else None for k, v in (("bos_token_id", 151643), ("eos_token_id", IM_END_ID))}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            rope_parameters=dict(
                rope_type="default", rope_theta=10000.0, mrope_section=rope_sections(hidden_size // heads)
            ),
            **ends,  # Qwen2-VL's <|endoftext|> and <|im_end|> where the vocabulary holds them
        ),
        vision_config=dict(depth=1, embed_dim=32, num_heads=2, hidden_size=hidden_size, mlp_ratio=2),
    )
    torch.manual_seed(seed)
    model = Qwen2VLModel(config).eval()
    if vocab_embedding is not None:
        model.language_model.embed_tokens.weight = torch.nn.Parameter(vocab_embedding.detach(), requires_grad=False)
    return model


def merged_input_embeds(model, input_ids, features) -> torch.Tensor:
    """What `Qwen2VLModel.forward` hands its language model: the word embeddings with `features` (one [n_i, H] block per
    picture, in order) written by its own merge into the `image_token_id` positions. [B, L, H]"""
    from transformers.modeling_outputs import BaseModelOutputWithPooling  # noqa: PLC0415 — transformers' Qwen2-VL loads when it runs (seconds)

    input_ids = as_batch(input_ids)
    features = [features] if isinstance(features, torch.Tensor) and features.dim() == 2 else list(features)
    seen = {}

    def keep(module, args, kwargs):
        seen["inputs_embeds"] = kwargs["inputs_embeds"].clone()

    hook = model.language_model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(input_ids=input_ids, mm_encoder_outputs={"image": BaseModelOutputWithPooling(pooler_output=features)})
    finally:
        hook.remove()
    return seen["inputs_embeds"]


def rope_positions(model, input_ids, image_grid_thw) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' `get_rope_index`: M-RoPE positions [3 (t, h, w), B, L] and each row's delta [B, 1]."""
    input_ids = as_batch(input_ids)
    mm_token_type_ids = (input_ids == model.config.image_token_id).int()  # 1: image, 0: text
    return model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=torch.as_tensor(image_grid_thw))

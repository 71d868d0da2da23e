"""Notebook 03 — fake prompt ids: ids past the vocabulary that point into the prompt table."""

import torch

from .checks.tensors import check_fake_id_counts, check_span_replacement
from .tokenizing import IMG_TOKEN_SPAN


def make_fake_prompt_ids(vocab_size: int, num_images: int, tokens_per_image: int = IMG_TOKEN_SPAN) -> torch.Tensor:
    """`fake_prompt_id` [N, 256]: vocab_size, vocab_size + 1, … one row per image."""
    check_fake_id_counts(vocab_size, num_images, tokens_per_image)
    return torch.arange(vocab_size, vocab_size + num_images * tokens_per_image).reshape(num_images, tokens_per_image)


def fake_ids_for_spans(vocab_size: int, lengths) -> list[torch.Tensor]:
    """The same ids for pictures of any span length: vocab_size, vocab_size + 1, … over the spans in order, one 1-D
    tensor per span (`lengths`, each span's ids, e.g. `span_lengths(img_pos)`)."""
    lengths = [int(n) for n in lengths]
    if not lengths:
        return []
    return list(make_fake_prompt_ids(vocab_size, 1, sum(lengths))[0].split(lengths))


def replace_image_spans(input_ids, img_pos, fake_prompt_id) -> torch.Tensor:
    """Copy of `input_ids` with image k's span `[a+1:b]` replaced by `fake_prompt_id[k]` (tags kept)."""
    input_ids, img_pos, fake_prompt_id = check_span_replacement(input_ids, img_pos, fake_prompt_id)
    input_ids = input_ids.clone()  # [B, L]
    for k, (i, a, b) in enumerate(img_pos.tolist()):
        input_ids[i, a + 1 : b] = fake_prompt_id[k]
    return input_ids


def fake_id_runs(ids, vocab_size: int) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive fake ids (>= vocab_size) in ids [L]: one per picture's span."""
    fake = torch.as_tensor(ids) >= vocab_size  # [L]
    edges = torch.diff(
        fake.to(torch.int8), prepend=torch.zeros(1, dtype=torch.int8), append=torch.zeros(1, dtype=torch.int8)
    )
    starts, ends = torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()
    return list(zip(starts, ends))

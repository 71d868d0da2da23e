"""Notebook 06 — sampling: the next token, greedy or drawn with temperature, top-k and top-p (TensorRT-LLM's knobs)."""

import torch

from ..requests import held_by, is_greedy, steady_logits

ARGMAX_BLOCK = 128  # greedy_tokens: the row's maximum per block of this many logits first


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Scores [n, V] divided by temperature, -inf outside the top_k and outside the smallest top_p mass (0/1: off)."""
    scores = logits / temperature if temperature != 1.0 else logits
    if 0 < top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # [n, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        ranked, order = scores.sort(dim=-1, descending=True)  # [n, V]
        probs = ranked.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked tokens
        drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, mass_before >= top_p)
        scores = scores.masked_fill(drop, float("-inf"))  # the best token always stays (mass_before = 0)
    return scores


def penalize_repetition(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """transformers' repetition penalty on logits [n, V]: the logits of tokens already in the row (`seen` [n, V]) are
    divided by `penalty` where positive, multiplied where negative."""
    penalty = held_by(penalty, logits.dtype)  # 1e-300 would be 0 in float32: logits / 0
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator=None) -> torch.Tensor:
    """Next token of each row of logits [n, V]: argmax when greedy, else a draw from the filtered softmax: [n]."""
    if is_greedy(top_k, top_p):
        return greedy_tokens(logits)
    temperature, top_p = held_by(temperature, logits.dtype), held_by(top_p, logits.dtype)
    probs = filter_logits(steady_logits(logits), temperature, top_k, top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(-1) (the first maximum of each row [n, V]) in two levels, since PyTorch's CPU argmax is not
    vectorised while amax is: the maximum of every block of ARGMAX_BLOCK logits, the first block that holds the row's
    maximum, then the first maximum inside it (a vocabulary that is no whole number of blocks: argmax)."""
    n, vocab = logits.shape
    if vocab % ARGMAX_BLOCK:
        return logits.argmax(dim=-1)
    blocks = logits.reshape(n, vocab // ARGMAX_BLOCK, ARGMAX_BLOCK)  # [n, V/B, B]
    best = blocks.amax(dim=-1).argmax(dim=-1)  # [n]
    block = blocks.gather(1, best[:, None, None].expand(n, 1, ARGMAX_BLOCK))[:, 0]  # [n, B]: no index tensor to make
    return torch.add(block.argmax(dim=-1), best, alpha=ARGMAX_BLOCK)  # five kernels on a GPU

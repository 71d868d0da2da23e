"""Engine, Triton decode attention — one new query per row against its KV cache, split over the keys.

At decode time a row's query meets at most max_seq_len cached keys per head: too little work for one program
per head to keep the memory busy, so the keys are cut into chunks of CHUNK ("flash decoding"). Each program
scores one (row, head, chunk) and keeps a partial softmax (its maximum, its sum and the weighted values); a
second kernel merges the chunks of each head. Keys after a row's position are masked by the position itself,
so no mask tensor is built.
"""

import torch
import triton
import triton.language as tl

CHUNK = 64  # keys per program
NEG = tl.constexpr(-1.0e30)  # the score of a masked key: finite, so a chunk without keys gives weights 0, not NaN


@triton.jit
def _attend_chunk_kernel(q_ptr, cache_ptr, pos_ptr, part_ptr, stat_ptr, heads, splits, scale,
                         stride_q, stride_kv, stride_row, stride_head, stride_pos,
                         HD: tl.constexpr, CHUNK: tl.constexpr):
    """Program (row·heads + head, chunk): softmax over the chunk's keys ≤ the row's position, unnormalised:
    part [HD] = Σ exp(s − m)·v, stat = (m, Σ exp(s − m))."""
    job, chunk = tl.program_id(0), tl.program_id(1)
    row, head = job // heads, job % heads
    d = tl.arange(0, HD)
    s = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = s <= tl.load(pos_ptr + row)
    q = tl.load(q_ptr + row * stride_q + head * HD + d).to(tl.float32) * scale  # [HD]
    keys = cache_ptr + row * stride_row + head * stride_head + s[:, None] * stride_pos + d[None, :]  # [CHUNK, HD]
    k = tl.load(keys, mask=ok[:, None], other=0.0).to(tl.float32)
    scores = tl.where(ok, tl.sum(k * q[None, :], axis=1), NEG)  # [CHUNK]
    m = tl.max(scores, axis=0)
    p = tl.where(ok, tl.exp(scores - m), 0.0)
    v = tl.load(keys + stride_kv, mask=ok[:, None], other=0.0).to(tl.float32)
    out = job * splits + chunk
    tl.store(part_ptr + out * HD + d, tl.sum(p[:, None] * v, axis=0))
    tl.store(stat_ptr + 2 * out, m)
    tl.store(stat_ptr + 2 * out + 1, tl.sum(p, axis=0))


@triton.jit
def _merge_chunks_kernel(part_ptr, stat_ptr, out_ptr, splits, HD: tl.constexpr, SPLITS: tl.constexpr):
    """Program row·heads + head: the chunks' partial softmaxes rescaled to their common maximum and normalised."""
    job = tl.program_id(0)
    c = tl.arange(0, SPLITS)
    d = tl.arange(0, HD)
    ok = c < splits
    m = tl.load(stat_ptr + 2 * (job * splits + c), mask=ok, other=NEG)  # [SPLITS]
    total = tl.load(stat_ptr + 2 * (job * splits + c) + 1, mask=ok, other=0.0)
    weight = tl.exp(m - tl.max(m, axis=0))  # chunks without keys: exp(NEG − max) = 0
    part = tl.load(part_ptr + (job * splits + c)[:, None] * HD + d[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(weight[:, None] * part, axis=0) / tl.sum(weight * total, axis=0)
    tl.store(out_ptr + job * HD + d, out.to(out_ptr.dtype.element_ty))


def decode_attention(q: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
    """q [n, heads, hd] of rows 0..n-1 at positions pos [n] (their keys and values already in the cache
    [2, rows, heads, S, hd]) attending to cache positions 0..pos (all < kv_len): [n, heads·hd]."""
    n, heads, hd = q.shape
    _, rows, cache_heads, seq, cache_hd = cache.shape
    if (heads, hd) != (cache_heads, cache_hd) or n > rows or not 0 < kv_len <= seq or pos.shape != (n,):
        raise ValueError(f"q {tuple(q.shape)}, pos {tuple(pos.shape)} and kv_len {kv_len} do not fit the cache "
                         f"{tuple(cache.shape)}")
    if not q.is_contiguous() or cache.stride(-1) != 1 or hd & (hd - 1):
        raise ValueError("decode_attention needs a contiguous q, a cache with contiguous head vectors and a head size "
                         f"that is a power of two, got head size {hd}")
    splits = triton.cdiv(kv_len, CHUNK)
    part = torch.empty(n, heads, splits, hd, dtype=torch.float32, device=q.device)
    stat = torch.empty(n, heads, splits, 2, dtype=torch.float32, device=q.device)
    out = torch.empty(n, heads * hd, dtype=q.dtype, device=q.device)
    _attend_chunk_kernel[(n * heads, splits)](q, cache, pos, part, stat, heads, splits, hd ** -0.5, q.stride(0),
                                              cache.stride(0), cache.stride(1), cache.stride(2), cache.stride(3),
                                              HD=hd, CHUNK=CHUNK)
    _merge_chunks_kernel[(n * heads,)](part, stat, out, splits, HD=hd, SPLITS=max(2, triton.next_power_of_2(splits)))
    return out

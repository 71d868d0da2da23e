"""Decode back end "triton", its attention — one new query per row against its KV cache, split over the keys.

At decode time a row's query meets at most max_seq_len cached keys per head: too little work for one program per
head to keep the memory busy, so the keys are cut into chunks of CHUNK ("flash decoding"). Each program rotates the
row's q and k (RoPE), writes k and v into the cache if its chunk holds the row's position, scores its chunk and keeps
a partial softmax (its maximum, its sum and the weighted values); the head's last program to finish (a ticket
counter) merges them. Keys after a row's position are masked by the position itself, so no mask tensor is built.
"""

import torch
import triton
import triton.language as tl

CHUNK = 32  # keys per program
NUM_WARPS = 2  # per program: few keys each, many programs
NEG = tl.constexpr(-1.0e30)  # the score of a masked key: finite, so a chunk without keys gives weights 0, not NaN


@triton.jit
def _rope(src, d, swapped, cos, sin_signed):
    """NeoX RoPE of one head vector at src [HD]: x·cos + [x2 | x1]·[-sin | sin], in float32."""
    return tl.load(src + d).to(tl.float32) * cos + tl.load(src + swapped).to(tl.float32) * sin_signed


@triton.jit
def _decode_attention_kernel(
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    cache_ptr,
    part_ptr,
    stat_ptr,
    tickets_ptr,
    out_ptr,
    heads,
    splits,
    scale,
    stride_qkv,
    stride_table,
    stride_kv,
    stride_row,
    stride_head,
    stride_pos,
    HD: tl.constexpr,
    CHUNK: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Program (row·heads + head, chunk): RoPE on the row's q and k (k and v go into the cache at the row's position,
    by the chunk that holds it), then a softmax over the chunk's keys ≤ that position, unnormalised: part [HD] =
    Σ exp(s − m)·v, stat = (m, Σ exp(s − m)). The head's last chunk to finish merges them into out."""
    job, chunk = tl.program_id(0), tl.program_id(1)
    row, head = job // heads, job % heads
    d = tl.arange(0, HD)
    swapped = (d + HD // 2) % HD  # [x2 | x1]
    pos = tl.load(pos_ptr + row)
    cos = tl.load(cos_ptr + pos * stride_table + d).to(tl.float32)
    sin_signed = tl.load(sin_ptr + pos * stride_table + d).to(tl.float32)
    src = qkv_ptr + row * stride_qkv + head * HD  # q; k and v follow heads·HD apart
    dtype = cache_ptr.dtype.element_ty
    q = _rope(src, d, swapped, cos, sin_signed).to(dtype).to(tl.float32) * scale  # [HD]
    k_new = _rope(src + heads * HD, d, swapped, cos, sin_signed).to(dtype)  # [HD]
    v_new = tl.load(src + 2 * heads * HD + d)
    here = cache_ptr + row * stride_row + head * stride_head + pos * stride_pos + d
    mine = d < tl.where(chunk == pos // CHUNK, HD, 0)  # [HD]: all true in the chunk that holds pos
    tl.store(here, k_new, mask=mine)
    tl.store(here + stride_kv, v_new, mask=mine)
    s = chunk * CHUNK + tl.arange(0, CHUNK)
    cached, new = (s < pos)[:, None], (s == pos)[:, None]  # [CHUNK, 1]: this step's key comes from registers
    keys = cache_ptr + row * stride_row + head * stride_head + s[:, None] * stride_pos + d[None, :]  # [CHUNK, HD]
    k = tl.where(new, k_new[None, :], tl.load(keys, mask=cached, other=0.0)).to(tl.float32)
    v = tl.where(new, v_new[None, :], tl.load(keys + stride_kv, mask=cached, other=0.0)).to(tl.float32)
    ok = s <= pos
    scores = tl.where(ok, tl.sum(k * q[None, :], axis=1), NEG)  # [CHUNK]
    m = tl.max(scores, axis=0)
    p = tl.where(ok, tl.exp(scores - m), 0.0)
    out = job * splits + chunk
    tl.store(part_ptr + out * HD + d, tl.sum(p[:, None] * v, axis=0))
    tl.store(stat_ptr + 2 * out, m)
    tl.store(stat_ptr + 2 * out + 1, tl.sum(p, axis=0))
    tl.debug_barrier()  # every thread of this program has stored its part before the ticket is taken
    if tl.atomic_add(tickets_ptr + job, 1) == splits - 1:  # the head's last chunk: merge
        c = tl.arange(0, SPLITS)
        c_ok = c < splits
        stat = stat_ptr + 2 * (job * splits + c)
        maxima = tl.load(stat, mask=c_ok, other=NEG, cache_modifier=".cg")  # [SPLITS]
        total = tl.load(stat + 1, mask=c_ok, other=0.0, cache_modifier=".cg")
        weight = tl.exp(maxima - tl.max(maxima, axis=0))  # chunks without keys: exp(NEG − max) = 0
        part = tl.load(
            part_ptr + (job * splits + c)[:, None] * HD + d[None, :],
            mask=c_ok[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        merged = tl.sum(weight[:, None] * part, axis=0) / tl.sum(weight * total, axis=0)
        tl.store(out_ptr + job * HD + d, merged.to(out_ptr.dtype.element_ty))
        tl.atomic_xchg(tickets_ptr + job, 0)


def decode_attention(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    pos: torch.Tensor,
    cache: torch.Tensor,
    kv_len: int,
    tickets: torch.Tensor,
) -> torch.Tensor:
    """qkv [n, 3·heads·hd] of rows 0..n-1 at positions pos [n] (all < kv_len): RoPE on q and k, k and v written into
    the cache [2, rows, heads, S, hd] at pos, q attending to cache positions 0..pos: [n, heads·hd]. cos, sin_signed
    [S, hd] as in LanguageModelEngine; tickets: int32 counters at 0, one per (row, head), left at 0."""
    n = qkv.shape[0]
    _, rows, heads, seq, hd = cache.shape
    if qkv.shape[1] != 3 * heads * hd or n > rows or pos.shape != (n,) or not 0 < kv_len <= seq:
        raise ValueError(
            f"qkv {tuple(qkv.shape)}, pos {tuple(pos.shape)} and kv_len {kv_len} do not fit the cache "
            f"{tuple(cache.shape)}"
        )
    if (
        cos.shape != (seq, hd)
        or sin_signed.shape != (seq, hd)
        or tickets.dtype != torch.int32
        or tickets.numel() < n * heads
    ):
        raise ValueError(
            f"RoPE tables {tuple(cos.shape)}, {tuple(sin_signed.shape)} must be [{seq}, {hd}] and tickets "
            f"int32 with at least {n * heads} counters, got {tickets.dtype} {tickets.numel()}"
        )
    if not all(t.is_contiguous() for t in (qkv, cos, sin_signed)) or cache.stride(-1) != 1 or hd & (hd - 1):
        raise ValueError(
            "decode_attention needs contiguous qkv and tables, a cache with contiguous head vectors and a "
            f"head size that is a power of two, got head size {hd}"
        )
    splits = triton.cdiv(kv_len, CHUNK)
    part = torch.empty(n, heads, splits, hd, dtype=torch.float32, device=qkv.device)
    stat = torch.empty(n, heads, splits, 2, dtype=torch.float32, device=qkv.device)
    out = torch.empty(n, heads * hd, dtype=cache.dtype, device=qkv.device)
    _decode_attention_kernel[(n * heads, splits)](
        qkv,
        cos,
        sin_signed,
        pos,
        cache,
        part,
        stat,
        tickets,
        out,
        heads,
        splits,
        hd**-0.5,
        qkv.stride(0),
        cos.stride(0),
        cache.stride(0),
        cache.stride(1),
        cache.stride(2),
        cache.stride(3),
        HD=hd,
        CHUNK=CHUNK,
        SPLITS=max(2, triton.next_power_of_2(splits)),
        num_warps=NUM_WARPS,
    )
    return out

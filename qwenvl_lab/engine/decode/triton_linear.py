"""Decode back end "triton", its products — the decode step's matrix-vector products with their neighbours fused in.

At decode time each weight matrix is read once per step for a handful of rows, so a layer costs what it takes to
stream its weights, and every separate small kernel around it (residual add, SwiGLU) adds a launch and a round trip
of the activations. `fused_linear` streams W [N, K] once and finishes in the same kernel: the bias, Qwen's gated MLP
`gate · silu(fc)`, or adding the product straight into the float32 residual stream (split over K across programs,
with atomic adds, so short outputs still get many programs). `rms_norm` reads the residual stream once per norm.
Rows go through tl.dot, ROW_TILE of them per program (a decode step of more rows streams W once per tile). On a CPU
the same kernels run through Triton's interpreter (TRITON_INTERPRET=1: tests only), which cannot time the tile
shapes and takes the first. docs/performance-log.md records the alternatives that were measured.

Weight-only INT8: W is int8 with one scale per output row. Each tile of W is read as int8 (half the bytes of
float16), turned into the activations' dtype in registers (exact: |q| <= 128) for tl.dot, and the float32 sums are
multiplied by the row's scale before the epilogue — the same y = scale · (x · q) + b as dequantising W first, with
no rounding of q · scale. Tile shapes with twice the K are added for int8, so a tile reads as many bytes.
"""

import torch
import triton
import triton.language as tl

ROW_TILE = 16  # rows per program: a decode step's batch × beams fits in one tile up to this
INTERPRETED = triton.knobs.runtime.interpret  # Triton's interpreter (TRITON_INTERPRET=1): a CPU runs the kernels


def _configs(shapes) -> list:
    """Tile shapes (BLOCK_N, BLOCK_K, warps, stages), each with split-K 1, 2 and 4."""
    return [
        triton.Config({"BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": s}, num_warps=w, num_stages=st)
        for n, k, w, st in shapes
        for s in (1, 2, 4)
    ]


# tile shapes tried once per shape on a GPU (and split-K when the product is added into the residual stream);
# the interpreter takes the first. The last ones are tried for int8 weights only (appended: a saved choice is an
# index into this list)
CONFIGS = _configs(
    (
        (16, 256, 4, 4),
        (16, 512, 4, 3),
        (32, 128, 4, 3),
        (32, 128, 4, 4),
        (32, 128, 4, 5),
        (32, 256, 4, 4),
        (64, 128, 8, 4),
        (64, 256, 4, 4),
    )
)
FLOAT_CONFIGS = len(CONFIGS)
CONFIGS += _configs(
    ((16, 512, 4, 4), (16, 1024, 4, 3), (32, 256, 4, 5), (32, 512, 4, 3), (32, 512, 4, 4), (64, 512, 8, 3))
)


def _prune(configs, named_args, **kwargs):
    """Split-K only where the product is added into the residual stream (atomic adds); the int8 tile shapes only for
    int8 weights."""
    return [
        c
        for i, c in enumerate(configs)
        if (c.kwargs["SPLIT_K"] == 1 or kwargs["EPILOGUE"] == "accumulate") and (i < FLOAT_CONFIGS or kwargs["SCALED"])
    ]


@triton.jit
def _fused_linear_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BIAS: tl.constexpr,
    SCALED: tl.constexpr,
    EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """y[rows, block] = epilogue(x[rows] @ W[block].T + b) for the row tile `rows`; swiglu reads rows `block` (gate)
    and N + block (fc); accumulate adds into y (float32) from SPLIT_K programs, each over its share of K. SCALED: W
    is int8, each of its rows n standing for W[n] · s[n] (the sums are scaled before the bias)."""
    pid, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rm < M, rn < N
    per_split = ((K + SPLIT_K - 1) // SPLIT_K + BLOCK_K - 1) // BLOCK_K * BLOCK_K  # a whole number of K tiles
    k_start = pid_k * per_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_fc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + per_split, K), BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc, input_precision="ieee")  # int8 → x's dtype in registers
        if EPILOGUE == "swiglu":
            w_fc = tl.load(
                w_ptr + (N + rn)[:, None] * stride_wn + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0
            )
            acc_fc = tl.dot(x, tl.trans(w_fc.to(x.dtype)), acc_fc, input_precision="ieee")
    if SCALED:  # one scale per row of W: per output column of y
        acc *= tl.load(s_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if EPILOGUE == "swiglu":
            acc_fc *= tl.load(s_ptr + N + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if BIAS:
        bias = tl.load(b_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)
        acc += tl.where(pid_k == 0, bias, 0.0)[None, :]  # added once, by the first share of K
    if EPILOGUE == "swiglu":
        acc = acc * (acc_fc * tl.sigmoid(acc_fc))  # gate · silu(fc)
    out = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    if EPILOGUE == "accumulate":
        tl.atomic_add(out, acc, mask=row_ok[:, None] & col_ok[None, :])
    else:
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


_tuned = triton.autotune(
    CONFIGS, key=["N", "K", "EPILOGUE"], prune_configs_by={"early_config_prune": _prune}, restore_value=["y_ptr"]
)(_fused_linear_kernel)


def tuned_choices() -> list[dict]:
    """The tile shapes the autotuner chose so far: [{"key": [N, K, epilogue, dtypes…], "config": index in CONFIGS}]."""
    return [
        {"key": list(key), "config": CONFIGS.index(config)} for key, config in _tuned.cache.items() if config in CONFIGS
    ]


def use_choices(choices: list[dict]) -> int:
    """Hand the autotuner choices made earlier (tuned_choices' form), so it does not time the tiles again: how many
    were taken (entries that do not name one of CONFIGS are skipped)."""
    taken = 0
    for choice in choices:
        index = choice.get("config") if isinstance(choice, dict) else None
        if isinstance(index, int) and 0 <= index < len(CONFIGS) and isinstance(choice.get("key"), list):
            _tuned.cache[tuple(choice["key"])] = CONFIGS[index]
            taken += 1
    return taken


def fused_linear(
    x: torch.Tensor, weight: torch.Tensor, bias=None, swiglu: bool = False, out=None, scale=None, dtype=None
) -> torch.Tensor:
    """x @ weight.T + bias for x [M, K], weight [N, K], both in one dtype (float32 accumulation).

    swiglu: weight stacks gate and fc rows [2F, K] and the result is gate · silu(fc) [M, F]. out: a float32
    [M, N] tensor (the residual stream) that the product is added into, in place; it is returned. scale: weight is
    int8 and stands for weight · scale[:, None] (weight-only INT8, scale [N] one per row). dtype: the result's
    (default x's; float32 for logits).
    """
    m, k = x.shape
    rows = weight.shape[0]
    n = rows // 2 if swiglu else rows
    if weight.shape[1] != k or (swiglu and rows % 2):
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}"
            + (" (swiglu needs gate and fc rows stacked: [2F, K])" if swiglu else "")
        )
    if (weight.dtype == torch.int8) != (scale is not None):
        raise ValueError(
            f"an int8 weight needs its scales [N] (scale=…), a {weight.dtype} one none: got weight {weight.dtype} "
            f"and scale {None if scale is None else tuple(scale.shape)}"
        )
    if scale is not None and (scale.shape != (rows,) or not scale.is_floating_point()):
        raise ValueError(f"scale must be a float tensor [{rows}], one per row of the weight, got {tuple(scale.shape)}")
    if x.dtype != weight.dtype and scale is None:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}: give both in the engine's dtype")
    if out is not None and (swiglu or out.shape != (m, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(
            f"out must be a contiguous float32 [{m}, {n}] tensor (not with swiglu), got {out.dtype} {tuple(out.shape)}"
        )
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(m, n, dtype=dtype or x.dtype, device=x.device) if out is None else out
    extra = x if scale is None else scale.contiguous()
    args = (x, weight, extra, bias if bias is not None else x, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0))
    flags = dict(
        BIAS=bias is not None,
        SCALED=scale is not None,
        BLOCK_M=ROW_TILE,
        EPILOGUE="swiglu" if swiglu else "accumulate" if out is not None else "none",
    )
    tiles = triton.cdiv(m, ROW_TILE)
    if INTERPRETED:  # it cannot time tile shapes: the first, split in two where it may be
        first = {**CONFIGS[0].kwargs, "SPLIT_K": 2 if out is not None else 1}
        _fused_linear_kernel[(triton.cdiv(n, first["BLOCK_N"]), first["SPLIT_K"], tiles)](*args, **flags, **first)
    else:
        _tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"], tiles)](*args, **flags)
    return y


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, y_ptr, ids_ptr, stream_ptr, H, eps, stride_x, stride_y, GATHER: tl.constexpr, BLOCK: tl.constexpr
):
    """One row per program: modeling.RMSNorm (normalise in float32, round to the weight's dtype, times the weight).
    GATHER: the row is row ids[row] of the table at x_ptr (an embedding), also written in float32 to stream_ptr (the
    residual stream [n, H], contiguous)."""
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    source = tl.load(ids_ptr + row) if GATHER else row
    x = tl.load(x_ptr + source * stride_x + d, mask=d < H, other=0.0).to(tl.float32)
    if GATHER:
        tl.store(stream_ptr + row * H + d, x, mask=d < H)
    w = tl.load(w_ptr + d, mask=d < H, other=0.0)
    y = (x * tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)).to(w.dtype) * w
    tl.store(y_ptr + row * stride_y + d, y, mask=d < H)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of x [n, H] (the float32 residual stream) in weight's dtype: [n, H]."""
    if x.dim() != 2 or weight.shape != (x.shape[1],) or x.stride(1) != 1:
        raise ValueError(
            f"rms_norm needs x [n, H] with contiguous rows and weight [H], got {tuple(x.shape)}, {tuple(weight.shape)}"
        )
    y = torch.empty(x.shape, dtype=weight.dtype, device=x.device)
    _rms_norm_kernel[(x.shape[0],)](
        x,
        weight,
        y,
        x,
        x,
        x.shape[1],
        eps,
        x.stride(0),
        y.stride(0),
        GATHER=False,
        BLOCK=triton.next_power_of_2(x.shape[1]),
    )
    return y


def embed_rms_norm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float):
    """The decode step's first kernel: rows ids [n] of the embedding table [V, H] as the float32 residual stream
    x [n, H], and its RMSNorm h [n, H] in weight's dtype — F.embedding, .float() and rms_norm in one launch: (x, h)."""
    if ids.dim() != 1 or table.dim() != 2 or weight.shape != (table.shape[1],) or table.stride(1) != 1:
        raise ValueError(
            f"embed_rms_norm needs ids [n], a table [V, H] with contiguous rows and weight [H], got "
            f"{tuple(ids.shape)}, {tuple(table.shape)}, {tuple(weight.shape)}"
        )
    ids, (n, hidden) = ids.contiguous(), (ids.shape[0], table.shape[1])
    x = torch.empty(n, hidden, dtype=torch.float32, device=table.device)
    y = torch.empty(n, hidden, dtype=weight.dtype, device=table.device)
    _rms_norm_kernel[(n,)](
        table,
        weight,
        y,
        ids,
        x,
        hidden,
        eps,
        table.stride(0),
        y.stride(0),
        GATHER=True,
        BLOCK=triton.next_power_of_2(hidden),
    )
    return x, y

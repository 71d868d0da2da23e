"""Decode back end "triton", its products — the decode step's matrix-vector products with their neighbours fused in.

At decode time each weight matrix is read once per step for a handful of rows, so a layer costs what it takes to
stream its weights, and every separate small kernel around it (residual add, SwiGLU) adds a launch and a round trip
of the activations. `fused_linear` streams W [N, K] once and finishes in the same kernel: the bias, Qwen's gated MLP
`gate · silu(fc)`, or adding the product straight into the float32 residual stream (split over K across programs,
with atomic adds, so short outputs still get many programs). `rms_norm` reads the residual stream once per norm.
Rows go through tl.dot, ROW_TILE of them per program (a decode step of more rows streams W once per tile). On a CPU
the same kernels run through Triton's interpreter (TRITON_INTERPRET=1: tests only), which cannot time the tile
shapes and takes the first. docs/performance-log.md records the alternatives that were measured.
"""

import torch
import triton
import triton.language as tl

ROW_TILE = 16  # rows per program: a decode step's batch × beams fits in one tile up to this
INTERPRETED = triton.knobs.runtime.interpret  # Triton's interpreter (TRITON_INTERPRET=1): a CPU runs the kernels

# tile shapes tried once per shape on a GPU (and split-K when the product is added into the residual stream);
# the interpreter takes the first
CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": s}, num_warps=w, num_stages=st)
    for n, k, w, st in (
        (16, 256, 4, 4),
        (16, 512, 4, 3),
        (32, 128, 4, 3),
        (32, 128, 4, 4),
        (32, 128, 4, 5),
        (32, 256, 4, 4),
        (64, 128, 8, 4),
        (64, 256, 4, 4),
    )
    for s in (1, 2, 4)
]


def _prune(configs, named_args, **kwargs):
    """Split-K only where the product is added into the residual stream (atomic adds)."""
    return [c for c in configs if c.kwargs["SPLIT_K"] == 1 or kwargs["EPILOGUE"] == "accumulate"]


@triton.jit
def _fused_linear_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BIAS: tl.constexpr,
    EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """y[rows, block] = epilogue(x[rows] @ W[block].T + b) for the row tile `rows`; swiglu reads rows `block` (gate)
    and N + block (fc); accumulate adds into y (float32) from SPLIT_K programs, each over its share of K."""
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
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        if EPILOGUE == "swiglu":
            w_fc = tl.load(
                w_ptr + (N + rn)[:, None] * stride_wn + rk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0
            )
            acc_fc = tl.dot(x, tl.trans(w_fc), acc_fc, input_precision="ieee")
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


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias=None, swiglu: bool = False, out=None) -> torch.Tensor:
    """x @ weight.T + bias for x [M, K], weight [N, K], both in one dtype (float32 accumulation).

    swiglu: weight stacks gate and fc rows [2F, K] and the result is gate · silu(fc) [M, F]. out: a float32
    [M, N] tensor (the residual stream) that the product is added into, in place; it is returned.
    """
    m, k = x.shape
    rows = weight.shape[0]
    n = rows // 2 if swiglu else rows
    if weight.shape[1] != k or (swiglu and rows % 2):
        raise ValueError(
            f"weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}"
            + (" (swiglu needs gate and fc rows stacked: [2F, K])" if swiglu else "")
        )
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype} but the weight is {weight.dtype}: give both in the engine's dtype")
    if out is not None and (swiglu or out.shape != (m, n) or out.dtype != torch.float32 or not out.is_contiguous()):
        raise ValueError(
            f"out must be a contiguous float32 [{m}, {n}] tensor (not with swiglu), got {out.dtype} {tuple(out.shape)}"
        )
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(m, n, dtype=weight.dtype, device=x.device) if out is None else out
    args = (x, weight, bias if bias is not None else x, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0))
    flags = dict(
        BIAS=bias is not None,
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
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, H, eps, stride_x, stride_y, BLOCK: tl.constexpr):
    """One row per program: modeling.RMSNorm (normalise in float32, round to the weight's dtype, times the weight)."""
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + d, mask=d < H, other=0.0).to(tl.float32)
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
        x, weight, y, x.shape[1], eps, x.stride(0), y.stride(0), BLOCK=triton.next_power_of_2(x.shape[1])
    )
    return y

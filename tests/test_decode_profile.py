"""tools/decode_profile.py's accounting of a decode step, on a made-up kernel timeline whose every number is known."""

import pytest

from tools import decode_profile as dp

LAYERS = 2


def step_kernels(start: float) -> list[tuple[str, float]]:
    """One Triton step of LAYERS layers as (kernel name, duration µs), then the pick and bookkeeping."""
    names = ["triton_poi__rms_norm_kernel"]  # the embedding's norm (any prefix or suffix is fine)
    for i in range(LAYERS):
        names += (["_rms_norm_kernel"] if i else []) + ["_fused_linear_kernel", "_decode_attention_kernel"]
        names += ["_fused_linear_kernel", "_rms_norm_kernel", "_fused_linear_kernel", "_fused_linear_kernel"]
    names += ["_rms_norm_kernel", "_fused_linear_kernel"]  # ln_f, lm_head
    durations = {"_fused_linear_kernel": 10.0, "_rms_norm_kernel": 2.0, "_decode_attention_kernel": 5.0}
    triton = [(n, next(d for k, d in durations.items() if k in n)) for n in names]
    return triton + [("reduce_kernel amax", 3.0), ("argmax_kernel", 1.0), ("copy_kernel", 1.0)]


def timeline(steps: int, gap_inside: float = 1.0, gap_outside: float = 4.0) -> list[dict]:
    """A prefill (PyTorch kernels), then `steps` decode steps: gap_inside µs between Triton kernels, gap_outside µs
    after each kernel outside the graph."""
    t, out = 0.0, [{"name": "ampere_sgemm", "start_us": 0.0, "dur_us": 50.0}]
    t = 60.0
    for _ in range(steps):
        for name, dur in step_kernels(t):
            out.append({"name": name, "start_us": t, "dur_us": dur})
            t += dur + (gap_inside if dp.role_of(name) else gap_outside)
    return out


def test_a_step_is_cut_at_the_first_triton_kernel_after_pytorch_ones():
    steps = dp.steps_of(timeline(4), LAYERS)
    assert len(steps) == 3  # the last one, which ends the generation, is dropped
    assert all(len(s) == len(step_kernels(0)) for s in steps)


def test_every_microsecond_of_a_step_lands_in_one_role():
    kernels = timeline(5)
    report = dp.summarize(kernels, LAYERS, {"qkv": 1000, "dense": 500, "gate_fc": 2000, "proj": 1000, "lm_head": 4000})
    ms = report["ms_per_step"]
    triton = 1 + (2 * LAYERS - 1) + 1  # norms: the embedding's, ln_1 after the first layer, ln_2 each, ln_f
    assert ms["norms"] == pytest.approx(triton * 2.0 / 1e3)
    assert ms["products"] == pytest.approx((4 * LAYERS + 1) * 10.0 / 1e3)
    assert ms["attention"] == pytest.approx(LAYERS * 5.0 / 1e3)
    assert ms["pick and bookkeeping"] == pytest.approx(5.0 / 1e3)
    inside = len(step_kernels(0)) - 3 - 1  # between consecutive Triton kernels
    assert ms["gaps inside the graph"] == pytest.approx(inside * 1.0 / 1e3)
    assert ms["gaps outside the graph"] == pytest.approx((1.0 + 3 * 4.0) / 1e3)  # after lm_head, then 3 × 4 µs
    parts = sum(v for k, v in ms.items() if k != "step")
    assert parts == pytest.approx(ms["step"]) and sum(report["share_of_step"].values()) == pytest.approx(1.0)
    assert report["products"]["qkv"]["launches_per_step"] == LAYERS and report["products"]["lm_head"]["us_each"] == 10
    assert report["products"]["gate_fc"]["gb_per_s"] == pytest.approx(2000 / 10e-6 / 1e9)
    assert report["outside_the_graph"]["argmax_kernel"] == {"us_per_step": 1.0, "launches_per_step": 1.0}
    assert report["steps"] == 4


def test_a_profile_without_the_graphs_kernels_says_so():
    with pytest.raises(ValueError, match="whole decode step"):
        dp.summarize([{"name": "ampere_sgemm", "start_us": 0.0, "dur_us": 5.0}], LAYERS, {})

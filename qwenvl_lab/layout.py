"""Weight names: Qwen-VL-Chat's (HF) keys and TensorRT-LLM's unified-checkpoint keys for the language model."""

import re

# (HF pattern, TensorRT-LLM name) — w1/w2 swap on purpose: TensorRT-LLM's GatedMLP is proj(silu(fc(x)) * gate(x))
LAYER_NAMES = {
    "ln_1.weight": "input_layernorm.weight",
    "attn.c_attn.weight": "attention.qkv.weight",
    "attn.c_attn.bias": "attention.qkv.bias",
    "attn.c_proj.weight": "attention.dense.weight",
    "ln_2.weight": "post_layernorm.weight",
    "mlp.w1.weight": "mlp.gate.weight",
    "mlp.w2.weight": "mlp.fc.weight",
    "mlp.c_proj.weight": "mlp.proj.weight",
}
TOP_NAMES = {
    "transformer.wte.weight": "transformer.vocab_embedding.weight",
    "transformer.ln_f.weight": "transformer.ln_f.weight",
    "lm_head.weight": "lm_head.weight",
}
LAYER_KEY = re.compile(r"transformer\.h\.(\d+)\.(.+)")


def is_visual(hf_key: str) -> bool:
    """True for the vision tower's weights (not part of the language-model engine)."""
    return hf_key.startswith("transformer.visual.")


def trtllm_name(hf_key: str) -> str:
    """TensorRT-LLM checkpoint name of a Qwen-VL-Chat language-model key."""
    if hf_key in TOP_NAMES:
        return TOP_NAMES[hf_key]
    match = LAYER_KEY.fullmatch(hf_key)
    if match and match.group(2) in LAYER_NAMES:
        return f"transformer.layers.{match.group(1)}.{LAYER_NAMES[match.group(2)]}"
    raise KeyError(f"{hf_key!r} is not a Qwen-VL language-model weight (vision weights stay out of the LLM checkpoint)")


def hf_name(trtllm_key: str) -> str:
    """Inverse of `trtllm_name`."""
    inverse_top = {v: k for k, v in TOP_NAMES.items()}
    if trtllm_key in inverse_top:
        return inverse_top[trtllm_key]
    match = re.fullmatch(r"transformer\.layers\.(\d+)\.(.+)", trtllm_key)
    inverse_layer = {v: k for k, v in LAYER_NAMES.items()}
    if match and match.group(2) in inverse_layer:
        return f"transformer.h.{match.group(1)}.{inverse_layer[match.group(2)]}"
    raise KeyError(f"{trtllm_key!r} is not a TensorRT-LLM QWen checkpoint weight")


def to_trtllm_names(state: dict) -> dict:
    """Rename a Qwen-VL state dict to TensorRT-LLM's names, dropping the vision tower."""
    return {trtllm_name(k): v for k, v in state.items() if not is_visual(k)}

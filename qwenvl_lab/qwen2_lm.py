"""transformers' Qwen2 on the course's language-model weights: a model this project did not write, as a reference.

Qwen-VL's language model is Qwen2's architecture under other names — pre-norm RMSNorm blocks, q, k and v with a bias,
rotate-half RoPE, a SwiGLU MLP, an untied lm_head — so its weights, renamed (`qwen2_state_dict`), run in
transformers' `Qwen2ForCausalLM` (`qwen2_model`). The per-stage diff compares a dump of it with the package's
language model (docs/diff.md); up to seq_length (2048), where Qwen-VL's dynamic NTK and logn attention start, the two
compute the same function.
"""

import re

import torch

# Qwen-VL's layer keys → Qwen2's; attn.c_attn [3·h, h] (and its bias) splits into q_proj, k_proj, v_proj. Qwen's MLP is
# c_proj(w1(x) · silu(w2(x))), Qwen2's down_proj(silu(gate_proj(x)) · up_proj(x)): w2 is the gate, w1 the up projection
QWEN2_LAYER_NAMES = {
    "ln_1.weight": "input_layernorm.weight",
    "attn.c_proj.weight": "self_attn.o_proj.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
    "mlp.w1.weight": "mlp.up_proj.weight",
    "mlp.w2.weight": "mlp.gate_proj.weight",
    "mlp.c_proj.weight": "mlp.down_proj.weight",
}
QWEN2_TOP_NAMES = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "lm_head.weight": "lm_head.weight",
}
LAYER_KEY = re.compile(r"transformer\.h\.(\d+)\.(.+)")


def qwen2_config(config):
    """transformers' Qwen2Config for a QWenVLConfig's language model (the vision tower stays out)."""
    from transformers import Qwen2Config  # noqa: PLC0415 — transformers' Qwen2 loads when it is asked for (seconds)

    if config.rotary_pct != 1.0 or not config.no_bias:
        raise ValueError(
            f"Qwen2 rotates every dimension of a head and has no MLP bias: rotary_pct {config.rotary_pct} and "
            f"no_bias {config.no_bias} do not map (Qwen-VL-Chat's are 1.0 and true)"
        )
    return Qwen2Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size // 2,  # Qwen v1 stores twice the MLP width
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_attention_heads,
        hidden_act="silu",
        max_position_embeddings=config.seq_length,  # past it Qwen-VL applies dynamic NTK, which Qwen2 does not
        rms_norm_eps=config.layer_norm_epsilon,
        rope_theta=float(config.rotary_emb_base),
        tie_word_embeddings=False,
        use_sliding_window=False,
        attention_dropout=0.0,
    )


def qwen2_state_dict(state: dict, hidden_size: int) -> dict[str, torch.Tensor]:
    """A Qwen-VL state dict's language model under Qwen2ForCausalLM's names (the vision tower dropped)."""
    renamed = {}
    for key, value in state.items():
        if key.startswith("transformer.visual."):
            continue
        if key in QWEN2_TOP_NAMES:
            renamed[QWEN2_TOP_NAMES[key]] = value
            continue
        found = LAYER_KEY.fullmatch(key)
        if found is None:
            raise KeyError(f"{key!r} is not a Qwen-VL language-model weight")
        prefix, name = f"model.layers.{found[1]}.", found[2]
        if name in ("attn.c_attn.weight", "attn.c_attn.bias"):
            kind = name.rsplit(".", 1)[1]
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), value.split(hidden_size, dim=0)):
                renamed[f"{prefix}self_attn.{part}.{kind}"] = chunk
        elif name in QWEN2_LAYER_NAMES:
            renamed[prefix + QWEN2_LAYER_NAMES[name]] = value
        else:
            raise KeyError(f"{key!r} is not a Qwen-VL language-model weight")
    return renamed


def qwen2_model(model):
    """transformers' Qwen2ForCausalLM holding a QWenLMHeadModel's language-model weights (copies), on its device and
    in its dtype, in eval mode."""
    from transformers import Qwen2ForCausalLM  # noqa: PLC0415 — transformers' Qwen2 loads when it is asked for (seconds)

    config = qwen2_config(model.config)
    with torch.device("meta"):
        qwen2 = Qwen2ForCausalLM(config)
    state = qwen2_state_dict(model.state_dict(), model.config.hidden_size)
    qwen2.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True, assign=True)
    with torch.device(model.device):  # the rotary tables are buffers: made again off the meta device
        qwen2.model.rotary_emb = type(qwen2.model.rotary_emb)(config=config)
    return qwen2.to(device=model.device, dtype=model.dtype).eval()

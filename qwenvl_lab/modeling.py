"""Notebook 04 — the language model: QWen (Qwen-VL-Chat's LM) as a transformers model, with both image paths.

Architecture from Qwen-VL's published modeling_qwen.py: RMSNorm,
fused qkv with bias, NeoX RoPE, SwiGLU MLP with w2 as the gate, untied lm_head. Images enter either
the original way (decode the path from the span, run the vision tower, overwrite `hidden[i][a+1:b]`)
or TensorRT-LLM's way (fake ids ≥ vocab_size looked up in a runtime `prompt_table`).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .checks.values import check_int, check_number
from .img_pos import locate_img_pos
from .injection import overwrite_image_spans
from .prompt_table import prompt_tuning_embedding
from .tokenizing import IMAGE_START_ID, decode_image_path
from .vision import Resampler, VisionTransformer, sincos_pos_embed_2d

QWEN_VL_CHAT_VISUAL = dict(
    heads=16,
    image_size=448,
    image_start_id=IMAGE_START_ID,
    layers=48,
    mlp_ratio=4.9231,
    output_dim=4096,
    patch_size=14,
    width=1664,
)
CONFIG_SIZES = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "kv_channels",
    "seq_length",
    "max_position_embeddings",
)
CONFIG_FLAGS = ("use_dynamic_ntk", "use_logn_attn", "no_bias", "tie_word_embeddings")
VISUAL_SIZES = ("heads", "image_size", "layers", "output_dim", "patch_size", "width")


def check_config(config: "QWenVLConfig") -> None:
    """Raise a TypeError (wrong type) or ValueError (wrong value) naming the first config field a model cannot use."""
    for key in CONFIG_SIZES:
        check_int(key, getattr(config, key), 1)
    for key in CONFIG_FLAGS:
        if not isinstance(getattr(config, key), bool):
            raise TypeError(
                f"{key} must be true or false, got {type(getattr(config, key)).__name__} {getattr(config, key)!r}"
            )
    check_number("layer_norm_epsilon", config.layer_norm_epsilon, 0, open_minimum=True)
    check_number("rotary_emb_base", config.rotary_emb_base, 0, open_minimum=True)
    check_number("initializer_range", config.initializer_range, 0)
    check_number("rotary_pct", config.rotary_pct, 0, 1, open_minimum=True)
    rot_dim = int(config.kv_channels * config.rotary_pct)
    if rot_dim < 2 or rot_dim % 2:
        raise ValueError(
            f"kv_channels {config.kv_channels} × rotary_pct {config.rotary_pct} gives {rot_dim} rotary "
            "dims per head; RoPE needs an even number >= 2"
        )
    if config.kv_channels * config.num_attention_heads != config.hidden_size:
        raise ValueError(
            f"kv_channels {config.kv_channels} × heads {config.num_attention_heads} must equal "
            f"hidden_size {config.hidden_size}"
        )
    check_visual(config.visual)
    if config.visual["output_dim"] != config.hidden_size:
        raise ValueError(f"visual output_dim {config.visual['output_dim']} must equal hidden_size {config.hidden_size}")


def check_visual(visual) -> None:
    """Raise a TypeError or ValueError naming the first field of a `visual` config the vision tower cannot use."""
    if not isinstance(visual, dict):
        raise TypeError(f"visual must be a dict of the vision tower's fields, got {type(visual).__name__}")
    missing = sorted(set(QWEN_VL_CHAT_VISUAL) - set(visual))
    if missing:
        raise ValueError(f"visual lacks {missing}; Qwen-VL's visual config holds {sorted(QWEN_VL_CHAT_VISUAL)}")
    for key in VISUAL_SIZES:
        check_int(f"visual.{key}", visual[key], 1)
    check_int("visual.image_start_id", visual["image_start_id"], 0)
    check_number("visual.mlp_ratio", visual["mlp_ratio"], 0, open_minimum=True)
    if visual["width"] % visual["heads"]:
        raise ValueError(f"visual.width {visual['width']} must be a multiple of visual.heads {visual['heads']}")
    if visual["patch_size"] > visual["image_size"]:
        raise ValueError(f"visual.patch_size {visual['patch_size']} exceeds visual.image_size {visual['image_size']}")
    if int(visual["width"] * visual["mlp_ratio"]) < 1:
        raise ValueError(
            f"visual.width × visual.mlp_ratio = {visual['width'] * visual['mlp_ratio']:g} leaves the ViT's MLP no width"
        )
    resampler_heads = max(visual["output_dim"] // 128, 1)
    if visual["output_dim"] % 4 or visual["output_dim"] % resampler_heads:
        raise ValueError(
            f"visual.output_dim {visual['output_dim']} must be a multiple of 4 (2-D sin-cos positions) "
            f"and of the resampler's {resampler_heads} heads (output_dim // 128)"
        )


class QWenVLConfig(PreTrainedConfig):
    """The fields of Qwen-VL-Chat's config.json (defaults = Qwen-VL-Chat), `visual` included."""

    model_type = "qwen"

    def __init__(  # noqa: PLR0913 — transformers' PretrainedConfig takes every key as a keyword
        self,
        vocab_size=151936,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        intermediate_size=22016,
        kv_channels=128,
        rotary_pct=1.0,
        rotary_emb_base=10000,
        seq_length=2048,
        max_position_embeddings=8192,
        layer_norm_epsilon=1e-6,
        use_dynamic_ntk=True,
        use_logn_attn=True,
        no_bias=True,
        initializer_range=0.02,
        visual=None,
        tie_word_embeddings=False,
        **kwargs,
    ):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.intermediate_size, self.kv_channels, self.rotary_pct = intermediate_size, kv_channels, rotary_pct
        self.rotary_emb_base, self.seq_length = rotary_emb_base, seq_length
        self.max_position_embeddings, self.layer_norm_epsilon = max_position_embeddings, layer_norm_epsilon
        self.use_dynamic_ntk, self.use_logn_attn, self.no_bias = use_dynamic_ntk, use_logn_attn, no_bias
        self.initializer_range = initializer_range
        self.visual = (
            dict(QWEN_VL_CHAT_VISUAL if visual is None else visual) if isinstance(visual, dict | None) else visual
        )
        kwargs.setdefault("architectures", ["QWenLMHeadModel"])
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        check_config(self)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, computed in float32, rounded to x's dtype, times weight."""
    norm = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return norm.type_as(x) * weight


class RMSNorm(nn.Module):
    """Root-mean-square norm (`rms_norm`) with a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., H] normalised over H and scaled by the weight."""
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(position_ids: torch.Tensor, dim: int, base: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotary tables for `position_ids` [B, L]: cos, sin [B, 1, L, dim]."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32) / dim)
    freqs = position_ids.float()[..., None] * inv_freq  # [B, L, dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # [B, 1, L, dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the first `cos.shape[-1]` dims of each head."""
    rot, rest = x[..., : cos.shape[-1]], x[..., cos.shape[-1] :]
    x1, x2 = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([-x2, x1], dim=-1) * sin, rest], dim=-1)


class QWenAttention(nn.Module):
    """Causal self-attention with one fused `c_attn` (bias) split as [Q | K | V]."""

    def __init__(self, config: QWenVLConfig, layer_idx: int):
        super().__init__()
        self.layer_idx, self.heads, self.head_dim = layer_idx, config.num_attention_heads, config.kv_channels
        proj = config.kv_channels * config.num_attention_heads
        self.c_attn = nn.Linear(config.hidden_size, 3 * proj)
        self.c_proj = nn.Linear(proj, config.hidden_size, bias=not config.no_bias)

    def forward(self, x, cos, sin, mask, cache):
        """x [B, L, H] attending to itself and the cache's earlier keys under `mask` [B, 1, L, T]: [B, L, H]."""
        b, length, _ = x.shape  # [B, L, H]
        q, k, v = (t.view(b, length, self.heads, self.head_dim).transpose(1, 2) for t in self.c_attn(x).chunk(3, -1))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # [B, heads, L, hd]
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # [B, heads, T, hd]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, heads, L, hd]
        return self.c_proj(out.transpose(1, 2).reshape(b, length, -1))


class QWenMLP(nn.Module):
    """SwiGLU: `c_proj(w1(x) * silu(w2(x)))` — w2 is the gate."""

    def __init__(self, config: QWenVLConfig):
        super().__init__()
        ff = config.intermediate_size // 2
        self.w1 = nn.Linear(config.hidden_size, ff, bias=not config.no_bias)
        self.w2 = nn.Linear(config.hidden_size, ff, bias=not config.no_bias)
        self.c_proj = nn.Linear(ff, config.hidden_size, bias=not config.no_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H] → [B, L, H]."""
        return self.c_proj(self.w1(x) * F.silu(self.w2(x)))


class QWenBlock(nn.Module):
    """Pre-norm decoder block."""

    def __init__(self, config: QWenVLConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.attn = QWenAttention(config, layer_idx)
        self.ln_2 = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.mlp = QWenMLP(config)

    def forward(self, x, cos, sin, mask, cache):
        """The residual stream [B, L, H] after this block's attention and MLP."""
        x = x + self.attn(self.ln_1(x), cos, sin, mask, cache)
        return x + self.mlp(self.ln_2(x))


def attention_bias(attention_mask, query_len: int, past_len: int, dtype, device) -> torch.Tensor:
    """Additive causal + padding mask [B, 1, L, T] (fully masked rows stay finite)."""
    total = past_len + query_len
    q_pos = torch.arange(past_len, total, device=device)[:, None]  # [L, 1]
    allowed = torch.arange(total, device=device)[None, :] <= q_pos  # [L, T]
    allowed = allowed[None, None]  # [1, 1, L, T]
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :total].bool()  # [B, 1, L, T]
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


class QWenPreTrainedModel(PreTrainedModel):
    """Weights init and transformers plumbing shared by the QWen models."""

    config_class = QWenVLConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["QWenBlock", "VisualBlock"]
    _supports_sdpa = True

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, (RMSNorm, nn.LayerNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, VisionTransformer):
            nn.init.normal_(module.positional_embedding, std=module.positional_embedding.shape[1] ** -0.5)
            nn.init.normal_(module.proj, std=module.output_dim**-0.5)
        elif isinstance(module, Resampler):
            nn.init.trunc_normal_(module.query, std=0.02)
            with torch.no_grad():
                module.pos_embed.copy_(
                    sincos_pos_embed_2d(module.pos_embed.shape[1], int(module.pos_embed.shape[0] ** 0.5))
                )


class QWenModel(QWenPreTrainedModel):
    """`transformer`: token embedding, image injection, decoder blocks, final norm, vision tower."""

    def __init__(self, config: QWenVLConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.h = nn.ModuleList(QWenBlock(config, i) for i in range(config.num_hidden_layers))
        self.ln_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon)
        self.visual = VisionTransformer(**config.visual)
        self.post_init()

    def get_input_embeddings(self):
        """The vocabulary embedding `wte` (transformers' accessor)."""
        return self.wte

    def set_input_embeddings(self, value):
        """Replace the vocabulary embedding `wte` (transformers' accessor)."""
        self.wte = value

    def embed(self, input_ids, prompt_table=None, tasks=None, task_vocab_size=None, prefill=True):
        """Token embeddings with images injected by the prompt table or by the original Qwen-VL way."""
        vocab_size = self.config.vocab_size
        if prompt_table is not None:
            if tasks is None:
                tasks = torch.zeros(input_ids.shape[0], dtype=torch.int32, device=input_ids.device)
            if task_vocab_size is None:
                task_vocab_size = prompt_table.shape[0]
            return prompt_tuning_embedding(input_ids, self.wte.weight, prompt_table, tasks, task_vocab_size, vocab_size)
        if (input_ids >= vocab_size).any():
            raise ValueError(
                f"input_ids hold fake prompt ids (>= vocab_size {vocab_size}) but no prompt_table was given; "
                "pass prompt_table, tasks and task_vocab_size (see ptuning_setup)"
            )
        hidden = self.wte(input_ids)  # [B, L, H]
        start_id = self.config.visual["image_start_id"]
        if prefill and (input_ids == start_id).any():
            img_pos = locate_img_pos(input_ids, start_id)  # [N, 3]
            paths = [decode_image_path(input_ids[i, a + 1 : b].tolist()) for i, a, b in img_pos.tolist()]
            input_vit = self.visual.encode(paths)  # [N, 256, H]
            hidden = overwrite_image_spans(hidden, img_pos, input_vit)
        return hidden

    def forward(  # noqa: PLR0913 — transformers' forward signature
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        prompt_table=None,
        tasks=None,
        task_vocab_size=None,
        **kwargs,
    ):
        """The final hidden states [B, L, H] and the cache, from ids (images injected by `embed`) or embeddings."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        past_len = cache.get_seq_length() if cache is not None else 0
        if inputs_embeds is None:
            inputs_embeds = self.embed(input_ids, prompt_table, tasks, task_vocab_size, prefill=past_len == 0)
        b, length, _ = inputs_embeds.shape
        if (self.config.use_dynamic_ntk or self.config.use_logn_attn) and past_len + length > self.config.seq_length:
            raise ValueError(
                f"{past_len + length} tokens exceed seq_length {self.config.seq_length}: dynamic NTK and logn attention, "
                "which Qwen-VL applies past that length, are not implemented here (nor in TensorRT-LLM); shorten the input"
            )
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            if attention_mask is not None:
                position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past_len : past_len + length]
            else:
                position_ids = torch.arange(past_len, past_len + length, device=inputs_embeds.device)[None].expand(
                    b, -1
                )
        rot_dim = int(self.config.kv_channels * self.config.rotary_pct)
        cos, sin = rope_cos_sin(position_ids, rot_dim, self.config.rotary_emb_base, inputs_embeds.dtype)
        mask = attention_bias(attention_mask, length, past_len, inputs_embeds.dtype, inputs_embeds.device)
        x = inputs_embeds
        for block in self.h:
            x = block(x, cos, sin, mask, cache)
        return self.ln_f(x), cache


class QWenLMHeadModel(QWenPreTrainedModel, GenerationMixin):
    """Qwen-VL-Chat: `transformer` + untied `lm_head`; generates with either image path."""

    def __init__(self, config: QWenVLConfig):
        super().__init__(config)
        self.transformer = QWenModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        """The vocabulary embedding (transformers' accessor)."""
        return self.transformer.wte

    def get_output_embeddings(self):
        """The untied `lm_head` (transformers' accessor)."""
        return self.lm_head

    def forward(  # noqa: PLR0913 — transformers' forward signature
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        prompt_table=None,
        tasks=None,
        task_vocab_size=None,
        labels=None,
        logits_to_keep=0,
        **kwargs,
    ):
        """Logits [B, L, V] in float32 (the last `logits_to_keep` positions if set), the cache, and the next-token
        loss when `labels` are given."""
        hidden, cache = self.transformer(
            input_ids,
            attention_mask,
            position_ids,
            cache,
            inputs_embeds,
            use_cache,
            prompt_table,
            tasks,
            task_vocab_size,
        )
        logits = self.lm_head(hidden[:, -logits_to_keep:] if logits_to_keep else hidden).float()  # [B, L, V]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, cache=cache)

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        """Beam search copies each sequence; the prompt table is shared, so it is not copied (tasks are)."""
        shared = {k: model_kwargs.pop(k) for k in ("prompt_table", "task_vocab_size") if k in model_kwargs}
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder, input_ids, **model_kwargs
        )
        return input_ids, {**model_kwargs, **shared}

"""Engine, forward — the language model on one device: its weights, the KV cache, and the packed prefill.

The decode step (one new token per row over the cache) is a back end of its own: see `engine.decode`.
"""

import torch
import torch.nn.functional as F

from ..checks.tensors import WEIGHT_ONLY
from ..files import CheckpointError
from ..limits import BuildConfig
from ..modeling import attention_bias, rms_norm, rope_cos_sin
from .build import check_engine_weights
from .layers import EngineLayer, attention_input, empty_matrix, mlp_output, stack_layer_weights, weight_bytes_per_token


class LanguageModelEngine:
    """The LM on one device: weights in the engine dtype (a weight-only engine's layer matrices in int8, with their
    scales), the layers' stacked [layers, …] with their matrices in `layout` (the decode back end's:
    engine.layers.LAYOUTS), RoPE tables, KV cache [layers, 2, rows, heads, S, hd]."""

    def __init__(self, build_config: BuildConfig, pretrained_config: dict, weights: dict, device, layout: str):
        check_engine_weights(weights, pretrained_config)
        self.weight_only = check_weight_only_weights(build_config, pretrained_config, weights)
        self.dtype, self.device = build_config.torch_dtype, torch.device(device)
        self.weight_bytes_per_token = weight_bytes_per_token(
            {
                name: torch.empty(t.shape, dtype=torch.int8 if t.dtype == torch.int8 else self.dtype, device="meta")
                for name, t in weights.items()
            }
        )
        self.eps = pretrained_config["norm_epsilon"]
        self.heads, self.head_dim = pretrained_config["num_attention_heads"], pretrained_config["head_size"]
        self.vocab_size = pretrained_config["vocab_size"]
        embedding = weights["transformer.vocab_embedding.weight"]
        self.vocab_embedding = embedding.to(device=self.device, dtype=self.dtype)  # [V, H]: rows are looked up
        lm_head = weights["lm_head.weight"]  # [V, H]
        self.lm_head_t = empty_matrix(lm_head.shape[1], lm_head.shape[0], layout, self.dtype, self.device)
        self.lm_head_t.copy_(lm_head.t())  # [H, V]
        self.ln_f = weights["transformer.ln_f.weight"].to(device=self.device, dtype=self.dtype)
        layers = pretrained_config["num_hidden_layers"]
        self.stacks = stack_layer_weights(weights, layers, layout, self.dtype, self.device)  # [layers, …] each
        self.layers = [EngineLayer(self.stacks, i) for i in range(layers)]
        self.max_seq_len = build_config.max_seq_len
        self.rows = build_config.max_batch_size * build_config.max_beam_width
        self.kv_cache = torch.zeros(
            len(self.layers),
            2,
            self.rows,
            self.heads,
            self.max_seq_len,
            self.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.key_pos = torch.arange(self.max_seq_len, device=self.device)
        cos, sin = rope_cos_sin(self.key_pos[None], self.head_dim, pretrained_config["rotary_base"], self.dtype)
        self.cos, self.sin = cos[0, 0], sin[0, 0]  # [S, hd]

    @property
    def stacked_bytes(self) -> int:
        """Bytes the engine's weights take on its device (int8 matrices one byte a number, their scales included)."""
        tensors = [*self.stacks.values(), self.vocab_embedding, self.lm_head_t, self.ln_f]
        return sum(t.numel() * t.element_size() for t in tensors)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary rows of ids [T] (no prompt table): [T, H]."""
        return F.embedding(ids, self.vocab_embedding)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and output layer of the residual stream x [n, H]: logits [n, V] in float32."""
        return (rms_norm(x, self.ln_f, self.eps) @ self.lm_head_t).float()

    def prefill(
        self, embeds: torch.Tensor, lengths: list[int], rows: list[range], starts=None, observe=None
    ) -> torch.Tensor:
        """Run the prompts packed [N, H] (request r has lengths[r] tokens, cached into `rows[r]`): last logits [B, V].

        With `starts`, the first starts[r] tokens of request r are already in its cache rows (reused blocks): embeds
        packs only the lengths[r] - starts[r] tokens after them, run at their positions over the cached keys. `observe(i, x)`,
        when given, sees each layer i's output x [N, H] (a per-stage dump's layers)."""
        starts = [0] * len(lengths) if starts is None else list(starts)
        news = [n - s for n, s in zip(lengths, starts)]  # tokens each request computes
        positions = torch.cat([torch.arange(s, n, device=self.device) for s, n in zip(starts, lengths)])  # [N]
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [N, 1, hd]
        masks = [attention_bias(None, n, s, self.dtype, self.device) for n, s in zip(news, starts)]  # [1, 1, n, s + n]
        offsets = [sum(news[:r]) for r in range(len(news))]
        x = embeds
        for i, (layer, cache) in enumerate(zip(self.layers, self.kv_cache)):
            q, k, v = attention_input(x, layer, self.eps, cos, sin, self.heads)  # [N, heads, hd] each
            outputs = []
            for offset, n, start, slots, mask in zip(offsets, news, starts, rows, masks):
                k_r, v_r = (t[offset : offset + n].transpose(0, 1) for t in (k, v))  # [heads, n, hd]
                cache[0, slots.start : slots.stop, :, start : start + n] = k_r  # every beam row of the request
                cache[1, slots.start : slots.stop, :, start : start + n] = v_r
                if start:  # the reused keys before the new ones: [heads, start + n, hd]
                    k_r, v_r = cache[0, slots.start, :, : start + n], cache[1, slots.start, :, : start + n]
                out = F.scaled_dot_product_attention(
                    q[offset : offset + n].transpose(0, 1)[None], k_r[None], v_r[None], attn_mask=mask
                )  # [1, heads, n, hd]
                outputs.append(out[0].transpose(0, 1).reshape(n, -1))
            x = mlp_output(x, torch.cat(outputs), layer, self.eps)
            if observe is not None:
                observe(i, x)
        last = torch.tensor([o + n - 1 for o, n in zip(offsets, news)], device=self.device)
        return self.logits(x[last])  # [B, V]

    def reorder(self, src_rows: torch.Tensor, kv_len: int) -> None:
        """Beam search: cache row i takes row src_rows[i]'s first kv_len keys and values."""
        n = src_rows.shape[0]
        self.kv_cache[:, :, :n, :, :kv_len] = self.kv_cache[:, :, src_rows, :, :kv_len]


def check_weight_only_weights(build_config: BuildConfig, pretrained_config: dict, weights: dict):
    """The engine's weight-only precision (None or "int8"), once the build config, the checkpoint's quant_algo and
    the dtype of its first qkv matrix agree; a CheckpointError saying to rebuild when they do not."""
    algo = (pretrained_config.get("quantization") or {}).get("quant_algo")
    int8 = weights["transformer.layers.0.attention.qkv.weight"].dtype == torch.int8
    if algo != WEIGHT_ONLY.get(build_config.weight_only) or int8 != (algo is not None):
        raise CheckpointError(
            f"the build config says weight_only={build_config.weight_only!r}, the language model's config "
            f"quant_algo={algo!r}, its weights are {'int8' if int8 else 'floating point'}: they must agree; rebuild "
            "the engine with build_engine(checkpoint_dir, engine_dir, build_config, overwrite=True)"
        )
    return build_config.weight_only

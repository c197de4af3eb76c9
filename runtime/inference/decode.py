"""The `hf` engine's decode step for Llama-style models, without the per-call machinery of a transformers forward.

One decode step of a small model is mostly framework overhead: argument handling, output objects, a cache
that concatenates every layer's keys and values onto a growing tensor, a rotary embedding recomputed for
every call. `LeanDecoder` runs the same arithmetic on the model's own modules (their current parameters, so
weight updates need nothing extra): RMSNorm in float32, rotary positions from a table computed the way the
model computes them, keys and values written into buffers allocated once for the whole generation, scaled
dot-product attention over the filled part. The prompt still goes through the model's own forward; its cache
seeds the buffers. Models it does not know exactly (another architecture, rotary scaling, sliding windows,
adapters wrapped around the projections) keep the transformers forward: `unsupported` says why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Architectures whose decoder layer is pre-norm RMSNorm -> q/k/v projections (optional bias) -> rotary
# embedding -> attention -> o projection, then RMSNorm -> SiLU-gated MLP, with the attention scale
# head_dim ** -0.5 (transformers' LlamaDecoderLayer and Qwen2DecoderLayer).
ARCHITECTURES = ("llama", "qwen2")


def unsupported(model) -> str | None:
    """Why `LeanDecoder` cannot stand in for this model's forward, or None when it can."""
    config = model.config
    if hasattr(model, "peft_config"):
        return "projections wrapped in adapters (LoRA)"
    if config.model_type not in ARCHITECTURES:
        return f"model type {config.model_type!r} (known: {', '.join(ARCHITECTURES)})"
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", None) != "default":
        return "rotary embedding other than the default"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {getattr(config, 'hidden_act', None)!r}"
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or ()
    ):
        return "sliding-window attention"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if inner is None:
        return "no decoder stack at model.model"
    linear = [model.lm_head] + [
        m
        for layer in inner.layers
        for m in (
            layer.self_attn.q_proj,
            layer.self_attn.k_proj,
            layer.self_attn.v_proj,
            layer.self_attn.o_proj,
            layer.mlp.gate_proj,
            layer.mlp.up_proj,
            layer.mlp.down_proj,
        )
    ]
    if any(type(m) is not torch.nn.Linear for m in linear):
        return "projections wrapped in other modules (adapters)"
    return None


class LeanDecoder:
    """Decode steps for a batch whose prompt pass already ran, each row one token at a time.

    The buffers hold `width + steps` positions per row: the (left-padded) prompt columns, then one column per
    generated token, the same column for every row. `valid` marks the columns a row attends to (its prompt's
    real tokens and everything generated); it is None when no prompt is padded.
    """

    def __init__(self, model, cache, mask: torch.Tensor | None, steps: int):
        config = model.config
        inner = model.model
        self.model, self.layers = model, inner.layers
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        batch, _, width, _ = keys[0].shape
        self.width = width
        total = width + steps
        dtype, device = keys[0].dtype, keys[0].device
        self.keys = [
            torch.empty((batch, self.kv_heads, total, self.head_dim), dtype=dtype, device=device) for _ in keys
        ]
        self.values = [torch.empty_like(k) for k in self.keys]
        for buf, src in zip(self.keys + self.values, keys + values):
            buf[:, :, :width] = src
        self.valid = None
        if mask is not None:
            self.valid = torch.ones((batch, total), dtype=torch.bool, device=device)
            self.valid[:, :width] = mask.bool()
        # cos / sin of every position a row can reach, computed as the model's rotary embedding computes them.
        rotary = inner.rotary_emb
        positions = torch.arange(total, device=device, dtype=torch.float32)
        freqs = positions[:, None] * rotary.inv_freq.to(device=device, dtype=torch.float32)[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        self.cos = (angles.cos() * rotary.attention_scaling).to(dtype)
        sin = (angles.sin() * rotary.attention_scaling).to(dtype)
        # rotate_half(x) * sin is roll(x, half) * sin with the first half of sin negated: one op, not three.
        half = self.head_dim // 2
        self.signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` (indices into the current batch)."""
        self.keys = [k[keep] for k in self.keys]
        self.values = [v[keep] for v in self.values]
        if self.valid is not None:
            self.valid = self.valid[keep]

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The model's RMSNorm: x * rsqrt(mean(x^2) + eps) in float32, back in x's dtype, times the weight."""
        return weight * F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps).to(x.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, step: int) -> torch.Tensor:
        """Float32 logits of the next token for each row, after feeding `tokens` at `positions` (per row) into
        column `width + step` of the buffers."""
        rows = tokens.shape[0]
        col = self.width + step
        cos = self.cos[positions].view(rows, 1, 1, self.head_dim)
        sin = self.signed_sin[positions].view(rows, 1, 1, self.head_dim)
        mask = self.valid[:, None, None, : col + 1] if self.valid is not None else None
        x = F.embedding(tokens, self.model.model.embed_tokens.weight)
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = self._norm(x, layer.input_layernorm.weight)
            q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(rows, self.heads, 1, self.head_dim)
            k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(rows, self.kv_heads, 1, self.head_dim)
            v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(rows, self.kv_heads, 1, self.head_dim)
            self.keys[i][:, :, col : col + 1] = self._rotate(k, cos, sin)
            self.values[i][:, :, col : col + 1] = v
            out = F.scaled_dot_product_attention(
                self._rotate(q, cos, sin),
                self.keys[i][:, :, : col + 1],
                self.values[i][:, :, : col + 1],
                attn_mask=mask,
                scale=self.scale,
                enable_gqa=self.kv_heads != self.heads,
            )
            x = x + F.linear(out.reshape(rows, self.heads * self.head_dim), attn.o_proj.weight, attn.o_proj.bias)
            h = self._norm(x, layer.post_attention_layernorm.weight)
            gated = F.silu(F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(
                h, mlp.up_proj.weight, mlp.up_proj.bias
            )
            x = x + F.linear(gated, mlp.down_proj.weight, mlp.down_proj.bias)
        x = self._norm(x, self.model.model.norm.weight)
        return F.linear(x, self.model.lm_head.weight, self.model.lm_head.bias).float()

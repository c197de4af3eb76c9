"""rlc's Megatron-Core modules for Qwen3.5's hybrid decoder, in torch alone (no Triton, no flash-linear-attention):

- `GatedDeltaNet`: the linear-attention token mixer (a causal depthwise convolution over q/k/v, the gated delta
  rule run chunk by chunk, a gated RMS norm per value head), tensor-parallel by key-head groups, with or without
  sequence parallelism;
- `ZeroCenteredRMSNorm`: Qwen3.5's RMS norm whose weight is stored as an offset from one (x̂ · (1 + w)).

Megatron-Core 0.16 ships a GatedDeltaNet too, but it needs flash-linear-attention's kernels at construction.

The fused input projection holds, for each key-head group g (one key head and the r = value heads / key heads value
heads it serves), the rows [q_g, k_g, v_g, z_g, b_g, a_g]; the convolution's channels are [q_g, k_g, v_g] per group.
Splitting by whole groups keeps that layout the same under every tensor-parallel size, so checkpoints reshard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64  # tokens per chunk of the delta rule


class ZeroCenteredRMSNorm(torch.nn.Module):
    """RMS norm with the weight stored as an offset from one, computed in fp32 as Qwen3.5's own."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        # Megatron sums the gradients of replicated norms across tensor ranks only under sequence parallelism
        self.weight.sequence_parallel = bool(getattr(config, "sequence_parallel", False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).type_as(x)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_rule(q, k, v, g, beta, chunk: int = CHUNK) -> torch.Tensor:
    """The gated delta rule over whole rows, chunk by chunk. q, k: [b, h, s, dk] (l2-normed, q scaled), v: [b, h, s,
    dv], g (log decay) and beta: [b, h, s]; fp32. Per token the state S (dk × dv) decays by exp(g), then corrects its
    prediction of v from k by beta; the output reads S with q.

    Within a chunk, with G the running sum of g and S0 the state entering it, every token's correction
    u_i = beta_i (v_i - e^{G_i} S0ᵀk_i - Σ_{j<i} e^{G_i-G_j} (k_i·k_j) u_j) solves a unit lower-triangular system,
    so U = Ũ - W S0 with Ũ, W independent of S0; outputs and the next state follow from U in matrix products."""
    b, h, s, dk = k.shape
    dv = v.shape[-1]
    pad = -s % chunk
    if pad:  # trailing zeros: decay 0, beta 0, so the real tokens' outputs do not change
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    n = (s + pad) // chunk
    q, k, v = (t.reshape(b, h, n, chunk, -1) for t in (q, k, v))
    g, beta = (t.reshape(b, h, n, chunk) for t in (g, beta))
    G = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    strict = lower.clone().fill_diagonal_(False)
    diff = G[..., :, None] - G[..., None, :]
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()  # e^{G_i - G_j}, j <= i
    A = torch.where(strict, beta[..., None] * decay * (k @ k.transpose(-1, -2)), torch.zeros_like(diff))
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    system = eye + A
    rhs = torch.cat([beta[..., None] * v, (beta * G.exp())[..., None] * k], -1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_free, w = solved[..., :dv], solved[..., dv:]
    scores = (q @ k.transpose(-1, -2)) * decay  # zero above the diagonal
    state = q.new_zeros(b, h, dk, dv)
    outs = []
    for c in range(n):
        u = u_free[:, :, c] - w[:, :, c] @ state
        outs.append((q[:, :, c] * G[:, :, c, :, None].exp()) @ state + scores[:, :, c] @ u)
        last = G[:, :, c, -1]
        state = (
            state * last[..., None, None].exp()
            + (k[:, :, c] * (last[..., None] - G[:, :, c]).exp()[..., None]).transpose(-1, -2) @ u
        )
    return torch.stack(outs, 2).reshape(b, h, n * chunk, dv)[:, :, :s]


class GatedDeltaNet(torch.nn.Module):
    """Qwen3.5's linear-attention mixer in a Megatron TransformerLayer's self-attention slot: (output, bias) of
    [s, b, hidden], the rank's key-head groups alone (the output projection sums the ranks)."""

    def __init__(
        self,
        config,
        layer_number: int = 1,
        num_key_heads: int = 1,
        num_value_heads: int = 1,
        key_head_dim: int = 1,
        value_head_dim: int = 1,
        conv_kernel: int = 4,
        **_,
    ):
        super().__init__()
        # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        tp = ps.get_tensor_model_parallel_world_size()
        self.config, self.layer_number = config, layer_number
        self.groups = num_key_heads // tp
        self.r = num_value_heads // num_key_heads
        self.dk, self.dv, self.kernel = key_head_dim, value_head_dim, conv_kernel
        self.eps = config.layernorm_epsilon
        hidden = config.hidden_size
        per_group = 2 * key_head_dim + 2 * self.r * value_head_dim + 2 * self.r
        init = config.init_method
        self.in_proj = tensor_parallel.ColumnParallelLinear(
            hidden, num_key_heads * per_group, config=config, init_method=init, gather_output=False, bias=False
        )
        conv_channels = self.groups * (2 * key_head_dim + self.r * value_head_dim)
        dtype = config.params_dtype
        self.conv1d_weight = torch.nn.Parameter(torch.empty(conv_channels, 1, conv_kernel, dtype=dtype))
        torch.nn.init.normal_(self.conv1d_weight, std=config.init_method_std)
        heads = self.groups * self.r
        self.A_log = torch.nn.Parameter(torch.empty(heads, dtype=dtype).uniform_(0.01, 16).log())
        self.dt_bias = torch.nn.Parameter(torch.ones(heads, dtype=dtype))
        for p in (self.conv1d_weight, self.A_log, self.dt_bias):
            tensor_parallel.set_tensor_model_parallel_attributes(p, True, 0, 1)
        self.out_norm_weight = torch.nn.Parameter(torch.ones(value_head_dim, dtype=dtype))
        self.out_proj = tensor_parallel.RowParallelLinear(
            num_value_heads * value_head_dim,
            hidden,
            config=config,
            init_method=config.output_layer_init_method,
            bias=False,
            input_is_parallel=True,
            skip_bias_add=True,
        )

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **_):
        # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
        from megatron.core import tensor_parallel

        # Under sequence parallelism the input is this rank's slice of the sequence: the column-parallel in_proj
        # gathers the whole rows (the recurrence runs along them) and the row-parallel out_proj scatters them back.
        mixed, _ = self.in_proj(hidden_states)
        s, b, _ = mixed.shape
        if attention_mask is not None:  # padding tokens (keys hidden even from themselves) enter as zeros
            real = ~attention_mask[:, 0].diagonal(dim1=-2, dim2=-1)  # [b, s]
            mixed = mixed * real.t()[..., None].to(mixed.dtype)  # in_proj has no bias: as zeros entering it
        dk, dv, r, n = self.dk, self.dv, self.r, self.groups
        mixed = mixed.view(s, b, n, -1)
        qkv, z, beta, a = mixed.split([2 * dk + r * dv, r * dv, r, r], -1)
        # causal depthwise convolution over the sequence: [b, channels, s]
        x = qkv.reshape(s, b, -1).permute(1, 2, 0)
        x = F.silu(F.conv1d(x, self.conv1d_weight, padding=self.kernel - 1, groups=x.shape[1])[..., :s])
        x = x.permute(0, 2, 1).reshape(b, s, n, -1)
        q, k, v = x.split([dk, dk, r * dv], -1)
        dtype = mixed.dtype
        # [b, heads, s, d] in fp32; each key head serves its r value heads
        q = _l2norm(q.float()).repeat_interleave(r, 2).transpose(1, 2) * dk**-0.5
        k = _l2norm(k.float()).repeat_interleave(r, 2).transpose(1, 2)
        v = v.reshape(b, s, n * r, dv).float().transpose(1, 2)
        beta = beta.reshape(s, b, n * r).float().sigmoid().permute(1, 2, 0)
        g = -self.A_log.float().exp() * F.softplus(a.reshape(s, b, n * r).float() + self.dt_bias)
        out = delta_rule(q, k, v, g.permute(1, 2, 0), beta)  # [b, heads, s, dv]
        out = out.transpose(1, 2)  # [b, s, heads, dv]
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = tensor_parallel.copy_to_tensor_model_parallel_region(self.out_norm_weight)  # gradient summed over TP
        out = weight * out.to(dtype)
        gate = z.reshape(s, b, n * r, dv).transpose(0, 1).float()
        out = (out * F.silu(gate)).to(dtype)
        return self.out_proj(out.reshape(b, s, -1).transpose(0, 1).contiguous())

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        # deferred: Megatron-Core, optional (FSDP jobs lack it); the conversion's tensor functions need torch alone
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint, sharded_state_dict_default

        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)
        split = {"conv1d_weight": 0, "A_log": 0, "dt_bias": 0}
        out = make_sharded_tensors_for_checkpoint(own, prefix, split, sharded_offsets)
        for name, module in self.named_children():
            out.update(sharded_state_dict_default(module, f"{prefix}{name}.", sharded_offsets, metadata))
        return out

"""Fake-INT4 quantization-aware training of MoE experts (`trainer.policy.model.fake_int4_qat`), as SkyRL 0.4 defines it.

An engine that serves a checkpoint's routed experts as group-wise symmetric INT4 (compressed-tensors) computes with
weights the trainer's bf16 masters only approximate. With `enabled`, the trainer's forward uses, in place of each
routed expert's [out, in] weight W, its fake-quantized copy on that grid, and its backward hands the gradient
straight through to W (the straight-through estimator):

    groups  = W's rows cut into runs of `group_size` inputs (the last run zero-padded)
    scale   = amax(|group|), divided by `scale_divisor` in float32 and rounded once to W's dtype
    q       = clamp(round(W / scale), q_min, 7)        in W's dtype (an all-zero group keeps scale 0 and gives 0)
    W_q     = q * scale                                 in W's dtype

`(scale_divisor, q_min)` is the convention of the served checkpoint: (7.5, -8) llm-compressor's round-to-nearest,
(7, -7) Kimi's and Miles'. Only the routed experts are quantized (Megatron's grouped expert linears, or each local
expert's linear_fc1 and linear_fc2 of a SequentialMLP); attention, dense MLPs, shared experts, the head and LoRA
adapters stay as they are. SkyRL runs it under megatron, with LoRA and adapters synced unmerged, so the engine keeps
its INT4 base and takes only the adapters: what the trainer sends is never quantized.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

Q_MAX = 7.0  # the top of the signed INT4 codes under both conventions


class _FakeInt4(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight: torch.Tensor, group_size: int, scale_divisor: float, q_min: float) -> torch.Tensor:
        return fake_int4_values(weight, group_size, scale_divisor, q_min)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None, None  # straight through to the master weight


def fake_int4_values(weight: torch.Tensor, group_size: int, scale_divisor: float, q_min: float) -> torch.Tensor:
    """The fake-quantized values of a 2-D [out, in] weight (no autograd), in its dtype."""
    rows, cols = weight.shape
    groups = -(-cols // group_size)
    padded = weight if groups * group_size == cols else torch.nn.functional.pad(weight, (0, groups * group_size - cols))
    g = padded.reshape(rows, groups, group_size)
    scale = (g.abs().amax(-1, keepdim=True).float() / scale_divisor).to(weight.dtype)
    divisor = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.clamp(torch.round(g / divisor), q_min, Q_MAX)
    return (q * scale).reshape(rows, groups * group_size)[:, :cols].contiguous()


def fake_int4(weight: torch.Tensor, group_size: int, scale_divisor: float, q_min: float) -> torch.Tensor:
    """`weight` fake-quantized, its gradient passed straight through; Megatron's fused gradient accumulation
    (`main_grad`) still finds the master's buffer."""
    out = _FakeInt4.apply(weight, int(group_size), float(scale_divisor), float(q_min))
    if hasattr(weight, "main_grad"):
        out.main_grad = weight.main_grad
    return out


@contextlib.contextmanager
def _weight_swapped(module: torch.nn.Module, value: torch.Tensor):
    """`module.weight` reads `value` for the duration (the Parameter itself stays registered and trains)."""
    original = module._parameters["weight"]
    module._parameters["weight"] = value  # type: ignore[assignment]
    try:
        yield
    finally:
        module._parameters["weight"] = original


def _quantize_forward(module: torch.nn.Module, qat: Any) -> None:
    forward = module.forward

    def quantized(*args, **kwargs):
        with _weight_swapped(module, fake_int4(module.weight, qat.group_size, qat.scale_divisor, qat.q_min)):
            return forward(*args, **kwargs)

    module.forward = quantized  # type: ignore[method-assign]


def _quantize_grouped(module: torch.nn.Module, qat: Any) -> None:
    """Transformer Engine's grouped expert linear: each expert's 2-D weight, as it hands them to its GEMM."""
    weights = module._get_weight_tensors

    def quantized():
        return [
            fake_int4(w, qat.group_size, qat.scale_divisor, qat.q_min)
            if isinstance(w, torch.Tensor) and w.dim() == 2
            else w
            for w in weights()
        ]

    module._get_weight_tensors = quantized


def install(models: list[torch.nn.Module], qat: Any) -> int:
    """Fake-quantize the routed experts' weights of these Megatron model chunks in every forward from now on;
    the number of expert linear layers it applies to. `qat` has the group_size, scale_divisor and q_min of
    `model.fake_int4_qat` (rlc.core.job.FakeInt4Qat). A start-up error (RuntimeError) for a model with experts it cannot quantize (legacy
    GroupedMLP) or none at all."""
    found = 0
    for model in models:
        for module in model.modules():
            kind = type(module).__name__
            if kind == "TEGroupedLinear":
                _quantize_grouped(module, qat)
                found += 1
            elif kind == "SequentialMLP":
                for expert in module.local_experts:
                    for linear in (expert.linear_fc1, expert.linear_fc2):
                        # under LoRA the frozen base weight is what the engines serve on the INT4 grid; the
                        # adapters beside it stay in the compute dtype (they sync unmerged)
                        _quantize_forward(getattr(linear, "base", linear), qat)
                        found += 1
            elif kind == "GroupedMLP":
                raise RuntimeError(
                    "fake_int4_qat: the legacy GroupedMLP experts (moe_grouped_gemm without Transformer Engine) are "
                    "not quantized by rlc; run with Transformer Engine or moe_grouped_gemm: false"
                )
    if not found:
        raise RuntimeError(
            "fake_int4_qat quantizes a mixture-of-experts model's routed experts, and this model has none: set "
            "trainer.policy.model.fake_int4_qat.enabled to false"
        )
    return found

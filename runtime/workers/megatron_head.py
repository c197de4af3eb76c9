"""trainer.fused_lm_head_logprob under Megatron: the last stage hands the loss its hidden states and the head's weight
instead of the head's logits, which are then scored chunk by chunk (`rlc.runtime.algorithms.fused_head`).

While `bypassed` is open, the output layer (a ColumnParallelLinear) returns its input as every tensor rank needs it
for its slice of the vocabulary, with the collectives the layer itself would run on it: gathered over the sequence
under sequence parallelism (its gradient reduce-scattered back), else copied (its gradient summed over the tensor
group, since each rank's gradient comes from its own slice of the vocabulary). The weight it would have used (its
own, or the embedding's when they are tied) is recorded for the loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["HeadInput", "bypassed", "last_stage_model"]


@dataclass(frozen=True)
class HeadInput:
    """The last stage's output under the fused head: hidden states [rows, seq, hidden] and the head's rows of this
    tensor rank [vocab / tp, hidden]."""

    hidden: torch.Tensor
    weight: torch.Tensor

    @property
    def device(self) -> torch.device:
        return self.hidden.device


def last_stage_model(model):
    """The GPTModel inside Megatron's wrappers (DDP, Float16Module) when it holds the output layer, else None."""
    while hasattr(model, "module"):
        model = model.module
    return model if getattr(model, "post_process", False) and hasattr(model, "output_layer") else None


@contextlib.contextmanager
def bypassed(model, seen: dict) -> Iterator[None]:
    """`model`'s output layer returns hidden states [seq, rows, hidden] instead of logits while open; `seen["weight"]`
    is the weight it was handed (None: its own)."""
    # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports the Megatron worker for every job
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    layer = model.output_layer

    def forward(hidden, weight=None, runtime_gather_output=None):
        seen["weight"] = layer.weight if weight is None else weight
        if layer.sequence_parallel:
            hidden = gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=True, group=layer.tp_group
            )
        else:
            hidden = _SumGradient.apply(hidden, layer.tp_group)
        return hidden, None

    layer.forward = forward
    try:
        yield
    finally:
        del layer.forward


class _SumGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over `group`. Megatron's copy_to_tensor_model_parallel_region
    does the same but all-reduces a contiguous copy of a non-contiguous gradient and returns the original (the
    head's input reaches it transposed), so its sum is lost."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.contiguous()
        if dist.get_world_size(ctx.group) > 1:
            dist.all_reduce(grad, group=ctx.group)
        return grad, None

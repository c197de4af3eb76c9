"""Routed experts (routing replay, R3): which experts each mixture-of-experts layer sent every token to.

An engine that captures them returns, with each completion, one row per token it ran the model on: the prompt's
tokens and every generated token but the last (the last is sampled, never fed back). A row is (layers, top_k)
expert ids, the layers being the model's MoE layers in order. The trainer replays them in its own router, so the
policy it trains routes as the policy that sampled did.

The hf engine records them with forward hooks on the routers of a transformers MoE model (Qwen3-MoE, Mixtral:
modules returning (logits, scores, indices)); vLLM returns them itself (`enable_return_routed_experts`). The
training batch lays them out beside its tokens (`runtime/batch.py`: `aligned`, `filler`).
"""

from __future__ import annotations

import torch

# The smallest integer type that holds an expert id: routes are per token and per layer, so they are kept small.
_ID_TYPES = ((2**8, torch.uint8), (2**15, torch.int16), (2**31, torch.int32))


def id_dtype(num_experts: int) -> torch.dtype:
    """The dtype routes over `num_experts` experts are kept in."""
    return next(dtype for bound, dtype in _ID_TYPES if num_experts <= bound)


def routers(model) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order: the modules that choose each token's top-k experts."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]


def num_experts(model) -> int:
    config = model.config
    for name in ("num_experts", "num_local_experts", "n_routed_experts"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    raise ValueError(f"model type {config.model_type!r} names no expert count in its config")


class RouteRecorder:
    """Forward hooks on a model's routers; `take(shape)` gives the last forward's routes as (*shape, layers, k)."""

    def __init__(self, model) -> None:
        found = routers(model)
        if not found:
            raise ValueError(
                f"routed-expert capture: {type(model).__name__} ({model.config.model_type!r}) has no "
                "mixture-of-experts router (modules returning logits, scores and expert indices)"
            )
        self.layers = len(found)
        self.top_k = int(model.config.num_experts_per_tok)
        self.dtype = id_dtype(num_experts(model))
        self._seen: list[torch.Tensor] = []
        self._handles = [r.register_forward_hook(self._record) for r in found]

    def _record(self, module, args, output) -> None:
        indices = output[2] if isinstance(output, tuple) and len(output) == 3 else None
        if indices is None:  # a router that returns its logits only: its top-k is the route
            logits = output[0] if isinstance(output, tuple) else output
            indices = torch.topk(logits, self.top_k, dim=-1).indices
        self._seen.append(indices.detach().to(self.dtype))

    def take(self, *shape: int) -> torch.Tensor:
        """The routes of the forward since the last take, as (*shape, layers, top_k) (shape: the input's)."""
        if len(self._seen) != self.layers:
            raise RuntimeError(f"routed-expert capture saw {len(self._seen)} router calls for {self.layers} layers")
        routes = torch.stack([s.reshape(*shape, self.top_k) for s in self._seen], dim=-2)
        self._seen = []
        return routes

    def clear(self) -> None:
        self._seen = []

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

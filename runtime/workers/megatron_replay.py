"""Routing replay (R3) in the Megatron worker: every MoE layer routes each token to the experts the inference engine
chose for it (`TrainBatch.routed_experts`, `runtime/inference/routes.py`) instead of its own top-k.

Megatron-Core gives each router of a model built with `moe_enable_routing_replay` a `RouterReplay`: in
REPLAY_FORWARD it takes the target indices set on it, in REPLAY_BACKWARD (an activation recompute in the backward
pass) the next ones of a queue that every `set_target_indices` appends to, in the order the forwards ran. So each
micro-batch's routes are set before its forward, the action turns to REPLAY_BACKWARD after it, and the queue is
emptied around every schedule (a forward-only schedule leaves it full).

A router sees the tokens of a [sequence, batch] activation flattened sequence-major, and with sequence parallelism
only its tensor-parallel rank's slice of the sequence; the batch's (rows, positions) routes are laid out the same.
The routes' layer axis counts either the model's MoE layers (the hf engine) or all its layers (vLLM on a model with
dense layers): each router takes the entry of its layer.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from rlc.runtime.batch import filler


def moe_layers(config) -> list[bool]:
    """Whether each of the model's layers is an MoE layer, as Megatron-Core reads `moe_layer_freq`."""
    freq = config.moe_layer_freq
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(config.num_layers)]
    return [bool(x) for x in freq]


class RoutingReplay:
    """The routers of one rank's model chunks, replaying the routes of the micro-batch running."""

    def __init__(self, chunks: list, config):
        self.routers: list[tuple[int, Any]] = []  # (global layer index, Megatron-Core's RouterReplay)
        for chunk in chunks:
            for layer in chunk.decoder.layers:
                router = getattr(getattr(layer, "mlp", None), "router", None)
                replay = getattr(router, "router_replay", None)
                if replay is not None:
                    self.routers.append((layer.layer_number - 1, replay))
        if not self.routers and any(moe_layers(config)):
            raise RuntimeError("moe_enable_routing_replay: Megatron-Core built the MoE routers without replay")
        pattern = moe_layers(config)
        self.num_layers = len(pattern)
        self.moe_index = {layer: n for n, layer in enumerate(i for i, moe in enumerate(pattern) if moe)}
        self.sequence_parallel = bool(getattr(config, "sequence_parallel", False))

    def _entry(self, layer: int, captured: int) -> int:
        """Where layer `layer`'s routes sit on a layer axis of `captured` entries."""
        if captured == len(self.moe_index):
            return self.moe_index[layer]
        if captured == self.num_layers:
            return layer
        raise ValueError(
            f"the batch's routed experts have {captured} layers; the model has {len(self.moe_index)} MoE layers of "
            f"{self.num_layers}: the engine served another model than the trainer trains"
        )

    def forward(self, routes: torch.Tensor, attention_mask: torch.Tensor, tp: int, tp_rank: int, device) -> None:
        """Set a micro-batch's routes, (rows, positions, layers, k) aligned with its input ids, on every router and
        replay them in the forward that follows; padding takes a filler route of distinct experts."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports the worker for every job
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        layers, top_k = routes.shape[-2:]
        pad = filler(layers, top_k, routes.dtype)
        routes = torch.where(attention_mask.bool()[..., None, None], routes, pad)
        tokens = routes.transpose(0, 1)  # Megatron's [sequence, batch] order
        if self.sequence_parallel and tp > 1:
            tokens = tokens.chunk(tp, dim=0)[tp_rank]
        flat = tokens.reshape(-1, layers, top_k).to(device=device, dtype=torch.long)
        for layer, replay in self.routers:
            replay.set_target_indices(flat[:, self._entry(layer, layers)].contiguous())
            replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)

    def after_forward(self) -> None:
        """A recompute in the backward pass takes the routes queued by the forwards, in their order."""
        # deferred: Megatron-Core, optional (FSDP jobs lack it); placement imports the worker for every job
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for _, replay in self.routers:
            replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)

    def clear(self) -> None:
        for _, replay in self.routers:
            replay.clear_indices()
            replay.clear_router_replay_action()

    @contextlib.contextmanager
    def schedule(self):
        """One pipeline schedule: the queue starts empty and is emptied after, whatever happened in between."""
        self.clear()
        try:
            yield
        finally:
            self.clear()

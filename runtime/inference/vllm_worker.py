"""Code that runs inside each vLLM worker process: how new weights get into the engine's model.

`engine_kwargs` names `WeightSyncExtension` as vLLM's `worker_extension_cls`, so vLLM mixes it into its
worker class (GPU or CPU) and `LLM.collective_rpc("rlc_...")` runs these methods on every worker (all TP x PP
ranks). Inside a worker, `self.model_runner.model.load_weights([(hf_name, tensor), ...])` takes
checkpoint names and tensors and does the fusing (q/k/v, gate/up) and tensor-parallel slicing itself,
so every worker receives full tensors: rlc never shards weights for vLLM.

A model's weights are not kept as loaded: after loading, vLLM turns them into its kernels' layout (on a CPU every
linear layer's weight is packed into a oneDNN or SGL matmul handle and the parameter emptied; quantized layers are
quantized). So every update runs inside vLLM's layerwise reload (`initialize_layerwise_reload` ...
`finalize_layerwise_reload`, what vLLM 0.30's own weight-transfer engines do): the layers get their
checkpoint-format parameters back, take the new tensors, and are processed again once each has all of its own.

The worker attributes used here (`model_runner`, `device`, `parallel_config`, `vllm_config`) are vLLM 0.30's
(`vllm/v1/worker/worker_base.py`). Only torch and rlc's weight transports are imported at module level: vLLM
imports this module by name in each worker, and the tests import it without vLLM.
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
from typing import Any

import torch
from rlc.runtime.weights.broadcast import GroupSeat, receive_weights
from rlc.runtime.weights.delta import receiver
from rlc.runtime.weights.ipc import open_bucket
from rlc.runtime.weights.payload import unpack
from rlc.runtime.weights.tensors import WeightMeta
from safetensors.torch import load

WEIGHT_GROUP = "rlc-weight-sync"  # weights.broadcast.init_group's default group name: both sides must agree
# What `rlc_http_call` runs: the methods whose arguments and results are plain JSON.
HTTP_METHODS = (
    "rlc_init_weight_update_group",
    "rlc_receive_weights",
    "rlc_close_weight_update_group",
    "rlc_weight_group",
    "rlc_load_safetensors",
    "rlc_load_delta",
)


class WeightSyncExtension:
    """Weight loading methods mixed into vLLM's worker. Names start with `rlc_` (vLLM refuses an
    extension whose attributes clash with the worker's)."""

    # Set by the vLLM worker this class is mixed into.
    device: Any
    parallel_config: Any
    model_runner: Any
    vllm_config: Any
    _rlc_seat: GroupSeat | None = None  # the weight-update group this worker joined

    def rlc_call(self, request: bytes):
        """Run `rlc_<method>(*args)` from pickled bytes: what crosses into an engine core running in its
        own process, whose msgpack transport keeps neither numpy arrays nor IPC rebuild functions."""
        method, args = pickle.loads(request)
        if not method.startswith("rlc_") or method == "rlc_call":
            raise ValueError(f"{method!r} is not an rlc worker method")
        return getattr(self, method)(*args)

    def rlc_http_call(self, request: str):
        """Run one of `HTTP_METHODS` from a JSON `{"method": ..., "args": [...]}`: what vLLM's own server passes on
        from its `POST /collective_rpc` (VLLM_SERVER_DEV_MODE=1), which carries string arguments only."""
        call = json.loads(request)
        method, args = call.get("method"), call.get("args", [])
        if method not in HTTP_METHODS or not isinstance(args, list):
            raise ValueError(f"{method!r} is not an rlc worker method callable over HTTP")
        return getattr(self, method)(*args)

    def rlc_seed(self, seed: int) -> None:
        """Start the worker's random generators from `seed`: vLLM samples unseeded requests from them, in the order it
        schedules them, so a call made again with its seed samples the same."""
        torch.manual_seed(seed)

    def rlc_load_safetensors(self, data: str) -> int:
        """Load a full state dict sent as base64 safetensors bytes (weights over vLLM's HTTP server)."""
        return self.rlc_load_weights(load(base64.b64decode(data)))

    def rlc_load_delta(self, update: str, settings: str) -> int:
        """Patch the local copy of the served checkpoint to the version the trainer published (`weights.delta`; the
        workers of one engine share the copy, patched once) and load it; returns the tensors loaded."""
        checkpoint = receiver(self.vllm_config.model_config.model, json.loads(settings))
        checkpoint.fetch(json.loads(update))
        self.rlc_start_weight_update()
        count = 0

        def stream():
            nonlocal count
            for name, tensor in checkpoint.tensors():
                count += 1
                yield name, tensor.to(self.device)

        self._rlc_load(stream())
        self.rlc_finish_weight_update()
        return count

    def rlc_weight_group(self) -> dict | None:
        """The weight-update group this worker is in (its master, rank, size, backend), or None."""
        return self._rlc_seat.info if self._rlc_seat is not None else None

    def rlc_load_weights(self, state_dict: dict) -> int:
        """Load a full state dict (tensors, or `weights.payload.pack`ed numpy arrays); returns the tensors loaded."""
        weights = unpack(state_dict)
        self.rlc_start_weight_update()
        # One tensor on the device at a time: the generator is consumed by load_weights.
        self._rlc_load((name, t.to(self.device)) for name, t in weights.items())
        self.rlc_finish_weight_update()
        return len(weights)

    def rlc_start_weight_update(self) -> None:
        """Begin an update: every layer gets its checkpoint-format parameters back (vLLM's layerwise reload)."""
        # deferred: vLLM, optional; imported for every job via inference/vllm.py (placement imports it)
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        _quiet_computed_buffers()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.model)

    def rlc_finish_weight_update(self) -> None:
        """End an update: the layers not processed yet are, and vLLM drops LoRA state built on the old weights."""
        # deferred: vLLM, optional; imported for every job via inference/vllm.py (placement imports it)
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self.model_runner.model, self.model_runner.model_config)
        # vLLM 0.26 (the last release on torch 2.11, what the GPU kit carries) has no LoRA state to reset.
        reset_lora_state = getattr(self.model_runner, "reset_lora_state", None)
        if reset_lora_state is not None:
            reset_lora_state()

    def rlc_init_weight_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        backend: str = "nccl",
        group_name: str = WEIGHT_GROUP,
    ) -> int:
        """Join the broadcast group trainer rank 0 hosts; returns this worker's rank in it.

        Run on every worker while the trainer calls `weights.broadcast.init_group` with rank 0 (each side
        blocks until all have joined). The rank is the one vLLM's own NCCL weight transfer gives a
        worker: rank_offset + data-parallel index x (TP x PP) + rank within the engine.
        """
        pc = self.parallel_config
        rank = rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self._rlc_seat = GroupSeat()
        self._rlc_seat.join(master_address, master_port, rank, world_size, backend, group_name=group_name)
        return rank

    def rlc_receive_weights(self, names: list[str], dtypes: list, shapes: list) -> int:
        """Receive the named tensors that trainer rank 0 broadcasts (`weights.broadcast.send_weights`), in this
        order, and load them module by module; returns the number received.

        Each tensor is allocated with `torch.empty` on this worker's device and filled by the broadcast;
        `weights.broadcast.receive_weights` also checks the sender's closing fingerprint of names and shapes.
        """
        metas = [WeightMeta(n, str(d).removeprefix("torch."), tuple(s)) for n, d, s in zip(names, dtypes, shapes)]
        self.rlc_start_weight_update()
        received = receive_weights(self._rlc_seat.group if self._rlc_seat else None, metas, self.device, self._rlc_load)
        self.rlc_finish_weight_update()
        return received

    def rlc_close_weight_update_group(self) -> None:
        if self._rlc_seat is not None:
            self._rlc_seat.leave()

    def rlc_update_weights_ipc(self, handles_by_gpu_uuid: dict, entries: list) -> int:
        """CUDA ONLY (untested without a GPU). Load one bucket that a trainer rank on this same GPU shares, between
        `rlc_start_weight_update` and `rlc_finish_weight_update`.

        `handles_by_gpu_uuid` maps `gpu_uuid(...)` of each trainer rank's GPU to its `weights.ipc.ipc_handle`
        of a `pack_ipc_bucket` buffer; `entries` are that bucket's `BucketEntry`s (or their dicts). The
        handle is opened with this worker's own device index (the sender's index means another GPU under
        another CUDA_VISIBLE_DEVICES), the buffer sliced into per-parameter views and loaded. Returns after
        the copies finished, so the sender may reuse its buffer once every engine has returned.
        """
        bucket = open_bucket(handles_by_gpu_uuid, entries, self.device.index)
        self._rlc_load(bucket)
        torch.cuda.synchronize(self.device)
        del bucket
        return len(entries)

    def _rlc_load(self, named_tensors) -> None:
        # rlc's trainer holds a multimodal checkpoint's text model alone (language_model_only, or
        # AutoModelForCausalLM's text class); vLLM serves the checkpoint's model, with or without its vision encoder
        if getattr(self.model_runner.model_config, "multimodal_config", None) is not None:
            named_tensors = ((multimodal_checkpoint_name(n), t) for n, t in named_tensors)
        # MTP heads (MiMo's `model.mtp_layers.*`, trained with trainer.mtp) are no part of the policy's model: they
        # go to the drafter (speculative_config method mtp, a model of its own sharing the embedding and the head),
        # or nowhere when nothing drafts.
        heads: list = []

        def trunk():
            for name, tensor in named_tensors:
                if name.startswith("model.mtp_layers."):
                    heads.append((name, tensor))
                else:
                    yield name, tensor

        self.model_runner.model.load_weights(weights=trunk())
        drafter = getattr(getattr(self.model_runner, "drafter", None), "model", None)
        if heads and drafter is not None and hasattr(drafter, "load_weights"):
            drafter.load_weights(heads)


def multimodal_checkpoint_name(name: str) -> str:
    """A text model's weight name (what rlc's trainer holds under language_model_only: `Qwen3_5ForCausalLM`'s
    `model.layers.0...`, `lm_head.weight`) as the multimodal checkpoint vLLM serves names it
    (`model.language_model.layers.0...`): the names its `load_weights` maps, as at start-up."""
    if name.startswith("model.") and not name.startswith(("model.language_model.", "model.visual.")):
        return "model.language_model." + name.removeprefix("model.")
    return name


def _computed_buffer_warning(record) -> bool:
    """False for vLLM's reload warning about a rotary embedding: its cos/sin cache is computed, never in a
    checkpoint, so every update "fails to load" it (and keeps it, which is right)."""
    return not (
        record.msg == "%s: Failed to load weights"
        and isinstance(record.args, tuple)
        and str(record.args[0]).endswith("RotaryEmbedding")
    )


def _quiet_computed_buffers() -> None:
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _computed_buffer_warning not in logger.filters:
        logger.addFilter(_computed_buffer_warning)

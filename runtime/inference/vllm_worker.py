"""Code that runs inside each vLLM worker process: how new weights get into the engine's model.

`engine_kwargs` names `WeightSyncExtension` as vLLM's `worker_extension_cls`, so vLLM mixes it into its
GPU worker class and `LLM.collective_rpc("rlc_...")` runs these methods on every worker (all TP x PP
ranks). Inside a worker, `self.model_runner.model.load_weights([(hf_name, tensor), ...])` takes
checkpoint names and tensors and does the fusing (q/k/v, gate/up) and tensor-parallel slicing itself,
so every worker receives full tensors: rlc never shards weights for vLLM.

The worker attributes used here (`model_runner`, `device`, `parallel_config`) are vLLM 0.30's
(`vllm/v1/worker/worker_base.py`). Only torch is imported at module level: vLLM imports this module
by name in each worker, and the tests import it without vLLM.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

WEIGHT_GROUP = "rlc-weight-sync"  # weight_sync.init_group's default group name: both sides must agree


def gpu_uuid(device_index: int) -> str:
    """CUDA only. The physical GPU behind a local device index, the same in every process whatever its
    CUDA_VISIBLE_DEVICES; a CUDA-IPC sender keys its handles by this."""
    return str(torch.cuda.get_device_properties(device_index).uuid)


class WeightSyncExtension:
    """Weight loading methods mixed into vLLM's worker. Names start with `rlc_` (vLLM refuses an
    extension whose attributes clash with the worker's)."""

    # Set by the vLLM worker this class is mixed into.
    device: Any
    parallel_config: Any
    model_runner: Any

    def rlc_call(self, request: bytes):
        """Run `rlc_<method>(*args)` from pickled bytes: what crosses into an engine core running in its
        own process, whose msgpack transport keeps neither numpy arrays nor IPC rebuild functions."""
        method, args = pickle.loads(request)
        if not method.startswith("rlc_") or method == "rlc_call":
            raise ValueError(f"{method!r} is not an rlc worker method")
        return getattr(self, method)(*args)

    def rlc_load_weights(self, state_dict: dict) -> int:
        """Load a full state dict (tensors, or `transfer.pack`ed numpy arrays); returns the tensors loaded."""
        from rlc.runtime.transfer import unpack

        weights = unpack(state_dict)
        # One tensor on the device at a time: the generator is consumed by load_weights.
        self._rlc_load((name, t.to(self.device)) for name, t in weights.items())
        return len(weights)

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

        Run on every worker while the trainer calls `weight_sync.init_group` with rank 0 (each side
        blocks until all have joined). The rank is the one vLLM's own NCCL weight transfer gives a
        worker: rank_offset + data-parallel index x (TP x PP) + rank within the engine.
        """
        from rlc.runtime.weight_sync import init_group

        pc = self.parallel_config
        rank = rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        self._rlc_group = init_group(
            master_address, master_port, rank, world_size, backend=backend, group_name=group_name
        )
        return rank

    def rlc_receive_weights(self, names: list[str], dtypes: list, shapes: list) -> int:
        """Receive the named tensors that trainer rank 0 broadcasts (`weight_sync.send_weights`), in this
        order, and load them module by module; returns the number received.

        Each tensor is allocated with `torch.empty` on this worker's device and filled by the broadcast;
        `weight_sync.receive_weights` also checks the sender's closing fingerprint of names and shapes.
        """
        from rlc.runtime.weight_sync import WeightMeta, receive_weights

        metas = [WeightMeta(n, str(d).removeprefix("torch."), tuple(s)) for n, d, s in zip(names, dtypes, shapes)]
        return receive_weights(self._rlc_group, metas, self.device, self._rlc_load)

    def rlc_close_weight_update_group(self) -> None:
        from rlc.runtime.weight_sync import close_group

        group = getattr(self, "_rlc_group", None)
        if group is not None:
            close_group(group)
            self._rlc_group = None

    def rlc_update_weights_ipc(self, handles_by_gpu_uuid: dict, entries: list) -> int:
        """CUDA ONLY (untested without a GPU). Load one bucket that a trainer rank on this same GPU shares.

        `handles_by_gpu_uuid` maps `gpu_uuid(...)` of each trainer rank's GPU to its `weight_sync.ipc_handle`
        of a `pack_ipc_bucket` buffer; `entries` are that bucket's `BucketEntry`s (or their dicts). The
        handle is opened with this worker's own device index (the sender's index means another GPU under
        another CUDA_VISIBLE_DEVICES), the buffer sliced into per-parameter views and loaded. Returns after
        the copies finished, so the sender may reuse its buffer once every engine has returned.
        """
        from rlc.runtime.weight_sync import BucketEntry, open_ipc_handle, unpack_bucket

        mine = gpu_uuid(self.device.index)
        if mine not in handles_by_gpu_uuid:
            raise RuntimeError(
                f"no weight bucket for this worker's GPU {mine}; the trainer shared {sorted(handles_by_gpu_uuid)}"
            )
        buffer = open_ipc_handle(handles_by_gpu_uuid[mine], self.device.index)
        entries = [e if isinstance(e, BucketEntry) else BucketEntry(**e) for e in entries]
        self._rlc_load(unpack_bucket(buffer, entries))
        torch.cuda.synchronize(self.device)
        del buffer
        return len(entries)

    def _rlc_load(self, named_tensors) -> None:
        # Unquantized models only: a quantized engine would also need process_weights_after_loading.
        self.model_runner.model.load_weights(weights=named_tensors)

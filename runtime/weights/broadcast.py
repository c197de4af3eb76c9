"""The broadcast transport (weight_sync_backend gloo / nccl): trainer rank 0 and every engine worker form a process
group of their own (`init_group`); rank 0 streams the unsharded weights in buckets (`iter_full_params` ->
`send_weights`) and each engine worker allocates, receives and loads them chunk by chunk (`receive_weights`).

The sending half runs on the policy ranks; the receiving half is `GroupSeat`, the one place an engine keeps the
group it is in (and refuses or leaves another), plus `receive_weights` in the process that holds the model.
"""

from __future__ import annotations

import datetime
import math
import zlib
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from rlc.runtime.weights.tensors import (
    DEFAULT_CHUNK_BYTES,
    NamedTensors,
    WeightMeta,
    chunk_by_module,
    dtype_name,
    nbytes,
)

# A broadcast per tensor costs a round trip each (hundreds of them for a real model, most of them small norms and
# biases). Buckets of a few MiB gather the small tensors; a larger tensor goes alone, uncopied, so the receiver
# loads one while the next is on its way (measured over gloo on 2 cores: the 25M-parameter model in 67 ms with
# 1-4 MiB buckets, 71-150 ms tensor by tensor and 175 ms in 64 MiB buckets; the 0.08M one in 6 ms, against 40).
BROADCAST_BUCKET_BYTES = 4 << 20


# -- the broadcast group -------------------------------------------------------------------------------


class WeightGroupExists(RuntimeError):
    """An engine is already in a weight-update group and was not asked to leave it."""


def init_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    backend: str = "nccl",
    group_name: str = "rlc-weight-sync",
    timeout_s: float = 600.0,
) -> dist.ProcessGroup:
    """A process group of trainer rank 0 (rank 0 here, hosting the store) and every engine worker.

    It does not use or touch the default process group (`torch.distributed.init_process_group`), so
    processes in different default groups, or in none, can form it. Every member calls this with the same
    address, port, size and backend; the call returns once all have joined, or raises after `timeout_s`,
    which also bounds every later collective. The group is not registered with torch.distributed's global
    state: use it through `broadcast_tensor` / `send_weights` / `receive_weights` (its own methods), not
    through `torch.distributed.broadcast(group=...)`. For "nccl", set each process's CUDA device first.
    """
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of {world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    # The rendezvous init_process_group does, minus the global registry: one TCP store hosted by rank 0, a
    # prefix per group so one store could serve several, and a prefix per device as torch's backends use.
    store = dist.TCPStore(
        master_address, master_port, world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    group_store = dist.PrefixStore(f"{group_name}/", store)
    group = dist.ProcessGroup(group_store, rank, world_size)
    if backend == "gloo":
        device, kind = torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO
        impl = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", group_store), rank, world_size, timeout)
    else:
        if not dist.is_nccl_available():
            raise RuntimeError("this torch build has no NCCL; use backend='gloo'")
        device, kind = torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        options.group_name = group_name
        impl = dist.ProcessGroupNCCL(dist.PrefixStore("cuda/", group_store), rank, world_size, options)
    impl._set_sequence_number_for_group()
    group._set_default_backend(kind)
    group._register_backend(device, kind, impl)
    group._set_group_name(group_name)
    return group


def close_group(group: dist.ProcessGroup) -> None:
    """Release the group's connections (NCCL communicators, gloo pairs); the group is unusable after."""
    group.shutdown()


def group_device(group: dist.ProcessGroup) -> torch.device:
    """Where the group's tensors must live: the current CUDA device for NCCL, the CPU for gloo."""
    if group._get_backend_name() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_tensor(tensor: torch.Tensor, group: dist.ProcessGroup, src: int = 0) -> torch.Tensor:
    """Broadcast a contiguous tensor in place from group rank `src`; returns it.

    With gloo this returns when the transfer is done; with NCCL when it is queued on the current stream,
    which later work on that stream is ordered after.
    """
    group.broadcast(tensor, src).wait()
    return tensor


def _fingerprint(metas: list[WeightMeta], device: torch.device) -> torch.Tensor:
    text = "\n".join(f"{m.name}|{m.dtype}|{m.shape}" for m in metas)
    return torch.tensor([len(metas), zlib.crc32(text.encode())], dtype=torch.int64, device=device)


def _fits(open_dtype: torch.dtype | None, open_bytes: int, dtype: torch.dtype, nbytes: int, limit: int) -> bool:
    """Whether a tensor joins the open broadcast bucket (`open_dtype` None: none is open).

    A bucket holds consecutive tensors of one dtype up to `limit` bytes; sender and receivers apply this
    same rule, the sender to the tensors as they come and the receivers to the metas, so they cut the
    stream at the same places.
    """
    return open_dtype == dtype and open_bytes + nbytes <= limit


def send_weights(
    group: dist.ProcessGroup, named_tensors: NamedTensors, src: int = 0, bucket_bytes: int = BROADCAST_BUCKET_BYTES
) -> list[WeightMeta]:
    """Broadcast the tensors in order from this rank (`src`), consecutive ones of a dtype flattened into
    one buffer of at most `bucket_bytes` (one collective per bucket, not per tensor); returns the metas of
    what was sent.

    The receivers must call `receive_weights` with the same metas in the same order and the same
    `bucket_bytes`. A last, small broadcast carries a fingerprint of the sent metas, so a receiver that
    expected different weights raises instead of keeping them silently.
    """
    device = group_device(group)
    sent: list[WeightMeta] = []
    pending: list[torch.Tensor] = []

    def flush() -> None:
        if pending:
            flat = pending[0].reshape(-1) if len(pending) == 1 else torch.cat([t.reshape(-1) for t in pending])
            broadcast_tensor(flat.contiguous(), group, src)
            pending.clear()

    open_bytes = 0
    for name, tensor in named_tensors:
        if device.type == "cuda":
            tensor = tensor.to(device)
        if not _fits(pending[0].dtype if pending else None, open_bytes, tensor.dtype, nbytes(tensor), bucket_bytes):
            flush()
            open_bytes = 0
        pending.append(tensor)
        open_bytes += nbytes(tensor)
        sent.append(WeightMeta(name, dtype_name(tensor.dtype), tuple(tensor.shape)))
    flush()
    broadcast_tensor(_fingerprint(sent, device), group, src)
    return sent


def receive_weights(
    group: dist.ProcessGroup,
    metas: list[WeightMeta],
    device: str | torch.device,
    load_fn: Callable[[list[tuple[str, torch.Tensor]]], object],
    src: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    bucket_bytes: int = BROADCAST_BUCKET_BYTES,
) -> int:
    """Receive the tensors `metas` describe (in `send_weights`'s buckets) into fresh tensors on `device`,
    handing them to `load_fn` in whole-module chunks of about `chunk_bytes`; returns the number received.

    Raises if the sender's fingerprint disagrees with `metas` (names, dtypes or shapes differ).
    """

    def buckets() -> Iterator[list[WeightMeta]]:
        bucket: list[WeightMeta] = []
        open_bytes = 0
        for meta in metas:
            if not _fits(
                bucket[0].torch_dtype if bucket else None, open_bytes, meta.torch_dtype, meta.nbytes, bucket_bytes
            ):
                if bucket:
                    yield bucket
                bucket, open_bytes = [], 0
            bucket.append(meta)
            open_bytes += meta.nbytes
        if bucket:
            yield bucket

    def arrivals() -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in buckets():
            sizes = [math.prod(m.shape) for m in bucket]
            flat = broadcast_tensor(torch.empty(sum(sizes), dtype=bucket[0].torch_dtype, device=device), group, src)
            for meta, part in zip(bucket, flat.split(sizes)):
                yield meta.name, part.view(meta.shape)

    for chunk in chunk_by_module(arrivals(), chunk_bytes):
        load_fn(chunk)
    on = group_device(group)
    theirs = broadcast_tensor(torch.empty(2, dtype=torch.int64, device=on), group, src)
    if not torch.equal(theirs, _fingerprint(list(metas), on)):
        raise RuntimeError(
            f"weight sync disagreement: the sender sent {int(theirs[0])} tensors that do not match "
            f"the {len(metas)} expected here (names, dtypes or shapes differ)"
        )
    return len(metas)


# -- the receiving half: an engine's seat in the group -----------------------------------------------------


class GroupSeat:
    """Where an engine (or one of its workers) sits in a weight-update group: the group it joined, when it holds it
    in this process, and what the group is (master, rank, size, backend) for whoever asks to replace it.

    The one rule for joining while still in another group (a run whose trainer is gone): leave it when asked to
    override it, else refuse with `WeightGroupExists`.
    """

    def __init__(self, info: dict | None = None):
        self.group: dist.ProcessGroup | None = None
        self.info = info

    def vacate(self, override_existing: bool, leave: Callable[[], object]) -> None:
        """Make room for a new group: nothing to do when in none; `leave()` with `override_existing`; else refuse."""
        if self.info is None:
            return
        if not override_existing:
            i = self.info
            raise WeightGroupExists(
                f"this engine is already in a weight-update group whose master is {i['master_address']}:"
                f"{i['master_port']} (rank {i['rank']} of {i['world_size']}, {i['backend']})"
            )
        leave()

    def record(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str) -> None:
        """Note the group joined (by this process, or by the workers it drives)."""
        self.info = {
            "master_address": master_address,
            "master_port": master_port,
            "rank": rank,
            "world_size": world_size,
            "backend": backend,
        }

    def join(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        group_name: str = "rlc-weight-sync",
    ) -> dist.ProcessGroup:
        """Join the group in this process (`init_group`, with trainer rank 0 joining meanwhile) and note it."""
        self.group = init_group(master_address, master_port, rank, world_size, backend, group_name=group_name)
        self.record(master_address, master_port, rank, world_size, backend)
        return self.group

    def leave(self) -> None:
        """Leave the group, closing it when this process holds it."""
        group, self.group, self.info = self.group, None, None
        if group is not None:
            close_group(group)

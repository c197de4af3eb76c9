"""Weight sync from the trainer to the inference engines: stream full weights, chunk them, send them.

Two paths. Broadcast: trainer rank 0 and every engine worker form a
process group of their own (`init_group`), rank 0 streams the unsharded weights one tensor at a time
(`iter_full_params` → `send_weights`) and each engine allocates, receives and loads them chunk by chunk
(`receive_weights`). CUDA IPC (trainer and engine on one GPU, where NCCL cannot pair them): every
trainer rank packs a chunk into one buffer on its GPU (`ipc_buckets`), shares it (`ipc_handle`), and
the engine on that GPU opens it and takes views (`open_ipc_handle`, `unpack_bucket`). Chunks hold
whole modules (`chunk_by_module`), because engine loaders fuse q/k/v and gate/up projections and need
all of a module's tensors at once.
"""

from __future__ import annotations

import datetime
import inspect
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

NamedTensors = Iterable[tuple[str, torch.Tensor]]

DEFAULT_CHUNK_BYTES = 1 << 30  # weight_transfer_threshold_cuda_ipc_GB's default of 1
# A broadcast per tensor costs a round trip each (hundreds of them for a real model, most of them small norms and
# biases). Buckets of a few MiB gather the small tensors; a larger tensor goes alone, uncopied, so the receiver
# loads one while the next is on its way (measured over gloo on 2 cores: the 25M-parameter model in 67 ms with
# 1-4 MiB buckets, 71-150 ms tensor by tensor and 175 ms in 64 MiB buckets; the 0.08M one in 6 ms, against 40).
BROADCAST_BUCKET_BYTES = 4 << 20
IPC_ALIGNMENT = 256  # bytes; CUDA's allocation granularity for the start of each tensor in a bucket


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16": a plain string that crosses process boundaries and JSON."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass(frozen=True)
class WeightMeta:
    """What a receiver needs to allocate one tensor before it arrives."""

    name: str
    dtype: str  # dtype_name(...), e.g. "bfloat16"
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))  # lists after JSON, torch.Size

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.torch_dtype.itemsize


def metas_of(named_tensors: NamedTensors, dtype: torch.dtype | None = None) -> list[WeightMeta]:
    """The metas of `named_tensors`, with floating tensors taken as `dtype` when given.

    On a sharded model, `metas_of(model.state_dict().items(), dtype)` gives, without any gather, the metas
    of what `iter_full_params(model, dtype)` will yield: a DTensor's shape is its full shape.
    """
    out = []
    for name, t in named_tensors:
        dt = dtype if dtype is not None and t.is_floating_point() else t.dtype
        out.append(WeightMeta(name, dtype_name(dt), tuple(t.shape)))
    return out


# -- streaming full weights out of FSDP2 shards --------------------------------------------------------


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@torch.no_grad()
def iter_full_params(
    model: torch.nn.Module,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    rank0_only: bool = True,
) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(name, full tensor) for each `model.state_dict()` entry, in that order, gathered one at a time.

    Each DTensor entry is all-gathered (`full_tensor()`), a collective: every rank of the model's mesh must
    run the whole iteration together. Floating tensors are cast to `dtype` and moved to `device`. With
    `rank0_only` (default), ranks other than 0 get `(name, None)` and drop each gathered tensor at once;
    otherwise every rank gets the values (the CUDA IPC path, where each rank feeds its own GPU's engine).
    Only one full tensor exists at a time. A yielded tensor may share storage with the model (a
    non-sharded entry already on `device` in `dtype`): clone it to keep it past an optimizer step.
    """
    keep = not rank0_only or _rank() == 0
    for name, value in model.state_dict().items():
        if isinstance(value, DTensor):
            if value.device.type != value.device_mesh.device_type:
                value = value.to(value.device_mesh.device_type)  # CPU-offloaded shards gather on the mesh's device
            value = value.full_tensor()
        if not keep:
            yield name, None
            continue
        value = value.detach().to(device)
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        yield name, value


# -- chunking ------------------------------------------------------------------------------------------


def _modules(named_tensors: NamedTensors) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Runs of consecutive items whose names share the prefix before the last dot."""
    run: list[tuple[str, torch.Tensor]] = []
    prefix = None
    for name, tensor in named_tensors:
        here = name.rpartition(".")[0]
        if run and here != prefix:
            yield run
            run = []
        run.append((name, tensor))
        prefix = here
    if run:
        yield run


def _packed_end(end: int, tensor: torch.Tensor, alignment: int | None) -> tuple[int, int]:
    """Where `tensor` starts and ends when appended at byte `end` of a bucket (`pack_ipc_bucket`'s layout)."""
    if alignment is not None:
        step = math.lcm(alignment, tensor.element_size())
        end = -(-end // step) * step
    return end, end + _nbytes(tensor)


def chunk_by_module(
    named_tensors: NamedTensors, threshold_bytes: int, alignment: int | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive items in lists of at most `threshold_bytes`, never splitting a module's tensors.

    A module is a run of consecutive names with the same prefix before the last dot. A module larger than
    the threshold gets a chunk of its own. With `alignment`, a chunk's size is that of its
    `pack_ipc_bucket(..., alignment=alignment)` buffer, padding included. Lazy: it holds at most one chunk
    plus one module.
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
    if alignment is not None and alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")

    def grown(start: int, module: list[tuple[str, torch.Tensor]]) -> int:
        for _, tensor in module:
            start = _packed_end(start, tensor, alignment)[1]
        return start

    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for module in _modules(named_tensors):
        size = grown(size, module)
        if chunk and size > threshold_bytes:
            yield chunk
            chunk, size = [], grown(0, module)
        chunk.extend(module)
    if chunk:
        yield chunk


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


def _group_device(group: dist.ProcessGroup) -> torch.device:
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
    device = _group_device(group)
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
        if not _fits(pending[0].dtype if pending else None, open_bytes, tensor.dtype, _nbytes(tensor), bucket_bytes):
            flush()
            open_bytes = 0
        pending.append(tensor)
        open_bytes += _nbytes(tensor)
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
    group_device = _group_device(group)
    theirs = broadcast_tensor(torch.empty(2, dtype=torch.int64, device=group_device), group, src)
    if not torch.equal(theirs, _fingerprint(list(metas), group_device)):
        raise RuntimeError(
            f"weight sync disagreement: the sender sent {int(theirs[0])} tensors that do not match "
            f"the {len(metas)} expected here (names, dtypes or shapes differ)"
        )
    return len(metas)


# -- buckets for CUDA IPC ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketEntry:
    """Where one tensor lies in a packed bucket: bytes [offset, offset + nbytes)."""

    name: str
    dtype: str  # dtype_name(...)
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))


def _allocate_shareable(nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer; on CUDA, from a non-expandable segment.

    CUDA ONLY part: CUDA IPC handles are made for classic cudaMalloc segments, so the allocator's
    expandable segments are switched off for this one allocation when the process enabled them.
    """
    if device.type != "cuda":
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    expandable = "expandable_segments:True" in torch._C._accelerator_getAllocatorSettings().replace(" ", "")
    if expandable:
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    try:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    finally:
        if expandable:
            torch._C._accelerator_setAllocatorSettings("expandable_segments:True")


def _view(buffer: torch.Tensor, entry: BucketEntry) -> torch.Tensor:
    return buffer[entry.offset : entry.offset + entry.nbytes].view(dtype_from_name(entry.dtype)).view(entry.shape)


def pack_ipc_bucket(
    named_tensors: NamedTensors, device: str | torch.device, alignment: int = IPC_ALIGNMENT
) -> tuple[torch.Tensor, list[BucketEntry]]:
    """Copy the tensors into one contiguous uint8 buffer on `device`, each starting at a multiple of
    `alignment` (and of its element size); returns the buffer and where each tensor lies in it.

    Meant for one `chunk_by_module` chunk. Works on any device; on CUDA the buffer can be shared with
    `ipc_handle`.
    """
    if alignment <= 0:
        raise ValueError(f"alignment must be positive, got {alignment}")
    items = list(named_tensors)
    entries, end = [], 0
    for name, tensor in items:
        offset, end = _packed_end(end, tensor, alignment)
        entries.append(BucketEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, _nbytes(tensor)))
    buffer = _allocate_shareable(end, torch.device(device))
    with torch.no_grad():
        for (_, tensor), entry in zip(items, entries):
            _view(buffer, entry).copy_(tensor)
    return buffer, entries


def ipc_buckets(
    named_tensors: NamedTensors, threshold_bytes: int, device: str | torch.device, alignment: int = IPC_ALIGNMENT
) -> Iterator[tuple[torch.Tensor, list[BucketEntry]]]:
    """`pack_ipc_bucket` of each `chunk_by_module` chunk: buffers of at most `threshold_bytes` (padding
    included), except a module larger than that, which gets a buffer of its own.

    Lazy, and holding nothing it yielded: once the caller drops a bucket, its buffer is freed before the
    next is gathered and packed. A chunk's tensors are freed once packed, so while the caller holds a
    bucket only its buffer, the stream's next module and the tensor after it are alive.
    """

    def packed(chunk: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[BucketEntry]]:
        bucket = pack_ipc_bucket(chunk, device, alignment)
        chunk.clear()  # the suspended chunk_by_module still holds this list
        return bucket

    for chunk in chunk_by_module(named_tensors, threshold_bytes, alignment):
        yield packed(chunk)


def unpack_bucket(buffer: torch.Tensor, entries: list[BucketEntry]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into a packed buffer. Views, not copies: load them before the sender reuses it."""
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"a bucket is a 1-D uint8 tensor, got {buffer.dtype} of shape {tuple(buffer.shape)}")
    out = []
    for entry in entries:
        if entry.offset < 0 or entry.offset + entry.nbytes > buffer.numel():
            raise ValueError(f"{entry.name} lies outside the {buffer.numel()}-byte bucket")
        if entry.nbytes != math.prod(entry.shape) * dtype_from_name(entry.dtype).itemsize:
            raise ValueError(f"{entry.name}: {entry.nbytes} bytes do not hold {entry.dtype}{list(entry.shape)}")
        out.append((entry.name, _view(buffer, entry)))
    return out


# CUDA ONLY: sharing a bucket between two processes on one GPU. The sender keeps the buffer alive (and
# unmodified) until the receiver reports it has loaded the bucket, then may call torch.cuda.ipc_collect().


def ipc_handle(buffer: torch.Tensor) -> tuple:
    """CUDA only. A picklable handle to `buffer` that another process on the same GPU opens."""
    if buffer.device.type != "cuda":
        raise ValueError(f"CUDA IPC shares CUDA tensors, got one on {buffer.device}")
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(buffer)


def open_ipc_handle(handle: tuple, device_index: int | None = None) -> torch.Tensor:
    """CUDA only. The tensor behind an `ipc_handle`, opened on local device `device_index` (default: current).

    The index recorded in the handle is the sender's, which differs from ours when each process sees its
    own CUDA_VISIBLE_DEVICES; the caller makes sure both indices name the same physical GPU.
    """
    rebuild, args = handle
    slot = list(inspect.signature(rebuild).parameters).index("storage_device")
    args = list(args)
    args[slot] = torch.cuda.current_device() if device_index is None else device_index
    return rebuild(*args)

"""The CUDA IPC transport (trainer and engine on one GPU, where NCCL cannot pair them): every trainer rank packs a
chunk of whole modules into one buffer on its GPU (`ipc_buckets`), shares it (`ipc_handle`) keyed by its GPU's
`gpu_uuid`, and the engine on that GPU opens it (`open_ipc_handle`) and takes views (`unpack_bucket`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from rlc.runtime.weights.tensors import NamedTensors, chunk_by_module, dtype_from_name, dtype_name, nbytes, packed_end
from torch.multiprocessing.reductions import reduce_tensor

IPC_ALIGNMENT = 256  # bytes; CUDA's allocation granularity for the start of each tensor in a bucket


def gpu_uuid(device_index: int) -> str:
    """CUDA only. The physical GPU behind a local device index, the same in every process whatever its
    CUDA_VISIBLE_DEVICES; a CUDA-IPC sender keys its handles by this."""
    return str(torch.cuda.get_device_properties(device_index).uuid)


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
        offset, end = packed_end(end, tensor, alignment)
        entries.append(BucketEntry(name, dtype_name(tensor.dtype), tuple(tensor.shape), offset, nbytes(tensor)))
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


def open_bucket(handles_by_gpu_uuid: dict, entries: list, device_index: int) -> list[tuple[str, torch.Tensor]]:
    """CUDA only. The receiving half: the (name, tensor) views of the bucket that the trainer rank on this GPU (local
    index `device_index`) shares; `entries` are that bucket's `BucketEntry`s or their dicts. Views, not copies: load
    them, then synchronize, before returning to the sender."""
    mine = gpu_uuid(device_index)
    if mine not in handles_by_gpu_uuid:
        raise RuntimeError(f"no weight bucket for this GPU {mine}; the trainer shared {sorted(handles_by_gpu_uuid)}")
    buffer = open_ipc_handle(handles_by_gpu_uuid[mine], device_index)
    return unpack_bucket(buffer, [e if isinstance(e, BucketEntry) else BucketEntry(**e) for e in entries])

"""Weights as named tensors, whatever carries them: their metas, full tensors streamed out of FSDP2 shards, and
chunks of whole modules (engine loaders fuse q/k/v and gate/up projections and need all of a module's tensors at
once). Every transport (`broadcast`, `ipc`, `payload`) builds on these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

NamedTensors = Iterable[tuple[str, torch.Tensor]]

DEFAULT_CHUNK_BYTES = 1 << 30  # weight_transfer_threshold_cuda_ipc_GB's default of 1


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.bfloat16` -> "bfloat16": a plain string that crosses process boundaries and JSON."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def nbytes(tensor: torch.Tensor) -> int:
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


def packed_end(end: int, tensor: torch.Tensor, alignment: int | None) -> tuple[int, int]:
    """Where `tensor` starts and ends when appended at byte `end` of a bucket (`pack_ipc_bucket`'s layout)."""
    if alignment is not None:
        step = math.lcm(alignment, tensor.element_size())
        end = -(-end // step) * step
    return end, end + nbytes(tensor)


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
            start = packed_end(start, tensor, alignment)[1]
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

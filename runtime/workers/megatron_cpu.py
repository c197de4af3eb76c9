"""Megatron-Core on a CPU: what lets the `megatron` strategy run (slowly) where there is no GPU.

Megatron-Core is written for CUDA only. Its model, DDP, optimizer and schedules are plain PyTorch and
compute correctly on the CPU, but they name the device in a few fixed ways: `device="cuda"` or
`torch.cuda.current_device()` when they allocate, `.cuda()` on a tensor, the CUDA RNG state for the
tensor-parallel RNG tracker, and `tensor.type() == "torch.cuda.FloatTensor"` asserts in gradient
clipping. `enable()` redirects exactly those to the CPU for this process:

- a torch function mode maps any CUDA device argument (`device=` or the target of `.to`) to the CPU,
  makes `.cuda()` and `.pin_memory()` return the tensor (and `pin_memory=True` false) and reports CPU
  tensor types under their CUDA names;
- `torch.cuda.current_device`, the CUDA RNG getters/setters and seeding, `synchronize` and
  `empty_cache` act on the CPU (the CPU generator plays the CUDA generator: dropout on CPU tensors
  draws from it);
- Megatron's RNG tracker saves and restores that generator's state;
- the CUDA streams and events Megatron's MoE token dispatchers order their device-to-host copies with become one
  CPU stand-in stream whose waits and events do nothing (the CPU runs in program order), and the split sizes
  those copies turn into host arrays become them on the CPU too.

Everything else, Megatron computes as it would on a GPU, with gloo for its collectives. It is meant for
checking a Megatron job on a laptop or in CI on a tiny model; `enable()` is called by the Megatron worker
only when the run has no GPU. Nothing changes when CUDA is available: `enable()` refuses then.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_enabled = False
_mode: _CpuDevices | None = None
_depth = threading.local()


class _Event:
    """A CUDA event on the CPU: recorded work is already done. A class, as torch.cuda.Event is: code imported later
    uses it in type annotations (transformers' `torch.cuda.Stream | None`)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def record(self, stream=None) -> None:
        pass


class _Stream:
    """The one CPU "stream": work runs in program order, so waiting and recording are no-ops. Constructing it gives
    that one stream."""

    _one: _Stream | None = None

    def __new__(cls, *args, **kwargs):
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self) -> None:
        pass


def _host_copy(tensor, as_numpy: bool = False, record_stream: bool = False):
    """Megatron's device-to-host copy of the MoE dispatchers' split sizes, for tensors already on the host: they
    still become numpy arrays where asked (the all-to-all takes its split sizes as a sequence of ints)."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


def _cpu_device(device):
    if isinstance(device, str) and device.startswith("cuda"):
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    if isinstance(device, int) and not isinstance(device, bool):  # a bare index names a CUDA device
        return _CPU
    return device


class _CpuDevices(TorchFunctionMode):
    """CUDA device arguments become the CPU; `.cuda()` is the identity; `.type()` answers with CUDA names."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _cpu_device(kwargs["device"])}
        if kwargs.get("pin_memory"):  # pinning needs an accelerator
            kwargs = {**kwargs, "pin_memory": False}
        name = getattr(func, "__name__", "")
        if name in ("cuda", "pin_memory") and args and torch.is_tensor(args[0]):
            return args[0]
        if name == "type" and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if (
            name == "to"
            and len(args) > 1
            and isinstance(args[1], (str, torch.device, int))
            and not isinstance(args[1], bool)
        ):
            args = (args[0], _cpu_device(args[1]), *args[2:])
        return func(*args, **kwargs)


def enable() -> None:
    """Redirect Megatron-Core's CUDA calls to the CPU in this process (idempotent)."""
    global _enabled, _mode
    if _enabled:
        return
    if torch.cuda.is_available():
        raise RuntimeError("megatron_cpu.enable() is for machines without CUDA; this one has a GPU")
    torch.cuda.current_device = lambda: _CPU
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    # Not torch.manual_seed: it calls torch.cuda.manual_seed_all itself.
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.manual_seed_all = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.cuda.current_stream = lambda device=None: _Stream()
    torch.cuda.default_stream = lambda device=None: _Stream()
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()

    # deferred: Megatron-Core, optional (FSDP jobs lack it); imported for every job via workers/megatron.py
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _host_copy
    mrandom._get_cuda_rng_state = lambda device=-1, clone=False, graph_safe=False: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    _mode = _CpuDevices()
    _enabled = True


@contextlib.contextmanager
def active():
    """The device redirection for the code inside (call `enable()` first). Modes are per thread, so each
    call into Megatron enters it rather than relying on the thread that called `enable()`."""
    if _mode is None:
        raise RuntimeError("megatron_cpu.enable() was not called")
    depth = getattr(_depth, "n", 0)
    _depth.n = depth + 1
    try:
        if depth:  # already inside, in this thread
            yield
        else:
            with _mode:
                yield
    finally:
        _depth.n = depth


def enabled() -> bool:
    return _enabled

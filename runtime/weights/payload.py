"""Weights between processes on one host: CPU threads per slot, and state dicts the object store shares.

Ray keeps numpy arrays in shared memory and hands readers a view, where a pickled torch tensor is
copied on every get. Packing a state dict as numpy arrays (bf16/fp16 as their raw 16-bit words) lets
an engine read the trainer's weights without a copy in between.
"""

from __future__ import annotations

import os
import warnings

import torch

_RAW = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def cpu_threads(slots_per_node: int) -> int:
    """Torch threads for one CPU slot: this process's cores shared evenly by the node's slots.

    On a CPU run the engines and the trainer ranks of a slot take turns (generate, then train), so each
    phase may use the slot's whole share of cores.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    threads = max(1, cores // max(1, slots_per_node))
    torch.set_num_threads(threads)
    return threads


def pack(state_dict: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """name -> (numpy array, torch dtype name, shape) of CPU tensors, for the object store."""
    out = {}
    for name, t in state_dict.items():
        t = t.detach().to("cpu").contiguous()
        raw = t.view(_RAW[t.dtype]) if t.dtype in _RAW else t
        out[name] = (raw.numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
    return out


def unpack(packed: dict) -> dict[str, torch.Tensor]:
    """The tensors of `pack`, viewing the arrays' memory (read-only when it is the object store's)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # from_numpy of a read-only array: we only read it
        for name, value in packed.items():
            if torch.is_tensor(value):
                out[name] = value
                continue
            array, dtype, shape = value
            t = torch.from_numpy(array)
            dt = getattr(torch, dtype)
            out[name] = (t.view(dt) if dt in _RAW else t).reshape(shape)
    return out


def pin_gloo_interface() -> str | None:
    """Point gloo at the network interface holding this node's Ray address; the interface name, or None.

    Gloo binds to whatever the hostname resolves to, which on many machines (and in network namespaces)
    is a loopback address peers on other nodes cannot reach. An explicit GLOO_SOCKET_IFNAME is kept.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    try:
        import psutil
        import ray

        if not ray.is_initialized():
            return None
        ip = ray.util.get_node_ip_address()
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return name
    return None

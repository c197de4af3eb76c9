"""This node's share of the machine: CPU threads per slot, and the network interface gloo binds to."""

from __future__ import annotations

import os

import torch


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


def pin_gloo_interface() -> str | None:
    """Point gloo at the network interface holding this node's Ray address; the interface name, or None.

    Gloo binds to whatever the hostname resolves to, which on many machines (and in network namespaces)
    is a loopback address peers on other nodes cannot reach. An explicit GLOO_SOCKET_IFNAME is kept.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return os.environ["GLOO_SOCKET_IFNAME"]
    try:
        # deferred: psutil and Ray are optional here: an hf engine served over HTTP runs without Ray
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

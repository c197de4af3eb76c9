"""What a weight sync costs on GPUs, part by part, from what its transport moves (docs/estimate.md, "Weight sync").

A sync is three parts: the trainer gathers its shards into whole tensors (an all-gather among the policy's GPUs), the
transport the compiler chose (`decide.weight_sync`) carries them, and every engine worker loads them with vLLM's
`load_weights` (each worker takes the whole tensors and keeps its own slice). The engines' wake-up before a colocated
sync (sleep level 2) maps memory and copies nothing: the weights arrive with the sync itself.

The constants are measurements published by the frameworks that do this (cited where they are set); the page holds
the result against SkyRL's, slime's and open-instruct's reported sync times.
"""

from __future__ import annotations

import math
from typing import Any

from rlc.compiler.decide import weight_sync
from rlc.core.dataclass import dataclass

# vLLM's load_weights of bf16 checkpoint tensors (weight loaders, TP slicing, fused projections), about 38 GB/s:
# vllm-project/vime#176 measured 14 ms an engine load per chunk of Qwen3-30B-A3B's 61 GB in 115 chunks (H200). The
# per-tensor work runs on the host, so it is taken to be the same on every GPU.
ENGINE_LOAD_GBS = 38.0
# Each CUDA-IPC bucket is a Ray call with its handles, opened by the engine: about 5 ms. SkyRL#161: a 14B model's
# sync on 8 H100 went from 4.4 s (a call per tensor, about 580) to 1.6 s (1 GB buckets, about 30); 2.8 s / 550 calls.
IPC_CALL_S = 0.005
# Copies between a GPU and pinned host memory (PCIe 4.0 x16: 32 GB/s a direction, about 25 reached).
PCIE_GBS = 25.0
# gloo between processes of a GPU node: TCP through host memory, as the CPU profile's link.
GLOO_GBS = 5.0


@dataclass(frozen=True)
class SyncCost:
    parts: tuple[tuple[str, float], ...]  # (what, seconds), in the order they run

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.parts)

    def how(self) -> str:
        return "; ".join(f"{name} {_ms(s)}" for name, s in self.parts)


def gpu_sync_cost(
    *,
    transport: str,
    size: float,
    policy_gpus: int,
    gather_gbs: float,
    link_gbs: float,
    ipc_bucket_bytes: int,
) -> SyncCost:
    """The parts of one GPU sync of `size` bytes: the policy's all-gather over `gather_gbs` among its `policy_gpus`,
    then `transport` ("ipc", "nccl", "gloo" or "payload"; `link_gbs` is the link a broadcast crosses), then the
    engines' load."""
    gb = size / 1e9
    parts = []
    if policy_gpus > 1:
        parts.append((f"gather over {policy_gpus} GPUs", gb * (policy_gpus - 1) / policy_gpus / gather_gbs))
    if transport == "ipc":
        buckets = max(math.ceil(size / ipc_bucket_bytes), 1)
        parts.append((f"CUDA IPC, {buckets} bucket(s) of {ipc_bucket_bytes / 1e9:.3g} GB", buckets * IPC_CALL_S))
    elif transport == "nccl":
        parts.append((f"nccl broadcast at {link_gbs:.4g} GB/s", gb / link_gbs))
    elif transport == "gloo":
        parts.append((f"to the host, gloo at {GLOO_GBS:g} GB/s, back", 2 * gb / PCIE_GBS + gb / GLOO_GBS))
    else:  # payload: whole state dicts through Ray's object store (or HTTP)
        parts.append(("to the host and the object store, back", 2 * gb / PCIE_GBS))
    parts.append((f"vLLM load at {ENGINE_LOAD_GBS:g} GB/s", gb / ENGINE_LOAD_GBS))
    return SyncCost(tuple(parts))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def sync_inputs(spec: Any, plan: Any) -> dict:
    """What `gpu_sync_cost` needs of the spec and plan besides the size: the transport the runtime uses and the
    policy's GPUs."""
    sync = weight_sync(spec, "cuda")
    policy = next((r for r in plan.roles if r.name == "policy"), None)
    return {
        "transport": sync.transport,
        "policy_gpus": max(len(policy.ranks), 1) if policy else 1,
        "ipc_bucket_bytes": sync.ipc_threshold_bytes,
    }

"""The weight sync's cost on GPUs: the policy's gather, the transport the runtime uses, vLLM's load."""

from __future__ import annotations

import math

import pytest
from conftest import EXAMPLES
from rlc.compiler.estimate import estimate_time
from rlc.compiler.pipeline import compile_job
from rlc.compiler.weight_sync_cost import ENGINE_LOAD_GBS, GLOO_GBS, IPC_CALL_S, PCIE_GBS
from rlc.core.overrides import parse_override

GSM8K = str(EXAMPLES / "gsm8k-grpo-8xh100.yaml")
APART = (  # the engines on GPUs of their own: the policy and reference on 4, 4 engines
    "trainer.placement.colocate_all=false",
    "trainer.placement.policy_num_gpus_per_node=4",
    "trainer.placement.ref_num_gpus_per_node=4",
    "generator.inference_engine.num_engines=4",
)


def sync(*overrides: str):
    result = compile_job(GSM8K, [parse_override(o) for o in overrides])
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    est = estimate_time(result.spec, result.plan, result.memory)
    assert est is not None
    return next(p for p in est.phases if p.name == "weight sync")


def test_a_colocated_sync_is_a_call_per_cuda_ipc_bucket_and_the_engines_load():
    base = sync()
    size = 2 * 1.54e9  # Qwen2.5-1.5B's bf16 weights, about
    assert "CUDA IPC, 3 bucket(s)" in base.how and "vLLM load" in base.how
    # the copy itself is HBM-fast; the load and the calls are what a sync costs (seconds for 16 GB, not 4.89 ms)
    assert base.seconds > 15 * size / 3350e9
    quarter = sync("generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB=0.25")
    more = math.ceil(3.09e9 / (0.25 * 2**30)) - 3
    assert quarter.seconds - base.seconds == pytest.approx(more * IPC_CALL_S, rel=0.01)


def test_engines_apart_take_a_broadcast_over_nvlink_or_the_hosts_gloo():
    nccl, gloo = sync(*APART), sync(*APART, "generator.inference_engine.weight_sync_backend=gloo")
    assert "nccl broadcast at 450 GB/s" in nccl.how and "gloo" in gloo.how
    size_gb = 3.09
    assert gloo.seconds - nccl.seconds == pytest.approx(size_gb * (2 / PCIE_GBS + 1 / GLOO_GBS - 1 / 450), rel=0.02)


def test_every_gpu_sync_pays_vllms_load_and_a_gather_among_the_policys_gpus():
    one = sync(
        "trainer.placement.colocate_all=false",
        "trainer.placement.policy_num_gpus_per_node=1",
        "trainer.placement.ref_num_gpus_per_node=1",
        "generator.inference_engine.num_engines=1",
        "cluster.gpus_per_node=2",
    )
    four = sync(*APART)
    assert "gather" not in one.how and "gather over 4 GPUs" in four.how
    assert one.seconds > 3.09 / ENGINE_LOAD_GBS


def test_a_link_override_sets_the_broadcasts_link():
    assert "nccl broadcast at 10 GB/s" in sync(*APART, "estimate.link_gbs=10").how

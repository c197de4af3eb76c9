"""SkyRL's INT4-QAT DAPO script in small: Qwen3.5-MoE under Megatron with LoRA synced unmerged, fake-INT4 QAT of the
routed experts and fused LM-head log-probs, on one rank and on two tensor ranks (sequence parallelism: the adapters'
low-rank activations gather and scatter the rows as their layers do) whose experts split over two expert ranks.

Every adapter starts from an A drawn from its layer and projection alone (B is zero), so both layouts start from the
same model: one step gives the same losses, gradient norm, old log-probs and trained adapters. (Under tensor
parallelism without expert parallelism, LoRA on the routed experts is refused at start-up: its step differs.)
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_megatron_qwen35 import qwen35_moe_text  # noqa: E402, F401 (the tiny Qwen3.5-MoE fixture)

LORA = {"rank": 4, "alpha": 8, "target_modules": "all-linear"}
SPLIT = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2, "expert_tensor_parallel_size": 1}


def _seed_adapters(worker) -> None:
    """Each adapter's A from its layer and projection (the same for every expert of a layer); a row-parallel layer
    split over its group holds its rank's input slice."""
    import torch.distributed as dist
    from rlc.runtime.workers.megatron_lora import LoraLinear

    for name, m in worker.chunks[0].named_modules():
        if not isinstance(m, LoraLinear):
            continue
        a = m.lora_A[0]
        parts = name.split(".")
        key = f"{parts[2]}.{'shared' if 'shared_experts' in name else ''}.{parts[-1]}"
        size = dist.get_world_size(m.group) if m.group is not None else worker.tp
        rank = dist.get_rank(m.group) if m.group is not None else worker.tp_rank
        split = m.style == "row" and size > 1
        g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        whole = torch.randn((a.shape[0], a.shape[1] * (size if split else 1)), generator=g) * 0.1
        a.data.copy_(whole.chunk(size, 1)[rank] if split else whole)


def _step(rank: int, world: int, port: int, q, model_path: str, split: dict) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from rlc.core.job import FakeInt4Qat
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from rlc.spec.model import default_model
    from test_fsdp import _batch_and_noise
    from test_megatron import _old_logprobs

    # Adam's eps at 1 makes the first update lr * g / (|g| + 1): the trained adapters show the gradients themselves
    # (at eps 1e-8 it would be lr times their signs)
    megatron = {"lora_config": {"merge_lora": False}, "optimizer_config_kwargs": {"adam_eps": 1.0}, **split}
    policy = {
        "optimizer_config": {"lr": 5e-2, "weight_decay": 0.0},
        "model": {"lora": LORA},
        "megatron_config": megatron,
    }
    algorithm = {"use_kl_loss": True, "kl_loss_coef": 0.1, "policy_loss_type": "dual_clip"}  # no entropy loss
    spec = default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": policy, "algorithm": algorithm}}
    )
    settings = WorkerSettings(
        "policy",
        model_path,
        micro_train_batch_size=4,
        micro_forward_batch_size=8,
        fake_int4_qat=FakeInt4Qat(8, 7.5, -8.0),
        fused_lm_head="torch",
    )
    worker = MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    with torch.no_grad():
        _seed_adapters(worker)
    batch, noise = _batch_and_noise(transformers.AutoConfig.from_pretrained(model_path).vocab_size)
    layout = worker.layout()
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    old = _old_logprobs(worker, mine, world)
    noise = noise.chunk(layout["dp_size"])[layout["dp_rank"]]
    metrics = worker.train_mini_batch(dataclasses.replace(mine, old_logprobs=old + noise), totals(batch))
    adapters = worker.full_state_dict(adapters_only=True)
    out = {"metrics": metrics, "old": old.numpy()}
    if rank == 0:
        out["adapters"] = {k: v.numpy() for k, v in adapters.items()}
    q.put((rank, out))
    worker.shutdown()


def test_the_int4_qat_scripts_combination_under_tp_and_ep_equals_one_rank(qwen35_moe_text):  # noqa: F811
    (one,) = run_ranks(_step, 1, qwen35_moe_text, {})
    split = run_ranks(_step, 2, qwen35_moe_text, SPLIT)[0]
    for key in ("policy_loss", "kl", "entropy", "grad_norm"):
        assert split["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), key
    torch.testing.assert_close(torch.from_numpy(split["old"]), torch.from_numpy(one["old"]), rtol=1e-4, atol=1e-5)
    assert sorted(split["adapters"]) == sorted(one["adapters"])
    assert any(".mlp.experts." in k for k in one["adapters"]) and any("linear_attn" in k for k in one["adapters"])
    moved = [k for k, v in one["adapters"].items() if "lora_B" in k and abs(v).sum() > 0]
    assert moved  # the step trained the adapters
    for k, v in one["adapters"].items():
        torch.testing.assert_close(torch.from_numpy(split["adapters"][k]), torch.from_numpy(v), rtol=1e-4, atol=1e-8)

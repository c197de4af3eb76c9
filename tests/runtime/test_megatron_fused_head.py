"""trainer.fused_lm_head_logprob in the Megatron worker (on the CPU, through `megatron_cpu`).

With the head fused, the old log-probs, squared probabilities and the GRPO step (losses, entropy, gradient norm,
updated weights) are those of the step that scores the head's whole logits, on one rank and with the vocabulary
split over two tensor ranks; what SkyRL refuses with it is refused at start-up.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

from conftest import run_ranks  # noqa: E402
from test_fsdp import _batch_and_noise  # noqa: E402

# SkyRL refuses the entropy loss with the fused head; the entropy is still reported
ALGORITHM = {"use_kl_loss": True, "kl_loss_coef": 0.1, "policy_loss_type": "dual_clip", "temperature": 0.8}


def _spec(tp: int, algorithm: dict = ALGORITHM):
    from rlc.spec.model import default_model

    # A dense model under tp runs without sequence parallelism on the CPU (torch's norms refuse it without
    # TransformerEngine): the head's input is copied to every tensor rank, its gradient summed over them.
    megatron = {"tensor_model_parallel_size": tp}
    policy = {"optimizer_config": {"lr": 1e-2, "weight_decay": 0.0}, "megatron_config": megatron}  # test_megatron's
    return default_model().to_typed(
        {"version": 1, "trainer": {"strategy": "megatron", "policy": policy, "algorithm": algorithm}}
    )


def _rank(rank: int, world: int, port: int, q, model_path: str, tp: int) -> None:
    """One rank on one tensor rank scores the old log-probs with the whole logits and with the fused head, then takes
    the plain step; two tensor ranks score and step with the fused head (backend triton: rlc's torch op)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist
    from rlc.runtime.batch import shards, totals
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker
    from transformers import AutoConfig

    spec = _spec(tp)
    plain = WorkerSettings(
        "policy",
        model_path,
        strategy="megatron",
        micro_train_batch_size=2,
        micro_forward_batch_size=3,
        temperature=0.8,
        logprobs_chunk_size=5,  # several chunks per micro-batch
    )
    fused = dataclasses.replace(plain, fused_lm_head="torch" if tp == 1 else "triton")
    worker = MegatronWorker(plain if tp == 1 else fused, spec.trainer.policy, spec.trainer.algorithm, rank, world)
    worker.setup("127.0.0.1", port)
    batch, noise = _batch_and_noise(AutoConfig.from_pretrained(model_path).vocab_size)
    layout = worker.layout()
    mine = shards(batch, layout["dp_size"])[layout["dp_rank"]]
    result: dict = {"collect": layout["collect"], "squares": worker.forward(mine, sum_pi_squared=True)}
    if tp == 1:  # the same weights through the fused head; the step below is the plain one
        worker.s = fused
        result["fused_squares"] = worker.forward(mine, sum_pi_squared=True)
        worker.s = plain
    found: list = [None] * world
    dist.all_gather_object(found, result["squares"] if layout["collect"] else None)
    old = next(s for s in found if s is not None)[..., 0]
    result["metrics"] = worker.train_mini_batch(dataclasses.replace(mine, old_logprobs=old + noise), totals(batch))
    result["weights"] = worker.full_state_dict()
    q.put((rank, result))
    worker.shutdown()


@pytest.fixture(scope="module")
def runs(tiny_model):
    def run(world, tp):
        return next(r for r in run_ranks(_rank, world, tiny_model, tp) if r["collect"])

    return run(1, 1), run(2, 2)


def test_the_fused_head_scores_as_the_whole_logits(runs):
    one, tp2 = runs
    real = _batch_and_noise(64)[0].loss_mask.bool()  # padding positions score tokens no row has
    torch.testing.assert_close(one["fused_squares"][real], one["squares"][real], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tp2["squares"][real], one["squares"][real], rtol=1e-4, atol=1e-5)


def test_a_step_through_the_fused_head_on_two_tensor_ranks_is_the_plain_step(runs, tiny_model):
    from test_megatron import OPTIMIZER, _initial

    want, got = runs
    for key in ("policy_loss", "kl", "entropy", "clip_fraction", "grad_norm"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-4, abs=1e-6), key
    assert got["weights"].keys() == want["weights"].keys()
    start, strong, total = _initial(tiny_model), 0, 0
    for name, w in want["weights"].items():
        # Adam's first step is +-lr where |g| is far above eps; where a gradient nearly cancels out, the order the
        # ranks sum in decides its sign, so those elements are not compared (as in test_megatron)
        clear = (w - start[name]).abs() > 0.999 * OPTIMIZER["lr"]
        torch.testing.assert_close(got["weights"][name][clear], w[clear], rtol=0, atol=1e-5, msg=name)
        strong, total = strong + int(clear.sum()), total + clear.numel()
    assert strong > 0.9 * total


@pytest.mark.parametrize(
    "change, message",
    [
        ({"algorithm": {**ALGORITHM, "use_entropy_loss": True}}, "use_entropy_loss"),
        ({"mtp_loss_weight": 0.1}, "trainer.mtp.enabled"),
    ],
)
def test_what_skyrl_refuses_with_the_fused_head_is_refused_at_start_up(tiny_model, change, message):
    from rlc.runtime.workers.common import WorkerSettings
    from rlc.runtime.workers.megatron import MegatronWorker

    spec = _spec(1, change.get("algorithm", ALGORITHM))
    extra = {k: v for k, v in change.items() if k != "algorithm"}
    settings = WorkerSettings("policy", tiny_model, strategy="megatron", fused_lm_head="torch", **extra)
    with pytest.raises(ValueError, match=message):
        MegatronWorker(settings, spec.trainer.policy, spec.trainer.algorithm, 0, 1)

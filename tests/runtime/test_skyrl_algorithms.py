"""SkyRL 0.4.0's `maxrl` estimator and `rollout_is`, `importance_sampling` and `cross_entropy` losses, and its
learning-rate schedules, against SkyRL's own formulas on the same tensors.

The expected values follow SkyRL's shape of the computation, not rlc's: advantages pre-scaled by the loss reduction
over the mini-batch, each loss summed over the masked tokens (skyrl 0.4.0, backends/skyrl_train/utils/ppo_utils.py
and train/trainer.py `_normalize_advantages`); rlc weights per-token losses instead (`token_weights`).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.algorithms import registry  # noqa: E402
from rlc.runtime.algorithms.advantages import maxrl_advantages  # noqa: E402
from rlc.runtime.batch import TrainBatch, totals  # noqa: E402
from rlc.runtime.workers.common import lr_lambda, policy_objective  # noqa: E402
from rlc.spec.model import default_model  # noqa: E402

F64 = torch.float64
EPS = 1e-6


def _algorithm(**algorithm):
    spec = {"version": 1, "trainer": {"algorithm": {"use_kl_loss": False, "use_entropy_loss": False, **algorithm}}}
    return default_model().to_typed(spec).trainer.algorithm


# ---- maxrl ------------------------------------------------------------------------------------------


def _skyrl_maxrl(scores: list[float], index: list[int]) -> list[float]:
    """SkyRL's compute_maxrl_advantage, one sample at a time: (s - mean) / (mean + eps) in a group of several,
    s - 0 in a group of one."""
    groups: dict[int, list[float]] = {}
    for s, i in zip(scores, index):
        groups.setdefault(i, []).append(s)
    out = []
    for s, i in zip(scores, index):
        members = groups[i]
        mean = sum(members) / len(members) if len(members) > 1 else 0.0
        out.append((s - mean) / (mean + EPS) if len(members) > 1 else s - mean)
    return out


def test_maxrl_matches_skyrl_on_mixed_groups():
    # A group with one success in four, one with three, an all-zero group, a group of one, fractional rewards.
    scores = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.7, 0.25, 0.5]
    index = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 4]
    mask = torch.ones(len(scores), 3, dtype=F64)
    mask[2, 1:] = 0
    advantages, returns = maxrl_advantages(torch.tensor(scores, dtype=F64), mask, index)
    expected = torch.tensor(_skyrl_maxrl(scores, index), dtype=F64)[:, None] * mask
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected)
    # The rare success weighs more than the common one: 3 for 1-in-4, 1/3 for 3-in-4.
    assert advantages[0, 0].item() == pytest.approx(3.0, rel=1e-5)
    assert advantages[4, 0].item() == pytest.approx(1 / 3, rel=1e-5)
    assert advantages[10, 0].item() == 0.7  # the group of one keeps its score, as in SkyRL


def test_maxrl_through_the_registry_reads_per_token_rewards():
    rewards = torch.zeros(4, 2)
    rewards[[0, 3], 1] = 1.0  # outcome reward on the last token
    fn = registry.get_advantage_estimator("maxrl")
    advantages, _ = fn(rewards, torch.ones(4, 2), index=torch.tensor([0, 0, 1, 1]), values=None, algorithm=None)
    expected = torch.tensor(_skyrl_maxrl([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1]))[:, None].expand(4, 2)
    torch.testing.assert_close(advantages, expected)


# ---- policy losses ----------------------------------------------------------------------------------

ROWS, LENGTH, MAX_SEQ_LEN = 4, 5, 7


def _tensors():
    """Log-probs, old and rollout log-probs, advantages and a ragged mask, with ratios inside and outside 0.8-1.2."""
    g = torch.Generator().manual_seed(3)
    mask = torch.ones(ROWS, LENGTH, dtype=F64)
    mask[1, 3:] = 0
    mask[3, 1:] = 0
    logp = -torch.rand(ROWS, LENGTH, generator=g, dtype=F64) * 3
    old = logp + torch.randn(ROWS, LENGTH, generator=g, dtype=F64) * 0.1
    rollout = logp + torch.randn(ROWS, LENGTH, generator=g, dtype=F64) * 0.3  # ~half the ratios leave the band
    advantages = torch.randn(ROWS, LENGTH, generator=g, dtype=F64) * mask
    return logp, old, rollout, advantages, mask


def _skyrl_scaled_advantages(advantages, mask, reduction):
    """SkyRL's apply_loss_reduction_to_advantages_minibatch for one mini-batch."""
    rows = advantages.shape[0]
    if reduction == "token_mean":
        return advantages / mask.sum().clamp(min=1)
    if reduction == "sequence_mean":
        return advantages / (rows * mask.sum(dim=-1, keepdim=True).clamp(min=1))
    return advantages / (rows * MAX_SEQ_LEN)


def _rlc(loss_type, reduction, logp_leaf, old, rollout, advantages, mask):
    batch = TrainBatch(
        input_ids=torch.zeros(ROWS, 1, dtype=torch.long),
        attention_mask=torch.ones(ROWS, 1, dtype=torch.long),
        response_ids=torch.zeros(ROWS, LENGTH, dtype=torch.long),
        loss_mask=mask,
        rollout_logprobs=rollout,
        token_rewards=torch.zeros(ROWS, LENGTH, dtype=F64),
        group=torch.arange(ROWS),
        prompt_len=1,
        old_logprobs=old,
        advantages=advantages,
    )
    a = _algorithm(policy_loss_type=loss_type, loss_reduction=reduction, eps_clip_low=0.2, eps_clip_high=0.2)
    loss, metrics = policy_objective(a, logp_leaf, torch.zeros_like(logp_leaf), batch, totals(batch), MAX_SEQ_LEN)
    loss.backward()
    return loss.detach(), logp_leaf.grad, metrics


def _skyrl_rollout_is(logp, old, rollout, advantages, mask):
    ratio = torch.exp(torch.clamp(logp - rollout, -20.0, 20.0))
    inside = (ratio > 0.8) & (ratio < 1.2)
    calibrated = torch.where(inside, ratio, torch.zeros_like(ratio))
    return (-(calibrated.detach() * advantages * logp) * mask).sum()


def _skyrl_importance_sampling(logp, old, rollout, advantages, mask):
    return (-(torch.exp(logp - old) * advantages) * mask).sum()


@pytest.mark.parametrize("reduction", ["token_mean", "sequence_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize(
    "loss_type, skyrl", [("rollout_is", _skyrl_rollout_is), ("importance_sampling", _skyrl_importance_sampling)]
)
def test_loss_and_gradient_match_skyrl(loss_type, skyrl, reduction):
    logp, old, rollout, advantages, mask = _tensors()
    mine = logp.clone().requires_grad_(True)
    loss, grad, _ = _rlc(loss_type, reduction, mine, old, rollout, advantages, mask)
    theirs = logp.clone().requires_grad_(True)
    expected = skyrl(theirs, old, rollout, _skyrl_scaled_advantages(advantages, mask, reduction), mask)
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, theirs.grad)


def test_rollout_is_gives_no_gradient_outside_the_band_and_ignores_old_log_probs():
    logp, old, rollout, advantages, mask = _tensors()
    outside = ((logp - rollout).exp() - 1).abs() >= 0.2
    assert (outside & mask.bool()).any() and (~outside & mask.bool()).any()
    results = []
    for anchor in (old, old + 5.0):  # rollout_is reads the engine's log-probs, never the old policy's
        leaf = logp.clone().requires_grad_(True)
        loss, grad, metrics = _rlc("rollout_is", "token_mean", leaf, anchor, rollout, advantages, mask)
        results.append(loss)
        assert (grad[outside] == 0).all() and (grad[~outside & mask.bool()] != 0).all()
        assert metrics["clip_fraction"] == pytest.approx(float((outside & mask.bool()).sum() / mask.sum()))
    assert results[0] == results[1]


def test_cross_entropy_is_skyrls_sft_loss_mean_over_tokens():
    # SkyRL's SFT collator scales the loss mask by 1 / (loss tokens of the batch), then sums -log p: a token mean.
    logp, old, rollout, advantages, mask = _tensors()
    mine = logp.clone().requires_grad_(True)
    loss, grad, _ = _rlc("cross_entropy", "token_mean", mine, old, rollout, advantages * 0, mask)
    theirs = logp.clone().requires_grad_(True)
    expected = (-theirs * (mask / mask.sum())).sum()
    expected.backward()
    torch.testing.assert_close(loss, expected.detach())
    torch.testing.assert_close(grad, theirs.grad)  # advantages of 0 still train: the loss does not read them


# ---- learning-rate schedules ------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["constant", "constant_with_warmup", "linear", "cosine"])
@pytest.mark.parametrize("warmup, total", [(0, 10), (3, 10), (4, 4), (6, 3)])
def test_lr_factor_is_hugging_faces_schedule(scheduler, warmup, total):
    from transformers import get_scheduler

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=1.0)
    theirs = get_scheduler(scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=total)
    factor = lr_lambda(scheduler, warmup, total)
    for step in range(total + 3):
        assert factor(step) == pytest.approx(theirs.get_last_lr()[0], abs=1e-12), step
        optimizer.step()
        theirs.step()
    if warmup:
        assert factor(0) == (0.0 if scheduler != "constant" else 1.0)  # the first step does not move the weights


def test_cosine_reaches_zero_at_the_last_step():
    assert lr_lambda("cosine", 2, 10)(10) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("cosine", 2, 10)(6) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


# ---- a loss reduction over the whole mini-batch ----------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["prompt_mean", "token_mean_legacy"])
def test_the_driver_weights_of_a_mini_batch_reduction_add_up_over_ranks(reduction):
    """prompt_mean and token_mean_legacy are weighed over the whole mini-batch by the driver (`mini_batch_weights`):
    each rank's loss on its rows, with those weights, sums to the loss of the mini-batch in one piece, which is
    SkyRL's (the mean over prompts, or over runs of micro_train_batch_size rows, of their token means)."""
    from rlc.runtime.algorithms.losses import mini_batch_weights

    _, old, rollout, advantages, mask = _tensors()
    group = torch.arange(ROWS) // 2  # prompts of two samples, in order
    a = _algorithm(policy_loss_type="regular", loss_reduction=reduction, eps_clip_low=0.2, eps_clip_high=0.2)
    batch = TrainBatch(
        input_ids=torch.zeros(ROWS, 1, dtype=torch.long),
        attention_mask=torch.ones(ROWS, 1, dtype=torch.long),
        response_ids=torch.zeros(ROWS, LENGTH, dtype=torch.long),
        loss_mask=mask,
        rollout_logprobs=rollout,
        token_rewards=torch.zeros(ROWS, LENGTH, dtype=F64),
        group=group,
        prompt_len=1,
        old_logprobs=old,
        advantages=advantages,
    )
    batch.loss_weights = mini_batch_weights(a, mask, group, 2)
    half = ROWS // 2
    shards = [batch.select(slice(0, half)), batch.select(slice(half, ROWS))]
    ranks = sum(
        policy_objective(a, old[s], torch.zeros_like(old[s]), shard, totals(batch), MAX_SEQ_LEN)[0]
        for s, shard in zip((slice(0, half), slice(half, ROWS)), shards)
    )
    # the regular loss at ratio 1 is -A per token: the reduction of -A by its definition
    token = -advantages * mask
    parts = [token[i : i + 2].sum() / mask[i : i + 2].sum().clamp(min=1) for i in range(0, ROWS, 2)]
    expected = sum(parts) / len(parts)
    whole = policy_objective(a, old, torch.zeros_like(old), batch, totals(batch), MAX_SEQ_LEN)[0]
    torch.testing.assert_close(ranks, whole.to(ranks.dtype))
    torch.testing.assert_close(whole, expected.to(whole.dtype), rtol=1e-6, atol=1e-8)

"""Zero-variance filter and dynamic sampling (filter / replace) on small hand-made batches."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from rlc.core import algorithms  # noqa: E402
from rlc.runtime.algorithms.filtering import DynamicSampler, zero_variance_groups  # noqa: E402
from rlc.spec.algorithm import DynamicSamplingConfig  # noqa: E402


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def g(values):
    return torch.tensor(values, dtype=torch.long)


def test_zero_variance_groups_flags_groups_with_equal_rewards():
    rewards = t([1, 1, 1, 0, 1, 0, 5, 0.3, 0.3])
    group = g([0, 0, 0, 1, 1, 1, 2, 3, 3])
    flags = zero_variance_groups(rewards, group)
    # Group 2 has a single sample: it is never flagged.
    assert flags.tolist() == [True, True, True, False, False, False, False, True, True]


def test_zero_variance_groups_all_equal_and_sparse_ids():
    assert zero_variance_groups(t([0, 0, 0, 0]), g([7, 7, 3, 3])).tolist() == [True] * 4
    assert zero_variance_groups(t([0, 1, 0, 0]), g([7, 7, 3, 3])).tolist() == [False, False, True, True]


def test_zero_variance_groups_tolerance():
    rewards = torch.tensor([0.5, 0.5 + 1e-7], dtype=torch.float64)
    assert zero_variance_groups(rewards, g([0, 0])).tolist() == [True, True]
    assert zero_variance_groups(rewards, g([0, 0]), tol=0.0).tolist() == [False, False]


def test_zero_variance_groups_counts_only_live_samples():
    # Group 0: the one sample with another reward has no loss tokens, so the live rewards are equal.
    # Group 1: one live sample left, which is never flagged.
    rewards = t([1, 1, 0, 1, 0])
    group = g([0, 0, 0, 1, 1])
    mask = t([[1, 1], [1, 0], [0, 0], [1, 1], [0, 0]])
    assert zero_variance_groups(rewards, group, mask=mask).tolist() == [True, True, True, False, False]


def test_zero_variance_groups_wants_one_reward_per_sample():
    with pytest.raises(ValueError, match="one scalar per sample"):
        zero_variance_groups(t([[0, 1], [1, 0]]), g([0, 0]))


def test_filter_collects_good_groups_over_several_batches():
    sampler = DynamicSampler("filter", 3, max_sample_batches=5)
    assert not sampler.add(t([1, 1, 0, 1]), g([0, 0, 1, 1]))  # rows 0-3: group 1 is good
    assert not sampler.add(t([0, 0, 1, 1]), g([0, 0, 1, 1]))  # rows 4-7: nothing
    assert sampler.add(t([1, 0, 0, 1]), g([0, 0, 1, 1]))  # rows 8-11: two good groups
    assert sampler.indices().tolist() == [2, 3, 8, 9, 10, 11]
    assert sampler.metrics() == {
        "dynamic_sampling/sample_batches": 3,
        "dynamic_sampling/zero_variance_groups": 3,
        "dynamic_sampling/kept_groups": 3,
        "dynamic_sampling/replaced_groups": 0,
    }


def test_filter_keeps_exactly_the_first_target_groups():
    sampler = DynamicSampler("filter", 1)
    # Both groups are good; the first to appear is kept, whole, even when its rows interleave.
    assert sampler.add(t([1, 1, 0, 0]), g([5, 2, 5, 2]))
    assert sampler.indices().tolist() == [0, 2]


def test_filter_sums_token_rewards_and_keeps_single_sample_groups():
    sampler = DynamicSampler("filter", 2)
    assert sampler.add(t([[0, 0], [0, 0]]), g([0, 1]))  # one sample per prompt: always good
    assert sampler.indices().tolist() == [0, 1]
    sampler = DynamicSampler("filter", 1)
    assert sampler.add(t([[0, 1], [0, 0]]), g([0, 0]))  # sums 1 and 0
    assert sampler.indices().tolist() == [0, 1]


def test_filter_raises_when_the_last_allowed_batch_falls_short():
    sampler = DynamicSampler("filter", 2, max_sample_batches=2)
    assert not sampler.add(t([0, 0, 1, 1]), g([0, 0, 1, 1]))
    with pytest.raises(RuntimeError, match="after 2 batches"):
        sampler.add(t([0, 1, 1, 1]), g([0, 0, 1, 1]))


def test_no_limit_samples_until_the_batch_is_full():
    sampler = DynamicSampler("filter", 1, max_sample_batches=-1)
    for _ in range(40):
        assert not sampler.add(t([1, 1]), g([0, 0]))
    assert sampler.add(t([0, 1]), g([0, 0]))
    assert sampler.indices().tolist() == [80, 81]
    assert sampler.metrics()["dynamic_sampling/sample_batches"] == 41


def test_a_complete_step_must_be_reset_before_the_next():
    sampler = DynamicSampler("filter", 1)
    with pytest.raises(RuntimeError, match="not collected"):
        sampler.indices()
    assert sampler.add(t([0, 1]), g([0, 0]))
    with pytest.raises(RuntimeError, match="reset"):
        sampler.add(t([0, 1]), g([0, 0]))
    sampler.reset()
    assert not sampler.ready
    assert sampler.add(t([1, 0]), g([3, 3]))
    assert sampler.indices().tolist() == [0, 1]
    assert sampler.metrics()["dynamic_sampling/sample_batches"] == 1


def test_replace_copies_the_only_good_group_over_every_bad_one():
    sampler = DynamicSampler("replace", min_replace_ratio=0.2)
    # Groups: 0 bad, 1 good (rows 2-3), 2 bad, 3 bad. 1 good > 4 * 0.2.
    assert sampler.add(t([1, 1, 0, 1, 0, 0, 1, 1]), g([0, 0, 1, 1, 2, 2, 3, 3]))
    assert sampler.indices().tolist() == [2, 3, 2, 3, 2, 3, 2, 3]
    assert sampler.metrics()["dynamic_sampling/kept_groups"] == 1
    assert sampler.metrics()["dynamic_sampling/replaced_groups"] == 3


def test_replace_draws_distinct_good_groups_when_there_are_enough():
    rewards, group = t([1, 1, 0, 1, 0, 0, 1, 0]), g([0, 0, 1, 1, 2, 2, 3, 3])
    sampler = DynamicSampler("replace", seed=3)
    assert sampler.add(rewards, group)
    rows = sampler.indices().tolist()
    assert rows[2:4] == [2, 3] and rows[6:8] == [6, 7]  # good groups stay
    assert sorted([rows[0:2], rows[4:6]]) == [[2, 3], [6, 7]]  # each bad group gets a different good one
    again = DynamicSampler("replace", seed=3)
    again.add(rewards, group)
    assert again.indices().tolist() == rows  # same seed, same batch


def test_replace_needs_more_than_min_replace_ratio_good_groups():
    sampler = DynamicSampler("replace", min_replace_ratio=0.5, max_sample_batches=3)
    # 2 good groups of 4 is not more than half: discard and sample again.
    assert not sampler.add(t([1, 1, 0, 1, 0, 0, 1, 0]), g([0, 0, 1, 1, 2, 2, 3, 3]))
    # 3 of 4 is: the batch trains, its rows follow the 8 rows of the first batch.
    assert sampler.add(t([1, 0, 0, 1, 0, 0, 1, 0]), g([0, 0, 1, 1, 2, 2, 3, 3]))
    rows = sampler.indices().tolist()
    assert rows[:4] == [8, 9, 10, 11] and rows[6:] == [14, 15]
    assert rows[4:6] in ([8, 9], [10, 11], [14, 15])
    assert sampler.metrics() == {
        "dynamic_sampling/sample_batches": 2,
        "dynamic_sampling/zero_variance_groups": 3,
        "dynamic_sampling/kept_groups": 3,
        "dynamic_sampling/replaced_groups": 1,
    }


def test_replace_raises_at_the_limit():
    sampler = DynamicSampler("replace", max_sample_batches=1)
    with pytest.raises(RuntimeError, match="replace"):
        sampler.add(t([1, 1, 0, 0]), g([0, 0, 1, 1]))


def test_sampler_from_spec_section_and_bad_settings():
    sampler = DynamicSampler.from_config(DynamicSamplingConfig(type="filter", max_sample_batches=1), 1)
    with pytest.raises(RuntimeError):
        sampler.add(t([1, 1]), g([0, 0]))
    with pytest.raises(ValueError, match="dynamic sampling type"):
        DynamicSampler("drop", 4)
    with pytest.raises(ValueError, match="target_groups"):
        DynamicSampler("filter")


# -- rows that cannot move the weights ----------------------------------------------------------------------


def _algorithm(**algorithm):
    from rlc.spec.model import default_model

    return (
        default_model()
        .to_typed({"version": 1, "trainer": {"algorithm": {"use_kl_loss": False, **algorithm}}})
        .trainer.algorithm
    )


def _policy_batch(rows=8, length=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(rows, length)
    mask[1, 3:] = 0
    mask[6, 1:] = 0
    advantages = torch.randn(rows, length, generator=gen) * mask
    advantages[2:4] = 0  # a group whose rewards were all equal
    advantages[5, :2] = 0  # a row whose only non-zero advantages lie outside its mask
    mask[5, 2:] = 0
    advantages[5, 2:] = 1.5
    from rlc.runtime.batch import TrainBatch

    return TrainBatch(
        input_ids=torch.arange(rows)[:, None],  # each row's own index, to follow rows through selections
        attention_mask=torch.ones(rows, 1, dtype=torch.long),
        response_ids=torch.zeros(rows, length, dtype=torch.long),
        loss_mask=mask,
        rollout_logprobs=torch.zeros(rows, length),
        token_rewards=torch.zeros(rows, length),
        group=torch.arange(rows) // 2,
        prompt_len=1,
        advantages=advantages,
        old_logprobs=-torch.rand(rows, length, generator=gen) * 3,
    )


def _rows(batch) -> torch.Tensor:
    """The original indices of a batch's rows (`_policy_batch` numbers them in input_ids)."""
    return batch.input_ids[:, 0]


def test_inert_rows_have_no_advantage_inside_their_mask():
    from rlc.runtime.algorithms.filtering import inert_rows

    batch = _policy_batch()
    assert inert_rows(batch, _algorithm()).tolist() == [False, False, True, True, False, True, False, False]
    # Terms every row feeds: nothing is inert.
    with_ref = dataclasses.replace(batch, ref_logprobs=batch.old_logprobs)
    assert inert_rows(with_ref, _algorithm(use_kl_loss=True)) is None
    assert inert_rows(batch, _algorithm(use_entropy_loss=True)) is None
    assert inert_rows(batch, _algorithm(policy_loss_type="clip_cov")) is None  # batch-wide covariances
    # A KL loss with no reference log-probs in the batch adds nothing; a zero entropy coefficient neither.
    assert inert_rows(batch, _algorithm(use_kl_loss=True)) is not None
    assert inert_rows(batch, _algorithm(use_entropy_loss=True, entropy_loss_coef=0.0)) is not None


@pytest.mark.parametrize("loss", [card.id for card in algorithms.POLICY_LOSSES if card.advantage_weighted])
@pytest.mark.parametrize("reduction", [card.id for card in algorithms.LOSS_REDUCTIONS])
def test_leaving_inert_rows_out_gives_the_same_loss_and_gradient(loss, reduction):
    from rlc.runtime.algorithms.filtering import rows_that_train
    from rlc.runtime.algorithms.losses import mini_batch_weights
    from rlc.runtime.batch import totals
    from rlc.runtime.workers.common import policy_objective

    a = _algorithm(policy_loss_type=loss, loss_reduction=reduction)
    batch = _policy_batch()
    # a reduction over the whole mini-batch is weighed by the driver before rows are left out, as the driver does
    batch.loss_weights = mini_batch_weights(a, batch.loss_mask, batch.group, 2)
    logp = batch.old_logprobs + torch.randn(batch.old_logprobs.shape, generator=torch.Generator().manual_seed(1)) * 0.3

    def run(mb, tot):
        leaf = logp[_rows(mb)].clone().requires_grad_(True)
        value, metrics = policy_objective(a, leaf, torch.ones_like(leaf), mb, tot, max_seq_len=5)
        value.backward()
        grad = torch.zeros_like(logp)
        grad[_rows(mb)] = leaf.grad
        return value.item(), grad, metrics

    trained, tot, left_out = rows_that_train(batch, totals(batch), a, ranks=1)
    assert left_out == 3 and _rows(trained).tolist() == [0, 1, 4, 6, 7]
    assert tot["tokens"] == totals(batch)["tokens"] and tot["trained_tokens"] == float(trained.loss_mask.sum())
    whole_loss, whole_grad, _ = run(batch, totals(batch))
    part_loss, part_grad, metrics = run(trained, tot)
    assert part_loss == pytest.approx(whole_loss, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(part_grad, whole_grad, rtol=1e-6, atol=1e-7)
    assert whole_grad[[2, 3, 5]].abs().sum() == 0
    assert metrics["entropy"] == pytest.approx(1.0)  # a mean over the tokens that ran


def test_every_rank_keeps_an_equal_share_of_rows():
    from rlc.runtime.algorithms.filtering import rows_that_train
    from rlc.runtime.batch import totals

    batch = _policy_batch()
    a = _algorithm()
    # 5 rows train; 4 ranks need 8 rows in all: nothing is left out.
    assert rows_that_train(batch, totals(batch), a, ranks=4)[2] == 0
    trained, _, left_out = rows_that_train(batch, totals(batch), a, ranks=2)  # 6 rows: one inert row stays
    assert left_out == 2 and _rows(trained).tolist() == [0, 1, 2, 4, 6, 7]
    batch.advantages.zero_()  # no row trains: each rank still runs one (zero-gradient) row
    trained, _, left_out = rows_that_train(batch, totals(batch), a, ranks=2)
    assert left_out == 6 and _rows(trained).tolist() == [0, 1]
    assert rows_that_train(_policy_batch(), totals(batch), _algorithm(use_entropy_loss=True), ranks=1)[2] == 0

"""Scoring a step's rollouts (rlc.runtime.scoring): PF-PPO draws the scored rows again by their rewards, each row
keeping what scoring gave it."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from rlc.core.job import KLControl, ScoringSettings  # noqa: E402
from rlc.runtime.batch import Rollout  # noqa: E402
from rlc.runtime.scoring import Scoring  # noqa: E402
from rlc.spec.algorithm import AlgorithmConfig  # noqa: E402

REWARDS = [0.0, 1.0, 0.5, 0.25, 1.0, 0.0, 0.0, 0.75, 0.5, 0.5, 1.0, 0.0]  # four groups of three


def _settings(**changes) -> ScoringSettings:
    base = ScoringSettings(
        multi_turn=False,
        step_wise=False,
        fully_async=False,
        apply_overlong_filtering=False,
        zero_reward_on_non_stop=False,
        zero_variance_filter=False,
        zero_variance_filter_tol=1e-6,
        off_policy_correction=False,
        kl_in_reward=False,
        kl_estimator="k3",
        kl=KLControl("fixed", 0.0, 0.1, 10000),
        advantage_estimator="grpo",
        advantage_batch_normalize=False,
        old_logprob_pass=False,
    )
    return dataclasses.replace(base, **changes)


def _rollouts() -> list[Rollout]:
    # each row's prompt is its own id, so a drawn row can be traced back to the one scored
    return [
        Rollout([100 + i], [5, 6, 7], [-0.5, -0.5, -0.5], "stop", reward, group=i // 3)
        for i, reward in enumerate(REWARDS)
    ]


def _score(settings: ScoringSettings, seed: int = 0):
    def forward(role, batch):
        raise AssertionError(f"no forward pass is needed, got {role}")

    metrics: dict = {}
    batch = Scoring(settings, AlgorithmConfig(), 0, set(), forward).batch(_rollouts(), metrics, seed=seed)
    return batch, metrics


def test_pf_ppo_draws_the_scored_rows_again_by_reward():
    plain, _ = _score(_settings())
    drawn, metrics = _score(_settings(pf_ppo="max_min"), seed=3)
    assert drawn.rows == plain.rows == len(REWARDS)
    ids = drawn.input_ids[:, -4].tolist()  # the prompt's token, left of the 3 response tokens
    assert {REWARDS[i - 100] for i in ids} <= {0.0, 1.0}  # max_min: only the highest and lowest rewards are drawn
    assert metrics["pf_ppo/distinct_rows_fraction"] < 1
    for row, i in enumerate(ids):  # each drawn row carries its own advantage, computed before the draw
        assert torch.equal(drawn.advantages[row], plain.advantages[i - 100])
        assert int(drawn.group[row]) == (i - 100) // 3
    again, _ = _score(_settings(pf_ppo="max_min"), seed=3)
    assert torch.equal(again.input_ids, drawn.input_ids)  # seeded: a resumed step draws the same rows

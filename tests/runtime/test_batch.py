"""The typed training batch: what the rollouts give, what phases add, and how rows are taken from it."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.batch import Rollout, TrainBatch, mini_batches, shards, to_batch  # noqa: E402

PAD = 0
ROLLOUTS = [Rollout([5, 6], [7, 8, 9], [-0.1, -0.2, -0.3], "stop", 1.0, group=g) for g in (0, 0, 1, 1)]


def test_the_rollouts_fill_the_required_fields_and_no_phase_has_run_yet():
    b = to_batch(ROLLOUTS, PAD)
    assert isinstance(b, TrainBatch) and (b.rows, b.real_rows, b.prompt_len) == (4, 4, 2)
    for name in ("old_logprobs", "ref_logprobs", "old_values", "is_weight", "advantages", "returns"):
        assert getattr(b, name) is None, name


def test_selecting_rows_takes_every_tensor_present_and_keeps_the_absent_ones_absent():
    b = to_batch(ROLLOUTS, PAD)
    b.advantages = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    picked = b.select(torch.tensor([1, 3]))
    assert picked.group.tolist() == [0, 1] and picked.advantages[:, 0].tolist() == [3.0, 9.0]
    assert picked.ref_logprobs is None and picked.prompt_len == b.prompt_len
    assert [s.advantages[:, 0].tolist() for s in shards(b, 2)] == [[0.0, 3.0], [6.0, 9.0]]
    assert [m.rows for m in mini_batches(b, 3)] == [3, 1]


def test_the_fields_are_the_contract():
    # A phase's output has a field of its own: a misspelt one is an error, not a key nobody reads.
    with pytest.raises(TypeError):
        dataclasses.replace(to_batch(ROLLOUTS, PAD), old_log_probs=torch.zeros(4, 3))


def test_a_multi_turn_rollout_brings_its_own_loss_mask_and_turn_rewards():
    turns = Rollout([5], [7, 8, 3, 3, 9], [-0.1, -0.2, 0.0, 0.0, -0.5], "stop", 1.5, group=0,
                    loss_mask=[1.0, 1.0, 0.0, 0.0, 1.0], token_rewards=[0.0, 0.5, 0.0, 0.0, 1.0])  # fmt: skip
    b = to_batch([turns, ROLLOUTS[0]], PAD)
    assert b.loss_mask.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0, 0.0]]
    assert b.token_rewards.tolist() == [[0.0, 0.5, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0, 0.0]]
    truncated = dataclasses.replace(turns, finish_reason="length")
    assert to_batch([truncated], PAD, mask_truncated=True).loss_mask.sum() == 0  # overlong filtering masks it all


def test_step_wise_mini_batches_take_whole_prompts_and_padding_rows_do_not_train():
    from rlc.runtime.batch import group_mini_batches, pad_rows

    steps = [Rollout([5], [7], None, "stop", 0.0, group=g) for g in (0, 0, 0, 1, 2, 2, 3)]
    b = to_batch(steps, PAD)
    assert [m.group.tolist() for m in group_mini_batches(b, 2)] == [[0, 0, 0, 1], [2, 2, 3]]
    padded = pad_rows(group_mini_batches(b, 2)[1], 2)
    assert (padded.rows, padded.padding_rows, padded.real_rows) == (4, 1, 3)
    assert padded.loss_mask[:, 0].tolist() == [1.0, 1.0, 1.0, 0.0]
    assert pad_rows(b, 7) is b


def test_step_wise_rows_share_their_trajectorys_advantage():
    from rlc.runtime.algorithms.advantages import broadcast_to_steps

    per_trajectory = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    last_step = torch.tensor([False, False, True, True])  # trajectory 0 took three turns, 1 took one
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert broadcast_to_steps(per_trajectory, last_step, mask).tolist() == [
        [2.0, 0.0, 0.0], [2.0, 2.0, 0.0], [2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]
    ]  # fmt: skip

"""Micro-batches cut by a token budget, and each in its narrowest padded layout."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.batch import Rollout, to_batch  # noqa: E402
from rlc.runtime.workers.micro_batches import by_tokens, inert, lengths, trimmed, widened  # noqa: E402


def _rollouts(shape: list[tuple[int, int]]) -> list[Rollout]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i, (p, r) in enumerate(shape):
        ids = torch.randint(3, 50, (p + r,), generator=g).tolist()
        out.append(Rollout(ids[:p], ids[p:], [-0.5] * r, "stop", float(i), group=i))
    return out


SHAPES = [(3, 9), (7, 1), (2, 2), (7, 12), (5, 5), (1, 1), (6, 3), (4, 8)]


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("budget", [1, 10, 20, 33, 1000])
def test_every_row_lands_in_one_micro_batch_within_the_budget(packed, budget):
    prompts, responses = [p for p, _ in SHAPES], [r for _, r in SHAPES]
    bins = by_tokens(prompts, responses, budget, packed)
    assert sorted(i for rows in bins for i in rows) == list(range(len(SHAPES)))
    for rows in bins:
        assert rows == sorted(rows)
        ps, rs = [prompts[i] for i in rows], [responses[i] for i in rows]
        tokens = sum(ps) + sum(rs) if packed else len(rows) * (max(ps) + max(rs))
        assert tokens <= budget or len(rows) == 1  # a row longer than the budget runs alone
    if budget >= 1000:
        assert len(bins) == 1
    if budget == 1:
        assert len(bins) == len(SHAPES)


def test_a_padded_budget_groups_rows_of_like_length():
    """Padded, a micro-batch costs rows x its widest row: the long rows go together, the short ones together."""
    assert by_tokens([10, 1, 10, 1], [10, 1, 10, 1], 40, packed=False) == [[0, 2], [1, 3]]
    assert by_tokens([10, 1, 10, 1], [10, 1, 10, 1], 40, packed=True) == [[0, 2], [1, 3]]
    assert by_tokens([10, 1, 10, 1], [10, 1, 10, 1], 44, packed=True) == [[0, 1, 2, 3]]
    assert by_tokens([10, 1, 10, 1], [10, 1, 10, 1], 44, packed=False) == [[0, 2], [1, 3]]


def test_trimmed_keeps_every_real_token_in_its_place():
    batch = to_batch(_rollouts(SHAPES), pad_id=0)
    batch.advantages = torch.randn(batch.response_ids.shape)
    rows = batch.select(torch.tensor([2, 5, 6]))  # prompts of 2, 1, 6 tokens; responses of 2, 1, 3
    small = trimmed(rows)
    assert small.prompt_len == 6 and small.response_ids.shape == (3, 3) and small.input_ids.shape == (3, 9)
    assert lengths(small) == lengths(rows)
    for i in range(3):
        real, narrow = rows.attention_mask[i].bool(), small.attention_mask[i].bool()
        assert rows.input_ids[i][real].tolist() == small.input_ids[i][narrow].tolist()
    for name in ("response_ids", "loss_mask", "advantages", "rollout_logprobs", "token_rewards"):
        assert torch.equal(getattr(small, name), getattr(rows, name)[:, :3]), name
    assert torch.equal(widened(small.loss_mask, rows.loss_mask.shape[1]), rows.loss_mask)
    assert trimmed(small) is small  # already as narrow as it gets


def test_an_inert_micro_batch_is_the_shortest_row_without_loss():
    batch = to_batch(_rollouts(SHAPES), pad_id=0)
    row = inert(batch)
    assert row.rows == 1 and int(row.group) == 5
    assert float(row.loss_mask.sum()) == 0.0

"""Each step's prompts (rlc.runtime.rollouts.Synchronous): SkyRL's hybrid environment sampling gives every batch its
minimum of each environment's rows."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")  # rlc.runtime.rollouts hands out rlc.runtime.batch's rows

from rlc.runtime.rollouts import Synchronous, environment_of, hybrid_plan  # noqa: E402
from rlc.runtime.run_error import RunError  # noqa: E402


def _rows(sizes: dict[str, int]) -> list[tuple[dict, list[int]]]:
    """Rows of each environment: named by data_source for some, by env_class for the others, as datasets mix."""
    rows = []
    for env, size in sizes.items():
        key = "data_source" if env.startswith("src") else "env_class"
        rows += [({key: env, "id": f"{env}-{i}"}, [i]) for i in range(size)]
    return rows


def _source(train, batch_size, min_per_env, seed=7):
    steps, min_per_env = hybrid_plan(train, batch_size, min_per_env)
    return steps, Synchronous(train, batch_size, steps, seed, checked=lambda r, s: r, min_per_env=min_per_env)


def test_every_hybrid_batch_holds_the_minimum_of_each_environment():
    train = _rows({"src-large": 70, "gsm8k": 20, "src-small": 6})
    steps, source = _source(train, batch_size=10, min_per_env=2)
    assert steps == 3  # the smallest environment fills its minimum 3 times
    seen = []
    for epoch in range(2):
        for step in range(1 + epoch * steps, 1 + (epoch + 1) * steps):
            batch = source.rows_for(step)
            counts = Counter(environment_of(row) for row, _ in batch)
            assert len(batch) == 10 and min(counts.values()) >= 2 and set(counts) == {"src-large", "gsm8k", "src-small"}
            if epoch == 0:
                seen += [row["id"] for row, _ in batch]
    assert len(seen) == len(set(seen))  # no row twice in an epoch
    # the places left over go mostly to the large environment, by its share of the data
    drawn = Counter(row_id.rsplit("-", 1)[0] for row_id in seen)
    assert drawn["src-large"] > drawn["gsm8k"] >= 6 and drawn["src-small"] == 6, drawn
    assert source.rows_for(2) == source.rows_for(2)  # a resumed run picks the same rows
    assert [r["id"] for r, _ in source.rows_for(1)] != [r["id"] for r, _ in source.rows_for(1 + steps)]


def test_a_minimum_the_batch_cannot_hold_is_lowered_and_impossible_ones_are_refused(capsys):
    train = _rows({"a": 30, "b": 30, "c": 30})
    assert hybrid_plan(train, 7, 3) == (12, 2)  # 3 x 3 > 7: two of each, as SkyRL lowers it
    assert "each batch takes 2 row(s)" in capsys.readouterr().out
    with pytest.raises(RunError, match="3 environments cannot each have a row"):
        hybrid_plan(train, 2, 1)
    with pytest.raises(RunError, match="'d' has 1 training row"):
        hybrid_plan(_rows({"a": 30, "d": 1}), 4, 2)


@pytest.mark.parametrize("seed", range(20))
def test_no_draw_spends_the_rows_a_later_batch_needs(seed):
    """An environment with just its minimums' rows (and a spare one) keeps a row for every batch, whatever the
    draws; SkyRL's own sampler can spend them early."""
    train = _rows({"src-large": 12, "src-small": 5})
    steps, source = _source(train, batch_size=4, min_per_env=1, seed=seed)
    assert steps == 4
    for step in range(1, steps + 1):
        assert Counter(environment_of(row) for row, _ in source.rows_for(step))["src-small"] >= 1

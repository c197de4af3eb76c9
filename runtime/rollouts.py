"""Where a training step's rollouts come from: two sources behind one interface, `batch_for(step)` giving the
step's rows, their rollouts (None: the step generates them itself, as dynamic sampling may draw more) and their
staleness (None when generation does not run ahead), and `close()`.

`Synchronous` hands out each step's prompts; `Ahead` (fully async) generates later steps' batches while the trainer
trains. `RayEngines` is the fan-out of one generation call over the job's engine actors.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlc.core.job import AheadSettings, Sampling, seed_for
from rlc.runtime.batch import Rollout
from rlc.runtime.generator import Generator

Rows = list[tuple[dict, list[int]]]  # (dataset row, prompt token ids)


class RayEngines:
    """The generator's engines: the job's engine actors, each given the prompts of its share of the groups.

    Group g of `count` goes to engine g // ceil(count / engines), so a trajectory's turns all reach the engine
    that holds its cached prefix, and the first turn's split (and every engine call's seed, from step, draw and
    turn) is what single-turn rollouts have always used."""

    def __init__(self, ray, engines: list, seed: int):
        self.ray, self.engines, self.seed = ray, engines, seed

    def submit(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        n: int,
        key: tuple[int, int, int],
        groups: list[int],
        count: int,
    ) -> tuple[list, list[list[int]]]:
        step, draw, turn = key
        per = -(-count // len(self.engines))
        shares: list[list[int]] = [[] for _ in self.engines]
        for i, g in enumerate(groups):
            shares[min(g // per, len(self.engines) - 1)].append(i)
        refs = [
            e.generate.remote(
                [prompts[i] for i in share], sampling, n, seed_for(self.seed, step, k + 1000 * draw + 100_000 * turn)
            )
            for k, (e, share) in enumerate(zip(self.engines, shares))
            if share
        ]
        return refs, [share for share in shares if share]

    def result(self, handle: tuple[list, list[list[int]]]) -> list[list]:
        refs, shares = handle
        out: list = [None] * sum(len(s) for s in shares)
        for ref, share in zip(refs, shares):
            for i, completions in zip(share, self.ray.get(ref)):
                out[i] = completions
        return out


class Synchronous:
    """Each step's prompts, generated when the step runs: its slice of the epoch's seeded order (so a resumed run
    picks the same ones)."""

    def __init__(self, train: Rows, batch_size: int, steps_per_epoch: int, seed: int, checked: Callable):
        self.train, self.size, self.steps_per_epoch, self.seed = train, batch_size, steps_per_epoch, seed
        self.checked = checked  # (rollouts, step) -> rollouts: numbered into groups, failures noted

    def rows_for(self, step: int) -> Rows:
        epoch, offset = divmod(step - 1, self.steps_per_epoch)
        order = list(range(len(self.train)))
        random.Random(self.seed * 131 + epoch).shuffle(order)
        return [self.train[i] for i in order[offset * self.size : (offset + 1) * self.size]]

    def batch_for(self, step: int) -> tuple[Rows, list[Rollout] | None, int | None]:
        return self.rows_for(step), None, None

    def close(self) -> None:
        """Nothing runs in the background."""


class Ahead:
    """Fully async generation: batches for later steps are generated while the trainer trains.

    A batch is dispatched with the engines' current weights (version v = steps trained so far) and
    trained at step s, so its staleness is s - 1 - v; batches are dispatched only while that stays at
    most `max_staleness_steps`, and at most `num_parallel_generation_workers // train_batch_size` of
    them (at least one) are in flight. An engine runs its calls in order, so the weight update queued
    after a training step reaches it after the batches dispatched before. A batch's first turn is
    dispatched here; its environments and later turns run on a thread of their own meanwhile (a multi-turn
    trajectory's later turns may then use newer weights than its first).
    """

    def __init__(self, source: Synchronous, generator: Generator, settings: AheadSettings, total_steps: int):
        self.source, self.generator, self.total = source, generator, total_steps
        t = settings
        self.staleness = t.max_staleness_steps
        self.in_flight = max(1, min(self.staleness + 1, t.num_parallel_generation_workers // t.train_batch_size))
        self.sampling, self.n = t.sampling, t.n_samples_per_prompt
        self.pending: dict[int, tuple[int, list, Any]] = {}  # step -> (weights version, rows, future rollouts)
        self.next: int | None = None
        self.threads = ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="rlc-ahead")

    def batch_for(self, step: int):
        """Rows, rollouts and staleness of `step`'s batch; tops up the batches in flight first."""
        generator = self.generator
        version = step - 1  # weights the engines hold once the previous step's sync has run
        n = step if self.next is None else self.next
        while n <= self.total and len(self.pending) < self.in_flight and n - 1 - version <= self.staleness:
            rows = self.source.rows_for(n)
            started = generator.start(rows, self.sampling, self.n, (n, 0))
            self.pending[n] = (version, rows, self.threads.submit(generator.finish, started))
            n += 1
        self.next = n
        dispatched, rows, future = self.pending.pop(step)
        return rows, self.source.checked(future.result(), step), step - 1 - dispatched

    def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)

"""Where a training step's rollouts come from: two sources behind one interface, `batch_for(step)` giving the
step's rows, their rollouts (None: the step generates them itself, as dynamic sampling may draw more) and their
staleness (None when generation does not run ahead), and `close()`.

`Synchronous` hands out each step's prompts; `Ahead` (fully async) generates later steps' batches while the trainer
trains. `RayEngines` is the fan-out of one generation call over the job's engine actors, `PrefillDecodeEngines` the
same over prefill and decode engines.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rlc.core.job import AheadSettings, Sampling, seed_for
from rlc.runtime.batch import Rollout
from rlc.runtime.generator import Generator
from rlc.runtime.run_error import RunError

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
        kv_transfer: list[list] | None = None,
    ) -> tuple[list, list[list[int]]]:
        step, draw, turn = key
        shares = self._shares(groups, count)
        refs = [
            e.generate.remote(
                [prompts[i] for i in share],
                sampling,
                n,
                seed_for(self.seed, step, k + 1000 * draw + 100_000 * turn),
                *(([kv_transfer[i] for i in share],) if kv_transfer is not None else ()),
            )
            for k, (e, share) in enumerate(zip(self.engines, shares))
            if share
        ]
        return refs, [share for share in shares if share]

    def submit_prefill(self, prompts: list[list[int]], n: int, groups: list[int], count: int):
        """Prefill engines: each prompt's `n` samples prefilled, their KV cache held for the decode engines."""
        shares = self._shares(groups, count)
        refs = [e.prefill.remote([prompts[i] for i in share], n) for e, share in zip(self.engines, shares) if share]
        return refs, [share for share in shares if share]

    def _shares(self, groups: list[int], count: int) -> list[list[int]]:
        per = -(-count // len(self.engines))
        shares: list[list[int]] = [[] for _ in self.engines]
        for i, g in enumerate(groups):
            shares[min(g // per, len(self.engines) - 1)].append(i)
        return shares

    def result(self, handle: tuple[list, list[list[int]]]) -> list[list]:
        refs, shares = handle
        out: list = [None] * sum(len(s) for s in shares)
        for ref, share in zip(refs, shares):
            for i, completions in zip(share, self.ray.get(ref)):
                out[i] = completions
        return out


class PrefillDecodeEngines:
    """The generator's engines split into prefill and decode engines (generator.inference_engine.enable_pd), routed
    as SkyRL's router routes them: each sample is prefilled on a prefill engine, then decoded on a decode engine that
    takes its KV cache over through vLLM's KV connector (given what the prefill handed back, where the connector
    needs it). Each side splits a call's groups over its engines as `RayEngines` does."""

    def __init__(self, ray, prefill: list, decode: list, seed: int):
        self.prefill, self.decode = RayEngines(ray, prefill, seed), RayEngines(ray, decode, seed)

    def submit(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        n: int,
        key: tuple[int, int, int],
        groups: list[int],
        count: int,
    ) -> tuple:
        return (prompts, sampling, n, key, groups, count), self.prefill.submit_prefill(prompts, n, groups, count)

    def result(self, handle: tuple) -> list[list]:
        (prompts, sampling, n, key, groups, count), prefilled = handle
        transfers = self.prefill.result(prefilled)
        return self.decode.result(self.decode.submit(prompts, sampling, n, key, groups, count, transfers))


def job_engines(ray, engines: list, pd_roles: tuple[str, ...], seed: int) -> RayEngines | PrefillDecodeEngines:
    """The generator's engines: split into prefill and decode engines by their roles (`VLLMArgs.pd_roles`, in the
    plan's engine order), else all alike."""
    if not pd_roles:
        return RayEngines(ray, engines, seed)
    by_role = {r: [e for e, role in zip(engines, pd_roles) if role == r] for r in ("prefill", "decode")}
    return PrefillDecodeEngines(ray, by_role["prefill"], by_role["decode"], seed)


def environment_of(row: dict) -> str:
    """The environment a row counts for in hybrid sampling: its data_source, else its env_class (as SkyRL groups)."""
    return str(row.get("data_source") or row.get("env_class") or "")


def hybrid_batch_count(environments: list[str], batch_size: int, min_per_env: int) -> int:
    """Batches of an epoch under hybrid sampling: as many as the smallest environment fills with its minimum, and
    the data with whole batches."""
    sizes = Counter(environments)
    return min(min(n // min_per_env for n in sizes.values()), len(environments) // batch_size)


def hybrid_plan(train: Rows, batch_size: int, min_per_env: int) -> tuple[int, int]:
    """(batches per epoch, rows of each environment per batch) of hybrid sampling over `train`. As SkyRL, a minimum
    the batch cannot hold for every environment is lowered to batch_size // environments; more environments than
    rows in a batch, or an environment too small for one batch, is a RunError."""
    environments = [environment_of(row) for row, _ in train]
    count = len(set(environments))
    if count > batch_size:
        raise RunError(
            f"hybrid environment sampling: {count} environments cannot each have a row in a batch of "
            f"train_batch_size={batch_size}; raise train_batch_size or turn trainer.use_hybrid_env_sampling off"
        )
    if count * min_per_env > batch_size:
        lowered = batch_size // count
        print(
            f"rlc: hybrid environment sampling: {count} environments x min_samples_per_env={min_per_env} do not fit "
            f"a batch of {batch_size}; each batch takes {lowered} row(s) of each environment",
            flush=True,
        )
        min_per_env = lowered
    batches = hybrid_batch_count(environments, batch_size, min_per_env)
    if batches == 0:
        smallest = min(Counter(environments).items(), key=lambda item: item[1])
        raise RunError(
            f"hybrid environment sampling: environment {smallest[0] or '(the default)'!r} has {smallest[1]} "
            f"training row(s), fewer than min_samples_per_env={min_per_env}: no batch can be drawn"
        )
    return batches, min_per_env


def hybrid_env_batches(environments: list[str], batch_size: int, min_per_env: int, rng: random.Random) -> list:
    """An epoch's batches (lists of row indices) under SkyRL's hybrid environment sampling: each batch takes
    `min_per_env` rows of every environment, then fills its other places one row at a time from an environment
    drawn by its share of the data (among those with rows left beyond the later batches' minimums); each
    environment's rows come in a shuffled order and each batch is shuffled. The caller makes sure the minimums fit
    in a batch (hybrid_plan)."""
    by_env: dict[str, list[int]] = {}
    for i, env in enumerate(environments):
        by_env.setdefault(env, []).append(i)
    share = {env: len(rows) / len(environments) for env, rows in by_env.items()}
    for rows in by_env.values():
        rng.shuffle(rows)
    batches = []
    count = hybrid_batch_count(environments, batch_size, min_per_env)
    for n in range(count):
        batch = [by_env[env].pop() for env in by_env for _ in range(min_per_env)]
        # the later batches' minimums stay reserved (SkyRL's sampler may spend them, and a later batch then lacks
        # an environment)
        reserved = min_per_env * (count - 1 - n)
        while len(batch) < batch_size:
            left = [env for env in by_env if len(by_env[env]) > reserved]
            batch.append(by_env[rng.choices(left, weights=[share[env] for env in left])[0]].pop())
        rng.shuffle(batch)
        batches.append(batch)
    return batches


class Synchronous:
    """Each step's prompts, generated when the step runs: its slice of the epoch's seeded order (so a resumed run
    picks the same ones), or with `min_per_env` its batch of the epoch's hybrid environment sampling."""

    def __init__(
        self,
        train: Rows,
        batch_size: int,
        steps_per_epoch: int,
        seed: int,
        checked: Callable,
        min_per_env: int | None = None,
    ):
        self.train, self.size, self.steps_per_epoch, self.seed = train, batch_size, steps_per_epoch, seed
        self.checked = checked  # (rollouts, step) -> rollouts: numbered into groups, failures noted
        self.min_per_env = min_per_env
        self.epoch_batches: tuple[int, list] | None = None  # (epoch, its hybrid batches), the last one drawn

    def rows_for(self, step: int) -> Rows:
        epoch, offset = divmod(step - 1, self.steps_per_epoch)
        rng = random.Random(self.seed * 131 + epoch)
        if self.min_per_env is not None:
            if self.epoch_batches is None or self.epoch_batches[0] != epoch:
                environments = [environment_of(row) for row, _ in self.train]
                self.epoch_batches = (epoch, hybrid_env_batches(environments, self.size, self.min_per_env, rng))
            return [self.train[i] for i in self.epoch_batches[1][offset]]
        order = list(range(len(self.train)))
        rng.shuffle(order)
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

"""Which samples train: the zero-variance filter (`trainer.algorithm.zero_variance_filter`) and
dynamic sampling (`trainer.algorithm.dynamic_sampling`, DAPO's filter and POLARIS's replace).

A group is the samples of one prompt, given as a (batch,) tensor of group ids. A group whose rewards
are all equal has zero GRPO advantage, so it carries no learning signal.
"""

from __future__ import annotations

import torch
from rlc.core import algorithms
from rlc.runtime.batch import TrainBatch

DYNAMIC_SAMPLING_TYPES = ("filter", "replace")


def zero_variance_groups(
    rewards: torch.Tensor,
    group: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    tol: float = 1e-6,
) -> torch.Tensor:
    """(batch,) bool: True for every sample of a group with more than one live sample whose live
    rewards all lie within `tol` of each other.

    `rewards` are per-sample scalars. A sample is live when its row of `mask` (the loss mask) has a
    token, or always without `mask`; a group with one live sample is never flagged. `tol` defaults
    to SkyRL's `zero_variance_filter_tol`; 0 asks for exact equality.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be one scalar per sample, got shape {tuple(rewards.shape)}")
    if group.shape != rewards.shape:
        raise ValueError(f"group has shape {tuple(group.shape)} for rewards of shape {tuple(rewards.shape)}")
    ids = torch.unique(group, return_inverse=True)[1]
    n_groups = int(ids.max()) + 1 if ids.numel() else 0
    live = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool().any(dim=-1)
    values = rewards.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.long, device=ids.device).index_add(0, ids, live.long())
    inf = torch.full((n_groups,), torch.inf, dtype=torch.float64, device=ids.device)
    high = (-inf).scatter_reduce(0, ids, torch.where(live, values, -torch.inf), "amax")
    low = inf.scatter_reduce(0, ids, torch.where(live, values, torch.inf), "amin")
    flat = (count > 1) & (high - low <= tol)
    return flat[ids]


def inert_rows(batch: TrainBatch, algorithm) -> torch.Tensor | None:
    """(rows,) bool: rows whose policy loss and gradient are exactly zero, or None where the objective has a
    term that every row feeds (a KL or entropy loss, or a loss whose card is not advantage_weighted).

    A row is inert when each of its tokens is out of the loss mask or has advantage 0: a GRPO group whose
    rewards are all equal, say (every sample right, or every one wrong).
    """
    a = algorithm
    if not algorithms.policy_loss(a.policy_loss_type).advantage_weighted:
        return None
    if (a.use_kl_loss and batch.ref_logprobs is not None) or (a.use_entropy_loss and a.entropy_loss_coef != 0):
        return None
    assert batch.advantages is not None, "advantages are computed before the updates"
    return ~((batch.advantages != 0) & batch.loss_mask.bool()).any(dim=-1)


def rows_that_train(batch: TrainBatch, totals: dict, algorithm, ranks: int) -> tuple[TrainBatch, dict, int]:
    """The mini-batch without its inert rows (`inert_rows`), the totals to train it with, and how many rows
    were left out.

    The totals keep the whole mini-batch's token and sequence counts, which weight every token's loss, so the
    loss and gradient are exactly those of the whole mini-batch; `trained_tokens` counts the tokens that run,
    over which the loss metrics (entropy, clip fraction, ...) are then means. Enough inert rows stay for every
    one of `ranks` data-parallel ranks to get the same number, at least one (they add nothing).
    """
    inert = inert_rows(batch, algorithm)
    rows = batch.rows
    if inert is None or not bool(inert.any()):
        return batch, totals, 0
    keep = torch.nonzero(~inert).flatten()
    short = max(ranks, -(-keep.numel() // ranks) * ranks) - keep.numel()
    if short:
        keep = torch.cat([keep, torch.nonzero(inert).flatten()[:short]]).sort().values
    if keep.numel() >= rows:
        return batch, totals, 0
    trained = batch.select(keep)
    return trained, {**totals, "trained_tokens": float(trained.loss_mask.sum())}, rows - keep.numel()


def _sample_rewards(rewards: torch.Tensor) -> torch.Tensor:
    """Per-sample reward: the scalar itself, or the sum of per-token rewards."""
    return rewards.sum(dim=-1) if rewards.dim() == 2 else rewards


def _groups_in_order(group: torch.Tensor) -> list[list[int]]:
    """Rows of each group, groups in order of first appearance, rows ascending."""
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(group.tolist()):
        rows.setdefault(g, []).append(i)
    return list(rows.values())


class DynamicSampler:
    """Collects the generated batches of one training step until dynamic sampling lets it train.

    A group is good when its rewards are not all equal (exactly) or it holds a single sample.
    - filter (DAPO): drop the other groups and keep generating until `target_groups` good groups are
      collected over the batches added; the step trains on the first `target_groups` of them.
    - replace (POLARIS): each batch is judged on its own. When good groups are more than
      `min_replace_ratio` of its groups, every other group's rows are overwritten by the rows of a
      good group, drawn without repeats while there are enough good groups and with repeats
      otherwise (seeded `torch.Generator`); else the batch is discarded and another one is needed.
    When the `max_sample_batches`-th batch still leaves the step short, `add` raises RuntimeError, as
    SkyRL does; `max_sample_batches` <= 0 (spec: -1) never stops. `reset()` starts the next step.
    """

    def __init__(
        self,
        kind: str,
        target_groups: int | None = None,
        *,
        max_sample_batches: int = 30,
        min_replace_ratio: float = 0.3,
        seed: int = 0,
    ):
        if kind not in DYNAMIC_SAMPLING_TYPES:
            expected = ", ".join(DYNAMIC_SAMPLING_TYPES)
            raise ValueError(f"unknown dynamic sampling type {kind!r}; expected one of {expected}")
        if kind == "filter" and (target_groups is None or target_groups < 1):
            raise ValueError(f"filter sampling needs target_groups >= 1, got {target_groups}")
        self.kind = kind
        self.target_groups = target_groups
        self.max_sample_batches = max_sample_batches
        self.min_replace_ratio = min_replace_ratio
        # Not reseeded by reset(), so successive steps draw different replacements.
        self._generator = torch.Generator().manual_seed(seed)
        self.reset()

    @classmethod
    def from_config(cls, dynamic_sampling, target_groups: int, *, seed: int = 0) -> DynamicSampler:
        """A sampler for the spec's `trainer.algorithm.dynamic_sampling` section (its `type` must be set)."""
        return cls(
            dynamic_sampling.type,
            target_groups,
            max_sample_batches=dynamic_sampling.max_sample_batches,
            min_replace_ratio=dynamic_sampling.min_replace_ratio,
            seed=seed,
        )

    def reset(self) -> None:
        """Forget the batches added so far."""
        self._batches = 0
        self._rows_added = 0
        self._good: list[list[int]] = []  # filter: rows (over everything added) of each good group
        self._rows: list[int] | None = None
        self._zero_variance = 0
        self._kept = 0
        self._replaced = 0

    def add(self, rewards: torch.Tensor, group: torch.Tensor) -> bool:
        """Take one generated batch: per-sample rewards ((batch,), or (batch, len) summed) and group ids.

        Returns True when the step can train on `indices()`, False when another batch is needed.
        """
        if self._rows is not None:
            raise RuntimeError("this step's batch is complete; call reset() before adding another")
        rewards = _sample_rewards(rewards)
        offset = self._rows_added
        self._batches += 1
        self._rows_added += rewards.shape[0]
        flat = zero_variance_groups(rewards, group, tol=0.0)
        groups = _groups_in_order(group)
        good = [rows for rows in groups if not flat[rows[0]]]
        bad = [rows for rows in groups if flat[rows[0]]]
        self._zero_variance += len(bad)
        if self.kind == "filter":
            assert self.target_groups is not None  # __init__ refuses a filter without it
            self._good += [[offset + i for i in rows] for rows in good]
            if len(self._good) >= self.target_groups:
                chosen = self._good[: self.target_groups]
                self._kept = len(chosen)
                self._rows = sorted(i for rows in chosen for i in rows)
        elif len(good) > len(groups) * self.min_replace_ratio:
            self._rows = self._replace(good, bad, offset, rewards.shape[0])
            self._kept, self._replaced = len(good), len(bad)
        if self._rows is not None:
            return True
        if self.max_sample_batches > 0 and self._batches >= self.max_sample_batches:
            raise RuntimeError(
                f"dynamic sampling ({self.kind}) still lacks enough groups with varied rewards after "
                f"{self._batches} batches (max_sample_batches); check the difficulty of the prompts"
            )
        return False

    def _replace(self, good: list[list[int]], bad: list[list[int]], offset: int, size: int) -> list[int]:
        if len(good) >= len(bad):
            picks = torch.randperm(len(good), generator=self._generator)[: len(bad)]
        else:
            picks = torch.randint(len(good), (len(bad),), generator=self._generator)
        rows = list(range(size))
        # Bad rows, in order, take the rows of the picked good groups, in order (as SkyRL pairs them).
        targets = [i for group_rows in bad for i in group_rows]
        sources = [i for p in picks.tolist() for i in good[p]]
        for target, source in zip(targets, sources):
            rows[target] = source
        return [offset + i for i in rows]

    @property
    def ready(self) -> bool:
        return self._rows is not None

    def indices(self) -> torch.Tensor:
        """(rows,) long: rows of the training batch, as indices into every batch added since reset, concatenated."""
        if self._rows is None:
            raise RuntimeError("dynamic sampling has not collected a full batch yet")
        return torch.tensor(self._rows, dtype=torch.long)

    def metrics(self) -> dict[str, int]:
        """Counts so far this step: batches generated, zero-variance groups seen, groups kept, groups replaced."""
        return {
            "dynamic_sampling/sample_batches": self._batches,
            "dynamic_sampling/zero_variance_groups": self._zero_variance,
            "dynamic_sampling/kept_groups": self._kept,
            "dynamic_sampling/replaced_groups": self._replaced,
        }

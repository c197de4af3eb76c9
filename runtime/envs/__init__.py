"""rlc's own scorers: turn a dataset row into a prompt and score one completion of it.

The runtime steps them as SkyRL-Gym environments (`rlc.runtime.envs.gym`, ids `arithmetic` and `synthetic`),
beside skyrl-gym's own; the benchmark's peer scores with them directly. Kept free of heavy imports.
"""

from __future__ import annotations

from pkgutil import resolve_name
from typing import Protocol

from rlc.core.environments import ENVIRONMENTS


class Environment(Protocol):
    name: str

    def prompt(self, row: dict) -> str | list[dict]:
        """The text the model continues, or chat messages (they go through the tokenizer's chat template)."""

    def reward(self, row: dict, response: str, finished: bool) -> float:
        """Score of one completion; `finished` is False when it ran out of tokens before EOS."""


def correct(env: Environment, row: dict, response: str, reward: float) -> bool:
    """Whether a completion is right, for the eval accuracy: the environment's own `correct` when it has one, else a
    reward of at least 1."""
    judge = getattr(env, "correct", None)
    return bool(judge(row, response)) if judge is not None else reward >= 1.0


# rlc's scorers by environment id, from the table of built-in environments (`rlc.core.environments`).
SCORERS = {env.id: env.scorer for env in ENVIRONMENTS if env.scorer is not None}


def make(name: str) -> Environment:
    """A fresh scorer of the environment `name`."""
    if name not in SCORERS:
        raise ValueError(f"unknown environment {name!r}; rlc has {', '.join(sorted(SCORERS))}")
    return resolve_name(SCORERS[name])()

"""rlc's own scorers: turn a dataset row into a prompt and score one completion of it.

The runtime steps them as SkyRL-Gym environments (`rlc.runtime.envs.gym`, ids `arithmetic` and `synthetic`),
beside skyrl-gym's own; the benchmark's peer scores with them directly. Kept free of heavy imports.
"""

from __future__ import annotations

from typing import Protocol


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


BUILTIN = ("arithmetic", "synthetic")  # the scorers; the environment ids are core.runtime_facts.BUILTIN_ENVS


def make(name: str) -> Environment:
    if name == "arithmetic":
        from rlc.runtime.envs.arithmetic import Arithmetic

        return Arithmetic()
    if name == "synthetic":
        from rlc.runtime.envs.synthetic import CopyDigit

        return CopyDigit()
    raise ValueError(f"unknown environment {name!r}; rlc has {', '.join(BUILTIN)}")

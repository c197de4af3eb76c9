"""Environments: turn a dataset row into a prompt and score a completion.

Kept free of heavy imports so the compiler can list the built-in names. An environment is chosen by
`environment.env_class` (or a row's own `env_class` column) and sees only its own row.
"""

from __future__ import annotations

from typing import Protocol

from rlc.core.runtime_facts import BUILTIN_ENVS


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


BUILTIN = BUILTIN_ENVS


def make(name: str) -> Environment:
    if name == "arithmetic":
        from rlc.runtime.envs.arithmetic import Arithmetic

        return Arithmetic()
    if name == "gsm8k":
        from rlc.runtime.envs.gsm8k import GSM8K

        return GSM8K()
    if name == "synthetic":
        from rlc.runtime.envs.synthetic import CopyDigit

        return CopyDigit()
    raise ValueError(f"unknown environment {name!r}; rlc has {', '.join(BUILTIN)}")

"""Environments: turn a dataset row into a prompt and score a completion.

Kept free of heavy imports so the compiler can list the built-in names. An environment is chosen by
`environment.env_class` (or a row's own `env_class` column) and sees only its own row.
"""

from __future__ import annotations

from typing import Protocol


class Environment(Protocol):
    name: str

    def prompt(self, row: dict) -> str:
        """The text the model continues."""

    def reward(self, row: dict, response: str, finished: bool) -> float:
        """Score of one completion; `finished` is False when it ran out of tokens before EOS."""


BUILTIN = ("gsm8k", "synthetic")


def make(name: str) -> Environment:
    if name == "gsm8k":
        from rlc.runtime.envs.gsm8k import GSM8K

        return GSM8K()
    if name == "synthetic":
        from rlc.runtime.envs.synthetic import CopyDigit

        return CopyDigit()
    raise ValueError(f"unknown environment {name!r}; rlc has {', '.join(BUILTIN)}")

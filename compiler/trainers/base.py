"""What a trainer is to the compiler: the program a compiled job runs on the cluster, fed every value of the
resolved spec. rlc's own runtime is one; SkyRL's and verl's trainers are the others (`launch.trainer`).

A trainer other than rlc's turns the resolved spec and plan into its own command line (`TrainerCommand`: the module
`python -m` runs, its overrides, what the nodes install), and lists the rules that refuse what it lacks
(`rules`, run by the check stage only when the spec chooses it). It never touches resolve or plan.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Protocol

from rlc.core.dataclass import dataclass

if TYPE_CHECKING:
    from rlc.compiler.rules.base import Rule
    from rlc.spec.root import RlcSpec


@dataclass(frozen=True)
class TrainerCommand:
    """How the head node starts a trainer: `python -m MODULE OVERRIDE...`, after the nodes install REQUIREMENTS."""

    module: str  # e.g. skyrl.train.entrypoints.main_base
    overrides: tuple[str, ...]  # the trainer's own command-line settings, key=value, in the order given
    requirements: tuple[str, ...]  # pip requirements of the trainer's release and the extras the job needs

    def argv(self, python: str = "python3") -> list[str]:
        return [python, "-m", self.module, *self.overrides]

    def script(self, python: str = "python3") -> str:
        """The command as a bash line, one override a line, each quoted for the shell."""
        head = f"{python} -m {shlex.quote(self.module)}"
        return " \\\n  ".join([head, *(shlex.quote(w) for w in self.overrides)]) + "\n"


class Trainer(Protocol):
    name: str  # the value of launch.trainer
    release: str  # the release rlc checks its commands against (launch.trainer_version's default); "" for rlc
    summary: str  # one line: what runs (rlc explain launch.trainer, rlc plan)

    def command(self, spec: RlcSpec, plan: dict, version: str) -> TrainerCommand | None:
        """The command of the job (None: rlc's own runtime, started by the targets as before)."""
        ...

    def rules(self) -> tuple[Rule, ...]:
        """The rules that refuse, in this trainer's terms, what it does not run."""
        ...

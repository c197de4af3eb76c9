"""Trainers: the program a compiled job runs (`launch.trainer`), each fed every value of the resolved spec.

TRAINERS is every trainer: the one list the spec's accepted values (rlc.spec.launch.TRAINER_NAMES, which a test holds
equal to these names), emit (train.sh), the targets, `rlc plan` and `rlc explain launch.trainer` read. A new trainer
is a module here and one entry below, and its refusals a module of compiler/rules/ that check.RULES lists (the
trainer's `rules()` returns them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlc.compiler.trainers.base import Trainer, TrainerCommand
from rlc.compiler.trainers.rlc import RLC
from rlc.compiler.trainers.skyrl import SKYRL
from rlc.compiler.trainers.verl import VERL

if TYPE_CHECKING:
    from rlc.spec.root import RlcSpec

TRAINERS: tuple[Trainer, ...] = (RLC, SKYRL, VERL)


def trainer(name: str) -> Trainer:
    """The trainer named `name` (a value of launch.trainer)."""
    return next(t for t in TRAINERS if t.name == name)


def version_of(spec: RlcSpec) -> str:
    """The release of the spec's trainer the nodes install: launch.trainer_version, else the one rlc checks against."""
    return spec.launch.trainer_version or trainer(spec.launch.trainer).release


def command_of(spec: RlcSpec, plan: dict) -> TrainerCommand | None:
    """The command of the spec's trainer (None for rlc's runtime)."""
    return trainer(spec.launch.trainer).command(spec, plan, version_of(spec))


TRAIN_SCRIPT = "train.sh"


def train_script(spec: RlcSpec, plan: dict, source: str, digest: str) -> str | None:
    """train.sh, the head node's command for a trainer other than rlc's (None for rlc's runtime): what the targets
    run where they would run `python -m rlc.runtime run`."""
    command = command_of(spec, plan)
    if command is None:
        return None
    return (
        "#!/usr/bin/env bash\n"
        f"# The job {spec.name} on the trainer {spec.launch.trainer} {version_of(spec)} ({command.module}), generated "
        f"by rlc from {source} ({digest}).\n"
        "# Every value comes from the resolved spec; resolved.yaml beside this file says where each one came from.\n"
        "set -euo pipefail\n"
        "exec " + command.script()
    )

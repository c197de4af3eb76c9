"""rlc's own runtime as a trainer: the targets start `python -m rlc.runtime run` on the compiled job, as ever."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlc.compiler.trainers.base import TrainerCommand

if TYPE_CHECKING:
    from rlc.compiler.rules.base import Rule
    from rlc.spec.root import RlcSpec


class RlcTrainer:
    name = "rlc"
    release = ""  # the rlc that compiled the job
    summary = "rlc's runtime: FSDP2 or Megatron-Core, vLLM or hf engines, on the compiled job as it is"

    def command(self, spec: RlcSpec, plan: dict, version: str) -> TrainerCommand | None:
        return None

    def rules(self) -> tuple[Rule, ...]:
        return ()


RLC = RlcTrainer()

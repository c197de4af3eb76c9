"""The spec sections the runtime's components take whole, read once from the compiled job.

A component takes its own sub-config (STYLE.md): a training rank `trainer.<role>` with `trainer.algorithm`, the
advantage estimators, loss filters and samplers `trainer.algorithm`, an engine taking LoRA adapters the policy's
`model.lora`, the generator its share of `generator` and `environment`. The driver and placement hand these on and
act on the compiler's decisions (`job.decisions`); neither reads a spec field (tests/compiler/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlc.core.job import CompiledJob
from rlc.runtime.generator import Settings


@dataclass(frozen=True)
class Sections:
    algorithm: Any  # trainer.algorithm
    roles: dict[str, Any]  # trainer.<role>, for every role the plan places
    lora: Any  # trainer.policy.model.lora
    generator: Settings

    @staticmethod
    def of(job: CompiledJob) -> Sections:
        t = job.spec.trainer
        return Sections(
            algorithm=t.algorithm,
            roles={role.name: getattr(t, role.name) for role in job.plan.roles},
            lora=t.policy.model.lora,
            generator=Settings.from_spec(job.spec),
        )

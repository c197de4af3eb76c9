"""The spec sections the runtime's components take whole, read once from the compiled job.

A component takes its own sub-config (STYLE.md): a training rank `trainer.<role>` with `trainer.algorithm`, the
advantage estimators, loss filters and samplers `trainer.algorithm`, an engine taking LoRA adapters the policy's
`model.lora`, the environments `environment.skyrl_gym`. The driver and placement hand these on and
act on the compiler's decisions (`job.decisions`); neither reads a spec field (tests/compiler/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rlc.core.dataclass import dataclass as spec_dataclass
from rlc.core.runtime_facts import megatron_lora_expert_parameters, megatron_lora_projections
from rlc.runtime.config import CompiledJob
from rlc.spec.algorithm import AlgorithmConfig
from rlc.spec.generation import SkyRLGymConfig
from rlc.spec.training import CriticConfig, PolicyConfig, RefConfig, SkyRLLoraConfig


@dataclass(frozen=True)
class Sections:
    algorithm: AlgorithmConfig  # trainer.algorithm
    roles: dict[str, PolicyConfig | RefConfig | CriticConfig]  # trainer.<role>, for every role the plan places
    lora: SkyRLLoraConfig  # trainer.policy.model.lora
    gym: SkyRLGymConfig  # environment.skyrl_gym, which every environment takes

    @staticmethod
    def of(job: CompiledJob) -> Sections:
        t = job.spec.trainer
        return Sections(
            algorithm=t.algorithm,
            roles={role.name: getattr(t, role.name) for role in job.plan.roles},
            lora=engine_lora(t),
            gym=job.spec.environment.skyrl_gym,
        )


@spec_dataclass
class EngineLora(SkyRLLoraConfig):
    """`model.lora` plus the fused expert parameters (PEFT's target_parameters) whose every expert gets adapters."""

    target_parameters: tuple[str, ...] = ()


def engine_lora(t) -> SkyRLLoraConfig:
    """The policy's `model.lora` as the engines' PEFT adapters take it: under megatron (adapters synced unmerged)
    on the Hugging Face projections Megatron's adapted layers fuse, and on each routed expert's."""
    lora = t.policy.model.lora
    if t.strategy != "megatron" or lora.rank <= 0:
        return lora
    same = {f.name: getattr(lora, f.name) for f in fields(lora)}
    same["target_modules"] = megatron_lora_projections(lora.target_modules, lora.exclude_modules)
    same["exclude_modules"] = None
    return EngineLora(
        **same, target_parameters=megatron_lora_expert_parameters(lora.target_modules, lora.exclude_modules)
    )

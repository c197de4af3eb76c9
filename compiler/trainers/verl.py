"""verl's trainer (launch.trainer: verl): `python3 -m verl.trainer.main_ppo` with the resolved spec as its Hydra
overrides (rlc.compiler.trainers.verl_config), and the rules that refuse what verl does not run
(rlc.compiler.rules.verl_trainer)."""

from __future__ import annotations

from rlc.compiler.rules import verl_trainer
from rlc.compiler.rules.base import Rule
from rlc.compiler.trainers.base import TrainerCommand
from rlc.compiler.trainers.verl_config import MODULE, RELEASE, overrides, requirements
from rlc.spec.root import RlcSpec


class VerlTrainer:
    """verl's main_ppo, fed every value of the resolved spec."""

    name = "verl"
    release = RELEASE
    summary = f"verl's trainer (python3 -m {MODULE}, verl {RELEASE}), given every value of the spec as Hydra overrides"

    def command(self, spec: RlcSpec, plan: dict, version: str) -> TrainerCommand:
        return TrainerCommand(MODULE, overrides(spec), requirements(spec, version or RELEASE))

    def rules(self) -> tuple[Rule, ...]:
        return verl_trainer.RULES


VERL = VerlTrainer()

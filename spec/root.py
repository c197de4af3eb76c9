"""The root of spec v1: rlc's version/name/cluster/launch around SkyRL's data/trainer/generator/environment."""

from rlc.core.dataclass import dataclass
from rlc.spec.estimate import EstimateConfig
from rlc.spec.fields import section, setting
from rlc.spec.generation import DataConfig, EnvironmentConfig, GeneratorConfig
from rlc.spec.launch import ClusterConfig, LaunchConfig
from rlc.spec.training import TrainerConfig

CURRENT_VERSION = 1
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


@dataclass
class RlcSpec:
    version: int = setting(
        CURRENT_VERSION, "Spec format version; a file without it is a legacy SkyRL config.", enum=(CURRENT_VERSION,)
    )
    name: str = setting("rlc-job", "Job and cluster name: letters, digits, '.', '_' and '-'.", pattern=NAME_PATTERN)
    cluster: ClusterConfig = section(ClusterConfig, "What to run on.")
    launch: LaunchConfig = section(LaunchConfig, "How to start the job.")
    data: DataConfig = section(DataConfig, "Training and validation data.")
    trainer: TrainerConfig = section(TrainerConfig, "Training: placement, models, algorithm, checkpoints.")
    generator: GeneratorConfig = section(GeneratorConfig, "Rollout generation and inference engines.")
    environment: EnvironmentConfig = section(EnvironmentConfig, "Environment that scores rollouts.")
    estimate: EstimateConfig = section(EstimateConfig, "Assumptions of `rlc plan`'s time and cost estimate.")

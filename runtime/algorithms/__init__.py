"""Pure tensor math of RL post-training: advantage estimators, policy losses, KL estimators.

Every function takes tensors and plain numbers and returns tensors; nothing here knows about Ray,
models or configs, so the worker and driver decide what to feed in. Names follow spec v1
(`trainer.algorithm`), which follows SkyRL.
"""

from rlc.runtime.algorithms.advantages import ADVANTAGE_ESTIMATORS
from rlc.runtime.algorithms.kl import KL_ESTIMATORS
from rlc.runtime.algorithms.losses import LOSS_REDUCTIONS, POLICY_LOSSES

__all__ = ["ADVANTAGE_ESTIMATORS", "KL_ESTIMATORS", "LOSS_REDUCTIONS", "POLICY_LOSSES"]

"""SkyRL-Gym as the environment layer: every trajectory steps a `skyrl_gym.Env`, made as SkyRL makes it.

The built-in ids, each with its class, are the entries of `rlc.core.environments.ENVIRONMENTS`: skyrl-gym's own
(gsm8k, gsm8k_multi_turn, text2sql, search, lcb, aime, searchcode; rlc's sandboxed classes for the three that run
the model's code) and rlc's (`synthetic`, `arithmetic`: its scorers as single-turn environments; `calculator`, a
multi-turn tool task; `llm_as_a_judge`, SkyRL's example; `verl`). Installed packages add theirs in the
entry-point group ``rlc.environments`` (entry-point name = env id, object = the environment class, or any callable
taking ``env_config`` and ``extras``)::

    [project.entry-points."rlc.environments"]
    countdown = "my_pkg.envs:CountdownEnv"

An environment is built as SkyRL's generator builds it: ``skyrl_gym.make(env_class, env_config=
environment.skyrl_gym.<env_class> (an empty dict when there is no such section), extras=<every column of the
dataset row but prompt and env_class, plus max_turns>)``. The environments that run what the model wrote (lcb,
searchcode's python tool, text2sql's SQL) run it in rlc's sandbox (`rlc.runtime.envs.code`, `rlc.runtime.envs.sql`)
and judge it in the trainer, never in the process that runs it.
"""

from __future__ import annotations

import threading
from importlib.metadata import entry_points
from typing import Any, ClassVar

import skyrl_gym
from rlc.core.environments import ENVIRONMENTS
from rlc.runtime.envs import correct
from rlc.runtime.envs import make as make_scorer
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

ENV_GROUP = "rlc.environments"

_lock = threading.Lock()
_registered = False


class UnknownEnvironmentError(Exception):
    """An environment id no installed package registers."""


def ensure_registered() -> None:
    """Register the built-in environments (`rlc.core.environments`: rlc's classes, and skyrl-gym's own where rlc
    runs skyrl-gym's) and the installed extensions' over skyrl-gym's registry, once per process."""
    global _registered
    with _lock:
        if _registered:
            return
        builtin = {env.id: env.entry_point for env in ENVIRONMENTS}
        for env_id, entry_point in {**builtin, **_entry_points()}.items():
            if env_id in skyrl_gym.registry:
                skyrl_gym.envs.registration.deregister(env_id)
            skyrl_gym.register(id=env_id, entry_point=entry_point)
        _registered = True


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep.value for ep in entry_points(group=ENV_GROUP)}


def registered() -> list[str]:
    """Every environment id this process can make."""
    ensure_registered()
    return sorted(skyrl_gym.registry)


def env_config(gym_config: Any, env_class: str) -> Any:
    """The settings SkyRL hands an environment: `environment.skyrl_gym.<env_class>`, or an empty dict."""
    found = getattr(gym_config, env_class, None)
    return found if found is not None and not isinstance(found, (int, float, str)) else {}


def make(env_class: str, gym_config: Any, extras: dict):
    """A fresh environment of `env_class` for one trajectory."""
    ensure_registered()
    if env_class not in skyrl_gym.registry:
        raise UnknownEnvironmentError(
            f"no environment {env_class!r} is registered (rlc and skyrl-gym have {', '.join(registered())}; "
            f"a package adds one through the entry-point group {ENV_GROUP})"
        )
    return skyrl_gym.make(env_class, env_config=env_config(gym_config, env_class), extras=extras)


# -- rlc's scorers as SkyRL-Gym environments ---------------------------------------------------------------------


class _ScorerEnv(BaseTextEnv):
    """One of rlc's scorers (the reward of one completion) as a single-turn environment.

    The scorers also judge whether the completion ran into the length limit: rlc's rollouts pass that through
    `step_finished`; a plain `step` takes the completion as ended."""

    scorer: ClassVar[str]

    def __init__(self, env_config: Any = None, extras: dict | None = None):
        super().__init__()
        self.row = dict(extras or {})
        self.inner = make_scorer(self.scorer)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        return self.step_finished(action, True)

    def step_finished(self, action: str, finished: bool) -> BaseTextEnvStepOutput:
        reward = float(self.inner.reward(self.row, action, finished))
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata={})

    def correct(self, action: str) -> bool:
        """Whether the final answer is right, for the eval accuracy (the scorer's own judgement)."""
        return correct(self.inner, self.row, action, float(self.inner.reward(self.row, action, True)))


class SyntheticEnv(_ScorerEnv):
    scorer = "synthetic"


class ArithmeticEnv(_ScorerEnv):
    scorer = "arithmetic"

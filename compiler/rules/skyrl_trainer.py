"""What SkyRL's trainer does not run, refused in its terms when the spec chooses it (`launch.trainer: skyrl`).

With SkyRL's trainer the spec becomes SkyRL 0.4.0's own command line (`compiler/trainers/skyrl.py`): a setting that
has no SkyRL key would be dropped, a name SkyRL does not register would fail on the cluster, and code the policy
writes would run without rlc's sandbox. Each is refused here, at its key, before anything starts (RLC-E640..E649,
RLC-W640..W649). The rules about what rlc's own runtime lacks (check.RLC_RUNTIME_RULES) do not run for such a job.
"""

from __future__ import annotations

import json
from typing import Any

from rlc.compiler.roles import critic_on, get, on_megatron
from rlc.compiler.rules.base import Context, rule
from rlc.compiler.trainers.skyrl_config import (
    ALGORITHM_NAMES,
    DROPPED,
    SKYRL_GYM_ENVS,
    dict_key,
    lacking,
    lacking_keys,
    skyrl_keys,
)
from rlc.core.runtime_facts import runs_model_code
from rlc.spec.model import default_model
from rlc.spec.skyrl_release import SKYRL_RELEASE

SKYRL = f"SkyRL {SKYRL_RELEASE}"
TRAINER = "launch.trainer"
SETTINGS = "launch.trainer_settings"
ENV = "environment.env_class"
ISOLATION = "environment.sandbox.isolation"
OTHER_TRAINER = "or run it with launch.trainer: rlc"


def _chosen(c: Context) -> bool:
    return c.s.launch.trainer == "skyrl"


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


@rule(
    "RLC-E640",
    f"a setting {SKYRL}'s trainer has no key for is left at its default",
    *lacking_keys(),
    TRAINER,
)
def settings_skyrl_lacks(c: Context):
    if not _chosen(c):
        return
    for key, value, default in lacking(c.s):
        if key == ISOLATION:
            continue  # how model-written code is isolated: RLC-E642
        if key in DROPPED:
            what, fix = f"an older SkyRL release's setting that {SKYRL} no longer has", DROPPED[key]
        else:
            what, fix = "an rlc setting", OTHER_TRAINER
        yield c.error(
            "RLC-E640",
            key,
            f"{key} = {_show(value)}: {SKYRL}'s trainer has no such setting ({what}), so the job would run without it",
            f"remove {key.rsplit('.', 1)[1]} (or set it to {_show(default)}); {fix}",
            [TRAINER],
        )


@rule("RLC-E641", f"environment.env_class is an environment skyrl-gym {SKYRL_RELEASE} registers", ENV, TRAINER)
def environment_in_skyrl_gym(c: Context):
    env_class = c.s.environment.env_class
    if _chosen(c) and isinstance(env_class, str) and env_class not in SKYRL_GYM_ENVS:
        yield c.error(
            "RLC-E641",
            ENV,
            f"{SKYRL}'s trainer runs the environments skyrl-gym {SKYRL_RELEASE} registers ({', '.join(SKYRL_GYM_ENVS)}); "
            f"{env_class!r} is not one of them",
            f"use one of those, {OTHER_TRAINER} (which has {env_class!r})",
            [TRAINER],
        )


def _model_code_env(c: Context) -> str | None:
    """The environment, when SkyRL's trainer is chosen and the environment runs what the policy writes."""
    env_class = c.s.environment.env_class
    if _chosen(c) and isinstance(env_class, str) and runs_model_code(env_class):
        return env_class
    return None


@rule(
    "RLC-E642",
    f"an environment that runs the model's code runs it unisolated under {SKYRL}: only when asked",
    ISOLATION,
    ENV,
    TRAINER,
)
def model_code_needs_consent(c: Context):
    """skyrl-gym's code and SQL environments run what the policy writes in SkyRL's own processes: rlc's sandbox is
    not there, so the isolation the spec asks for cannot be had (refused, as rlc refuses a machine without it)."""
    env_class, isolation = _model_code_env(c), c.s.environment.sandbox.isolation
    if env_class is not None and isolation != "unisolated":
        yield c.error(
            "RLC-E642",
            ISOLATION,
            f"the {env_class} environment runs what the policy writes, and {SKYRL}'s trainer runs it in its own "
            f"processes: the isolation: {isolation} the spec asks for cannot be had there",
            f"set environment.sandbox.isolation: unisolated if every program it runs is trusted, {OTHER_TRAINER} "
            "(whose sandbox isolates it)",
            [ENV, TRAINER],
        )


@rule(
    "RLC-W640",
    f"model-written code runs in {SKYRL}'s trainer processes (isolation: unisolated)",
    ISOLATION,
    ENV,
    TRAINER,
)
def model_code_unisolated(c: Context):
    env_class = _model_code_env(c)
    if env_class is not None and c.s.environment.sandbox.isolation == "unisolated":
        yield c.warning(
            "RLC-W640",
            ISOLATION,
            f"the {env_class} environment runs what the policy writes in {SKYRL}'s trainer processes, with their "
            "filesystem, network and secrets",
            f"accepted because isolation is unisolated; {OTHER_TRAINER} to run it in rlc's sandbox",
            [ENV, TRAINER],
        )


@rule(
    "RLC-E643",
    f"every algorithm the spec names is one {SKYRL} registers",
    *ALGORITHM_NAMES,
    TRAINER,
)
def algorithms_skyrl_has(c: Context):
    if not _chosen(c):
        return
    for key, names in ALGORITHM_NAMES.items():
        value = get(c.s, key)
        if isinstance(value, str) and value not in names:
            yield c.error(
                "RLC-E643",
                key,
                f"{key} = {value!r}: {SKYRL} registers no such {key.rsplit('.', 1)[1].replace('_', ' ')} "
                f"(it has {', '.join(names)})",
                f"use one of those, {OTHER_TRAINER} (where {value!r} is registered)",
                [TRAINER],
            )


def _settings(c: Context) -> list[tuple[str, str, str | None]]:
    """(key, where it is written, its place in the spec or None) of launch.trainer_settings.skyrl, when SkyRL's
    trainer is chosen."""
    settings = c.s.launch.trainer_settings.get("skyrl") if isinstance(c.s.launch.trainer_settings, dict) else None
    if not _chosen(c) or not isinstance(settings, dict):
        return []
    keys, model = skyrl_keys(), default_model()
    return [
        (key, f"{SETTINGS}.skyrl.{key}", key if key in keys or model.lookup(key) is not None else dict_key(key))
        for key in settings
    ]


def _checked(c: Context) -> bool:
    return c.s.launch.trainer_version in (None, SKYRL_RELEASE)


@rule(
    "RLC-E644",
    f"launch.trainer_settings.skyrl names keys of {SKYRL}'s config",
    SETTINGS,
    TRAINER,
    "launch.trainer_version",
)
def trainer_settings_are_skyrl_keys(c: Context):
    for key, where, place in _settings(c):
        if place is None and _checked(c):
            import difflib  # deferred: only a wrong key needs a close match

            close = difflib.get_close_matches(key, list(skyrl_keys()), n=1)
            yield c.error(
                "RLC-E644",
                where,
                f"{key!r} is not a key of {SKYRL}'s config: SkyRLTrainConfig.from_cli_overrides would refuse it",
                f"did you mean {close[0]!r}?" if close else "use a dotted key of SkyRL's config",
            )


@rule(
    "RLC-W641",
    f"launch.trainer_settings.skyrl keys {SKYRL} lacks are passed as written to another SkyRL release",
    SETTINGS,
    TRAINER,
    "launch.trainer_version",
)
def trainer_settings_of_another_release(c: Context):
    for key, where, place in _settings(c):
        if place is None and not _checked(c):
            yield c.warning(
                "RLC-W641",
                where,
                f"{key!r} is not a key of {SKYRL}'s config, the release rlc checks; it is passed as written to "
                f"SkyRL {c.s.launch.trainer_version}",
                f"check it against SkyRL {c.s.launch.trainer_version}'s config",
            )


@rule(
    "RLC-E645",
    "launch.trainer_settings.skyrl holds only what the spec has no place for",
    SETTINGS,
    TRAINER,
)
def trainer_settings_not_in_spec(c: Context):
    for key, where, place in _settings(c):
        if place is not None:
            yield c.error(
                "RLC-E645",
                where,
                f"{key} has its place in the spec ({place}), where {SKYRL}'s command takes it from; in "
                "launch.trainer_settings it would be set twice",
                f"move it to {place} in the spec",
            )


@rule(
    "RLC-E646",
    f"the engines and the weight sync are ones {SKYRL} runs (vLLM; nccl, delta)",
    "generator.inference_engine.backend",
    "generator.inference_engine.weight_sync_backend",
    TRAINER,
)
def engines_skyrl_runs(c: Context):
    if not _chosen(c):
        return
    ie = c.s.generator.inference_engine
    if ie.backend != "vllm":
        yield c.error(
            "RLC-E646",
            "generator.inference_engine.backend",
            f"backend {ie.backend!r} is rlc's own engine; {SKYRL}'s trainer generates with vLLM only",
            f"set generator.inference_engine.backend: vllm, {OTHER_TRAINER}",
            [TRAINER],
        )
    if ie.weight_sync_backend == "gloo":
        yield c.error(
            "RLC-E646",
            "generator.inference_engine.weight_sync_backend",
            f"{SKYRL} has no gloo weight sync (it would broadcast over nccl instead)",
            f"set generator.inference_engine.weight_sync_backend: nccl, {OTHER_TRAINER}",
            [TRAINER],
        )


@rule("RLC-E647", f"{SKYRL}'s trainer runs on GPUs", "cluster.accelerator", TRAINER)
def skyrl_needs_gpus(c: Context):
    if _chosen(c) and str(c.s.cluster.accelerator).lower() == "none":
        yield c.error(
            "RLC-E647",
            "cluster.accelerator",
            f"{SKYRL}'s trainer places every model and engine on CUDA GPUs; this cluster has none",
            f"name the GPUs in cluster.accelerator (e.g. H100), {OTHER_TRAINER} (which trains on CPUs)",
            [TRAINER],
        )


MODEL_PATHS = tuple(f"trainer.{role}.model.path" for role in ("policy", "ref", "critic"))


@rule("RLC-E648", f"models are ones {SKYRL} loads (no rlc: packaged model)", *MODEL_PATHS, TRAINER)
def models_skyrl_loads(c: Context):
    if not _chosen(c):
        return
    policy = c.s.trainer.policy.model.path
    for key in MODEL_PATHS:
        path = get(c.s, key)
        if key != MODEL_PATHS[0] and path == policy:
            continue  # the policy's model, refused at its own key
        if isinstance(path, str) and path.startswith("rlc:"):
            yield c.error(
                "RLC-E648",
                key,
                f"{path!r} is a model packaged with rlc; {SKYRL} loads Hugging Face ids and local paths only",
                f"name a Hugging Face model (or its directory), {OTHER_TRAINER}",
                [TRAINER],
            )


@rule(
    "RLC-E649",
    f"{SKYRL}'s trainer trains a critic with FSDP only",
    "trainer.critic.model.path",
    "trainer.critic.strategy",
    "trainer.strategy",
    TRAINER,
)
def critic_skyrl_trains(c: Context):
    if _chosen(c) and critic_on(c.s) and on_megatron(c.s, "critic"):
        yield c.error(
            "RLC-E649",
            "trainer.critic.model.path",
            f"the critic trains with megatron; {SKYRL} refuses a critic under the megatron strategy",
            f"use strategy: fsdp2 for this PPO job, {OTHER_TRAINER} (whose Megatron worker trains critics)",
            ["trainer.strategy", TRAINER],
        )


@rule(
    "RLC-W642",
    f"the SkyRL release the nodes install is the one rlc checks ({SKYRL_RELEASE})",
    "launch.trainer_version",
    TRAINER,
)
def release_checked(c: Context):
    version = c.s.launch.trainer_version
    if _chosen(c) and version not in (None, SKYRL_RELEASE):
        yield c.warning(
            "RLC-W642",
            "launch.trainer_version",
            f"rlc writes and checks SkyRL's command against {SKYRL}; SkyRL {version} may name or default its keys "
            "differently",
            f"remove trainer_version to install {SKYRL}, or check the command (rlc plan) against SkyRL {version}",
            [TRAINER],
        )


RULES = (
    settings_skyrl_lacks,
    environment_in_skyrl_gym,
    model_code_needs_consent,
    model_code_unisolated,
    algorithms_skyrl_has,
    trainer_settings_are_skyrl_keys,
    trainer_settings_of_another_release,
    trainer_settings_not_in_spec,
    engines_skyrl_runs,
    skyrl_needs_gpus,
    models_skyrl_loads,
    critic_skyrl_trains,
    release_checked,
)

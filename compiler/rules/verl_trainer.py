"""What verl's trainer does not run, refused in verl's terms when the spec chooses it (launch.trainer: verl).

Each rule fires only for launch.trainer verl: rlc's own runtime runs these values. An error names verl's release
and says what to change; a warning says where verl reads a value differently and rlc cannot say it verl's way.
"""

from __future__ import annotations

import difflib
from dataclasses import fields

from rlc.compiler.importers.verl.compose import defaults
from rlc.compiler.importers.verl.hydra_overrides import MISSING, lookup
from rlc.compiler.rules.base import Context, rule
from rlc.compiler.trainers.verl_config import (
    ALWAYS,
    DEFAULTS,
    REFINED,
    RELEASE,
    TO_AGG,
    TO_ESTIMATOR,
    TO_KL,
    TO_LOSS,
    flat,
    steps_per_batch,
    verl_values,
)
from rlc.spec.generation import SandboxConfig

VERL = f"verl {RELEASE}"
ALG = "trainer.algorithm"
SETTINGS = "launch.trainer_settings.verl"
# Mappings in verl's config whose keys are free (passed on to a library): any key under them is verl's.
FREE = ("engine_kwargs", "override_config", "override_transformer_config", "apply_chat_template_kwargs",
        "reward_kwargs", "ray_init", "runtime_env", "env_vars")  # fmt: skip


def _verl(c: Context) -> bool:
    return c.s.launch.trainer == "verl"


@rule("RLC-E660", "verl generates with vLLM or SGLang", "generator.inference_engine.backend", "launch.trainer")
def backend(c: Context):
    if _verl(c) and c.ie.backend not in ("vllm", "sglang"):
        yield c.error("RLC-E660", "generator.inference_engine.backend",
                      f"{VERL}'s rollout runs vLLM or SGLang (actor_rollout_ref.rollout.name), not {c.ie.backend!r}",
                      "set generator.inference_engine.backend: vllm, or launch.trainer: rlc to keep this engine")  # fmt: skip


@rule(
    "RLC-E661",
    "verl's main_ppo puts every role in one pool",
    "trainer.placement.colocate_all",
    "trainer.fully_async.enabled",
    "launch.trainer",
)
def one_pool(c: Context):
    if _verl(c) and (not c.p.colocate_all or c.s.trainer.fully_async.enabled):
        key = "trainer.fully_async.enabled" if c.s.trainer.fully_async.enabled else "trainer.placement.colocate_all"
        yield c.error("RLC-E661", key, f"{VERL}'s main_ppo runs actor, rollout, reference and critic colocated in "
                      "one resource pool, one step after another; it has no separate pools or fully-async trainer",
                      "set trainer.placement.colocate_all: true and trainer.fully_async.enabled: false, or keep "
                      "launch.trainer: rlc")  # fmt: skip


@rule(
    "RLC-E662",
    "verl scores rows by their data_source (environment verl) or your reward function (reward_function), one turn",
    "environment.env_class",
    "generator.max_turns",
    "environment.skyrl_gym.reward_function.experiment_name",
    "trainer.algorithm.overlong_buffer_len",
    "trainer.run_name",
    "launch.trainer",
)
def environment(c: Context):
    env = c.s.environment.env_class
    if _verl(c) and env not in ("verl", "reward_function"):
        yield c.error("RLC-E662", "environment.env_class",
                      f"{VERL} scores each row by its data_source with its own reward functions; rlc's "
                      f"environment {env!r} runs only in rlc's runtime",
                      "set environment.env_class: verl (verl's data and reward) or reward_function (your function, "
                      "verl's custom_reward_function), or keep launch.trainer: rlc")  # fmt: skip
    named = c.s.environment.skyrl_gym.reward_function.experiment_name
    if _verl(c) and env == "reward_function" and named is not None:
        key = "environment.skyrl_gym.reward_function.experiment_name"
        if c.alg.overlong_buffer_len is not None:
            yield c.error("RLC-E662", key, f"{VERL} adds experiment_name to extra_info in its gdpo reward manager "
                          "and the overlong penalty in its dapo one; a job has one manager",
                          "remove experiment_name or overlong_buffer_len, or keep launch.trainer: rlc")  # fmt: skip
        elif named != c.t.run_name:
            yield c.error("RLC-E662", key, f"{VERL}'s gdpo reward manager adds its trainer.experiment_name "
                          f"({c.t.run_name!r}, from trainer.run_name), not {named!r}",
                          f"set experiment_name to trainer.run_name ({c.t.run_name!r})")  # fmt: skip
    if _verl(c) and c.s.generator.max_turns > 1:
        yield c.error("RLC-E662", "generator.max_turns", f"{VERL}'s main_ppo generates one turn from "
                      "environments; multi-turn rollouts there are verl's agent loops, which the spec does not set",
                      "set generator.max_turns: 1, or keep launch.trainer: rlc")  # fmt: skip


@rule("RLC-E663", "verl has no sandbox for model-written code", "environment.sandbox", "launch.trainer")
def sandbox(c: Context):
    if not _verl(c):
        return
    default = SandboxConfig()
    for f in fields(SandboxConfig):
        if getattr(c.s.environment.sandbox, f.name) != getattr(default, f.name):
            yield c.error("RLC-E663", f"environment.sandbox.{f.name}", f"{VERL} runs no sandbox for model-written "
                          "code: environment.sandbox is rlc's runtime's, and verl would ignore it",
                          f"remove environment.sandbox.{f.name}, or keep launch.trainer: rlc")  # fmt: skip


# SkyRL's masks in off_policy_correction, which verl's rollout_correction lacks (its TIS weight and rejection modes
# are written, rlc.compiler.trainers.verl_config).
SKYRL_MASKS = (
    "sequence_mask_metric",
    "outlier_token_is_threshold_low",
    "outlier_token_is_threshold_high",
    "token_mask_is_threshold_low",
    "token_mask_is_threshold_high",
    "m2po_threshold",  # AReaL's M2PO
)


@rule("RLC-E664", "verl has the algorithm", f"{ALG}.advantage_estimator", f"{ALG}.policy_loss_type",
      f"{ALG}.loss_reduction", f"{ALG}.kl_estimator_type", f"{ALG}.dynamic_sampling.type", f"{ALG}.use_tis",
      f"{ALG}.off_policy_correction.sequence_mask_metric", f"{ALG}.off_policy_correction", f"{ALG}.pf_ppo",
      "trainer.use_hybrid_env_sampling", "launch.trainer")  # fmt: skip
def algorithm(c: Context):
    if not _verl(c):
        return
    a = c.alg
    for key, value, known in (
        ("advantage_estimator", a.advantage_estimator, TO_ESTIMATOR),
        ("policy_loss_type", a.policy_loss_type, {**TO_LOSS, "regular": "vanilla"}),
        ("loss_reduction", a.loss_reduction, TO_AGG),
        ("kl_estimator_type", a.kl_estimator_type, TO_KL),
    ):
        if value not in known:
            yield c.error("RLC-E664", f"{ALG}.{key}", f"{VERL} has no {key.replace('_', ' ')} {value!r}",
                          f"use one verl has ({', '.join(sorted(known))}), or keep launch.trainer: rlc")  # fmt: skip
    if a.dynamic_sampling.type not in (None, "filter"):
        yield c.error("RLC-E664", f"{ALG}.dynamic_sampling.type", f"{VERL} filters groups (filter_groups); it has no "
                      f"{a.dynamic_sampling.type!r} dynamic sampling", "use type: filter or null")  # fmt: skip
    if c.s.trainer.use_hybrid_env_sampling:
        yield c.error("RLC-E664", "trainer.use_hybrid_env_sampling", f"{VERL}'s dataloader has no hybrid environment "
                      "sampling (a minimum of rows of each environment in every batch)",
                      "turn it off, or keep launch.trainer: rlc")  # fmt: skip
    if a.pf_ppo.reweight_method is not None and a.advantage_estimator != "gae":
        yield c.error("RLC-E664", f"{ALG}.pf_ppo.reweight_method", f"{VERL}'s main_ppo resamples with PF-PPO only "
                      f"under advantage_estimator gae; with {a.advantage_estimator} it would ignore use_pf_ppo",
                      "use gae, remove pf_ppo, or keep launch.trainer: rlc")  # fmt: skip
    opc = a.off_policy_correction
    for name in SKYRL_MASKS:
        if getattr(opc, name) is not None:
            yield c.error("RLC-E664", f"{ALG}.off_policy_correction.{name}", f"{VERL}'s rollout_correction has no "
                          "counterpart of SkyRL's sequence, outlier and token masks or AReaL's M2PO (it has "
                          "rejection_sampling's modes)", "remove it, use rejection_sampling, or keep launch.trainer: rlc")  # fmt: skip


@rule(
    "RLC-E665",
    "verl's warm-up counts whole training steps",
    "trainer.policy.optimizer_config.num_warmup_steps",
    "trainer.policy.optimizer_config.scheduler",
    "trainer.train_batch_size",
    "trainer.policy_mini_batch_size",
    "trainer.update_epochs_per_batch",
    "launch.trainer",
)
def warmup(c: Context):
    if not _verl(c):
        return
    oc, per = c.t.policy.optimizer_config, steps_per_batch(c.s)
    if oc.num_warmup_steps % per:
        yield c.error("RLC-E665", "trainer.policy.optimizer_config.num_warmup_steps",
                      f"{VERL} steps its LR schedule once a training step ({per} optimizer steps here: "
                      f"train_batch_size / policy_mini_batch_size x update_epochs_per_batch), so its warm-up is a "
                      f"whole number of training steps; {oc.num_warmup_steps} optimizer steps is not",
                      f"write a multiple of {per}, e.g. {oc.num_warmup_steps // per * per or per}")  # fmt: skip
    if oc.scheduler not in ("constant_with_warmup", "cosine"):
        yield c.error("RLC-E665", "trainer.policy.optimizer_config.scheduler",
                      f"{VERL} schedules the LR constant or cosine, not {oc.scheduler!r}",
                      "use constant_with_warmup or cosine")  # fmt: skip


# it reads the whole spec: a setting the spec holds is one rlc writes for verl from the spec
@rule(
    "RLC-E666",
    "launch.trainer_settings.verl holds verl's own keys the spec has no place for",
    "launch.trainer_settings",
    "launch.trainer",
    "cluster",
    "data",
    "trainer",
    "generator",
    "environment",
)
def settings(c: Context):
    given = flat(dict((c.s.launch.trainer_settings or {}).get("verl") or {}))
    if not _verl(c) or not given:
        return
    tree = defaults(DEFAULTS)["engines"]["megatron" if c.megatron else "dp"]
    placed = (set(flat(verl_values(c.s))) | set(ALWAYS)) - set(REFINED)
    for key in given:
        if key in placed:
            yield c.error("RLC-E666", SETTINGS, f"{key} is a value the spec holds (rlc writes it for verl from the "
                          "spec), so it does not go in trainer_settings", "set it in the spec (rlc explain shows "
                          "which key), and remove it from launch.trainer_settings.verl")  # fmt: skip
        elif lookup(tree, key) is MISSING and not _free(tree, key):
            close = difflib.get_close_matches(key, list(flat(tree)), n=1, cutoff=0.9)
            if close:  # a misspelt key: verl would refuse to start (Hydra's "Could not override")
                yield c.error("RLC-E666", SETTINGS, f"{key} is no key of {VERL}'s config (ppo_trainer), so verl "
                              "would refuse to start", f"did you mean {close[0]}?")  # fmt: skip
            else:
                yield c.warning("RLC-W661", SETTINGS, f"{key} is no key of {VERL}'s config (ppo_trainer): it is "
                                "added (+key), and only verl code that reads it uses it", "check the key against "
                                "verl's config classes (verl/workers/config, verl/trainer/config)")  # fmt: skip


def _free(tree: dict, key: str) -> bool:
    parts = key.split(".")
    return any(p in FREE and isinstance(lookup(tree, ".".join(parts[: i + 1])), dict) for i, p in enumerate(parts))


@rule(
    "RLC-W660",
    "verl averages the entropy bonus and KL loss as the policy loss",
    f"{ALG}.loss_reduction",
    f"{ALG}.use_entropy_loss",
    f"{ALG}.use_kl_loss",
    "launch.trainer",
)
def aux_averaging(c: Context):
    if not _verl(c):
        return
    a = c.alg
    if a.use_entropy_loss and a.loss_reduction != "token_mean":
        yield c.warning("RLC-W660", f"{ALG}.loss_reduction", f"{VERL} averages the entropy bonus by the loss "
                        f"reduction ({a.loss_reduction}); rlc takes its token mean: the bonus weighs responses "
                        "differently under verl", "use loss_reduction: token_mean for the same entropy term")  # fmt: skip
    if a.use_kl_loss and a.loss_reduction != "sequence_mean":
        yield c.warning("RLC-W660", f"{ALG}.loss_reduction", f"{VERL} averages the KL loss by the loss reduction "
                        f"({a.loss_reduction}); rlc takes each response's token mean, then their mean: the KL term "
                        "weighs responses differently under verl", "use loss_reduction: sequence_mean for the "
                        "same KL term")  # fmt: skip


RULES = (backend, one_pool, environment, sandbox, algorithm, warmup, settings, aux_averaging)

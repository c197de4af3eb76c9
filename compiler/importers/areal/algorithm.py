"""AReaL's algorithm settings in spec v1 terms: estimator, loss, KL, off-policy correction, critic and ref."""

from __future__ import annotations

from collections.abc import Callable

from rlc.compiler import allocation
from rlc.compiler.importers.areal.record import ArealImport
from rlc.core.algorithms import SEQUENCE_RATIO_LOSS


def algorithm(imp: ArealImport) -> None:
    """The advantage estimator, loss, KL and off-policy settings from AReaL's actor section."""
    alg = "trainer.algorithm"
    critic = isinstance(imp.get("critic"), dict)
    rn = imp.get("actor.reward_norm") or {}
    an = imp.get("actor.adv_norm") or {}
    if critic:
        imp.put(f"{alg}.advantage_estimator", "gae", "critic.path", reason="a critic: PPO with GAE")
    elif rn.get("mean_level") == "group" and rn.get("mean_leave1out"):
        imp.put(f"{alg}.advantage_estimator", "rloo", "actor.reward_norm.mean_leave1out", reason="leave-one-out mean")
    elif rn.get("mean_level") == "group":
        imp.put(f"{alg}.advantage_estimator", "grpo", "actor.reward_norm.mean_level", reason="group-relative")
        std = rn.get("std_level") == "group"
        imp.put(f"{alg}.grpo_norm_by_std", std, "actor.reward_norm.std_level", reason="Dr.GRPO when false")
    else:
        imp.put(f"{alg}.advantage_estimator", "reinforce++", "actor.reward_norm", reason="no group baseline")
    for key in ("mean_level", "std_level", "mean_leave1out", "std_unbiased", "eps", "group_size"):
        imp.drop(f"actor.reward_norm.{key}", "part of the advantage estimator")
    batch_norm = an.get("mean_level") == "batch" or an.get("std_level") == "batch"
    imp.put(f"{alg}.advantage_batch_normalize", batch_norm, "actor.adv_norm.mean_level", reason="batch normalisation")
    for key in ("mean_level", "std_level", "mean_leave1out", "std_unbiased", "eps", "group_size"):
        imp.drop(f"actor.adv_norm.{key}", "part of advantage_batch_normalize")
    scaled = imp.get("actor.reward_scaling", 1.0) != 1.0 or imp.get("actor.reward_bias", 0.0) != 0.0
    normalised = an.get("std_level") is not None or rn.get("std_level") is not None
    why = (
        "a linear reward change that advantage normalisation cancels" if normalised else "rlc does not rescale rewards"
    )
    for key in ("reward_scaling", "reward_bias"):
        imp.drop(f"actor.{key}", why, "error" if scaled and not normalised else "info")
    if imp.has("actor.reward_clip"):  # AReaL clips at 20 when a config says nothing: far above a 0..1 reward
        imp.put(f"{alg}.reward_clip", imp.get("actor.reward_clip"), "actor.reward_clip",
                reason="AReaL clips the reward after its bias and scaling, rlc the reward as it is" if scaled else "",
                severity="warning" if scaled else "info")  # fmt: skip
    imp.drop("actor.group_size", "the same as gconfig.n_samples")
    lo = imp.get("actor.eps_clip", 0.2)
    hi = imp.get("actor.eps_clip_higher") or lo
    imp.put(f"{alg}.eps_clip_low", lo, "actor.eps_clip")
    imp.put(
        f"{alg}.eps_clip_high", hi, "actor.eps_clip_higher" if imp.has("actor.eps_clip_higher") else "actor.eps_clip"
    )
    if imp.get("actor.c_clip"):
        imp.put(f"{alg}.policy_loss_type", "dual_clip", "actor.c_clip", reason="dual clipping")
        imp.put(f"{alg}.clip_ratio_c", imp.get("actor.c_clip"), "actor.c_clip")
    elif imp.get("actor.importance_sampling_level") == "sequence":
        imp.put(f"{alg}.policy_loss_type", SEQUENCE_RATIO_LOSS, "actor.importance_sampling_level", reason="GSPO")
    else:
        imp.drop("actor.importance_sampling_level", "token-level ratios, as in rlc's regular loss")
        imp.drop("actor.c_clip", "no dual clipping")
    temp = imp.get("actor.temperature")
    if temp is not None and temp != imp.get("gconfig.temperature", 1.0):
        imp.put(f"{alg}.temperature", temp, "actor.temperature")
    else:
        imp.drop("actor.temperature", "derived from the sampling temperature")
    kl = imp.get("actor.kl_ctl", 0.1)
    if kl:
        imp.put(f"{alg}.use_kl_in_reward", True, "actor.kl_ctl", reason="AReaL subtracts the KL from the reward")
        imp.put(f"{alg}.use_kl_loss", False, "actor.kl_ctl", reason="KL in the reward, not the loss")
        imp.put(f"{alg}.kl_loss_coef", kl, "actor.kl_ctl")
    else:
        imp.put(f"{alg}.use_kl_loss", False, "actor.kl_ctl", reason="kl_ctl 0: no KL term")
        imp.put(f"{alg}.use_kl_in_reward", False, "actor.kl_ctl", reason="kl_ctl 0: no KL term")
    if imp.has("actor.kl_estimator"):
        imp.put(f"{alg}.kl_estimator_type", imp.get("actor.kl_estimator"), "actor.kl_estimator")
    if imp.has("actor.discount"):
        imp.put(f"{alg}.gamma", imp.get("actor.discount"), "actor.discount")
    if imp.has("actor.gae_lambda"):
        imp.put(f"{alg}.lambd", imp.get("actor.gae_lambda"), "actor.gae_lambda")
    if imp.get("actor.use_decoupled_loss") is True:
        cap = imp.get("actor.behav_imp_weight_cap")
        opc = f"{alg}.off_policy_correction"
        imp.put(f"{opc}.tis_ratio_type", "token", "actor.use_decoupled_loss", reason="AReaL's decoupled PPO loss")
        if cap:
            imp.put(f"{opc}.token_tis_ratio_clip_high", cap, "actor.behav_imp_weight_cap")
            imp.put(f"{opc}.token_mask_is_threshold_high", cap, "actor.behav_imp_weight_cap", reason="mask above cap")
    else:
        imp.drop("actor.use_decoupled_loss", "false: the standard PPO loss")
        imp.drop("actor.behav_imp_weight_cap", "only with use_decoupled_loss")
    if imp.get("actor.prox_logp_method", "recompute") == "loglinear":  # AReaL's approximation of the proximal policy
        imp.drop("actor.prox_logp_method", "rlc recomputes the proximal (old) log-probs with a forward pass; AReaL's "
                 "loglinear interpolation between policy versions is not in rlc", "error")  # fmt: skip
    else:
        imp.drop("actor.prox_logp_method", "rlc recomputes the proximal (old) log-probs, as AReaL's recompute")
    if imp.get("actor.m2_threshold") is not None:  # M2PO: behaviour (the engine's) against proximal log-probs
        imp.put(f"{alg}.off_policy_correction.m2po_threshold", imp.get("actor.m2_threshold"), "actor.m2_threshold",
                reason="M2PO")  # fmt: skip
    if imp.get("actor.dynamic_sampling") is True:
        imp.put(f"{alg}.dynamic_sampling.type", "filter", "actor.dynamic_sampling", reason="DAPO's group filter")
    else:
        imp.drop("actor.dynamic_sampling", "false: off")
    if imp.get("actor.overlong_reward_penalty") is True:  # verl's dapo arithmetic (reward_overlong_penalty)
        imp.put(f"{alg}.overlong_buffer_len", imp.get("actor.overlong_tokens"), "actor.overlong_tokens",
                "actor.overlong_reward_penalty")  # fmt: skip
        imp.put(f"{alg}.overlong_buffer_penalty_factor", imp.get("actor.overlong_penalty_factor", 1.0),
                "actor.overlong_penalty_factor")  # fmt: skip
        most, longest = imp.get("actor.max_new_tokens"), imp.get("gconfig.max_new_tokens")
        if most is not None and longest is not None and most != longest:
            imp.drop("actor.max_new_tokens", f"AReaL counts the overlong buffer back from actor.max_new_tokens={most}; "
                     f"rlc from max_generate_length={longest} (gconfig.max_new_tokens)", "error")  # fmt: skip
    else:
        for key in ("overlong_reward_penalty", "overlong_tokens", "overlong_penalty_factor"):
            imp.drop(f"actor.{key}", "the overlong penalty is off")
    if imp.has("actor.mask_no_eos_with_zero"):
        imp.put(
            "generator.apply_overlong_filtering", imp.get("actor.mask_no_eos_with_zero"), "actor.mask_no_eos_with_zero"
        )


def critic_and_ref(imp: ArealImport, optimizer: Callable[[ArealImport, str, str], None]) -> None:
    """The critic (PPO) and the reference model; the critic's optimizer is mapped as the actor's is."""
    if isinstance(imp.get("critic"), dict):
        imp.put("trainer.critic.model.path", imp.get("critic.path") or imp.get("actor.path"), "critic.path")
        optimizer(imp, "critic", "trainer.critic")
        if imp.has("critic.eps_clip"):
            imp.put("trainer.algorithm.value_clip", imp.get("critic.eps_clip"), "critic.eps_clip")
        batch, n_mb = imp.get("train_dataset.batch_size"), imp.get("critic.ppo_n_minibatches", 4)
        if isinstance(batch, int) and isinstance(n_mb, int) and n_mb > 0 and batch % n_mb == 0:
            imp.put("trainer.critic_mini_batch_size", batch // n_mb, "critic.ppo_n_minibatches", reason="batch / n")
        _critic_gpus(imp)
        for key in ("is_critic", "init_from_scratch", "disable_dropout", "dtype", "gradient_checkpointing"):
            imp.drop(f"critic.{key}", "the critic follows the policy's settings")
    ref_path = imp.get("ref.path")
    if ref_path and ref_path != imp.get("actor.path"):
        imp.put("trainer.ref.model.path", ref_path, "ref.path")
    else:
        imp.drop("ref.path", "the policy's model, as rlc's reference model defaults to")
    for key in ("init_from_scratch", "disable_dropout", "dtype", "optimizer", "gradient_checkpointing"):
        imp.drop(f"ref.{key}", "the reference model follows the policy's settings and is not trained")


def _critic_gpus(imp: ArealImport) -> None:
    """AReaL's critic shares the actor's training GPUs; rlc shares them only under colocate_all, so a separate
    training group is split between policy and critic."""
    text = imp.result.spec.get("trainer.placement.allocation")
    if not isinstance(text, str):
        return
    parsed = allocation.parse(text)
    comps = parsed.components
    train = [c for c in comps if not c.inference]
    engines = [c for c in comps if c.inference]
    if len(train) != 1 or not engines or engines[0].group == train[0].group:
        return  # colocated everything, or a critic already placed: nothing to split
    actor = train[0]
    d = actor.dims.get("d", 1)
    if d % 2:
        imp.put(
            "trainer.placement.allocation",
            text,
            "allocation_mode",
            reason=f"the critic needs GPUs of its own in rlc and d{d} does not split in two: set its placement by hand",
            severity="error",
        )
        return
    half = {**actor.dims, "d": d // 2}
    dims = "".join(f"{k}{v}" for k, v in half.items())
    backend = actor.backend or "fsdp"
    parts = [f"{backend}:{dims}" if c is actor else text[c.start :].split("+")[0].strip() for c in comps]
    parts.append(f"{backend}[critic]:{dims}")
    imp.put(
        "trainer.placement.allocation",
        "+".join(parts),
        "allocation_mode",
        reason=f"AReaL's critic shares the actor's {actor.gpus} GPUs; rlc gives it GPUs of its own, half of them",
        severity="error",
    )

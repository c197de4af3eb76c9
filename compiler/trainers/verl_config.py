"""The resolved spec as verl's config: the Hydra overrides of `python3 -m verl.trainer.main_ppo` that verl's trainer
(rlc.compiler.trainers.verl) runs.

It is the verl importer (rlc.compiler.importers.verl) run backwards, on its names and tables: every value of the
spec in verl's keys and units, only what differs from verl's defaults written (and what verl always needs), then
`launch.trainer_settings.verl`. Where verl reads a value differently, the verl setting that gives rlc's meaning is
written: rlc's regular loss is verl's vanilla loss with a dual clip that never bites, rlc's warm-up counts
optimizer steps, the one micro-batch knob goes to each role's, and so on. What verl cannot mean, its rules refuse
(rlc.compiler.rules.verl_trainer).
"""

from __future__ import annotations

from typing import Any

from rlc.compiler.importers.verl.compose import compose_overrides, defaults
from rlc.compiler.importers.verl.hydra_overrides import MISSING, Override, lookup
from rlc.compiler.importers.verl.mapping import (
    ALG,
    ESTIMATORS,
    KL_TYPES,
    LOSS_AGG,
    LOSS_MODES,
    REF,
    A,
    C,
    M,
    R,
    T,
)
from rlc.compiler.roles import on_megatron
from rlc.core import algorithms
from rlc.core.pipeline_stages import VIRTUAL
from rlc.spec.root import RlcSpec

RELEASE = "0.9.1"
DEFAULTS = "v0.9.1"  # the vendored defaults (compiler/importers/verl/defaults) the overrides are written against
MODULE = "verl.trainer.main_ppo"
# rlc's names -> verl's, the importer's tables turned round (the first verl name where several map to one).
TO_ESTIMATOR = {ours: theirs for theirs, ours in reversed(ESTIMATORS.items())}
TO_KL = {ours: theirs for theirs, ours in reversed(KL_TYPES.items())}
TO_AGG = {ours: theirs for theirs, ours in reversed(LOSS_AGG.items())}
TO_LOSS = {ours: theirs for theirs, ours in reversed(LOSS_MODES.items())}
# rlc's regular loss has no dual clip; verl's vanilla loss always has one, at clip_ratio_c x -advantage. A bound
# no ratio reaches makes verl's loss rlc's regular one.
NO_DUAL_CLIP = 1e9
RESUME = {"latest": "auto", "none": "disable", "from_path": "resume_path"}
LOGGERS = ("wandb", "mlflow", "tensorboard")
# Keys verl needs written whatever its default says (rollout.name is `???` in verl's config).
ALWAYS = (f"{R}.name", f"{M}.path", "data.train_files")
# verl keys launch.trainer_settings.verl may set though the spec writes them too: verl has one per role (or a list)
# where the spec has one value (the importer keeps a job's own there).
REFINED = (
    f"{T}.logger",
    f"{R}.name",  # verl also rolls out with SGLang, where rlc runs vLLM
    f"{A}.ppo_micro_batch_size_per_gpu",
    f"{R}.log_prob_micro_batch_size_per_gpu",
    f"{REF}.log_prob_micro_batch_size_per_gpu",
    f"{C}.ppo_micro_batch_size_per_gpu",
    f"{C}.forward_micro_batch_size_per_gpu",
    f"{R}.log_prob_max_token_len_per_gpu",
    f"{REF}.log_prob_max_token_len_per_gpu",
    f"{C}.ppo_max_token_len_per_gpu",
    f"{C}.forward_max_token_len_per_gpu",
)


def verl_values(spec: RlcSpec) -> dict[str, Any]:
    """What the resolved spec says, as verl's dotted keys and values (rlc's meaning, verl's units)."""
    values: dict[str, Any] = {}
    parts = (
        _job,
        _data,
        _model,
        _batches,
        _optimizer,
        _strategy,
        _loss,
        _algorithm,
        _reward,
        _critic,
        _rollout,
        _trainer,
    )
    for part in parts:
        values.update(part(spec))
    return values


def _job(spec: RlcSpec) -> dict[str, Any]:
    t, p = spec.trainer, spec.trainer.placement
    values = {
        f"{T}.project_name": t.project_name,
        f"{T}.experiment_name": t.run_name,
        # verl's main_ppo puts every role in one pool of nnodes x n_gpus_per_node: the policy's GPUs
        f"{T}.nnodes": p.policy_num_nodes,
        f"{T}.n_gpus_per_node": p.policy_num_gpus_per_node,
    }
    if spec.cluster.accelerator == "none":
        values[f"{T}.device"] = "cpu"
    return values


def _data(spec: RlcSpec) -> dict[str, Any]:
    t, g = spec.trainer, spec.generator
    values: dict[str, Any] = {
        "data.train_files": _files(spec.data.train_data),
        "data.train_batch_size": t.train_batch_size,
        "data.max_prompt_length": t.max_prompt_length,
        "data.max_response_length": g.sampling_params.max_generate_length,
    }
    if spec.data.val_data:
        values["data.val_files"] = _files(spec.data.val_data)
    for key, value in (g.chat_template_kwargs or {}).items():
        values[f"data.apply_chat_template_kwargs.{key}"] = value
    return values


def _files(paths: list[str]) -> str | list[str]:
    """verl reads a file or a list of them: one file is written as verl's own default is, a string."""
    return paths[0] if len(paths) == 1 else list(paths)


def _model(spec: RlcSpec) -> dict[str, Any]:
    t = spec.trainer
    values: dict[str, Any] = {
        f"{M}.path": t.policy.model.path,
        f"{M}.enable_gradient_checkpointing": t.gradient_checkpointing,
        f"{M}.use_remove_padding": t.use_sample_packing,
    }
    lora = t.policy.model.lora
    if lora.rank > 0:
        # the FSDP engine reads lora_rank/lora_alpha, the Megatron engine lora.rank/lora.alpha: both say the same
        values.update({f"{M}.lora_rank": lora.rank, f"{M}.lora_alpha": lora.alpha, f"{M}.lora.rank": lora.rank,
                       f"{M}.lora.alpha": lora.alpha})  # fmt: skip
        if t.strategy != "megatron":
            values[f"{M}.target_modules"] = lora.target_modules
            if lora.exclude_modules:
                values[f"{M}.exclude_modules"] = lora.exclude_modules
    for key, value in (t.policy.model_config_kwargs or {}).items():
        values[f"{M}.override_config.{key}"] = value
    return values


def has_critic(spec: RlcSpec) -> bool:
    return bool(spec.trainer.critic.model.path)


def _batches(spec: RlcSpec) -> dict[str, Any]:
    """rlc's two micro-batch knobs are each role's in verl; token budgets (max_tokens_per_microbatch) likewise."""
    t = spec.trainer
    values: dict[str, Any] = {
        f"{A}.ppo_mini_batch_size": t.policy_mini_batch_size,
        f"{A}.ppo_epochs": t.update_epochs_per_batch,
        f"{A}.ppo_micro_batch_size_per_gpu": t.micro_train_batch_size_per_gpu,
        f"{R}.log_prob_micro_batch_size_per_gpu": t.micro_forward_batch_size_per_gpu,
        f"{REF}.log_prob_micro_batch_size_per_gpu": t.micro_forward_batch_size_per_gpu,
    }
    budget = t.max_tokens_per_microbatch
    if isinstance(budget, int) and budget > 0:
        # verl's budget is a GPU's: it multiplies it by the GPUs that split each row (Megatron's context parallel
        # size, FSDP's Ulysses size); rlc's counts whole rows.
        if t.strategy == "megatron":
            splits = dict.fromkeys((A, R, REF), t.policy.megatron_config.context_parallel_size)
        else:
            splits = {A: t.policy.sequence_parallel_size, R: t.policy.sequence_parallel_size}
            splits[REF] = t.ref.sequence_parallel_size
        per_gpu = {role: -(-budget // max(1, int(split))) for role, split in splits.items()}
        values[f"{A}.use_dynamic_bsz"] = True
        values[f"{A}.ppo_max_token_len_per_gpu"] = per_gpu[A]
        for role in (R, REF):
            values[f"{role}.log_prob_use_dynamic_bsz"] = True
            values[f"{role}.log_prob_max_token_len_per_gpu"] = per_gpu[role]
    if has_critic(spec):
        values.update({f"{C}.ppo_mini_batch_size": t.critic_mini_batch_size,
                       f"{C}.ppo_micro_batch_size_per_gpu": t.micro_train_batch_size_per_gpu,
                       f"{C}.forward_micro_batch_size_per_gpu": t.micro_forward_batch_size_per_gpu})  # fmt: skip
        if isinstance(budget, int) and budget > 0:
            values.update({f"{C}.use_dynamic_bsz": True, f"{C}.ppo_max_token_len_per_gpu": budget,
                           f"{C}.forward_max_token_len_per_gpu": budget})  # fmt: skip
    return values


def steps_per_batch(spec: RlcSpec) -> int:
    """Optimizer steps in one verl training step: train_batch_size / ppo_mini_batch_size x ppo_epochs."""
    t = spec.trainer
    return max(1, t.train_batch_size // t.policy_mini_batch_size) * t.update_epochs_per_batch


def _optimizer(spec: RlcSpec) -> dict[str, Any]:
    oc, o = spec.trainer.policy.optimizer_config, f"{A}.optim"
    values: dict[str, Any] = {
        f"{o}.lr": oc.lr,
        f"{o}.weight_decay": oc.weight_decay,
        f"{o}.betas": list(oc.adam_betas),
        f"{o}.clip_grad": oc.max_grad_norm,
    }
    # verl's FSDP optimizer names its schedule lr_scheduler_type, its Megatron optimizer lr_decay_style
    style = "lr_decay_style" if spec.trainer.strategy == "megatron" else "lr_scheduler_type"
    values[f"{o}.{style}"] = "cosine" if oc.scheduler == "cosine" else "constant"
    # verl counts training steps, rlc optimizer steps (RLC-E665 refuses a warm-up that is not whole ones)
    values[f"{o}.lr_warmup_steps"] = oc.num_warmup_steps // steps_per_batch(spec)
    return values


def _strategy(spec: RlcSpec) -> dict[str, Any]:
    t, fc = spec.trainer, f"{A}.fsdp_config"
    values: dict[str, Any] = {f"{fc}.optimizer_offload": t.policy.optimizer_config.offload_after_step}
    if t.strategy == "megatron":
        mc, mg = t.policy.megatron_config, f"{A}.megatron"
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                    "expert_model_parallel_size", "expert_tensor_parallel_size"):  # fmt: skip
            values[f"{mg}.{key}"] = getattr(mc, key)
        for key, value in (mc.transformer_config_kwargs or {}).items():
            # verl takes virtual pipeline stages as a setting of its own and builds the model chunks from it
            values[f"{mg}.{key}" if key == VIRTUAL else f"{mg}.override_transformer_config.{key}"] = value
        del values[f"{fc}.optimizer_offload"]
        values[f"{mg}.optimizer_offload"] = t.policy.optimizer_config.offload_after_step
        return values
    pf = t.policy.fsdp_config
    values.update({f"{A}.strategy": "fsdp2", f"{fc}.offload_policy": pf.cpu_offload})  # rlc trains with FSDP2
    values[f"{fc}.fsdp_size"] = pf.fsdp_size
    values[f"{fc}.reshard_after_forward"] = pf.reshard_after_forward
    values[f"{A}.ulysses_sequence_parallel_size"] = t.policy.sequence_parallel_size
    values[f"{REF}.ulysses_sequence_parallel_size"] = t.ref.sequence_parallel_size
    return values


def _loss(spec: RlcSpec) -> dict[str, Any]:
    alg = spec.trainer.algorithm
    values: dict[str, Any] = {
        f"{A}.clip_ratio_low": alg.eps_clip_low,
        f"{A}.clip_ratio_high": alg.eps_clip_high,
        f"{A}.clip_ratio_c": alg.clip_ratio_c,
    }
    kind = alg.policy_loss_type
    if kind == "regular":
        values[f"{A}.clip_ratio_c"] = NO_DUAL_CLIP
    # bypass: verl's trainer puts its bypass_mode loss in place of loss_mode (rollout_correction.bypass_mode)
    values[f"{A}.policy_loss.loss_mode"] = "vanilla" if kind in ("regular", "bypass") else TO_LOSS.get(kind, kind)
    if kind == "sapo":
        values.update({f"{A}.tau_pos": alg.sapo.tau_pos, f"{A}.tau_neg": alg.sapo.tau_neg})
    elif kind == "cispo":
        values.update({f"{A}.clip_ratio_low": alg.cispo.cispo_eps_clip_low,
                       f"{A}.clip_ratio_high": alg.cispo.cispo_eps_clip_high})  # fmt: skip
    elif kind == "clip_cov":
        pl = f"{A}.policy_loss"
        values.update({f"{pl}.clip_cov_ratio": alg.clip_cov.clip_ratio, f"{pl}.clip_cov_lb": alg.clip_cov.clip_cov_lb,
                       f"{pl}.clip_cov_ub": alg.clip_cov.clip_cov_ub})  # fmt: skip
    elif kind == "kl_cov":
        pl = f"{A}.policy_loss"
        values.update({f"{pl}.kl_cov_ratio": alg.kl_cov.kl_cov_frac, f"{pl}.ppo_kl_coef": alg.kl_cov.ppo_kl_coef})
    reduction = alg.loss_reduction
    if reduction in TO_AGG:
        values[f"{A}.loss_agg_mode"] = TO_AGG[reduction]
        if reduction == "seq_mean_token_sum_norm" and alg.max_seq_len:
            values[f"{A}.loss_scale_factor"] = alg.max_seq_len
    values[f"{A}.entropy_coeff"] = alg.entropy_loss_coef if alg.use_entropy_loss else 0.0
    values[f"{A}.use_kl_loss"] = alg.use_kl_loss
    if alg.use_kl_loss or not alg.use_kl_in_reward:  # rlc's one estimator and coefficient: the loss's
        values[f"{A}.kl_loss_coef"] = alg.kl_loss_coef
        values[f"{A}.kl_loss_type"] = TO_KL.get(alg.kl_estimator_type, alg.kl_estimator_type)
    return values


def _algorithm(spec: RlcSpec) -> dict[str, Any]:
    alg = spec.trainer.algorithm
    values: dict[str, Any] = {
        f"{ALG}.adv_estimator": TO_ESTIMATOR.get(alg.advantage_estimator, alg.advantage_estimator),
        f"{ALG}.gamma": alg.gamma,
        f"{ALG}.lam": alg.lambd,
        f"{ALG}.norm_adv_by_std_in_grpo": alg.grpo_norm_by_std,
        f"{ALG}.use_kl_in_reward": alg.use_kl_in_reward,
    }
    if alg.use_kl_in_reward and not alg.use_kl_loss:  # rlc's one estimator and coefficient: the reward's
        values.update({f"{ALG}.kl_penalty": TO_KL.get(alg.kl_estimator_type, alg.kl_estimator_type),
                       f"{ALG}.kl_ctrl.kl_coef": alg.kl_loss_coef, f"{ALG}.kl_ctrl.type": alg.kl_ctrl.type,
                       f"{ALG}.kl_ctrl.horizon": alg.kl_ctrl.horizon,
                       f"{ALG}.kl_ctrl.target_kl": alg.kl_ctrl.kl_target})  # fmt: skip
    if algorithms.advantage_estimator(alg.advantage_estimator).needs_sum_pi_squared:  # verl's actor computes it
        values[f"{A}.calculate_sum_pi_squared"] = True  # only when told (its trainer asserts it is there)
    if alg.dynamic_sampling.type == "filter":
        values.update({f"{ALG}.filter_groups.enable": True,
                       f"{ALG}.filter_groups.max_num_gen_batches": alg.dynamic_sampling.max_sample_batches})  # fmt: skip
    if alg.pf_ppo.reweight_method is not None:
        values.update({f"{ALG}.use_pf_ppo": True, f"{ALG}.pf_ppo.reweight_method": alg.pf_ppo.reweight_method,
                       f"{ALG}.pf_ppo.weight_pow": alg.pf_ppo.weight_pow})  # fmt: skip
    return values | _rollout_correction(alg)


def _rollout_correction(alg) -> dict[str, Any]:
    """verl's rollout_correction from the TIS weight and the rejection sampling (rules.verl_trainer refuses SkyRL's
    masks, which verl lacks), and its bypass mode; the engines then return their log-probs."""
    rc, opc = f"{ALG}.rollout_correction", alg.off_policy_correction
    values: dict[str, Any] = {}
    if alg.policy_loss_type == "bypass":
        values.update({f"{rc}.bypass_mode": True, f"{rc}.loss_type": alg.bypass.loss_type})
    if opc.tis_ratio_type is not None:
        high = getattr(opc, f"{opc.tis_ratio_type}_tis_ratio_clip_high")
        low = opc.tis_ratio_clip_low
        values.update({f"{rc}.rollout_is": opc.tis_ratio_type,
                       f"{rc}.rollout_is_threshold": high if low is None else f"{low}_{high}",
                       f"{rc}.rollout_is_batch_normalize": opc.tis_batch_normalize})  # fmt: skip
    if opc.rejection_sampling:
        values.update({f"{rc}.rollout_rs": ",".join(opc.rejection_sampling),
                       f"{rc}.rollout_rs_threshold": _rs_threshold(opc)})  # fmt: skip
    if values:
        values[f"{R}.calculate_log_probs"] = True
    return values


def _reward(spec: RlcSpec) -> dict[str, Any]:
    """env_class reward_function is verl's custom_reward_function (with trainer.experiment_name in extra_info: its
    gdpo reward manager); DAPO's overlong penalty is its dapo reward manager's overlong buffer, counted back from
    the longest response; GDPO's components are the same keys of the function's dict (RLC-E662 refuses the rest)."""
    alg, rf = spec.trainer.algorithm, spec.environment.skyrl_gym.reward_function
    values: dict[str, Any] = {}
    if spec.environment.env_class == "reward_function":
        values.update({"reward.custom_reward_function.path": rf.path, "reward.custom_reward_function.name": rf.name})
        if rf.kwargs:
            values["reward.custom_reward_function.reward_kwargs"] = dict(rf.kwargs)
        if rf.experiment_name is not None:
            values["reward.reward_manager.name"] = "gdpo"
    if alg.gdpo_reward_keys:
        values[f"{ALG}.gdpo_reward_keys"] = list(alg.gdpo_reward_keys)
        if alg.gdpo_reward_weights is not None:
            values[f"{ALG}.gdpo_reward_weights"] = list(alg.gdpo_reward_weights)
    if alg.overlong_buffer_len is not None:
        buffer = {"enable": True, "len": alg.overlong_buffer_len,
                  "penalty_factor": alg.overlong_buffer_penalty_factor, "log": False}  # fmt: skip
        values.update({"reward.reward_manager.name": "dapo", "reward.reward_kwargs.overlong_buffer_cfg": buffer,
                       "reward.reward_kwargs.max_resp_len": spec.generator.sampling_params.max_generate_length})  # fmt: skip
    return values


def _rs_threshold(opc) -> float | str:
    """verl's rollout_rs_threshold: one entry per mode ("low_high" for a k1 mode with its lower bound), or the one
    bound all modes share."""
    modes = list(dict.fromkeys(opc.rejection_sampling))
    highs = list(opc.rejection_threshold_high or [])
    if len(highs) == 1 and not opc.rejection_threshold_low:
        return highs[0]
    highs = highs * len(modes) if len(highs) == 1 else highs
    k1 = [m for m in modes if m.endswith("k1")]
    lows = list(opc.rejection_threshold_low or [])
    lows = lows * len(k1) if len(lows) == 1 else lows
    low_of = dict(zip(k1, lows, strict=False))
    return ",".join(f"{low_of[m]}_{h}" if m in low_of else str(h) for m, h in zip(modes, highs, strict=True))


def _critic(spec: RlcSpec) -> dict[str, Any]:
    t = spec.trainer
    critic = has_critic(spec)
    values: dict[str, Any] = {}
    if critic != (t.algorithm.advantage_estimator == "gae"):  # verl's default: a critic for gae only
        values[f"{C}.enable"] = critic
    if critic:
        values.update({f"{C}.model.path": t.critic.model.path, f"{C}.optim.lr": t.critic.optimizer_config.lr,
                       f"{C}.cliprange_value": t.algorithm.value_clip})  # fmt: skip
        if on_megatron(spec, "critic") != (t.strategy == "megatron"):
            values[f"{C}.strategy"] = "megatron" if on_megatron(spec, "critic") else "fsdp2"
        if on_megatron(spec, "critic"):  # verl's critic has parallel sizes of its own
            mc = t.critic.megatron_config
            for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                        "expert_model_parallel_size", "expert_tensor_parallel_size"):  # fmt: skip
                values[f"{C}.megatron.{key}"] = getattr(mc, key)
            for key, value in (mc.transformer_config_kwargs or {}).items():
                values[f"{C}.megatron.override_transformer_config.{key}"] = value
    return values


def _rollout(spec: RlcSpec) -> dict[str, Any]:
    g, ie = spec.generator, spec.generator.inference_engine
    sp = g.sampling_params
    values: dict[str, Any] = {
        f"{R}.name": ie.backend,
        f"{R}.n": g.n_samples_per_prompt,
        f"{R}.temperature": sp.temperature,
        f"{R}.top_p": sp.top_p,
        f"{R}.top_k": sp.top_k,
        f"{R}.gpu_memory_utilization": ie.gpu_memory_utilization,
        f"{R}.tensor_model_parallel_size": ie.tensor_parallel_size,
        f"{R}.data_parallel_size": ie.data_parallel_size,
        f"{R}.pipeline_model_parallel_size": ie.pipeline_parallel_size,
        f"{R}.expert_parallel_size": ie.expert_parallel_size,
        f"{R}.enforce_eager": ie.enforce_eager,
        f"{R}.enable_chunked_prefill": ie.enable_chunked_prefill,
        f"{R}.enable_prefix_caching": ie.enable_prefix_caching,
        f"{R}.max_num_batched_tokens": ie.max_num_batched_tokens,
        f"{R}.max_num_seqs": ie.max_num_seqs,
        f"{R}.dtype": ie.model_dtype,
        f"{R}.val_kwargs.n": g.eval_n_samples_per_prompt,
    }
    esp = g.eval_sampling_params
    if esp is not None and esp.temperature > 0:
        values.update({f"{R}.val_kwargs.do_sample": True, f"{R}.val_kwargs.temperature": esp.temperature,
                       f"{R}.val_kwargs.top_p": esp.top_p, f"{R}.val_kwargs.top_k": esp.top_k})  # fmt: skip
    else:
        values[f"{R}.val_kwargs.do_sample"] = False
    for key, value in (ie.engine_init_kwargs or {}).items():
        values[f"{R}.engine_kwargs.{ie.backend}.{key}"] = value
    return values


def _trainer(spec: RlcSpec) -> dict[str, Any]:
    t = spec.trainer
    values: dict[str, Any] = {
        f"{T}.total_epochs": t.epochs,
        f"{T}.logger": ["console", t.logger] if t.logger in LOGGERS else ["console"],
        f"{T}.save_freq": t.ckpt_interval,
        f"{T}.test_freq": t.eval_interval,
        f"{T}.val_before_train": t.eval_before_train,
        f"{T}.default_local_dir": t.ckpt_path,
        f"{T}.resume_mode": RESUME.get(t.resume_mode or "none", "disable"),
        f"{T}.max_actor_ckpt_to_keep": None if t.max_ckpts_to_keep < 0 else t.max_ckpts_to_keep,
    }
    if t.max_training_steps is not None:
        values[f"{T}.total_training_steps"] = t.max_training_steps
    if t.resume_path:
        values[f"{T}.resume_from_path"] = t.resume_path
    return values


def flat(values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys down to the leaves (a non-empty mapping value becomes its leaves)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and value:
            out.update(flat({f"{key}.{k}": v for k, v in value.items()}))
        else:
            out[key] = value
    return out


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar: strings quoted (so '1e-3' stays a string and spaces survive)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def overrides(spec: RlcSpec) -> tuple[str, ...]:
    """verl's Hydra overrides for the spec: what differs from verl's defaults (after its interpolations), what verl
    always needs, then launch.trainer_settings.verl; `+key` for a key verl's config lacks."""
    engine = "megatron" if spec.trainer.strategy == "megatron" else "dp"
    tree = defaults(DEFAULTS)["engines"][engine]
    wanted = flat(verl_values(spec))
    wanted.update(flat(dict((spec.launch.trainer_settings or {}).get("verl") or {})))
    head = ["model_engine=megatron"] if engine == "megatron" else []
    written: dict[str, Any] = {k: v for k, v in wanted.items() if k in ALWAYS}
    for _ in range(8):  # an override changes what other keys' interpolations give: compose until none differs
        composed = compose_overrides(
            [Override(o) for o in head + [_override(tree, k, v) for k, v in written.items()]], release=DEFAULTS
        ).config
        missing = {k: v for k, v in wanted.items() if k not in written and lookup(composed, k) != v}
        # a key under an interpolation (the reference's megatron settings are the actor's) waits for its source
        direct = {k: v for k, v in missing.items() if not _interpolated(tree, k)}
        if not missing:
            break
        written.update(direct or missing)
    return tuple(head + [_override(tree, k, v) for k, v in written.items()])


def _interpolated(tree: dict, key: str) -> bool:
    parts = key.split(".")
    for i in range(1, len(parts)):
        node = lookup(tree, ".".join(parts[:i]))
        if isinstance(node, str) and "${" in node:
            return True
    return False


def _override(tree: dict, key: str, value: Any) -> str:
    plus = "+" if lookup(tree, key) is MISSING else ""
    return f"{plus}{key}={hydra_value(value)}"


def requirements(spec: RlcSpec, version: str) -> tuple[str, ...]:
    """verl's release with the extras of the job's engine and strategy (verl's own extras: vllm or sglang, fsdp or
    megatron)."""
    settings = flat(dict((spec.launch.trainer_settings or {}).get("verl") or {}))
    backend = settings.get(f"{R}.name", spec.generator.inference_engine.backend)
    extras = [
        "sglang" if backend == "sglang" else "vllm",
        "megatron" if spec.trainer.strategy == "megatron" else "fsdp",
    ]
    return (f"verl[{','.join(extras)}]=={version}",)

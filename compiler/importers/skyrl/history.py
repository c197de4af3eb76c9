"""Keys SkyRL's base config carried on branches and releases, beyond the mainline renames in `legacy`.

Each entry says what the key did in SkyRL, when dropping it changes nothing, and which finding it gets when
dropping it would change what runs. Written from the history of SkyRL's `ppo_base_config.yaml` on every
branch we could read (tests/fixtures/skyrl-history holds those versions; tools/skyrl_history.py says how
they were gathered).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rlc.core.dataclass import dataclass

# Finding codes for history keys (docs/rules.md lists them).
FEATURE = "RLC-E030"  # the value turns on a SkyRL feature rlc does not run
HYDRA_IN_SPEC = "RLC-E031"  # an unknown Hydra default group writes into a spec section
TOKEN_BUDGET = "RLC-E032"  # dynamic batching is on but no budget says how many tokens a micro-batch holds
MEMORY_ONLY = "RLC-W030"  # changes memory use or debug output, not the training
HYDRA_OUTSIDE = "RLC-W031"  # an unknown Hydra default group rlc's stages never read
SAFETY_LIMIT = "RLC-W032"  # a wall-clock limit rlc does not enforce (changes only runs that hit it)
OPERATIONS = "RLC-W033"  # logging, uploads, retries or process layout: how a run is operated, not what it trains

# What a warning-level drop says about the value it dropped (an error-level one says it changes what runs).
WARNING_SAYS = {
    MEMORY_ONLY: "its value changes memory use or debug output, not what is trained",
    HYDRA_OUTSIDE: "no stage of the base trainer reads it",
    SAFETY_LIMIT: "rlc does not enforce this limit; only runs that reach it differ",
    OPERATIONS: "its value changes how the run is operated, not what is trained",
}

# Old names of keys spec v1 has (SkyRL renamed them before the generator.inference_engine move).
RENAMES: dict[str, str] = {
    "generator.use_http_server_inference_engine_client": "generator.inference_engine.enable_http_endpoint",
    "generator.http_server_inference_engine_client_host": "generator.inference_engine.http_endpoint_host",
    "generator.http_server_inference_engine_client_port": "generator.inference_engine.http_endpoint_port",
    # A branch's early name for the off-policy correction block; its sub-keys are checked against the new one.
    "trainer.algorithm.rollout_correction": "trainer.algorithm.off_policy_correction",
    # The block's first names (2025-12), renamed in SkyRL before release: caps became clips, the rejection mask
    # the sequence mask, and the outlier-token thresholds lost their sequence_ prefix.
    **{
        f"trainer.algorithm.off_policy_correction.{old}": f"trainer.algorithm.off_policy_correction.{new}"
        for old, new in (
            ("token_tis_ratio_cap_high", "token_tis_ratio_clip_high"),
            ("sequence_tis_ratio_cap_high", "sequence_tis_ratio_clip_high"),
            ("rejection_mask_type", "sequence_mask_metric"),
            ("geo_rejection_mask_ratio_cap_high", "geo_mask_high"),
            ("geo_rejection_mask_ratio_cap_low", "geo_mask_low"),
            ("sequence_rejection_mask_ratio_cap_high", "product_mask_high"),
            ("sequence_rejection_mask_ratio_cap_low", "product_mask_low"),
            ("sequence_mask_low", "outlier_token_is_threshold_low"),
            ("sequence_mask_high", "outlier_token_is_threshold_high"),
        )
    },
    # The HTTP endpoint's names between the http_server_inference_engine_client ones and the inference_engine move.
    "generator.use_inference_http_server": "generator.inference_engine.enable_http_endpoint",
    "generator.inference_http_server_host": "generator.inference_engine.http_endpoint_host",
    "generator.inference_http_server_port": "generator.inference_engine.http_endpoint_port",
}

# Values SkyRL spelled otherwise on the way (by the key as renamed): the string "null" the off-policy block's first
# version used for null, and its rejection mask's "sequence" (the product of the ratios) for product.
VALUES: dict[str, dict[Any, Any]] = {
    "trainer.algorithm.off_policy_correction.tis_ratio_type": {"null": None},
    "trainer.algorithm.off_policy_correction.sequence_mask_metric": {"null": None, "sequence": "product"},
}

# Sampling arguments an SGLang fork (ai-blaise/SkyRL) added to generator.sampling_params that vLLM also takes,
# as {fork's name: (vLLM's name, vLLM's default)}. A value other than the default moves to
# generator.sampling_params.additional_kwargs, which rlc hands to vLLM as is; the default drops (nothing to pass).
ENGINE_SAMPLING: dict[str, tuple[str, Any]] = {
    "frequency_penalty": ("frequency_penalty", 0.0),
    "presence_penalty": ("presence_penalty", 0.0),
    "min_new_tokens": ("min_tokens", 0),
    "skip_special_tokens": ("skip_special_tokens", True),
    "spaces_between_special_tokens": ("spaces_between_special_tokens", True),
    "ignore_eos": ("ignore_eos", False),
    "logit_bias": ("logit_bias", None),
    "stop_token_ids": ("stop_token_ids", None),
    "no_stop_trim": ("include_stop_str_in_output", False),
}


_REFERENCE = re.compile(r"\$\{([^{}:]+)\}")


def inert(value: Any) -> bool:
    """True when a value turns nothing on: null, false, empty, a disabled block, or a block of such values."""
    if value is None or value is False or value == "" or value == [] or value == {}:
        return True
    if isinstance(value, str) and _REFERENCE.fullmatch(value.strip()):
        return True  # a reference to another key, dropped or migrated on its own
    if isinstance(value, dict):
        if value.get("enabled") is False or value.get("enable") is False:  # SkyRL spells its switches both ways
            return True
        return all(inert(v) for v in value.values())
    return False


def _same(value: Any, default: Any) -> bool:
    """Equal, and a flag only to a flag (0 is not False)."""
    return bool(value == default) and isinstance(value, bool) == isinstance(default, bool)


def at_engine_default(value: Any, default: Any) -> bool:
    """True when `value` asks vLLM for nothing: unset, empty, or vLLM's own default (a flag only as a flag)."""
    return value is None or value == [] or value == {} or _same(value, default)


@dataclass(frozen=True)
class Retired:
    """A key with no spec v1 equivalent."""

    path: str
    reason: str  # what the key did in SkyRL
    harmless: Callable[[Any, Callable[[str], Any]], bool]  # (value, get) -> dropping it changes nothing
    code: str = FEATURE

    @property
    def severity(self) -> str:
        return "warning" if self.code.startswith("RLC-W") else "error"


def _off(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None or value is False or value == 0 or value == {} or value == []


def _block_off(value: Any, get: Callable[[str], Any]) -> bool:
    return inert(value)


def _unset(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None


def _only_with(flag: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless unless `flag` (read before anything is dropped) is true."""
    return lambda value, get: get(flag) is not True


def _at(*defaults: Any) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless when unset or at one of the values the branch shipped as its (inert) default."""

    def harmless(value: Any, get: Callable[[str], Any]) -> bool:
        if value is None:
            return True
        if isinstance(value, str):
            return value.lower() in {str(d).lower() for d in defaults if isinstance(d, str)}
        for d in defaults:
            if isinstance(d, bool) or isinstance(value, bool):
                if value is d:
                    return True
            elif not isinstance(d, str) and value == d:
                return True
        return False

    return harmless


def _only_when(key: str, *chosen: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless unless `key` (read before anything is dropped) names one of `chosen` (a prefix match)."""

    def harmless(value: Any, get: Callable[[str], Any]) -> bool:
        picked = get(key)
        return not (isinstance(picked, str) and picked.lower().startswith(chosen))

    return harmless


def _above(limit: int) -> Callable[[Any, Callable[[str], Any]], bool]:
    return lambda value, get: value is None or (isinstance(value, int) and value <= limit)


def _single_expert_group(role: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless while the role's FSDP mesh has one expert group (no expert parallelism)."""
    return lambda value, get: get(f"trainer.{role}.fsdp_config.expert_model_parallel_size") in (None, 1)


def _block_at(**defaults: Any) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless when unset, or a block whose every key holds the value the branch shipped."""

    def harmless(value: Any, get: Callable[[str], Any]) -> bool:
        if value is None:
            return True
        return isinstance(value, dict) and all(k in defaults and v == defaults[k] for k, v in value.items())

    return harmless


def _field_at(field: str, *values: Any) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless when unset, or a block whose `field` is missing or one of `values`."""
    return lambda value, get: value is None or (isinstance(value, dict) and value.get(field) in (None, *values))


def _tis_off(value: Any, get: Callable[[str], Any]) -> bool:
    """Harmless unless truncated importance sampling is on (legacy use_tis, or its off_policy_correction form)."""
    return (
        get("trainer.algorithm.use_tis") is not True
        and get("trainer.algorithm.off_policy_correction.tis_ratio_type") is None
    )


def _fields_unset(*fields: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless when unset, or a block in which none of `fields` is set."""
    return lambda value, get: value is None or (isinstance(value, dict) and all(value.get(f) is None for f in fields))


def _is_one(key: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless unless `key` (read before anything is dropped) is set to something other than 1."""
    return lambda value, get: get(key) in (None, 1)


def _is_zero(key: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless unless `key` (read before anything is dropped) is set to something other than 0."""
    return lambda value, get: get(key) in (None, 0, 0.0)


def _no_teacher(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None or (isinstance(value, dict) and value.get("model_path") in (None, ""))


def _adamw(value: Any, get: Callable[[str], Any]) -> bool:
    return value is None or str(value).lower() in ("adam", "adamw")


def _optimizer_of(role: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    def harmless(value: Any, get: Callable[[str], Any]) -> bool:
        chosen = [get(f"trainer.{role}.optimizer_config.{k}") for k in ("optimizer_type", "optimizer")]
        return not any(isinstance(c, str) and c.lower() == "muon" for c in chosen)

    return harmless


def _as_shipped(shipped: dict[str, Any]) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Harmless when unset, or a block whose every key is off (null, false, empty) or holds the value shipped."""

    def matches(value: Any, default: Any) -> bool:
        if isinstance(value, dict) and isinstance(default, dict):
            return all(inert(v) or (k in default and matches(v, default[k])) for k, v in value.items())
        return _same(value, default) or inert(value)

    return lambda value, get: value is None or (isinstance(value, dict) and matches(value, shipped))


def _block_off_but(key: str) -> Callable[[Any, Callable[[str], Any]], bool]:
    """Like _block_off, leaving out `key` (a retired entry of its own judges it)."""
    return lambda value, get: _block_off(
        {k: v for k, v in value.items() if k != key} if isinstance(value, dict) else value, get
    )


def _sglang_off(value: Any, get: Callable[[str], Any]) -> bool:
    """Harmless when off, or when the engines are not SGLang (the only engine that reads it)."""
    backend = get("generator.inference_engine.backend") or get("generator.backend")
    return _off(value, get) or not (isinstance(backend, str) and backend.lower() == "sglang")


# A SkyRL branch's dynamic batching: the flag, then its training budgets (newest spelling first) and the forward
# passes' own budget (which fell back to max_token_len_per_gpu). SkyRL 0.4 spells the training budget
# trainer.max_tokens_per_microbatch (`skyrl._Step.token_budget`).
DYNAMIC_BATCHING = "trainer.use_dynamic_batching"
TOKEN_BUDGETS = ("trainer.max_token_len_per_gpu_train", "trainer.max_token_len_per_gpu")
FORWARD_BUDGET = "trainer.max_token_len_per_gpu_forward"

_PROFILER_SCHEDULE = (
    "skip_first",
    "wait",
    "warmup",
    "active",
    "repeat",
    "activities",
    "record_shapes",
    "profile_memory",
    "with_stack",
    "with_flops",
    "with_modules",
    "export_type",
    "use_gzip",
)

RETIRED: list[Retired] = [
    Retired(
        "generator.trajectory_timeout_seconds",
        "a wall-clock limit per trajectory; rlc ends trajectories only at their length and turn limits",
        _off,
        SAFETY_LIMIT,
    ),
    Retired(
        "generator.context_folding",
        "folds (summarises) long multi-turn contexts; rlc's generator keeps the whole conversation",
        _block_off,
    ),
    Retired(
        "reward_inference",
        "a separate reward-model inference service; rlc scores rollouts with environments",
        _block_off,
    ),
    Retired(
        "generator.context_warning_threshold",
        "when to warn the model that its context is filling up (with inject_context_status)",
        _only_with("generator.inject_context_status"),
    ),
    Retired(
        "generator.inject_context_status",
        "injects context-usage messages into multi-turn conversations; rlc's generator does not",
        _off,
    ),
    # trainer.algorithm.dro, the DRO policy loss of SkyRL's history, is spec v1's own again (verl's dro, dro.beta)
    Retired(
        "trainer.loss_chunk_size",
        "computes the loss in chunks of this many tokens to save memory (same result); rlc computes it whole",
        _unset,
        MEMORY_ONLY,
    ),
    Retired("trainer.off_policy", "an off-policy training block; rlc's knobs are trainer.fully_async", _block_off),
    Retired("trainer.replay", "a replay buffer of past rollouts; rlc trains on fresh rollouts only", _block_off),
    # trainer.deterministic, deterministic kernels in SkyRL's history, is spec v1's own (rlc_only)
    Retired(
        "generator.retokenize",
        "re-tokenizes generated text before training; rlc trains on the token ids the engine returned",
        _off,
    ),
    Retired(
        "data.env_filter",
        "keeps only the rows of the named environments; rlc trains on every row",
        _block_off,
    ),
    Retired(
        "trainer.dump_training_trajectories",
        "writes each training batch's trajectories to disk (debug output only)",
        _off,
        MEMORY_ONLY,
    ),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.{key}",
            "the optimizer class; rlc trains with AdamW",
            _adamw,
        )
        for role in ("policy", "critic")
        for key in ("optimizer_type", "optimizer")
    ),
    # SkyRL 0.3.0 moved the profiler to trainer.policy.torch_profiler_config (all strategies) and gave it a
    # schedule; `legacy.MOVES` brings the block to the megatron one, whose enable/ranks/save_path spec v1 has.
    *(
        Retired(
            f"trainer.policy.megatron_config.torch_profiler_config.{key}",
            f"torch.profiler's {key} (which steps are traced and what a trace records; debug output only)",
            _only_with("trainer.policy.megatron_config.torch_profiler_config.enable"),
            MEMORY_ONLY,
        )
        for key in _PROFILER_SCHEDULE
    ),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.muon_lr",
            "the Muon optimizer's learning rate (only read when the optimizer is Muon)",
            _optimizer_of(role),
        )
        for role in ("policy", "critic")
    ),
    # -- keys of SkyRL's forks (tests/fixtures/skyrl-history/README.md lists where each was seen) -------------
    Retired("trainer.log_level", "SkyRL's console log level (rlc logs at its own level)", _at("INFO"), MEMORY_ONLY),
    Retired(
        "trainer.tracker_commit_each_step",
        "commits each step to the experiment tracker at once (when metrics show up, not what they are)",
        _off,
        OPERATIONS,
    ),
    Retired(
        "trainer.policy.track_extra_gradient_metrics",
        "logs extra gradient metrics (debug output only)",
        _off,
        MEMORY_ONLY,
    ),
    Retired(
        "trainer.s3_export", "uploads checkpoints to S3 (rlc writes them to trainer.ckpt_path)", _block_off, OPERATIONS
    ),
    Retired("trainer.hf_upload_mode", "the layout of uploads to the Hugging Face Hub", _at("latest"), OPERATIONS),
    Retired("trainer.run_group", "groups runs in the experiment tracker", _unset, OPERATIONS),
    Retired("trainer.eval_retries", "retries a failed evaluation", _above(1), OPERATIONS),
    Retired(
        "trainer.placement.policy_strict_spread_pg",
        "reserves the policy's placement group before the engines' (the order Ray places bundles in)",
        _off,
        OPERATIONS,
    ),
    Retired(
        "trainer.save_optimizer_state_in_ckpt",
        "leaves optimizer state out of checkpoints (only a resumed run differs)",
        _at(True),
        OPERATIONS,
    ),
    Retired(
        "trainer.save_dataloader_state_in_ckpt",
        "leaves the dataloader position out of checkpoints (only a resumed run differs)",
        _at(True),
        OPERATIONS,
    ),
    Retired(
        "trainer.dump_every_batch", "writes evaluation results after each batch (debug output only)", _off, MEMORY_ONLY
    ),
    Retired("trainer.dump_eval_per_turn", "writes evaluation results per turn (debug output only)", _off, MEMORY_ONLY),
    Retired("trainer.dump_rollout_logs", "writes rollout logs to disk (debug output only)", _off, MEMORY_ONLY),
    Retired(
        "trainer.rollout_visualization", "logs token-level rollout plots (debug output only)", _block_off, MEMORY_ONLY
    ),
    Retired(
        "trainer.micro_critic_train_batch_size_per_gpu",
        "a separate micro-batch size for the critic; rlc uses trainer.micro_train_batch_size_per_gpu for both "
        "(gradient accumulation gives the same update, memory use differs)",
        _unset,
        MEMORY_ONLY,
    ),
    Retired("trainer.eval_only", "evaluates once and exits without training", _off),
    Retired("trainer.max_steps", "stops training after this many steps (rlc runs trainer.epochs)", _unset),
    Retired("trainer.algorithm.policy_loss_coef", "scales the policy-gradient loss", _at(1, 1.0)),
    Retired("trainer.algorithm.obs_prediction_coef", "weight of an auxiliary observation-prediction loss", _off),
    Retired("trainer.algorithm.task_advantage_normalize", "normalizes advantages per task", _off),
    Retired("trainer.algorithm.z_clip", "adaptive (z-score) gradient-norm clipping", _block_off),
    Retired("trainer.algorithm.stale_clip", "damps the learning rate for stale batches", _block_off),
    *(
        Retired(
            f"trainer.algorithm.{key}",
            "the RLOO-N estimator's group settings (only read when advantage_estimator is rloo_n*)",
            _only_when("trainer.algorithm.advantage_estimator", "rloo_n"),
        )
        for key in ("rloo_n_min_group_size", "rloo_n_filter_zero_reward_groups")
    ),
    Retired(
        "trainer.algorithm.icvl",
        "the in-context value estimator's settings (only read when advantage_estimator is icvl)",
        _only_when("trainer.algorithm.advantage_estimator", "icvl"),
    ),
    Retired(
        "trainer.algorithm.state_action",
        "the state-action TD estimator's Q/V heads (only read when advantage_estimator is state_action_td)",
        _only_when("trainer.algorithm.advantage_estimator", "state_action"),
    ),
    Retired(
        "trainer.algorithm.value_head_type",
        "the critic's value head (rlc's critic regresses the value with MSE)",
        _at("regression"),
    ),
    *(
        Retired(
            f"trainer.algorithm.{key}",
            "the value range and bins of a cross-entropy or sigmoid value head",
            _only_when("trainer.algorithm.value_head_type", "cross_entropy", "sigmoid"),
        )
        for key in ("value_min", "value_max", "value_num_bins")
    ),
    *(
        Retired(
            f"trainer.algorithm.{key}",
            "the settings of a joint-distribution (zip) value head",
            _only_when("trainer.algorithm.value_head_type", "zip"),
        )
        for key in (
            "zip_distribution_token_id",
            "zip_reward_values",
            "zip_num_length_bins",
            "zip_scale_zero_one_rewards",
        )
    ),
    *(
        Retired(f"trainer.{role}.model.lora.lora_type", "the LoRA variant (rlc trains plain LoRA)", _at("lora"))
        for role in ("policy", "critic")
    ),
    *(
        Retired(
            f"trainer.{role}.model.lora.pissa_niter",
            "SVD iterations of a PiSSA adapter initialisation (only read when lora.init_method is pissa*)",
            _only_when(f"trainer.{role}.model.lora.init_method", "pissa"),
        )
        for role in ("policy", "critic")
    ),
    *(
        Retired(f"trainer.{role}.model.load_in_4bit", "loads the model quantised to 4 bits", _off)
        for role in ("policy", "ref", "critic")
    ),
    Retired("trainer.policy.model.freeze_base_model", "trains only the adapters and projections", _off),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.{key}",
            "extra arguments for the optimizer or scheduler class",
            _block_off,
        )
        for role in ("policy", "critic")
        for key in ("optimizer_kwargs", "scheduler_specific_kwargs")
    ),
    # An expert-parallel FSDP mesh (a fork's MoE work); with one expert group none of it is read.
    *(
        Retired(f"trainer.{role}.fsdp_config.{key}", "expert parallelism inside FSDP", _at(1))
        for role in ("policy", "ref", "critic")
        for key in ("expert_model_parallel_size", "expert_tensor_parallel_size")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.moe_router_replay",
            "replays the experts the rollout chose when training a MoE model",
            _off,
        )
        for role in ("policy", "ref", "critic")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.moe_grouped_gemm",
            "grouped-GEMM MoE kernels (the same result, faster)",
            _off,
            MEMORY_ONLY,
        )
        for role in ("policy", "ref", "critic")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.{key}",
            "how experts exchange tokens (only read with fsdp_config.expert_model_parallel_size > 1)",
            _single_expert_group(role),
            MEMORY_ONLY,
        )
        for role in ("policy", "ref", "critic")
        for key in ("moe_token_dispatcher_type", "ep_comm_backend", "deepep_num_sms", "deepep_token_chunk_size")
    ),
    Retired("data.noise_level", "injects label noise into the training data", _off),
    Retired("data.keep_in_memory", "loads datasets fully into RAM (memory use only)", _unset, MEMORY_ONLY),
    *(
        Retired(f"data.{key}", "worker processes that prepare the data (speed only)", _unset, OPERATIONS)
        for key in ("dataset_num_workers", "dataloader_num_workers")
    ),
    *(
        Retired(f"generator.{key}", "serves a different model (e.g. quantised) on the engines", _unset)
        for key in ("inference_model_path", "vllm_model_path")
    ),
    Retired("generator.reset_prompt_each_step", "rebuilds the prompt from the latest observation at each turn", _off),
    Retired(
        "generator.reset_prompt_include_initial_prompt",
        "keeps the first prompt when prompts are rebuilt (with reset_prompt_each_step)",
        _only_with("generator.reset_prompt_each_step"),
    ),
    Retired("generator.branching", "branches new trajectories from finished ones", _block_off),
    Retired("generator.train_child_trajectories", "also trains on trajectories of spawned child agents", _off),
    Retired("generator.child_openrouter_model", "the model child agents call through OpenRouter", _unset),
    Retired(
        "generator.child_openrouter_base_url",
        "where child agents reach OpenRouter (only read with generator.child_openrouter_model)",
        lambda value, get: get("generator.child_openrouter_model") in (None, ""),
    ),
    Retired(
        "generator.enable_child_agents",
        "lets the agent spawn child agents (they call generator.child_openrouter_model; only read with one)",
        lambda value, get: value is not True or get("generator.child_openrouter_model") in (None, ""),
    ),
    Retired("generator.judge_reward_model", "scores rollouts with an LLM judge instead of the environment", _unset),
    Retired(
        "generator.judge_reward_base_url",
        "where the LLM judge is reached (only read with generator.judge_reward_model)",
        lambda value, get: get("generator.judge_reward_model") in (None, ""),
    ),
    Retired("generator.custom_chat_template_key", "picks one of generator.custom_chat_templates by name", _unset),
    Retired(
        "generator.custom_chat_templates",
        "named chat templates (only read with generator.custom_chat_template_key)",
        lambda value, get: get("generator.custom_chat_template_key") in (None, ""),
    ),
    Retired("generator.user_simulator", "rewrites prompts with a simulated user model", _block_off),
    Retired("generator.rollout_log_path", "writes rollouts to a log file (debug output only)", _unset, MEMORY_ONLY),
    Retired(
        "generator.trajectory_logging", "logs trajectories to the tracker (debug output only)", _block_off, MEMORY_ONLY
    ),
    Retired(
        "generator.debug_log_rendered_prompt",
        "logs prompts after the chat template (debug output only)",
        _off,
        MEMORY_ONLY,
    ),
    *(
        Retired(
            f"generator.debug_log_rendered_prompt_{key}",
            "how many rendered prompts are logged (debug output only)",
            _only_with("generator.debug_log_rendered_prompt"),
            MEMORY_ONLY,
        )
        for key in ("every_n_steps", "max_per_step", "max_chars")
    ),
    Retired(
        "generator.timeout_multiplier",
        "scales the timeouts of a generator's API requests",
        _at(1, 1.0),
        SAFETY_LIMIT,
    ),
    Retired(
        "generator.fuse_weights",
        "fuses projection weights before the weight sync (the same weights arrive)",
        _off,
        OPERATIONS,
    ),
    Retired("generator.vllm_stats_interval", "how often engine statistics are logged", _above(1), OPERATIONS),
    Retired("generator.refresh_modalities_each_step", "rebuilds multimodal encoders at each step", _off),
    *(
        Retired(path, "multimodal encoders and projections (rlc trains text models)", _block_off)
        for path in ("modalities", "trainer.modalities", "generator.modalities")
    ),
    Retired("teacher", "a teacher model for distillation (set by teacher.model_path)", _no_teacher),
    # -- the MarinSkyRL fork (ekellbuch/MarinSkyRL) ------------------------------------------------------------
    Retired(
        "checkpoint_export",
        "exports a stored checkpoint (and uploads it to the Hugging Face Hub) instead of training",
        _fields_unset("step", "checkpoint_path", "export_root", "hf_hub_repo_id"),
        OPERATIONS,
    ),
    Retired(
        "trainer.debug_mode",
        "stack dumps and collective flight recording (debug output only)",
        _at("off", "light"),
        MEMORY_ONLY,
    ),
    Retired(
        "trainer.collective_phase_diagnostics", "per-rank collective phase logs (debug output only)", _off, MEMORY_ONLY
    ),
    Retired(
        "trainer.distributed",
        "placement-group and collective timeouts (rlc applies its own)",
        _block_at(placement_group_timeout_seconds=180, worker_collective_timeout_seconds=1800),
        SAFETY_LIMIT,
    ),
    Retired(
        "trainer.model_load_retry",
        "retries a failed model load",
        _block_at(max_retries=5, backoff_base_seconds=2.0, backoff_cap_seconds=32.0),
        OPERATIONS,
    ),
    Retired(
        "trainer.progress", "console progress reporting (output only)", _field_at("mode", "auto", "off"), MEMORY_ONLY
    ),
    Retired(
        "trainer.sampler_ledger",
        "records which prompts were sampled to a ledger file",
        _field_at("path", None),
        OPERATIONS,
    ),
    Retired(
        "trainer.preflight_gate",
        "a reward check before training that can stop the run (only runs that fail it differ)",
        _block_off,
        SAFETY_LIMIT,
    ),
    Retired("trainer.attn_backend", "the trainer's attention kernel (the same result)", _at("auto"), MEMORY_ONLY),
    *(
        Retired(f"trainer.placement.{key}", "how Ray bundles and pins the policy's GPUs", _off, OPERATIONS)
        for key in ("policy_per_gpu_bundles", "policy_force_cvd_mask", "enable_numa_affinity")
    ),
    Retired("trainer.policy.host_memory_monitor", "logs host memory use (debug output only)", _block_off, MEMORY_ONLY),
    Retired(
        "trainer.policy.grug_query_bias_update_mode",
        "how a Grug MoE router's query bias is updated during training",
        _at("frozen"),
    ),
    *(
        Retired(f"trainer.policy.{key}", "a Grug MoE router's query-bias update", _unset)
        for key in ("grug_query_bias_interpolation_weight", "grug_query_bias_update_rate")
    ),
    *(
        Retired(f"trainer.{role}.model.source_uri", "loads the weights from this URI instead of model.path", _block_off)
        for role in ("policy", "ref")
    ),
    *(
        Retired(f"trainer.{role}.model.source_identity", "a provenance label of the weights", _block_off, OPERATIONS)
        for role in ("policy", "ref")
    ),
    Retired("trainer.policy.model.lm_head_compute_dtype", "the dtype the LM head is computed in", _unset),
    *(
        Retired(
            f"trainer.{role}.optimizer_config.fsdp_parameter_storage_dtype",
            "the dtype FSDP stores parameters in",
            _unset,
        )
        for role in ("policy", "critic")
    ),
    *(
        Retired(f"trainer.{role}.fsdp_config.context_parallel_size", "context parallelism inside FSDP", _at(1))
        for role in ("policy", "ref", "critic")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.{key}",
            "how context parallelism splits attention (only read with fsdp_config.context_parallel_size > 1)",
            _is_one(f"trainer.{role}.fsdp_config.context_parallel_size"),
            MEMORY_ONLY,
        )
        for role in ("policy", "ref", "critic")
        for key in ("cp_style", "cp_rotate_method")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.expert_loader_chunk_rows",
            "rows per chunk when expert weights are loaded (memory use only)",
            _single_expert_group(role),
            MEMORY_ONLY,
        )
        for role in ("policy", "ref", "critic")
    ),
    *(
        Retired(
            f"trainer.{role}.fsdp_config.use_grouped_mm",
            "grouped matmul MoE kernels (the same result)",
            _off,
            MEMORY_ONLY,
        )
        for role in ("policy", "ref", "critic")
    ),
    Retired("trainer.algorithm.batch_invariant", "batch-invariant (deterministic) kernels", _off),
    Retired("trainer.algorithm.group_advantage_min_size", "a minimum group size for group advantages", _unset),
    Retired(
        "trainer.algorithm.resolved_group_advantage",
        "how groups are formed for the advantage (rlc groups the n_samples_per_prompt samples of a prompt)",
        _field_at("kind", "exact_physical"),
    ),
    *(
        Retired(
            f"trainer.algorithm.{key}",
            "token splicing for truncated importance sampling (only read with TIS on)",
            _tis_off,
        )
        for key in ("tis_splice", "tis_lcs_alert_threshold")
    ),
    Retired("trainer.algorithm.tito_full", "token-in/token-out handling of full conversations", _unset),
    Retired("trainer.algorithm.enable_token_reward_channel", "per-token rewards from the environment", _off),
    Retired("trainer.algorithm.think_token_weight", "weights the loss on thinking tokens", _at(1, 1.0)),
    Retired("trainer.algorithm.think_token_cost", "a reward cost per thinking token", _off),
    Retired(
        "trainer.algorithm.think_max_cost_per_turn",
        "caps the thinking-token cost per turn (only read with think_token_cost)",
        _is_zero("trainer.algorithm.think_token_cost"),
    ),
    *(
        Retired(
            f"trainer.algorithm.{key}",
            "the DPPO loss's divergence (only read when policy_loss_type is dppo)",
            _only_when("trainer.algorithm.policy_loss_type", "dppo"),
        )
        for key in ("dppo_divergence_type", "dppo_divergence_threshold")
    ),
    Retired("trainer.algorithm.dynamic_sampling.min_reward_std", "a reward-spread floor for dynamic sampling", _off),
    Retired(
        "trainer.algorithm.dynamic_sampling.metric",
        "what dynamic sampling judges a group by (reward, as rlc does, or another metric)",
        _at("reward"),
    ),
    Retired(
        "trainer.fully_async.preserve_inflight_kv_cache_on_weight_update",
        "keeps requests' KV cache across a weight sync instead of prefilling them again (only read in fully async "
        "training)",
        lambda value, get: value is not True or get("trainer.fully_async.enabled") is not True,
    ),
    Retired(
        "trainer.anyscale_remote_upload_dir",
        "where checkpoints are uploaded on Anyscale (only read with trainer.enable_anyscale_upload)",
        lambda value, get: get("trainer.enable_anyscale_upload") is not True,
        OPERATIONS,
    ),
    Retired(
        "trainer.algorithm.dynamic_sampling.informative_on",
        "which reward decides that a group is informative (only read with dynamic_sampling.type)",
        lambda value, get: get("trainer.algorithm.dynamic_sampling.type") is None,
    ),
    Retired(
        "trainer.fully_async.admission_stall_timeout",
        "how long fully-async admission may stall before the run stops",
        _unset,
        SAFETY_LIMIT,
    ),
    Retired(
        "generator.engine_init_timeout_seconds",
        "how long an inference engine may take to start",
        _at(1800),
        SAFETY_LIMIT,
    ),
    Retired("generator.vllm_attention_backend", "vLLM's attention kernel (the same result)", _unset, MEMORY_ONLY),
    Retired(
        "generator.gdn_backend", "the Gated DeltaNet kernel of the engines (the same result)", _at("torch"), MEMORY_ONLY
    ),
    Retired("generator.inference_engine_mp_backend", "runs each engine's workers as processes", _off, OPERATIONS),
    Retired(
        "generator.inference_engine_decode_context_parallel_size",
        "decode context parallelism in the engines",
        _at(1),
    ),
    Retired(
        "generator.max_logprobs", "the most log-probs an engine may return (memory use only)", _above(1), MEMORY_ONLY
    ),
    Retired("generator.coordinator_executor_workers", "threads of the rollout coordinator", _at(256), OPERATIONS),
    *(
        Retired(
            f"generator.{key}",
            "how router-replay data reaches the trainer (only read with fsdp_config.moe_router_replay)",
            _only_with("trainer.policy.fsdp_config.moe_router_replay"),
            OPERATIONS,
        )
        for key in ("r3_transport", "r3_dispatch_put_timeout_seconds")
    ),
    Retired("generator.trajectory_reward_shaping", "shapes rewards by loops, length and stop reasons", _block_off),
    Retired("data.shuffle", "shuffles the training data (rlc always shuffles, seeded by trainer.seed)", _at(True)),
    Retired("data.sampling", "weighted or adaptive sampling of prompts by domain or grade", _field_at("kind", None)),
    *(
        Retired(f"trainer.{key}", "a family of telemetry records (output only)", _at(True), MEMORY_ONLY)
        for key in ("training_metrics", "policy_train_spans", "generate_spans", "async_spans")
    ),
    Retired(
        "trainer.algorithm.ratio_diagnostics",
        "log-ratio diagnostics (metrics only)",
        _field_at("pooled", False),
        MEMORY_ONLY,
    ),
    Retired(
        "trainer.restore_dataloader_state",
        "restores the dataloader position on resume (only a resumed run differs)",
        _at(True),
        OPERATIONS,
    ),
    Retired(
        "trainer.fully_async.pause_mode",
        "what the engines do with requests in flight at a weight sync",
        _at("abort"),
    ),
    Retired(
        "trainer.fully_async.teacher_scoring",
        "queues of a teacher model's scoring (only read with teacher.model_path)",
        lambda value, get: get("teacher.model_path") in (None, ""),
        OPERATIONS,
    ),
    Retired(
        "generator.weight_sync_transport",
        "how weights reach the engines (the same weights arrive)",
        _at("auto", "broadcast"),
        OPERATIONS,
    ),
    Retired(
        "generator.expert_block_sync",
        "timeouts and checks of the expert-block weight sync",
        _block_at(timeout_seconds=600, verify=False),
        OPERATIONS,
    ),
    Retired("generator.inference_stats_interval", "how often engine statistics are logged", _above(1), OPERATIONS),
    Retired(
        "generator.weight_sync_pause_timeout_seconds",
        "how long engines may take to pause for a weight sync",
        _at(30, 30.0),
        SAFETY_LIMIT,
    ),
    Retired("data.terminal_bench_data", "task directories of an extra terminal-bench dataset", _block_off),
    Retired(
        "trainer.trajectory_selector",
        "keeps a selection (e.g. best of n) of each group's trajectories",
        _field_at("type", None),
    ),
    *(
        Retired(f"trainer.{role}.model.{key}", "loads another revision or tokenizer than model.path's", _block_off)
        for role in ("policy", "ref")
        for key in ("revision", "tokenizer_path", "tokenizer_revision")
    ),
    *(
        Retired(f"trainer.policy.model.lora.{key}", "starts from an existing LoRA adapter", _unset)
        for key in ("adapter_path", "adapter_revision")
    ),
    Retired(
        "trainer.algorithm.group_admission",
        "how long group admission may stall before the run stops",
        _field_at("stall_timeout", None),
        SAFETY_LIMIT,
    ),
    Retired(
        "trainer.fully_async.max_buffered_groups",
        "bounds the finished groups waiting for the trainer (memory use only)",
        _unset,
        MEMORY_ONLY,
    ),
    Retired(
        "trainer.fully_async.first_token_admission",
        "counts staleness from the policy version that sampled the first token",
        _off,
    ),
    Retired("trainer.distillation_token_budget", "stops after this many teacher-scored tokens", _unset),
    *(
        Retired(f"trainer.{key}", "resets a counter when a run resumes (only a resumed run differs)", _off, OPERATIONS)
        for key in ("reset_distillation_token_count_on_resume", "reset_global_step_on_resume")
    ),
    Retired("trainer.export_hf_artifact", "also exports a Hugging Face artifact", _off, OPERATIONS),
    *(
        Retired(
            f"trainer.{key}",
            "leaves optimizer or scheduler state out of checkpoints or resumes (only a resumed run differs)",
            _at(True),
            OPERATIONS,
        )
        for key in (
            "save_optimizer_states",
            "load_optimizer_states",
            "save_lr_scheduler_states",
            "load_lr_scheduler_states",
        )
    ),
    Retired("trainer.diag_group_metrics", "logs per-group rollout diagnostics (metrics only)", _off, MEMORY_ONLY),
    Retired(
        "trainer.dump_train_rollouts", "writes decoded training rollouts to disk (debug output only)", _off, MEMORY_ONLY
    ),
    Retired(
        "trainer.algorithm.global_loss_denom",
        "a global loss denominator (set at run time for the seq_mean_token_sum_norm_global reduction)",
        _unset,
    ),
    Retired(
        "trainer.offload_optimizer_during_rollouts",
        "keeps optimizer state on the CPU during rollouts (memory use only)",
        _off,
        MEMORY_ONLY,
    ),
    Retired(
        "trainer.eval_num_prompts",
        "evaluates a fixed sample of the validation prompts (evaluation output only)",
        _unset,
        MEMORY_ONLY,
    ),
    Retired(
        "generator.require_exact_chat_transport",
        "requires every environment to use the structured-chat transport",
        _off,
    ),
    Retired(
        "generator.speculative_decoding",
        "speculative decoding with a draft model (and its online training)",
        _block_off,
    ),
    Retired(
        "trajectory_runner",
        "a process pool that runs trajectories (the same trajectories)",
        _block_off,
        OPERATIONS,
    ),
    Retired(
        "generator.trajectory_retention",
        "keeps sampled trajectories on disk (debug output only)",
        _block_off,
        MEMORY_ONLY,
    ),
    Retired(
        "rollout",
        "spreads rollout orchestration over several coordinator processes (the same trajectories)",
        _block_off,
        OPERATIONS,
    ),
    # -- the SGLang fork (ai-blaise/SkyRL, and divijdawar/SkyRL built on it) -------------------------------------
    # Its engine blocks are SGLang server arguments; SkyRL's vLLM engines never read them. Each is quiet at the
    # values the fork shipped and says what it would change otherwise.
    Retired(
        "curriculum",
        "picks prompts near a target difficulty that follows the reward (curriculum learning); rlc samples "
        "batches uniformly",
        _block_off,
    ),
    Retired(
        "generator.use_overlapped_weight_sync",
        "keeps SGLang engines generating with the old weights while new ones arrive (more tokens sampled by an "
        "older policy); rlc has no overlapped weight sync",
        _sglang_off,
    ),
    Retired(
        "generator.batched_multi_turn",
        "batches each turn's requests across samples (the same trajectories, sooner)",
        _off,
        OPERATIONS,
    ),
    Retired(
        "generator.kv_cache",
        "the SGLang engines' KV-cache dtype (e.g. FP8) and FP8 GEMM kernels; rlc's engines keep the model dtype",
        _as_shipped({"dtype": "auto", "quantization_param_path": None, "fp8_gemm_backend": "auto"}),
    ),
    Retired(
        "generator.quantization",
        "serves a quantised copy of the policy on the SGLang engines; rlc's engines serve the trained weights",
        _as_shipped({"load_format": "auto", "modelopt": {}}),
    ),
    Retired(
        "generator.deterministic_inference",
        "batch-invariant SGLang kernels, or kernels that match FSDP's numerics (rl_on_policy_target)",
        _as_shipped({}),
    ),
    Retired(
        "generator.sessions",
        "keeps each conversation's KV cache on the SGLang engines between turns (speed and memory only)",
        _as_shipped({"enabled": True, "default_capacity": 8192, "pool_sessions": True, "max_pool_size": 64}),
        MEMORY_ONLY,
    ),
    Retired(
        "generator.lora",
        "LoRA adapters the SGLang engines load beside the model (a request uses one only when "
        "sampling_params.lora_name names it)",
        _as_shipped({"max_loras_per_batch": 8, "eviction_policy": "lru", "backend": "csgmv", "max_chunk_size": 16}),
        OPERATIONS,
    ),
    Retired(
        "generator.custom_logit_processor",
        "lets requests carry their own logit processor (sampling_params.custom_logit_processor decides)",
        _block_off,
        OPERATIONS,
    ),
    Retired(
        "generator.structured_output",
        "the grammar engine for constrained requests (sampling_params.json_schema, regex and ebnf decide)",
        _block_off,
        OPERATIONS,
    ),
    *(
        Retired(f"generator.{key}", f"SGLang's {what} (speed and memory only)", _block_off, MEMORY_ONLY)
        for key, what in (
            ("piecewise_cuda_graph", "CUDA graphs for prefill"),
            ("torch_compile", "torch.compile of the served model"),
            ("cpu_offload", "offload of weights to host memory"),
        )
    ),
    Retired(
        "generator.cuda_graph",
        "which decode batch sizes SGLang captures as CUDA graphs (speed and memory only)",
        _block_off,
        MEMORY_ONLY,
    ),
    Retired(
        "generator.attention.enable_double_sparsity",
        "approximate attention over the heaviest tokens (double sparsity); rlc's engines attend to every token",
        _off,
    ),
    Retired(
        "generator.hierarchical_cache.kv_cache_dtype",
        "the dtype of the host-memory KV cache (e.g. FP8); rlc's engines keep the model dtype",
        _at("auto"),
    ),
    Retired(
        "generator.attention",
        "SGLang's attention kernels for prefill, decode and images (the same result)",
        _block_off_but("enable_double_sparsity"),
        MEMORY_ONLY,
    ),
    Retired(
        "generator.hierarchical_cache",
        "spills the SGLang engines' KV cache to host memory or disk (memory use only)",
        _block_off_but("kv_cache_dtype"),
        MEMORY_ONLY,
    ),
    Retired(
        "generator.metrics",
        "Prometheus metrics, traces and request logs of the SGLang engines (output only)",
        _block_off,
        MEMORY_ONLY,
    ),
    Retired(
        "generator.scheduling",
        "the order, priority, preemption and chunking of SGLang's requests (the same samples)",
        _as_shipped(
            {
                "policy": "fcfs",
                "enable_priority": True,
                "preemption_threshold": 10,
                "conservativeness": 1.0,
            }
        ),
        OPERATIONS,
    ),
    Retired(
        "generator.disaggregation",
        "splits prefill and decode over separate SGLang workers (the same samples)",
        _field_at("mode", "null"),
        OPERATIONS,
    ),
    *(
        Retired(f"generator.{key}", f"SGLang's {what} (the same samples)", _block_off, OPERATIONS)
        for key, what in (
            ("multi_node", "multi-node engine layout and NCCL settings"),
            ("load_balancing", "request routing, expert placement and batching limits"),
        )
    ),
    Retired(
        "generator.health_checks",
        "watchdog, health-check and start-up timeouts of the SGLang engines",
        _block_off,
        SAFETY_LIMIT,
    ),
    Retired(
        "generator.sampling_params.seed",
        "one sampling seed for every request; rlc seeds each request from trainer.seed",
        _unset,
    ),
    *(
        Retired(f"generator.sampling_params.{key}", what, _unset)
        for key, what in (
            ("n", "samples per request; rlc asks for generator.n_samples_per_prompt"),
            ("best_of", "keeps the best of several samples per request"),
            ("lora_name", "the SGLang LoRA adapter that samples a request"),
            ("stop_regex", "a regular expression that ends generation"),
            ("json_schema", "constrains samples to a JSON schema"),
            ("regex", "constrains samples to a regular expression"),
            ("ebnf", "constrains samples to an EBNF grammar"),
            ("custom_logit_processor", "a serialised logit processor applied to each request"),
            ("custom_params", "arguments of the request's custom logit processor"),
        )
    ),
]


def hydra_group(entry: str, known: dict[str, str], sections: set[str]) -> tuple[str, str, str]:
    """(text, severity, code) for one entry of a `defaults:` list."""
    group, _, option = entry.partition(":")
    name, _, package = group.strip().partition("@")
    name = name.strip()
    option = option.strip()
    if name in known:
        return f"{entry} -> {known[name]}", "info", ""
    target = package.strip() or name
    if target.split(".")[0] in sections:
        return (
            f"{entry} -> unknown group: its values land in {target}, which rlc runs; write them out in the "
            "spec (this alters what runs)",
            "error",
            HYDRA_IN_SPEC,
        )
    return (
        f"{entry} -> unknown group: it fills the top-level key {target!r}, which no stage of the base trainer "
        "reads (does not alter what runs)",
        "warning",
        HYDRA_OUTSIDE,
    )

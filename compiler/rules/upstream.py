"""SkyRL 0.4 settings spec v1 accepts but this runtime does not run yet: refused unless left at their default.

Spec v1 knows every field of SkyRL 0.4.0's `SkyRLTrainConfig`, so a SkyRL user's file and overrides load. A field
the runtime executes is used; one it cannot execute yet keeps SkyRL's default, and any other value stops the
compile here (RLC-E801..E849) instead of being silently ignored on the cluster.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rlc.compiler.roles import get
from rlc.compiler.rules.base import Context, Rule
from rlc.spec.model import default_model, to_plain

ROLES = ("policy", "ref", "critic")
MEGATRON_ROLES = ("policy", "ref")


@dataclass(frozen=True)
class Unsupported:
    code: str
    what: str  # the feature, in words
    keys: tuple[str, ...]
    also_accepted: tuple[tuple[str, Any], ...] = ()  # (key, value) pairs the runtime runs besides the default


def _per_role(roles: tuple[str, ...], *suffixes: str) -> tuple[str, ...]:
    return tuple(f"trainer.{role}.{s}" for role in roles for s in suffixes)


_MEGATRON = "megatron_config."
_PROFILER = (
    "enable ranks save_path skip_first wait warmup active repeat activities record_shapes profile_memory "
    "with_stack with_flops with_modules use_gzip export_type"
).split()
_QAT = "enabled group_size symmetric scale_divisor q_min bf16_base_path".split()
_IE = "generator.inference_engine."

UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        "RLC-E801",
        "prompt-loader worker processes (rlc loads prompts in the driver process)",
        ("data.dataloader.num_workers", "data.dataloader.persistent_workers"),
        also_accepted=(("data.dataloader.num_workers", 0),),
    ),
    Unsupported(
        "RLC-E802",
        "multi-adapter LoRA serving and in-memory adapter sync",
        _per_role(ROLES, "model.lora.sync_mode", "model.lora.share_expert_adapters", "model.lora.max_loras")
        + _per_role(ROLES, "model.lora.max_cpu_loras"),
    ),
    Unsupported(
        "RLC-E803",
        "fake-INT4 quantization-aware training",
        _per_role(ROLES, *(f"model.fake_int4_qat.{k}" for k in _QAT)),
    ),
    Unsupported(
        "RLC-E804", "the torch profiler", tuple(f"trainer.policy.torch_profiler_config.{k}" for k in _PROFILER)
    ),
    Unsupported(
        "RLC-E805",
        "Megatron MoE router options (aux loss, routing replay, per-layer logging, router dtype, frozen router)",
        _per_role(
            MEGATRON_ROLES,
            *(
                _MEGATRON + k
                for k in (
                    "moe_aux_loss_coeff",
                    "moe_enable_routing_replay",
                    "moe_per_layer_logging",
                    "moe_router_dtype",
                    "freeze_moe_router",
                    "freeze_dsa_indexer",
                )
            ),
        ),
    ),
    Unsupported(
        "RLC-E806",
        "Megatron FP8 training",
        _per_role(
            MEGATRON_ROLES,
            *(_MEGATRON + k for k in ("fp8", "fp8_recipe", "fp8_param", "fp8_amax_compute_algo")),
            _MEGATRON + "ddp_config.fp8_param_gather",
        ),
    ),
    Unsupported(
        "RLC-E807",
        "distributed Hugging Face export from Megatron",
        _per_role(
            MEGATRON_ROLES,
            _MEGATRON + "hf_export_config.distributed_save",
            _MEGATRON + "hf_export_config.save_every_n_ranks",
        ),
    ),
    Unsupported(
        "RLC-E808",
        "Megatron LoRA options (unmerged adapter sync, shared expert LoRA, MoE LoRA normalization)",
        _per_role(
            MEGATRON_ROLES,
            *(
                _MEGATRON + "lora_config." + k
                for k in ("merge_lora", "experts_shared_outer_loras", "normalize_moe_lora")
            ),
        ),
    ),
    Unsupported(
        "RLC-E809",
        "multi-token-prediction (MTP) training",
        ("trainer.mtp.enabled", "trainer.mtp.num_speculative_tokens", "trainer.mtp.loss_weight")
        + _per_role(
            MEGATRON_ROLES,
            *(_MEGATRON + k for k in ("mtp_num_layers", "mtp_loss_weight", "mtp_loss_chunk_size", "mtp_loss_topk")),
        ),
    ),
    Unsupported(
        "RLC-E810",
        "asynchronous Megatron checkpoint saves",
        _per_role(MEGATRON_ROLES, _MEGATRON + "async_dist_ckpt_save", _MEGATRON + "async_save_prestage_to_cpu"),
    ),
    Unsupported(
        "RLC-E811",
        "vision-language models",
        (
            "trainer.policy.language_model_only",
            "trainer.ref.language_model_only",
            _IE + "language_model_only",
            "generator.vision_language_generator",
        ),
    ),
    Unsupported("RLC-E812", "an inference-only policy", ("trainer.policy.inference_only_init",)),
    Unsupported(
        "RLC-E813",
        "sample-support replay and routed-expert capture",
        (
            "trainer.algorithm.enable_sample_support_replay",
            _IE + "enable_return_sample_support_set",
            _IE + "enable_return_routed_experts",
        ),
    ),
    Unsupported("RLC-E814", "CISPO anchored on the rollout log-probs", ("trainer.algorithm.cispo.cispo_anchor",)),
    Unsupported(
        "RLC-E815",
        "the DPPO loss",
        ("trainer.algorithm.dppo.dppo_type", "trainer.algorithm.dppo.delta_low", "trainer.algorithm.dppo.delta_high"),
    ),
    Unsupported(
        "RLC-E816",
        "fully-async full-batch sampling, KV-cache clearing on sync and simulated training",
        tuple(
            f"trainer.fully_async.{k}"
            for k in (
                "sample_full_batch",
                "clear_kv_cache_on_weight_sync",
                "simulate_training",
                "simulate_training_step_seconds",
                "simulate_weight_sync_seconds",
            )
        ),
    ),
    Unsupported(
        "RLC-E817",
        "turning off per-mini-batch old log-probs, and SkyRL's log-prob and entropy chunking",
        tuple(
            f"trainer.{k}"
            for k in (
                "recompute_old_logprobs_per_minibatch",
                "logprobs_chunk_size",
                "vocab_entropy_chunk_size",
                "vocab_entropy_chunk_memory_mb",
                "fused_lm_head_logprob",
                "fused_lm_head_logprob_backend",
            )
        ),
    ),
    Unsupported(
        "RLC-E818",
        "SkyRL's GPU monitor, run tags and example logging",
        tuple(
            f"trainer.{k}"
            for k in (
                "enable_ray_gpu_monitor",
                "tags",
                "print_example_interval",
                "num_logger_eval_samples",
                "num_logger_train_samples",
                "log_example_interval",
            )
        ),
    ),
    Unsupported(
        "RLC-E819",
        "FP8 and delta weight sync, and KV-cache offload during sync",
        (_IE + "fp8_weight_sync_mode", _IE + "delta_weight_sync", _IE + "offload_kv_for_weight_sync"),
    ),
    Unsupported("RLC-E820", "expandable segments in the inference engines", (_IE + "use_expandable_segments",)),
    Unsupported("RLC-E821", "speculative decoding", (_IE + "speculative_config",)),
    Unsupported(
        "RLC-E822",
        "prefill-decode disaggregation",
        tuple(
            _IE + k
            for k in ("enable_pd", "num_prefill", "prefill_init_kwargs", "decode_init_kwargs", "router_init_kwargs")
        ),
    ),
    Unsupported(
        "RLC-E823",
        "turning off the prefix-cache salt, and merged step-wise output",
        ("generator.use_cache_salt", "generator.merge_stepwise_output"),
    ),
)


def refused(spec: Any, group: Unsupported) -> list[tuple[str, Any, Any]]:
    """(key, value, default) for every key of `group` set to a value the runtime does not run."""
    model = default_model()
    out = []
    for key in group.keys:
        field = model.lookup(key)
        assert field is not None, key
        value, default = to_plain(get(spec, key)), to_plain(field.default())
        if value == default or (key, value) in group.also_accepted:
            continue
        out.append((key, value, default))
    return out


def _rule_for(group: Unsupported) -> Rule:
    def not_supported_yet(c: Context):
        for key, value, default in refused(c.s, group):
            accepted = [default, *(v for k, v in group.also_accepted if k == key)]
            shown = " or ".join(_show(v) for v in accepted)
            yield c.error(
                group.code,
                key,
                f"{key} = {_show(value)}: this rlc runtime does not support {group.what} yet (a SkyRL 0.4 setting)",
                f"remove {key.rsplit('.', 1)[1]} (or set it to {shown}, which rlc runs)",
                value=value,
                default=default,
            )

    not_supported_yet.__name__ = f"not_supported_yet_{group.code[-3:]}"
    return Rule(group.code, f"not supported yet: {group.what}", group.keys, not_supported_yet)


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


RULES = tuple(_rule_for(group) for group in UNSUPPORTED)

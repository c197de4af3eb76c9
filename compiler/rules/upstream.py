"""SkyRL 0.4 settings spec v1 accepts but this runtime does not run yet: refused when they would change what runs.

Spec v1 knows every field of SkyRL 0.4.0's `SkyRLTrainConfig`, so a SkyRL user's file and overrides load. A field
the runtime executes is used; one it cannot execute yet keeps SkyRL's default, and any other value stops the
compile here (RLC-E801..E849) instead of being silently ignored on the cluster -- unless the value turns nothing
on: a setting of a feature that is off (a profiler save_path with `enable: false`, Megatron options under fsdp2,
LoRA serving options without LoRA) is read by nothing, in SkyRL as in rlc, and is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rlc.compiler.roles import BF16_BASE, get, trainer_checkpoint
from rlc.compiler.rules.base import Context, Rule
from rlc.core.dataclass import dataclass
from rlc.spec.model import default_model, to_plain

ROLES = ("policy", "ref", "critic")
MEGATRON_ROLES = ("policy", "ref")


@dataclass(frozen=True)
class Condition:
    """What must hold for a setting to be read at all: `holds(value of key)`; `example` is a value that holds."""

    key: str
    holds: Callable[[Any], bool]
    example: Any
    off: Any  # a value that does not hold: the feature off
    says: str  # the condition in words, for messages
    # the value `holds` reads, from the typed spec, where it is not the key's alone (None: the key's value), and
    # the other keys it reads
    value_of: Callable[[Any], Any] | None = None
    reads: tuple[str, ...] = ()


def equals(key: str, value: Any, off: Any = False) -> Condition:
    return Condition(key, lambda v: v == value, value, off, f"{key} is {json.dumps(value)}")


def positive(key: str, example: Any = 8) -> Condition:
    return Condition(key, lambda v: isinstance(v, (int, float)) and v > 0, example, 0, f"{key} > 0")


def given(key: str, example: Any) -> Condition:
    return Condition(key, lambda v: v not in (None, "", [], {}), example, None, f"{key} is set")


def _always(key: str) -> tuple[Condition, ...]:
    return ()


@dataclass(frozen=True)
class Unsupported:
    code: str
    what: str  # the feature, in words
    keys: tuple[str, ...]
    also_accepted: tuple[tuple[str, Any], ...] = ()  # (key, value) pairs the runtime runs besides the default
    # key -> the conditions under which its value is read (a value is refused only when all hold)
    when: Callable[[str], tuple[Condition, ...]] = _always
    # (key, value) pairs that are refused where the key's other values run (a value rlc does not run yet)
    refused_values: tuple[tuple[str, Any], ...] = ()
    why: str = ""  # what rlc lacks, where the feature's name does not say it (put first in the help)


def _role(key: str) -> str:
    return key.split(".")[1]


def _megatron(key: str, *more: Condition) -> tuple[Condition, ...]:
    """Megatron options are read by the megatron strategy only."""
    return (equals("trainer.strategy", "megatron", off="fsdp2"), *more)


def _lora(key: str) -> Condition:
    return positive(f"trainer.{_role(key)}.model.lora.rank")


def _megatron_lm_only(key: str) -> tuple[Condition, ...]:
    """language_model_only: train the text model alone (of a multimodal checkpoint, Qwen3.5's). rlc's Megatron worker
    converts Qwen3.5's and Qwen3.5-MoE's text models and dense text models, so the setting is refused there only when
    rlc cannot tell what the text model is (no config.json it can read, nor a tabled hub id) or cannot size it. The
    checkpoint read is the one the trainer loads (`trainer_checkpoint`: fake_int4_qat.bf16_base_path where set)."""
    role = _role(key)
    path = f"trainer.{role}.model.path"

    def text_model_unknown(path_value: Any) -> bool:
        # deferred: model_size's shape tables, only when a model's shape is checked
        from rlc.compiler.model_size import KNOWN_TYPES, model_info

        if not isinstance(path_value, str) or not path_value:
            return True
        shape = model_info(path_value, None, language_model_only=True).shape
        return shape is None or shape.model_type not in KNOWN_TYPES

    return _megatron(
        key,
        Condition(
            path,
            text_model_unknown,
            "Qwen/Qwen3-VL-8B-Instruct",
            "Qwen/Qwen3.5-0.8B",
            f"the checkpoint trainer.{role} loads ({path}, or trainer.policy.model.fake_int4_qat.bf16_base_path "
            "where set) has a text model rlc's Megatron worker cannot convert",
            value_of=lambda spec: trainer_checkpoint(spec, role),
            reads=(BF16_BASE, "trainer.policy.model.path"),
        ),
    )


def _per_role(roles: tuple[str, ...], *suffixes: str) -> tuple[str, ...]:
    return tuple(f"trainer.{role}.{s}" for role in roles for s in suffixes)


_MEGATRON = "megatron_config."
_PROFILER = (
    "enable ranks save_path skip_first wait warmup active repeat activities record_shapes profile_memory "
    "with_stack with_flops with_modules use_gzip export_type"
).split()
_IE = "generator.inference_engine."
_not_vllm = Condition(_IE + "backend", lambda v: v != "vllm", "hf", "vllm", f"{_IE}backend is not vllm")

UNSUPPORTED: tuple[Unsupported, ...] = (
    Unsupported(
        "RLC-E801",
        "prompt-loader worker processes (rlc loads prompts in the driver process)",
        ("data.dataloader.num_workers", "data.dataloader.persistent_workers"),
        also_accepted=(("data.dataloader.num_workers", 0),),
        # persistent_workers keeps loader workers alive: without workers there is nothing to keep
        when=lambda key: (positive("data.dataloader.num_workers", 4),) if key.endswith("persistent_workers") else (),
    ),
    Unsupported(
        "RLC-E802",
        "multi-adapter LoRA serving and in-memory adapter sync",
        _per_role(ROLES, "model.lora.sync_mode", "model.lora.share_expert_adapters", "model.lora.max_loras")
        + _per_role(ROLES, "model.lora.max_cpu_loras"),
        when=lambda key: (_lora(key),),
    ),
    Unsupported(
        "RLC-E804",
        "the torch profiler",
        tuple(f"trainer.policy.torch_profiler_config.{k}" for k in _PROFILER),
        when=lambda key: (
            () if key.endswith(".enable") else (equals("trainer.policy.torch_profiler_config.enable", True),)
        ),
    ),
    Unsupported(
        "RLC-E805",
        "Megatron MoE router options (aux loss, per-layer logging, router dtype, frozen router)",
        _per_role(
            MEGATRON_ROLES,
            *(
                _MEGATRON + k
                for k in (
                    "moe_aux_loss_coeff",
                    "moe_per_layer_logging",
                    "moe_router_dtype",
                    "freeze_moe_router",
                    "freeze_dsa_indexer",
                )
            ),
        ),
        when=_megatron,
    ),
    Unsupported(
        "RLC-E806",
        "Megatron FP8 training",
        _per_role(
            MEGATRON_ROLES,
            *(_MEGATRON + k for k in ("fp8", "fp8_recipe", "fp8_param", "fp8_amax_compute_algo")),
            _MEGATRON + "ddp_config.fp8_param_gather",
        ),
        # the recipe and the amax algorithm only shape FP8 compute, which fp8 turns on
        when=lambda key: _megatron(
            key,
            *(
                (given(f"trainer.{_role(key)}.megatron_config.fp8", "e4m3"),)
                if key.endswith(("fp8_recipe", "fp8_amax_compute_algo"))
                else ()
            ),
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
        when=lambda key: _megatron(
            key,
            *(
                (equals(key.rsplit(".", 1)[0] + ".distributed_save", True),)
                if key.endswith("save_every_n_ranks")
                else ()
            ),
        ),
    ),
    Unsupported(
        "RLC-E808",
        "Megatron LoRA options (canonical_lora and DoRA adapters synced unmerged, shared outer LoRAs over the "
        "experts, MoE LoRA normalization)",
        _per_role(
            MEGATRON_ROLES,
            *(
                _MEGATRON + "lora_config." + k
                for k in ("merge_lora", "experts_shared_outer_loras", "normalize_moe_lora")
            ),
        ),
        # merge_lora false runs for lora_type lora, dense or mixture-of-experts (runtime/workers/megatron_adapters.py);
        # rlc's MoE LoRA gives each routed expert its own adapters (neither shared outer LoRAs nor their normalization)
        when=lambda key: _megatron(
            key,
            _lora(key),
            *(
                (
                    Condition(
                        f"trainer.{_role(key)}.{_MEGATRON}lora_config.lora_type",
                        lambda v: v != "lora",
                        "dora",
                        "lora",
                        "lora_type is not lora",
                    ),
                )
                if key.endswith("merge_lora")
                else ()
            ),
        ),
    ),
    Unsupported(
        "RLC-E809",
        "multi-token-prediction (MTP) heads on the reference model",
        _per_role(
            ("ref",),
            *(_MEGATRON + k for k in ("mtp_num_layers", "mtp_loss_weight", "mtp_loss_chunk_size", "mtp_loss_topk")),
        ),
        also_accepted=(("trainer.ref.megatron_config.mtp_num_layers", 0),),
        # the loss settings are read where heads are built
        when=lambda key: (
            _megatron(key)
            if key.endswith("mtp_num_layers")
            else _megatron(key, given(f"trainer.{_role(key)}.megatron_config.mtp_num_layers", 1))
        ),
        why="the reference model only scores tokens: rlc builds MTP heads on the policy alone (trainer.mtp.enabled, "
        "the policy's megatron_config.mtp_*)",
    ),
    Unsupported(
        "RLC-E810",
        "asynchronous Megatron checkpoint saves",
        _per_role(MEGATRON_ROLES, _MEGATRON + "async_dist_ckpt_save", _MEGATRON + "async_save_prestage_to_cpu"),
        when=lambda key: _megatron(
            key,
            *(
                (equals(key.rsplit(".", 1)[0] + ".async_dist_ckpt_save", True),)
                if key.endswith("prestage_to_cpu")
                else ()
            ),
        ),
    ),
    Unsupported(
        "RLC-E811",
        "language_model_only (the text model alone) under Megatron for a model whose text model rlc cannot read or "
        "convert",
        ("trainer.policy.language_model_only", "trainer.ref.language_model_only"),
        when=_megatron_lm_only,
        why="rlc's Megatron worker converts the text models of Qwen3.5 and Qwen3.5-MoE checkpoints and dense llama, "
        "mistral and qwen2 models, and needs the model's config (a local directory, the Hugging Face cache or rlc's "
        "table) to know which it is. Strategy fsdp2 trains any multimodal checkpoint's text model",
    ),
    Unsupported(
        "RLC-E824", "vision-language generation (image and text prompts)", ("generator.vision_language_generator",)
    ),
    Unsupported("RLC-E812", "an inference-only policy", ("trainer.policy.inference_only_init",)),
    Unsupported(
        "RLC-E813",
        "sample-support replay",
        ("trainer.algorithm.enable_sample_support_replay", _IE + "enable_return_sample_support_set"),
    ),
    Unsupported(
        "RLC-E814",
        "CISPO anchored on the rollout log-probs",
        ("trainer.algorithm.cispo.cispo_anchor",),
        when=lambda key: (equals("trainer.algorithm.policy_loss_type", "cispo", off="regular"),),
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
        when=lambda key: (
            equals("trainer.fully_async.enabled", True),
            *((equals("trainer.fully_async.simulate_training", True),) if "seconds" in key else ()),
        ),
    ),
    Unsupported(
        "RLC-E818",
        "SkyRL's run tags and example logging",
        tuple(
            f"trainer.{k}"
            for k in (
                "tags",
                "print_example_interval",
                "num_logger_eval_samples",
                "num_logger_train_samples",
                "log_example_interval",
            )
        ),
        # Off is what rlc does: no example printing or uploads. Tags go to wandb only.
        also_accepted=(
            ("trainer.tags", []),
            *((f"trainer.{k}", v) for k in ("print_example_interval", "log_example_interval") for v in (0, -1)),
            *((f"trainer.{k}", 0) for k in ("num_logger_eval_samples", "num_logger_train_samples")),
        ),
        when=lambda key: (equals("trainer.logger", "wandb", off="console"),) if key.endswith(".tags") else (),
    ),
    Unsupported(
        "RLC-E819",
        "FP8 weight sync, and KV-cache offload during sync",
        (_IE + "fp8_weight_sync_mode", _IE + "offload_kv_for_weight_sync"),
    ),
    Unsupported("RLC-E820", "expandable segments in the inference engines", (_IE + "use_expandable_segments",)),
    Unsupported(
        "RLC-E821",
        "speculative decoding outside the vllm engine",
        (_IE + "speculative_config",),
        also_accepted=((_IE + "speculative_config", {}),),
        # the vllm engine passes it to vLLM as its speculative_config (on GPUs: RLC-E520 refuses it on a CPU)
        when=lambda key: (_not_vllm,),
        why="speculative decoding is vLLM's (its speculative_config): the hf engine has none, and a remote server "
        "takes it from its own command line",
    ),
    Unsupported(
        "RLC-E822",
        "prefill-decode disaggregation outside the vllm engine, and vllm-router's settings",
        tuple(
            _IE + k
            for k in ("enable_pd", "num_prefill", "prefill_init_kwargs", "decode_init_kwargs", "router_init_kwargs")
        ),
        # the vllm engine runs the split, rlc routing each request itself (rules/prefill_decode.py checks it)
        when=lambda key: (
            (equals(_IE + "enable_pd", True),)
            if key.endswith("router_init_kwargs")
            else (_not_vllm,)
            if key.endswith("enable_pd")
            else (equals(_IE + "enable_pd", True), _not_vllm)
        ),
        why="the prefill/decode split is vLLM's (kv_transfer_config), which the hf engine lacks; rlc routes the "
        "requests itself, so vllm-router's settings have nothing to set",
    ),
    Unsupported(
        "RLC-E823",
        "turning off the prefix-cache salt, and merged step-wise output",
        ("generator.use_cache_salt", "generator.merge_stepwise_output"),
        when=lambda key: (equals("generator.step_wise_trajectories", True),) if key.endswith("stepwise_output") else (),
    ),
)


def refused(spec: Any, group: Unsupported) -> list[tuple[str, Any, Any]]:
    """(key, value, default) for every key of `group` set to a value the runtime does not run, where it is read."""
    model = default_model()
    out = []
    for key in group.keys:
        field = model.lookup(key)
        assert field is not None, key
        value, default = to_plain(get(spec, key)), to_plain(field.default())
        if value == default or (key, value) in group.also_accepted:
            continue
        if any(k == key for k, _ in group.refused_values) and (key, value) not in group.refused_values:
            continue  # one of the key's values rlc runs
        if not all(c.holds(c.value_of(spec) if c.value_of else to_plain(get(spec, c.key))) for c in group.when(key)):
            continue  # a setting of a feature that is off: nothing reads it
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
                (f"{group.why}: " if group.why else "")
                + f"remove {key.rsplit('.', 1)[1]} (or set it to {shown}, which rlc runs)",
                value=value,
                default=default,
            )

    not_supported_yet.__name__ = f"not_supported_yet_{group.code[-3:]}"
    # the keys it refuses, then the ones that decide whether they are read (rlc explain lists the rule under both)
    read = [k for key in group.keys for c in group.when(key) for k in (c.key, *c.reads)]
    keys = tuple(dict.fromkeys([*group.keys, *read]))
    return Rule(group.code, f"not supported yet: {group.what}", keys, not_supported_yet)


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


RULES = tuple(_rule_for(group) for group in UNSUPPORTED)

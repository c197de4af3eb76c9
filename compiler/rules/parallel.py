"""Parallelism rules (Megatron, FSDP2 mesh) and LoRA rules."""

from __future__ import annotations

import json
import os

from rlc.compiler.roles import BF16_BASE, critic_on, fsdp_roles, on_megatron, ref_on, trainer_checkpoint
from rlc.compiler.rules.base import Context, num, rule
from rlc.core.pipeline_stages import FIRST, LAST, VIRTUAL, Stages, balanced
from rlc.core.runtime_facts import MEGATRON_LORA_LAYERS

IE = "generator.inference_engine"


# -- Megatron ------------------------------------------------------------------------------------


@rule(
    "RLC-E521",
    "Megatron: the critic trains without LoRA (rlc's Megatron LoRA adapts the policy)",
    "trainer.critic.model.lora.rank",
    "trainer.critic.model.path",
    "trainer.critic.strategy",
    "trainer.strategy",
)
def megatron_critic_has_no_lora(c: Context):
    lora = c.t.critic.model.lora
    if critic_on(c.s) and on_megatron(c.s, "critic") and isinstance(lora.rank, int) and lora.rank > 0:
        yield c.error(
            "RLC-E521",
            "trainer.critic.model.lora.rank",
            f"the critic trains with megatron and lora.rank is {lora.rank}; rlc's Megatron LoRA adapts the policy only",
            "set trainer.critic.model.lora.rank: 0, or train the critic with fsdp2 (trainer.critic.strategy: fsdp2)",
            ["trainer.strategy", "trainer.critic.strategy"],
        )


@rule(
    "RLC-E504",
    "Megatron uses no Ulysses sequence parallelism",
    "trainer.policy.sequence_parallel_size",
    "trainer.strategy",
    "trainer.ref.sequence_parallel_size",
)
def megatron_has_no_ulysses(c: Context):
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        sp = getattr(c.t, role).sequence_parallel_size
        if sp != 1:
            yield c.error(
                "RLC-E504",
                f"trainer.{role}.sequence_parallel_size",
                f"sequence_parallel_size is {sp}; Megatron splits sequences with context_parallel_size instead",
                f"set sequence_parallel_size: 1 and megatron_config.context_parallel_size: {sp}",
                ["trainer.strategy"],
            )


@rule(
    "RLC-W501",
    "Megatron: world divisible by pp * ep * etp",
    "trainer.policy.megatron_config.expert_model_parallel_size",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.placement.policy_num_nodes",
    "trainer.policy.megatron_config.expert_tensor_parallel_size",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.strategy",
)
def megatron_expert_layout_divides_world(c: Context):
    if not c.megatron:
        return
    mc, w = c.t.policy.megatron_config, c.world("policy")
    sizes = [
        num(mc.expert_tensor_parallel_size or mc.tensor_model_parallel_size),
        num(mc.pipeline_model_parallel_size),
        num(mc.expert_model_parallel_size),
    ]
    if not (sizes[0] and sizes[1] and sizes[2]):
        return  # an interpolation resolved on the node
    size = int(sizes[0] * sizes[1] * sizes[2])
    if w and w % size:
        yield c.warning(
            "RLC-W501",
            "trainer.policy.megatron_config.expert_model_parallel_size",
            f"policy GPUs ({w}) are not divisible by pp*ep*etp = {size}; Megatron-Core will refuse this expert layout",
            f"make {w} a multiple of {size}",
        )


def _closest(names: list[str], fields: frozenset[str], config: str) -> str:
    """A fix for unknown keyword names: the field each most likely means, else their removal."""
    import difflib  # deferred: only a wrong name needs a close match

    guesses = [f"{n} -> {m[0]}" for n in names if (m := difflib.get_close_matches(n, fields, n=1, cutoff=0.75))]
    if guesses:
        return f"did you mean {', '.join(guesses)}? ({config}'s field names)"
    return f"remove {'it' if len(names) == 1 else 'them'}: {config} has no such field"


# OptimizerConfig arguments the megatron worker sets from the spec itself: a second value in optimizer_config_kwargs
# is a TypeError there. (use_distributed_optimizer is read from the kwargs, not set beside them.)
MEGATRON_OPTIMIZER_SET_BY_RLC = {
    "optimizer": "rlc (always adam)",
    "lr": "trainer.policy.optimizer_config.lr",
    "min_lr": "rlc (0: the learning-rate schedule is rlc's own)",
    "weight_decay": "trainer.policy.optimizer_config.weight_decay",
    "adam_beta1": "trainer.policy.optimizer_config.adam_betas",
    "adam_beta2": "trainer.policy.optimizer_config.adam_betas",
    "clip_grad": "trainer.policy.optimizer_config.max_grad_norm",
    "bf16": "trainer.bf16",
    "params_dtype": "trainer.bf16",
}


@rule(
    "RLC-E511",
    "Megatron: transformer_config_kwargs and optimizer_config_kwargs are arguments Megatron-Core's configs take",
    "trainer.policy.megatron_config.transformer_config_kwargs",
    "trainer.ref.megatron_config.transformer_config_kwargs",
    "trainer.policy.megatron_config.optimizer_config_kwargs",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def megatron_config_kwargs_known(c: Context):
    # The megatron worker builds TransformerConfig(**...) and OptimizerConfig(**...) with these; a name the dataclass
    # lacks, or one the worker already sets from the spec, is a TypeError at start-up.
    # deferred: Megatron-Core's field tables, only for a megatron job's kwargs
    from rlc.compiler.megatron_fields import MEGATRON_CORE, OPTIMIZER_CONFIG_FIELDS, TRANSFORMER_CONFIG_FIELDS

    if not c.megatron:
        return
    for role in ("policy", "ref") if ref_on(c.s) else ("policy",):
        key = f"trainer.{role}.megatron_config.transformer_config_kwargs"
        given = getattr(c.t, role).megatron_config.transformer_config_kwargs
        unknown = sorted(
            str(k) for k in (given if isinstance(given, dict) else {}) if k not in TRANSFORMER_CONFIG_FIELDS
        )
        if unknown:
            yield c.error(
                "RLC-E511",
                f"{key}.{unknown[0]}",
                f"{', '.join(unknown)}: not an argument of Megatron-Core {MEGATRON_CORE}'s TransformerConfig",
                _closest(unknown, TRANSFORMER_CONFIG_FIELDS, "TransformerConfig"),
                unknown=unknown,
            )
    key = "trainer.policy.megatron_config.optimizer_config_kwargs"
    given = c.t.policy.megatron_config.optimizer_config_kwargs
    given = given if isinstance(given, dict) else {}
    unknown = sorted(str(k) for k in given if k not in OPTIMIZER_CONFIG_FIELDS)
    if unknown:
        yield c.error(
            "RLC-E511",
            f"{key}.{unknown[0]}",
            f"{', '.join(unknown)}: not an argument of Megatron-Core {MEGATRON_CORE}'s OptimizerConfig",
            _closest(unknown, OPTIMIZER_CONFIG_FIELDS, "OptimizerConfig"),
            unknown=unknown,
        )
    twice = sorted(str(k) for k in given if k in MEGATRON_OPTIMIZER_SET_BY_RLC)
    if twice:
        yield c.error(
            "RLC-E511",
            f"{key}.{twice[0]}",
            f"{', '.join(twice)}: the megatron worker sets {'it' if len(twice) == 1 else 'them'} from the spec "
            "(OptimizerConfig would get two values)",
            "remove them from optimizer_config_kwargs; they come from "
            + ", ".join(f"{k}: {MEGATRON_OPTIMIZER_SET_BY_RLC[k]}" for k in twice),
            twice=twice,
        )


# -- LoRA -------------------------------------------------------------------------------------


@rule(
    "RLC-E602",
    "LoRA alpha is positive when LoRA is on",
    "trainer.policy.model.lora.alpha",
    "trainer.critic.model.lora.alpha",
    "trainer.critic.model.lora.rank",
    "trainer.policy.model.lora.rank",
)
def lora_alpha_positive(c: Context):
    for role in ("policy", "critic"):
        lora = getattr(c.t, role).model.lora
        if lora.rank > 0 and lora.alpha <= 0:
            yield c.error(
                "RLC-E602",
                f"trainer.{role}.model.lora.alpha",
                f"lora.alpha is {lora.alpha}; the adapter would be scaled to nothing",
                "use alpha > 0 (commonly 2 x rank)",
            )


# -- FSDP2 mesh ------------------------------------------------------------------------------------------


@rule(
    "RLC-E505",
    "FSDP2: fsdp_size divides the role's world size",
    "trainer.policy.fsdp_config.fsdp_size",
    "trainer.ref.fsdp_config.fsdp_size",
    "trainer.critic.fsdp_config.fsdp_size",
    "trainer.strategy",
    "trainer.placement.policy_num_nodes",
    "trainer.placement.policy_num_gpus_per_node",
    "trainer.critic.model.path",
    "trainer.placement.critic_num_gpus_per_node",
    "trainer.placement.critic_num_nodes",
    "trainer.placement.ref_num_gpus_per_node",
    "trainer.placement.ref_num_nodes",
)
def fsdp_size_divides_world(c: Context):
    # The fsdp2 worker builds a (world / fsdp_size, fsdp_size) mesh and refuses a size that does not divide the world.
    if c.megatron:
        return
    for role in ("policy", "ref", "critic"):
        shard, world = getattr(c.t, role).fsdp_config.fsdp_size, c.world(role)
        if role == "critic" and not critic_on(c.s):
            continue
        if not isinstance(shard, int) or not world:
            continue
        if 0 < shard < world and world % shard:  # a size >= the world shards over all of it
            yield c.error(
                "RLC-E505",
                f"trainer.{role}.fsdp_config.fsdp_size",
                f"fsdp_size {shard} does not divide the {role}'s {world} GPUs; the fsdp2 worker refuses it",
                f"set fsdp_size to a divisor of {world}, or -1 to shard over all of them",
                [f"trainer.placement.{role}_num_gpus_per_node"],
                fsdp_size=shard,
                world=world,
            )


@rule(
    "RLC-E512",
    "FSDP2: sequence_parallel_size divides the model's attention heads, and every layer is attention (readable model "
    "configs)",
    "trainer.policy.sequence_parallel_size",
    "trainer.ref.sequence_parallel_size",
    "trainer.critic.sequence_parallel_size",
    "trainer.policy.model.path",
    "trainer.ref.model.path",
    "trainer.critic.model.path",
    "trainer.policy.model_config_kwargs",
    "trainer.ref.model_config_kwargs",
    "trainer.critic.model_config_kwargs",
    "trainer.critic.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
    "trainer.strategy",
)
def sequence_parallel_divides_heads(c: Context):
    # Ulysses gives each GPU of a sequence-parallel group whole attention heads. Key/value heads need not divide:
    # the fsdp2 worker repeats them up to lcm(kv heads, sp).
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import find_config

    for role in fsdp_roles(c.s):
        cfg = getattr(c.t, role)
        sp = cfg.sequence_parallel_size
        if not isinstance(sp, int) or sp <= 1:
            continue
        path = cfg.model.path or (c.t.policy.model.path if role == "ref" else None)
        if not isinstance(path, str) or not path:
            continue
        config = {**(find_config(path)[0] or {}), **(cfg.model_config_kwargs or {})}
        mixing = sorted(set(config.get("layer_types") or ()) - {"full_attention", "sliding_attention"})
        if mixing:
            yield c.error(
                "RLC-E512",
                f"trainer.{role}.sequence_parallel_size",
                f"{path} has {', '.join(mixing)} layers, which mix tokens outside attention: Ulysses splits "
                "sequences only around attention",
                "use sequence_parallel_size: 1 with this model",
                [f"trainer.{role}.model.path"],
                layer_types=mixing,
            )
            continue
        heads = config.get("num_attention_heads")
        if not isinstance(heads, int) or isinstance(heads, bool) or heads <= 0 or heads % sp == 0:
            continue
        fits = [d for d in range(2, heads + 1) if heads % d == 0]
        yield c.error(
            "RLC-E512",
            f"trainer.{role}.sequence_parallel_size",
            f"{path} has {heads} attention heads, which sequence_parallel_size {sp} does not divide: Ulysses "
            "gives each GPU of the group whole heads",
            f"use a sequence_parallel_size that divides {heads} ({', '.join(map(str, fits[:6]))})"
            if fits
            else "use sequence_parallel_size: 1 (the model has one attention head)",
            [f"trainer.{role}.model.path"],
            heads=heads,
            sp=sp,
        )


def local_model_config(path: object) -> dict | None:
    """The config.json of a local model directory; None for hub ids, `rlc:` models and unreadable files."""
    if not isinstance(path, str) or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


@rule(
    "RLC-E506",
    "Megatron: the model's heads and MLP width divide by tensor_model_parallel_size (local models)",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    "trainer.critic.megatron_config.tensor_model_parallel_size",
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.critic.model.path",
    "trainer.strategy",
    "trainer.critic.strategy",
)
def megatron_heads_divide_by_tensor_parallel(c: Context):
    # Megatron-Core splits attention heads, KV heads and the MLP width evenly over the tensor-parallel ranks.
    for role in ("policy", "ref", "critic"):
        if not on_megatron(c.s, role) or (role == "critic" and not critic_on(c.s)):
            continue
        cfg = getattr(c.t, role)
        path = trainer_checkpoint(c.s, role)
        tp, config = cfg.megatron_config.tensor_model_parallel_size, local_model_config(path)
        if config is None or not isinstance(tp, int) or tp <= 0:
            continue
        heads = config.get("num_attention_heads")
        sizes = {
            "num_attention_heads": heads,
            "num_key_value_heads": config.get("num_key_value_heads") or heads,
            "intermediate_size": config.get("intermediate_size"),
        }
        bad = {k: v for k, v in sizes.items() if isinstance(v, int) and v % tp}
        if bad:
            what = ", ".join(f"{k}={v}" for k, v in bad.items())
            yield c.error(
                "RLC-E506",
                f"trainer.{role}.megatron_config.tensor_model_parallel_size",
                f"{path} has {what}, not divisible by tensor_model_parallel_size {tp}",
                "use a tensor_model_parallel_size that divides the model's head counts and MLP width",
                [f"trainer.{role}.model.path"],
                tp=tp,
                **bad,
            )


def qwen3_5_text_config(path: object) -> dict | None:
    """The text model's config when the model is Qwen3.5's hybrid (a qwen3_5 or qwen3_5_moe checkpoint's text_config,
    or a qwen3_5_text / qwen3_5_moe_text model) and rlc can read its config; None otherwise."""
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import find_config, text_model_config

    if not isinstance(path, str) or not path:
        return None
    config = find_config(path)[0]
    text = text_model_config(config) if config else None
    return text if text and text.get("model_type") in ("qwen3_5_text", "qwen3_5_moe_text") else None


_QWEN3_5_KEYS = (
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)


def _qwen3_5_roles(c: Context):
    """(role, its Megatron config, the checkpoint its trainer loads, text config) of the policy and ref that train
    Qwen3.5 under Megatron."""
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        if role == "ref" and not ref_on(c.s):
            continue
        cfg = getattr(c.t, role)
        path = trainer_checkpoint(c.s, role)
        text = qwen3_5_text_config(path)
        if text is not None:
            yield role, cfg.megatron_config, path, text


@rule(
    "RLC-E540",
    "Megatron: Qwen3.5's hybrid text model runs without context parallelism (its Gated DeltaNet layers carry a "
    "state along whole rows)",
    "trainer.policy.megatron_config.context_parallel_size",
    "trainer.ref.megatron_config.context_parallel_size",
    *_QWEN3_5_KEYS,
)
def megatron_qwen3_5_context_parallel(c: Context):
    # rlc's context parallelism gives each rank chunks of every row; a linear-attention layer's recurrence needs the
    # state the row's earlier tokens left, which rlc's Gated DeltaNet does not pass between ranks.
    for role, mc, path, _ in _qwen3_5_roles(c):
        cp = mc.context_parallel_size
        if _positive_int(cp) and cp > 1:
            yield c.error(
                "RLC-E540",
                f"trainer.{role}.megatron_config.context_parallel_size",
                f"{path} is Qwen3.5, whose Gated DeltaNet (linear-attention) layers carry a recurrent state along "
                f"each whole row; rlc's context parallelism splits rows over {cp} ranks, which those layers cannot "
                "follow",
                "set context_parallel_size: 1 (tensor or pipeline parallelism shard Qwen3.5 under megatron)",
                [f"trainer.{role}.model.path"],
                cp=cp,
            )


@rule(
    "RLC-E542",
    "Megatron: tensor_model_parallel_size divides Qwen3.5's attention and key-value heads, linear-attention key "
    "heads and MLP width (readable model configs)",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    *_QWEN3_5_KEYS,
)
def megatron_qwen3_5_tensor_parallel(c: Context):
    # rlc's Gated DeltaNet gives each tensor rank whole key-head groups (a key head and the value heads it serves);
    # Megatron-Core splits the gated attention's heads, the dense MLP or Qwen3.5-MoE's shared expert (the routed
    # experts split by expert parallelism: RLC-E516, E517). Fewer key-value heads than ranks, dividing them, are
    # fine: each rank then computes its query group's.
    for role, mc, path, text in _qwen3_5_roles(c):
        tp = mc.tensor_model_parallel_size
        if not _positive_int(tp) or tp == 1:
            continue
        mlp = "shared_expert_intermediate_size" if text.get("num_experts") else "intermediate_size"
        keys: tuple[str, ...] = ("num_attention_heads", "num_key_value_heads", "linear_num_key_heads", mlp)
        if (local_model_config(path) or {}).get("num_attention_heads"):  # a text model's: RLC-E506 reads the rest
            keys = ("linear_num_key_heads",)
        bad = {
            k: text[k]
            for k in keys
            if _positive_int(text.get(k)) and text[k] % tp and not (k == "num_key_value_heads" and tp % text[k] == 0)
        }
        if bad:
            what = ", ".join(f"{k}={v}" for k, v in bad.items())
            yield c.error(
                "RLC-E542",
                f"trainer.{role}.megatron_config.tensor_model_parallel_size",
                f"{path} (Qwen3.5) has {what}, not divisible by tensor_model_parallel_size {tp}: each tensor rank "
                "takes whole heads and whole linear-attention key-head groups",
                "use a tensor_model_parallel_size that divides them",
                [f"trainer.{role}.model.path"],
                tp=tp,
                **bad,
            )


# -- pipeline stages and layers (model configs rlc can read) --------------------------------------------------


def config_count(path: object, *keys: str) -> int | None:
    """The first positive whole number among `keys` of the model's config when rlc can read it (a local directory,
    the Hugging Face cache, an embedded `rlc:` model or rlc's table of common hub ids); None otherwise."""
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import find_config

    if not isinstance(path, str) or not path:
        return None
    config = find_config(path)[0] or {}
    text = config.get("text_config")  # a multimodal checkpoint (Qwen3.5) holds its text model's shape there
    for key in keys:
        value = config.get(key, text.get(key) if isinstance(text, dict) else None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def num_hidden_layers(path: object) -> int | None:
    """The model's decoder layer count when rlc can read its config."""
    return config_count(path, "num_hidden_layers")


def _positive_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _even_split_hint(layers: int, pp: int) -> str:
    """Pipeline sizes that divide `layers`, and the uneven split nearest to an even one."""
    fits = ", ".join(str(d) for d in range(1, min(layers, 16) + 1) if layers % d == 0)
    hint = f"use a pipeline_model_parallel_size that divides {layers} ({fits})"
    if pp > layers:
        return hint
    near = balanced(layers, pp)
    return (
        f"{hint}, or set transformer_config_kwargs.{FIRST}: {near.first} and {LAST}: {near.last} "
        f"({near.per_stage()[1]} on each other stage)"
    )


@rule(
    "RLC-E507",
    "Megatron: the model's layers split over the pipeline stages as Megatron-Core places them (evenly, or the "
    "first / last stage's set counts and the rest evenly; each stage's layers divide by the virtual stages)",
    "trainer.policy.megatron_config.pipeline_model_parallel_size",
    "trainer.ref.megatron_config.pipeline_model_parallel_size",
    "trainer.policy.megatron_config.transformer_config_kwargs",
    "trainer.ref.megatron_config.transformer_config_kwargs",
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def megatron_pipeline_divides_layers(c: Context):
    # The megatron worker builds the stages Megatron-Core's TransformerConfig asks for and loads each stage's layers
    # by rlc.core.pipeline_stages; a layout Megatron-Core refuses fails at start-up.
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        cfg = getattr(c.t, role)
        if role == "ref" and not ref_on(c.s):
            continue
        mc = cfg.megatron_config
        pp, path = mc.pipeline_model_parallel_size, trainer_checkpoint(c.s, role)
        if not _positive_int(pp):
            continue
        given = mc.transformer_config_kwargs if isinstance(mc.transformer_config_kwargs, dict) else {}
        placing = {k: given[k] for k in (FIRST, LAST, VIRTUAL) if given.get(k) is not None}
        kwargs = f"trainer.{role}.megatron_config.transformer_config_kwargs"
        bad = [k for k, v in placing.items() if not _positive_int(v)]
        if bad:
            yield c.error(
                "RLC-E507",
                f"{kwargs}.{bad[0]}",
                f"{bad[0]}={placing[bad[0]]!r}: a count of layers or virtual stages is a positive integer",
                "give a positive integer, or leave it out",
            )
            continue
        if placing.get(VIRTUAL, 1) > 1 and pp == 1:
            yield c.error(
                "RLC-E507",
                f"{kwargs}.{VIRTUAL}",
                "virtual pipeline stages interleave model chunks over pipeline stages; this job has one",
                "set pipeline_model_parallel_size above 1, or leave virtual_pipeline_model_parallel_size out",
                [f"trainer.{role}.megatron_config.pipeline_model_parallel_size"],
            )
            continue
        layers = num_hidden_layers(path)
        if layers is None:
            continue
        try:
            Stages.of(layers, pp, placing).per_stage()
        except ValueError as exc:
            uneven = FIRST in placing or LAST in placing
            if not placing:
                hint = _even_split_hint(layers, pp)
            elif uneven:
                hint = (
                    "choose num_layers_in_first/last_pipeline_stage so the layers left divide evenly over the "
                    "other stages" + (" and every stage's count by the virtual stages" if VIRTUAL in placing else "")
                )
            else:
                hint = f"use a virtual_pipeline_model_parallel_size that divides {layers // pp}"
            key = next(iter(placing), None)
            yield c.error(
                "RLC-E507",
                f"{kwargs}.{key}" if key else f"trainer.{role}.megatron_config.pipeline_model_parallel_size",
                f"{path} has num_hidden_layers={layers}: {exc}",
                hint,
                [f"trainer.{role}.model.path", f"trainer.{role}.megatron_config.pipeline_model_parallel_size"],
                pp=pp,
                num_hidden_layers=layers,
            )


def num_experts(path: object) -> int | None:
    """The routed experts of a mixture-of-experts model whose config rlc can read; None for a dense model."""
    return config_count(path, "num_experts", "num_local_experts", "n_routed_experts")  # Qwen-MoE, Mixtral, DeepSeek


@rule(
    "RLC-E516",
    "Megatron: expert_model_parallel_size divides the model's routed experts (readable model configs)",
    "trainer.policy.megatron_config.expert_model_parallel_size",
    "trainer.ref.megatron_config.expert_model_parallel_size",
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def megatron_experts_divide_by_expert_parallel(c: Context):
    # Megatron-Core gives every expert-parallel rank the same number of whole experts (num_moe_experts % ep == 0).
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        if role == "ref" and not ref_on(c.s):
            continue
        cfg = getattr(c.t, role)
        ep, path = cfg.megatron_config.expert_model_parallel_size, trainer_checkpoint(c.s, role)
        experts = num_experts(path)
        if not isinstance(ep, int) or isinstance(ep, bool) or ep <= 1:
            continue
        if experts is None and _readable(path):
            yield c.error(
                "RLC-E516",
                f"trainer.{role}.megatron_config.expert_model_parallel_size",
                f"{path} is a dense model (its config names no experts), yet expert_model_parallel_size is {ep}; "
                "Megatron-Core would split experts that do not exist over ranks that then hold nothing to train",
                "set expert_model_parallel_size: 1 (data parallelism takes the GPUs instead)",
                [f"trainer.{role}.model.path"],
                ep=ep,
            )
            continue
        if experts is None or experts % ep == 0:
            continue
        fits = [d for d in range(2, min(experts, 64) + 1) if experts % d == 0]
        yield c.error(
            "RLC-E516",
            f"trainer.{role}.megatron_config.expert_model_parallel_size",
            f"{path} has {experts} routed experts, not divisible by expert_model_parallel_size {ep}; Megatron-Core "
            "gives every expert-parallel rank the same number of whole experts",
            f"use an expert_model_parallel_size that divides {experts} ({', '.join(map(str, [1, *fits]))})",
            [f"trainer.{role}.model.path"],
            ep=ep,
            num_experts=experts,
        )


def _readable(path: object) -> bool:
    """Whether rlc can read the model's config (so a missing key means the model lacks it)."""
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import find_config

    return isinstance(path, str) and bool(path) and find_config(path)[0] is not None


def expert_ffn(path: object) -> int | None:
    """The routed experts' MLP width of a mixture-of-experts model whose config rlc can read."""
    if num_experts(path) is None:
        return None
    return config_count(path, "moe_intermediate_size") or config_count(path, "intermediate_size")


def _megatron_roles(c: Context):
    for role in ("policy", "ref"):
        if role == "ref" and not ref_on(c.s):
            continue
        cfg = getattr(c.t, role)
        yield role, cfg, trainer_checkpoint(c.s, role)


@rule(
    "RLC-E517",
    "Megatron: expert_tensor_parallel_size (null: tensor_model_parallel_size) divides the routed experts' MLP width "
    "(`moe_intermediate_size`, Mixtral's `intermediate_size`; readable MoE configs), as Megatron-Core splits each "
    "expert's fc1/fc2 over it",
    "trainer.policy.megatron_config.expert_tensor_parallel_size",
    "trainer.ref.megatron_config.expert_tensor_parallel_size",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def megatron_expert_width_divides_by_expert_tp(c: Context):
    if not c.megatron:
        return
    for role, cfg, path in _megatron_roles(c):
        mc = cfg.megatron_config
        etp = num(mc.expert_tensor_parallel_size or mc.tensor_model_parallel_size)
        if not etp or etp <= 1:
            continue
        width = expert_ffn(path)
        if width is None or width % etp == 0:
            continue
        key = "expert_tensor_parallel_size" if mc.expert_tensor_parallel_size else "tensor_model_parallel_size"
        fits = [d for d in range(1, min(width, 64) + 1) if width % d == 0]
        yield c.error(
            "RLC-E517",
            f"trainer.{role}.megatron_config.{key}",
            f"{path}'s experts are {width} wide, not divisible by expert tensor parallelism {etp}; Megatron-Core "
            "splits every expert's fc1 and fc2 evenly over the expert-tensor-parallel ranks",
            f"set expert_tensor_parallel_size to a size that divides {width} ({', '.join(map(str, fits))})",
            [f"trainer.{role}.model.path"],
            etp=etp,
            expert_ffn=width,
        )


@rule(
    "RLC-E518",
    "Megatron MoE under tensor parallelism (tensor_model_parallel_size > 1) runs with sequence parallelism, as "
    "Megatron-Core trains an MoE layer under TP only with it: not with transformer_config_kwargs.sequence_parallel "
    "false (readable MoE configs)",
    "trainer.policy.megatron_config.tensor_model_parallel_size",
    "trainer.ref.megatron_config.tensor_model_parallel_size",
    "trainer.policy.megatron_config.transformer_config_kwargs",
    "trainer.ref.megatron_config.transformer_config_kwargs",
    "trainer.policy.model.path",
    BF16_BASE,
    "trainer.ref.model.path",
    "trainer.strategy",
    "trainer.algorithm.use_kl_loss",
    "trainer.algorithm.use_kl_in_reward",
)
def megatron_moe_tensor_parallel_needs_sequence_parallel(c: Context):
    if not c.megatron:
        return
    for role, cfg, path in _megatron_roles(c):
        mc = cfg.megatron_config
        tp = num(mc.tensor_model_parallel_size)
        if not tp or tp <= 1 or num_experts(path) is None:
            continue
        kwargs = mc.transformer_config_kwargs if isinstance(mc.transformer_config_kwargs, dict) else {}
        if kwargs.get("sequence_parallel", True) is False:
            yield c.error(
                "RLC-E518",
                f"trainer.{role}.megatron_config.transformer_config_kwargs",
                f"{path} is a mixture-of-experts model under tensor_model_parallel_size {tp} with "
                "sequence_parallel: false; Megatron-Core refuses to train an MoE layer under tensor parallelism "
                "without sequence parallelism",
                "drop sequence_parallel: false (rlc's worker turns it on for MoE models under TP), or set "
                "tensor_model_parallel_size: 1",
                [f"trainer.{role}.model.path", f"trainer.{role}.megatron_config.tensor_model_parallel_size"],
                tp=tp,
            )


@rule(
    "RLC-E508",
    "vLLM: every pipeline stage of an engine gets a layer (pipeline_parallel_size <= num_hidden_layers)",
    f"{IE}.pipeline_parallel_size",
    f"{IE}.backend",
    "trainer.policy.model.path",
    "generator.inference_engine.run_engines_locally",
)
def vllm_pipeline_fits_layers(c: Context):
    # vLLM splits the decoder layers over its pipeline stages, unevenly where they do not divide (the last stages
    # take one more); with fewer layers than stages a stage holds none and vLLM's model cannot be built.
    ie = c.ie
    if ie.backend != "vllm" or not ie.run_engines_locally:
        return
    pp, layers = ie.pipeline_parallel_size, num_hidden_layers(c.t.policy.model.path)
    if layers is None or not isinstance(pp, int) or isinstance(pp, bool) or pp <= layers:
        return
    yield c.error(
        "RLC-E508",
        f"{IE}.pipeline_parallel_size",
        f"{c.t.policy.model.path} has {layers} decoder layers, fewer than the engine's {pp} pipeline stages",
        f"use a pipeline_parallel_size of at most {layers} (more tensor_parallel_size instead)",
        ["trainer.policy.model.path"],
        pp=pp,
        num_hidden_layers=layers,
    )


# -- LoRA on the engines and under Megatron ----------------------------------------------------------------------

# vLLM 0.30's accepted max_lora_rank values (rlc.compiler.decide rounds a rank up to the next one).
VLLM_MAX_LORA_RANK = 512


@rule(
    "RLC-E509",
    "vLLM engines hold LoRA adapters up to rank 512 (vLLM's largest max_lora_rank)",
    "trainer.policy.model.lora.rank",
    f"{IE}.backend",
    "trainer.strategy",
    "generator.inference_engine.run_engines_locally",
)
def vllm_lora_rank_supported(c: Context):
    # Under fsdp2 the vLLM engines load the policy's adapters themselves (enable_lora); under megatron they run the
    # merged model and the rank does not reach them.
    # deferred: an import cycle (decide imports the rules' helpers)
    from rlc.compiler.decide import VLLM_LORA_RANKS

    rank = c.t.policy.model.lora.rank
    if c.ie.backend != "vllm" or not c.ie.run_engines_locally or c.megatron:
        return
    if isinstance(rank, int) and rank > VLLM_LORA_RANKS[-1]:
        yield c.error(
            "RLC-E509",
            "trainer.policy.model.lora.rank",
            f"lora.rank {rank} is above {VLLM_LORA_RANKS[-1]}, the largest max_lora_rank vLLM accepts; "
            "the vLLM engines could not load the policy's adapters",
            f"use a rank of at most {VLLM_LORA_RANKS[-1]} (vLLM's ranks: "
            f"{', '.join(map(str, VLLM_LORA_RANKS))}; others round up to the next)",
            [f"{IE}.backend"],
            rank=rank,
        )


# What rlc's Megatron LoRA puts adapters on: Megatron's linear layers of a decoder layer (attention's and the MLP's,
# a Gated DeltaNet's), by their own names or the Hugging Face projections they fuse, or "all-linear".
MEGATRON_LORA_NAMES = (
    "all-linear",
    *MEGATRON_LORA_LAYERS,
    *(p for ps, _style in MEGATRON_LORA_LAYERS.values() for p in ps),
)


def module_names(value: object) -> list[str]:
    """PEFT-style module names of a target/exclude setting (comma or space separated)."""
    return [n.strip() for n in str(value or "").replace(",", " ").split() if n.strip()]


@rule(
    "RLC-E510",
    "Megatron LoRA: target_modules name layers rlc's Megatron LoRA has",
    "trainer.policy.model.lora.target_modules",
    "trainer.policy.model.lora.exclude_modules",
    "trainer.policy.model.lora.rank",
    "trainer.strategy",
)
def megatron_lora_targets_known(c: Context):
    # The megatron worker maps target_modules onto Megatron's fused layers: a name it does not know would be skipped
    # without a word, and a list naming no layer (after exclude_modules) is refused at start-up.
    lora = c.t.policy.model.lora
    if not c.megatron or not isinstance(lora.rank, int) or lora.rank <= 0:
        return
    key = "trainer.policy.model.lora.target_modules"
    wanted, excluded = module_names(lora.target_modules), set(module_names(lora.exclude_modules))
    unknown = [n for n in wanted if n not in MEGATRON_LORA_NAMES]
    known = ", ".join(MEGATRON_LORA_NAMES)
    if unknown:
        yield c.error(
            "RLC-E510",
            key,
            f"target_modules names {', '.join(map(repr, unknown))}, not a layer the megatron strategy's LoRA has",
            f"name Megatron layers or the projections they fuse: {known}",
            ["trainer.strategy"],
            unknown=unknown,
        )
        return
    chosen = [
        layer
        for layer, (projections, _style) in MEGATRON_LORA_LAYERS.items()
        if layer not in excluded
        and {p for p in projections if "all-linear" in wanted or p in wanted or layer in wanted} - excluded
    ]
    if not chosen:
        yield c.error(
            "RLC-E510",
            key,
            f"target_modules {lora.target_modules!r} (less exclude_modules {lora.exclude_modules!r}) leaves no layer "
            "for the megatron strategy's LoRA to put adapters on",
            f"target at least one of {known}",
            ["trainer.policy.model.lora.exclude_modules", "trainer.strategy"],
        )


RULES = (
    megatron_critic_has_no_lora,
    megatron_has_no_ulysses,
    megatron_expert_layout_divides_world,
    megatron_config_kwargs_known,
    lora_alpha_positive,
    fsdp_size_divides_world,
    sequence_parallel_divides_heads,
    megatron_heads_divide_by_tensor_parallel,
    megatron_qwen3_5_context_parallel,
    megatron_qwen3_5_tensor_parallel,
    megatron_pipeline_divides_layers,
    megatron_experts_divide_by_expert_parallel,
    megatron_expert_width_divides_by_expert_tp,
    megatron_moe_tensor_parallel_needs_sequence_parallel,
    vllm_pipeline_fits_layers,
    vllm_lora_rank_supported,
    megatron_lora_targets_known,
)

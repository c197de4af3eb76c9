"""Parallelism rules (Megatron, FSDP2 mesh) and LoRA rules."""

from __future__ import annotations

import json
import os

from rlc.compiler.check import Context, num, rule
from rlc.compiler.resolve import critic_on

IE = "generator.inference_engine"


# -- Megatron ------------------------------------------------------------------------------------


@rule("RLC-E503", "Megatron trains no critic (GRPO-style only)", "trainer.critic.model.path", "trainer.strategy")
def megatron_has_no_critic(c: Context):
    if c.megatron and critic_on(c.s):
        yield c.error(
            "RLC-E503",
            "trainer.critic.model.path",
            "the megatron strategy has no critic; PPO with a value model needs fsdp2",
            "use strategy: fsdp2, or drop the critic",
            ["trainer.strategy"],
        )


@rule(
    "RLC-E504",
    "Megatron uses no Ulysses sequence parallelism",
    "trainer.policy.sequence_parallel_size",
    "trainer.strategy",
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


# -- LoRA -------------------------------------------------------------------------------------


@rule("RLC-E602", "LoRA alpha is positive when LoRA is on", "trainer.policy.model.lora.alpha")
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
    "trainer.policy.model.path",
    "trainer.ref.model.path",
    "trainer.strategy",
)
def megatron_heads_divide_by_tensor_parallel(c: Context):
    # Megatron-Core splits attention heads, KV heads and the MLP width evenly over the tensor-parallel ranks.
    if not c.megatron:
        return
    for role in ("policy", "ref"):
        cfg = getattr(c.t, role)
        tp, config = cfg.megatron_config.tensor_model_parallel_size, local_model_config(cfg.model.path)
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
                f"{cfg.model.path} has {what}, not divisible by tensor_model_parallel_size {tp}",
                "use a tensor_model_parallel_size that divides the model's head counts and MLP width",
                [f"trainer.{role}.model.path"],
                tp=tp,
                **bad,
            )

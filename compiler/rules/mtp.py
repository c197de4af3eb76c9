"""Multi-token-prediction (MTP) head training (trainer.mtp, SkyRL 0.4): what it needs.

SkyRL's own validation (`_apply_mtp_config`, `_validate_draft_weight_sync_cfg`) refuses MTP without the megatron
strategy and with the heads explicitly turned off (mtp_num_layers 0): RLC-E545 and E546, for every trainer. rlc's
Megatron worker trains the heads of one pipeline stage, without context parallelism or LoRA, on a checkpoint its
conversion covers: RLC-E547 and E548, for rlc's runtime.
"""

from __future__ import annotations

from rlc.compiler.rules.base import Context, num, rule

MTP = "trainer.mtp"
MC = "trainer.policy.megatron_config"
# The checkpoint's head count, by its config's name for it (MiMo's, Qwen3.5's).
HEAD_COUNTS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
# The model types whose MTP heads rlc's Megatron conversion loads: MiMo's (a Qwen2 trunk), and Qwen2-shaped decoders
# given heads under MiMo's names.
MTP_MODEL_TYPES = ("mimo", "qwen2", "llama", "mistral")


def _on(c: Context) -> bool:
    return bool(c.t.mtp.enabled)


def _megatron(c: Context) -> bool:
    return c.t.strategy == "megatron"


@rule("RLC-E545", "MTP heads are trained under the megatron strategy", f"{MTP}.enabled", "trainer.strategy")
def mtp_strategy(c: Context):
    if _on(c) and not _megatron(c):
        yield c.error(
            "RLC-E545",
            f"{MTP}.enabled",
            f"trainer.mtp.enabled under strategy {c.t.strategy}: the MTP heads are trained by the Megatron policy "
            "alone (an FSDP model carries no MTP head; SkyRL refuses this too)",
            "set trainer.strategy: megatron, or trainer.mtp.enabled: false",
            ["trainer.strategy"],
        )


@rule("RLC-E546", "MTP on with its heads turned off", f"{MC}.mtp_num_layers", f"{MTP}.enabled", "trainer.strategy")
def mtp_heads_off(c: Context):
    if _on(c) and _megatron(c) and c.t.policy.megatron_config.mtp_num_layers == 0:
        yield c.error(
            "RLC-E546",
            f"{MC}.mtp_num_layers",
            "mtp_num_layers 0 turns the MTP heads off, while trainer.mtp.enabled trains them (SkyRL refuses this too)",
            "remove mtp_num_layers (null: the checkpoint's heads), or set trainer.mtp.enabled: false",
            [f"{MTP}.enabled"],
        )


@rule(
    "RLC-E547",
    "MTP heads: one pipeline stage, no context parallelism, no LoRA",
    f"{MC}.pipeline_model_parallel_size",
    f"{MC}.context_parallel_size",
    f"{MC}.transformer_config_kwargs",
    "trainer.policy.model.lora.rank",
    f"{MTP}.enabled",
    "trainer.strategy",
)
def mtp_layout(c: Context):
    if not (_on(c) and _megatron(c)):
        return
    mc = c.t.policy.megatron_config
    why = {
        "pipeline_model_parallel_size": "rlc builds the heads on a model of one pipeline stage (Megatron puts them on "
        "the last stage with a copy of the first stage's embedding, which rlc's weight export does not join yet)",
        "context_parallel_size": "the heads' shifted targets cross the chunks of a row that context parallelism "
        "splits (SkyRL refuses it too)",
    }
    for key, reason in why.items():
        size = num(getattr(mc, key))
        if size is not None and size > 1:
            yield c.error(
                "RLC-E547",
                f"{MC}.{key}",
                f"{key} {size} with trainer.mtp.enabled: {reason}",
                f"use {key}: 1 with MTP (tensor and data parallelism run), or trainer.mtp.enabled: false",
                [f"{MTP}.enabled"],
                size=size,
            )
    kwargs = mc.transformer_config_kwargs if isinstance(mc.transformer_config_kwargs, dict) else {}
    virtual = num(kwargs.get("virtual_pipeline_model_parallel_size"))
    if virtual is not None and virtual > 1:
        yield c.error(
            "RLC-E547",
            f"{MC}.transformer_config_kwargs",
            f"virtual_pipeline_model_parallel_size {virtual} with trainer.mtp.enabled: rlc builds the heads on a model "
            "of one pipeline stage",
            "remove virtual_pipeline_model_parallel_size with MTP, or set trainer.mtp.enabled: false",
            [f"{MTP}.enabled"],
        )
    rank = num(c.t.policy.model.lora.rank)
    if rank is not None and rank > 0:
        yield c.error(
            "RLC-E547",
            "trainer.policy.model.lora.rank",
            "LoRA with trainer.mtp.enabled: rlc's Megatron adapters sit on the decoder's layers, and the heads would "
            "train whole beside them (SkyRL syncs merged adapters to the drafter; rlc has not run it)",
            "train the whole policy with MTP (lora.rank: 0), or set trainer.mtp.enabled: false",
            [f"{MTP}.enabled"],
        )


@rule(
    "RLC-E548",
    "MTP heads: a checkpoint with heads rlc's Megatron conversion loads",
    "trainer.policy.model.path",
    f"{MC}.mtp_num_layers",
    f"{MTP}.enabled",
    "trainer.strategy",
)
def mtp_checkpoint(c: Context):
    # deferred: model_size's config lookup, only when MTP is on
    from rlc.compiler.model_size import find_config

    if not (_on(c) and _megatron(c)):
        return
    path = c.t.policy.model.path
    config, _source, _note = find_config(str(path)) if isinstance(path, str) and path else (None, "", "")
    if config is None:  # nothing to read here: the worker says so at start-up if the checkpoint has no heads
        return
    kind = config.get("model_type")
    heads = next((int(config[k]) for k in HEAD_COUNTS if isinstance(config.get(k), int) and config[k] > 0), 0)
    wanted = c.t.policy.megatron_config.mtp_num_layers
    if kind not in MTP_MODEL_TYPES:
        yield c.error(
            "RLC-E548",
            "trainer.policy.model.path",
            f"{path} is a {kind} model: rlc's Megatron worker trains the MTP heads of MiMo-style checkpoints "
            f"({', '.join(MTP_MODEL_TYPES)}: a dense trunk its conversion loads, heads under model.mtp_layers.*)",
            "use a MiMo-style checkpoint with MTP, or set trainer.mtp.enabled: false",
            [f"{MTP}.enabled"],
            model_type=kind,
        )
    elif heads < (num(wanted) or 1):
        yield c.error(
            "RLC-E548",
            "trainer.policy.model.path",
            f"{path} has {heads} MTP heads ({' / '.join(HEAD_COUNTS)} in its config), and trainer.mtp.enabled trains "
            f"{wanted if wanted is not None else 'the checkpoint'}'s",
            "use a checkpoint with MTP heads (MiMo's), lower mtp_num_layers, or set trainer.mtp.enabled: false",
            [f"{MTP}.enabled", f"{MC}.mtp_num_layers"],
            heads=heads,
        )


RULES = (mtp_strategy, mtp_heads_off)
RUNTIME_RULES = (mtp_layout, mtp_checkpoint)  # what rlc's own runtime does not run (SkyRL's trainer runs its own)

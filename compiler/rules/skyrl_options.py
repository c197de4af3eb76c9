"""SkyRL 0.4 training options rlc runs, checked as SkyRL checks them before it starts (RLC-E550..E554): the
log-prob and entropy chunk sizes (`trainer.logprobs_chunk_size`, `trainer.vocab_entropy_chunk_size`,
`trainer.vocab_entropy_chunk_memory_mb`) and fake-INT4 QAT (`trainer.policy.model.fake_int4_qat`)."""

from __future__ import annotations

from rlc.compiler.rules.base import Context, rule

LP, EC, EM = "trainer.logprobs_chunk_size", "trainer.vocab_entropy_chunk_size", "trainer.vocab_entropy_chunk_memory_mb"


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@rule(
    "RLC-E550",
    "log-prob and entropy chunk sizes: positive (log-probs unchunked under megatron only)",
    LP,
    EC,
    EM,
    "trainer.strategy",
)
def chunk_sizes(c: Context):
    lp, ec, em = c.t.logprobs_chunk_size, c.t.vocab_entropy_chunk_size, c.t.vocab_entropy_chunk_memory_mb
    if lp is None and c.t.strategy != "megatron":
        yield c.error(
            "RLC-E550",
            LP,
            f"logprobs_chunk_size is null (no chunking) under strategy {c.t.strategy}: only the megatron strategy "
            "scores a micro-batch's tokens all at once (as in SkyRL)",
            "set logprobs_chunk_size to a positive number of tokens, e.g. 1024",
        )
    elif lp is not None and (not _integer(lp) or lp <= 0):
        yield c.error(
            "RLC-E550", LP, f"logprobs_chunk_size is {lp!r}: it must be a positive integer or null", "set it to 1024"
        )
    if ec is not None and (not _integer(ec) or ec < 0):
        yield c.error(
            "RLC-E550",
            EC,
            f"vocab_entropy_chunk_size is {ec!r}: it must be 0 (sized from vocab_entropy_chunk_memory_mb), a "
            "positive number of tokens or null",
            "set it to 0",
        )
    if not _integer(em) or em <= 0:
        yield c.error(
            "RLC-E550", EM, f"vocab_entropy_chunk_memory_mb is {em!r}: it must be a positive integer", "set it to 512"
        )


QAT = "trainer.{role}.model.fake_int4_qat"
MERGE = "trainer.policy.megatron_config.lora_config.merge_lora"


@rule(
    "RLC-E551",
    "fake-INT4 QAT as SkyRL runs it: the policy's, under megatron, with LoRA whose adapters are synced unmerged "
    "(the engine keeps its INT4 base); symmetric, groups of at least one input",
    *(f"trainer.{r}.model.fake_int4_qat.{k}" for r in ("policy", "ref", "critic") for k in ("enabled",)),
    *(f"trainer.policy.model.fake_int4_qat.{k}" for k in ("group_size", "symmetric")),
    *(f"trainer.{r}.model.lora.rank" for r in ("policy", "ref", "critic")),
    "trainer.strategy",
    MERGE,
)
def fake_int4_qat(c: Context):
    for role in ("policy", "ref", "critic"):
        q, key = getattr(c.t, role).model.fake_int4_qat, QAT.format(role=role)
        if not q.enabled:
            continue
        if getattr(c.t, role).model.lora.rank <= 0:
            yield c.error(
                "RLC-E551",
                f"{key}.enabled",
                f"{key}.enabled needs LoRA on the {role} (trainer.{role}.model.lora.rank > 0): the engine keeps its "
                "INT4 base and takes only the adapters (SkyRL asserts it)",
                f"set trainer.{role}.model.lora.rank, e.g. 32, or turn fake_int4_qat off",
                [f"trainer.{role}.model.lora.rank"],
            )
        if role != "policy":
            continue
        if c.t.strategy != "megatron":
            yield c.error(
                "RLC-E551",
                f"{key}.enabled",
                f"{key}.enabled runs under the megatron strategy only (its routed experts are Megatron's), not "
                f"{c.t.strategy}",
                "set trainer.strategy: megatron, or turn fake_int4_qat off",
                ["trainer.strategy"],
            )
        elif c.t.policy.megatron_config.lora_config.merge_lora:
            yield c.error(
                "RLC-E551",
                MERGE,
                "fake_int4_qat needs the adapters synced unmerged (merge_lora: false): merged, they would carry "
                "the bf16 experts over the engine's INT4 ones (SkyRL asserts it)",
                "set trainer.policy.megatron_config.lora_config.merge_lora: false",
                [f"{key}.enabled"],
            )
        if not q.symmetric:
            yield c.error(
                "RLC-E551",
                f"{key}.symmetric",
                "fake_int4_qat.symmetric is false: SkyRL's grid, and rlc's, is symmetric only (SkyRL ignores the "
                "setting)",
                "remove symmetric (true)",
            )
        if not isinstance(q.group_size, int) or q.group_size < 1:
            yield c.error(
                "RLC-E551",
                f"{key}.group_size",
                f"fake_int4_qat.group_size is {q.group_size!r}: a group is at least one input",
                "set it to the served checkpoint's group size (32)",
            )


RULES = (chunk_sizes, fake_int4_qat)

"""SkyRL 0.4 training options rlc runs, checked as SkyRL checks them before it starts (RLC-E550..E554): the
log-prob and entropy chunk sizes (`trainer.logprobs_chunk_size`, `trainer.vocab_entropy_chunk_size`,
`trainer.vocab_entropy_chunk_memory_mb`)."""

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


RULES = (chunk_sizes,)

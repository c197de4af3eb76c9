"""Fused LM-head log-probs (trainer.fused_lm_head_logprob, SkyRL 0.4): what SkyRL refuses with it, refused here too.

The fused head scores the last hidden states against the head's weight a chunk at a time, so the head's whole
logits never exist: only the Megatron worker runs it (RLC-E817), the entropy it reports has no gradient for an
entropy loss (RLC-E570), and MTP draft heads, which distil from those whole logits, cannot train beside it
(RLC-E571). SkyRL's config validation and Megatron worker refuse the same three, so these hold under any trainer.
"""

from __future__ import annotations

from rlc.compiler.rules.base import Context, rule

FUSED = "trainer.fused_lm_head_logprob"
OFF = f"or set {FUSED}: false (rlc then scores the head's logits in trainer.logprobs_chunk_size chunks)"


@rule("RLC-E817", "fused LM-head log-probs run under the megatron strategy", FUSED, "trainer.strategy")
def fused_head_strategy(c: Context):
    if c.t.fused_lm_head_logprob and c.t.strategy != "megatron":
        yield c.error(
            "RLC-E817",
            FUSED,
            f"{FUSED} under strategy {c.t.strategy}: the fused LM head is the Megatron worker's (SkyRL refuses it "
            "with any other backend too)",
            f"set trainer.strategy: megatron, {OFF}",
            ["trainer.strategy"],
        )


@rule("RLC-E570", "fused LM-head log-probs without an entropy loss", FUSED, "trainer.algorithm.use_entropy_loss")
def fused_head_entropy_loss(c: Context):
    if c.t.fused_lm_head_logprob and c.t.algorithm.use_entropy_loss:
        yield c.error(
            "RLC-E570",
            "trainer.algorithm.use_entropy_loss",
            f"trainer.algorithm.use_entropy_loss with {FUSED}: the fused head's entropy is a metric without a "
            "gradient, since backward recomputes the log-probs' chunks alone (SkyRL refuses this too)",
            f"set trainer.algorithm.use_entropy_loss: false, {OFF}",
            [FUSED],
        )


@rule("RLC-E571", "fused LM-head log-probs without MTP draft heads", FUSED, "trainer.mtp.enabled")
def fused_head_mtp(c: Context):
    if c.t.fused_lm_head_logprob and c.t.mtp.enabled:
        yield c.error(
            "RLC-E571",
            "trainer.mtp.enabled",
            f"trainer.mtp.enabled with {FUSED}: the MTP heads' draft loss distils from the head's whole logits, "
            "which the fused head never makes (SkyRL refuses this too)",
            f"set trainer.mtp.enabled: false, {OFF}",
            [FUSED],
        )


RULES = (fused_head_strategy, fused_head_entropy_loss, fused_head_mtp)

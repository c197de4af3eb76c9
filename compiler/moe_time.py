"""What a Megatron mixture of experts spends beyond its FLOPs: the token exchange of every expert layer and the
experts' grouped matrix products at the small token counts of one micro-batch.

Each expert layer of a pass sends every token to its routed experts and brings the results back: two all-to-all
exchanges over the expert-parallel group (and two more for their gradients in a backward pass, two again where
activation recompute reruns the forward). Before each, Megatron's all-to-all dispatcher copies the tokens-per-expert
counts to the host to size the exchange and the grouped GEMM: the host waits for the GPU, so a layer costs its
launches plus its kernels, not the larger of the two. At the few thousand tokens of a micro-batch of one or two rows
that fixed cost (`estimate.moe_exchange_ms`) is what an exchange takes; its bytes (each token's hidden state to each
routed expert, over NVLink within a node or the network across nodes) add little. The grouped GEMM reads every local
expert's weights once a forward and twice a backward (input and weight gradients) for a few rows each: bound by
memory bandwidth, not by FLOPs. Micro-batches run one after another on each data-parallel rank, so these costs count
once per micro-batch, not per row; pipeline stages split the layers and add a micro-batch per extra stage.
"""

from __future__ import annotations

import math

from rlc.compiler.model_size import ModelShape

NETWORK_GBS = 50  # between nodes: 400 Gb/s InfiniBand or EFA per GPU (as estimate.NETWORK_GBS)


def micro_batches(spec, role: str, rows: float, row_tokens: float, dp: int, train: bool) -> int:
    """Micro-batches one data-parallel rank runs for `rows` rows: by rows, or under a token budget by tokens."""
    t = spec.trainer
    per_rank = rows / max(dp, 1)
    budget = int(t.max_tokens_per_microbatch)
    if budget > 0:
        return max(math.ceil(per_rank * row_tokens / budget), 1)
    micro = int(t.micro_train_batch_size_per_gpu if train else t.micro_forward_batch_size_per_gpu)
    return max(math.ceil(per_rank / max(micro, 1)), 1)


def megatron_moe_seconds(
    spec,
    role: str,
    shape: ModelShape,
    gpus: int,
    gpus_per_node: int,
    rows: float,
    row_tokens: float,
    train: bool,
    bandwidth: float,
    link: float,
) -> float:
    """Seconds a Megatron role's expert layers add to a forward (or, `train`, a training) pass over `rows` rows of
    `row_tokens` tokens: exchanges and grouped-GEMM weight reads, per micro-batch of each data-parallel rank."""
    if not shape.moe_layers or spec.trainer.strategy != "megatron" or role == "critic":
        return 0.0
    e = spec.estimate
    mc = getattr(spec.trainer, role).megatron_config
    tp, pp, cp = int(mc.tensor_model_parallel_size), int(mc.pipeline_model_parallel_size), int(mc.context_parallel_size)
    ep = int(mc.expert_model_parallel_size)
    etp = int(mc.expert_tensor_parallel_size or tp)
    dp = max(gpus // (tp * pp * cp), 1)
    micro = micro_batches(spec, role, rows, row_tokens, dp, train)
    tokens = rows / dp / micro * row_tokens / (cp * tp)  # a rank's tokens of one micro-batch (sequence parallel)
    recompute = train and bool(spec.trainer.gradient_checkpointing)
    forwards = (2 if recompute else 1) if train else 1
    backwards = 1 if train else 0
    exchanges = 2 * (forwards + backwards)
    exchange = 0.0
    if ep > 1:
        exchange_bytes = tokens * max(shape.experts_per_token, 1) * shape.hidden * 2 * (ep - 1) / ep
        over = link if ep * etp <= gpus_per_node else NETWORK_GBS * 1e9
        exchange = exchanges * (e.moe_exchange_ms / 1000 + exchange_bytes / over)
    local_experts = -(-shape.experts // ep)
    expert_bytes = local_experts * 3 * shape.hidden * shape.moe_intermediate * 2 / etp
    reads = forwards + 2 * backwards
    gemm = reads * expert_bytes / (bandwidth * e.bandwidth_use)
    stage_layers = -(-shape.moe_layers // pp)
    return (micro + pp - 1) * stage_layers * (exchange + gemm)

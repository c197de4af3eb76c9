"""Memory fit: the estimated peak of every GPU of the plan, phase by phase, against the accelerator's capacity.

What each role holds is counted the way rlc's runtime builds it (this text is `rlc explain memory`; docs/memory.md
has the derivation, the margins and the published jobs it is checked against):
- fsdp2: fp32 parameters, gradients and AdamW's two moments, sharded over the role's shard group (fsdp_size, or
  the world); the working copies FSDP gathers in the compute dtype (the root's embeddings and head, two layers);
  cpu_offload keeps the sharded state on the CPU. LoRA trains (and keeps gradients and moments of) the adapters.
- megatron: compute-dtype weights of the largest pipeline stage split over tp (experts over ep x etp; norms and
  routers whole on each tp rank), fp32 main gradients, and the distributed optimizer's fp32 master copy and moments
  split over the data-parallel ranks (the experts' over the expert data-parallel ranks). LoRA: gradients, master copy
  and moments of the adapters alone (docs/memory.md), the frozen base's weights only. A Megatron critic has one
  embedding and a value per token where the policy has the vocabulary head and its logits.
- activations per micro-batch token: every layer's saved tensors, or with gradient checkpointing each layer's
  input plus one layer recomputed; the vocabulary head's logits (fsdp2: of the positions that predict a response
  token; megatron: of every token, upcast to float32), whose gradient is written over them in training, plus the
  log-prob scorer's float32 work space for 512 tokens at a time (never a whole micro-batch's log-softmax).
- a vLLM engine takes gpu_memory_utilization of each of its GPUs: its share of the weights, the rest KV cache.
- every trainer process on a GPU adds 1 GiB for its CUDA context, NCCL buffers and allocator slack.
With colocate_all, each phase has only what SkyRL keeps on the GPU then (generate: the engines; a forward or
training pass: that role's model, optimizer when training, and the sleeping engines' CUDA contexts; weight sync:
engine and policy weights), so the peak is the worst phase. Without it everything placed on a GPU stays there,
and the phases only add their transients.
The estimate takes every row at the longest length the spec allows. A GPU that overflows even with rows 1/8 that
long, or with none (weights, gradients, optimizer, engines), is an error (RLC-E701..E706); one that overflows only
with longer rows is RLC-W704, naming the row length up to which it fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import field

from rlc.compiler.megatron_adapters import RankAdapters, stage_adapters
from rlc.compiler.model_size import ModelInfo, ModelShape, model_info
from rlc.compiler.plan import node_ranges
from rlc.compiler.roles import critic_on, on_megatron, ref_on
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, WARNING, Diagnostic, Location
from rlc.core.pipeline_stages import VIRTUAL, Stages
from rlc.core.plan import Plan
from rlc.core.runtime_facts import LOGPROB_CHUNK_TOKENS, score_chunk

MiB, GiB = 1 << 20, 1 << 30
CUDA_CONTEXT = GiB  # per trainer process on a GPU: CUDA context, NCCL communicators, allocator slack
WARN_FILL = 0.9
# Rows this short, relative to the longest a spec allows, are the least a job is taken to see: a GPU that
# overflows even then is an error; one that overflows only with longer rows is a warning naming the length.
SHORT_ROWS = 1 / 8
MAX_ROW_TOKENS = 2**31

# Usable memory of one device as the driver reports it (nvidia-smi / rocm-smi totals), by SkyPilot's names.
ACCELERATORS: dict[str, int] = {
    "H100": 81559 * MiB,
    "H100-80GB": 81559 * MiB,
    "H100-MEGA": 81559 * MiB,
    "H100-NVL": 95830 * MiB,
    "H200": 143771 * MiB,
    "GH200": 97871 * MiB,
    "B200": 183359 * MiB,
    "B100": 183359 * MiB,
    "A100": 40960 * MiB,
    "A100-40GB": 40960 * MiB,
    "A100-80GB": 81920 * MiB,
    "L40S": 46068 * MiB,
    "L40": 46068 * MiB,
    "L4": 23034 * MiB,
    "A10G": 23028 * MiB,
    "A10": 23028 * MiB,
    "A6000": 49140 * MiB,
    "RTX6000-ADA": 49140 * MiB,
    "RTX4090": 24564 * MiB,
    "V100": 16384 * MiB,
    "V100-32GB": 32768 * MiB,
    "T4": 15360 * MiB,
    "MI300X": 196592 * MiB,
    "MI325X": 262144 * MiB,
    "MI250X": 65536 * MiB,
    "TPU": 0,  # not a CUDA device: never checked
}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}

CODES = {
    "RLC-E701": "a training role's model state (weights, gradients, optimizer) does not fit its GPUs",
    "RLC-E702": "training activations and logits of a micro-batch do not fit",
    "RLC-E703": "forward-pass activations and logits of a micro-batch do not fit",
    "RLC-E704": "the inference engines' gpu_memory_utilization leaves too little for what shares their GPUs",
    "RLC-E705": "an engine's share of the weights does not fit in its gpu_memory_utilization",
    "RLC-E706": "weight sync (engine weights and policy weights on the same GPU) does not fit",
    "RLC-W701": "a GPU is estimated above 90% full at its peak",
    "RLC-W702": "a model's size is unknown: its memory is left out of the estimate",
    "RLC-W703": "the accelerator's memory is unknown: the GPU check is skipped",
    "RLC-W704": "a micro-batch fits only while its rows stay shorter than the longest the spec allows",
}
MEMORY_KEYS = {
    "RLC-E701": ("trainer.policy.model.path", "trainer.placement.policy_num_gpus_per_node",
                 "trainer.policy.fsdp_config.cpu_offload", "trainer.policy.fsdp_config.fsdp_size",
                 "trainer.policy.model.lora.rank", "trainer.strategy"),
    "RLC-E702": ("trainer.micro_train_batch_size_per_gpu", "trainer.gradient_checkpointing",
                 "generator.sampling_params.max_generate_length", "trainer.max_prompt_length"),
    "RLC-E703": ("trainer.micro_forward_batch_size_per_gpu",),
    "RLC-E704": ("generator.inference_engine.gpu_memory_utilization", "trainer.placement.colocate_all"),
    "RLC-E705": ("generator.inference_engine.tensor_parallel_size",
                 "generator.inference_engine.gpu_memory_utilization"),
    "RLC-E706": ("trainer.placement.colocate_all",),
    "RLC-W701": ("cluster.accelerator",),
    "RLC-W702": ("trainer.policy.model.path", "trainer.policy.model_config_kwargs"),
    "RLC-W703": ("cluster.accelerator",),
    "RLC-W704": ("trainer.micro_train_batch_size_per_gpu", "generator.sampling_params.max_generate_length",
                 "trainer.max_prompt_length"),
}  # fmt: skip


def capacity(accelerator: str) -> int | None:
    """Bytes of one device of this SkyPilot accelerator name (case and an `NVIDIA-` prefix ignored)."""
    name = accelerator.strip().upper().replace("_", "-").replace(" ", "-")
    name = name.removeprefix("NVIDIA-").split(":")[0]
    found = ACCELERATORS.get(name)
    return found or None


@dataclass
class RoleCost:
    """Bytes one rank of a role holds: `state` while its model is on the GPU, `optimizer` with it when training,
    and the transients of a training and of a forward pass."""

    state: dict[str, int]
    optimizer: dict[str, int]
    train: dict[str, int]
    forward: dict[str, int]


@dataclass
class GpuMemory:
    node: int
    gpu: int
    capacity: int
    peak: int
    phase: str
    parts: dict[str, int]
    phases: dict[str, int] = field(default_factory=dict)  # every phase's total, in the order a step runs them

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def fill(self) -> float:
        return self.peak / self.capacity if self.capacity else 0.0

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "capacity_bytes": self.capacity,
            "peak_bytes": self.peak,
            "fits": self.fits,
            "phase": self.phase,
            "parts": dict(self.parts),
            "phases": dict(self.phases),
        }


@dataclass
class MemoryEstimate:
    models: dict[str, ModelInfo]
    accelerator: str
    capacity: int | None
    gpus: list[GpuMemory] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return all(g.fits for g in self.gpus)

    def to_json(self) -> dict:
        return {
            "fits": self.fits,
            "models": {role: m.to_json() for role, m in self.models.items()},
            "gpus": [g.to_json() for g in self.gpus],
        }


# -- per-role costs --------------------------------------------------------------------------------------------


def longest_row(spec) -> tuple[int, int]:
    """Tokens of the longest trajectory and of its response (what logits are computed for)."""
    g = spec.generator
    # No model reads 2^31 tokens: longer limits are counted as that (their estimate stays a finite float).
    response = min(int(g.sampling_params.max_generate_length), MAX_ROW_TOKENS)
    prompt = min(int(g.max_input_length or spec.trainer.max_prompt_length), MAX_ROW_TOKENS)
    if int(g.max_turns) > 1:  # max_input_length bounds the whole conversation; all but the first prompt is scored
        return prompt + response, max(prompt + response - int(spec.trainer.max_prompt_length), 1)
    return prompt + response, response


def _lengths(spec, fraction: float) -> tuple[int, int]:
    """`longest_row`, with every row `fraction` of that long (the estimate at shorter rows)."""
    full, response = longest_row(spec)
    if fraction >= 1:
        return full, response
    return max(math.ceil(full * fraction), 1), max(math.ceil(response * fraction), 1)


def packed_rows(spec) -> bool:
    """Whether fsdp2 packs a micro-batch's real tokens into one row (then its size is their sum, not rows x the
    longest): sample packing on a GPU with flash attention in a 16-bit dtype."""
    t = spec.trainer
    return bool(t.use_sample_packing and t.flash_attn and t.bf16) and t.strategy != "megatron"


def layer_activation_bytes(shape: ModelShape, b: int) -> int:
    """Bytes one decoder layer saves for backward, per token: norms (fp32 inputs), q/k/v before and after rotary,
    the attention output, the MLP's gate, up, activation and product (the routed experts of a token for MoE)."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    inter = shape.intermediate
    if shape.moe_layers:
        inter = shape.moe_intermediate * max(shape.experts_per_token, 1) + shape.shared_intermediate
    return b * (2 * h + 2 * (q + 2 * kv) + 2 * q + 4 * inter) + 8 * h + 4 * shape.experts


def activation_bytes(shape: ModelShape, tokens: int, b: int, checkpointing: bool, layers: int | None = None) -> int:
    layers = shape.layers if layers is None else layers
    per_layer = layer_activation_bytes(shape, b)
    saved = layers * b * shape.hidden + per_layer if checkpointing else layers * per_layer
    return tokens * (saved + 2 * b * shape.hidden + 4 * shape.hidden)


def logits_bytes(
    vocab: int, tokens: int, scored: int, b: int, fp32_output: bool = False, chunk: int | None = LOGPROB_CHUNK_TOKENS
) -> int:
    """The vocabulary head's logits and scoring them (the runtime's chunked `score_tokens`), forward or training.

    The head's logits for `tokens` positions in the compute dtype (Megatron's Float16Module hands them on in
    float32, `fp32_output`, after a moment with both copies, and its backward turns their gradient back into the
    compute dtype beside them). In training their gradient overwrites them (`inplace_backward`): one copy, not
    two. Plus the scorer's work space, `chunk` (trainer.logprobs_chunk_size, at most LOGPROB_CHUNK_TOKENS) of the
    `scored` positions at a time (an entropy chunk bound under megatron only makes it smaller): a block of the
    logits, its float32 copy, their exp and one product (backward: the block, float32 log-probs, softmax and the
    gradient block). Temperature and entropy are computed in that work space: they add nothing.
    """
    out = 4 if fp32_output else b
    block = score_chunk(scored, chunk) * vocab * max(out + 12, 2 * out + 8)
    cast = tokens * vocab * b if fp32_output and b != 4 else 0  # the head's own output, until it is upcast
    return tokens * vocab * out + max(block, cast)


def fsdp_cost(spec, role: str, shape: ModelShape, world: int, gpu: bool, fraction: float = 1.0) -> RoleCost:
    t = spec.trainer
    cfg = getattr(t, role)
    fsdp = cfg.fsdp_config
    mp = fsdp.mixed_precision
    b = DTYPE_BYTES[mp.param_dtype] if (t.bf16 and mp) else (2 if t.bf16 else 4)
    shard = fsdp.fsdp_size if 0 < fsdp.fsdp_size < world else world
    params = shape.critic_params if role == "critic" else shape.params
    lora = cfg.model.lora.rank if role != "ref" and hasattr(cfg.model, "lora") else 0
    trainable = shape.lora_params(lora) + (shape.hidden + 1 if role == "critic" and lora else 0) if lora else params
    total = params + (shape.lora_params(lora) if lora else 0)
    # verl's FSDP2 reference keeps its weights on the CPU whatever the spec says (CPUOffloadPolicy, forward only)
    verl_ref = role == "ref" and spec.launch.trainer == "verl"
    offload = (fsdp.cpu_offload or verl_ref) and gpu
    state = {"weights": 0 if offload else -(-4 * total // shard)}
    optimizer = {} if role == "ref" else {"optimizer": 0 if offload else -(-8 * trainable // shard)}
    plain = world == 1 and not gpu and not t.bf16  # one CPU rank without a dtype policy trains the plain module
    root = shape.embedding * (1 if shape.tied or role == "critic" else 2) + shape.hidden
    if plain:
        gathered = 0
    elif not fsdp.reshard_after_forward:
        gathered = b * total
    else:
        gathered = b * (root + 2 * shape.layer)
    full, response = _lengths(spec, fraction)
    sp = max(int(cfg.sequence_parallel_size), 1)
    budget = int(t.max_tokens_per_microbatch)

    def transient(micro: int, train: bool) -> dict[str, int]:
        # A micro-batch's tokens before the sequence-parallel split: `micro` rows at their longest, or under a token
        # budget the budget (a longer row runs alone). Each rank of an sp group holds 1/sp of them.
        group_tokens = max(budget, full) if budget > 0 else micro * full
        tokens = -(-group_tokens // sp)
        ckpt = bool(t.gradient_checkpointing) and train and role != "ref"
        out = {"gathered": gathered}
        if train:
            out["grads"] = -(-4 * trainable // shard)
            out["gathered"] = gathered + (0 if plain else 2 * (b + 4) * shape.layer)
        out["activations"] = (
            activation_bytes(shape, tokens, b, ckpt)
            if train
            else tokens * (layer_activation_bytes(shape, b) + 4 * b * shape.hidden)
        )
        if role == "critic":
            out["values"] = tokens * 4 * 3
        else:
            # The head runs on the positions that predict a response token, packed or padded (logits_to_keep): rows
            # at their longest; split over an sp group, the rank holding the rows' ends holds the most.
            scored = min(-(-group_tokens * response // full), tokens)
            out["logits"] = logits_bytes(shape.vocab, scored, scored, b, chunk=t.logprobs_chunk_size)
        return out

    return RoleCost(
        state,
        optimizer,
        transient(int(t.micro_train_batch_size_per_gpu), True) if role != "ref" else {},
        transient(int(t.micro_forward_batch_size_per_gpu), False),
    )


def largest_stage_layers(layers: int, pp: int, transformer_config_kwargs: dict) -> int:
    """Decoder layers on the pipeline stage that holds the most, as Megatron-Core places them (uneven first and last
    stages when set); a layout it refuses (rule RLC-E507) counts as an even split rounded up."""
    try:
        return max(Stages.of(layers, pp, transformer_config_kwargs).per_stage())
    except (ValueError, TypeError):
        return -(-layers // pp)


def in_flight_chunks(pp: int, vp: int) -> int:
    """Micro-batches of a model chunk whose activations the first pipeline stage holds at once in training: the
    warm-up forwards of Megatron's 1F1B schedule (interleaved over `vp` chunks a stage) and the one in flight."""
    if pp <= 1:
        return 1
    return pp if vp <= 1 else (pp - 1) * 2 + (vp - 1) * pp + 1


def megatron_cost(spec, role: str, shape: ModelShape, world: int, fraction: float = 1.0) -> RoleCost:
    t = spec.trainer
    mc = getattr(t, role).megatron_config
    tp, pp, cp = int(mc.tensor_model_parallel_size), int(mc.pipeline_model_parallel_size), int(mc.context_parallel_size)
    ep, etp = int(mc.expert_model_parallel_size), int(mc.expert_tensor_parallel_size or tp)
    b = 2 if t.bf16 else 4
    tc = mc.transformer_config_kwargs or {}
    stage_layers = largest_stage_layers(shape.layers, pp, tc)
    chunks = tc.get(VIRTUAL)
    vp = chunks if isinstance(chunks, int) and chunks > 1 and pp > 1 else 1
    expert_layer = shape.expert_params // shape.moe_layers if shape.moe_layers else 0
    # One embedding per stage that holds one (two with an untied head on a one-stage model); the critic's value head
    # takes the vocabulary head's place (hidden + 1 weights, left out).
    body = stage_layers * (shape.layer - expert_layer) + (
        shape.embedding * (1 if shape.tied or role == "critic" else 2) if pp == 1 else shape.embedding
    )
    experts = stage_layers * expert_layer * shape.moe_layers // max(shape.layers, 1)
    replicated = tp_replicated(shape, stage_layers, last_stage=pp == 1)
    dense = -(-(body + (shape.hidden if pp == 1 else 0) - replicated) // tp) + replicated
    local = dense + -(-experts // (ep * etp))
    dp = max(world // (tp * pp * cp), 1)
    edp = max(world // (pp * ep * etp), 1)
    opt = mc.optimizer_config_kwargs or {}
    distributed = bool(opt.get("use_distributed_optimizer", True))
    offload = float(opt.get("optimizer_offload_fraction", 0.0)) if opt.get("optimizer_cpu_offload") else 0.0
    # What trains: the whole stage, or with LoRA its adapters alone (the frozen base has no gradients or state).
    trained = megatron_trained(spec, role, shape, stage_layers, dense, -(-experts // (ep * etp)))
    dense_state = trained.dense * 12 // (dp if distributed else 1)
    expert_state = trained.experts * 12 // (edp if distributed else 1)
    state = {"weights": b * (local + (trained.total if trained.adapters else 0))}
    optimizer = {} if role == "ref" else {"optimizer": int((dense_state + expert_state) * (1 - offload))}
    full, response = _lengths(spec, fraction)
    recompute = tc.get("recompute_granularity") == "full" and t.gradient_checkpointing
    budget = int(t.max_tokens_per_microbatch)

    def transient(micro: int, train: bool) -> dict[str, int]:
        # A micro-batch's tokens: `micro` rows at their longest, or under a token budget the budget (a longer row
        # runs alone); each context rank holds 1/cp of them.
        group = max(budget, full) if budget > 0 else micro * full
        tokens = -(-group // cp)
        per_layer = layer_activation_bytes(shape, b) // tp
        if train:
            saved = stage_layers * b * shape.hidden // tp + per_layer if recompute else stage_layers * per_layer
            act = tokens * saved * in_flight_chunks(pp, vp) // vp  # a chunk holds 1/vp of the stage's layers
        else:
            act = tokens * per_layer
        grads = (4 if mc.ddp_config.grad_reduce_in_fp32 else b) * trained.total
        if role == "critic":  # a value per position, in float32: the output, its slice and its gradient
            return {**({"grads": grads} if train else {}), "activations": act, "values": tokens * 4 * 3}
        # GPTModel's head runs on every position this context rank holds; the response's are scored in place.
        logits = logits_bytes(
            -(-shape.vocab // tp),
            tokens,
            -(-(group * response // full) // cp),
            b,
            fp32_output=b != 4,
            chunk=t.logprobs_chunk_size,
        )
        return {**({"grads": grads} if train else {}), "activations": act, "logits": logits}

    return RoleCost(
        state,
        optimizer,
        transient(int(t.micro_train_batch_size_per_gpu), True) if role != "ref" else {},
        transient(int(t.micro_forward_batch_size_per_gpu), False),
    )


def tp_replicated(shape: ModelShape, stage_layers: int, last_stage: bool) -> int:
    """Parameters of a stage every tensor-parallel rank holds whole: the norms (and query/key norms), each expert
    layer's router, and the last stage's final norm."""
    per_layer = shape.norms_per_layer * shape.hidden + 2 * shape.head_dim * shape.qk_norm
    routers = stage_layers * shape.moe_layers // max(shape.layers, 1) * shape.hidden * shape.experts
    return stage_layers * per_layer + routers + (shape.hidden if last_stage else 0)


def megatron_trained(spec, role: str, shape: ModelShape, stage_layers: int, dense: int, experts: int) -> RankAdapters:
    """The parameters one Megatron rank trains (dense and expert parts): its own `dense` and `experts`, or its LoRA
    adapters when the role trains LoRA (flagged `adapters`)."""
    cfg = getattr(spec.trainer, role)
    mc = cfg.megatron_config
    tp, ep = int(mc.tensor_model_parallel_size), int(mc.expert_model_parallel_size)
    etp = int(mc.expert_tensor_parallel_size or tp)
    lora = cfg.model.lora if role != "ref" and hasattr(cfg.model, "lora") else None
    if lora is None or int(lora.rank) <= 0:
        return RankAdapters(dense, experts, adapters=False)
    lc = mc.lora_config
    return stage_adapters(
        shape, int(lora.rank), lora.target_modules, lora.exclude_modules, lc.lora_type, stage_layers, tp, ep, etp,
        bool(lc.experts_shared_outer_loras),
    )  # fmt: skip


def engine_weights(spec, shape: ModelShape) -> int:
    ie = spec.generator.inference_engine
    return DTYPE_BYTES.get(ie.model_dtype, 2) * -(
        -shape.params // (int(ie.tensor_parallel_size) * int(ie.pipeline_parallel_size))
    )


# -- the estimate ---------------------------------------------------------------------------------------------


def models_of(spec) -> dict[str, ModelInfo]:
    t = spec.trainer
    roles = ["policy"] + (["ref"] if ref_on(spec) else []) + (["critic"] if critic_on(spec) else [])
    out = {}
    for role in roles:
        cfg = getattr(t, role)
        path = cfg.model.path or (t.policy.model.path if role == "ref" else None)
        overrides = cfg.model_config_kwargs if isinstance(cfg.model_config_kwargs, dict) else None
        # language_model_only: a multimodal checkpoint's text model is what the role loads (the critic has none)
        out[role] = model_info(path, overrides, bool(getattr(cfg, "language_model_only", False)))
    return out


def estimate(spec, plan: Plan, fraction: float = 1.0) -> MemoryEstimate:
    """The per-GPU peak of every GPU of the plan (none on a CPU-only cluster or an unknown accelerator), with every
    row of a micro-batch `fraction` of the longest trajectory."""
    models = models_of(spec)
    accel = str(spec.cluster.accelerator)
    cap = None if plan.device == "CPU" else capacity(accel)
    out = MemoryEstimate(models, accel, cap)
    if cap is None:
        return out
    t = spec.trainer
    costs: dict[str, RoleCost] = {}
    for role in plan.roles:
        info = models.get(role.name)
        if info is None or info.shape is None:
            continue
        if on_megatron(spec, role.name):
            costs[role.name] = megatron_cost(spec, role.name, info.shape, role.world_size, fraction)
        else:
            costs[role.name] = fsdp_cost(spec, role.name, info.shape, role.world_size, True, fraction)
    ie = spec.generator.inference_engine
    policy = models["policy"].shape
    engine: dict[str, int] = {}
    if policy is not None and ie.backend == "vllm":
        weights = engine_weights(spec, policy)
        engine = {"engine/weights": weights, "engine/kv_cache": max(int(ie.gpu_memory_utilization * cap) - weights, 0)}
    elif policy is not None:
        engine = {"engine/weights": engine_weights(spec, policy)}
    on_gpu: dict[tuple[int, int], list[str]] = {}
    for role in plan.roles:
        for n, g, _ in role.ranks:
            on_gpu.setdefault((n, g), []).append(role.name)
    engine_gpus = {ng for e in plan.engines for ng in e.gpus}
    colocated = bool(t.placement.colocate_all)
    for n, g in sorted(set(on_gpu) | engine_gpus):
        roles = [r for r in on_gpu.get((n, g), []) if r in costs]
        phases = _phases(spec, roles, costs, engine if (n, g) in engine_gpus else {}, colocated)
        contexts = {f"{r}/cuda_context": CUDA_CONTEXT for r in on_gpu.get((n, g), [])}
        totals = {p: sum({**parts, **contexts}.values()) for p, parts in phases.items()}
        name = max(totals, key=lambda p: totals[p])
        parts = {k: v for k, v in {**phases[name], **contexts}.items() if v}
        ordered = dict(sorted(parts.items(), key=lambda kv: (-kv[1], kv[0])))
        out.gpus.append(GpuMemory(n, g, cap, sum(ordered.values()), name, ordered, totals))
    return out


def _phases(spec, roles: list[str], costs: dict[str, RoleCost], engine: dict, colocated: bool) -> dict:
    """Bytes on one GPU in each phase of a step, by part."""

    def tag(role: str, parts: dict[str, int]) -> dict[str, int]:
        return {f"{role}/{k}": v for k, v in parts.items()}

    t = spec.trainer
    kept = {}  # optimizer state a role keeps on the GPU between steps (offload_after_step false)
    if colocated:
        for r in roles:
            opt = getattr(getattr(t, r), "optimizer_config", None)
            if opt is not None and not opt.offload_after_step:
                kept.update(tag(r, costs[r].optimizer))
        phases = {"generate": {**engine, **kept}} if engine else {"idle": dict(kept)}
        for r in roles:  # a step scores its rows with every model, then trains
            phases[f"forward {r}"] = {**kept, **tag(r, costs[r].state), **tag(r, costs[r].forward)}
        for r in roles:
            c = costs[r]
            if c.train:
                phases[f"train {r}"] = {**kept, **tag(r, c.state), **tag(r, c.optimizer), **tag(r, c.train)}
        if engine and "policy" in roles:
            phases["weight sync"] = {
                **kept,
                **tag("policy", costs["policy"].state),
                "engine/weights": engine["engine/weights"],
            }
        if engine:  # asleep, an engine's process keeps its CUDA context (awake, gpu_memory_utilization counts it)
            for name, parts in phases.items():
                if name != "generate":
                    parts["engine/cuda_context"] = CUDA_CONTEXT
        return phases
    resident = dict(engine)
    for r in roles:
        resident.update(tag(r, costs[r].state))
        resident.update(tag(r, costs[r].optimizer))
    phases = {"steady": dict(resident)}
    for r in roles:
        phases[f"forward {r}"] = {**resident, **tag(r, costs[r].forward)}
    for r in roles:
        if costs[r].train:
            phases[f"train {r}"] = {**resident, **tag(r, costs[r].train)}
    return phases


# -- diagnostics ----------------------------------------------------------------------------------------------


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def _gpu_list(gpus: list[GpuMemory]) -> str:
    by_node: dict[int, list[int]] = {}
    for g in gpus:
        by_node.setdefault(g.node, []).append(g.gpu)

    return "; ".join(f"node {n} GPU {node_ranges(sorted(gs))}" for n, gs in by_node.items())


def mini_per_gpu(spec, role: str) -> int | None:
    """Rows of a role's mini-batch on one data-parallel rank (None where a count is not a number)."""
    t = spec.trainer
    p, cfg = t.placement, getattr(t, role)
    mini = t.critic_mini_batch_size if role == "critic" else t.policy_mini_batch_size
    try:
        world = int(getattr(p, f"{role}_num_gpus_per_node")) * int(getattr(p, f"{role}_num_nodes"))
        if on_megatron(spec, role):
            mc = cfg.megatron_config
            split = (
                int(mc.tensor_model_parallel_size)
                * int(mc.pipeline_model_parallel_size)
                * int(mc.context_parallel_size)
            )
        else:
            split = max(int(cfg.sequence_parallel_size), 1)
        return int(mini) * int(spec.generator.n_samples_per_prompt) // max(world // split, 1)
    except (TypeError, ValueError):
        return None


def _divisor_at_most(total: int | None, limit: int) -> int:
    """The largest divisor of `total` not above `limit` (`limit` itself when `total` is unknown)."""
    if not total or total < 1 or total > 10**12:  # unknown, or too large to factor here
        return limit
    best = 1
    for i in range(1, math.isqrt(total) + 1):
        if total % i == 0:
            best = max([best, *(d for d in (i, total // i) if d <= limit)])
    return best


def _cause(spec, g: GpuMemory) -> tuple[str, str, str]:
    """(code, key, fix) of what tips a GPU over: the largest group of parts in its peak phase."""
    t, ie = spec.trainer, spec.generator.inference_engine
    groups: dict[tuple[str, str], int] = {}
    for name, v in g.parts.items():
        owner, what = name.split("/", 1)
        if what == "cuda_context":
            continue
        if owner == "engine":
            kind = "sync" if g.phase == "weight sync" else "engine"
        elif g.phase == "weight sync":
            kind = "sync"
        elif what in ("activations", "logits", "values"):
            kind = "train" if g.phase.startswith("train") else "forward"
        else:
            kind = "state"
        key = (kind, owner if kind == "state" else "")
        groups[key] = groups.get(key, 0) + v
    (kind, owner), biggest = max(groups.items(), key=lambda kv: kv[1])
    over = g.peak - g.capacity
    if kind == "state":
        role = owner
        if on_megatron(spec, role):
            fix = (
                f"split trainer.{role} over more GPUs (raise megatron_config.tensor_model_parallel_size or "
                "pipeline_model_parallel_size, or the placement's GPUs), or offload the optimizer "
                "(megatron_config.optimizer_config_kwargs.optimizer_cpu_offload: true)"
            )
        else:
            fix = (
                f"shard the {role} over more GPUs (trainer.placement.{role}_num_gpus_per_node / {role}_num_nodes"
                f"{', fsdp_size -1' if getattr(t, role).fsdp_config.fsdp_size > 0 else ''}), set "
                f"trainer.{role}.fsdp_config.cpu_offload: true, or train LoRA adapters (model.lora.rank > 0)"
            )
        return "RLC-E701", f"trainer.{role}.model.path", fix
    if kind in ("train", "forward"):
        name = "micro_train_batch_size_per_gpu" if kind == "train" else "micro_forward_batch_size_per_gpu"
        if int(t.max_tokens_per_microbatch) > 0:  # a token budget sizes the micro-batches instead
            name = "max_tokens_per_microbatch"
        micro = int(getattr(t, name))
        # Activations and logits grow with the micro-batch: the largest one that fits, kept under 90%.
        room = int(WARN_FILL * g.capacity) - (g.peak - biggest)
        fits = int(micro * room // biggest) if biggest and room > 0 else 0
        if kind == "train" and fits >= 1 and name != "max_tokens_per_microbatch":
            # a micro-batch of rows that divides the role's mini-batch per GPU (RLC-E106); a token budget need not
            fits = _divisor_at_most(mini_per_gpu(spec, g.phase.split()[-1]), fits)
        fix = f"lower trainer.{name} to {fits}" if fits >= 1 else f"lower trainer.{name}, and shorten the sequences"
        if name == "max_tokens_per_microbatch" and fits < longest_row(spec)[0]:  # a longer row runs whole anyway
            fix = "one row at its longest does not fit: shorten the sequences"
        if kind == "train" and not t.gradient_checkpointing:
            fix = "turn on trainer.gradient_checkpointing, or " + fix
        fix += " (or shorten generator.sampling_params.max_generate_length, or split rows: sequence_parallel_size)"
        return ("RLC-E702" if kind == "train" else "RLC-E703"), f"trainer.{name}", fix
    if kind == "engine":
        gmu = float(ie.gpu_memory_utilization)
        lower = round(max(gmu - over / g.capacity - 0.02, 0.05), 2)
        return (
            "RLC-E704",
            "generator.inference_engine.gpu_memory_utilization",
            f"lower generator.inference_engine.gpu_memory_utilization to {lower}",
        )
    return (
        "RLC-E706",
        "trainer.placement.colocate_all",
        "give the engines GPUs of their own (colocate_all: false) or raise tensor_parallel_size",
    )


def check_memory(
    spec, plan: Plan, locate: Callable[[str], Location | None] = lambda key: None
) -> tuple[MemoryEstimate, list[Diagnostic]]:
    """The estimate and its findings: an error per cause of a GPU that does not fit, a warning above 90%."""
    est = estimate(spec, plan)
    diags: list[Diagnostic] = []
    for role, info in est.models.items():
        if info.shape is None and info.path is not None:  # no path at all is RLC-E314
            key = f"trainer.{role}.model.path"
            diags.append(
                Diagnostic(
                    "RLC-W702",
                    WARNING,
                    f"the size of {info.path} is unknown ({info.note}): the {role}'s memory is left out of the estimate",
                    key=key,
                    location=locate(key),
                    hint=(
                        f"point trainer.{role}.model.path at a local directory with its config.json, or give its "
                        f"shape in trainer.{role}.model_config_kwargs (hidden_size, num_hidden_layers, "
                        "num_attention_heads, num_key_value_heads, intermediate_size, vocab_size, tie_word_embeddings)"
                    ),
                    values={"path": info.path},
                )
            )
    if plan.device == "GPU" and est.capacity is None:
        known = ", ".join(k for k, v in ACCELERATORS.items() if v)
        diags.append(
            Diagnostic(
                "RLC-W703",
                WARNING,
                f"rlc does not know how much memory a {est.accelerator} has: the GPU memory check is skipped",
                key="cluster.accelerator",
                location=locate("cluster.accelerator"),
                hint=f"accelerators rlc knows: {known}",
            )
        )
    ie = spec.generator.inference_engine
    policy = est.models["policy"].shape
    if est.capacity and policy is not None and ie.backend == "vllm" and plan.engines:
        weights = engine_weights(spec, policy)
        budget = int(ie.gpu_memory_utilization * est.capacity)
        if weights >= budget:
            key = "generator.inference_engine.tensor_parallel_size"
            diags.append(
                Diagnostic(
                    "RLC-E705",
                    ERROR,
                    f"each vLLM engine GPU holds {gib(weights)} of {policy.params / 1e9:.2f}B weights, more than "
                    f"gpu_memory_utilization {ie.gpu_memory_utilization} of a {est.accelerator} ({gib(budget)}): "
                    "no room is left for the KV cache",
                    key=key,
                    location=locate(key),
                    hint="raise generator.inference_engine.tensor_parallel_size (or pipeline_parallel_size), or "
                    "gpu_memory_utilization; `rlc fit` proposes a fix",
                    related=["generator.inference_engine.gpu_memory_utilization"],
                    values={"weights_bytes": weights, "budget_bytes": budget},
                )
            )
    over = [g for g in est.gpus if not g.fits]
    near = [g for g in est.gpus if g.fits and g.fill > WARN_FILL]
    if over:
        short = {(g.node, g.gpu): g for g in estimate(spec, plan, SHORT_ROWS).gpus}
        hard = [(g, short[g.node, g.gpu]) for g in over if not short[g.node, g.gpu].fits]
        diags += _cannot_fit(spec, est, hard, locate)
        soft = [g for g in over if short[g.node, g.gpu].fits]
        diags += _fits_shorter_rows(spec, plan, est, soft, locate)
    if near:
        worst = max(near, key=lambda g: g.peak)
        code, key, fix = _cause(spec, worst)
        diags.append(
            Diagnostic(
                "RLC-W701",
                WARNING,
                f"{_gpu_list(near)} are estimated at {worst.fill:.0%} of a {est.accelerator}'s memory at their peak "
                f"({gib(worst.peak)} of {gib(worst.capacity)} in the {worst.phase} phase; {_top(worst)}): "
                "allocator fragmentation can take the rest",
                key=key,
                location=locate(key),
                hint=f"for headroom: {fix}",
                values=_numbers(worst),
            )
        )
    return est, diags


def _cannot_fit(spec, est: MemoryEstimate, gpus: list[tuple[GpuMemory, GpuMemory]], locate) -> list[Diagnostic]:
    """Errors for GPUs that overflow even when every row is SHORT_ROWS of the longest: one per cause, its numbers
    those short rows' (the fix is sized for the longest rows, where it has to hold)."""
    full, _ = longest_row(spec)
    short_tokens = _lengths(spec, SHORT_ROWS)[0]
    groups: dict[tuple[str, str], list[tuple[GpuMemory, GpuMemory]]] = {}
    for at_full, at_short in gpus:
        code, key, _ = _cause(spec, at_short)
        groups.setdefault((code, key), []).append((at_full, at_short))
    out = []
    for (code, key), pairs in groups.items():
        worst_full, worst = max(pairs, key=lambda p: p[1].peak)
        cause = _cause(spec, worst_full)
        fix = cause[2] if cause[0] == code else _cause(spec, worst)[2]
        out.append(
            Diagnostic(
                code,
                ERROR,
                f"out of GPU memory: {_gpu_list([p[1] for p in pairs])} need an estimated {gib(worst.peak)} in the "
                f"{worst.phase} phase even with rows of {short_tokens} tokens (1/{round(1 / SHORT_ROWS)} of the "
                f"longest, {full}), more than a {est.accelerator}'s {gib(worst.capacity)} ({_top(worst)})",
                key=key,
                location=locate(key),
                hint=fix + "; `rlc plan` shows every GPU's parts; `rlc fit` proposes a fix",
                related=list(MEMORY_KEYS[code][1:]),
                values=_numbers(worst, row_tokens=short_tokens),
            )
        )
    return out


def _fits_shorter_rows(spec, plan: Plan, est: MemoryEstimate, gpus: list[GpuMemory], locate) -> list[Diagnostic]:
    """Warnings for GPUs that fit short rows but not rows of the longest length: the length at which each group
    (by cause) stops fitting, found by bisection on the estimate, and what to change if rows can get that long."""
    full, response = longest_row(spec)
    prompt = full - response
    groups: dict[tuple[str, str, str], list[GpuMemory]] = {}
    for g in gpus:
        groups.setdefault(_cause(spec, g), []).append(g)
    out = []
    for (code, key, fix), members in groups.items():
        where = {(g.node, g.gpu) for g in members}

        def fits(tokens: int, where: set = where) -> bool:
            return all(g.fits for g in estimate(spec, plan, tokens / full).gpus if (g.node, g.gpu) in where)

        lo, hi = _lengths(spec, SHORT_ROWS)[0], full  # fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        worst = max(members, key=lambda g: g.peak)
        rows = (
            f"a micro-batch's rows average at most {lo} tokens"
            if packed_rows(spec)
            else f"no row of a step is longer than {lo} tokens (every row is padded to the longest)"
        )
        out.append(
            Diagnostic(
                "RLC-W704",
                WARNING,
                f"{_gpu_list(members)} fit only while {rows}; rows of the longest length ({full}: {prompt} prompt + "
                f"{response} generated) need an estimated {gib(worst.peak)} in the {worst.phase} phase, more than a "
                f"{est.accelerator}'s {gib(worst.capacity)} ({_top(worst)})",
                key=key,
                location=locate(key),
                hint=(
                    f"if rows can get that long: {fix}; `rlc plan` shows every GPU's parts; `rlc fit` proposes a fix"
                ),
                related=list(MEMORY_KEYS[code][1:]),
                values=_numbers(worst, fits_up_to_tokens=lo, longest_tokens=full),
            )
        )
    return out


def _numbers(g: GpuMemory, **more: int) -> dict:
    """A diagnostic's values: the GPU's peak, capacity and phase, and `more`."""
    return {"peak_bytes": g.peak, "capacity_bytes": g.capacity, "phase": g.phase, **more}


def _top(g: GpuMemory, count: int = 3) -> str:
    return ", ".join(f"{k} {gib(v)}" for k, v in list(g.parts.items())[:count])


def fill_colour(fill: float) -> str:
    """Green below 70%, amber to 90%, orange to 100%, red above: the plan picture's GPU colours."""
    if fill > 1:
        return "#e06666"
    if fill > WARN_FILL:
        return "#f6b26b"
    if fill > 0.7:
        return "#ffe599"
    return "#b6d7a8"


def fmt_bytes(n: int) -> str:
    return f"{n / GiB:.1f}" if n < 100 * GiB else f"{math.floor(n / GiB)}"

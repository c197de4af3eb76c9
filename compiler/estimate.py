"""Time and cost before launch: seconds per step by phase, then the whole run's wall time, GPU-hours and cost.

Each phase is counted from the spec, the plan and a device profile (this text is `rlc explain time`; docs/estimate.md
has the derivation and the published jobs it is held against):
- generate: prefill by FLOPs (2 x params x the tokens run, at prefill_mfu of the engine GPUs' peak): every row's
  prompt (the hf engine runs a group's shared prompt once), and in a multi-turn job each later turn's new tokens (the
  last response and the environment's answer, the rest being in the prefix cache); decode by memory bandwidth: each decoding
  step reads the engine's weights and its rows' KV cache (at bandwidth_use of the bandwidth), at the batch an engine
  runs (its rows, capped by max_num_seqs and by how many rows of the mean length its KV cache holds; more rows
  stream through it), for every turn's response, plus decode_step_overhead_ms per step. A turn decodes until its
  longest row ends, fewer rows each step as they end: lengths are taken as spread evenly up to max_generate_length
  around the mean, so the longest of k rows is that spread's k/(k+1) point.
  remax's greedy response per prompt counts as one more row of each prompt.
- log-prob forwards: 2 x params x tokens for each model that scores the rows (the reference, the policy's old
  log-probs when a step takes more than one optimizer step or the estimator reads them, the critic's values), at
  train_mfu of its GPUs.
- train: 6 x params x tokens per update epoch (8 with gradient checkpointing: the forward runs twice), policy and
  critic, at train_mfu of their GPUs.
- a Megatron mixture of experts adds, per expert layer and micro-batch of each data-parallel rank, its all-to-all
  token exchanges over the expert-parallel group (two a forward, two a backward, two more with recompute; each
  moe_exchange_ms plus its bytes over NVLink or the network) and its grouped GEMMs' reads of the local experts'
  weights (memory-bound at a micro-batch's few rows): what such a job spends beyond its FLOPs.
- weight sync: on GPUs, the policy's all-gather of its shards, then the transport the runtime uses (a call per CUDA-IPC
  bucket when colocated, an nccl broadcast over NVLink or the network, gloo or Ray's object store through host
  memory), then vLLM loading the weights (about 38 GB/s), each at its published cost (compiler/weight_sync_cost.py);
  on a CPU, the weights through host memory over gloo.
- call_overhead_ms: each call into the workers (generate, each forward, each mini-batch, weight sync) adds it; a
  CPU's profile counts it (10 ms), a GPU's leaves it in step_overhead_s (0 ms).
- step_overhead_s: what a step spends outside these (Ray calls, offload and wake-up, rewards; on a CPU the driver's
  own work).
Rows are the mean length (prompt_fill and response_fill of the limits), not the longest; a multi-turn row
(generator.max_turns above 1) is its first prompt (of trainer.max_prompt_length), estimate.turns responses (half of
max_turns) and the environment's answers between them (estimate.observation_tokens each), as many turns as fit before
the conversation passes generator.max_input_length; training sees all of it. A mixture of experts counts the
parameters a token runs through (the experts it is routed to) for FLOPs, all of them for bytes. fsdp2 runs a group's
shared prompt once (forwards, and training without gradient checkpointing), as rlc's trainer does. Rows whose
advantages are all zero, which rlc's trainer leaves out, are not counted: estimate.inert_fraction says how many (a
run's inert_row_fraction), else 2/(n+1) of them where a group of n samples of a right-or-wrong reward is measured
against its own mean (the chance its rewards all agree when the prompt's success rate is unknown). The run is
max_training_steps, or epochs x dataset_rows / train_batch_size; GPU-hours count every GPU of the cluster, and the
cost takes a price per GPU-hour from a dated table (`PRICES`) unless estimate.gpu_hour_price sets one.
Every assumption is printed beside the estimate and set under `estimate:` in the spec (or as an override).
"""

from __future__ import annotations

import math
from dataclasses import field

from rlc.compiler.memory import DTYPE_BYTES, MemoryEstimate, capacity, engine_weights
from rlc.compiler.moe_time import megatron_moe_seconds
from rlc.compiler.roles import critic_on, engine_gpus, ref_on
from rlc.compiler.weight_sync_cost import gpu_sync_cost, sync_inputs
from rlc.core import algorithms
from rlc.core.dataclass import dataclass
from rlc.core.environments import BY_ID
from rlc.core.plan import Plan


@dataclass(frozen=True)
class Device:
    """What the estimate needs of one device: dense 16-bit peak TFLOP/s, memory bandwidth and the link between two
    devices of a node (GB/s, one direction), fixed costs of a decoding step, of a training step and of each call
    into the workers (a GPU's calls are in its step overhead)."""

    tflops: float
    bandwidth_gbs: float
    link_gbs: float
    decode_step_ms: float = 5.0
    step_overhead_s: float = 2.0
    call_ms: float = 0.0  # each call into the workers: generate, each forward, each mini-batch, weight sync


# Vendor datasheets: dense (not sparse) BF16 tensor TFLOP/s, HBM bandwidth, NVLink per direction (PCIe 4/5 x16 for
# cards without NVLink).
DEVICES: dict[str, Device] = {
    "H100": Device(989, 3350, 450),
    "H100-NVL": Device(835, 3900, 300),
    "H200": Device(989, 4800, 450),
    "GH200": Device(989, 4000, 450),
    "B200": Device(2250, 8000, 900),
    "B100": Device(1750, 8000, 900),
    "A100": Device(312, 1555, 300),
    "A100-80GB": Device(312, 2039, 300),
    "L40S": Device(362, 864, 32),
    "L40": Device(181, 864, 32),
    "L4": Device(121, 300, 32),
    "A10G": Device(70, 600, 32),
    "A10": Device(125, 600, 32),
    "MI300X": Device(1307, 5300, 64),
}
DEVICES["H100-80GB"] = DEVICES["H100-MEGA"] = DEVICES["H100"]
# A CPU slot of rlc's local runs (`accelerator: none`), measured on the 2-core machine rlc's CPU benchmarks run on
# (docs/estimate.md, "The CPU profile"): about 0.4 TFLOP/s, the float32 FMA peak of two cores (SmolLM2-135M trains at
# about a third of it), 10 GB/s of memory bandwidth, 3 ms per step of Hugging Face `generate`; 10 ms for each call
# into the workers (a Ray round trip with the batch, the weight sync of a tiny model) and 40 ms a step of the
# driver's own CPU (rewards, batching, advantages at 128 rows): what a tiny model's step is made of there.
CPU = Device(tflops=0.4, bandwidth_gbs=10, link_gbs=5, decode_step_ms=3.0, step_overhead_s=0.04, call_ms=10.0)
NETWORK_GBS = 50  # between nodes: 400 Gb/s InfiniBand or EFA per GPU

# USD per GPU-hour, on demand. Source: mercatus-ai.com's cloud GPU price survey, "Cloud GPU pricing in May 2026",
# https://www.mercatus-ai.com/blog/cloud-gpu-pricing , the midpoint of its specialty-provider range. Accelerators
# it does not price have no default: set estimate.gpu_hour_price.
PRICES_AS_OF = "2026-05"
PRICE_SOURCE = "https://www.mercatus-ai.com/blog/cloud-gpu-pricing"
PRICES: dict[str, float] = {"H100": 3.00, "H100-80GB": 3.00, "H200": 4.00, "A100-80GB": 1.30}


@dataclass
class Phase:
    name: str
    seconds: float
    how: str


@dataclass
class TimeEstimate:
    phases: list[Phase]
    step_s: float
    steps: int | None
    gpus: int
    price: float | None
    price_source: str
    assumptions: dict[str, object] = field(default_factory=dict)

    @property
    def run_s(self) -> float | None:
        return None if self.steps is None else self.steps * self.step_s

    @property
    def gpu_hours(self) -> float | None:
        return None if self.run_s is None else self.run_s / 3600 * self.gpus

    @property
    def cost(self) -> float | None:
        return None if self.gpu_hours is None or self.price is None else self.gpu_hours * self.price

    def to_json(self) -> dict:
        return {
            "phases": {p.name: round(p.seconds, 4) for p in self.phases},
            "step_seconds": round(self.step_s, 4),
            "steps": self.steps,
            "run_seconds": None if self.run_s is None else round(self.run_s, 1),
            "gpus": self.gpus,
            "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 2),
            "gpu_hour_price": self.price,
            "price_source": self.price_source,
            "cost": None if self.cost is None else round(self.cost, 2),
            "assumptions": self.assumptions,
        }


def device_of(spec) -> tuple[str, Device]:
    accel = str(spec.cluster.accelerator)
    if accel == "none":
        return "CPU", CPU
    name = accel.strip().upper().replace("_", "-").removeprefix("NVIDIA-").split(":")[0]
    return name, DEVICES.get(name, DEVICES["H100"] if capacity(accel) else CPU)


def estimate_time(spec, plan: Plan, memory: MemoryEstimate | None) -> TimeEstimate | None:
    """The step's phases and the run's totals; None where the policy's size is unknown."""
    models = memory.models if memory else {}
    policy = models.get("policy")
    if policy is None or policy.shape is None:
        return None
    e, t, g = spec.estimate, spec.trainer, spec.generator
    name, dev = device_of(spec)
    flops = (e.peak_tflops or dev.tflops) * 1e12
    bandwidth = (e.memory_bandwidth_gbs or dev.bandwidth_gbs) * 1e9
    decode_ms = dev.decode_step_ms if e.decode_step_overhead_ms is None else e.decode_step_overhead_ms
    call = (dev.call_ms if e.call_overhead_ms is None else e.call_overhead_ms) / 1000
    overhead = dev.step_overhead_s if e.step_overhead_s is None else e.step_overhead_s
    shape = policy.shape
    params = shape.active_params  # a mixture of experts' FLOPs: the experts a token is routed to
    n = lengths(spec)
    samples = int(g.n_samples_per_prompt)
    prompts = int(t.train_batch_size)
    rows = prompts * samples
    tokens = round(rows * (n.prompt + n.after))
    # fsdp2 runs a group's shared prompt once (not under sequence parallelism, nor in training with checkpointing)
    share = t.strategy != "megatron" and samples > 1 and int(t.policy.sequence_parallel_size) <= 1
    shared = round(prompts * n.prompt + rows * n.after) if share else tokens
    train_tokens = tokens if t.gradient_checkpointing else shared
    estimator = algorithms.advantage_estimator(str(t.algorithm.advantage_estimator))
    generated = rows + (prompts if estimator.needs_greedy_baseline else 0)  # remax: a greedy response per prompt
    phases = [_generate(spec, plan, memory, shape, generated, n, flops, bandwidth, decode_ms, e, call)]
    role_gpus = {r.name: max(len(r.ranks), 1) for r in plan.roles}
    forwards, trains = [], []
    if ref_on(spec):
        forwards.append(
            ("ref", models["ref"].shape.active_params if models.get("ref") and models["ref"].shape else params)
        )
    several = int(t.train_batch_size) > int(t.policy_mini_batch_size) or int(t.update_epochs_per_batch) > 1
    if several or estimator.needs_sum_pi_squared:
        forwards.append(("policy", params))
    trains.append(("policy", params))
    if critic_on(spec) and models.get("critic") and models["critic"].shape:
        critic = models["critic"].shape.active_params
        forwards.append(("critic", critic))
        trains.append(("critic", critic))
    per_gpu = flops * e.train_mfu

    def experts(role: str, rows: float, train: bool) -> float:
        """What a Megatron role's expert layers add beyond FLOPs (exchanges, grouped GEMMs; compiler/moe_time.py)."""
        info = models.get(role)
        moe = info.shape if info is not None and info.shape is not None else shape
        per_node = int(spec.cluster.gpus_per_node)
        link = dev.link_gbs * 1e9
        return megatron_moe_seconds(
            spec, role, moe, role_gpus.get(role, 1), per_node, rows, n.prompt + n.after, train, bandwidth, link
        )

    moe_fwd = sum(experts(r, rows, False) for r, _ in forwards)
    fwd = sum(2 * n * shared / (per_gpu * role_gpus.get(r, 1)) + call for r, n in forwards) + moe_fwd
    names = ", ".join(r for r, _ in forwards) or "none: one optimizer step per batch reuses the engine's rows"
    how = f"2 x params x {shared} tokens for {names}" + _moe_how(moe_fwd)
    phases.append(Phase("log-prob forwards", fwd, how + _calls(call, forwards)))
    factor = 8 if t.gradient_checkpointing else 6
    epochs = int(t.update_epochs_per_batch)
    minis = {
        "policy": math.ceil(prompts / int(t.policy_mini_batch_size)),
        "critic": math.ceil(prompts / int(t.critic_mini_batch_size)),
    }
    calls = [(r, epochs * minis[r]) for r, _ in trains]
    kept = {"policy": 1 - inert(spec)}  # the rows the policy's update runs
    train = sum(
        factor * n * train_tokens * epochs * kept.get(r, 1) / (per_gpu * role_gpus.get(r, 1)) for r, n in trains
    )
    train += call * sum(k for _, k in calls)
    moe_train = sum(experts(r, rows * epochs * kept.get(r, 1), True) for r, _ in trains)
    train += moe_train
    how = f"{factor} x {params / 1e9:.3g}B params x {train_tokens} tokens x {epochs} epoch(s)"
    if kept["policy"] < 1:
        source = "expected" if e.inert_fraction is None else "estimate.inert_fraction"
        how += f" x {kept['policy']:.3g} of the policy's rows (the rest inert, {source})"
    how += _moe_how(moe_train)
    phases.append(Phase("train", train, how + _calls(call, calls)))
    phases.append(_weight_sync(spec, plan, shape, dev, bandwidth, e, call))
    outside = (
        "the driver's own work: rewards, batching, advantages"
        if dev is CPU
        else "Ray calls, offload and wake-up, rewards"
    )
    phases.append(Phase("overhead", overhead, outside))
    step = sum(p.seconds for p in phases)
    if t.fully_async.enabled:  # generation runs beside training: the slower of the two sets the pace
        step = max(phases[0].seconds, step - phases[0].seconds)
    steps = _steps(spec)
    price = e.gpu_hour_price if e.gpu_hour_price is not None else PRICES.get(name)
    source = "estimate.gpu_hour_price" if e.gpu_hour_price is not None else f"{PRICES_AS_OF} price, {PRICE_SOURCE}"
    gpus = int(spec.cluster.gpus_per_node) * int(spec.cluster.num_nodes) if name != "CPU" else 0
    assumptions = {
        "device": name,
        "peak_tflops": flops / 1e12,
        "memory_bandwidth_gbs": bandwidth / 1e9,
        "prompt_tokens": n.prompt,
        "response_tokens": n.response,
        **({"turns": round(n.turns, 2), "observation_tokens": n.observation} if n.multi else {}),
        **({"inert_fraction": round(inert(spec), 3)} if inert(spec) else {}),
        "train_mfu": e.train_mfu,
        "prefill_mfu": e.prefill_mfu,
        **({"moe_exchange_ms": e.moe_exchange_ms} if moe_fwd or moe_train else {}),
        "bandwidth_use": e.bandwidth_use,
        "decode_step_overhead_ms": decode_ms,
        "step_overhead_s": overhead,
        "call_overhead_ms": call * 1000,
    }
    return TimeEstimate(phases, step, steps, gpus, price if gpus else None, source if gpus else "", assumptions)


def inert(spec) -> float:
    """The share of the policy's rows its update leaves out, where rlc's trainer leaves rows out (a loss weighted by
    the advantage, with no KL or entropy term every row feeds): estimate.inert_fraction, else what `expected_inert`
    expects of the job."""
    a = spec.trainer.algorithm
    if not algorithms.policy_loss(a.policy_loss_type).advantage_weighted or a.use_kl_loss:
        return 0.0
    if a.use_entropy_loss and float(a.entropy_loss_coef) != 0:
        return 0.0
    stated = spec.estimate.inert_fraction
    return expected_inert(spec) if stated is None else float(stated)


def expected_inert(spec) -> float:
    """The share of rows in groups whose rewards are all equal, expected before a run: 2/(n+1) for groups of n samples
    of a right-or-wrong reward, an advantage against the group's own mean, and nothing that refills or reweights
    those groups; else 0. n samples of a prompt that succeeds with chance p agree with chance p^n + (1-p)^n, which
    is 2/(n+1) on average when p is equally likely anything (a run's figure is higher where prompts are mostly too
    easy or too hard for the model: set estimate.inert_fraction from its inert_row_fraction)."""
    a, n = spec.trainer.algorithm, int(spec.generator.n_samples_per_prompt)
    env = BY_ID.get(str(spec.environment.env_class))
    if (
        env is None
        or not env.right_or_wrong
        or n < 2
        or not algorithms.advantage_estimator(a.advantage_estimator).group_baseline
    ):
        return 0.0
    if a.use_kl_in_reward or a.advantage_batch_normalize or a.dynamic_sampling.type:
        return 0.0  # rewards less each row's KL differ; normalised advantages are not 0; resampled groups agree less
    return 2 / (n + 1)


def _moe_how(seconds: float) -> str:
    return f", + {duration(seconds)} of expert-layer exchanges and grouped GEMMs per micro-batch" if seconds else ""


def _calls(call: float, calls: list) -> str:
    """How many calls into the workers a phase counts, where the profile gives them a cost."""
    n = sum(k if isinstance(k, int) else 1 for _, k in calls)
    return f", + {n} call(s) of {duration(call)}" if call and n else ""


@dataclass(frozen=True)
class Lengths:
    """A row's mean lengths in tokens: its prompt, each turn's response, its turns and what the environment adds
    after each turn but the last (multi-turn jobs only)."""

    prompt: int
    response: int
    turns: float = 1.0
    observation: int = 0
    multi: bool = False

    @property
    def after(self) -> float:
        """Tokens after the prompt: every turn's response and every observation between turns (what is trained)."""
        return self.turns * self.response + (self.turns - 1) * self.observation


def lengths(spec) -> Lengths:
    """The mean row: `prompt_fill` and `response_fill` of the limits; a multi-turn job's prompt is the first one
    (trainer.max_prompt_length), its turns `estimate.turns` (half of max_turns) and as many as fit before the
    conversation passes generator.max_input_length."""
    e, t, g = spec.estimate, spec.trainer, spec.generator
    multi = int(g.max_turns) > 1 and not g.batched
    limit = int(t.max_prompt_length) if multi else int(g.max_input_length or t.max_prompt_length)
    prompt = max(round(e.prompt_fill * limit), 1)
    response = max(round(e.response_fill * int(g.sampling_params.max_generate_length)), 1)
    if not multi:
        return Lengths(prompt, response)
    turns = min(float(e.turns) if e.turns is not None else max(int(g.max_turns) / 2, 1.0), float(g.max_turns))
    observation = response if e.observation_tokens is None else int(e.observation_tokens)
    room = int(g.max_input_length or limit) - prompt  # the context every turn but the last may fill
    turns = max(min(turns, 1 + room / (response + observation)), 1.0)
    return Lengths(prompt, response, turns, observation, multi=True)


def _generate(spec, plan, memory, shape, rows, n: Lengths, flops, bandwidth, decode_ms, e, call) -> Phase:
    ie = spec.generator.inference_engine
    engines = max(len(plan.engines), 1)
    gpus = engine_gpus(ie)
    per_engine = math.ceil(rows / engines)
    weights = engine_weights(spec, shape)  # one GPU's share
    kv_token = _kv_bytes(spec, shape)
    context = n.prompt + n.after  # a row's whole context at its end
    batch = min(per_engine, int(ie.max_num_seqs)) if ie.backend == "vllm" else per_engine
    if ie.backend == "vllm" and memory is not None and memory.capacity:
        kv = float(ie.gpu_memory_utilization) * memory.capacity - weights
        batch = max(min(batch, int(kv // max(kv_token * context, 1))), 1)
    waves = math.ceil(per_engine / batch)
    # The hf engine runs a group's shared prompt once; vLLM prefills every sample's request (docs/engines.md, measured).
    # A later turn runs only the last response and the environment's answer: the rest is in vLLM's prefix cache, or
    # the hf engine's cache of the last call's prompts; without a prefix cache the whole context runs again.
    hf = ie.backend != "vllm"
    cached = hf or bool(ie.enable_prefix_caching)
    first = per_engine / int(spec.generator.n_samples_per_prompt) * n.prompt if hf else per_engine * n.prompt
    step_in = n.response + n.observation
    later = (n.turns - 1) * (step_in if cached else n.prompt + n.turns / 2 * step_in)
    prefilled = first + per_engine * later
    prefill = 2 * shape.active_params * prefilled / (gpus * flops * e.prefill_mfu)
    base = n.prompt + (n.turns - 1) / 2 * step_in  # a mean turn's context before it decodes

    def step_s(active: float, t: float) -> float:
        """One decoding step with `active` rows t tokens into the turn: the weights and their KV cache read (or its
        FLOPs, where that many rows make it compute-bound), plus the fixed cost of a step."""
        read = weights + active * (base + t) * kv_token
        compute = 2 * shape.active_params / gpus * active / (flops * e.prefill_mfu)
        return max(read / (bandwidth * e.bandwidth_use), compute) + decode_ms / 1000

    limit = int(spec.generator.sampling_params.max_generate_length)
    longest, active = _drain(n.response, limit, batch)
    # Rows stream through a full batch (vLLM refills it as rows end) until the last wave, which decodes until its
    # longest row ends, fewer rows each step.
    full_step = step_s(batch, n.response / 2)
    full = n.response * full_step
    pieces = 64
    width = longest / pieces
    last = sum(step_s(active((i + 0.5) * width), (i + 0.5) * width) * width for i in range(pieces))
    decode = n.turns * ((waves - 1) * full + last)
    calls = math.ceil(n.turns)  # each turn is a call into the engines
    turns = f" x {n.turns:.3g} turns" if n.multi else ""
    how = (
        f"prefill {duration(prefill)} ({round(prefilled)} tokens an engine); decode {duration(decode)}: "
        f"{engines} engine(s) x {per_engine} rows, batch {batch}, {waves} wave(s); a turn runs until its longest "
        f"row ends, {longest:.0f} steps (mean {n.response}){turns}, {duration(full_step)} a "
        "step at the full batch" + _calls(call, [("engines", calls)])
    )
    return Phase("generate", prefill + decode + call * calls, how)


def _drain(mean: int, limit: int, batch: int):
    """A batch's decoding steps until its longest row ends, and the rows still decoding at each step: response
    lengths spread evenly over [2 x mean - limit, limit] or [0, 2 x mean] (the mean given, none past the limit), so
    the longest of `batch` rows is that range's k/(k+1) point and the rows end at an even pace up to it."""
    low, high = max(2 * mean - limit, 0), min(2 * mean, limit)
    if high <= low:  # every row runs to the limit
        return float(high), lambda t: float(batch)
    longest = low + (high - low) * batch / (batch + 1)
    return longest, lambda t: batch if t < low else max(batch * (high - t) / (high - low), 1.0)


def _kv_bytes(spec, shape) -> int:
    """KV-cache bytes of one token on one engine GPU."""
    ie = spec.generator.inference_engine
    b = DTYPE_BYTES.get(str(ie.model_dtype), 2)
    tp = max(int(ie.tensor_parallel_size), 1)
    return 2 * shape.layers * math.ceil(shape.kv_heads / tp) * shape.head_dim * b


def _weight_sync(spec, plan, shape, dev: Device, bandwidth: float, e, call: float) -> Phase:
    ie = spec.generator.inference_engine
    size = DTYPE_BYTES.get(str(ie.model_dtype), 2) * shape.params
    if spec.cluster.accelerator == "none":
        link = (e.link_gbs or dev.link_gbs) * 1e9
        how = "estimate.link_gbs" if e.link_gbs else "gloo through host memory"
        how = f"{size / 1e9:.3g} GB over {how} at {link / 1e9:.4g} GB/s" + _calls(call, [("sync", 1)])
        return Phase("weight sync", size / link + call, how)
    return _gpu_weight_sync(spec, plan, size, dev, e, call)


def _gpu_weight_sync(spec, plan, size: float, dev: Device, e, call: float) -> Phase:
    """Gather, transport and the engines' load, each at what it costs (compiler/weight_sync_cost.py)."""
    inputs = sync_inputs(spec, plan)
    across_nodes = inputs["policy_gpus"] > int(spec.cluster.gpus_per_node)
    gather = NETWORK_GBS if across_nodes else dev.link_gbs
    link = e.link_gbs or (NETWORK_GBS if int(spec.cluster.num_nodes) > 1 else dev.link_gbs)
    cost = gpu_sync_cost(size=size, gather_gbs=gather, link_gbs=link, **inputs)
    how = f"{size / 1e9:.3g} GB: {cost.how()}" + _calls(call, [("sync", 1)])
    return Phase("weight sync", cost.seconds + call, how)


def _steps(spec) -> int | None:
    t = spec.trainer
    if t.max_training_steps:
        return int(t.max_training_steps)
    rows = spec.estimate.dataset_rows
    if rows is None:
        return None
    return int(t.epochs) * max(int(rows) // int(t.train_batch_size), 1)


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"


def render_time(est: TimeEstimate | None) -> str:
    """The estimate under `rlc plan`'s memory: each phase, the step, the run, and every assumption."""
    lines = ["", "time (estimated per step; `rlc explain time` says how, `estimate.*` overrides each assumption):"]
    if est is None:
        lines.append("  no estimate: the policy's size is unknown")
        return "\n".join(lines)
    width = max(len(p.name) for p in est.phases)
    lines += [f"  {p.name:<{width}}  {duration(p.seconds):>9}  {p.how}" for p in est.phases]
    lines.append(f"  {'step':<{width}}  {duration(est.step_s):>9}")
    if est.steps is None:
        lines.append("  run: set trainer.max_training_steps or estimate.dataset_rows to count its steps")
    else:
        run = f"  run: {est.steps} steps, {duration(est.run_s or 0)}"
        if est.gpus:
            run += f", {est.gpu_hours:.3g} GPU-hours"
            run += (
                f", ${est.cost:,.2f} at ${est.price:.2f}/GPU-hour ({est.price_source})"
                if est.cost is not None
                else " (no price for this accelerator: set estimate.gpu_hour_price)"
            )
        lines.append(run)
    lines.append(
        "  assumptions: "
        + ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in est.assumptions.items())
    )
    return "\n".join(lines)

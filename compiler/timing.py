"""Time and cost before launch: seconds per step by phase, then the whole run's wall time, GPU-hours and cost.

Each phase is counted from the spec, the plan and a device profile (this text is `rlc explain time`; docs/estimate.md
has the derivation and the published jobs it is held against):
- generate: prefill by FLOPs (2 x params x prompt tokens, at prefill_mfu of the engine GPUs' peak); decode by memory
  bandwidth: each decoding step reads the engine's weights and its rows' KV cache (at bandwidth_use of the
  bandwidth), at the batch an engine runs (its rows, capped by max_num_seqs and by how many rows of the mean length
  its KV cache holds), in as many waves as that batch takes, plus decode_step_overhead_ms per step.
- log-prob forwards: 2 x params x tokens for each model that scores the rows (the reference, the policy's old
  log-probs when a step takes more than one optimizer step, the critic's values), at train_mfu of its GPUs.
- train: 6 x params x tokens per update epoch (8 with gradient checkpointing: the forward runs twice), policy and
  critic, at train_mfu of their GPUs.
- weight sync: the engine's weights (its dtype) over the link the plan chose (CUDA IPC on the GPU itself, NVLink
  within a node, the network across nodes, gloo through host memory on a CPU).
- call_overhead_ms: each call into the workers (generate, each forward, each mini-batch, weight sync) adds it; a
  CPU's profile counts it (10 ms), a GPU's leaves it in step_overhead_s (0 ms).
- step_overhead_s: what a step spends outside these (Ray calls, offload and wake-up, rewards; on a CPU the driver's
  own work).
Rows are the mean length (prompt_fill and response_fill of the limits), not the longest; fsdp2 runs a group's
shared prompt once (forwards, and training without gradient checkpointing), as rlc's trainer does. Rows whose
advantages are all zero, which rlc's trainer leaves out, are counted: the estimate is for every row. The run is
max_training_steps, or epochs x dataset_rows / train_batch_size; GPU-hours count every GPU of the cluster, and the
cost takes a price per GPU-hour from a dated table (`PRICES`) unless estimate.gpu_hour_price sets one.
Every assumption is printed beside the estimate and set under `estimate:` in the spec (or as an override).
"""

from __future__ import annotations

import math
from dataclasses import field

from rlc.compiler.memory import DTYPE_BYTES, MemoryEstimate, capacity, engine_weights
from rlc.compiler.roles import critic_on, engine_gpus, ref_on
from rlc.core.dataclass import dataclass
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
    params = shape.params
    prompt = max(round(e.prompt_fill * int(g.max_input_length or t.max_prompt_length)), 1)
    response = max(round(e.response_fill * int(g.sampling_params.max_generate_length)), 1)
    samples = int(g.n_samples_per_prompt)
    prompts = int(t.train_batch_size)
    rows = prompts * samples
    tokens = rows * (prompt + response)
    # fsdp2 runs a group's shared prompt once (not under sequence parallelism, nor in training with checkpointing)
    share = t.strategy != "megatron" and samples > 1 and int(t.policy.sequence_parallel_size) <= 1
    shared = prompts * prompt + rows * response if share else tokens
    train_tokens = tokens if t.gradient_checkpointing else shared
    phases = [_generate(spec, plan, memory, shape, rows, prompt, response, flops, bandwidth, decode_ms, e, call)]
    role_gpus = {r.name: max(len(r.ranks), 1) for r in plan.roles}
    forwards, trains = [], []
    if ref_on(spec):
        forwards.append(("ref", models["ref"].shape.params if models.get("ref") and models["ref"].shape else params))
    if int(t.train_batch_size) > int(t.policy_mini_batch_size) or int(t.update_epochs_per_batch) > 1:
        forwards.append(("policy", params))
    trains.append(("policy", params))
    if critic_on(spec) and models.get("critic") and models["critic"].shape:
        forwards.append(("critic", models["critic"].shape.params))
        trains.append(("critic", models["critic"].shape.params))
    per_gpu = flops * e.train_mfu
    fwd = sum(2 * n * shared / (per_gpu * role_gpus.get(r, 1)) + call for r, n in forwards)
    names = ", ".join(r for r, _ in forwards) or "none: one optimizer step per batch reuses the engine's rows"
    phases.append(Phase("log-prob forwards", fwd, f"2 x params x {shared} tokens for {names}" + _calls(call, forwards)))
    factor = 8 if t.gradient_checkpointing else 6
    epochs = int(t.update_epochs_per_batch)
    minis = {
        "policy": math.ceil(prompts / int(t.policy_mini_batch_size)),
        "critic": math.ceil(prompts / int(t.critic_mini_batch_size)),
    }
    calls = [(r, epochs * minis[r]) for r, _ in trains]
    train = sum(factor * n * train_tokens * epochs / (per_gpu * role_gpus.get(r, 1)) for r, n in trains)
    train += call * sum(k for _, k in calls)
    how = f"{factor} x {params / 1e9:.3g}B params x {train_tokens} tokens x {epochs} epoch(s)"
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
        "prompt_tokens": prompt,
        "response_tokens": response,
        "train_mfu": e.train_mfu,
        "prefill_mfu": e.prefill_mfu,
        "bandwidth_use": e.bandwidth_use,
        "decode_step_overhead_ms": decode_ms,
        "step_overhead_s": overhead,
        "call_overhead_ms": call * 1000,
    }
    return TimeEstimate(phases, step, steps, gpus, price if gpus else None, source if gpus else "", assumptions)


def _calls(call: float, calls: list) -> str:
    """How many calls into the workers a phase counts, where the profile gives them a cost."""
    n = sum(k if isinstance(k, int) else 1 for _, k in calls)
    return f", + {n} call(s) of {duration(call)}" if call and n else ""


def _generate(spec, plan, memory, shape, rows, prompt, response, flops, bandwidth, decode_ms, e, call) -> Phase:
    ie = spec.generator.inference_engine
    engines = max(len(plan.engines), 1)
    gpus = engine_gpus(ie)
    per_engine = math.ceil(rows / engines)
    weights = engine_weights(spec, shape)  # one GPU's share
    kv_token = _kv_bytes(spec, shape)
    batch = min(per_engine, int(ie.max_num_seqs)) if ie.backend == "vllm" else per_engine
    if ie.backend == "vllm" and memory is not None and memory.capacity:
        kv = float(ie.gpu_memory_utilization) * memory.capacity - weights
        batch = max(min(batch, int(kv // max(kv_token * (prompt + response), 1))), 1)
    waves = math.ceil(per_engine / batch)
    prefill = 2 * shape.params * per_engine * prompt / (gpus * flops * e.prefill_mfu)
    read = weights + batch * (prompt + response / 2) * kv_token
    compute = 2 * shape.params / gpus * batch / (flops * e.prefill_mfu)
    step = max(read / (bandwidth * e.bandwidth_use), compute) + decode_ms / 1000
    decode = waves * response * step
    how = (
        f"prefill {duration(prefill)}; decode {duration(decode)}: {engines} engine(s) x {per_engine} rows, batch "
        f"{batch}, {waves} wave(s) of {response} steps of {duration(step)}" + _calls(call, [("engines", 1)])
    )
    return Phase("generate", prefill + decode + call, how)


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
        link, how = dev.link_gbs * 1e9, "gloo through host memory"
    elif spec.trainer.placement.colocate_all:
        link, how = bandwidth, "CUDA IPC on the same GPU"
    elif int(spec.cluster.num_nodes) > 1:
        link, how = NETWORK_GBS * 1e9, "the network between nodes"
    else:
        link, how = dev.link_gbs * 1e9, "NVLink within the node"
    if e.link_gbs:
        link, how = e.link_gbs * 1e9, "estimate.link_gbs"
    how = f"{size / 1e9:.3g} GB over {how} at {link / 1e9:.4g} GB/s" + _calls(call, [("sync", 1)])
    return Phase("weight sync", size / link + call, how)


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

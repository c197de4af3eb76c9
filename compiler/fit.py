"""`rlc fit`: the smallest set of changes that makes a job fit its GPUs, each with what it costs in throughput.

The search tries what a practitioner would, cheapest in throughput first (MOVES): smaller micro-batches, gradient
checkpointing, the engines' gpu_memory_utilization (their KV cache against the longest rows), CPU offload, Megatron's
tensor and pipeline parallelism, wider engine tensor parallelism, Ulysses sequence parallelism, and only then more
GPUs or nodes. Each move is taken at
its mildest value that fits; a move that does not make the job fit alone is kept at its strongest value when it
lowers the overflow, and the next is tried on top. Then every kept move is relaxed back as far as the job still
fits, and dropped where it is not needed. The answer is checked by rlc's own pipeline: it validates and fits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from rlc.compiler.check import check
from rlc.compiler.memory import WARN_FILL, GiB, MemoryEstimate, engine_weights, estimate, longest_row, mini_per_gpu
from rlc.compiler.pipeline import CompileResult, compile_job
from rlc.compiler.plan import plan as make_plan
from rlc.compiler.resolve import resolve
from rlc.compiler.roles import critic_on, fsdp_roles, get, ref_on
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import has_errors
from rlc.core.overrides import Override, parse_override

MAX_GPUS = 64  # the most GPUs the search asks for
ROUNDS = 2
FITS = (0, 0)
ENGINE_STEP = 0.05  # gpu_memory_utilization is moved in steps of this
TRAIN, FORWARD = "trainer.micro_train_batch_size_per_gpu", "trainer.micro_forward_batch_size_per_gpu"
GMU, TP = "generator.inference_engine.gpu_memory_utilization", "generator.inference_engine.tensor_parallel_size"
ENGINES = "generator.inference_engine.num_engines"


@dataclass
class Change:
    key: str
    before: Any
    after: Any
    cost: str = ""

    @property
    def override(self) -> str:
        return f"{self.key}={_yaml_scalar(self.after)}"

    def to_json(self) -> dict:
        return {"key": self.key, "before": self.before, "after": self.after, "cost": self.cost}


@dataclass
class FitResult:
    """What `rlc fit` found: `status` is "fits" (nothing to change), "proposal" (the changes make it fit), "none"
    (nothing the search tries makes it fit) or "error" (the spec has errors other than memory)."""

    status: str
    base: CompileResult
    after: CompileResult | None = None
    changes: list[Change] = field(default_factory=list)
    note: str = ""

    @property
    def overrides(self) -> list[str]:
        return [c.override for c in self.changes]


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    return str(v)


def is_memory_code(code: str) -> bool:
    return code.startswith("RLC-E70") or code == "RLC-W704"


@dataclass
class Option:
    """One value of a move: the keys it sets, and whether it changes what resolve derives (then the whole pipeline
    judges it, not the plan and estimate alone)."""

    values: dict[str, Any]
    structural: bool = False


class Search:
    """Trials of a job with changes on top: fast (a copy of the resolved spec, re-planned and re-estimated) unless a
    change is structural, then resolved again and checked by the rules. `source` and `overrides` (a file's job) let
    `compile` run the whole pipeline on an answer; an editor's buffer has none."""

    def __init__(self, base: CompileResult, headroom: float, source: str = "", overrides: Sequence[Override] = ()):
        self.base, self.headroom = base, headroom
        self.source, self.overrides = source, list(overrides)
        self._cache: dict[tuple, tuple[Any, MemoryEstimate | None]] = {}

    def trial(self, changes: dict[str, Any], structural: bool) -> tuple[Any, MemoryEstimate | None]:
        """(the resolved spec, its estimate) with `changes`; the estimate is None where the job does not plan or
        validate."""
        key = tuple(sorted((k, repr(v)) for k, v in changes.items())) + (structural,)
        if key not in self._cache:
            self._cache[key] = self._full(changes) if structural else self._fast(changes)
        return self._cache[key]

    def _fast(self, changes: dict[str, Any]) -> tuple[Any, MemoryEstimate | None]:
        spec = self.base.spec
        for k, v in changes.items():
            spec = _with(spec, k, v)
        layout, found = make_plan(spec)
        return spec, None if has_errors(found) else estimate(spec, layout)

    def _full(self, changes: dict[str, Any]) -> tuple[Any, MemoryEstimate | None]:
        """Resolved again (what the cluster and engine sizes derive) and checked by the rules; the estimate is None
        where a rule other than memory's refuses it."""
        res = self.base.analysis.resolution
        assert res is not None  # the base planned, so it resolved
        spec = res.spec
        for k, v in changes.items():
            spec = _with(spec, k, v)
        again = resolve(spec, res.explicit | set(changes))
        found = again.diagnostics + check(again.spec, lambda key, related=(): None)
        layout, placed = make_plan(again.spec)
        if has_errors(found + placed):
            return again.spec, None
        return again.spec, estimate(again.spec, layout)

    def compile(self, changes: dict[str, Any]) -> CompileResult:
        extra = [parse_override(f"{k}={_yaml_scalar(v)}") for k, v in changes.items()]
        return compile_job(self.source, self.overrides + extra)

    def overflow(self, spec, est: MemoryEstimate | None) -> tuple[float, float]:
        """The worst GPU's bytes over the target, then the sum over GPUs, each plus what the engines' KV cache lacks
        for one longest row ((0, 0): the job fits; infinite where it does not plan). A change is progress when it
        lowers the worst GPU, or the others with the worst unchanged."""
        if est is None:
            return (math.inf, math.inf)
        target = 1 - self.headroom
        over = [max(g.peak - g.capacity * target, 0) for g in est.gpus]
        kv = kv_shortfall(spec, est)
        return (max(over, default=0) + kv, sum(over) + kv)


def _with(obj: Any, path: str, value: Any) -> Any:
    """A copy of `obj` with the dotted `path` set to `value`: only the objects on the path are copied (a trial must
    not change the base, and a deep copy of a whole spec costs more than planning and estimating it)."""
    head, _, rest = path.partition(".")
    new = copy.copy(obj)
    setattr(new, head, _with(getattr(obj, head), rest, value) if rest else value)
    return new


def kv_bytes_per_token(spec, shape) -> int:
    """KV-cache bytes of one token on one engine GPU (keys and values of every layer, split over tensor ranks)."""
    ie = spec.generator.inference_engine
    tp = max(int(ie.tensor_parallel_size), 1)
    b = 2 if str(ie.model_dtype) not in ("float32", "fp32") else 4
    return (
        2 * shape.layers * math.ceil(shape.kv_heads / tp) * shape.head_dim * b // max(int(ie.pipeline_parallel_size), 1)
    )


def kv_cache_bytes(spec, est: MemoryEstimate) -> int | None:
    """The KV cache of one vLLM engine GPU (None without vLLM engines or a known size)."""
    ie, policy = spec.generator.inference_engine, est.models["policy"].shape
    if ie.backend != "vllm" or policy is None or not est.capacity:
        return None
    return int(float(ie.gpu_memory_utilization) * est.capacity) - engine_weights(spec, policy)


def kv_shortfall(spec, est: MemoryEstimate) -> int:
    kv = kv_cache_bytes(spec, est)
    if kv is None:
        return 0
    need = kv_bytes_per_token(spec, est.models["policy"].shape) * longest_row(spec)[0]
    return max(need - kv, 0)


# -- the moves, cheapest in throughput first -------------------------------------------------------------------


def _descending(current: int, allowed: Callable[[int], bool]) -> list[int]:
    return [v for v in range(current - 1, 0, -1) if allowed(v)]


def _micro_train(spec, base) -> list[Option]:
    t = spec.trainer
    if int(t.max_tokens_per_microbatch) > 0:
        return []
    roles = ["policy"] + (["critic"] if critic_on(spec) else [])
    minis = [m for m in (mini_per_gpu(spec, r) for r in roles) if m]
    return [
        Option({TRAIN: v})
        for v in _descending(int(t.micro_train_batch_size_per_gpu), lambda v: all(m % v == 0 for m in minis))
    ]


def _micro_forward(spec, base) -> list[Option]:
    if int(spec.trainer.max_tokens_per_microbatch) > 0:
        return []
    return [
        Option({FORWARD: v}) for v in _descending(int(spec.trainer.micro_forward_batch_size_per_gpu), lambda v: True)
    ]


def _checkpointing(spec, base) -> list[Option]:
    return [] if spec.trainer.gradient_checkpointing else [Option({"trainer.gradient_checkpointing": True})]


def _engine_memory(spec, base) -> list[Option]:
    ie = spec.generator.inference_engine
    if ie.backend != "vllm":
        return []
    gmu = float(ie.gpu_memory_utilization)
    steps = round(gmu / ENGINE_STEP)
    lower = [round(ENGINE_STEP * i, 2) for i in range(steps - 1, 0, -1)]
    higher = [round(ENGINE_STEP * i, 2) for i in range(steps + 1, round(0.95 / ENGINE_STEP) + 1)]
    # Lowering frees memory for what shares the engines' GPUs; raising gives a KV cache too small for a row room.
    return [Option({GMU: v}) for v in lower] + [Option({GMU: v}) for v in higher]


def _offload(spec, base) -> list[Option]:
    # The reference's weights first (no optimizer to step on the CPU), then the critic's, then the policy's.
    roles = [r for r in ("ref", "critic", "policy") if r in fsdp_roles(spec)]
    roles = [r for r in roles if not getattr(spec.trainer, r).fsdp_config.cpu_offload]
    out: list[Option] = []
    acc: dict[str, Any] = {}
    for r in roles:
        acc = {**acc, f"trainer.{r}.fsdp_config.cpu_offload": True}
        out.append(Option(dict(acc)))
    return out


def _megatron_parallel(spec, base) -> list[Option]:
    """Megatron's tensor parallelism doubled up to a node's GPUs, then pipeline stages doubled (every role on it)."""
    if spec.trainer.strategy != "megatron":
        return []
    roles = [r for r in ("policy", "ref", "critic") if r not in fsdp_roles(spec)]
    mc = spec.trainer.policy.megatron_config
    tp, pp = int(mc.tensor_model_parallel_size), int(mc.pipeline_model_parallel_size)
    per_node = min(int(spec.cluster.gpus_per_node), 8)
    sizes = [(t, pp) for t in (2 * tp, 4 * tp, 8 * tp) if t <= per_node]
    top = sizes[-1][0] if sizes else tp
    sizes += [(top, p) for p in (2 * pp, 4 * pp, 8 * pp)]
    out = []
    for t, p in sizes:
        values: dict[str, Any] = {}
        for r in roles:
            key = f"trainer.{r}.megatron_config"
            values.update({f"{key}.tensor_model_parallel_size": t, f"{key}.pipeline_model_parallel_size": p})
        out.append(Option(values, structural=True))
    return out


def _engine_tp(spec, base) -> list[Option]:
    ie = spec.generator.inference_engine
    if ie.backend != "vllm" or spec.cluster.accelerator == "none":
        return []
    tp, per_node = int(ie.tensor_parallel_size), int(spec.cluster.gpus_per_node)
    engines = ie.num_engines
    explicit = ENGINES not in base.analysis.resolution.derived and isinstance(engines, int)
    out = []
    new = tp * 2
    while new <= per_node:
        values: dict[str, Any] = {TP: new}
        if explicit:
            values[ENGINES] = max(engines * tp // new, 1)
        out.append(Option(values, structural=True))
        new *= 2
    return out


def _sequence_parallel(spec, base) -> list[Option]:
    if spec.trainer.strategy == "megatron":
        return []
    roles = fsdp_roles(spec)
    sp = max(int(spec.trainer.policy.sequence_parallel_size), 1)
    out, new = [], sp * 2
    while new <= min(int(spec.cluster.gpus_per_node), 8):
        out.append(Option({f"trainer.{r}.sequence_parallel_size": new for r in roles}, structural=True))
        new *= 2
    return out


def _more_gpus(spec, base) -> list[Option]:
    c = spec.cluster
    per_node, nodes = int(c.gpus_per_node), int(c.num_nodes)
    derived = base.analysis.resolution.derived
    out = []
    sizes = [(g, nodes) for g in (2 * per_node, 4 * per_node, 8 * per_node) if per_node < g <= 8]
    top = sizes[-1][0] if sizes else per_node
    sizes += [(top, n) for n in (2 * nodes, 4 * nodes, 8 * nodes) if top * n <= MAX_GPUS]
    for gpn, n in sizes:
        values: dict[str, Any] = {}
        if gpn != per_node:
            values["cluster.gpus_per_node"] = gpn
        if n != nodes:
            values["cluster.num_nodes"] = n
        for key, scale in _placement_keys(spec, gpn / per_node, n / nodes):
            if key not in derived and isinstance(get(spec, key), int):
                values[key] = max(int(get(spec, key) * scale), 1)
        out.append(Option(values, structural=True))
    return out


def _placement_keys(spec, per_node: float, nodes: float) -> list[tuple[str, float]]:
    """Placement counts a user wrote, and how each scales when the cluster grows."""
    roles = ["policy", *(["ref"] if ref_on(spec) else []), *(["critic"] if critic_on(spec) else [])]
    keys = [(f"trainer.placement.{r}_num_gpus_per_node", per_node) for r in roles]
    keys += [(f"trainer.placement.{r}_num_nodes", nodes) for r in roles]
    return keys + [(ENGINES, per_node * nodes)]


MOVES: list[tuple[str, Callable[[Any, CompileResult], list[Option]]]] = [
    ("training micro-batch", _micro_train),
    ("forward micro-batch", _micro_forward),
    ("gradient checkpointing", _checkpointing),
    ("engine memory", _engine_memory),
    ("CPU offload", _offload),
    ("Megatron tensor and pipeline parallelism", _megatron_parallel),
    ("engine tensor parallelism", _engine_tp),
    ("sequence parallelism", _sequence_parallel),
    ("more GPUs", _more_gpus),
]


# -- the search ------------------------------------------------------------------------------------------------


def fit(source: str, overrides: Sequence[Override] = (), headroom: float = 0.0, largest: bool = False) -> FitResult:
    """The smallest set of changes that makes `source` (plus overrides) fit, or "fits" (with `largest`, the
    largest micro-batches that still fit)."""
    search = Search(compile_job(str(source), list(overrides)), headroom, str(source), overrides)
    base = search.base
    other = [d for d in base.diagnostics if d.severity == "error" and not is_memory_code(d.code)]
    if base.spec is None or base.plan is None or other:
        return FitResult("error", base, note="the spec has errors other than memory: fix them first")
    if base.memory is None or base.memory.capacity is None:
        why = "a CPU-only cluster" if base.plan.device == "CPU" else "an accelerator of unknown memory"
        return FitResult("fits", base, base, note=f"nothing to fit on {why}: GPU memory is not checked")
    if search.overflow(base.spec, base.memory) == FITS and not has_errors(base.diagnostics):
        if largest:  # the largest that fit without a warning: every GPU under RLC-W701's line
            search.headroom = max(headroom, 1 - WARN_FILL)
        changes = _largest(search) if largest else []
        after = search.compile({c.key: c.after for c in changes}) if changes else base
        return FitResult("fits", base, after, changes)
    chosen = _search(search)
    if chosen is None:
        return FitResult("none", base, note=f"nothing rlc tries fits (up to {MAX_GPUS} GPUs)")
    values = {k: v for opt in chosen for k, v in opt.values.items()}
    after = search.compile(values)
    if not after.ok or search.overflow(after.spec, after.memory) != FITS:
        found = "; ".join(f"{d.code} {d.message}" for d in after.diagnostics if d.severity == "error")
        return FitResult("none", base, after, note=f"the best set found does not validate: {found}")
    return FitResult("proposal", base, after, _changes(base, after, values))


Move = Callable[[Any, CompileResult], list[Option]]


def _search(search: Search) -> list[Option] | None:
    kept: list[tuple[Move, Option]] = []

    def state(opts: list[Option]) -> tuple[float, float]:
        spec, est = search.trial(_values(opts), any(o.structural for o in opts))
        return search.overflow(spec, est)

    def spec_with(opts: list[Option]):
        return search.trial(_values(opts), any(o.structural for o in opts))[0] or search.base.spec

    current = state([])
    for _ in range(ROUNDS):  # a bigger cluster opens moves the first round had not (engine and sequence parallelism)
        start = current
        for _, move in MOVES:
            opts = [o for _, o in kept]
            options = [o for o in move(spec_with(opts), search.base) if o not in opts]
            if not options:
                continue
            found = _mildest(options, lambda o, opts=opts: bool(state([*opts, o]) == FITS))  # type: ignore[misc]
            if found is not None:
                kept.append((move, found))
                return _relax(search, kept, state, spec_with)
            strongest = min(options, key=lambda o: state([*opts, o]))
            if (score := state([*opts, strongest])) < current:
                kept.append((move, strongest))
                current = score
        if current == start:
            break
    return None


def _values(opts: list[Option]) -> dict[str, Any]:
    return {k: v for o in opts for k, v in o.values.items()}


def _mildest(options: list[Option], fits: Callable[[Option], bool]) -> Option | None:
    """The first option that fits: by bisection over a long list of one key's values, where more fit the further
    down one goes (gpu_memory_utilization's go down, then up: they are scanned)."""
    monotone = all(len(o.values) == 1 for o in options) and GMU not in options[0].values
    if not monotone or len(options) < 8:
        return next((o for o in options if fits(o)), None)
    if not fits(options[-1]):
        return None
    lo, hi = -1, len(options) - 1  # options[hi] fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(options[mid]) else (mid, hi)
    return options[hi]


def _relax(search: Search, kept: list[tuple[Move, Option]], state, spec_with) -> list[Option]:
    """Each kept move dropped where the job fits without it, else taken back to its mildest value that fits."""
    chosen = [o for _, o in kept]
    for i, (move, option) in enumerate(kept):
        others = [o for j, o in enumerate(chosen) if j != i and o.values]
        if state(others) == FITS:
            chosen[i] = Option({})
            continue
        options = move(spec_with(others), search.base)
        if option in options:
            options = options[: options.index(option) + 1]
        found = (
            _mildest(options, lambda o, others=others: bool(state([*others, o]) == FITS))  # type: ignore[misc]
            if options
            else None
        )
        if found is not None:
            chosen[i] = found
    return [o for o in chosen if o.values]


def _largest(search: Search) -> list[Change]:
    """The largest training and forward micro-batches that still fit (training: ones that divide the
    mini-batch per GPU)."""
    spec: Any = search.base.spec
    t = spec.trainer
    if int(t.max_tokens_per_microbatch) > 0:
        return []
    roles = ["policy"] + (["critic"] if critic_on(spec) else [])
    minis = [m for m in (mini_per_gpu(spec, r) for r in roles) if m]
    rows = max(minis) if minis else int(t.micro_train_batch_size_per_gpu)
    values: dict[str, Any] = {}
    for key, ok in ((TRAIN, lambda v: all(m % v == 0 for m in minis)), (FORWARD, lambda v: True)):
        current = int(get(spec, key))
        ups = [v for v in range(current + 1, max(rows, current) + 1) if ok(v)]
        best = None
        for v in ups:  # the estimate grows with the micro-batch: stop at the first that does not fit
            if search.overflow(*search.trial({**values, key: v}, False)) != FITS:
                break
            best = v
        if best is not None:
            values[key] = best
    return _changes(search.base, None, values)


def _changes(base: CompileResult, after: CompileResult | None, values: dict[str, Any]) -> list[Change]:
    """The changes of `values`, less those that leave a written value as it was (one move can undo another's)."""
    derived = base.analysis.resolution.derived if base.analysis.resolution else {}
    out = []
    for k, v in values.items():
        before = get(base.spec, k)
        if before != v or k in derived:
            out.append(Change(k, before, v, cost(base, k, before, v, after)))
    return out


def _kv_cost(base: CompileResult, final: CompileResult) -> str:
    """An engine GPU's KV cache before and after, and how many rows of the longest length it holds at once."""

    def kv(result: CompileResult) -> tuple[float, int]:
        memory = result.memory
        shape = memory.models["policy"].shape if memory else None
        if memory is None or shape is None or not memory.capacity or result.spec is None:
            return 0.0, 0
        room = max(
            float(result.spec.generator.inference_engine.gpu_memory_utilization) * memory.capacity
            - engine_weights(result.spec, shape),
            0.0,
        )
        row = kv_bytes_per_token(result.spec, shape) * longest_row(result.spec)[0]
        return room, int(room // row) if row else 0

    (b, rows_b), (a, rows_a) = kv(base), kv(final)
    full = longest_row(base.spec)[0]
    return f"KV cache per engine GPU {b / GiB:.1f} -> {a / GiB:.1f} GiB: {rows_b} -> {rows_a} rows of {full} tokens at once"


def cost(base: CompileResult, key: str, before: Any, after: Any, final: CompileResult | None = None) -> str:
    """What a change costs in throughput (or, growing a micro-batch, saves), in a practitioner's words; `final` is
    the job with every change (an engine's KV cache depends on its tensor parallelism too)."""
    if key in (TRAIN, FORWARD):
        what = "training" if key == TRAIN else "forward"
        if after < before:
            return f"micro-batch {before} -> {after}: {before / after:.3g}x more {what} passes"
        return f"micro-batch {before} -> {after}: {after / before:.3g}x fewer {what} passes"
    if key == "trainer.gradient_checkpointing":
        return "each layer's forward runs again in backward: about a third more training compute"
    if key == GMU and base.memory is not None:
        return _kv_cost(base, final or base)
    if key.endswith("fsdp_config.cpu_offload"):
        role = key.split(".")[1]
        extra = ", and its optimizer steps on the CPU" if role != "ref" else ""
        return f"the {role}'s sharded state lives on the CPU: copied over PCIe every pass{extra}"
    if key == TP:
        return f"engines of {before} -> {after} GPUs: fewer engines, an all-reduce per layer in decoding"
    if key == ENGINES:
        return f"{before} -> {after} engines (the same GPUs)"
    if key.endswith("tensor_model_parallel_size") or key.endswith("pipeline_model_parallel_size"):
        what = "tensor" if "tensor" in key else "pipeline"
        extra = "an all-reduce per layer" if what == "tensor" else "pipeline bubbles"
        return (
            f"Megatron {what} parallelism {before} -> {after}: {extra}, {after / before:g}x fewer data-parallel ranks"
        )
    if key.endswith("sequence_parallel_size"):
        return (
            f"each row split over {after} GPUs: an all-to-all per attention layer, {after}x fewer data-parallel ranks"
        )
    if key in ("cluster.gpus_per_node", "cluster.num_nodes"):
        return f"{before} -> {after}: {after / before:.3g}x the GPU-hours"
    return f"{before} -> {after}"


def proposals(result: CompileResult) -> list[tuple[str, dict[str, Any]]]:
    """`rlc fit`'s answer for a compiled buffer, as `rlc lsp` offers it (a code action): one titled set of changes,
    or none where the job fits, has other errors, or nothing tried fits. Judged by the rules and the estimate, as
    each trial of the search is."""
    other = [d for d in result.diagnostics if d.severity == "error" and not is_memory_code(d.code)]
    if result.spec is None or result.plan is None or result.memory is None or not result.memory.capacity or other:
        return []
    search = Search(result, 0.0)
    if search.overflow(result.spec, result.memory) == FITS:
        return []
    chosen = _search(search)
    if chosen is None:
        return []
    values = _values(chosen)
    if search.overflow(*search.trial(values, True)) != FITS:
        return []
    changes = _changes(result, None, values)
    title = "rlc fit: " + ", ".join(
        f"{c.key.rsplit('.', 1)[-1]} {_yaml_scalar(c.before)} -> {c.override.split('=', 1)[1]}" for c in changes
    )
    return [(title, {c.key: c.after for c in changes})]

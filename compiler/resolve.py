"""Resolve: from the typed spec to a config in which every derived value is explicit.

Derivations follow SkyRL's `__post_init__` hooks and the values its `validate_cfg` fills in, then
rlc's own: placement counts from `cluster` when the spec leaves them unset, and `cluster` from the
placement when it is unset (one node when `cluster` names only its GPUs per node and the spec sets no placement
count). Each derived value records the keys it came from.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import re
import types
import typing
from dataclasses import field
from typing import Any

from rlc.compiler import allocation, launch_values
from rlc.compiler.allocation import Allocation
from rlc.compiler.roles import (
    ENGINES,
    PLACEMENT_COUNTS,
    ROLES,
    colocated_counts,
    count,
    critic_on,
    engine_gpus,
    get,
    gpu_demand,
    put,
    ref_on,
)
from rlc.core import algorithms
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, INFO, WARNING, Diagnostic, Location
from rlc.core.runtime_facts import off_policy_section_corrects
from rlc.spec import fields as meta
from rlc.spec.generation import SamplingParams
from rlc.spec.model import default_model
from rlc.spec.training import DEFAULT_MEGATRON_OPTIMIZER_KWARGS, DEFAULT_TRANSFORMER_CONFIG_KWARGS

REF = re.compile(r"\$\{([^{}]+)\}")
ONE_NODE = "RLC-I201"  # the placement follows a cluster of one node the spec names by its GPUs alone


@dataclass
class Resolution:
    spec: Any  # the resolved RlcSpec
    explicit: set[str]  # field paths written in the spec or overrides
    derived: dict[str, list[str]] = field(default_factory=dict)  # path -> the keys it was derived from
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # Fields whose reference did not resolve to a value they take: reported (RLC-E016) and put back to their default,
    # so the rules read a value of the field's type; what the rules find of them is left out, as for schema errors.
    failed: set[str] = field(default_factory=set)


class _Resolver:
    def __init__(self, spec: Any, explicit: set[str], locate):
        self.spec = copy.deepcopy(spec)
        self.explicit = explicit
        self.locate = locate
        self.out = Resolution(self.spec, explicit)
        self.fixed: set[str] = set()  # keys the allocation string set; they count as written
        self.one_node = False  # cluster.num_nodes taken as 1: the cluster names a node and nothing else

    def derive(self, path: str, value: Any, sources: list[str]) -> None:
        put(self.spec, path, value)
        self.out.derived[path] = sources

    def unset(self, path: str) -> bool:
        return path not in self.explicit and path not in self.fixed

    # -- ${...} references -----------------------------------------------------------------

    def interpolate(self) -> None:
        for path, value in list(_walk(self.spec, "")):
            if isinstance(value, str) and "${" in value:
                resolved = self._expand(path, value, [path])
                if resolved is _FAILED:
                    self._restore(path)
                    continue
                wanted = _field_type(self.spec, path)
                if wanted is not None and not _fits(resolved, wanted):
                    what = (
                        "a section" if dataclasses.is_dataclass(resolved) else f"{type(resolved).__name__} {resolved!r}"
                    )
                    self._bad(
                        path,
                        f"{path} is {value!r}, which resolves to {what}; {path} takes {_type_name(wanted)}",
                        "point the reference at a key holding a value of that type, or write the value itself",
                    )
                    self._restore(path)
                    continue
                if _text_only(wanted) and isinstance(resolved, (int, float)) and not isinstance(resolved, bool):
                    resolved = str(resolved)  # as OmegaConf gives a text field: `name: ${trainer.epochs}` is "20"
                outside = _outside(path, resolved)
                if outside:  # the schema saw the reference, not its value: the field's accepted values apply now
                    self._bad(
                        path,
                        f"{path} is {value!r}, which resolves to {resolved!r}; {outside}",
                        "point the reference at a key holding an accepted value, or write the value itself",
                    )
                    self._restore(path)
                    continue
                put(self.spec, path, resolved)

    def _restore(self, path: str) -> None:
        """A field whose reference failed takes its default again (a text field keeps the reference as written)."""
        wanted = _field_type(self.spec, path)
        if wanted is not None and _fits("${}", wanted):
            return
        default = _field_default(self.spec, path)
        if default is not _FAILED:
            put(self.spec, path, default)
            self.out.failed.add(path)

    def _expand(self, path: str, value: str, chain: list[str]) -> Any:
        whole = REF.fullmatch(value)
        refs = REF.findall(value)
        if not refs:
            return value
        results = {}
        for ref in refs:
            if ref.startswith("oc.env:") or ":" in ref:
                continue  # resolved on the node that runs the job
            try:
                target = get(self.spec, ref)
            except AttributeError:
                self._bad(
                    path,
                    f"{path} refers to ${{{ref}}}, which is not a key of the spec",
                    "point the reference at an existing dotted key, e.g. ${trainer.max_prompt_length}",
                )
                return _FAILED
            if ref in chain:
                self._bad(
                    path,
                    f"{path}: references form a cycle ({' -> '.join(chain + [ref])})",
                    "break the cycle with a literal value",
                )
                return _FAILED
            if isinstance(target, str) and "${" in target:
                target = self._expand(ref, target, chain + [ref])
                if target is _FAILED:
                    return _FAILED
                put(self.spec, ref, target)
            results[ref] = target
        if whole and whole.group(1) in results:
            self.out.derived[path] = [whole.group(1)]
            return copy.deepcopy(results[whole.group(1)])
        self.out.derived[path] = list(results)
        return REF.sub(lambda m: str(results[m.group(1)]) if m.group(1) in results else m.group(0), value)

    def _bad(self, path: str, message: str, hint: str) -> None:
        self.out.diagnostics.append(
            Diagnostic("RLC-E016", ERROR, message, key=path, location=self.locate(path), hint=hint)
        )

    # -- the allocation string -----------------------------------------------------------------

    def allocation(self) -> None:
        """Expand trainer.placement.allocation into the keys it stands for; a key also written must agree."""
        text = self.spec.trainer.placement.allocation
        if not isinstance(text, str):
            return
        per_node = self.spec.cluster.gpus_per_node
        try:
            parsed = allocation.parse(text)
            found = allocation.settings(
                parsed, self.spec.trainer.strategy, per_node if isinstance(per_node, int) else None
            )
        except allocation.AllocationError as exc:
            message = f"{allocation.KEY}: {exc.message}"
            self.out.diagnostics.append(
                Diagnostic(
                    exc.code, ERROR, message, key=allocation.KEY, location=self._in_string(exc.offset), hint=exc.hint
                )
            )
            return
        self._unused_components(parsed)
        for path, value in found.items():
            if path not in self.explicit:
                self.derive(path, value, [allocation.KEY])
                self.fixed.add(path)
                continue
            current = get(self.spec, path)
            if current == value or (path == "trainer.strategy" and current == "fsdp" and value == "fsdp2"):
                continue
            self.out.diagnostics.append(
                Diagnostic(
                    allocation.CONFLICT,
                    ERROR,
                    f"{path} is {current!r} but {allocation.KEY} ({text!r}) makes it {value!r}",
                    key=path,
                    location=self.locate(path),
                    hint=f"remove {path} and let the allocation string set it, or change the string",
                    related=[allocation.KEY],
                )
            )

    def _unused_components(self, parsed: Allocation) -> None:
        for comp in parsed.components:
            if comp.role == "ref" and not ref_on(self.spec):
                code, what, hint = (
                    allocation.UNUSED_REF,
                    "places a reference model, but no KL term loads one (use_kl_loss and use_kl_in_reward are off)",
                    "drop the ref component, or turn on a KL term",
                )
            elif comp.role == "critic" and not critic_on(self.spec):
                code, what, hint = (
                    allocation.UNUSED_CRITIC,
                    "places a critic, but trainer.critic.model.path is unset, so no critic is trained",
                    "set trainer.critic.model.path, or drop the critic component",
                )
            else:
                continue
            self.out.diagnostics.append(
                Diagnostic(
                    code,
                    WARNING,
                    f"{allocation.KEY} {what}; its GPUs stay idle",
                    key=allocation.KEY,
                    location=self._in_string(comp.start),
                    hint=hint,
                )
            )

    def _in_string(self, offset: int) -> Location | None:
        """Where character `offset` of the allocation string is written (the value's start when unknown)."""
        loc = self.locate(allocation.KEY)
        if loc is None or loc.text is None:
            return loc
        if loc.line == 0:  # a command-line override: key=value
            eq = loc.text.find("=")
            return Location(loc.file, 0, eq + 2 + offset if eq >= 0 else 0, loc.text)
        quoted = loc.col > 0 and loc.text[loc.col - 1 : loc.col] in ("'", '"')
        return Location(loc.file, loc.line, loc.col + offset + (1 if quoted else 0), loc.text)

    # -- SkyRL's derivations ------------------------------------------------------------------

    def skyrl(self) -> None:
        s = self.spec
        t, g, alg = s.trainer, s.generator, s.trainer.algorithm
        if t.strategy == "fsdp":
            self.derive("trainer.strategy", "fsdp2", ["trainer.strategy"])
        if t.ref.model.path is None:
            self.derive("trainer.ref.model.path", t.policy.model.path, ["trainer.policy.model.path"])
        if g.eval_sampling_params is None:
            mgl = g.sampling_params.max_generate_length
            self.derive(
                "generator.eval_sampling_params",
                SamplingParams(temperature=0.0, max_generate_length=mgl),
                ["generator.sampling_params.max_generate_length"],
            )
        if g.max_input_length is None:
            self.derive("generator.max_input_length", t.max_prompt_length, ["trainer.max_prompt_length"])
        if g.rope_scaling is None and t.rope_scaling is not None:
            self.derive("generator.rope_scaling", copy.deepcopy(t.rope_scaling), ["trainer.rope_scaling"])
        if g.rope_theta is None and t.rope_theta is not None:
            self.derive("generator.rope_theta", t.rope_theta, ["trainer.rope_theta"])
        if alg.temperature is None:
            self.derive(
                "trainer.algorithm.temperature",
                g.sampling_params.temperature,
                ["generator.sampling_params.temperature"],
            )
        lengths = ("generator.max_input_length", "generator.sampling_params.max_generate_length")
        if (
            alg.max_seq_len is None
            and isinstance(g.max_input_length, int)
            and isinstance(g.sampling_params.max_generate_length, int)
            and not self.out.failed.intersection(lengths)  # not from a default that stands in for a failed reference
        ):
            self.derive(
                "trainer.algorithm.max_seq_len",
                g.max_input_length + g.sampling_params.max_generate_length,
                ["generator.max_input_length", "generator.sampling_params.max_generate_length"],
            )
        for role in ("policy", "ref"):
            mc = get(t, f"{role}.megatron_config")
            for name, defaults in (
                ("transformer_config_kwargs", DEFAULT_TRANSFORMER_CONFIG_KWARGS),
                ("optimizer_config_kwargs", DEFAULT_MEGATRON_OPTIMIZER_KWARGS),
            ):
                current = getattr(mc, name) or {}
                if not isinstance(current, dict):
                    continue  # a ${oc.env:...} reference, resolved on the node
                missing = {k: copy.deepcopy(v) for k, v in defaults.items() if k not in current}
                if missing or getattr(mc, name) is None:
                    self.derive(
                        f"trainer.{role}.megatron_config.{name}",
                        {**current, **missing},
                        [f"trainer.{role}.megatron_config.{name}"],
                    )
        opc = alg.off_policy_correction
        if alg.use_tis:
            self.derive(
                "trainer.algorithm.off_policy_correction.tis_ratio_type", "token", ["trainer.algorithm.use_tis"]
            )
            self.derive(
                "trainer.algorithm.off_policy_correction.token_tis_ratio_clip_high",
                alg.tis_imp_ratio_cap,
                ["trainer.algorithm.use_tis", "trainer.algorithm.tis_imp_ratio_cap"],
            )
        if off_policy_section_corrects(opc) and g.sampling_params.logprobs is None:
            self.derive("generator.sampling_params.logprobs", 1, ["trainer.algorithm.off_policy_correction"])
        elif algorithms.policy_loss(alg.policy_loss_type).rollout_anchored and g.sampling_params.logprobs is None:
            self.derive("generator.sampling_params.logprobs", 1, ["trainer.algorithm.policy_loss_type"])

    # -- placement <-> cluster ------------------------------------------------------------------

    def placement(self) -> None:
        s = self.spec
        c, p, ie = s.cluster, s.trainer.placement, s.generator.inference_engine
        if (
            isinstance(c.gpus_per_node, int)
            and c.num_nodes is None
            and p.colocate_all
            and not self._counts_written()
            and self._batches_divide(c.gpus_per_node)
        ):
            # A cluster named by its node alone (`H100:8`): the job takes that node, as with `num_nodes: 1`
            # written, not SkyRL's one-GPU default placement that would leave the rest of it idle. Only where every
            # role shares every GPU: separate groups split the node unevenly (7 policy GPUs and 1 engine), which
            # SkyRL's default batch sizes do not divide, and SkyRL runs that job on its default counts. Likewise a
            # node whose GPU count the batch sizes do not divide (3 GPUs, 1024 prompts): SkyRL runs it on one GPU,
            # and W202 says what is idle.
            self.derive("cluster.num_nodes", 1, ["cluster.gpus_per_node"])
            self.one_node = True
        G, N = c.gpus_per_node, c.num_nodes
        if not isinstance(G, int) or not isinstance(N, int):
            self._cluster_from_placement()
            return
        total = G * N
        per_engine = engine_gpus(ie)
        src = ["cluster.gpus_per_node", "cluster.num_nodes"]
        if p.colocate_all:
            shape = [f"generator.inference_engine.{k}_parallel_size" for k in ("tensor", "pipeline", "data")]
            for key, value in colocated_counts(s, G, N).items():
                if key == ENGINES:
                    if self.unset(key):
                        self.derive(key, value, src + shape)
                elif self._role_unset(key.removeprefix("trainer.placement.").split("_num_")[0]):
                    self.derive(key, value, src)
            return
        # Separate groups: models whose counts are unset share what the engines and explicit models leave.
        separate = ["policy"] + (["critic"] if critic_on(s) else [])
        if ref_on(s) and not p.colocate_policy_ref:
            separate.append("ref")
        fixed = [r for r in separate if not self._role_unset(r)]
        free = [r for r in separate if self._role_unset(r)]
        used = sum(count(getattr(p, f"{r}_num_nodes")) * count(getattr(p, f"{r}_num_gpus_per_node")) for r in fixed)
        inference = count(ie.num_engines) * per_engine if ie.run_engines_locally else 0
        if free:
            share = (total - used - inference) // len(free)
            for role in free:
                self._role_from(role, share, G, src + ["generator.inference_engine.num_engines"])
        elif self.unset("generator.inference_engine.num_engines") and ie.run_engines_locally:
            left = total - used
            if left >= per_engine:
                self.derive(
                    "generator.inference_engine.num_engines",
                    left // per_engine,
                    src + [f"trainer.placement.{r}_num_gpus_per_node" for r in fixed],
                )
        if ref_on(s) and p.colocate_policy_ref and self._role_unset("ref"):
            for dim in ("num_nodes", "num_gpus_per_node"):
                self.derive(
                    f"trainer.placement.ref_{dim}", getattr(p, f"policy_{dim}"), [f"trainer.placement.policy_{dim}"]
                )

    def _batches_divide(self, gpus: int) -> bool:
        """Whether the batch sizes split evenly over `gpus` data-parallel ranks (RLC-E105-E107 would refuse else)."""
        t = self.spec.trainer
        sizes = [t.train_batch_size, t.policy_mini_batch_size] + (
            [t.critic_mini_batch_size] if critic_on(self.spec) else []
        )
        return all(isinstance(n, int) and n % gpus == 0 for n in sizes)

    def _counts_written(self) -> list[str]:
        """The placement counts the spec sets (in the file, an override or the allocation string)."""
        return [k for k in PLACEMENT_COUNTS if not self.unset(k)]

    def notice(self) -> None:
        """Say what a cluster of one node made of the placement, and how to ask for more nodes."""
        if not self.one_node:
            return
        s = self.spec
        p, ie = s.trainer.placement, s.generator.inference_engine
        made = [
            f"{r} {getattr(p, f'{r}_num_nodes')} x {getattr(p, f'{r}_num_gpus_per_node')} GPUs"
            for r in ROLES
            if f"trainer.placement.{r}_num_gpus_per_node" in self.out.derived
        ]
        if ENGINES in self.out.derived:
            made.append(f"{ie.num_engines} inference engine(s) of {engine_gpus(ie)} GPU(s)")
        derived = {k: get(s, k) for k in ("cluster.num_nodes", *PLACEMENT_COUNTS) if k in self.out.derived}
        self.out.diagnostics.append(
            Diagnostic(
                ONE_NODE,
                INFO,
                f"cluster.num_nodes is unset and the spec sets no placement count: the job takes one node of "
                f"{s.cluster.gpus_per_node} GPUs and its placement follows it ({', '.join(made)})",
                key="cluster.num_nodes",
                location=self.locate("cluster.num_nodes"),
                hint="set cluster.num_nodes for more nodes, or the placement counts for fewer GPUs "
                "(counts you set are kept)",
                values={"derived": derived},
            )
        )

    def _role_unset(self, role: str) -> bool:
        return self.unset(f"trainer.placement.{role}_num_nodes") and self.unset(
            f"trainer.placement.{role}_num_gpus_per_node"
        )

    def _role_from(self, role: str, gpus: int, per_node: int, src: list[str]) -> None:
        if not self._role_unset(role) or gpus <= 0:
            return
        nodes, gpn = (gpus // per_node, per_node) if gpus >= per_node else (1, gpus)
        self.derive(f"trainer.placement.{role}_num_nodes", nodes, src)
        self.derive(f"trainer.placement.{role}_num_gpus_per_node", gpn, src)

    def _cluster_from_placement(self) -> None:
        s = self.spec
        c, p = s.cluster, s.trainer.placement
        roles = ["policy"] + (["ref"] if ref_on(s) else []) + (["critic"] if critic_on(s) else [])
        # Models that must share the policy's GPUs take its layout when the spec leaves theirs unset.
        shared = [r for r in roles[1:] if p.colocate_all or (r == "ref" and p.colocate_policy_ref)]
        for role in shared:
            if self._role_unset(role):
                for dim in ("num_nodes", "num_gpus_per_node"):
                    self.derive(
                        f"trainer.placement.{role}_{dim}",
                        getattr(p, f"policy_{dim}"),
                        [f"trainer.placement.policy_{dim}"],
                    )
        per_node = max(count(getattr(p, f"{r}_num_gpus_per_node")) for r in roles)
        demand = gpu_demand(s)
        src = [f"trainer.placement.{r}_num_gpus_per_node" for r in roles]
        if not isinstance(c.gpus_per_node, int):
            if isinstance(c.num_nodes, int) and demand % c.num_nodes == 0 and demand // c.num_nodes >= per_node:
                self.derive("cluster.gpus_per_node", demand // c.num_nodes, src + ["cluster.num_nodes"])
            else:
                self.derive("cluster.gpus_per_node", per_node, src)
        if not isinstance(c.num_nodes, int):
            self.derive(
                "cluster.num_nodes",
                nodes_needed(s, count(c.gpus_per_node)),
                src + ["generator.inference_engine.num_engines", "cluster.gpus_per_node"],
            )


_FAILED = object()


def nodes_needed(spec, per_node: int) -> int:
    """Nodes of `per_node` GPUs the placement needs when whole-node bundles and engines are not split."""
    p, ie = spec.trainer.placement, spec.generator.inference_engine

    def nodes(role: str) -> int:
        n, g = count(getattr(p, f"{role}_num_nodes")), count(getattr(p, f"{role}_num_gpus_per_node"))
        return n if g > per_node // 2 else -(-n * g // per_node)

    if p.colocate_all:
        return max(1, -(-gpu_demand(spec) // per_node))
    total = nodes("policy") + (nodes("critic") if critic_on(spec) else 0)
    if ref_on(spec) and not p.colocate_policy_ref:
        total += nodes("ref")
    if ie.run_engines_locally:
        size = engine_gpus(ie)
        if size <= per_node:
            total += -(-count(ie.num_engines) // (per_node // size))
        else:
            total += count(ie.num_engines) * -(-size // per_node)
    return max(1, total)


def _field_type(spec: Any, path: str) -> Any:
    """The annotation of the spec field at `path`, or None where it cannot be read."""
    *head, last = path.split(".")
    try:
        parent = get(spec, ".".join(head)) if head else spec
        return typing.get_type_hints(type(parent)).get(last)
    except Exception:  # an extension's field annotated with a name the hints cannot resolve: no check
        return None


def _field_default(spec: Any, path: str) -> Any:
    """The default of the spec field at `path` (a fresh one where it has a factory), or _FAILED."""
    *head, last = path.split(".")
    try:
        parent = get(spec, ".".join(head)) if head else spec
        found = {f.name: f for f in dataclasses.fields(parent)}.get(last)
    except Exception:  # not a dataclass field (an extension's mapping, a list item): left as it is
        return _FAILED
    if found is None:
        return _FAILED
    if found.default is not dataclasses.MISSING:
        return copy.deepcopy(found.default)
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return _FAILED


def _fits(value: Any, wanted: Any) -> bool:
    """Whether an interpolated value has the field's type (scalars and containers by kind; sections never)."""
    if dataclasses.is_dataclass(value):
        return False
    if wanted is Any:
        return True
    origin = typing.get_origin(wanted)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(wanted))
    if origin is typing.Literal:
        return value in typing.get_args(wanted)
    if wanted is type(None):
        return value is None
    if wanted is bool:
        return isinstance(value, bool)
    if wanted is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if wanted is str:  # a whole reference to a number in a text field: the number as text (`_text_only`)
        return isinstance(value, (str, int, float))
    kind = origin or wanted
    if kind in (list, tuple, collections.abc.Sequence):
        return isinstance(value, (list, tuple))
    if kind in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    return True  # anything else (a section type, a custom class) is checked by the rules


def _outside(path: str, value: Any) -> str | None:
    """What an interpolated value breaks of its field's accepted values and bounds, or None."""

    model = default_model()
    field = model.lookup(path)
    if field is None or dataclasses.is_dataclass(value):
        return None
    allowed = model.allowed_values(field)
    if allowed and value not in allowed:
        return f"{path} takes one of {', '.join(str(a) for a in allowed)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high, above = (field.meta.get(k) for k in (meta.MINIMUM, meta.MAXIMUM, meta.EXCLUSIVE_MINIMUM))
        bounds = [
            (f"at least {low}", low is not None and value < low),
            (f"above {above}", above is not None and value <= above),
            (f"at most {high}", high is not None and value > high),
        ]
        if any(broken for _, broken in bounds):
            return f"{path} takes values " + " and ".join(text for text, _ in bounds if not text.endswith("None"))
    return None


def _text_only(wanted: Any) -> bool:
    """Whether a field takes text and no number (str, or str | None)."""
    if typing.get_origin(wanted) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(wanted) if a is not type(None)]
        return args == [str]
    return wanted is str


def _type_name(wanted: Any) -> str:
    return getattr(wanted, "__name__", None) or str(wanted).replace("typing.", "")


def _walk(obj: Any, path: str):
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name), f"{path}.{f.name}" if path else f.name)
    else:
        yield path, obj


def resolve(spec: Any, explicit: set[str], locate=lambda path: None) -> Resolution:
    """Interpolate references, apply SkyRL's derivations, then derive placement and cluster."""
    r = _Resolver(spec, explicit, locate)
    r.interpolate()
    launch_values.normalize(lambda path: get(r.spec, path), r.derive)
    r.allocation()
    r.skyrl()
    r.placement()
    r.notice()
    return r.out

"""Allocation strings: AReaL's placement shorthand (`vllm:d4t2+fsdp:d8`) parsed and turned into placement settings.

The string is an alternative way to write the placement counts: resolve expands it into the same keys a spec
would set by hand (engine count and sizes, the policy/ref/critic layout, colocation, Megatron parallel sizes), so
both forms give the same plan. Every error carries the offset of the offending character in the string.
"""

from __future__ import annotations

from dataclasses import field

from rlc.core.dataclass import dataclass

KEY = "trainer.placement.allocation"
INFERENCE_BACKENDS = ("vllm",)
TRAINING_BACKENDS = ("fsdp", "megatron")
ROLE_NAMES = {"actor": "policy", "policy": "policy", "ref": "ref", "critic": "critic"}
ROLLOUT_NAMES = ("rollout", "gen", "inference")
DIM_NAMES = {"d": "data", "t": "tensor", "p": "pipeline", "c": "context", "e": "expert"}
_INFERENCE_DIMS = "dtp"

GRAMMAR = """\
allocation := group ( "+" group )*            groups joined by + get separate GPUs
group      := component ( "|" component )*    components joined by | share the same GPUs
component  := backend [ "[" name "]" ] ":" dims
            | dims                             (a training component with trainer.strategy's backend)
backend    := vllm                             inference engines
            | fsdp | megatron                  training (sets trainer.strategy)
name       := actor | policy | ref | critic    which model a training component places (default: the policy)
            | rollout                          the inference engines
dims       := ( "d" N | "t" N | "p" N | "c" N | "e" N )+
              d data-parallel (for vllm: the number of engines), t tensor-, p pipeline-, c context-,
              e expert-parallel size; vllm takes d, t, p; fsdp takes d and c (c is Ulysses
              sequence parallelism); megatron takes all five (e does not add GPUs)
A model takes d*t*p*c GPUs, laid out on whole nodes of cluster.gpus_per_node. Examples:
  vllm:d4t2+fsdp:d8                      4 engines of 2 GPUs, and the policy on 8 other GPUs
  vllm:d8|fsdp:d8                        engines and policy share 8 GPUs (colocate_all)
  vllm:d4+megatron:d2t2                  policy under Megatron with tensor parallel 2
  vllm:d2+fsdp[actor]:d4+fsdp[ref]:d2    reference model on GPUs of its own
This is AReaL's allocation_mode grammar without its hybrid MoE form `(attn:..|ffn:..)`; sglang engines
and the `sglang.d4p1t1+d4p1t1` spelling are rewritten by `rlc migrate --from areal`."""

# Diagnostic codes (docs/rules.md lists them).
SYNTAX = "RLC-E220"  # the string does not parse
BACKEND = "RLC-E221"  # unknown or unsupported backend
DIMS = "RLC-E222"  # a dimension the backend does not take, repeated, or zero
NAMES = "RLC-E223"  # unknown or repeated component name, or two components for one model
STRATEGY = "RLC-E224"  # training components with different backends
COLOCATION = "RLC-E225"  # a sharing rlc's placement cannot express, or shared components of different sizes
LAYOUT = "RLC-E226"  # a model's GPUs do not fill whole nodes
CONFLICT = "RLC-E227"  # the string and an explicitly set key disagree
UNUSED_REF = "RLC-W220"  # a ref component while no KL term uses the reference model
UNUSED_CRITIC = "RLC-W221"  # a critic component while no critic model is set
CODES = {
    SYNTAX: "the allocation string does not parse",
    BACKEND: "an unknown or unsupported backend",
    DIMS: "a parallel dimension the backend does not take, given twice, or 0",
    NAMES: "an unknown or repeated component name, or two components for the same model",
    STRATEGY: "training components with different backends (rlc trains every model with one strategy)",
    COLOCATION: "a sharing of GPUs rlc's placement cannot express, or shared components of different sizes",
    LAYOUT: "a model's GPU count does not fill whole nodes of cluster.gpus_per_node",
    CONFLICT: "the allocation string and an explicitly set placement key disagree",
    UNUSED_REF: "warning: a ref component, but no KL term loads the reference model",
    UNUSED_CRITIC: "warning: a critic component, but trainer.critic.model.path is unset",
}


class AllocationError(Exception):
    def __init__(self, code: str, message: str, offset: int, hint: str):
        super().__init__(message)
        self.code, self.message, self.offset, self.hint = code, message, offset, hint


@dataclass
class Component:
    backend: str | None  # None: bare dims, a training component with trainer.strategy's backend
    name: str | None
    dims: dict[str, int]
    start: int  # offset of the component in the string
    group: int  # index of the "+"-separated group it belongs to

    @property
    def inference(self) -> bool:
        return self.backend in INFERENCE_BACKENDS

    @property
    def gpus(self) -> int:
        return self.dims.get("d", 1) * self.dims.get("t", 1) * self.dims.get("p", 1) * self.dims.get("c", 1)

    @property
    def role(self) -> str:
        return "engines" if self.inference else ROLE_NAMES.get(self.name or "actor", "policy")


@dataclass
class Allocation:
    text: str
    components: list[Component] = field(default_factory=list)


class _Parser:
    def __init__(self, text: str):
        self.s, self.i = text, 0

    def fail(self, code: str, message: str, hint: str, at: int | None = None):
        raise AllocationError(code, message, self.i if at is None else at, hint)

    def skip(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.skip()
        return self.s[self.i] if self.i < len(self.s) else ""

    def word(self) -> str:
        start = self.i
        while self.i < len(self.s) and (self.s[self.i].isalpha() or self.s[self.i] == "_"):
            self.i += 1
        return self.s[start : self.i]

    def number(self) -> int:
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        if start == self.i:
            got = repr(self.s[self.i]) if self.i < len(self.s) else "the end"
            self.fail(SYNTAX, f"expected a size after {self.s[start - 1]!r}, found {got}", "write e.g. d4 or t2")
        value = int(self.s[start : self.i])
        if value == 0:
            self.fail(DIMS, f"parallel size {self.s[start - 1]}0 is 0", "sizes start at 1", at=start - 1)
        return value

    def parse(self) -> Allocation:
        out = Allocation(self.s)
        if not self.s.strip():
            self.fail(SYNTAX, "the allocation string is empty", "write e.g. vllm:d4+fsdp:d4, or remove the key")
        group = 0
        while True:
            out.components.append(self.component(group))
            nxt = self.peek()
            if nxt == "":
                return out
            if nxt == "+":
                group += 1
            elif nxt != "|":
                self.fail(SYNTAX, f"unexpected {nxt!r} after a component", "join components with + or |")
            self.i += 1

    def component(self, group: int) -> Component:
        self.skip()
        start = self.i
        head = self.word()
        if not head:
            got = repr(self.s[self.i]) if self.i < len(self.s) else "the end"
            self.fail(
                SYNTAX, f"expected a component such as fsdp:d4, found {got}", "write backend:dims, e.g. vllm:d4t2"
            )
        if len(head) == 1 and head in DIM_NAMES and self.i < len(self.s) and self.s[self.i].isdigit():
            self.i = start  # bare dims: a training component
            return Component(None, None, self.dims(None), start, group)
        backend = self.backend(head, start)
        name = None
        if self.peek() == "[":
            self.i += 1
            self.skip()
            name_at = self.i
            name = self.word()
            if not name or self.peek() != "]":
                self.fail(SYNTAX, "a component name is a word in brackets", "write e.g. fsdp[critic]:d4")
            self.i += 1
            self.check_name(backend, name, name_at)
        sep = self.peek()
        if sep != ":":
            hint = "write backend:dims, e.g. vllm:d4" + (
                " (AReaL's older 'sglang.d4' spelling: `rlc migrate --from areal` rewrites it)" if sep == "." else ""
            )
            self.fail(SYNTAX, f"expected ':' after {head!r}, found {sep or 'the end'!r}", hint)
        self.i += 1
        if self.peek() == "(":
            self.fail(
                SYNTAX,
                "the hybrid MoE form (attn:...|ffn:...) is not supported",
                "give one set of sizes, e.g. megatron:d2t2e2",
            )
        return Component(backend, name, self.dims(backend), start, group)

    def backend(self, head: str, at: int) -> str:
        if head in INFERENCE_BACKENDS or head in TRAINING_BACKENDS:
            return head
        if head == "sglang":
            self.fail(
                BACKEND,
                "rlc runs vLLM inference engines, not SGLang",
                "write vllm in place of sglang (same sizes)",
                at=at,
            )
        if head == "archon":
            self.fail(BACKEND, "the archon training backend is not supported", "use fsdp or megatron", at=at)
        import difflib  # deferred: only a wrong name needs a close match

        close = difflib.get_close_matches(head, INFERENCE_BACKENDS + TRAINING_BACKENDS, n=1)
        hint = f"did you mean {close[0]}?" if close else "backends: vllm (inference), fsdp, megatron (training)"
        self.fail(BACKEND, f"unknown backend {head!r}", hint, at=at)
        raise AssertionError  # fail raises

    def check_name(self, backend: str, name: str, at: int) -> None:
        allowed = ROLLOUT_NAMES if backend in INFERENCE_BACKENDS else tuple(ROLE_NAMES)
        if name not in allowed:
            self.fail(NAMES, f"{backend}[{name}]: unknown component name", f"names here: {', '.join(allowed)}", at=at)

    def dims(self, backend: str | None) -> dict[str, int]:
        allowed = _INFERENCE_DIMS if backend in INFERENCE_BACKENDS else "dc" if backend == "fsdp" else "dtpce"
        out: dict[str, int] = {}
        while True:
            self.skip()
            at = self.i
            letter = self.s[self.i] if self.i < len(self.s) else ""
            if letter not in DIM_NAMES:
                break
            self.i += 1
            value = self.number()
            if letter in out:
                self.fail(DIMS, f"{letter} is given twice", "give each parallel size once", at=at)
            if letter not in allowed and value != 1:
                who = backend or "a training component"
                takes = ", ".join(allowed)
                extra = " (rlc's FSDP has no tensor or pipeline parallelism; use megatron)" if backend == "fsdp" else ""
                self.fail(DIMS, f"{who} takes no {DIM_NAMES[letter]}-parallel size", f"it takes {takes}{extra}", at=at)
            out[letter] = value
        if not out:
            got = repr(self.s[self.i]) if self.i < len(self.s) else "the end"
            self.fail(
                SYNTAX, f"expected parallel sizes such as d4, found {got}", "sizes are d, t, p, c, e with a number"
            )
        return out


def parse(text: str) -> Allocation:
    """The components of an allocation string, each checked alone; raises AllocationError."""
    return _Parser(text).parse()


def settings(alloc: Allocation, strategy: str, gpus_per_node: int | None) -> dict[str, object]:
    """The placement keys the string stands for, as dotted path -> value; raises AllocationError."""
    comps = alloc.components
    inference = [c for c in comps if c.inference]
    training = [c for c in comps if not c.inference]
    if len(inference) > 1:
        raise AllocationError(
            NAMES, "more than one inference component", inference[1].start, "rlc runs one engine group"
        )
    seen: dict[str, Component] = {}
    for c in training:
        if c.role in seen:
            raise AllocationError(
                NAMES, f"two components place the {c.role}", c.start, "name them, e.g. fsdp[actor]:d4+fsdp[critic]:d4"
            )
        seen[c.role] = c
    backends = {c.backend for c in training if c.backend}
    if len(backends) > 1:
        second = next(c for c in training if c.backend and c.backend != training[0].backend)
        raise AllocationError(STRATEGY, "training components use different backends", second.start, "use one of them")
    out: dict[str, object] = {}
    if backends:
        backend = backends.pop()
        out["trainer.strategy"] = "fsdp2" if backend == "fsdp" else backend
        strategy = backend
    if inference:
        e = inference[0]
        ie = "generator.inference_engine"
        out.update(
            {
                f"{ie}.backend": "vllm",
                f"{ie}.num_engines": e.dims.get("d", 1),
                f"{ie}.tensor_parallel_size": e.dims.get("t", 1),
                f"{ie}.pipeline_parallel_size": e.dims.get("p", 1),
            }
        )
    for c in training:
        if c.backend is None and strategy not in ("megatron",) and any(c.dims.get(k, 1) != 1 for k in "tpe"):
            raise AllocationError(
                DIMS,
                "t, p and e sizes need the megatron backend",
                c.start,
                "write megatron:... (or set trainer.strategy)",
            )
        out.update(_role_settings(c, strategy, gpus_per_node))
    out.update(_colocation(comps, seen, inference))
    if out.get("trainer.placement.colocate_all") is True:
        for role in ("ref", "critic"):  # under colocate_all every model takes the policy's GPUs
            if role not in seen:
                for dim in ("num_nodes", "num_gpus_per_node"):
                    out[f"trainer.placement.{role}_{dim}"] = out[f"trainer.placement.policy_{dim}"]
    return out


def _role_settings(c: Component, strategy: str, gpus_per_node: int | None) -> dict[str, object]:
    role, gpus = c.role, c.gpus
    if gpus_per_node is None or gpus <= gpus_per_node:
        nodes, per_node = 1, gpus
    elif gpus % gpus_per_node == 0:
        nodes, per_node = gpus // gpus_per_node, gpus_per_node
    else:
        raise AllocationError(
            LAYOUT,
            f"the {role} takes {gpus} GPUs, which do not fill whole nodes of {gpus_per_node}",
            c.start,
            f"make its size a multiple of {gpus_per_node}",
        )
    out: dict[str, object] = {
        f"trainer.placement.{role}_num_nodes": nodes,
        f"trainer.placement.{role}_num_gpus_per_node": per_node,
    }
    d = c.dims
    if (c.backend or strategy) == "megatron":
        mc = f"trainer.{role}.megatron_config"
        out.update(
            {
                f"{mc}.tensor_model_parallel_size": d.get("t", 1),
                f"{mc}.pipeline_model_parallel_size": d.get("p", 1),
                f"{mc}.context_parallel_size": d.get("c", 1),
                f"{mc}.expert_model_parallel_size": d.get("e", 1),
            }
        )
    elif "c" in d:
        out[f"trainer.{role}.sequence_parallel_size"] = d["c"]
    return out


def _colocation(comps: list[Component], roles: dict[str, Component], inference: list[Component]) -> dict[str, object]:
    policy = roles.get("policy")
    if policy is None:
        return {}
    shared = [c for c in comps if c.group == policy.group and c is not policy]
    for c in shared:
        if c.gpus != policy.gpus:
            raise AllocationError(
                COLOCATION,
                f"{'the engines share' if c.inference else f'the {c.role} shares'} the policy's GPUs but takes {c.gpus}, the policy {policy.gpus}",
                c.start,
                "components joined by | take the same number of GPUs",
            )
    if inference and inference[0].group == policy.group:
        apart = [c for c in comps if c.group != policy.group]
        if apart:
            raise AllocationError(
                COLOCATION,
                f"the engines share the policy's GPUs, so the {apart[0].role} must too",
                apart[0].start,
                "with engines and policy colocated every model shares their GPUs: join it with |",
            )
        return {"trainer.placement.colocate_all": True}
    out: dict[str, object] = {"trainer.placement.colocate_all": False} if inference else {}
    if "critic" in roles and roles["critic"].group == policy.group:
        raise AllocationError(
            COLOCATION,
            "the critic can share the policy's GPUs only when the engines share them too",
            roles["critic"].start,
            "give the critic its own GPUs with +, or colocate everything with |",
        )
    if "ref" in roles:
        out["trainer.placement.colocate_policy_ref"] = roles["ref"].group == policy.group
    return out

"""What a rule is and what it sees: `Rule` (a code, a title, the keys it reads, the check itself) and `Context`
(the resolved spec, where each key is written and how the user set it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from rlc.compiler.roles import on_megatron
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, WARNING, Diagnostic


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    keys: tuple[str, ...]
    fn: Callable[[Context], Iterable[Diagnostic]]


def rule(code: str, title: str, *keys: str) -> Callable[[Callable[[Context], Iterable[Diagnostic]]], Rule]:
    """Make a function a Rule with its code, title and the keys it reads (its module lists it in RULES)."""

    def make(fn: Callable[[Context], Iterable[Diagnostic]]) -> Rule:
        return Rule(code, title, keys, fn)

    return make


def num(v: Any) -> float | None:
    """A numeric value, or None for strings left for the node to resolve (e.g. ${oc.env:...})."""
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# Where a value came from, as `origin(key)` tells: a command-line override, a line of the file that differs from
# the default, a line of the file that repeats the default, or nothing the user wrote (None).
OVERRIDE, CHANGED, WRITTEN = "override", "changed", "written"


class Context:
    def __init__(
        self,
        spec: Any,
        locate: Callable[..., Any],
        env: dict | None = None,
        origin: Callable[[str], str | None] | None = None,
    ):
        self.s = spec
        self.locate = locate
        self.env = os.environ if env is None else env
        self.origin = origin or (lambda key: None)

    def culprit(self, keys: Iterable[str], fallback: str) -> str:
        """The key among `keys` the user most likely changed to cause a mismatch: the first set by an override,
        else the first the file sets to a value other than its default, else the first the file sets at all."""
        keys = list(keys)
        for rank in (OVERRIDE, CHANGED, WRITTEN):
            for k in keys:
                if self.origin(k) == rank:
                    return k
        return fallback

    def how_set(self, key: str) -> str:
        """`key = value` and where the user set it, for a message; empty when the user did not set it."""
        where = {OVERRIDE: "on the command line", CHANGED: "in the file", WRITTEN: "in the file"}.get(
            self.origin(key) or ""
        )
        if where is None:
            return ""
        value: Any = self.s
        for part in key.split("."):
            value = getattr(value, part)
        return f"{key} = {value} ({where})"

    def diag(
        self, severity: str, code: str, key: str, message: str, hint: str, related: Iterable[str] = (), **values
    ) -> Diagnostic:
        return Diagnostic(
            code,
            severity,
            message,
            key=key,
            location=self.locate(key, list(related)),
            hint=hint,
            values=values,
            related=list(related),
        )

    def error(self, code, key, message, hint, related=(), **values) -> Diagnostic:
        return self.diag(ERROR, code, key, message, hint, related, **values)

    def warning(self, code, key, message, hint, related=(), **values) -> Diagnostic:
        return self.diag(WARNING, code, key, message, hint, related, **values)

    # shorthands
    @property
    def t(self):
        return self.s.trainer

    @property
    def p(self):
        return self.s.trainer.placement

    @property
    def ie(self):
        return self.s.generator.inference_engine

    @property
    def alg(self):
        return self.s.trainer.algorithm

    @property
    def megatron(self) -> bool:
        return self.t.strategy == "megatron"

    def world(self, role: str) -> int | None:
        n, g = num(getattr(self.p, f"{role}_num_nodes")), num(getattr(self.p, f"{role}_num_gpus_per_node"))
        return int(n * g) if n is not None and g is not None else None

    def dp(self, role: str) -> int | None:
        """Data-parallel size of a role: world / (tp*pp*cp) under Megatron, world // sp under FSDP."""
        w = self.world(role)
        if w is None:
            return None
        if on_megatron(self.s, role):
            mc = getattr(self.t, role).megatron_config
            parts = [
                num(mc.tensor_model_parallel_size),
                num(mc.pipeline_model_parallel_size),
                num(mc.context_parallel_size),
            ]
            if not (parts[0] and parts[1] and parts[2]):
                return None
            size = int(parts[0] * parts[1] * parts[2])
            return w // size if w % size == 0 else None
        sp = getattr(self.t, role).sequence_parallel_size
        return w // sp if isinstance(sp, int) and sp > 0 else None

"""Semantic rules: what SkyRL asserts on a running cluster, decided here from the resolved config alone.

Each rule has a stable code (docs/rules.md lists them) and names the keys it involves, so `rlc explain`
can say which rules a key takes part in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rlc.core.diagnostics import ERROR, WARNING, Diagnostic


@dataclass(frozen=True)
class Rule:
    code: str
    title: str
    keys: tuple[str, ...]
    fn: Callable[[Context], Iterable[Diagnostic]]


RULES: list[Rule] = []
INTERNAL_ERROR = "RLC-E999"  # a rule raised instead of returning diagnostics


def rule(code: str, title: str, *keys: str):
    def deco(fn):
        RULES.append(Rule(code, title, keys, fn))
        return fn

    return deco


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
        if self.megatron and role in ("policy", "ref"):
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


def check(
    spec: Any,
    locate: Callable[..., Any],
    env: dict | None = None,
    origin: Callable[[str], str | None] | None = None,
) -> list[Diagnostic]:
    _load_rules()
    ctx = Context(spec, locate, env, origin)
    out: list[Diagnostic] = []
    for r in RULES:
        try:
            out.extend(r.fn(ctx))
        except Exception as exc:  # noqa: BLE001 - a crashing rule is rlc's bug, reported as data, never a traceback
            message = f"rule {r.code} ({r.fn.__name__}) crashed: {type(exc).__name__}: {exc}"
            out.append(
                Diagnostic(
                    INTERNAL_ERROR,
                    ERROR,
                    message,
                    hint="this is a bug in rlc, not in your spec: please report it with the spec",
                )
            )
    return out


def rules_for(key: str) -> list[Rule]:
    _load_rules()
    return [r for r in RULES if any(key == k or k.startswith(key + ".") or key.startswith(k + ".") for k in r.keys)]


def _load_rules() -> None:
    """The rule modules register themselves with @rule when imported."""
    from rlc.compiler.rules import (  # noqa: F401
        algorithm,
        batch,
        parallel,
        placement,
        runtime,
        upstream,
    )

"""Check: the semantic rules run over the resolved spec, what SkyRL asserts on a running cluster decided here from
the resolved config alone.

Each rule has a stable code (docs/rules.md lists them) and names the keys it involves, so `rlc explain` can say
which rules a key takes part in. RULES below is every rule, module by module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlc.compiler.rules import (
    algorithm,
    batch,
    launch_values,
    parallel,
    placement,
    runtime,
    slurm,
    upstream,
    vllm_cpu,
)
from rlc.compiler.rules.base import Context, Rule
from rlc.compiler.trainers.verl import VERL
from rlc.core.diagnostics import ERROR, Diagnostic

RULES: tuple[Rule, ...] = (
    *algorithm.RULES,
    *batch.RULES,
    *launch_values.RULES,
    *parallel.RULES,
    *placement.RULES,
    *runtime.RULES,
    *slurm.RULES,
    *upstream.RULES,
    *vllm_cpu.RULES,
    *VERL.rules(),  # verl's refusals, for launch.trainer: verl only
)
INTERNAL_ERROR = "RLC-E999"  # a rule raised instead of returning diagnostics


def check(
    spec: Any,
    locate: Callable[..., Any],
    env: dict | None = None,
    origin: Callable[[str], str | None] | None = None,
) -> list[Diagnostic]:
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
    return [r for r in RULES if any(key == k or k.startswith(key + ".") or key.startswith(k + ".") for k in r.keys)]

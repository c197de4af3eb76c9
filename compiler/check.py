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
    fused_head,
    launch_values,
    mtp,
    parallel,
    placement,
    prefill_decode,
    recovery,
    rollout_correction,
    routing_replay,
    runtime,
    skyrl_options,
    skyrl_trainer,
    slurm,
    upstream,
    verl_trainer,
    vllm_cpu,
)
from rlc.compiler.rules.base import Context, Rule
from rlc.core.diagnostics import ERROR, Diagnostic

RULES: tuple[Rule, ...] = (
    *algorithm.RULES,
    *rollout_correction.RULES,
    *batch.RULES,
    *fused_head.RULES,
    *launch_values.RULES,
    *mtp.RULES,
    *mtp.RUNTIME_RULES,
    *parallel.RULES,
    *placement.RULES,
    *prefill_decode.RULES,
    *recovery.RULES,
    *routing_replay.RULES,
    *runtime.RULES,
    *skyrl_options.RULES,
    *skyrl_trainer.RULES,
    *slurm.RULES,
    *upstream.RULES,
    *verl_trainer.RULES,  # verl's refusals, for launch.trainer: verl only
    *vllm_cpu.RULES,
)
# Rules about what rlc's own runtime runs, not about the job: with SkyRL's trainer (launch.trainer: skyrl) they would
# refuse what SkyRL runs (SkyRL 0.4's features rlc has not built yet, rlc's environments, engines and LoRA layers),
# and rules/skyrl_trainer.py refuses in SkyRL's terms what it lacks instead.
RLC_RUNTIME_RULES = frozenset(
    r.code
    for r in (*upstream.RULES, *runtime.RULES, *vllm_cpu.RULES, *mtp.RUNTIME_RULES, routing_replay.replay_runs_here)
    if r.code != "RLC-E904"  # an environment's service (retrieval URL, judge key) is needed under any trainer
) | {
    "RLC-E510",  # the layers rlc's Megatron LoRA puts adapters on
    "RLC-E540",  # Qwen3.5 under rlc's Megatron conversion: no context parallelism,
}
NOT_FOR_TRAINER: dict[str, frozenset[str]] = {"skyrl": RLC_RUNTIME_RULES}
INTERNAL_ERROR = "RLC-E999"  # a rule raised instead of returning diagnostics


def check(
    spec: Any,
    locate: Callable[..., Any],
    env: dict | None = None,
    origin: Callable[[str], str | None] | None = None,
) -> list[Diagnostic]:
    ctx = Context(spec, locate, env, origin)
    out: list[Diagnostic] = []
    skipped = NOT_FOR_TRAINER.get(getattr(spec.launch, "trainer", "rlc"), frozenset())
    for r in RULES:
        if r.code in skipped:
            continue
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

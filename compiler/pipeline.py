"""The compiler as one call: load -> migrate -> validate -> resolve -> check -> plan -> memory fit, with every
diagnostic located.

Every command that reads a spec (validate, plan, compile, diff, launch, run) goes through `compile_job`, so they
all report the same findings at the same places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlc.compiler.frontend import Analysis, analyze
from rlc.compiler.memory import MemoryEstimate, check_memory
from rlc.compiler.plan import plan as make_plan
from rlc.core.diagnostics import Diagnostic, has_errors
from rlc.core.overrides import Override
from rlc.core.plan import Plan


@dataclass
class CompileResult:
    source: str
    analysis: Analysis
    plan: Plan | None  # None when the spec has errors before planning
    diagnostics: list[Diagnostic]  # the front end's, the planner's and the memory check's, in that order
    memory: MemoryEstimate | None = None  # None when there is no plan that fits the cluster

    @property
    def ok(self) -> bool:
        return self.plan is not None and not has_errors(self.diagnostics)

    @property
    def warnings(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "warning")


def compile_job(source: str | Path, overrides: Sequence[Override] = (), env: dict | None = None) -> CompileResult:
    """Everything the compiler can say about a spec plus overrides, and its plan when it has no errors."""
    analysis = analyze(source, list(overrides), env=env)
    diags = list(analysis.diagnostics)
    the_plan, memory = None, None
    if analysis.ok and analysis.doc is not None:
        doc = analysis.doc
        locate = lambda key: doc.locate(tuple(key.split(".")))  # noqa: E731
        the_plan, found = make_plan(analysis.spec, locate)
        diags += found
        if not has_errors(found):
            memory, found = check_memory(analysis.spec, the_plan, locate)
            diags += found
    return CompileResult(str(source), analysis, the_plan, diags, memory)

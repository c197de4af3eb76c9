"""The whole compiler front to back as one call: load -> migrate -> validate -> resolve -> check -> plan.

Every command that reads a spec goes through `compile_job`, so they all report the same diagnostics with the
same locations; rendering the launch files stays with `rlc.compiler.emit.build`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rlc.compiler.frontend import Analysis, analyze
from rlc.compiler.plan import plan as make_plan
from rlc.core.diagnostics import Diagnostic, has_errors
from rlc.core.overrides import Override
from rlc.core.plan import Plan
from rlc.spec.model import SpecModel


@dataclass
class Compilation:
    """What the compiler found: the analysis, the plan (None when the spec did not get that far), all diagnostics."""

    analysis: Analysis
    plan: Optional[Plan] = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.plan is not None and not has_errors(self.diagnostics)

    @property
    def spec(self) -> Any:
        return self.analysis.spec


def compile_job(source: str | Path, overrides: list[Override] = (), model: Optional[SpecModel] = None,
                env: Optional[dict] = None, display: Optional[str] = None) -> Compilation:
    """Analyse and plan SOURCE plus OVERRIDES; an override that cannot apply raises OverrideError."""
    analysis = analyze(source, overrides, model, env, display)
    result = Compilation(analysis, diagnostics=list(analysis.diagnostics))
    if not analysis.ok or analysis.doc is None:
        return result
    doc = analysis.doc
    result.plan, found = make_plan(analysis.spec, lambda key: doc.locate(tuple(key.split("."))))
    result.diagnostics += found
    return result

"""The compiler's spine: load -> upgrade -> validate -> resolve -> check -> plan -> memory -> decide, in that order and
nowhere else.

Every command that reads a spec (validate, plan, compile, diff, launch, run) runs `compile_job` and uses its one
result, so they all report the same findings at the same places; emitting only renders that result. `analyze` is
the front half (up to check), for what needs no plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path

from rlc.compiler.check import INTERNAL_ERROR, check
from rlc.compiler.decide import decide
from rlc.compiler.importers.versions import MigrationReport, upgrade
from rlc.compiler.load import Document, LoadError, decode, document_from_text, load_document
from rlc.compiler.memory import MemoryEstimate, check_memory
from rlc.compiler.plan import plan as make_plan
from rlc.compiler.resolve import Resolution, resolve
from rlc.compiler.roles import get
from rlc.compiler.rules.base import CHANGED, OVERRIDE, WRITTEN
from rlc.compiler.validate import UNREADABLE_VERSION, typed_spec, validate
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, Diagnostic, Location, has_errors
from rlc.core.job import Decisions
from rlc.core.overrides import Override
from rlc.core.plain import plain_yaml
from rlc.core.plan import Plan
from rlc.spec.model import SpecModel, default_model
from rlc.spec.root import RlcSpec


@dataclass
class Analysis:
    """The front half's result: the document, its migration, the resolved spec and every finding so far."""

    doc: Document | None
    resolution: Resolution | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    migration: MigrationReport | None = None  # when the file (or an override) was legacy

    @property
    def spec(self) -> RlcSpec | None:
        return self.resolution.spec if self.resolution else None

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


@dataclass
class CompileResult:
    """Everything the compiler says about a spec: the front half, the plan, the memory estimate, the decisions."""

    source: str
    analysis: Analysis
    plan: Plan | None  # None when the spec has errors before planning
    diagnostics: list[Diagnostic]  # the front half's, the planner's, the memory check's and decide's, in that order
    memory: MemoryEstimate | None = None  # None when there is no plan that fits the cluster
    decisions: Decisions | None = None  # the runtime's settings; None unless the plan fits

    @property
    def spec(self) -> RlcSpec | None:
        return self.analysis.spec

    @property
    def ok(self) -> bool:
        return self.plan is not None and self.decisions is not None and not has_errors(self.diagnostics)

    @property
    def warnings(self) -> int:
        return sum(1 for d in self.diagnostics if d.severity == "warning")


def compile_job(source: str | Path, overrides: Sequence[Override] = (), env: dict | None = None) -> CompileResult:
    """Everything the compiler can say about a spec plus overrides: its plan, memory fit and runtime decisions when it
    has no errors."""
    return _finish(str(source), analyze(source, list(overrides), env=env))


def compile_text(text: str, name: str, env: dict | None = None) -> CompileResult:
    """`compile_job` of a document's text as an editor holds it (saved or not), named `name` in its findings; the
    text passes the same guards as a file's bytes (size, NUL bytes, line length). Its comments are not kept: nothing
    here writes the text back."""
    try:
        doc = document_from_text(decode(text.encode("utf-8", "surrogatepass"), name), name, comments=False)
    except LoadError as exc:
        return _finish(name, Analysis(None, diagnostics=[exc.diagnostic]))
    return _finish(name, analyze_document(doc, env=env))


def _finish(source: str, analysis: Analysis) -> CompileResult:
    """The back half: plan, memory and decide for a front half without errors."""
    result = CompileResult(source, analysis, None, list(analysis.diagnostics))
    spec, doc = analysis.spec, analysis.doc
    if not analysis.ok or spec is None or doc is None:
        return result
    locate = _locator(doc)
    # plan: which role and engine runs on which node and GPU
    result.plan, found = make_plan(spec, locate)
    result.diagnostics += found
    if has_errors(found):
        return result
    # memory: each GPU's peak against its capacity
    result.memory, found = check_memory(spec, result.plan, locate)
    result.diagnostics += found
    # decide: what the runtime does that the spec does not spell out
    try:
        result.decisions = decide(spec, result.plan)
    except Exception as exc:  # noqa: BLE001 - rlc's bug, reported as data like a crashing rule, never a traceback
        message = f"deciding the runtime settings crashed: {type(exc).__name__}: {exc}"
        hint = "this is a bug in rlc, not in your spec: please report it with the spec"
        result.diagnostics.append(Diagnostic(INTERNAL_ERROR, ERROR, message, hint=hint))
    return result


def analyze(
    source: str | Path,
    overrides: Sequence[Override] = (),
    model: SpecModel | None = None,
    env: dict | None = None,
    display: str | None = None,
) -> Analysis:
    """The front half for a spec file plus overrides: load, then `analyze_document`."""
    try:
        doc = load_document(source, display)
    except LoadError as exc:
        return Analysis(None, diagnostics=[exc.diagnostic])
    return analyze_document(doc, overrides, model, env)


def analyze_document(
    doc: Document, overrides: Sequence[Override] = (), model: SpecModel | None = None, env: dict | None = None
) -> Analysis:
    """upgrade -> validate -> resolve -> check on a loaded document."""
    model = model or default_model()
    analysis = Analysis(doc)
    # upgrade: the overrides applied, a legacy SkyRL document migrated in memory
    report = upgrade(doc, list(overrides))
    if report is not None:
        analysis.migration = report
        analysis.diagnostics.extend(report.diagnostics(doc))
    # validate: the schema, then the typed spec
    data = plain_yaml(doc.data)
    schema_diags, invalid = validate(doc, data, model)
    analysis.diagnostics.extend(schema_diags)
    if any(d.code == UNREADABLE_VERSION for d in schema_diags):
        return analysis
    typed, explicit = typed_spec(data, model, invalid)
    # resolve: every derived value explicit
    locate = _locator(doc)
    resolution = resolve(typed, explicit, locate)
    analysis.resolution = resolution
    analysis.diagnostics.extend(resolution.diagnostics)
    # check: the semantic rules, each finding placed where the user set the likeliest culprit
    written = _Written(doc, explicit, model, resolution)
    for d in check(resolution.spec, written.locate, env, written.origin):
        if _touches(d, invalid | resolution.failed):
            continue  # the schema, or the reference's resolution, already reported the key
        if report is not None and d.key and d.key not in explicit and written.is_default(d.key):
            d.hint = f"{d.hint} (the legacy file leaves {d.key} at SkyRL's default; set it explicitly)"
        analysis.diagnostics.append(d)
    return analysis


def _locator(doc: Document) -> Callable[[str], Location]:
    return lambda key: doc.locate(tuple(key.split(".")))


@dataclass
class _Written:
    """How the user set each key: on the command line, in the file (changed from the default or not), or not at all."""

    doc: Document
    explicit: set[str]
    model: SpecModel
    resolution: Resolution

    def locate(self, key: str, related: Sequence[str] = ()) -> Location:
        keys = [key, *related]
        chosen = next((k for k in keys if tuple(k.split(".")) in self.doc.overrides), None)  # the likeliest culprit
        chosen = chosen or next((k for k in keys if k in self.explicit), key)
        return self.doc.locate(key_path(chosen))

    def origin(self, key: str) -> str | None:
        if tuple(key.split(".")) in self.doc.overrides:
            return OVERRIDE
        if key not in self.explicit:
            return None
        return WRITTEN if self.is_default(key) else CHANGED

    def is_default(self, key: str) -> bool:
        spec = self.model.lookup(key)
        if spec is None or key in self.resolution.derived:
            return False
        try:
            return bool(get(self.resolution.spec, key) == spec.default())
        except AttributeError:
            return False


def key_path(key: str) -> tuple[str | int, ...]:
    """A dotted key as a document path: `a.b[1]` (an item of a list, as diagnostics name it) is ('a', 'b', 1)."""
    return tuple(int(part[1:-1]) if part.startswith("[") else part for part in re.findall(r"\[\d+\]|[^.\[]+", key))


def _touches(d: Diagnostic, invalid: set[str]) -> bool:
    keys = [d.key or ""] + list(d.related)
    return any(k == bad or k.startswith(bad + ".") or bad.startswith(k + ".") for k in keys for bad in invalid)

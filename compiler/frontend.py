"""The front end as one call: load -> migrate -> validate -> resolve -> check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlc.compiler.load import Document, LoadError, load_document
from rlc.compiler.resolve import Resolution, resolve
from rlc.compiler.validate import validate
from rlc.core.diagnostics import Diagnostic, has_errors
from rlc.core.overrides import Override
from rlc.core.plain import plain_yaml as to_plain
from rlc.spec.model import SpecModel, default_model


@dataclass
class Analysis:
    doc: Document | None
    resolution: Resolution | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    migration: Any = None  # the MigrationReport when the file (or an override) was legacy

    @property
    def spec(self):
        return self.resolution.spec if self.resolution else None

    @property
    def ok(self) -> bool:
        return not has_errors(self.diagnostics)


def written_paths(data: Any, model: SpecModel, prefix: str = "") -> set[str]:
    """Field paths a document writes (sections and leaves)."""
    out: set[str] = set()
    if not isinstance(data, dict):
        return out
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        spec = model.lookup(path)
        if spec is None:
            continue
        out.add(path)
        if spec.section is not None and isinstance(value, dict):
            out |= written_paths(value, model, path)
    return out


def integral_floats_to_int(data: Any, model: SpecModel, prefix: str = "") -> None:
    """An integer field written as 1e3 (which the schema accepts) becomes the int 1000, so rules compute exactly.

    Left a float, 1e308 turns products into inf and floor divisions into NaN, which no integer conversion takes.
    """
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        spec = model.lookup(path)
        if spec is None:
            continue
        if isinstance(value, dict):
            integral_floats_to_int(value, model, path)
        elif isinstance(value, float) and value.is_integer() and _takes_int(spec.tp):
            data[key] = int(value)


def _takes_int(tp: Any) -> bool:
    return tp is int or (int in getattr(tp, "__args__", ()) and float not in getattr(tp, "__args__", ()))


def analyze(
    source: str | Path,
    overrides: Sequence[Override] = (),
    model: SpecModel | None = None,
    env: dict | None = None,
    display: str | None = None,
) -> Analysis:
    """Everything the compiler can say about a spec file plus overrides, without touching anything else."""
    try:
        doc = load_document(source, display)
    except LoadError as exc:
        return Analysis(None, diagnostics=[exc.diagnostic])
    return analyze_document(doc, overrides, model, env)


def analyze_document(
    doc: Document, overrides: Sequence[Override] = (), model: SpecModel | None = None, env: dict | None = None
) -> Analysis:
    from rlc.compiler.importers.versions import upgrade

    model = model or default_model()
    analysis = Analysis(doc)
    report = upgrade(doc, list(overrides))
    if report is not None:
        analysis.migration = report
        analysis.diagnostics.extend(report.diagnostics(doc))
    data = to_plain(doc.data)
    schema_diags, invalid = validate(doc, data, model)
    analysis.diagnostics.extend(schema_diags)
    if any(d.code == "RLC-E014" for d in schema_diags):
        return analysis
    explicit = written_paths(data, model) - invalid
    integral_floats_to_int(data, model)
    typed = model.to_typed(data, frozenset(invalid))

    def locate(path: str):
        return doc.locate(tuple(path.split(".")))

    resolution = resolve(typed, explicit, locate)
    analysis.resolution = resolution
    analysis.diagnostics.extend(resolution.diagnostics)
    from rlc.compiler.check import check

    def locate_written(key: str, related: Sequence[str] = ()):
        for k in [key, *related]:  # a value set on the command line is the likeliest culprit
            if tuple(k.split(".")) in doc.overrides:
                return locate(k)
        for k in [key, *related]:
            if k in explicit:
                return locate(k)
        return locate(key)

    def origin(key: str) -> str | None:
        from rlc.compiler.rules.base import CHANGED, OVERRIDE, WRITTEN

        if tuple(key.split(".")) in doc.overrides:
            return OVERRIDE
        if key not in explicit:
            return None
        return WRITTEN if _is_default(model, key, resolution) else CHANGED

    for d in check(resolution.spec, locate_written, env, origin):
        if _touches(d, invalid):
            continue
        if report is not None and d.key and d.key not in explicit and _is_default(model, d.key, resolution):
            d.hint = f"{d.hint} (the legacy file leaves {d.key} at SkyRL's default; set it explicitly)"
        analysis.diagnostics.append(d)
    return analysis


def _is_default(model: SpecModel, key: str, resolution: Resolution) -> bool:
    spec = model.lookup(key)
    if spec is None or key in resolution.derived:
        return False
    from rlc.compiler.roles import get

    try:
        return get(resolution.spec, key) == spec.default()
    except AttributeError:
        return False


def _touches(d: Diagnostic, invalid: set[str]) -> bool:
    keys = [d.key or ""] + list(d.related)
    return any(k == bad or k.startswith(bad + ".") or bad.startswith(k + ".") for k in keys for bad in invalid)

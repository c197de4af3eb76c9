"""What the language server answers, as pure functions of a document's lines and its `CompileResult`: the findings
as LSP diagnostics, hover text, completions and the edits that fix a finding. The server (`server.py`) only wires
them to the protocol.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from lsprotocol import types as lsp
from rlc.compiler.explain import explain_key
from rlc.compiler.fit import proposals as fit_proposals
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.registry import IMPORTERS, importer
from rlc.compiler.importers.skyrl.legacy import legacy_target
from rlc.compiler.load import LoadError, document_from_text
from rlc.compiler.lsp.outline import key_line, path_at, siblings, typing_at
from rlc.compiler.memory import GiB
from rlc.compiler.pipeline import CompileResult, compile_text
from rlc.compiler.provenance import trace
from rlc.compiler.roles import get
from rlc.core.diagnostics import ERROR, INFO, WARNING, Diagnostic, Location, caret_width
from rlc.spec.model import FieldSpec, SpecModel, type_label

SOURCE = "rlc"
_SEVERITY = {
    ERROR: lsp.DiagnosticSeverity.Error,
    WARNING: lsp.DiagnosticSeverity.Warning,
    INFO: lsp.DiagnosticSeverity.Information,
}

# The proposals of other commands (`rlc fit`'s): each returns, for a compiled spec, (title, {dotted key: value})
# pairs that the editor offers as code actions on the keys they change.
Proposer = Callable[[CompileResult], Sequence[tuple[str, dict[str, Any]]]]
PROPOSERS: list[Proposer] = [fit_proposals]


def finding_range(d: Diagnostic, lines: Sequence[str]) -> lsp.Range:
    """Where a finding is, as `rlc validate` underlines it: from its column over the token there; the first line when
    it has no place in the file (a finding about the whole file)."""
    loc = d.location
    if loc is None or loc.line <= 0 or loc.line > len(lines):
        return lsp.Range(lsp.Position(0, 0), lsp.Position(0, len(lines[0]) if lines else 0))
    text = lines[loc.line - 1]
    start = max(loc.col - 1, 0)
    return lsp.Range(lsp.Position(loc.line - 1, start), lsp.Position(loc.line - 1, start + caret_width(text, loc.col)))


def to_lsp(d: Diagnostic, lines: Sequence[str], uri: str) -> lsp.Diagnostic:
    """A finding as an editor shows it: code, severity, message and key; its fix as related information."""
    where = finding_range(d, lines)
    related = [lsp.DiagnosticRelatedInformation(lsp.Location(uri, where), f"help: {d.hint}")] if d.hint else None
    return lsp.Diagnostic(
        range=where,
        message=d.message + (f"\nkey: {d.key}" if d.key else ""),
        severity=_SEVERITY.get(d.severity, lsp.DiagnosticSeverity.Information),
        code=d.code,
        source=SOURCE,
        related_information=related,
        data={
            "key": d.key,
            "values": json.loads(json.dumps(d.values, default=str)),
            "whole_file": d.location is None or d.location.line <= 0,
        },
    )


# -- hover -------------------------------------------------------------------------------------------------------


def hover(lines: Sequence[str], line: int, result: CompileResult | None) -> str | None:
    """What `rlc explain KEY` says of the key on this line, and the value it resolves to with where that came from."""
    found = path_at(lines, line)
    if found is None:
        return None
    key = ".".join(found[0])
    text, known = explain_key(key)
    if not known:
        return None
    head = _resolved(key, result)
    return (f"{head}\n\n" if head else "") + f"```text\n{text}\n```"


def _resolved(key: str, result: CompileResult | None) -> str:
    analysis = result.analysis if result else None
    if analysis is None or analysis.resolution is None:
        return ""
    try:
        value = get(analysis.resolution.spec, key)
    except AttributeError:
        return ""
    origins = trace(analysis.resolution, analysis.doc, analysis.migration)
    if not hasattr(value, "__dataclass_fields__"):
        return _value_line(key, value, origins.get(key))
    # a section: the values derived inside it, which its lines do not show
    derived = [k for k in origins if k.startswith(key + ".") and origins[k].kind == "derived"]
    return "\n".join(f"- {_value_line(k, get(analysis.resolution.spec, k), origins[k])}" for k in derived)


def _value_line(key: str, value: Any, origin: Any) -> str:
    return f"**{key}** = `{json.dumps(value, default=str)}`" + (f": {origin}" if origin else "")


# -- completion --------------------------------------------------------------------------------------------------


def completions(lines: Sequence[str], line: int, col: int, model: SpecModel) -> list[lsp.CompletionItem]:
    """The keys that may be written here (those not yet written in this mapping), or the accepted values of this
    key, each with its doc."""
    typing = typing_at(lines, line, col)
    if typing is None:
        return []
    parent = ".".join(typing.parent)
    if typing.value:
        spec = model.lookup(parent)
        return _values(spec, model) if spec is not None and spec.section is None else []
    section = model.root if not parent else getattr(model.lookup(parent), "section", None)
    if section is None:
        return []
    taken = siblings(lines, line, typing.start)
    return [
        lsp.CompletionItem(
            label=f.name,
            kind=lsp.CompletionItemKind.Module if f.section is not None else lsp.CompletionItemKind.Property,
            detail="section" if f.section is not None else type_label(f.tp),
            documentation=lsp.MarkupContent(lsp.MarkupKind.Markdown, _doc(f)),
            insert_text=f"{f.name}:" + ("\n" + " " * (typing.start + 2) if f.section is not None else " "),
        )
        for f in model.fields_of(section, parent)
        if f.name not in taken or f.name == typing.word
    ]


def _values(spec: FieldSpec, model: SpecModel) -> list[lsp.CompletionItem]:
    allowed = model.allowed_values(spec)
    if allowed is None and type_label(spec.tp).startswith("bool"):
        allowed = (True, False)
    return [
        lsp.CompletionItem(
            label=json.dumps(v) if not isinstance(v, str) else v,
            kind=lsp.CompletionItemKind.EnumMember,
            detail=spec.path,
            documentation=lsp.MarkupContent(lsp.MarkupKind.Markdown, _doc(spec)),
        )
        for v in allowed or ()
    ]


def _doc(f: FieldSpec) -> str:
    if f.section is not None:
        return f.doc
    return f"{f.doc}\n\ntype: `{type_label(f.tp)}`, default: `{json.dumps(f.default(), default=str)}`"


# -- code actions ------------------------------------------------------------------------------------------------


def actions(
    lines: Sequence[str], uri: str, wanted: lsp.Range, found: Sequence[Diagnostic], result: CompileResult | None
) -> list[lsp.CodeAction]:
    """The edits that fix the findings on the lines of `wanted`: a misspelt key or value, a renamed legacy key, the
    value a rule proposes; then what the registered proposers offer for those lines."""
    out: list[lsp.CodeAction] = []
    for d in found:
        where = finding_range(d, lines)
        if where.end.line < wanted.start.line or where.start.line > wanted.end.line:
            continue
        for title, edit in _fixes(d, lines, where):
            out.append(_action(title, uri, [edit], to_lsp(d, lines, uri)))
        changes = d.values.get("proposed_changes") or {}
        several = [e for key, value in changes.items() if (e := set_value(lines, key, value)) is not None]
        if changes and len(several) == len(changes):  # every key is set on a line of the file: one edit of them all
            title = "set " + ", ".join(f"{k.rsplit('.', 1)[1]} to {_scalar(v)}" for k, v in changes.items())
            out.append(_action(title, uri, several, to_lsp(d, lines, uri)))
    proposals = [p for proposer in PROPOSERS for p in proposer(result)] if result is not None else []
    for title, values in proposals:
        edits = [e for key, value in values.items() if (e := set_value(lines, key, value)) is not None]
        if edits and any(wanted.start.line <= e.range.start.line <= wanted.end.line for e in edits):
            out.append(_action(title, uri, edits, None))
    return out


def _action(title: str, uri: str, edits: list[lsp.TextEdit], d: lsp.Diagnostic | None) -> lsp.CodeAction:
    return lsp.CodeAction(
        title=title,
        kind=lsp.CodeActionKind.QuickFix,
        diagnostics=[d] if d else None,
        edit=lsp.WorkspaceEdit(changes={uri: edits}),
        is_preferred=d is not None,
    )


def _fixes(d: Diagnostic, lines: Sequence[str], where: lsp.Range) -> list[tuple[str, lsp.TextEdit]]:
    if d.code == "RLC-E010" and d.key:
        parent, _, name = d.key.rpartition(".")
        names = [s for s in d.values.get("suggestions", []) if "." not in s]
        target = legacy_target(d.key)
        if target and target.rpartition(".")[0] == parent and " " not in target:
            names.append(target.rpartition(".")[2])
        span = _key_span(lines, where.start.line, name)
        return [(f"rename {name} to {new}", lsp.TextEdit(span, new)) for new in names if span is not None]
    proposed = d.values.get("proposed")
    if proposed is not None and d.key:
        edit = set_value(lines, d.key, proposed)
        return [(f"set {d.key} to {_scalar(proposed)}", edit)] if edit else []
    return []


def _key_span(lines: Sequence[str], n: int, name: str) -> lsp.Range | None:
    found = key_line(lines, n)
    if found is None or found.key != name:
        return None
    start = lines[n].index(name, found.col)
    return lsp.Range(lsp.Position(n, start), lsp.Position(n, start + len(name)))


def set_value(lines: Sequence[str], key: str, value: Any) -> lsp.TextEdit | None:
    """The edit that writes `value` for `key` on the line that sets it; None when the file does not set it."""
    parts = key.split(".")
    for n in range(len(lines)):
        found = path_at(lines, n)
        if found is None or found[0] != parts:
            continue
        line = found[1]
        rest = lines[n][line.value_col :]
        body = rest.split(" #", 1)[0] if not rest.lstrip().startswith("#") else ""
        start = line.value_col + len(body) - len(body.lstrip())
        end = line.value_col + len(body.rstrip())
        if end <= start:
            start = end = line.value_col
        text = _scalar(value) if end > start else " " + _scalar(value)
        return lsp.TextEdit(lsp.Range(lsp.Position(n, start), lsp.Position(n, end)), text)
    return None


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def migration_action(text: str, name: str, uri: str, lines: Sequence[str]) -> lsp.CodeAction | None:
    """The whole legacy SkyRL file rewritten as spec v1, comments kept (what `rlc migrate --in-place` writes)."""
    try:
        migrated = importer("skyrl").convert(document_from_text(text, name))
    except (LoadError, NotImportable):
        return None
    if migrated is None:
        return None
    end = lsp.Position(len(lines), 0)
    edit = lsp.TextEdit(lsp.Range(lsp.Position(0, 0), end), migrated.text)
    return lsp.CodeAction(
        title=f"migrate this file to spec v1 ({len(migrated.changes)} change(s), as `rlc migrate --in-place`)",
        kind=lsp.CodeActionKind.RefactorRewrite,
        edit=lsp.WorkspaceEdit(changes={uri: [edit]}),
    )


def imported_findings(text: str, name: str) -> list[Diagnostic] | None:
    """For a config of another framework rlc imports (`rlc migrate --from NAME`, e.g. AReaL): what the import
    reports, each change that alters what runs at its line, then the findings of the spec v1 it imports to (placed on
    the first line: their lines are the new file's). None when no importer takes the file."""
    try:
        doc = document_from_text(text, name)
    except LoadError:
        return None
    for chosen in IMPORTERS:
        if chosen.rewrites:
            continue  # a rewriting importer (legacy SkyRL) is the pipeline's own migration
        try:
            imported = chosen.convert(doc)
        except NotImportable:
            continue
        if imported is None:
            continue
        head = Diagnostic(
            "RLC-W010",
            WARNING,
            f"{name} is an {chosen.what}, not spec v1; {len(imported.changes)} change(s) import it",
            location=Location(name, 0, 0),
            hint=f"run `rlc migrate --from {chosen.name} {name} -o NEW.yaml` to write it as spec v1 and see the report",
        )
        changes = [
            Diagnostic(
                c.code or ("RLC-E020" if c.severity == ERROR else "RLC-W020"),
                c.severity,
                f"import: {c.describe()}",
                key=c.old,
                location=Location(name, c.line, 1 if c.line else 0, doc.line_text(c.line)),
            )
            for c in imported.changes
            if c.severity in (ERROR, WARNING)
        ]
        compiled = compile_text(imported.text, name).diagnostics
        as_v1 = [replace(d, message=f"as spec v1: {d.message}", location=Location(name, 0, 0)) for d in compiled]
        return [head, *changes, *as_v1]
    return None


def fit_lens(lines: Sequence[str], result: CompileResult | None) -> lsp.CodeLens | None:
    """The GPU-fit verdict of `rlc plan` above the `cluster:` line: the fullest GPU's estimated peak against its
    capacity, and how many GPUs do not fit."""
    memory = result.memory if result else None
    if memory is None or not memory.gpus:
        return None
    fullest = max(memory.gpus, key=lambda g: g.fill)
    over = sum(1 for g in memory.gpus if not g.fits)
    verdict = f"every GPU of {len(memory.gpus)} fits" if not over else f"{over} of {len(memory.gpus)} GPUs do not fit"
    title = (
        f"GPU memory: peak {fullest.peak / GiB:.1f} / {fullest.capacity / GiB:.1f} GiB ({fullest.fill:.0%}) "
        f"at {fullest.phase}; {verdict} (rlc plan)"
    )
    at = next((n for n, text in enumerate(lines) if text.startswith("cluster:")), 0)
    return lsp.CodeLens(lsp.Range(lsp.Position(at, 0), lsp.Position(at, 0)), lsp.Command(title, ""))

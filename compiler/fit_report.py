"""`rlc fit`'s answer as a user reads it: the changes as overrides and as a diff of the spec, each GPU's peak before
and after, and (with --write) the spec rewritten with comments and layout kept."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from rlc.compiler.fit import FitResult
from rlc.compiler.importers.versions import migrated_text
from rlc.compiler.load import load_document
from rlc.compiler.memory import GiB, MemoryEstimate
from rlc.compiler.migration import write_atomic
from rlc.compiler.plan import node_ranges
from rlc.core.diagnostics import render_json, render_text
from rlc.core.overrides import apply_overrides, parse_override


def render(source: str, result: FitResult, write: bool, fmt: str) -> tuple[str, int]:
    """(what to print, exit code); with `write`, the spec file is rewritten when there is something to write."""
    if result.status == "error":
        if fmt == "json":
            return render_json(result.base.diagnostics, file=source), 1
        return render_text(result.base.diagnostics, False) + f"\n{source}: {result.note}", 1
    new_text = written_text(source, result) if result.changes else None
    diff = unified_diff(source, new_text) if new_text is not None else ""
    wrote = None
    if write and result.changes:
        if new_text is None:
            return f"{source}: a legacy SkyRL file: `rlc migrate --in-place` it first, then `rlc fit --write`", 2

        write_atomic(Path(source), new_text)
        wrote = source
    code = 0 if result.status in ("fits", "proposal") else 1
    before = result.base.memory
    after = result.after.memory if result.after else None
    if fmt == "json":
        data = {
            "status": result.status,
            "note": result.note,
            "changes": [c.to_json() for c in result.changes],
            "overrides": result.overrides,
            "diff": diff,
            "written": wrote,
            "before": before.to_json() if before else None,
            "after": after.to_json() if after else None,
        }
        return json.dumps(data, indent=2, default=str), code
    return "\n".join(_text(source, result, before, after, diff, wrote)), code


def _text(source, result: FitResult, before, after, diff: str, wrote: str | None) -> list[str]:
    lines = []
    worst = max(before.gpus, key=lambda g: g.peak - g.capacity) if before and before.gpus else None
    if result.status == "fits":
        lines.append(f"{source}: fits" + (f" ({result.note})" if result.note else ""))
        if result.changes:
            lines.append("largest micro-batches that still fit:")
    else:
        state = "does not fit"
        if worst is not None:
            state += (
                f": node {worst.node} gpu {worst.gpu} needs {worst.peak / GiB:.1f} GiB in the {worst.phase} phase, "
                f"of a {before.accelerator}'s {worst.capacity / GiB:.1f} GiB"
            )
        lines.append(f"{source}: {state}")
        if result.status == "none":
            lines.append(f"no proposal: {result.note}")
            return lines
        lines.append(f"proposal ({len(result.changes)} change(s); validated and fits by rlc's rules):")
    width = max((len(c.override) for c in result.changes), default=0)
    lines += [f"  {c.override:<{width}}  {c.cost}" for c in result.changes]
    if result.changes:
        lines += ["overrides: " + " ".join(result.overrides)]
    if before is not None and before.gpus and (result.changes or result.status != "fits"):
        lines += ["peak per GPU (before -> after):", *peaks(before, after)]
    elif before is not None and before.gpus:
        lines += ["peak per GPU:", *peaks(before, None, single=True)]
    if diff:
        lines += ["diff:", diff.rstrip("\n")]
    if wrote:
        lines.append(f"wrote {wrote}")
    elif result.changes:
        flag = " --max" if result.status == "fits" else ""
        lines.append(f"(`rlc fit {source}{flag} --write` writes this into the spec)")
    return lines


def peaks(before: MemoryEstimate, after: MemoryEstimate | None, single: bool = False) -> list[str]:
    """Each GPU's peak before and after, GPUs with the same figures on one line (GPUs a bigger cluster adds too)."""
    new = {(g.node, g.gpu): g for g in (after.gpus if after else [])}
    old = {(g.node, g.gpu): g for g in before.gpus}
    groups: dict[tuple, list] = {}
    for at in sorted(set(old) | set(new)):
        b, a = old.get(at), new.get(at)
        key = (b.peak if b else None, b.phase if b else None, a.peak if a else None, a.phase if a else None)
        groups.setdefault(key, []).append(at)
    cap = before.capacity or 0
    lines = []
    for (pb, phb, pa, pha), gpus in groups.items():
        by_node: dict[int, list[int]] = {}
        for n, g in gpus:
            by_node.setdefault(n, []).append(g)
        where = "; ".join(f"node {n} gpu {node_ranges(sorted(v))}" for n, v in by_node.items())
        left = f"{pb / GiB:.1f} GiB at {phb}" if pb is not None else "(not in use)"
        if single:
            lines.append(f"  {where}: {left} of {cap / GiB:.1f} GiB")
            continue
        right = f"{pa / GiB:.1f} GiB at {pha}" if pa is not None else "(not in use)"
        lines.append(f"  {where}: {left} -> {right} of {cap / GiB:.1f} GiB")
    return lines


def written_text(source: str, result: FitResult) -> str | None:
    """The spec file with the command line's overrides and the changes written in, comments and layout kept (None
    for a legacy file, which is migrated first)."""

    doc = load_document(source)
    if not isinstance(doc.data, dict) or "version" not in doc.data:
        return None
    typed = list(result.base.analysis.doc.overrides.values()) if result.base.analysis.doc else []
    apply_overrides(doc, [parse_override(t) for t in typed] + [parse_override(o) for o in result.overrides])
    return migrated_text(doc)


def unified_diff(source: str, new_text: str) -> str:
    old = Path(source).read_text(encoding="utf-8")
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new_text.splitlines(keepends=True), fromfile=source, tofile=f"{source} (fitted)"
    )
    return "".join(lines)

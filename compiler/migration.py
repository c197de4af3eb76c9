"""`rlc migrate`: run the version migrations on a file and write the result without losing anything."""

from __future__ import annotations

import difflib
import io
import os
import re
import sys
import tempfile
from pathlib import Path

import click
from rlc.compiler.load import LoadError, load_document
from rlc.core.diagnostics import render_text


def _indentation(text: str) -> tuple[int, int]:
    """(mapping indent, block-sequence dash offset) as the file writes them."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    keys = [len(ln) - len(ln.lstrip()) for ln in lines if re.match(r"^\s+[^\s-][^:]*:(\s|$)", ln)]
    indent = min(keys) if keys else 2
    offset = 0
    for prev, ln in zip(lines, lines[1:]):
        if ln.lstrip().startswith("- ") and prev.rstrip().endswith(":"):
            offset = max(0, (len(ln) - len(ln.lstrip())) - (len(prev) - len(prev.lstrip())))
            break
    return indent, offset


def _dumper(text: str):
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long lines the user wrote
    indent, offset = _indentation(text)
    y.indent(mapping=indent, sequence=offset + 2, offset=offset)
    y.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    return y


def migrated_text(doc) -> str:
    buf = io.StringIO()
    _dumper(doc.text).dump(doc.data, buf)
    return buf.getvalue()


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent or "."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def run_migrate(old: str, output: str | None, in_place: bool, check: bool, show_diff: bool, force: bool) -> int:
    from rlc.compiler.importers.versions import VersionError, migrate_data

    try:
        doc = load_document(old)
        report = migrate_data(doc.data)
    except LoadError as exc:
        click.echo(render_text([exc.diagnostic], sys.stderr.isatty()), err=True)
        return 1
    except VersionError as exc:
        click.echo(f"rlc migrate: {old}: {exc}", err=True)
        return 1
    if report is None:
        click.echo(f"{old}: already spec v1; nothing to migrate", err=True)
        if not (check or show_diff or output or in_place):
            click.echo(doc.text, nl=False)
        return 0
    if check:
        click.echo(
            f"{old}: needs migrating ({len(report.changes)} change(s)); run `rlc migrate {old} --in-place`", err=True
        )
        return 1
    new_text = migrated_text(doc)
    target: Path | None = None
    if in_place:
        target = Path(old)
    elif output:
        target = Path(output)
        if target.exists() and not force:
            raise click.UsageError(f"{output} exists; pass --force to replace it, or choose another path")
        if target.resolve() == Path(old).resolve():
            raise click.UsageError("-o names the input file; use --in-place to rewrite it")
    if show_diff:
        diff = difflib.unified_diff(
            doc.text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=old,
            tofile=str(target or f"{old} (migrated)"),
        )
        click.echo("".join(diff), nl=False)
    elif target is None:
        click.echo(new_text, nl=False)
    if target is not None:
        _write_atomic(target, new_text)
    _print_report(old, report, target)
    return 1 if report.errors else 0


def _print_report(old: str, report, target: Path | None) -> None:
    click.echo(f"{old}: {' then '.join(report.steps)}; {len(report.changes)} change(s)", err=True)
    for line in report.lines():
        click.echo(f"  {line}", err=True)
    if report.errors:
        click.echo(f"{len(report.errors)} change(s) alter what runs; review them before launching", err=True)
    if target is not None:
        click.echo(f"wrote {target}", err=True)


def areal_text(source: str, result) -> str:
    """Spec v1 YAML of an AReaL import, each key commented with the AReaL keys it came from."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    root = CommentedMap()
    root["version"] = 1
    for section in ("name", "cluster", "launch", "data", "trainer", "generator", "environment"):
        if any(p == section or p.startswith(section + ".") for p in result.spec):
            root[section] = CommentedMap() if section != "name" else None
    for path, value in result.spec.items():
        *head, last = path.split(".")
        node = root
        for part in head:
            if not isinstance(node.get(part), CommentedMap):
                node[part] = CommentedMap()
            node = node[part]
        node[last] = value
        sources = [s for s in result.sources.get(path, []) if s]
        if sources:
            node.yaml_add_eol_comment(
                f"AReaL: {', '.join(sources)}", last, column=_comment_column(len(head), last, value)
            )
    root.yaml_set_start_comment(
        f"Imported from the AReaL config {source} by `rlc migrate --from areal`.\n"
        "Comments name the AReaL keys each value came from; the report lists what was dropped."
    )
    y = YAML(typ="rt")
    y.width = 4096
    y.indent(mapping=2, sequence=4, offset=2)
    buf = io.StringIO()
    y.dump(root, buf)
    return buf.getvalue()


def _comment_column(depth: int, key: str, value) -> int:
    """Two spaces after `key: value` (ruamel would otherwise align a comment with the one before it)."""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (str, int, float)):
        shown = str(value)
    else:
        shown = ""  # a block list or mapping: the comment goes after `key:`
    return 2 * depth + len(key) + 2 + len(shown) + (2 if shown else 1)


def run_areal_import(old: str, output: str | None, force: bool) -> int:
    from rlc.compiler.importers.areal import ImportRefused, import_areal
    from rlc.core.plain import plain_yaml

    try:
        doc = load_document(old)
    except LoadError as exc:
        click.echo(render_text([exc.diagnostic], sys.stderr.isatty()), err=True)
        return 1
    target = Path(output) if output else None
    if target is not None:
        if target.exists() and not force:
            raise click.UsageError(f"{output} exists; pass --force to replace it, or choose another path")
        if target.resolve() == Path(old).resolve():
            raise click.UsageError("-o names the input file; the AReaL config is kept, choose another path")
    data = plain_yaml(doc.data)
    if not isinstance(data, dict):
        click.echo(f"rlc migrate: {old}: not an AReaL experiment config (the top level is not a mapping)", err=True)
        return 1
    try:
        result = import_areal(data, lambda path: doc.locate(tuple(path.split("."))).line)
    except ImportRefused as exc:
        click.echo(
            f"rlc migrate: {old}: {exc}; rlc compiles RL post-training jobs (GRPO, PPO, DAPO, Dr.GRPO, GSPO, "
            "REINFORCE, RLOO) only, so nothing was written",
            err=True,
        )
        return 1
    text = areal_text(old, result)
    if target is None:
        click.echo(text, nl=False)
    else:
        _write_atomic(target, text)
    click.echo(f"{old}: AReaL config -> spec v1; {len(result.changes)} change(s)", err=True)
    for change in result.changes:
        mark = "  !! " if change.severity == "error" else "  "
        click.echo(f"{mark}{change.describe()}", err=True)
    if result.errors:
        click.echo(
            f"{len(result.errors)} change(s) alter what runs (marked !!); review them before launching", err=True
        )
    if target is not None:
        click.echo(f"wrote {target}", err=True)
    return 1 if result.errors else 0

"""`rlc migrate`: a foreign config (a legacy SkyRL file, or an AReaL config with --from areal) written as spec v1,
and the report of every change. Library code: it returns what to show and the exit code; the CLI prints it.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from dataclasses import field
from pathlib import Path

from rlc.compiler.importers.base import Change, Imported, Importer, NotImportable
from rlc.compiler.load import LoadError, load_document
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import Diagnostic

OUT, ERR = "stdout", "stderr"


class MigrateUsageError(Exception):
    """Options that cannot work together for this file (a usage error, exit 2)."""


@dataclass
class Outcome:
    code: int
    shown: list[tuple[str, str]] = field(default_factory=list)  # (OUT | ERR, text with its line ends), in order
    diagnostics: list[Diagnostic] = field(default_factory=list)  # why the file could not be loaded

    def say(self, text: str, stream: str = ERR) -> None:
        self.shown.append((stream, text if stream == OUT else text + "\n"))


def write_atomic(path: Path, text: str) -> None:
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


def migrate_file(
    old: str,
    importer: Importer,
    output: str | None,
    in_place: bool,
    check: bool,
    show_diff: bool,
    force: bool,
    trainer: str | None = None,
) -> Outcome:
    """Convert the file OLD with `importer`: to stdout, to -o OUTPUT or in place, or only check or diff it; with
    `trainer`, the spec runs on that trainer (launch.trainer)."""
    reads_path = getattr(importer, "convert_path", None)  # an importer of directories and non-YAML files
    if os.path.isdir(old) and reads_path is None:
        raise MigrateUsageError(f"{old} is a directory; --from {importer.name} reads a file")
    doc = None
    out = Outcome(0)
    try:
        if reads_path is not None:
            imported = reads_path(old)
        else:
            doc = load_document(old)
            imported = importer.convert(doc)
    except LoadError as exc:
        return Outcome(1, diagnostics=[exc.diagnostic])
    except NotImportable as exc:
        out.say(f"rlc migrate: {old}: {exc}")
        out.code = 1
        return out
    if imported is None:
        out.say(f"{old}: already spec v1; nothing to migrate")
        if doc is not None and not (check or show_diff or output or in_place):
            out.say(doc.text, OUT)
        return out
    text = doc.text if doc is not None else ""
    if trainer is not None:
        imported = with_trainer(imported, trainer)
    return _deliver(
        out, old, text, imported, (importer.what, importer.rewrites), output, in_place, check, show_diff, force
    )


def migrate_script(
    old: str,
    env: dict[str, str],
    argv: list[str],
    output: str | None,
    force: bool,
    trainer: str | None = None,
    cwd: str | None = None,
) -> Outcome:
    """Import the launch script OLD (read, never run; `"$@"` is ARGV, the environment ENV, `$(pwd)` CWD) as a new
    spec."""
    # deferred: tree-sitter's bash grammar, only for a launch script
    from rlc.compiler.importers.scripts import import_script

    out = Outcome(0)
    try:
        imported, errors, warnings = import_script(old, env, argv, cwd)
    except NotImportable as exc:
        out.say(f"rlc migrate: {old}: {exc}")
        out.code = 1
        return out
    out.diagnostics = [*warnings, *errors]
    if imported is None:
        out.say(
            f"rlc migrate: {old}: the script cannot be imported ({len(errors)} error(s) above); nothing was written"
        )
        out.code = 1
        return out
    if trainer is not None:
        imported = with_trainer(imported, trainer)
    return _deliver(out, old, "", imported, ("launch script", False), output, False, False, False, force)


def with_trainer(imported: Imported, trainer: str) -> Imported:
    """The imported spec run on `trainer` (`rlc migrate --trainer`): launch.trainer set first in launch, every
    comment kept, and the change reported."""
    # deferred: ruamel's round trip, only for --trainer
    import io

    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    yaml = YAML(typ="rt")
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    root = yaml.load(imported.text)
    launch = root.get("launch")
    if not isinstance(launch, CommentedMap):
        launch = CommentedMap()
        keys = list(root)
        root.insert(keys.index("data") if "data" in keys else len(keys), "launch", launch)
    if "trainer" in launch:
        launch["trainer"] = trainer
    else:
        launch.insert(0, "trainer", trainer)
    buf = io.StringIO()
    yaml.dump(root, buf)
    change = Change("added", None, "launch.trainer", new_value=trainer, reason="rlc migrate --trainer")
    return Imported(
        buf.getvalue(),
        imported.title,
        [*imported.changes, change],
        [*imported.lines, change.describe()],
        imported.alters,
    )


def _deliver(
    out: Outcome,
    old: str,
    old_text: str,
    imported: Imported,
    kind: tuple[str, bool],  # what OLD is, as a message names it; whether it is rewritten as it stands
    output: str | None,
    in_place: bool,
    check: bool,
    show_diff: bool,
    force: bool,
) -> Outcome:
    """Show, diff or write an imported spec, then the report of its changes."""
    if check:
        out.say(f"{old}: needs migrating ({len(imported.changes)} change(s)); run `rlc migrate {old} --in-place`")
        out.code = 1
        return out
    target: Path | None = None
    if in_place:
        target = Path(old)
    elif output:
        target = Path(output)
        if target.exists() and not force:
            raise MigrateUsageError(f"{output} exists; pass --force to replace it, or choose another path")
        if target.resolve() == Path(old).resolve():
            keep = "use --in-place to rewrite it" if kind[1] else f"the {kind[0]} is kept, choose another path"
            raise MigrateUsageError(f"-o names the input file; {keep}")
    if show_diff:
        diff = difflib.unified_diff(
            old_text.splitlines(keepends=True),
            imported.text.splitlines(keepends=True),
            fromfile=old,
            tofile=str(target or f"{old} (migrated)"),
        )
        out.say("".join(diff), OUT)
    elif target is None:
        out.say(imported.text, OUT)
    if target is not None:
        try:
            write_atomic(target, imported.text)
        except OSError as exc:  # a missing directory, no permission: the user's path, not a bug
            raise MigrateUsageError(f"cannot write {target}: {exc.strerror or exc}") from None
    out.say(f"{old}: {imported.title}; {len(imported.changes)} change(s)")
    for line in imported.lines:
        out.say(line)
    if imported.errors:
        out.say(imported.alters)
    if target is not None:
        out.say(f"wrote {target}")
    out.code = 1 if imported.errors else 0
    return out

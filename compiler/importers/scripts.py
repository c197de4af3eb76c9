"""Launch scripts as spec v1: the script is read statically (rlc.compiler.importers.shell), and the Python program
it launches picks the importer of its framework's command line (SCRIPT_IMPORTERS).

A script importer has a `name`, a `what` (as messages name it), `accepts(launch)` (does this importer read the
command line of that program?) and `convert_launch(script, launch)` (the spec, or NotImportable saying why not) and `names_run(word)` (does
that `key=value` only name the run, its logs or checkpoints, so a `$(date ...)` in it is read as the import's date?);
it may have `refuse_unlaunched(script)`: why a script that stops before any launch (a usage check on missing
ARGS) is no job rlc imports, or None; and `working_directory(script, launch)`: (the folder, why) the script is
documented to run from, when its launch needs `$(pwd)` to be read, or None.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from rlc.compiler.importers.base import Imported, NotImportable
from rlc.compiler.importers.shell import WORKDIR, Launch, Script, Word, read_script
from rlc.compiler.importers.skyrl.script import SkyRLScript
from rlc.compiler.importers.verl.script import VerlScript
from rlc.core.diagnostics import WARNING, Diagnostic, Location

SCRIPT_SUFFIXES = (".sh", ".bash")


class ScriptImporter(Protocol):
    name: str
    what: str

    def accepts(self, launch: Launch) -> bool: ...

    def convert_launch(self, script: Script, launch: Launch) -> Imported: ...

    def names_run(self, word: Word) -> bool: ...


SCRIPT_IMPORTERS: tuple[ScriptImporter, ...] = (SkyRLScript(), VerlScript())

# What each importer reads, as a refusal names it.
READS = {
    "skyrl": "skyrl.train.entrypoints.main_base or its DAPO entrypoints (SkyRL)",
    "verl": "verl.trainer.main_ppo (verl)",
}


def is_script(path: str) -> bool:
    """A launch script, by its name or its first line (`#!/bin/bash`, `#!/usr/bin/env bash`, `#!/bin/sh`)."""
    if path.endswith(SCRIPT_SUFFIXES):
        return True
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and any(s in first for s in (b"bash", b"/sh", b" sh"))


def import_script(
    path: str, env: dict[str, str], argv: list[str], cwd: str | None = None
) -> tuple[Imported | None, list[Diagnostic], list[Diagnostic]]:
    """(the spec or None, errors, warnings) of a launch script; raises NotImportable when it launches no program an
    importer reads. Errors (a value only running the script would give) mean nothing is written. `cwd` is the
    folder the script runs in (`$(pwd)`, $PWD); without it (or --env PWD), an importer may find the one its
    framework documents (verl: its repository root), said in a warning."""
    if cwd is not None:
        env = {**env, "PWD": os.path.abspath(cwd)}
    script, launch, diags = _read(path, env, argv)
    if launch is not None and "PWD" not in env:
        found = getattr(_importer(launch), "working_directory", lambda s, x: None)(script, launch)
        if found is not None:
            folder, why = found
            script, launch, diags = _read(path, {**env, "PWD": folder}, argv)
            where = Location(path, launch.line if launch else 0, 0)
            note = f"`$(pwd)` and $PWD are read as {folder}, {why}"
            diags = [Diagnostic(WORKDIR, WARNING, note, location=where, hint="pass --cwd DIR to choose it"), *diags]
    errors = [d for d in diags if d.is_error]
    warnings = [d for d in diags if not d.is_error]
    if launch is None:
        for i in SCRIPT_IMPORTERS:  # a script that stops before its launch may still say what it runs
            why = getattr(i, "refuse_unlaunched", lambda s: None)(script)
            if why:
                raise NotImportable(why)
        found = sorted({x.program for x in script.launches})
        if found and not any(d.code == "RLC-E060" for d in errors):
            reads = " or ".join(READS[i.name] for i in SCRIPT_IMPORTERS if i.name in READS)
            raise NotImportable(
                f"it launches {', '.join(found)}; rlc imports launch scripts of {reads}, so nothing was written"
            )
        return None, errors, warnings
    imported = _importer(launch).convert_launch(script, launch)  # its refusal says more than an unknown value does
    return (None if errors else imported), errors, warnings


def _importer(launch: Launch) -> ScriptImporter:
    return next(i for i in SCRIPT_IMPORTERS if i.accepts(launch))


def _read(path: str, env: dict[str, str], argv: list[str]) -> tuple[Script, Launch | None, list[Diagnostic]]:
    script = read_script(Path(path), path, env=env, argv=argv)
    launch, diags = script.command(
        lambda x: any(i.accepts(x) for i in SCRIPT_IMPORTERS), lambda x, word: _importer(x).names_run(word)
    )
    return script, launch, diags

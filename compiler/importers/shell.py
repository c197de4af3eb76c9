"""A bash launch script read statically: the training command it runs, found without running anything.

The script is parsed with the bash grammar (tree-sitter-bash) and interpreted over what can be known without
executing a program: assignments and `export`, `${V:-d}`/`${V:=d}`/`${V:?m}` and the other parameter expansions,
arrays, `$((...))`, `if`/`case`/`&&`/`||` on known values, `for` over known words, functions, `"$@"` (filled from
the command line), and `bash other.sh ...` wrappers. No `$(...)` is run: a value that depends on one, on a branch
whose condition is not known, or on a variable the script requires, is an Unknown piece of the word, reported with
its line (`--env NAME=VALUE` fixes it). A branch whose condition is unknown is read both ways; what differs between
the two becomes unknown. Launchers (`uv run`, `python3 -m`, `torchrun`, `ray job submit --`, `env`, `nohup`) are
stripped, so a Launch names the Python module or script and its arguments, each with its file, line and column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import field
from pathlib import Path

from rlc.compiler.importers.shell_expand import Exit
from rlc.compiler.importers.shell_read import Reader
from rlc.compiler.importers.shell_words import (
    BRANCH,
    DATED,
    FROM_ENV,
    NEEDS_ENV,
    NO_LAUNCH,
    NOT_BASH,
    NOT_STATIC,
    WORKDIR,
    Launch,
    Piece,
    Unknown,
    Word,
    find_program,
    launch_diagnostics,
    script_text,
)
from rlc.compiler.load import LoadError
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import COMMAND_LINE, ERROR, Diagnostic, Location

__all__ = [
    "BRANCH",
    "DATED",
    "FROM_ENV",
    "NEEDS_ENV",
    "NOT_BASH",
    "NOT_STATIC",
    "NO_LAUNCH",
    "WORKDIR",
    "Launch",
    "Piece",
    "Script",
    "Unknown",
    "Word",
    "find_program",
    "read_script",
]


@dataclass
class Script:
    """What a static reading of a script found: every Python launch in order, and the problems met."""

    name: str
    launches: list[Launch]
    diagnostics: list[Diagnostic]
    exit_line: int = 0  # the line of an `exit` that ended the reading (0: read to the end)
    lines: list[str] = field(default_factory=list)
    unknown_programs: list[Diagnostic] = field(default_factory=list)  # commands whose program is unknown

    def command(
        self,
        accept: Callable[[Launch], bool] | None = None,
        naming: Callable[[Launch, Word], bool] = lambda launch, word: False,
    ) -> tuple[Launch | None, list[Diagnostic]]:
        """The training command (the last launch `accept` takes; by default the last Python launch) and every
        problem that bears on it: the script's own, then each unknown part of its words (a date in a word that
        `naming` says only names the run is a warning)."""
        chosen = [x for x in self.launches if accept is None or accept(x)]
        if not chosen:
            where = f"; the script exits at line {self.exit_line} first" if self.exit_line else ""
            found = ", ".join(sorted({x.program for x in self.launches})) or "none"
            diag = Diagnostic(
                NO_LAUNCH,
                ERROR,
                f"no training command found in {self.name}{where} (Python launches found: {found})",
                location=Location(self.name, self.exit_line, 1 if self.exit_line else 0, self._line(self.exit_line)),
                hint="point rlc at the script that runs the trainer",
            )
            return None, [*self.diagnostics, *self.unknown_programs, diag]
        launch = chosen[-1]
        return launch, [*self.diagnostics, *launch_diagnostics(launch, self._line, lambda w: naming(launch, w))]

    def _line(self, line: int) -> str | None:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else None


def read_script(
    source: str | bytes | Path,
    name: str | None = None,
    env: dict[str, str] | None = None,
    argv: Iterable[str] = (),
) -> Script:
    """Read a launch script statically. `env` is the environment it starts with (--env; it also stands for a value
    the script would compute with `$(...)`), `argv` fills `"$@"`. Never raises on bad input: it is a diagnostic."""
    label = name or (str(source) if isinstance(source, Path) else "<script>")
    try:
        text = script_text(source, label)
    except LoadError as exc:
        return Script(label, [], [exc.diagnostic])
    args = [Word((a,), COMMAND_LINE, 0, 0) for a in argv]
    reader = Reader(dict(env or {}), label)
    script_path = source if isinstance(source, Path) else Path(label)
    try:
        reader.run_file(text, label, script_path, args, depth=0)
    except Exit:
        pass
    except RecursionError:
        reader.diag(NOT_BASH, "the script nests too deeply to read", label, 0)
    return Script(
        label, reader.launches, reader.diagnostics, reader.exit_line, text.splitlines(), reader.unknown_programs
    )

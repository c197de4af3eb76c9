"""The words a launch script's static reading produces (rlc.compiler.importers.shell): literal text with unknown
parts, each word with its file, line and column; the Python launches found and the findings about their words;
and how a command line's launcher (`uv run`, `python3 -m`, `torchrun`, `ray job submit --`, `srun`, `env`, `nohup`) is
told from the program it starts."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlc.compiler.load import LoadError, decode
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import COMMAND_LINE, ERROR, WARNING, Diagnostic, Location

MAX_BYTES = 1 << 20  # launch scripts are a few KiB
MAX_STEPS = 200_000  # statements, expansions and loop turns read before giving up (a loop that never ends)
MAX_DEPTH = 16  # nested scripts and function calls

NOT_BASH = "RLC-E060"  # unreadable input: too large, binary, not UTF-8, a syntax the reader cannot follow
NEEDS_ENV = "RLC-E061"  # a value computed by `$(...)`, or a variable `${V:?}` requires: only --env can give it
BRANCH = "RLC-E062"  # a value (or the launch itself) depends on a condition that is not known
NOT_STATIC = "RLC-E063"  # an expansion or statement the reader does not evaluate statically
NO_LAUNCH = "RLC-E064"  # no training command found, or the script exits before it
FROM_ENV = "RLC-W060"  # a variable the script reads but never sets: its value is the environment's
WORKDIR = "RLC-W062"  # `$(pwd)`/$PWD read as the folder the script is documented to run from (rlc migrate --cwd)
DATED = "RLC-W061"  # `$(date +FORMAT)` in a value that only names the run (its name, its logs' and checkpoints' paths)


@dataclass(frozen=True)
class Unknown:
    """A part of a word no static reading can know, and why."""

    kind: str  # env | command | clock (`$(date +FORMAT)`) | required | branch | unsupported
    source: str  # as the script writes it: "$HOME", "$(date +%s)", "${A/x/y}"
    name: str = ""  # the variable --env would fix ("" when none would)
    line: int = 0  # where it arises
    file: str = ""
    why: str = ""  # for required: the script's message; for branch: the condition's variables; for clock: the
    # import's time in the script's format


Piece = str | Unknown


@dataclass(frozen=True)
class Word:
    """One argument of a command after expansion: literal text and unknown parts, and where it was written."""

    pieces: tuple[Piece, ...]
    file: str
    line: int  # 1-based; 0 for a word given on the command line
    column: int

    @property
    def text(self) -> str:
        """The word, its unknown parts spelled as the script writes them."""
        return "".join(p if isinstance(p, str) else p.source for p in self.pieces)

    @property
    def known(self) -> bool:
        return all(isinstance(p, str) for p in self.pieces)

    @property
    def unknowns(self) -> list[Unknown]:
        return [p for p in self.pieces if isinstance(p, Unknown)]

    def render(self, unknown: Callable[[Unknown], str]) -> str:
        """The word with each unknown part written as `unknown` spells it (e.g. `${oc.env:HOME}`)."""
        return "".join(p if isinstance(p, str) else unknown(p) for p in self.pieces)


@dataclass
class Launch:
    """A Python program the script starts: a module (`-m M`) or a script file, with its arguments."""

    program: str  # "verl.trainer.main_ppo", "examples/train.py"
    module: bool
    args: list[Word]
    file: str
    line: int
    column: int
    launcher: list[str]  # the words stripped before the program: ["uv", "run", "--isolated", "-m"]
    env: dict[str, str]  # variables it starts with: exported ones and `K=V cmd` prefixes (known values only)
    condition: Unknown | None = None  # set when it runs only on a branch whose condition is not known


def launch_diagnostics(
    launch: Launch, line_text: Callable[[int], str | None], naming: Callable[[Word], bool] = lambda w: False
) -> list[Diagnostic]:
    """One diagnostic for each distinct unknown in the launch's words, at the first word that holds it. A date
    (`$(date +%Y%m%d)`) in a word that only names the run (`naming`) is the import's date, with a warning; in any
    other word it is an error, as every value a command computes is."""
    out: list[Diagnostic] = []
    seen: set[tuple[str, str, int]] = set()
    # a date that reaches any word other than a name is an error wherever it is met
    runs = {_ident(u) for w in launch.args if not naming(w) for u in w.unknowns if u.kind == "clock"}
    if launch.condition is not None:
        c = launch.condition
        out.append(
            Diagnostic(
                BRANCH,
                ERROR,
                f"the launch runs only on one branch of line {c.line}, whose condition depends on {c.why}",
                location=Location(launch.file, launch.line, launch.column, line_text(launch.line)),
                hint=_env_hint(c.why),
            )
        )
    for word in launch.args:
        for u in word.unknowns:
            if u.kind == "required":
                continue  # the script's own diagnostic (bash stops there)
            ident = _ident(u)
            if ident in seen:
                continue
            seen.add(ident)
            where = (
                Location(COMMAND_LINE, 0, 0, word.text)
                if word.file == COMMAND_LINE
                else Location(
                    word.file, word.line, word.column, line_text(word.line) if word.file == launch.file else None
                )
            )
            if u.kind == "clock" and ident not in runs:
                out.append(_dated(u, word, where))
            else:
                out.append(unknown_diagnostic(u, where))
    return out


def _ident(u: Unknown) -> tuple[str, str, int]:
    return (u.kind, u.name or u.source, u.line)


def _dated(u: Unknown, word: Word, where: Location) -> Diagnostic:
    what = f"{u.name}, set from `{u.source}` (line {u.line})," if u.name else f"`{u.source}`"
    key = word.text.split("=", 1)[0].lstrip("+~")
    return Diagnostic(
        DATED,
        WARNING,
        f"{what} is read as the date of the import, {u.why}: {key} names the run or its files, and changes "
        "nothing of what runs",
        location=where,
        hint=f"pass --env {u.name}=VALUE to choose it" if u.name else "write the name into the script to choose it",
    )


def _env_hint(names: str) -> str:
    first = names.split(", ")[0] if names else "NAME"
    return f"pass --env {first}=VALUE with the value it has where the job is launched"


def unknown_diagnostic(u: Unknown, where: Location) -> Diagnostic:
    at = f" (line {u.line})" if u.line else ""
    if u.kind == "env":
        return Diagnostic(
            FROM_ENV,
            WARNING,
            f"{u.name} is never set by the script; its value is the environment's",
            location=where,
            hint=f"pass --env {u.name}=VALUE to fix it",
        )
    if u.kind in ("command", "clock"):
        what = f"{u.name}, set from `{u.source}`{at}," if u.name else f"`{u.source}`{at}"
        return Diagnostic(
            NEEDS_ENV,
            ERROR,
            f"{what} is the output of a command; rlc reads the script without running anything",
            location=where,
            hint=f"pass --env {u.name}=VALUE" if u.name else "write the value into the script",
        )
    if u.kind == "required":
        msg = f" ({u.why})" if u.why else ""
        return Diagnostic(
            NEEDS_ENV,
            ERROR,
            f"the script requires {u.name}{msg}{at}, and nothing sets it",
            location=where,
            hint=f"pass --env {u.name}=VALUE",
        )
    if u.kind == "branch":
        return Diagnostic(
            BRANCH,
            ERROR,
            f"{u.name} is set differently by the branches of line {u.line}, whose condition depends on {u.why}",
            location=where,
            hint=_env_hint(u.why),
        )
    return Diagnostic(
        NOT_STATIC,
        ERROR,
        f"`{u.source}`{at} is not read statically ({u.why or 'rlc does not evaluate it'})",
        location=where,
        hint="write the value into the script, or pass it with --env",
    )


def script_text(source: str | bytes | Path, label: str) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, Path):
        try:
            if not source.is_file():
                raise LoadError(read_error(f"{label} is not a regular file", label))
            if source.stat().st_size > MAX_BYTES:
                raise LoadError(
                    read_error(
                        f"{label} is {source.stat().st_size} bytes; a launch script is limited to {MAX_BYTES}", label
                    )
                )
            raw = source.read_bytes()
        except OSError as exc:
            raise LoadError(read_error(f"cannot read {label}: {exc.strerror or exc}", label)) from None
    else:
        raw = source
    if len(raw) > MAX_BYTES:
        raise LoadError(read_error(f"{label} is {len(raw)} bytes; a launch script is limited to {MAX_BYTES}", label))
    try:
        return decode(raw, label)
    except LoadError as exc:
        raise LoadError(replace(exc.diagnostic, code=NOT_BASH)) from None


def read_error(message: str, file: str, line: int = 0, text: str | None = None) -> Diagnostic:
    return Diagnostic(NOT_BASH, ERROR, message, location=Location(file, line, 1 if line else 0, text))


_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)*)?$")
_UV_VALUE_OPTIONS = {
    "--extra", "--with", "--with-editable", "--with-requirements", "--env-file", "--project", "--directory",
    "--python", "-p", "--group", "--package", "--index", "--index-url", "--extra-index-url", "--no-extra",
    "--only-group", "--no-group", "--refresh-package", "--config-file", "--cache-dir", "--find-links", "-f",
    "--python-preference", "--upgrade-package", "--reinstall-package", "--no-binary-package", "--index-strategy",
}  # fmt: skip
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
_PY_VALUE_OPTIONS = {"-X", "-W", "-Q"}
_WRAPPERS = {"nohup", "exec", "time", "command", "builtin"}
# Slurm's srun options written `-w NODE` / `--nodes N` (a value in the next word); `--opt=value` is one word.
_SRUN_VALUE_OPTIONS = {
    "-N", "-n", "-w", "-c", "-p", "-t", "-J", "-o", "-e", "-G", "-A", "-q", "-C", "-x", "-D", "-m", "-d", "-i",
    "--nodes", "--ntasks", "--nodelist", "--cpus-per-task", "--partition", "--time", "--job-name", "--output",
    "--error", "--gpus", "--gres", "--account", "--qos", "--constraint", "--exclude", "--chdir", "--distribution",
    "--dependency", "--input", "--ntasks-per-node", "--gpus-per-node", "--gpus-per-task", "--mem", "--mem-per-cpu",
    "--mem-per-gpu", "--container-image", "--container-mounts", "--export", "--mpi", "--cpu-bind", "--het-group",
}  # fmt: skip


def find_program(words: list[Word]) -> tuple[str, bool, int, list[str]] | None:
    """(program, is a module, index of its first argument, launcher words) when the words start a Python program
    (through `uv run`, `python -m`, `torchrun`, `ray job submit --`, `srun`, `env`, `nohup`), else None."""
    texts = [w.text for w in words]
    i = 0
    python_seen = False
    while i < len(texts):
        head = texts[i]
        base = head.rsplit("/", 1)[-1]
        if base in _WRAPPERS:
            i += 1
        elif base == "srun":
            i += 1
            while i < len(texts) and texts[i].startswith("-"):
                i += 2 if texts[i] in _SRUN_VALUE_OPTIONS else 1
        elif base == "env":
            i += 1
            while i < len(texts) and (re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", texts[i]) or texts[i].startswith("-")):
                i += 2 if texts[i] in ("-u", "-C", "-S") else 1
        elif base == "uv" and i + 1 < len(texts) and texts[i + 1] == "run":
            i += 2
            while i < len(texts) and texts[i].startswith("-") and texts[i] not in ("-m", "--module", "--"):
                opt = texts[i]
                i += 2 if opt in _UV_VALUE_OPTIONS else 1
            if i < len(texts) and texts[i] == "--":
                i += 1
            if i < len(texts) and texts[i] in ("-m", "--module"):
                return _module(texts, i + 1)
            python_seen = True  # `uv run script.py` runs python
        elif base == "ray" and texts[i + 1 : i + 3] == ["job", "submit"]:
            if "--" not in texts[i:]:
                return None
            i = texts.index("--", i) + 1
        elif base == "torchrun" or (python_seen and head in ("torch.distributed.run", "torch.distributed.launch")):
            i += 1
            while i < len(texts) and texts[i].startswith("-") and texts[i] not in ("-m", "--module"):
                opt = texts[i]
                i += 1 if ("=" in opt or opt in _TORCHRUN_FLAGS) else 2
            if i < len(texts) and texts[i] in ("-m", "--module"):
                return _module(texts, i + 1)
            python_seen = True
        elif _PYTHON.match(base):
            i += 1
            while i < len(texts) and texts[i].startswith("-") and texts[i] != "-m":
                if texts[i] == "-c":
                    return None  # an inline program: not a launch
                i += 2 if texts[i] in _PY_VALUE_OPTIONS else 1
            if i < len(texts) and texts[i] == "-m":
                if texts[i + 1 : i + 2] in (["torch.distributed.run"], ["torch.distributed.launch"]):
                    python_seen, i = True, i + 1
                    continue
                return _module(texts, i + 1)
            python_seen = True
        elif python_seen or head.endswith(".py"):
            if not head.endswith(".py") and not python_seen:
                return None
            return head, False, i + 1, texts[:i]
        else:
            return None
    return None


def _module(texts: list[str], at: int) -> tuple[str, bool, int, list[str]] | None:
    if at >= len(texts):
        return None
    return texts[at], True, at + 1, texts[:at]

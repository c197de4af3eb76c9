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

import codecs
import fnmatch
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from rlc.compiler.load import LoadError, decode
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


@dataclass(frozen=True)
class Unknown:
    """A part of a word no static reading can know, and why."""

    kind: str  # env | command | required | branch | unsupported
    source: str  # as the script writes it: "$HOME", "$(date +%s)", "${A/x/y}"
    name: str = ""  # the variable --env would fix ("" when none would)
    line: int = 0  # where it arises
    file: str = ""
    why: str = ""  # for required: the script's message; for branch: the condition's variables


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


@dataclass
class Script:
    """What a static reading of a script found: every Python launch in order, and the problems met."""

    name: str
    launches: list[Launch]
    diagnostics: list[Diagnostic]
    exit_line: int = 0  # the line of an `exit` that ended the reading (0: read to the end)
    lines: list[str] = field(default_factory=list)
    unknown_programs: list[Diagnostic] = field(default_factory=list)  # commands whose program is unknown

    def command(self, accept: Callable[[Launch], bool] | None = None) -> tuple[Launch | None, list[Diagnostic]]:
        """The training command (the last launch `accept` takes; by default the last Python launch) and every
        problem that bears on it: the script's own, then each unknown part of its words."""
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
        return launch, [*self.diagnostics, *launch_diagnostics(launch, self._line)]

    def _line(self, line: int) -> str | None:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else None


def launch_diagnostics(launch: Launch, line_text: Callable[[int], str | None]) -> list[Diagnostic]:
    """One diagnostic for each distinct unknown in the launch's words, at the first word that holds it."""
    out: list[Diagnostic] = []
    seen: set[tuple[str, str, int]] = set()
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
            ident = (u.kind, u.name or u.source, u.line)
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
            out.append(_unknown_diagnostic(u, where))
    return out


def _env_hint(names: str) -> str:
    first = names.split(", ")[0] if names else "NAME"
    return f"pass --env {first}=VALUE with the value it has where the job is launched"


def _unknown_diagnostic(u: Unknown, where: Location) -> Diagnostic:
    at = f" (line {u.line})" if u.line else ""
    if u.kind == "env":
        return Diagnostic(
            FROM_ENV,
            WARNING,
            f"{u.name} is never set by the script; its value is the environment's",
            location=where,
            hint=f"pass --env {u.name}=VALUE to fix it",
        )
    if u.kind == "command":
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
        text = _text(source, label)
    except LoadError as exc:
        return Script(label, [], [exc.diagnostic])
    args = [Word((a,), COMMAND_LINE, 0, 0) for a in argv]
    reader = _Reader(dict(env or {}), label)
    script_path = source if isinstance(source, Path) else Path(label)
    try:
        reader.run_file(text, label, script_path, args, depth=0)
    except _Exit:
        pass
    except RecursionError:
        reader.diag(NOT_BASH, "the script nests too deeply to read", label, 0)
    return Script(
        label, reader.launches, reader.diagnostics, reader.exit_line, text.splitlines(), reader.unknown_programs
    )


def _text(source: str | bytes | Path, label: str) -> str:
    if isinstance(source, str):
        return source
    if isinstance(source, Path):
        try:
            if not source.is_file():
                raise LoadError(_err(f"{label} is not a regular file", label))
            if source.stat().st_size > MAX_BYTES:
                raise LoadError(
                    _err(f"{label} is {source.stat().st_size} bytes; a launch script is limited to {MAX_BYTES}", label)
                )
            raw = source.read_bytes()
        except OSError as exc:
            raise LoadError(_err(f"cannot read {label}: {exc.strerror or exc}", label)) from None
    else:
        raw = source
    if len(raw) > MAX_BYTES:
        raise LoadError(_err(f"{label} is {len(raw)} bytes; a launch script is limited to {MAX_BYTES}", label))
    try:
        return decode(raw, label)
    except LoadError as exc:
        raise LoadError(replace(exc.diagnostic, code=NOT_BASH)) from None


def _err(message: str, file: str, line: int = 0, text: str | None = None) -> Diagnostic:
    return Diagnostic(NOT_BASH, ERROR, message, location=Location(file, line, 1 if line else 0, text))


# ---------------------------------------------------------------------------------------------------------------
# The interpreter


@dataclass
class _Var:
    value: tuple[Piece, ...] | list[Word]  # a scalar's pieces, or an array's words
    exported: bool = False


class _Exit(Exception):
    pass


class _TooLong(Exception):
    pass


@dataclass
class _Field:
    """A word being built by expansion: its pieces, and the origin of an array element expanded whole."""

    pieces: list[Piece]
    origin: tuple[str, int, int] | None = None


@dataclass
class _Frame:
    """What a statement runs in: the file and its lines, the positional parameters, the script's path."""

    file: str
    path: Path
    data: bytes
    lines: list[bytes]
    argv: list[Word]
    depth: int
    condition: Unknown | None = None  # the unknown condition the statements run under, if any


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


def find_program(words: list[Word]) -> tuple[str, bool, int, list[str]] | None:
    """(program, is a module, index of its first argument, launcher words) when the words start a Python program
    (through `uv run`, `python -m`, `torchrun`, `ray job submit --`, `env`, `nohup`), else None."""
    texts = [w.text for w in words]
    i = 0
    python_seen = False
    while i < len(texts):
        head = texts[i]
        base = head.rsplit("/", 1)[-1]
        if base in _WRAPPERS:
            i += 1
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


class _Reader:
    def __init__(self, env: dict[str, str], name: str):
        self.given = env
        self.vars: dict[str, _Var] = {k: _Var((v,), exported=True) for k, v in env.items()}
        self.functions: dict[str, Any] = {}
        self.launches: list[Launch] = []
        self.unknown_programs: list[Diagnostic] = []  # commands whose program itself is unknown
        self.diagnostics: list[Diagnostic] = []
        self.exit_line = 0
        self.steps = 0
        self.name = name
        self.frame: _Frame
        self.recovered: list[tuple[int, int]] = []  # byte ranges of the current file read again after a misparse

    # -- bookkeeping -------------------------------------------------------------------------------------------

    def diag(self, code: str, message: str, file: str, line: int, severity: str = ERROR, hint: str | None = None):
        text = None
        if line and file == self.frame.file and line <= len(self.frame.lines):
            text = self.frame.lines[line - 1].decode("utf-8", "replace")
        d = Diagnostic(code, severity, message, location=Location(file, line, 1 if line else 0, text), hint=hint)
        if all((x.code, x.message, x.location) != (d.code, d.message, d.location) for x in self.diagnostics):
            self.diagnostics.append(d)

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _TooLong

    def pos(self, node) -> tuple[str, int, int]:
        row, col = node.start_point
        line = self.frame.lines[row] if row < len(self.frame.lines) else b""
        return self.frame.file, row + 1, len(line[:col].decode("utf-8", "replace")) + 1

    def line(self, node) -> int:
        return node.start_point[0] + 1

    @staticmethod
    def src(node) -> str:
        return node.text.decode("utf-8", "replace")

    # -- files -------------------------------------------------------------------------------------------------

    def run_file(self, text: str, file: str, path: Path, argv: list[Word], depth: int) -> None:
        data = text.encode("utf-8")
        tree = _parser().parse(data)
        outer = getattr(self, "frame", None)
        self.frame = _Frame(file, path, data, data.split(b"\n"), argv, depth, outer.condition if outer else None)
        saved, self.recovered = self.recovered, []
        try:
            try:
                self.block(tree.root_node.children)
            except _TooLong:
                self.diag(NOT_BASH, f"reading stopped after {MAX_STEPS} steps (a loop that does not end?)", file, 0)
            finally:
                bad = _first_error(tree.root_node, self.recovered)
                if bad is not None:
                    row = bad.start_point[0] + 1
                    self.diag(
                        NOT_BASH,
                        f"line {row} is not bash the reader can parse; the statement there is skipped",
                        file,
                        row,
                        WARNING,
                        hint="check the script runs under bash (`bash -n` checks its syntax)",
                    )
        finally:
            self.recovered = saved
            if outer is not None:
                self.frame = outer

    def follow(self, node, words: list[Word], sourced: bool) -> bool:
        """`bash other.sh args` or `source other.sh`: read the other script, if it can be found. True if read."""
        if not words or not words[0].known:
            return False
        target = self.locate(words[0].text)
        line = self.line(node)
        if target is None:
            self.diag(
                NOT_STATIC,
                f"{words[0].text} (line {line}) is not found next to the script, so it is not read",
                self.frame.file,
                line,
                WARNING,
                hint="run rlc from the directory the script is launched from",
            )
            return False
        if self.frame.depth >= MAX_DEPTH:
            self.diag(
                NOT_STATIC, f"scripts nest more than {MAX_DEPTH} deep; {target} is not read", self.frame.file, line
            )
            return False
        try:
            text = _text(target, str(target))
        except LoadError as exc:
            self.diagnostics.append(exc.diagnostic)
            return False
        argv = words[1:] if not sourced or len(words) > 1 else self.frame.argv
        label = words[0].text  # the path as the script writes it
        if sourced:
            self.run_file(text, label, target, argv if len(words) > 1 else self.frame.argv, self.frame.depth + 1)
            return True
        saved = self.vars
        self.vars = {k: v for k, v in self.vars.items() if v.exported}  # a child bash sees the exported variables
        try:
            self.run_file(text, label, target, argv, self.frame.depth + 1)
        except _Exit:
            pass
        finally:
            self.vars = saved
        return True

    def locate(self, path: str) -> Path | None:
        """A script named in a script: relative to the current directory, the script's own directory, or any
        directory above it (scripts are often run from the root of their repository)."""
        p = Path(path)
        if p.is_absolute():
            return p if p.is_file() else None
        here = self.frame.path.parent
        for base in [Path("."), here, *here.parents]:
            if (base / p).is_file():
                return base / p
        return None

    # -- statements --------------------------------------------------------------------------------------------

    def block(self, nodes) -> bool | None:
        status: bool | None = True
        for node in nodes:
            if node.is_named and node.type not in ("comment",):
                status = self.statement(node)
        return status

    def statement(self, node) -> bool | None:  # noqa: C901 - one branch per statement kind
        self.tick()
        t = node.type
        if t == "command":
            return self.command(node)
        if t == "variable_assignment":
            self.assign(node)
            return True
        if t == "variable_assignments":
            for c in node.named_children:
                self.assign(c)
            return True
        if t == "declaration_command":
            return self.declare(node)
        if t == "unset_command":
            for c in node.named_children:
                self.vars.pop(self.src(c), None)
            return True
        if t in ("redirected_statement",):
            body = node.child_by_field_name("body")
            return self.statement(body) if body is not None else True
        if t == "pipeline":
            status: bool | None = True
            for c in node.named_children:
                saved = dict(self.vars)
                status = self.statement(c)
                self.vars = saved  # each part of a pipeline runs in a subshell
            return status
        if t == "list":
            return self.and_or(node)
        if t == "negated_command":
            inner = self.statement(node.named_children[0]) if node.named_children else True
            return None if inner is None else not inner
        if t == "test_command":
            return self.test(node)
        if t == "if_statement":
            return self.if_statement(node)
        if t == "case_statement":
            return self.case(node)
        if t == "for_statement":
            return self.for_loop(node)
        if t in ("compound_statement", "do_group"):
            return self.block(node.children)
        if t == "subshell":
            saved = dict(self.vars)
            try:
                return self.block(node.children)
            finally:
                self.vars = saved
        if t == "function_definition":
            name = node.child_by_field_name("name")
            body = node.child_by_field_name("body")
            if name is not None and body is not None:
                self.functions[self.src(name)] = body
            return True
        if t in ("while_statement", "c_style_for_statement", "until_statement"):
            self.diag(
                NOT_STATIC,
                f"the {t.split('_')[0]} loop at line {self.line(node)} is not read (only `for` over words is)",
                self.frame.file,
                self.line(node),
                WARNING,
            )
            return True
        if t == "arithmetic_expansion" or t == "compound_statement":
            return True
        if t == "ERROR":
            return None
        return True

    def and_or(self, node) -> bool | None:
        kids = [c for c in node.children if c.type != "comment"]
        status = self.statement(kids[0])
        i = 1
        while i + 1 < len(kids):
            op, right = kids[i].type, kids[i + 1]
            i += 2
            if status is None:
                status = self.branch(node, [partial(self.statement, right), _nothing], self.condition_of(kids[0]))
                continue
            if (op == "&&" and status) or (op == "||" and not status):
                status = self.statement(right)
        return status

    def if_statement(self, node) -> bool | None:
        # (condition nodes, body nodes) for `if` and each `elif`, then the `else` body
        arms: list[tuple[list, list]] = []
        cond: list = []
        body: list = []
        part = "cond"
        otherwise: list | None = None
        for c in node.children:
            if c.type in ("if", "fi", ";", "\n"):
                continue
            if c.type == "then":
                part = "body"
            elif c.type == "elif_clause":
                arms.append((cond, body))
                cond, body, part = [], [], "cond"
                for e in c.children:
                    if e.type == "then":
                        part = "body"
                    elif e.is_named and e.type != "comment":
                        (cond if part == "cond" else body).append(e)
            elif c.type == "else_clause":
                otherwise = [e for e in c.children if e.is_named]
            elif c.is_named and c.type != "comment":
                (cond if part == "cond" else body).append(c)
        arms.append((cond, body))
        return self.arms(node, arms, otherwise)

    def arms(self, node, arms: list[tuple[list, list]], otherwise: list | None) -> bool | None:
        if not arms:
            return self.block(otherwise) if otherwise is not None else True
        (cond, body), rest = arms[0], arms[1:]
        status = self.block(cond)
        if status is True:
            return self.block(body)
        if status is False:
            return self.arms(node, rest, otherwise)
        return self.branch(
            node,
            [lambda: self.block(body), lambda: self.arms(node, rest, otherwise)],
            self.condition_of(*cond),
        )

    def case(self, node) -> bool | None:
        value_node = node.child_by_field_name("value")
        value = self.scalar(value_node) if value_node is not None else ("",)
        items = [c for c in node.children if c.type == "case_item"]

        def patterns(item) -> list[str]:
            out = []
            for i, c in enumerate(item.children):
                if item.field_name_for_child(i) == "value":
                    out.append("".join(p if isinstance(p, str) else "*" for p in self.scalar(c)))
            return out

        def body(item) -> list:
            kids, seen = [], False
            for i, c in enumerate(item.children):
                if c.type == ")":
                    seen = True
                elif seen and c.is_named and item.field_name_for_child(i) != "termination" and c.type != "comment":
                    kids.append(c)
            return kids

        if all(isinstance(p, str) for p in value):
            text = "".join(value)  # type: ignore[arg-type]
            for item in items:
                if any(fnmatch.fnmatchcase(text, pat) for pat in patterns(item)):
                    return self.block(body(item))
            return True
        runs: list[Callable[[], bool | None]] = [partial(self.block, body(item)) for item in items]
        if not any("*" == pat for item in items for pat in patterns(item)):
            runs.append(_nothing)
        return self.branch(node, runs, _names(value))

    def for_loop(self, node) -> bool | None:
        var = node.child_by_field_name("variable")
        body = node.child_by_field_name("body")
        values = [c for i, c in enumerate(node.children) if node.field_name_for_child(i) == "value"]
        words = [w for v in values for w in self.words(v)] if values else list(self.frame.argv)
        status: bool | None = True
        for w in words:
            self.tick()
            if var is not None:
                self.set(self.src(var), w.pieces)
            if body is not None:
                status = self.statement(body)
        return status

    def branch(self, node, runs: list[Callable[[], bool | None]], depends: str) -> bool | None:
        """Read each alternative from the same state; a variable they leave different becomes unknown."""
        line = self.line(node)
        cond = Unknown("branch", self.src(node).split("\n")[0][:60], "", line, self.frame.file, depends or "?")
        start, outer = self.vars, self.frame.condition
        ends: list[dict[str, _Var]] = []
        statuses: list[bool | None] = []
        exited = 0
        for run in runs:
            self.vars = dict(start)
            self.frame.condition = outer or cond
            try:
                statuses.append(run())
                ends.append(self.vars)
            except _Exit:
                exited += 1
        self.frame.condition = outer
        if not ends:
            self.vars = start
            raise _Exit
        merged: dict[str, _Var] = {}
        for key in set().union(*ends):
            values = [e.get(key) for e in ends]
            first = values[0]
            if all(v is not None and _same(v.value, first.value) for v in values if first is not None) and all(
                (v is None) == (first is None) for v in values
            ):
                if first is not None:
                    merged[key] = first
                continue
            exported = any(v is not None and v.exported for v in values)
            merged[key] = _Var((replace(cond, name=key, source=f"${key}"),), exported)
        self.vars = merged
        return statuses[0] if all(s == statuses[0] for s in statuses) else None

    def condition_of(self, *nodes) -> str:
        """The variables that make a condition unknown, as a message names them."""
        names: list[str] = []
        for n in nodes:
            for ref in _expansions(n):
                for u in self.scalar(ref):
                    if isinstance(u, Unknown):
                        label = u.name or u.source
                        if label not in names:
                            names.append(label)
        return ", ".join(names) or "a file or a command the reader does not run"

    # -- commands ----------------------------------------------------------------------------------------------

    def command(self, node) -> bool | None:
        prefix = [c for c in node.children if c.type == "variable_assignment"]
        name_node = node.child_by_field_name("name")
        words: list[Word] = []
        if name_node is not None:
            words = self.words(name_node)
        for i, c in enumerate(node.children):
            if node.field_name_for_child(i) == "argument":
                words.extend(self.words(c))
        if name_node is None:
            for a in prefix:
                self.assign(a)
            return True
        if not words:
            return True
        head = words[0].text
        args = words[1:]
        line = self.line(node)
        if not words[0].known:
            file, ln, col = self.pos(node)
            loc = Location(file, ln, col, self.frame.lines[ln - 1].decode("utf-8", "replace"))
            for u in words[0].unknowns:
                d = _unknown_diagnostic(u, loc)
                d.message = f"the program run at line {ln} is not known: {d.message}"
                d.severity = ERROR
                self.unknown_programs.append(d)
            return True
        if head in (":", "true", "echo", "printf", "set", "cd", "pushd", "popd", "mkdir", "sleep", "wait", "trap"):
            if head == "set" and args and args[0].text == "--":
                self.frame.argv = args[1:]
            return True
        if head == "false":
            return False
        if head == "shift":
            n = int(args[0].text) if args and args[0].text.isdigit() else 1
            self.frame.argv = self.frame.argv[n:]
            return True
        if head == "exit" or (head == "return" and self.frame.depth == 0):
            if self.frame.condition is None and self.frame.depth == 0:
                self.exit_line = line
            raise _Exit
        if head in ("source", "."):
            return self.follow(node, args, sourced=True) or True
        if head in ("bash", "sh") and args and not args[0].text.startswith("-"):
            return self.follow(node, args, sourced=False) or True
        if head == "test" or head == "[":
            return None
        if head in self.functions:
            return self.call(head, args, line)
        found = find_program(words)
        if found is not None:
            program, module, first, launcher = found
            env = {k: "".join(v.value) for k, v in self.vars.items() if v.exported and _is_text(v.value)}  # type: ignore[arg-type]
            for a in prefix:
                var_name, value = self.assignment_value(a)
                if isinstance(value, tuple) and _is_text(value):
                    env[var_name] = "".join(value)  # type: ignore[arg-type]
            file, ln, col = self.pos(node)
            self.launches.append(
                Launch(program, module, words[first:], file, ln, col, launcher, env, self.frame.condition)
            )
        return True

    def call(self, name: str, args: list[Word], line: int) -> bool | None:
        if self.frame.depth >= MAX_DEPTH:
            self.diag(NOT_STATIC, f"functions nest more than {MAX_DEPTH} deep at line {line}", self.frame.file, line)
            return None
        saved = self.frame.argv, self.frame.depth
        self.frame.argv, self.frame.depth = args, self.frame.depth + 1
        try:
            return self.statement(self.functions[name])
        finally:
            self.frame.argv, self.frame.depth = saved

    def declare(self, node) -> bool:
        keyword = node.children[0].type if node.children else ""
        for c in node.named_children:
            if c.type == "variable_assignment":
                name = self.assign(c)
                if keyword == "export" and name in self.vars:
                    self.vars[name].exported = True
            elif c.type == "variable_name" and keyword == "export":
                name = self.src(c)
                if name in self.vars:
                    self.vars[name].exported = True
        return True

    def assignment_value(self, node) -> tuple[str, tuple[Piece, ...] | list[Word]]:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        name = self.src(name_node) if name_node is not None else ""
        if name_node is not None and name_node.type == "subscript":
            inner = name_node.child_by_field_name("name")
            name = self.src(inner) if inner is not None else name
        if value_node is None:
            return name, ("",)
        if value_node.type == "array":
            return name, [w for c in value_node.named_children if c.type != "comment" for w in self.words(c)]
        return name, self.scalar(value_node, assigning=name)

    def assign(self, node) -> str:
        name, value = self.assignment_value(node)
        name_node = node.child_by_field_name("name")
        appending = any(c.type == "+=" for c in node.children)
        old = self.vars.get(name)
        if name_node is not None and name_node.type == "subscript":
            index = name_node.child_by_field_name("index")
            idx = self.arith(index) if index is not None else None
            items = list(old.value) if old is not None and isinstance(old.value, list) else []
            if isinstance(idx, int) and isinstance(value, tuple):
                file, line, col = self.pos(node)
                while len(items) <= idx:
                    items.append(Word(("",), file, line, col))
                items[idx] = Word(value, file, line, col)
                self.vars[name] = _Var(items, old.exported if old else False)
            return name
        if appending and old is not None:
            if isinstance(value, list):
                base = old.value if isinstance(old.value, list) else [Word(old.value, *self.pos(node))]
                value = [*base, *value]
            elif isinstance(old.value, tuple):
                value = old.value + value
        if isinstance(value, tuple) and name in self.given and not _is_text(value):
            value = (self.given[name],)  # --env stands for a value the script would compute
        self.set(name, value, old.exported if old else False)
        return name

    def set(self, name: str, value: tuple[Piece, ...] | list[Word], exported: bool = False) -> None:
        old = self.vars.get(name)
        self.vars[name] = _Var(value, exported or (old.exported if old else False))

    # -- conditions --------------------------------------------------------------------------------------------

    def test(self, node) -> bool | None:
        inner = [c for c in node.named_children]
        if len(inner) != 1:
            return None
        return self.truth(inner[0])

    def truth(self, node) -> bool | None:  # noqa: C901 - one branch per test operator
        t = node.type
        if t == "parenthesized_expression":
            kids = node.named_children
            return self.truth(kids[0]) if kids else None
        if t == "unary_expression":
            op_node = node.child_by_field_name("operator") or node.children[0]
            op = self.src(op_node)
            operand = [c for c in node.named_children if c is not op_node]
            if op == "!":
                inner = self.truth(operand[0]) if operand else None
                return None if inner is None else not inner
            if not operand:
                return None
            value = self.scalar(operand[0])
            if not _is_text(value):
                return None
            text = "".join(value)  # type: ignore[arg-type]
            if op == "-z":
                return text == ""
            if op == "-n":
                return text != ""
            if op == "-v":
                return text in self.vars
            return None  # file tests: the reader does not look at the file system
        if t == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op = self.src(node.child_by_field_name("operator")) if node.child_by_field_name("operator") else ""
            if left is None or right is None:
                return None
            if op in ("&&", "-a", "||", "-o"):
                a = self.truth(left)
                if op in ("&&", "-a"):
                    if a is False:
                        return False
                    b = self.truth(right)
                    return False if b is False else (True if a and b else None)
                if a is True:
                    return True
                b = self.truth(right)
                return True if b is True else (False if a is False and b is False else None)
            lv, rv = self.scalar(left), self.scalar(right)
            if not (_is_text(lv) and _is_text(rv)):
                return None
            a_text, b_text = "".join(lv), "".join(rv)  # type: ignore[arg-type]
            if op in ("=", "=="):
                return (
                    fnmatch.fnmatchcase(a_text, b_text)
                    if node.parent.type == "test_command"
                    and self.src(node.parent).startswith("[[")
                    and right.type != "string"
                    else a_text == b_text
                )
            if op == "!=":
                return a_text != b_text
            if op == "=~":
                try:
                    return re.search(b_text, a_text) is not None
                except re.error:
                    return None
            if op in ("<", ">"):
                return a_text < b_text if op == "<" else a_text > b_text
            if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                try:
                    x, y = int(a_text), int(b_text)
                except ValueError:
                    return None
                return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
            return None
        value = self.scalar(node)
        return ("".join(value) != "") if _is_text(value) else None  # type: ignore[arg-type]

    # -- expansion ---------------------------------------------------------------------------------------------

    def words(self, node) -> list[Word]:
        """The words an argument expands to (word splitting and `"${A[@]}"` included)."""
        file, line, col = self.pos(node)
        return [
            Word(tuple(_merge(f.pieces)), *(f.origin or (file, line, col)))
            for f in self.fields(node, quoted=False, arg=True)
        ]

    def scalar(self, node, assigning: str = "") -> tuple[Piece, ...]:
        """A value as one string (an assignment's right side, a test operand): no splitting."""
        saved = getattr(self, "assigning", "")
        self.assigning = assigning
        try:
            fields = self.fields(node, quoted=True)
        finally:
            self.assigning = saved
        pieces: list[Piece] = []
        for i, f in enumerate(fields):
            if i:
                pieces.append(" ")
            pieces.extend(f.pieces)
        return tuple(_merge(pieces)) or ("",)

    def fields(self, node, quoted: bool, arg: bool = False) -> list[_Field]:  # noqa: C901 - one branch per node type
        self.tick()
        t = node.type
        if t in ("word", "number", "extglob_pattern", "regex", "test_operator", "special_variable_name"):
            text = self.src(node)
            if t == "word" and not quoted:
                text = _unescape(text)
                if arg and (text == "~" or text.startswith("~/")):
                    return [_Field([*self.lookup("HOME", "$HOME"), text[1:]])]
            return [_Field([text])]
        if t == "raw_string":
            return [_Field([self.src(node)[1:-1]])]
        if t == "ansi_c_string":
            try:
                text = codecs.decode(self.src(node)[2:-1], "unicode_escape")
            except (UnicodeDecodeError, ValueError):
                text = self.src(node)[2:-1]
            return [_Field([text])]
        if t in ("string", "translated_string"):
            return self.string(node)
        if t == "concatenation":
            out: list[_Field] | None = None
            for c in node.children:
                part = self.fields(c, quoted, arg)
                out = part if out is None else _join(out, part)
            return out or []
        if t == "simple_expansion":
            kids = node.named_children
            name = self.src(kids[0]) if kids else self.src(node)[1:]
            return self.variable(name, "$" + name, quoted)
        if t == "expansion":
            return self.expansion(node, quoted)
        if t in ("command_substitution", "process_substitution"):
            return [_Field(list(self.substitution(node)))]
        if t == "arithmetic_expansion":
            inner = node.named_children
            value = self.arith(inner[0]) if inner else 0
            if isinstance(value, int):
                return [_Field([str(value)])]
            return [_Field([Unknown("unsupported", self.src(node), "", self.line(node), self.frame.file, value)])]
        if t == "array":
            return [_Field(list(w.pieces)) for c in node.named_children for w in self.words(c)]
        if t == "command_name":
            kids = node.named_children
            return self.fields(kids[0], quoted, arg) if kids else []
        if t == "brace_expression":
            return [_Field([self.src(node)])]
        if t == "comment":
            return []
        return [_Field([self.src(node)])]

    def string(self, node) -> list[_Field]:
        out: list[_Field] = [_Field([])]
        first = True
        for c in node.children:
            if c.type == '"' or c.type == '$"':
                continue
            if c.type == "string_content":
                part = [_Field([_unescape_dq(self.src(c))])]
            else:
                part = self.fields(c, quoted=True)
            if not part:  # "$@" with no arguments
                if first and len(node.named_children) == 1:
                    return []
                continue
            out = _join(out, part)
            first = False
        return out

    def substitution(self, node) -> tuple[Piece, ...]:
        """`$(...)` is never run; a few pure path functions of known words are evaluated (dirname, basename,
        pwd, `cd D && pwd`), everything else is an unknown the user gives with --env."""
        text = node.text
        if text.startswith(b"$((") and text.endswith(b"))"):
            # tree-sitter-bash reads `$((...))` inside `${V:=...}` as a command substitution of a subshell
            arith = self.reparse(node.start_byte, text, "arithmetic_expansion")
            if arith is not None:
                self.recovered.append((node.start_byte, node.end_byte))
                number = self.arith(arith.named_children[0]) if arith.named_children else 0
                if isinstance(number, int):
                    return (str(number),)
                return (Unknown("unsupported", self.src(node), "", self.line(node), self.frame.file, number),)
        body = node.named_children
        value = self.pure_command(body[0]) if len(body) == 1 else None
        if value is not None:
            return value
        return (Unknown("command", self.src(node), getattr(self, "assigning", ""), self.line(node), self.frame.file),)

    def pure_command(self, node) -> tuple[Piece, ...] | None:
        if node.type == "list":
            kids = [c for c in node.children if c.type not in ("comment",)]
            if len(kids) == 3 and kids[1].type == "&&" and kids[0].type == "command" and kids[2].type == "command":
                first = [w for c in kids[0].children if c.is_named for w in self.words(c)]
                last = [w for c in kids[2].children if c.is_named for w in self.words(c)]
                first = [w for w in first if w.text != "--"]
                if len(first) == 2 and first[0].text == "cd" and [w.text for w in last] == ["pwd"]:
                    return first[1].pieces if first[1].known else None
            return None
        if node.type != "command":
            return None
        words = [w for c in node.children if c.is_named and c.type != "variable_assignment" for w in self.words(c)]
        if not words or not all(w.known for w in words):
            return None
        head, args = words[0].text, [w.text for w in words[1:] if not w.text.startswith("-")]
        if head == "dirname" and len(args) == 1:
            return (os.path.dirname(args[0]) or ".",)
        if head == "basename" and args:
            base = os.path.basename(args[0].rstrip("/"))
            return (base[: -len(args[1])] if len(args) > 1 and base.endswith(args[1]) else base,)
        if head == "pwd" and not args:
            return tuple(self.lookup("PWD", "$(pwd)"))
        return None

    def variable(self, name: str, source: str, quoted: bool) -> list[_Field]:
        if name in ("@", "*"):
            argv = self.frame.argv
            if quoted and name == "*":
                return [_Field(_merge([p for i, w in enumerate(argv) for p in ((" ",) if i else ()) + w.pieces]))]
            return [_Field(list(w.pieces), (w.file, w.line, w.column)) for w in argv]
        if name == "#":
            return [_Field([str(len(self.frame.argv))])]
        if name == "0":
            return [_Field([str(self.frame.path)])]
        if name.isdigit():
            i = int(name) - 1
            return [_Field(list(self.frame.argv[i].pieces))] if i < len(self.frame.argv) else self._split("", quoted)
        if name == "?":
            return [_Field(["0"])]
        if name in ("$", "!", "-", "RANDOM", "SECONDS", "LINENO"):
            return [_Field([Unknown("unsupported", source, "", 0, self.frame.file, "it changes from run to run")])]
        var = self.vars.get(name)
        if var is None:
            return [_Field(list(self.lookup(name, source)))]
        if isinstance(var.value, list):
            return self._split(var.value[0].pieces if var.value else "", quoted)
        return self._split(var.value, quoted)

    def lookup(self, name: str, source: str) -> list[Piece]:
        var = self.vars.get(name)
        if var is not None:
            return list(_flat(var.value))
        if name == "BASH_SOURCE":
            return [str(self.frame.path)]
        return [Unknown("env", source, name, 0, self.frame.file)]

    def _split(self, value: Any, quoted: bool) -> list[_Field]:
        pieces = [value] if isinstance(value, str) else list(value)
        if quoted:
            return [_Field(pieces)]
        fields: list[_Field] = []
        current: list[Piece] = []
        started = False
        for p in pieces:
            if isinstance(p, Unknown):
                current.append(p)
                started = True
                continue
            parts = re.split(r"[ \t\n]+", p)
            for j, part in enumerate(parts):
                if j:
                    if started:
                        fields.append(_Field(current))
                    current, started = [], False
                if part:
                    current.append(part)
                    started = True
        if started:
            fields.append(_Field(current))
        return fields

    def expansion(self, node, quoted: bool) -> list[_Field]:  # noqa: C901 - one branch per operator
        kids = [c for c in node.children if c.type not in ("${", "}")]
        prefix = ""
        if kids and kids[0].type in ("#", "!"):
            prefix = kids[0].type
            kids = kids[1:]
        if not kids:
            return [_Field([""])]
        target, rest = kids[0], kids[1:]
        source = self.src(node)
        unsupported = [_Field([Unknown("unsupported", source, "", self.line(node), self.frame.file)])]
        index: str | None = None
        if target.type == "subscript":
            name_node, index_node = target.child_by_field_name("name"), target.child_by_field_name("index")
            name = self.src(name_node) if name_node is not None else ""
            index = self.src(index_node) if index_node is not None else None
        elif target.type in ("variable_name", "special_variable_name"):
            name = self.src(target)
        else:
            return unsupported
        if prefix == "!":
            return unsupported
        var = self.vars.get(name)
        if index in ("@", "*"):
            items: list[Word] = []
            if var is not None:
                items = var.value if isinstance(var.value, list) else [Word(var.value, *self.pos(node))]
            if prefix == "#":
                return [_Field([str(len(items))])]
            if not rest:
                if quoted and index == "@":
                    return [_Field(list(w.pieces), (w.file, w.line, w.column)) for w in items]
                joined: list[Piece] = []
                for i, w in enumerate(items):
                    joined += ([" "] if i else []) + list(w.pieces)
                return self._split(joined, quoted)
            return unsupported
        if index is not None:
            if var is None:
                value: tuple[Piece, ...] | None = None
            elif isinstance(var.value, list):
                at = self.arith(target.child_by_field_name("index"))
                inside = isinstance(at, int) and -len(var.value) <= at < len(var.value)
                value = var.value[at].pieces if isinstance(at, int) and inside else ("",)
            else:
                value = var.value if index == "0" else ("",)
        elif name in ("@", "*") or name.isdigit() or name == "#":
            fields = self.variable(name, "$" + name, quoted)
            value = tuple(p for i, f in enumerate(fields) for p in ((" ",) if i else ()) + tuple(f.pieces))
            if name.isdigit() and int(name) > len(self.frame.argv):
                value = None
        else:
            value = (
                None
                if var is None
                else (var.value[0].pieces if isinstance(var.value, list) and var.value else _flat(var.value))
            )
        if prefix == "#":
            return [_Field([str(len("".join(value)))])] if value is None or _is_text(value) else unsupported  # type: ignore[arg-type]
        if not rest:
            if value is None:
                return [_Field(list(self.lookup(name, source)))] if name not in ("@", "*") else []
            return self._split(value, quoted)
        op = rest[0].type
        operand = rest[1:]
        if node.has_error and quoted and target.type == "variable_name":
            recovered = self.recover_operand(node, target)
            if recovered is None:
                return unsupported
            op, operand = recovered
        empty = value is None or (_is_text(value) and "".join(value) == "")  # type: ignore[arg-type]
        unset = value is None
        if op in (":-", "-", ":=", "=", ":?", "?", ":+", "+"):
            missing = empty if op.startswith(":") else unset
            saved = getattr(self, "assigning", "")
            self.assigning = name if op in (":=", "=") else saved
            try:
                word = self.operand(operand, quoted) if missing or op in (":+", "+") else []
            finally:
                self.assigning = saved
            if op in (":-", "-"):
                return self._split(word, quoted) if missing else self._split(value, quoted)
            if op in (":=", "="):
                if missing:
                    self.set(name, tuple(word) if word else ("",))
                    return self._split(word, quoted)
                return self._split(value, quoted)
            if op in (":?", "?"):
                if missing:
                    why = "".join(p if isinstance(p, str) else p.source for p in word).strip()
                    u = Unknown("required", source, name, self.line(node), self.frame.file, why)
                    if name not in self.vars:
                        self.diag(
                            NEEDS_ENV,
                            f"the script requires {name}{f' ({why})' if why else ''}, and nothing sets it",
                            self.frame.file,
                            u.line,
                            hint=f"pass --env {name}=VALUE",
                        )
                    self.set(name, (u,))
                    return [_Field([u])]
                return self._split(value, quoted)
            return self._split(word, quoted) if not missing else []
        if value is None or not _is_text(value):
            return [_Field(list(value))] if value is not None else unsupported
        text = "".join(value)  # type: ignore[arg-type]
        pattern = "".join(p if isinstance(p, str) else "" for p in self.operand(operand, True))
        if op in ("#", "##", "%", "%%"):
            return [_Field([_remove(text, pattern, op)])]
        if op == "^^":
            return [_Field([text.upper()])]
        if op == ",,":
            return [_Field([text.lower()])]
        if op == ":":
            nums = [n for n in (self.arith(o) for o in operand if o.is_named) if isinstance(n, int)]
            if nums and len(nums) == len([o for o in operand if o.is_named]):
                start = nums[0]
                end = None if len(nums) < 2 else start + nums[1] if nums[1] >= 0 else nums[1]
                return [_Field([text[start:end]])]
        return unsupported

    def reparse(self, start: int, text: bytes, kind: str):
        """TEXT parsed as if written at byte START of the current file (so lines and columns stay right): the first
        node of type KIND in it, or None."""
        pad = bytes(b if b == 10 else 32 for b in self.frame.data[:start])
        tree = _parser().parse(pad + text)
        stack = [tree.root_node]
        while stack:
            n = stack.pop()
            if n.type == kind and n.start_byte == start:
                return None if n.has_error else n
            stack.extend(reversed(n.children))
        return None

    def recover_operand(self, node, target) -> tuple[str, list] | None:
        """`"${V:-'a'}"`: tree-sitter-bash reads the quotes inside the braces as shell quotes, where bash keeps
        them as text; the operand is read again as the double-quoted text it is."""
        after = node.text[target.end_byte - node.start_byte : -1]
        m = re.match(rb"(:-|:=|:\?|:\+|-|=|\?|\+)", after)
        if m is None or b'"' in after:
            return None
        start = target.end_byte + m.end() - 1
        string = self.reparse(start, b'"' + after[m.end() :] + b'"', "string")
        if string is None:
            return None
        self.recovered.append((node.start_byte, node.end_byte))
        return m.group(1).decode(), [string]

    def operand(self, nodes, quoted: bool) -> list[Piece]:
        pieces: list[Piece] = []
        for n in nodes:
            for i, f in enumerate(self.fields(n, quoted=True)):
                pieces += ([" "] if i else []) + f.pieces
        return _merge(pieces)

    def arith(self, node) -> int | str:  # noqa: C901 - one branch per operator
        """An arithmetic value, or a string saying why it is not known."""
        if node is None:
            return 0
        t = node.type
        if t == "number":
            return _number(self.src(node))
        if t in ("variable_name", "word"):
            text = self.src(node)
            if re.fullmatch(r"-?\d+|0[xX][0-9a-fA-F]+", text):
                return _number(text)
            var = self.vars.get(text)
            if var is None:
                return 0 if t == "variable_name" else f"{text} is unknown"
            return self._arith_value(_flat(var.value), text)
        if t in ("simple_expansion", "expansion", "string", "concatenation"):
            return self._arith_value(tuple(self.scalar(node)), self.src(node))
        if t == "parenthesized_expression":
            kids = node.named_children
            return self.arith(kids[0]) if kids else 0
        if t == "unary_expression":
            op = self.src(node.children[0])
            v = self.arith(node.named_children[-1]) if node.named_children else 0
            if not isinstance(v, int):
                return v
            return {"-": -v, "+": v, "!": int(not v), "~": ~v}.get(op, f"{op} is not evaluated")
        if t == "ternary_expression":
            c = self.arith(node.child_by_field_name("condition"))
            if not isinstance(c, int):
                return c
            return self.arith(node.child_by_field_name("consequence" if c else "alternative"))
        if t == "binary_expression":
            a = self.arith(node.child_by_field_name("left"))
            b = self.arith(node.child_by_field_name("right"))
            op_node = node.child_by_field_name("operator")
            op = self.src(op_node) if op_node is not None else ""
            if not isinstance(a, int):
                return a
            if not isinstance(b, int):
                return b
            return _binary(op, a, b)
        return f"{self.src(node)} is not evaluated"

    def _arith_value(self, value: tuple[Piece, ...], source: str) -> int | str:
        if not _is_text(value):
            return f"{source} is unknown"
        text = "".join(value).strip()  # type: ignore[arg-type]
        if re.fullmatch(r"[-+]?\d+", text or "0"):
            return int(text or "0")
        return f"{source} is not a number"


def _nothing() -> bool | None:
    return True


def _binary(op: str, a: int, b: int) -> int | str:
    try:
        if op == "/":
            return int(a / b) if b else "division by zero"
        if op == "%":
            return (abs(a) % abs(b)) * (1 if a >= 0 else -1) if b else "division by zero"
        if op == "**":
            return a**b if 0 <= b < 64 else f"{a}**{b} is not evaluated"
        table = {
            "+": a + b,
            "-": a - b,
            "*": a * b,
            "<": int(a < b),
            ">": int(a > b),
            "<=": int(a <= b),
            ">=": int(a >= b),
            "==": int(a == b),
            "!=": int(a != b),
            "&&": int(bool(a and b)),
            "||": int(bool(a or b)),
            "&": a & b,
            "|": a | b,
            "^": a ^ b,
        }
        if op in ("<<", ">>"):
            return (a << b if op == "<<" else a >> b) if 0 <= b < 64 else f"shift by {b}"
        return table[op] if op in table else f"{op} is not evaluated"
    except (OverflowError, ValueError):
        return "out of range"


def _number(text: str) -> int | str:
    try:
        if text.lower().startswith("0x"):
            return int(text, 16)
        if "#" in text:
            base, digits = text.split("#", 1)
            return int(digits, int(base))
        if len(text) > 1 and text.startswith("0"):
            return int(text, 8)
        return int(text)
    except ValueError:
        return f"{text} is not a number"


def _remove(text: str, pattern: str, op: str) -> str:
    """`${V#p}`, `${V##p}`, `${V%p}`, `${V%%p}`: the shortest or longest match of a glob removed from an end."""
    n = len(text)
    if op in ("#", "##"):
        cuts = range(0, n + 1) if op == "#" else range(n, -1, -1)
        for i in cuts:
            if fnmatch.fnmatchcase(text[:i], pattern):
                return text[i:]
        return text
    cuts = range(n, -1, -1) if op == "%" else range(0, n + 1)
    for i in cuts:
        if fnmatch.fnmatchcase(text[i:], pattern):
            return text[:i]
    return text


def _join(left: list[_Field], right: list[_Field]) -> list[_Field]:
    """Two adjacent expansions: the last word of the left and the first of the right are one word."""
    if not left:
        return right
    if not right:
        return left
    joined = _Field(left[-1].pieces + right[0].pieces)
    if not left[-1].pieces:
        joined.origin = right[0].origin
    elif not right[0].pieces:
        joined.origin = left[-1].origin
    return [*left[:-1], joined, *right[1:]]


def _merge(pieces: Iterable[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def _flat(value: tuple[Piece, ...] | list[Word]) -> tuple[Piece, ...]:
    if isinstance(value, tuple):
        return value
    out: list[Piece] = []
    for i, w in enumerate(value):
        out += ([" "] if i else []) + list(w.pieces)
    return tuple(out)


def _is_text(value: Any) -> bool:
    return all(isinstance(p, str) for p in value)


def _same(a: tuple[Piece, ...] | list[Word], b: tuple[Piece, ...] | list[Word]) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return [w.pieces for w in a] == [w.pieces for w in b]
    return a == b


def _names(value: tuple[Piece, ...]) -> str:
    return ", ".join(dict.fromkeys(p.name or p.source for p in value if isinstance(p, Unknown)))


def _expansions(node) -> list:
    """The outermost `$V`, `${...}` and `$(...)` of a condition."""
    out: list = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type in ("simple_expansion", "expansion", "command_substitution"):
            out.append(n)
            continue
        stack.extend(reversed(n.children))
    return out


def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def _first_error(node, recovered: list[tuple[int, int]]):
    """The first node tree-sitter could not parse, outside the ranges the reader read again by itself."""
    stack = [node]
    while stack:
        n = stack.pop()
        if any(a <= n.start_byte and n.end_byte <= b for a, b in recovered):
            continue
        if n.type == "ERROR" or n.is_missing:
            return n
        stack.extend(reversed([c for c in n.children if c.has_error or c.type == "ERROR" or c.is_missing]))
    return None


def _unescape(text: str) -> str:
    """An unquoted word as bash reads it: a backslash quotes the next character; a backslash-newline vanishes."""
    return re.sub(r"\\(\n|.)", lambda m: "" if m.group(1) == "\n" else m.group(1), text, flags=re.S)


def _unescape_dq(text: str) -> str:
    """Text inside double quotes: a backslash quotes only $ ` \" \\ and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)

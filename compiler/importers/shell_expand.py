"""How a launch script's words expand when read statically: quoting, word splitting, `$V` and `${...}` with their
operators, arrays, `$((...))`, and `$(...)`, which is never run (a few pure path functions of known words aside).
`Expander` holds the reading's state; rlc.compiler.importers.shell_read adds the statements."""

from __future__ import annotations

import codecs
import fnmatch
import os
import re
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlc.compiler.importers.shell_words import MAX_STEPS, NEEDS_ENV, Launch, Piece, Unknown, Word
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, Diagnostic, Location


@dataclass
class Var:
    value: tuple[Piece, ...] | list[Word]  # a scalar's pieces, or an array's words
    exported: bool = False


class Exit(Exception):
    pass


class TooLong(Exception):
    pass


@dataclass
class Field:
    """A word being built by expansion: its pieces, and the origin of an array element expanded whole."""

    pieces: list[Piece]
    origin: tuple[str, int, int] | None = None


@dataclass
class Frame:
    """What a statement runs in: the file and its lines, the positional parameters, the script's path."""

    file: str
    path: Path
    data: bytes
    lines: list[bytes]
    argv: list[Word]
    depth: int
    condition: Unknown | None = None  # the unknown condition the statements run under, if any


class Expander:
    """The state of a static reading (variables, positional parameters, findings) and the expansion of words."""

    vars: dict[str, Var]
    recovered: list[tuple[int, int]]  # byte ranges of the current file read again after a misparse
    frame: Frame

    def __init__(self, env: dict[str, str], name: str):
        self.given = env
        self.vars = {k: Var((v,), exported=True) for k, v in env.items()}
        self.functions: dict[str, Any] = {}
        self.launches: list[Launch] = []
        self.unknown_programs: list[Diagnostic] = []  # commands whose program itself is unknown
        self.diagnostics: list[Diagnostic] = []
        self.exit_line = 0
        self.steps = 0
        self.name = name
        self.recovered = []
        self.assigning = ""  # the variable whose value is being expanded (a `$(...)` in it names it for --env)

    def swap_recovered(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        old, self.recovered = self.recovered, ranges
        return old

    def swap_vars(self, variables: dict[str, Var]) -> dict[str, Var]:
        old, self.vars = self.vars, variables
        return old

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
            raise TooLong

    def pos(self, node) -> tuple[str, int, int]:
        row, col = node.start_point
        line = self.frame.lines[row] if row < len(self.frame.lines) else b""
        return self.frame.file, row + 1, len(line[:col].decode("utf-8", "replace")) + 1

    def line(self, node) -> int:
        return node.start_point[0] + 1

    @staticmethod
    def src(node) -> str:
        return node.text.decode("utf-8", "replace")

    def set(self, name: str, value: tuple[Piece, ...] | list[Word], exported: bool = False) -> None:
        old = self.vars.get(name)
        self.vars[name] = Var(value, exported or (old.exported if old else False))

    def words(self, node) -> list[Word]:
        """The words an argument expands to (word splitting and `"${A[@]}"` included)."""
        file, line, col = self.pos(node)
        return [
            Word(tuple(merge(f.pieces)), *(f.origin or (file, line, col)))
            for f in self.fields(node, quoted=False, arg=True)
        ]

    def scalar(self, node, assigning: str = "") -> tuple[Piece, ...]:
        """A value as one string (an assignment's right side, a test operand): no splitting."""
        saved = self.assigning
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
        return tuple(merge(pieces)) or ("",)

    def fields(self, node, quoted: bool, arg: bool = False) -> list[Field]:  # noqa: C901 - one branch per node type
        self.tick()
        t = node.type
        if t in ("word", "number", "extglob_pattern", "regex", "test_operator", "special_variable_name"):
            text = self.src(node)
            if t == "word" and not quoted:
                text = _unescape(text)
                if arg and (text == "~" or text.startswith("~/")):
                    return [Field([*self.lookup("HOME", "$HOME"), text[1:]])]
            return [Field([text])]
        if t == "raw_string":
            return [Field([self.src(node)[1:-1]])]
        if t == "ansi_c_string":
            try:
                text = codecs.decode(self.src(node)[2:-1], "unicode_escape")
            except (UnicodeDecodeError, ValueError):
                text = self.src(node)[2:-1]
            return [Field([text])]
        if t in ("string", "translated_string"):
            return self.string(node)
        if t == "concatenation":
            out: list[Field] | None = None
            for c in node.children:
                part = self.fields(c, quoted, arg)
                out = part if out is None else join(out, part)
            return out or []
        if t == "simple_expansion":
            kids = node.named_children
            name = self.src(kids[0]) if kids else self.src(node)[1:]
            return self.variable(name, "$" + name, quoted)
        if t == "expansion":
            return self.expansion(node, quoted)
        if t in ("command_substitution", "process_substitution"):
            return [Field(list(self.substitution(node)))]
        if t == "arithmetic_expansion":
            inner = node.named_children
            value = self.arith(inner[0]) if inner else 0
            if isinstance(value, int):
                return [Field([str(value)])]
            return [Field([Unknown("unsupported", self.src(node), "", self.line(node), self.frame.file, value)])]
        if t == "array":
            return [Field(list(w.pieces)) for c in node.named_children for w in self.words(c)]
        if t == "command_name":
            kids = node.named_children
            return self.fields(kids[0], quoted, arg) if kids else []
        if t == "brace_expression":
            return [Field([self.src(node)])]
        if t == "comment":
            return []
        return [Field([self.src(node)])]

    def string(self, node) -> list[Field]:
        out: list[Field] = [Field([])]
        first = True
        for c in node.children:
            if c.type == '"' or c.type == '$"':
                continue
            if c.type == "string_content":
                part = [Field([_unescape_dq(self.src(c))])]
            else:
                part = self.fields(c, quoted=True)
            if not part:  # "$@" with no arguments
                if first and len(node.named_children) == 1:
                    return []
                continue
            out = join(out, part)
            first = False
        return out

    def substitution(self, node) -> tuple[Piece, ...]:
        """`$(...)` is never run; a few pure path functions of known words are evaluated (dirname, basename,
        pwd, `cd D && pwd`), `date +FORMAT` is the import's time (a "clock" unknown), everything else is an unknown
        the user gives with --env."""
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
        now = self.date(body[0]) if len(body) == 1 else ""
        kind = "clock" if now else "command"
        return (Unknown(kind, self.src(node), self.assigning, self.line(node), self.frame.file, now),)

    def date(self, node) -> str:
        """`date +FORMAT` (or `date -u +FORMAT`): the time of the import in that format; "" for any other command.
        The importer takes it where it only names the run (rlc.compiler.importers.shell_words.launch_diagnostics)."""
        words = self.command_words(node)
        if not words or not all(w.known for w in words) or words[0].text != "date":
            return ""
        args = [w.text for w in words[1:]]
        utc = bool(args) and args[0] in ("-u", "--utc", "--universal")
        args = args[1:] if utc else args
        if len(args) != 1 or not args[0].startswith("+"):
            return ""
        now = datetime.now(timezone.utc) if utc else datetime.now().astimezone()
        return now.strftime(args[0][1:])

    def pure_command(self, node) -> tuple[Piece, ...] | None:
        """dirname, basename, pwd and `cd D && pwd` of known words (redirections aside); None for anything else."""
        if node.type == "list":
            kids = [c for c in node.children if c.type not in ("comment",)]
            if len(kids) == 3 and kids[1].type == "&&":
                first, last = self.command_words(kids[0]), self.command_words(kids[2])
                if first and last is not None and [w.text for w in last] == ["pwd"]:
                    first = [w for w in first if not w.text.startswith("-")]
                    if len(first) == 2 and first[0].text == "cd" and first[1].known:
                        return (os.path.normpath("".join(first[1].pieces)),)  # type: ignore[arg-type]
            return None
        words = self.command_words(node)
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

    def command_words(self, node) -> list[Word] | None:
        """The name and arguments of a simple command (its redirections dropped), or None for another statement."""
        while node.type == "redirected_statement" and node.child_by_field_name("body") is not None:
            node = node.child_by_field_name("body")
        if node.type != "command":
            return None
        return [
            w
            for i, c in enumerate(node.children)
            if node.field_name_for_child(i) in ("name", "argument")
            for w in self.words(c)
        ]

    def variable(self, name: str, source: str, quoted: bool) -> list[Field]:
        if name in ("@", "*"):
            argv = self.frame.argv
            if quoted and name == "*":
                return [Field(merge([p for i, w in enumerate(argv) for p in ((" ",) if i else ()) + w.pieces]))]
            return [Field(list(w.pieces), (w.file, w.line, w.column)) for w in argv]
        if name == "#":
            return [Field([str(len(self.frame.argv))])]
        if name == "0":
            return [Field([str(self.frame.path)])]
        if name.isdigit():
            i = int(name) - 1
            return [Field(list(self.frame.argv[i].pieces))] if i < len(self.frame.argv) else self._split("", quoted)
        if name == "?":
            return [Field(["0"])]
        if name in ("$", "!", "-", "RANDOM", "SECONDS", "LINENO"):
            return [Field([Unknown("unsupported", source, "", 0, self.frame.file, "it changes from run to run")])]
        var = self.vars.get(name)
        if var is None:
            return [Field(list(self.lookup(name, source)))]
        if isinstance(var.value, list):
            return self._split(var.value[0].pieces if var.value else "", quoted)
        return self._split(var.value, quoted)

    def lookup(self, name: str, source: str) -> list[Piece]:
        var = self.vars.get(name)
        if var is not None:
            return list(flat(var.value))
        if name == "BASH_SOURCE":
            return [str(self.frame.path)]
        return [Unknown("env", source, name, 0, self.frame.file)]

    def _split(self, value: Any, quoted: bool) -> list[Field]:
        pieces = [value] if isinstance(value, str) else list(value)
        if quoted:
            return [Field(pieces)]
        fields: list[Field] = []
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
                        fields.append(Field(current))
                    current, started = [], False
                if part:
                    current.append(part)
                    started = True
        if started:
            fields.append(Field(current))
        return fields

    def expansion(self, node, quoted: bool) -> list[Field]:  # noqa: C901 - one branch per operator
        kids = [c for c in node.children if c.type not in ("${", "}")]
        prefix = ""
        if kids and kids[0].type in ("#", "!"):
            prefix = kids[0].type
            kids = kids[1:]
        if not kids:
            return [Field([""])]
        target, rest = kids[0], kids[1:]
        source = self.src(node)
        unsupported = [Field([Unknown("unsupported", source, "", self.line(node), self.frame.file)])]
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
                return [Field([str(len(items))])]
            if not rest:
                if quoted and index == "@":
                    return [Field(list(w.pieces), (w.file, w.line, w.column)) for w in items]
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
                else (var.value[0].pieces if isinstance(var.value, list) and var.value else flat(var.value))
            )
        if prefix == "#":
            if value is None:  # the environment's, or set by a command rlc does not run (`read -a V`)
                why = f"{name} is not set by the script"
                return [Field([Unknown("unsupported", source, "", self.line(node), self.frame.file, why)])]
            return [Field([str(len("".join(value)))])] if is_text(value) else unsupported  # type: ignore[arg-type]
        if not rest:
            if value is None:
                return [Field(list(self.lookup(name, source)))] if name not in ("@", "*") else []
            return self._split(value, quoted)
        op = rest[0].type
        operand = rest[1:]
        if node.has_error and quoted and target.type == "variable_name":
            recovered = self.recover_operand(node, target)
            if recovered is None:
                return unsupported
            op, operand = recovered
        empty = value is None or (is_text(value) and "".join(value) == "")  # type: ignore[arg-type]
        unset = value is None
        if op in (":-", "-", ":=", "=", ":?", "?", ":+", "+"):
            missing = empty if op.startswith(":") else unset
            saved = self.assigning
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
                    return [Field([u])]
                return self._split(value, quoted)
            return self._split(word, quoted) if not missing else []
        if value is None or not is_text(value):
            return [Field(list(value))] if value is not None else unsupported
        text = "".join(value)  # type: ignore[arg-type]
        pattern = "".join(p if isinstance(p, str) else "" for p in self.operand(operand, True))
        if op in ("#", "##", "%", "%%"):
            return [Field([_remove(text, pattern, op)])]
        if op == "^^":
            return [Field([text.upper()])]
        if op == ",,":
            return [Field([text.lower()])]
        if op == ":":
            nums = [n for n in (self.arith(o) for o in operand if o.is_named) if isinstance(n, int)]
            if nums and len(nums) == len([o for o in operand if o.is_named]):
                start = nums[0]
                end = None if len(nums) < 2 else start + nums[1] if nums[1] >= 0 else nums[1]
                return [Field([text[start:end]])]
        return unsupported

    def reparse(self, start: int, text: bytes, kind: str):
        """TEXT parsed as if written at byte START of the current file (so lines and columns stay right): the first
        node of type KIND in it, or None."""
        pad = bytes(b if b == 10 else 32 for b in self.frame.data[:start])
        tree = bash_parser().parse(pad + text)
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
        return merge(pieces)

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
            return self._arith_value(flat(var.value), text)
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
        if not is_text(value):
            return f"{source} is unknown"
        text = "".join(value).strip()  # type: ignore[arg-type]
        if re.fullmatch(r"[-+]?\d+", text or "0"):
            return int(text or "0")
        return f"{source} is not a number"


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


def join(left: list[Field], right: list[Field]) -> list[Field]:
    """Two adjacent expansions: the last word of the left and the first of the right are one word."""
    if not left:
        return right
    if not right:
        return left
    joined = Field(left[-1].pieces + right[0].pieces)
    if not left[-1].pieces:
        joined.origin = right[0].origin
    elif not right[0].pieces:
        joined.origin = left[-1].origin
    return [*left[:-1], joined, *right[1:]]


def merge(pieces: Iterable[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        elif p != "":
            out.append(p)
    return out


def flat(value: tuple[Piece, ...] | list[Word]) -> tuple[Piece, ...]:
    if isinstance(value, tuple):
        return value
    out: list[Piece] = []
    for i, w in enumerate(value):
        out += ([" "] if i else []) + list(w.pieces)
    return tuple(out)


def is_text(value: Any) -> bool:
    return all(isinstance(p, str) for p in value)


def bash_parser():
    # deferred: tree-sitter and its bash grammar (native libraries) load only when a launch script is read
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def _unescape(text: str) -> str:
    """An unquoted word as bash reads it: a backslash quotes the next character; a backslash-newline vanishes."""
    return re.sub(r"\\(\n|.)", lambda m: "" if m.group(1) == "\n" else m.group(1), text, flags=re.S)


def _unescape_dq(text: str) -> str:
    """Text inside double quotes: a backslash quotes only $ ` \" \\ and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)

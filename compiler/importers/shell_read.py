"""The statements of a launch script read statically: assignments, `export`, commands (a Python launch is recorded,
`bash`/`source` of another script is followed), `if`/`case`/`&&`/`||` on known values (an unknown condition is
read both ways, and what the ways leave different becomes unknown), `for` over words, functions."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

from rlc.compiler.importers.shell_expand import (
    Exit,
    Expander,
    Field,
    Frame,
    TooLong,
    Var,
    bash_parser,
    is_text,
    join,
    merge,
)
from rlc.compiler.importers.shell_words import (
    MAX_DEPTH,
    MAX_STEPS,
    NOT_BASH,
    NOT_STATIC,
    Launch,
    Piece,
    Unknown,
    Word,
    find_program,
    script_text,
    unknown_diagnostic,
)
from rlc.compiler.load import LoadError
from rlc.core.diagnostics import ERROR, WARNING, Location


class Reader(Expander):
    """A static reading of one launch script and the scripts it runs: the launches found, and the findings."""

    def run_file(self, text: str, file: str, path: Path, argv: list[Word], depth: int) -> None:
        data = text.encode("utf-8")
        tree = bash_parser().parse(data)
        outer = getattr(self, "frame", None)
        self.frame = Frame(file, path, data, data.split(b"\n"), argv, depth, outer.condition if outer else None)
        saved = self.swap_recovered([])
        try:
            try:
                self.block(tree.root_node.children)
            except TooLong:
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
            self.swap_recovered(saved)
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
            text = script_text(target, str(target))
        except LoadError as exc:
            self.diagnostics.append(exc.diagnostic)
            return False
        argv = words[1:] if not sourced or len(words) > 1 else self.frame.argv
        label = words[0].text  # the path as the script writes it
        if sourced:
            self.run_file(text, label, target, argv if len(words) > 1 else self.frame.argv, self.frame.depth + 1)
            return True
        saved_vars = self.swap_vars({k: v for k, v in self.vars.items() if v.exported})  # a child bash sees these
        try:
            self.run_file(text, label, target, argv, self.frame.depth + 1)
        except Exit:
            pass
        finally:
            self.swap_vars(saved_vars)
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
                self.swap_vars(saved)  # each part of a pipeline runs in a subshell
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
        if t == "compound_statement" and node.children and node.children[0].type == "((":
            inner = node.named_children
            value = self.arith(inner[0]) if len(inner) == 1 else None
            return bool(value) if isinstance(value, int) else None  # `(( expr ))`: true when not 0
        if t in ("compound_statement", "do_group"):
            return self.block(node.children)
        if t == "subshell":
            saved = dict(self.vars)
            try:
                return self.block(node.children)
            finally:
                self.swap_vars(saved)
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
        ends: list[dict[str, Var]] = []
        statuses: list[bool | None] = []
        exited = 0
        for run in runs:
            self.swap_vars(dict(start))
            self.frame.condition = outer or cond
            try:
                statuses.append(run())
                ends.append(self.vars)
            except Exit:
                exited += 1
        self.frame.condition = outer
        if not ends:
            self.swap_vars(start)
            raise Exit
        merged: dict[str, Var] = {}
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
            merged[key] = Var((replace(cond, name=key, source=f"${key}"),), exported)
        self.swap_vars(merged)
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

    def command(self, node) -> bool | None:
        if self.split_assignment(node):
            return True
        groups = self.glued(node)
        prefix = [g for g in groups if g[0].type == "variable_assignment"]
        words: list[Word] = []
        for g in groups[len(prefix) :]:
            fields: list[Field] = []
            for part in g:
                fields = join(fields, self.fields(part, quoted=False, arg=True))
            file, line, col = self.pos(g[0])
            words += [Word(tuple(merge(f.pieces)), *(f.origin or (file, line, col))) for f in fields]
        if len(prefix) == len(groups):
            for g in prefix:
                self.assign(g[0], g[1:])
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
                d = unknown_diagnostic(u, loc)
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
            raise Exit
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
            env = {k: "".join(v.value) for k, v in self.vars.items() if v.exported and is_text(v.value)}  # type: ignore[arg-type]
            for g in prefix:
                var_name, value = self.assignment_value(g[0], g[1:])
                if isinstance(value, tuple) and is_text(value):
                    env[var_name] = "".join(value)  # type: ignore[arg-type]
            file, ln, col = self.pos(node)
            self.launches.append(
                Launch(program, module, words[first:], file, ln, col, launcher, env, self.frame.condition)
            )
        return True

    def split_assignment(self, node) -> bool:
        """`X=$A/b/$C/$D`, one assignment to bash, which tree-sitter-bash may read as an assignment `X=$A/b/$`
        glued to a command `C/$D`: read again as the assignment it is (its value as double-quoted text, which an
        assignment's value is to bash: neither split nor globbed). False for any other command."""
        kids = [
            c for i, c in enumerate(node.children) if c.type == "variable_assignment" or node.field_name_for_child(i)
        ]
        if len(kids) != 2 or kids[0].type != "variable_assignment" or kids[1].type != "command_name":
            return False
        if kids[0].end_byte != kids[1].start_byte or kids[1].end_byte != node.end_byte:
            return False
        name, eq, value = node.text.partition(b"=")
        if not eq or not name.decode().isidentifier() or any(q in value for q in b"\"'\\`"):
            return False
        string = self.reparse(node.start_byte + len(name), b'"' + value + b'"', "string")
        if string is None:
            return False
        self.set(name.decode(), self.scalar(string, assigning=name.decode()))
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

    def glued(self, node) -> list[list]:
        """A simple command's assignments and words, those written together across a line continuation
        (`X='a'\\<newline>'b'`, which bash reads as one word and tree-sitter-bash as two) in one group."""
        groups: list[list] = []
        for i, c in enumerate(node.children):
            if c.type != "variable_assignment" and node.field_name_for_child(i) not in ("name", "argument"):
                continue
            if groups and self.frame.data[groups[-1][-1].end_byte : c.start_byte] == b"\\\n":
                groups[-1].append(c)
            else:
                groups.append([c])
        return groups

    def assignment_value(self, node, glued: Sequence = ()) -> tuple[str, tuple[Piece, ...] | list[Word]]:
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
        value = self.scalar(value_node, assigning=name)
        for part in glued:
            value += self.scalar(part, assigning=name)
        return name, tuple(merge(value))

    def assign(self, node, glued: Sequence = ()) -> str:
        name, value = self.assignment_value(node, glued)
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
                self.vars[name] = Var(items, old.exported if old else False)
            return name
        if appending and old is not None:
            if isinstance(value, list):
                base = old.value if isinstance(old.value, list) else [Word(old.value, *self.pos(node))]
                value = [*base, *value]
            elif isinstance(old.value, tuple):
                value = old.value + value
        if isinstance(value, tuple) and name in self.given and not is_text(value):
            value = (self.given[name],)  # --env stands for a value the script would compute
        self.set(name, value, old.exported if old else False)
        return name

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
            operand = [c for c in node.named_children if c != op_node]
            if op == "!":
                inner = self.truth(operand[0]) if operand else None
                return None if inner is None else not inner
            if not operand:
                return None
            value = self.scalar(operand[0])
            if not is_text(value):
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
            if not (is_text(lv) and is_text(rv)):
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
        return ("".join(value) != "") if is_text(value) else None  # type: ignore[arg-type]


def _nothing() -> bool | None:
    return True


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

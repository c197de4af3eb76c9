"""Load a YAML spec with ruamel.yaml round-trip, keeping the line and column of every key and value.

Everything a hostile or broken file can do is refused here with a diagnostic: oversize files, non-UTF-8
bytes, syntax errors, duplicate keys, unknown tags, alias bombs, and a top level that is no mapping. What is refused
for its size or shape (too large, too deep, too many values) is refused from the text, before the YAML parser runs:
ruamel.yaml spends seconds on a few KiB nested thousands deep, or on a MiB of one-line values.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import field
from functools import cached_property
from pathlib import Path
from typing import Any

from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import COMMAND_LINE, ERROR, Diagnostic, Location

MAX_BYTES = 1 << 20  # 1 MiB; real configs are tens of KiB
MAX_NODES = 100_000  # nodes after alias expansion (billion-laughs guard)
MAX_LINE = 20_000  # characters; the YAML scanner slows down badly on giant single lines
MAX_DEPTH = 200  # nested collections; real specs nest under 10 deep
STANDARD_TAGS = {
    None,
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}

Path_ = tuple  # a path into the document: keys (str) and list indices (int)


class LoadError(Exception):
    """The file cannot be read as a spec; carries the diagnostic."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass
class Document:
    """A loaded spec: the round-trip tree plus what is needed to point at any node of it."""

    name: str
    text: str
    data: Any  # ruamel CommentedMap
    overrides: dict[Path_, str] = field(default_factory=dict)  # path -> the override as typed
    legacy: bool = False

    @cached_property
    def lines(self) -> list[str]:  # read for every finding's source line: split once (the text is never replaced)
        return self.text.splitlines()

    def line_text(self, line: int) -> str | None:
        lines = self.lines
        return lines[line - 1] if 0 < line <= len(lines) else None

    def locate(self, path: Path_, key: bool = False) -> Location:
        """Where `path` is written: its key (key=True) or value; the nearest written ancestor if absent."""
        for n in range(len(path), 0, -1):
            if tuple(path[:n]) in self.overrides:
                return Location(COMMAND_LINE, 0, 0, self.overrides[tuple(path[:n])])
        node = self.data
        best: tuple[int, int] | None = None
        for i, part in enumerate(path):
            last = i == len(path) - 1
            pos = _child_pos(node, part, key and last)
            if pos is None:
                break
            best = pos
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                break
        if best is None:
            return Location(self.name, 0, 0)
        line, col = best[0] + 1, best[1] + 1
        return Location(self.name, line, col, self.line_text(line))


def _child_pos(node: Any, part: Any, key: bool) -> tuple[int, int] | None:
    lc = getattr(node, "lc", None)
    if lc is None:
        return None
    try:
        if isinstance(part, int):
            return lc.item(part)
        return (
            lc.key(part) if key or node[part] is None else lc.value(part)
        )  # an empty value has no position of its own
    except (KeyError, IndexError, TypeError, AttributeError):
        try:
            return (lc.line, lc.col) if part in node else None
        except TypeError:
            return None


def _yaml():
    # deferred: ruamel.yaml's round-trip loader, which the language server's libyaml parse does not need
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    y.preserve_quotes = True
    return y


def _diag(
    code: str, message: str, name: str, line: int = 0, col: int = 0, text: str | None = None, hint: str | None = None
) -> Diagnostic:
    return Diagnostic(code, ERROR, message, location=Location(name, line, col, text), hint=hint)


def read_text(path: Path, name: str | None = None) -> str:
    """The file's text, or LoadError for unreadable, oversize or non-UTF-8 files."""
    name = name or str(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise LoadError(_diag("RLC-E008", f"{name} is not a regular file", name))
        if size > MAX_BYTES:
            raise LoadError(
                _diag(
                    "RLC-E005",
                    f"file is {size} bytes; specs are limited to {MAX_BYTES} bytes",
                    name,
                    hint="a spec this large is almost certainly not a config; check the path",
                )
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise LoadError(_diag("RLC-E008", f"cannot read {name}: {exc.strerror or exc}", name)) from None
    return decode(raw, name)


def decode(raw: bytes, name: str) -> str:
    if len(raw) > MAX_BYTES:
        raise LoadError(_diag("RLC-E005", f"input is {len(raw)} bytes; specs are limited to {MAX_BYTES} bytes", name))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise LoadError(
            _diag(
                "RLC-E006",
                f"byte 0x{raw[exc.start]:02x} at offset {exc.start} is not valid UTF-8",
                name,
                line,
                col,
                hint="save the file as UTF-8",
            )
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    long = next((i for i, line in enumerate(text.splitlines(), 1) if len(line) > MAX_LINE), None)
    if long is not None:
        raise LoadError(
            _diag(
                "RLC-E005",
                f"line {long} is longer than {MAX_LINE} characters",
                name,
                long,
                1,
                hint="a spec line this long is almost certainly not a config; check the file",
            )
        )
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise LoadError(_diag("RLC-E006", "the file contains NUL bytes; it is not a text file", name, line, 1))
    return text


# In one line: a quoted scalar (which may hide brackets; it starts only where a value can, and may run on to later
# lines), a comment (after a blank only), or a bracket opening or closing a flow collection.
_FLOW = re.compile(
    r"""(?<![^\s\[{,:])(?P<q>["'])(?:(?<=")(?:[^"\\]|\\.)*(?P<dq>")?|(?<=')(?:[^']|'')*(?P<sq>')?)"""
    r"""|(?<!\S)#.*|[\[\]{}]"""
)
_CONTINUED = {'"': re.compile(r'(?:[^"\\]|\\.)*"'), "'": re.compile(r"(?:[^']|'')*'")}
_BLOCK_SCALAR = re.compile(r"(?:^|[\s:-])[|>][0-9+-]*\s*(?:#.*)?$")  # a header: its more-indented lines are text
_ITEMS = re.compile(r"(?:[-?](?:\s+|$))+")  # `- - x`: collections opened on one line
_COMMENT = re.compile(r"(?<!\S)#.*")
_NODE_MARKS = re.compile(r"[\[{,]|[-?:](?=\s)|\n")  # every value follows one of these


def prescan(text: str, name: str) -> None:
    """Refuse, from the text alone, a document nested deeper than MAX_DEPTH or holding more than MAX_NODES values,
    so that neither reaches the parser. Both are read in one pass as upper bounds of what the parser would build
    (within a factor of two), so no document the parser would accept is refused."""
    if len(_NODE_MARKS.findall(_COMMENT.sub("", text))) > MAX_NODES:
        raise LoadError(
            _diag(
                "RLC-E004",
                f"the document holds more than {MAX_NODES} values",
                name,
                hint="a spec this large is almost certainly not a config; check the file",
            )
        )
    indents: list[int] = []  # the block collections open at this line, by indentation
    flow = 0  # flow collections open ([ and {), across lines
    quoted = ""  # the quote of a quoted scalar that runs on past its line
    scalar_indent = -1  # a block scalar's header line's indentation, while its lines are read
    for number, line in enumerate(text.split("\n"), 1):
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        if scalar_indent >= 0:
            if not body.strip() or indent > scalar_indent:
                continue
            scalar_indent = -1
        if quoted:
            end = _CONTINUED[quoted].match(body)
            if end is None:
                continue
            body, indent, quoted = body[end.end() :], indent + end.end(), ""
        elif not flow and body.strip() and not body.startswith("#"):
            while indents and indents[-1] > indent:
                indents.pop()
            if not indents or indents[-1] < indent:
                indents.append(indent)
            items = _ITEMS.match(body)
            if len(indents) - 1 + (items.group(0).count("-") + items.group(0).count("?") if items else 0) > MAX_DEPTH:
                raise _too_deep(name, number, indent + 1, line)
        for token in _FLOW.finditer(body):
            t = token.group(0)
            if t in ("[", "{"):
                flow += 1
                if max(len(indents) - 1, 0) + flow > MAX_DEPTH:
                    raise _too_deep(name, number, indent + token.start() + 1, line)
            elif t in ("]", "}"):
                flow = max(flow - 1, 0)
            elif token.group("q") and not (token.group("dq") or token.group("sq")):
                quoted = token.group("q")
        if not flow and not quoted and not body.startswith("#") and _BLOCK_SCALAR.search(body):
            scalar_indent = indent


def _too_deep(name: str, line: int, col: int, text: str) -> LoadError:
    return LoadError(
        _diag(
            "RLC-E004",
            f"the document is nested more than {MAX_DEPTH} levels deep",
            name,
            line,
            col,
            text[:200],
            hint="a spec nests a few levels; check the file",
        )
    )


def parse(text: str, name: str, comments: bool = True) -> Any:
    """Parse YAML text into a round-trip tree; LoadError on any YAML-level problem. comments=False: the tree without
    its comments, parsed by libyaml where it can (`libyaml.py`), for what reads a spec only for its findings."""
    # deferred: ruamel.yaml's errors, as above
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    prescan(text, name)
    lines = text.splitlines()
    if not comments:
        from rlc.compiler import libyaml  # deferred: PyYAML's import costs about 10 ms, the language server's alone

        try:
            data = libyaml.load(text)
        except libyaml.Declined:
            pass  # ruamel's parser reads it, and words what is wrong with it
        else:
            _check_tags_and_size(data, name, lines)
            return data

    def at(mark) -> tuple[int, int, str | None]:
        if mark is None:
            return 0, 0, None
        line = mark.line + 1
        return line, mark.column + 1, lines[line - 1] if 0 < line <= len(lines) else None

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. a reused anchor: legal YAML, not the user's concern
            data = _yaml().load(text)
    except DuplicateKeyError as exc:
        line, col, src = at(exc.problem_mark)
        first = _first_occurrence(lines, exc, line, col)
        problem = (exc.problem or "duplicate key").replace("found duplicate key", "duplicate key")
        raise LoadError(
            _diag(
                "RLC-E002",
                problem,
                name,
                line,
                col,
                src,
                hint=f"remove one of the two (the first is on line {first})" if first else "remove one of the two",
            )
        ) from None
    except MarkedYAMLError as exc:
        line, col, src = at(exc.problem_mark)
        message = f"YAML syntax error: {exc.problem or exc.context or 'cannot parse'}"
        raise LoadError(_diag("RLC-E001", message, name, line, col, src)) from None
    except (
        YAMLError,
        TypeError,
        ValueError,
        LookupError,
        AttributeError,
    ) as exc:  # ruamel raises these for bad keys, dates, !!int etc.
        raise LoadError(_diag("RLC-E001", f"YAML error: {exc}", name)) from None
    except RecursionError:
        raise LoadError(_diag("RLC-E004", "the document is nested too deeply", name)) from None
    _check_tags_and_size(data, name, lines)
    return data


def _first_occurrence(lines: list[str], exc, line: int, col: int) -> int | None:
    """Line of the first of two duplicate keys: same key, same indentation, earlier in the mapping."""
    m = re.search(r'duplicate key "(.*?)"', exc.problem or "")
    if not m:
        return None
    start = exc.context_mark.line if exc.context_mark else 0
    pattern = re.compile(rf"^\s{{{max(col - 1, 0)}}}[\"']?{re.escape(m.group(1))}[\"']?\s*:")
    for n in range(start, line - 1):
        if pattern.match(lines[n]):
            return n + 1
    return None


def _check_tags_and_size(data: Any, name: str, lines: list[str]) -> None:
    # deferred: ruamel.yaml's node types, as above
    from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar

    sizes: dict[int, int] = {}

    def tag_of(node: Any) -> str | None:
        tag = getattr(node, "tag", None)
        return getattr(tag, "value", None) if tag is not None else None

    def visit(node: Any, parent: Any, part: Any, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise LoadError(_diag("RLC-E004", "the document is nested too deeply", name))
        if id(node) in sizes:
            return sizes[id(node)]
        tag = tag_of(node) if isinstance(node, (TaggedScalar, CommentedMap, CommentedSeq)) else None
        if isinstance(node, TaggedScalar) or tag not in STANDARD_TAGS:
            pos = _child_pos(parent, part, False) if parent is not None else None
            line, col = (pos[0] + 1, pos[1] + 1) if pos else (0, 0)
            raise LoadError(
                _diag(
                    "RLC-E003",
                    f"unknown YAML tag {tag}",
                    name,
                    line,
                    col,
                    lines[line - 1] if 0 < line <= len(lines) else None,
                    hint="specs use plain YAML values; remove the tag",
                )
            )
        total = 1
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(k, TaggedScalar):
                    pos = _child_pos(node, k, True)
                    line, col = (pos[0] + 1, pos[1] + 1) if pos else (0, 0)
                    raise LoadError(
                        _diag(
                            "RLC-E003",
                            f"unknown YAML tag {tag_of(k)} on a key",
                            name,
                            line,
                            col,
                            lines[line - 1] if 0 < line <= len(lines) else None,
                            hint="remove the tag",
                        )
                    )
                total += visit(v, node, k, depth + 1)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                total += visit(v, node, i, depth + 1)
        sizes[id(node)] = total
        if total > MAX_NODES:
            raise LoadError(
                _diag(
                    "RLC-E004",
                    f"the document expands to more than {MAX_NODES} nodes through aliases",
                    name,
                    hint="aliases that repeat aliases multiply; write the values out",
                )
            )
        return total

    visit(data, None, None, 0)


def load_document(path: str | Path, display: str | None = None) -> Document:
    """Read, decode and parse a spec file; LoadError unless its top level is a mapping."""
    p = Path(path)
    name = display or str(path)
    text = read_text(p, name)
    return document_from_text(text, name)


def document_from_text(text: str, name: str, comments: bool = True) -> Document:
    data = parse(text, name, comments)
    if data is None:
        raise LoadError(_diag("RLC-E007", "the spec is empty", name, hint="start from one of the files in examples/"))
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__} value"
        raise LoadError(
            _diag(
                "RLC-E007",
                f"the top level is {kind}; a spec is a mapping of sections",
                name,
                1,
                1,
                text.splitlines()[0] if text else None,
                hint="write `version: 1` and the sections as top-level keys",
            )
        )
    return Document(name, text, data)

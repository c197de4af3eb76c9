"""The one shape of an importer of a foreign config format (SkyRL's legacy YAML, AReaL's experiment configs): it
turns a loaded file into spec v1 text and reports every change it made, flagging those that alter what runs; and
what the importers of the formats share (each format's folder imports this module, never another format's).

`rlc migrate --from NAME` runs the importer of that name (the registry is rlc.compiler.importers.registry.IMPORTERS).
"""

from __future__ import annotations

import io
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from rlc.compiler.load import Document
from rlc.core.dataclass import dataclass
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

if TYPE_CHECKING:
    from rlc.compiler.importers.shell_words import Unknown, Word


@dataclass
class Change:
    """One thing an import did to a key: moved, changed, dropped, added (and the reason, when there is one)."""

    kind: str  # moved | transformed | dropped | reference | defaults | added
    old: str | None
    new: str | None
    line: int = 0
    old_value: Any = None
    new_value: Any = None
    reason: str = ""
    severity: str = "info"  # info | warning | error (error: behaviour would change)
    code: str = ""  # the finding's code when it is not the generic RLC-E020 / RLC-W020

    def describe(self) -> str:
        at = f" (line {self.line})" if self.line else ""
        if self.kind == "moved":
            return f"moved    {self.old}{at} -> {self.new}"
        if self.kind == "transformed":
            return (
                f"changed  {self.old}: {show_value(self.old_value)}{at} -> {self.new}: {show_value(self.new_value)}"
                + (f"  [{self.reason}]" if self.reason else "")
            )
        if self.kind == "dropped":
            return f"dropped  {self.old}{at}: {self.reason}"
        if self.kind == "reference":
            return f"rewrote  {self.old_value}{at} -> {self.new_value} (in {self.new})"
        if self.kind == "defaults":
            return f"removed  defaults{at}: {self.reason}"
        return f"added    {self.new}: {show_value(self.new_value)}" + (f"  [{self.reason}]" if self.reason else "")


def show_value(v: Any) -> str:
    """A value as a report line shows it: YAML's spelling of booleans and null, strings quoted."""
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    return str(v)


class NotImportable(Exception):
    """The file is not one this importer turns into spec v1 (the message says why); nothing is written."""


@dataclass
class Imported:
    """A foreign config as spec v1, and the report of how it got there."""

    text: str  # the spec v1 YAML
    title: str  # what was done, e.g. "legacy SkyRL YAML -> spec v1"
    changes: list[Change]
    lines: list[str]  # the report: a line a change, as printed
    alters: str  # the closing line of a report in which some change alters what runs

    @property
    def errors(self) -> list[Change]:
        return [c for c in self.changes if c.severity == "error"]


@dataclass
class ImportResult:
    """The spec v1 keys an import wrote, each with the foreign keys it came from, and the changes it reported."""

    spec: dict[str, Any]  # dotted spec path -> value, in writing order
    sources: dict[str, list[str]]  # dotted spec path -> the foreign keys it came from
    changes: list[Change] = field(default_factory=list)

    @property
    def errors(self) -> list[Change]:
        return [c for c in self.changes if c.severity == "error"]


def leaves(node: Any, prefix: str = ""):
    """(dotted path, value) of every leaf of nested mappings; an empty mapping is a leaf."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


def environment_reference(u: Unknown) -> str:
    """How a spec value spells a variable a launch script reads from the environment where the job runs (and a
    `$(date +FORMAT)`: the import's date, taken where it only names the run)."""
    if u.kind == "clock":
        return u.why
    return "${oc.env:" + u.name + "}" if u.kind == "env" else u.source


def names_run(word: Word, keys: frozenset[str]) -> bool:
    """Whether a `key=value` word sets one of `keys`: a value that names the run, its logs or its checkpoints, and
    changes nothing of what runs."""
    return word.text.split("=", 1)[0].lstrip("+~") in keys


class Importer(Protocol):
    name: str  # the value of `rlc migrate --from`
    what: str  # what it reads, as a message names it ("AReaL config")
    rewrites: bool  # True: the file is edited as it stands (--in-place, --check, --diff); False: a new spec is written

    def convert(self, doc: Document) -> Imported | None:
        """The file as spec v1 (None when it already is spec v1); raises NotImportable when it cannot be."""
        ...


def spec_text(spec: dict[str, Any], comments: dict[str, str], header: str) -> str:
    """Spec v1 YAML from dotted paths and values (in writing order), each value with its comment (where it came
    from), under a header comment."""
    root = CommentedMap()
    root["version"] = 1
    for section in ("name", "cluster", "launch", "data", "trainer", "generator", "environment"):
        if any(p == section or p.startswith(section + ".") for p in spec):
            root[section] = CommentedMap() if section != "name" else None
    for path, value in spec.items():
        *head, last = path.split(".")
        node = root
        for part in head:
            if not isinstance(node.get(part), CommentedMap):
                node[part] = CommentedMap()
            node = node[part]
        node[last] = value
        if comments.get(path):
            node.yaml_add_eol_comment(comments[path], last, column=_comment_column(len(head), last, value))
    root.yaml_set_start_comment(header)
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

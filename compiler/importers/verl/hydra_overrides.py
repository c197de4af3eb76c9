"""Hydra's command-line overrides, read and applied as Hydra applies them to a composed config.

An override is `key=value` (change a key the config has), `+key=value` (add a key it lacks), `++key=value` (add
or change), `~key` or `~key=value` (delete). Applying one that breaks Hydra's struct rules (change an absent
key, add a present one, delete an absent one) is an error with Hydra's words, which is what a verl user sees
when the job fails to start. Values follow Hydra's grammar: null, booleans, integers and floats, quoted strings,
`[...]` lists and `{k: v}` dicts, `${...}` interpolations (resolved after every override, as Hydra does), and
anything else as a string. A top-level comma is a multirun sweep, which a single job cannot take.
"""

from __future__ import annotations

import math
import re
from typing import Any

from rlc.core.dataclass import dataclass

_KEY = re.compile(r"^(~|\+\+|\+)?([A-Za-z0-9_./@\-\[\]]+)(?:=(.*))?$", re.DOTALL)
_INT = re.compile(r"^[+-]?(?:0|[1-9][0-9_]*)$")
_FLOAT = re.compile(
    r"^[+-]?(?:(?:[0-9][0-9_]*)?\.[0-9_]*(?:[eE][+-]?[0-9]+)?|[0-9][0-9_]*[eE][+-]?[0-9]+|inf|nan)$", re.I
)
_DICT_KEY = re.compile(r"(?:[A-Za-z0-9_\-./$*@ ]|\\.)+")  # Hydra's dict keys: names, with `\{` style escapes
_SWEEPS = ("choice", "range", "interval", "glob", "shuffle", "sort", "tag")


class OverrideError(ValueError):
    """An override Hydra would refuse (the message is Hydra's reason, in a user's words)."""


@dataclass(frozen=True)
class Override:
    """One override as written: its text, and the line of the file it came from (0 when none)."""

    text: str
    line: int = 0


@dataclass(frozen=True)
class Parsed:
    prefix: str  # "" change | "+" add | "++" add or change | "~" delete
    key: str
    value: Any
    has_value: bool
    source: Override


def parse(override: Override) -> Parsed:
    """One override string read as Hydra reads it; raises OverrideError for what Hydra's parser rejects."""
    text = override.text.strip()
    m = _KEY.match(text)
    if m is None or (m.group(1) != "~" and m.group(3) is None):
        raise OverrideError(f"{text!r} is not a Hydra override (key=value, +key=value, ++key=value or ~key)")
    prefix, key, raw = m.group(1) or "", m.group(2), m.group(3)
    if raw is None:
        return Parsed(prefix, key, None, False, override)
    return Parsed(prefix, key, value(raw, key), True, override)


def value(raw: str, key: str = "") -> Any:
    """A Hydra override value as the Python value Hydra makes of it."""
    reader = _Reader(raw.strip(), key)
    found = reader.element(top=True)
    reader.skip_space()
    if reader.pos != len(reader.text):
        raise OverrideError(f"cannot read the value of {key}: unexpected {reader.text[reader.pos :]!r}")
    return found


class _Reader:
    """A small recursive reader of Hydra's value grammar (primitives, quoted strings, lists, dicts)."""

    def __init__(self, text: str, key: str):
        self.text, self.pos, self.key = text, 0, key

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def element(self, top: bool = False) -> Any:
        self.skip_space()
        if self.pos >= len(self.text):
            return "" if top else None
        c = self.text[self.pos]
        if c == "[":
            return self._sequence("[", "]")
        if c == "{" and not self.text.startswith("${", self.pos):
            return self._mapping()
        if c in "'\"":
            return self._quoted(c)
        return self._primitive(top)

    def _sequence(self, open_: str, close: str) -> list:
        self.pos += 1
        items: list = []
        self.skip_space()
        if self.pos < len(self.text) and self.text[self.pos] == close:
            self.pos += 1
            return items
        while True:
            items.append(self.element())
            self.skip_space()
            if self.pos >= len(self.text):
                raise OverrideError(f"cannot read the value of {self.key}: {open_} without {close}")
            if self.text[self.pos] == ",":
                self.pos += 1
                continue
            if self.text[self.pos] == close:
                self.pos += 1
                return items
            raise OverrideError(f"cannot read the value of {self.key}: unexpected {self.text[self.pos]!r}")

    def _mapping(self) -> dict:
        self.pos += 1
        out: dict = {}
        self.skip_space()
        if self.pos < len(self.text) and self.text[self.pos] == "}":
            self.pos += 1
            return out
        while True:
            self.skip_space()
            m = _DICT_KEY.match(self.text, self.pos)
            if m is None:
                raise OverrideError(f"cannot read the value of {self.key}: a dict key is expected")
            self.pos = m.end()
            self.skip_space()
            if self.pos >= len(self.text) or self.text[self.pos] != ":":
                raise OverrideError(f"cannot read the value of {self.key}: ':' expected after {m.group(0)!r}")
            self.pos += 1
            out[re.sub(r"\\(.)", r"\1", m.group(0)).strip()] = self.element()
            self.skip_space()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
                continue
            if self.pos < len(self.text) and self.text[self.pos] == "}":
                self.pos += 1
                return out
            raise OverrideError(f"cannot read the value of {self.key}: {{ without }}")

    def _quoted(self, quote: str) -> str:
        self.pos += 1
        out = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "\\" and self.pos + 1 < len(self.text) and self.text[self.pos + 1] in (quote, "\\"):
                out.append(self.text[self.pos + 1])
                self.pos += 2
                continue
            if c == quote:
                self.pos += 1
                return "".join(out)
            out.append(c)
            self.pos += 1
        raise OverrideError(f"cannot read the value of {self.key}: an unclosed {quote} quote")

    def _primitive(self, top: bool) -> Any:
        start, depth = self.pos, 0
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if self.text.startswith("${", self.pos):
                depth += 1
                self.pos += 2
                continue
            if c == "}" and depth:
                depth -= 1
            elif c == "\\" and self.pos + 1 < len(self.text):
                self.pos += 2
                continue
            elif not depth and c in ",]}[{":
                if c == "," and top:
                    raise OverrideError(
                        f"{self.key}={self.text}: a comma makes it a Hydra multirun sweep, which one job cannot "
                        f"run; write {self.key}=[...] for a list or quote the value for a string"
                    )
                break
            self.pos += 1
        word = self.text[start : self.pos].strip()
        if "(" in word and word.split("(", 1)[0] in _SWEEPS:
            raise OverrideError(f"{self.key}={word}: a Hydra sweep function, which one job cannot run")
        return primitive(re.sub(r"\\(.)", r"\1", word))


def primitive(word: str) -> Any:
    low = word.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    if _INT.match(word):
        return int(word.replace("_", ""))
    if _FLOAT.match(word):
        number = float(word.replace("_", ""))
        return number if not math.isnan(number) else math.nan
    return word


# -- applying overrides to a composed config (a nested dict) -------------------------------------------------

MISSING = object()


def lookup(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def apply(tree: dict, parsed: Parsed) -> None:
    """Apply one override to `tree` in place by Hydra's rules; raises OverrideError as Hydra would fail."""
    key, here = parsed.key, lookup(tree, parsed.key)
    shown = parsed.source.text.strip()
    if parsed.prefix == "~":
        if here is MISSING or here is None:  # Hydra cannot tell a null from an absent key here
            raise OverrideError(f"Could not delete from config. '{key}' does not exist ({shown})")
        if parsed.has_value and parsed.value != here:
            raise OverrideError(
                f"Could not delete from config. The value of '{key}' is {here!r} and not {parsed.value!r}"
            )
        parent, last = _parent(tree, key, add=False)
        del parent[last]
        return
    if parsed.prefix == "" and here is MISSING:
        raise OverrideError(_not_in_struct(key, shown))
    if parsed.prefix == "+" and here is not MISSING and here is not None and not isinstance(parsed.value, (dict, list)):
        # Hydra appends over a null, and merges a dict or list value into what is there
        raise OverrideError(
            f"Could not append to config. An item is already at '{key}' ({shown}); write {shown[1:]} to change it"
        )
    parent, last = _parent(tree, key, add=parsed.prefix != "")
    if last not in parent and parsed.prefix == "":
        raise OverrideError(_not_in_struct(key, shown))
    if isinstance(parent.get(last), dict) and isinstance(parsed.value, dict):
        _merge(parent[last], parsed.value)  # Hydra merges a dict value into a dict node
    else:
        parent[last] = parsed.value


def _not_in_struct(key: str, shown: str) -> str:
    return (
        f"Could not override '{key}'. To append to your config use +{shown} (Key '{key.split('.')[-1]}' is not in "
        f"struct)"
    )


_REFERENCE = re.compile(r"^\$\{(?:oc\.select:)?([A-Za-z0-9_.]+)(?:,[^{}]*(?:\{\})?)?\}$")


def _parent(tree: dict, key: str, add: bool) -> tuple[dict, str]:
    """The section holding `key`'s last part. On the way, a value that references a section (`${a.b}`,
    `${oc.select:a.b,...}`) is that section, as OmegaConf follows it; any other value becomes an empty section, as
    OmegaConf.update makes it, whose keys only an added override can then set."""
    *head, last = key.split(".")
    node = tree
    for part in head:
        nxt = node.get(part)
        if isinstance(nxt, str) and (ref := _REFERENCE.match(nxt)):
            target = lookup(tree, ref.group(1))
            if isinstance(target, dict):
                nxt = target
        if not isinstance(nxt, dict):
            if part not in node and not add:
                raise OverrideError(f"'{key}' does not exist")
            nxt = node[part] = {}
        node = nxt
    return node, last


def _merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(into.get(k), dict) and isinstance(v, dict):
            _merge(into[k], v)
        else:
            into[k] = v


def resolve(tree: dict) -> dict:
    """Every `${...}` interpolation resolved (`oc.select` included), as verl's config reads after composition;
    raises OverrideError naming the interpolation that cannot resolve. A value `???` (mandatory) stays `???`.

    The forms verl's configs use (`${a.b}`, `${oc.select:a.b,default}`, text around them) are resolved here, with
    OmegaConf's rules, in a fraction of OmegaConf's time; anything else (another resolver, an escaped `\\${`)
    goes to OmegaConf itself."""
    try:
        return _Resolver(tree).node(tree, ())
    except _Unsupported:
        pass
    # deferred: omegaconf, only for an interpolation rlc's own resolver does not take
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True, throw_on_missing=False)
    except OmegaConfBaseException as exc:
        raise OverrideError(f"an interpolation cannot be resolved: {str(exc).splitlines()[0]}") from None
    assert isinstance(resolved, dict)
    return resolved


class _Unsupported(Exception):
    """An interpolation of a form only OmegaConf resolves."""


_INTERPOLATION = re.compile(r"\$\{")


class _Resolver:
    def __init__(self, tree: dict):
        self.tree = tree
        self.done: dict[tuple[str, ...], Any] = {}

    def node(self, value: Any, path: tuple[str, ...], chain: tuple = ()) -> Any:
        if isinstance(value, dict):
            return {k: self.node(v, (*path, str(k)), chain) for k, v in value.items()}
        if isinstance(value, list):
            return [self.node(v, (*path, str(i)), chain) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        if "\\${" in value:
            raise _Unsupported
        return self.text(value, chain, path[:-1])

    def text(self, value: str, chain: tuple, here: tuple[str, ...]) -> Any:
        parts: list[Any] = []
        pos = 0
        while (m := _INTERPOLATION.search(value, pos)) is not None:
            end = _closing(value, m.end())
            parts.append(value[pos : m.start()])
            parts.append(self.expression(value[m.end() : end], chain, here))
            pos = end + 1
        parts.append(value[pos:])
        parts = [p for p in parts if not (isinstance(p, str) and p == "")]
        if len(parts) == 1 and value.startswith("${") and value.endswith("}"):
            return parts[0]
        return "".join(p if isinstance(p, str) else str(p) for p in parts)

    def expression(self, body: str, chain: tuple, here: tuple[str, ...]) -> Any:
        body = body.strip()
        if body.startswith("oc.select:"):
            key, _, default = body[len("oc.select:") :].partition(",")
            found = self.key(_absolute(key.strip(), here), chain, required=False)
            if found is MISSING or found == "???":
                return self.literal(default.strip(), chain, here) if default else None
            return found
        if body.startswith("oc.env:"):  # the environment where the job runs: kept for it to resolve
            return "${" + body + "}"
        if ":" in body or not re.fullmatch(r"[A-Za-z0-9_.\-]+", body):
            raise _Unsupported
        return self.key(_absolute(body, here), chain, required=True)

    def key(self, key: str, chain: tuple, required: bool) -> Any:
        if key in chain:
            raise OverrideError(
                f"an interpolation cannot be resolved: {key} refers to itself through {' -> '.join(chain)}"
            )
        found = lookup(self.tree, key)
        if found is MISSING:
            if required:
                raise OverrideError(f"an interpolation cannot be resolved: Interpolation key '{key}' not found")
            return MISSING
        return self.node(found, tuple(key.split(".")), (*chain, key))

    def literal(self, text: str, chain: tuple, here: tuple[str, ...]) -> Any:
        if text.startswith("${"):
            return self.text(text, chain, here)
        if text in ("[]", "{}"):
            return [] if text == "[]" else {}
        if any(c in text for c in "[]{}'\""):
            raise _Unsupported
        return primitive(text)


def _absolute(key: str, here: tuple[str, ...]) -> str:
    """A key relative to the section holding the value (`.x` a sibling, `..x` an uncle) as an absolute one."""
    if not key.startswith("."):
        return key
    up = len(key) - len(key.lstrip("."))
    if up - 1 > len(here):
        raise _Unsupported
    return ".".join((*here[: len(here) - (up - 1)], key[up:]))


def _closing(text: str, start: int) -> int:
    """The index of the `}` that closes the interpolation whose body starts at `start`."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise _Unsupported

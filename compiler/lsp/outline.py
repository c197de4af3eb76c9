"""Where the cursor is in a spec, read from the lines' indentation alone: the dotted key a line sets and what the
cursor is typing. A spec being edited is often not YAML yet (half a key, a missing colon), so this never parses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rlc.core.dataclass import dataclass

# `  - name: value  # comment`: indentation, an optional list dash, the key, the rest of the line
_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<dash>-[ ]+)?(?P<key>[A-Za-z_][\w.\-]*|\"[^\"]*\"|'[^']*')[ ]*:(?=[ ]|$)")
# what may stand before the cursor while a key is being typed
_TYPING_KEY = re.compile(r"^(?P<indent>[ ]*)(?P<dash>-[ ]+)?(?P<word>[A-Za-z_][\w\-]*)?$")


@dataclass(frozen=True)
class KeyLine:
    """A line that sets a key: its 0-based line, the column of the key, the key, where its value starts."""

    line: int
    col: int
    key: str
    value_col: int  # the first column after `key:`


def key_line(lines: Sequence[str], n: int) -> KeyLine | None:
    if not 0 <= n < len(lines):
        return None
    m = _KEY.match(lines[n])
    if m is None:
        return None
    col = len(m["indent"]) + len(m["dash"] or "")
    return KeyLine(n, col, m["key"].strip("\"'"), m.end())


def parents(lines: Sequence[str], n: int, col: int) -> list[str]:
    """The keys of the mappings that hold a key written at line n, column col, outermost first."""
    out: list[str] = []
    for i in range(n - 1, -1, -1):
        if col == 0:
            break
        text = lines[i]
        stripped = text.lstrip(" ")
        if not stripped or stripped.startswith("#"):
            continue
        found = key_line(lines, i)
        indent = len(text) - len(stripped)
        if found is None:
            if indent < col and stripped.startswith("- "):
                col = indent  # an item of a list: its key is further up
            continue
        if found.col < col:
            out.append(found.key)
            col = found.col if not stripped.startswith("- ") else len(text) - len(stripped)
    return out[::-1]


def path_at(lines: Sequence[str], n: int) -> tuple[list[str], KeyLine] | None:
    """The dotted key line n sets (as parts) and the line, or None when it sets none."""
    found = key_line(lines, n)
    if found is None:
        return None
    return [*parents(lines, n, found.col), found.key], found


@dataclass(frozen=True)
class Typing:
    """What the cursor is writing: a key under `parent` (value None) or the value of the key `parent`."""

    parent: list[str]
    word: str  # what is typed of it so far
    start: int  # the column the word starts at
    value: bool  # True: a value of the key `parent`; False: a key of the mapping `parent`


def typing_at(lines: Sequence[str], n: int, col: int) -> Typing | None:
    """What is being typed at (line n, column col): a key of some mapping, or a scalar value of some key."""
    if not 0 <= n < len(lines):
        return Typing([], "", 0, False) if n == len(lines) and col == 0 else None
    before = lines[n][:col]
    m = _TYPING_KEY.match(before)
    if m is not None:
        at = len(m["indent"]) + len(m["dash"] or "")
        return Typing(parents(lines, n, at), m["word"] or "", at, False)
    found = key_line(lines, n)
    if found is not None and col >= found.value_col and "#" not in before[found.value_col :]:
        typed = before[found.value_col :]
        word = typed.lstrip(" ")
        return Typing([*parents(lines, n, found.col), found.key], word, col - len(word), True)
    return None


def siblings(lines: Sequence[str], n: int, col: int) -> set[str]:
    """The keys already written in the mapping that a key at (line n, column col) would join."""
    out: set[str] = set()
    for step in (-1, 1):
        i = n + step
        while 0 <= i < len(lines):
            text = lines[i]
            stripped = text.lstrip(" ")
            if stripped and not stripped.startswith("#"):
                indent = len(text) - len(stripped)
                if indent < col:
                    break
                found = key_line(lines, i)
                if found is not None and found.col == col:
                    out.add(found.key)
            i += step
    return out

"""A spec's round-trip tree from libyaml's parser (PyYAML's C extension), built by ruamel.yaml's composer and
constructor.

ruamel's own parser is pure Python: about 35 ms of CPU for a 300-line spec, most of what `rlc lsp` spends on an
edit. libyaml parses the same text into the same events in about 1 ms, and ruamel builds the tree from them as it
does from its own: the same values and types, every key's and value's line and column. Comments are not kept
(nothing that reads a spec for its findings looks at them). A text this path does not carry over (a tag, a
%-directive, a tab, a folded scalar, an empty value before a comment) or that either side refuses is `Declined`:
`load.parse` then reads it with ruamel alone, which words the error. Importing PyYAML costs about 10 ms, so only the
long-lived language server takes this path.
"""

from __future__ import annotations

import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml import events as rt
from ruamel.yaml.composer import Composer

try:
    from yaml import events as lib
    from yaml._yaml import CParser
except ImportError:  # PyYAML without its C extension: every text is declined
    CParser = None


class Declined(Exception):
    """This text is for ruamel's own parser: it has a tag or a directive, or libyaml or ruamel refused it."""


def load(text: str) -> Any:
    """The round-trip tree of `text` without its comments (None for an empty document), or Declined."""
    if CParser is None:
        raise Declined("PyYAML's C extension is not installed")
    y = YAML(typ="rt")
    y.allow_duplicate_keys = False
    y.preserve_quotes = True
    try:
        composer = _Composer(y, _Events(_events(text)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. a reused anchor, as load.parse ignores it
            node = composer.get_single_node()
            return None if node is None else y.constructor.construct_document(node)
    except Declined:
        raise
    except Exception as exc:  # noqa: BLE001 - any refusal: ruamel's parser reads the text again and words it
        raise Declined(str(exc)) from exc


def _events(text: str) -> list[rt.Event]:
    if "\t" in text:
        raise Declined("a tab: ruamel refuses some that libyaml takes")
    lines = text.splitlines()
    parser = CParser(text)
    out: list[rt.Event] = []
    empty = None  # the index of an empty mapping value, which ruamel marks where the next event starts
    while True:
        event = parser.get_event()
        if empty is not None:
            out[empty].start_mark = out[empty].end_mark = event.start_mark
            empty = None
        if isinstance(event, lib.ScalarEvent) and not event.style and not event.value:
            mark = event.start_mark
            line = lines[mark.line] if mark.line < len(lines) else ""
            if line[mark.column - 1 : mark.column] != ":" or line[mark.column :].strip():
                raise Declined("an empty value with a comment after it, or not a mapping's value")
            empty = len(out)
        out.append(_event(event))
        if isinstance(event, lib.StreamEndEvent):
            return out


def _event(e: Any) -> rt.Event:
    """libyaml's event as ruamel's own parser would give it (a plain scalar's style is None, not '')."""
    kind = type(e)
    if getattr(e, "tag", None) is not None or getattr(e, "version", None) is not None or getattr(e, "tags", None):
        raise Declined("a tag or a directive")
    if kind is lib.ScalarEvent:
        if e.style == ">":
            raise Declined("a folded scalar: ruamel keeps where its lines folded, for writing it back")
        return rt.ScalarEvent(e.anchor, None, e.implicit, e.value, e.start_mark, e.end_mark, style=e.style or None)
    if kind is lib.MappingStartEvent:
        return rt.MappingStartEvent(e.anchor, None, e.implicit, e.start_mark, e.end_mark, flow_style=e.flow_style)
    if kind is lib.SequenceStartEvent:
        return rt.SequenceStartEvent(e.anchor, None, e.implicit, e.start_mark, e.end_mark, flow_style=e.flow_style)
    if kind is lib.AliasEvent:
        return rt.AliasEvent(e.anchor, e.start_mark, e.end_mark)
    if kind is lib.DocumentStartEvent or kind is lib.DocumentEndEvent:
        return _SAME[kind](e.start_mark, e.end_mark, explicit=e.explicit)
    return _SAME[kind](e.start_mark, e.end_mark)


_SAME: dict[type, Any] = {}
if CParser is not None:
    _SAME = {
        lib.StreamStartEvent: rt.StreamStartEvent,
        lib.StreamEndEvent: rt.StreamEndEvent,
        lib.DocumentStartEvent: rt.DocumentStartEvent,
        lib.DocumentEndEvent: rt.DocumentEndEvent,
        lib.MappingEndEvent: rt.MappingEndEvent,
        lib.SequenceEndEvent: rt.SequenceEndEvent,
    }


class _Events:
    """The parser ruamel's composer reads events from."""

    def __init__(self, events: list[rt.Event]) -> None:
        self.events = events
        self.at = 0

    def check_event(self, *choices: type) -> bool:
        return self.at < len(self.events) and (not choices or isinstance(self.events[self.at], choices))

    def peek_event(self) -> rt.Event:
        return self.events[self.at]

    def get_event(self) -> rt.Event:
        self.at += 1
        return self.events[self.at - 1]


class _Composer(Composer):
    """ruamel's composer reading libyaml's events; its parser and resolver are plain attributes (ruamel looks them
    up through two properties per event)."""

    parser: Any = None
    resolver: Any = None

    def __init__(self, loader: YAML, events: _Events) -> None:
        super().__init__(loader)
        self.parser = events
        self.resolver = loader.resolver

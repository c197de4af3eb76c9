"""Diagnostics are data: a code, a severity, the key and place they concern, what is wrong and the fix."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, field
from typing import Any

from rlc.core.dataclass import dataclass

ERROR = "error"
WARNING = "warning"
INFO = "info"

COMMAND_LINE = "<command line>"


@dataclass(frozen=True)
class Location:
    file: str
    line: int  # 1-based; 0 when unknown
    col: int  # 1-based; 0 when unknown
    text: str | None = None  # the source line (or the override) shown under the message


@dataclass
class Diagnostic:
    code: str
    severity: str
    message: str
    key: str | None = None
    location: Location | None = None
    hint: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    related: list[str] = field(default_factory=list)  # other dotted keys the finding involves

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def to_json(self) -> dict:
        d = _finite(asdict(self))
        loc = d.pop("location")
        d["file"] = loc["file"] if loc else None
        d["line"] = loc["line"] if loc else None
        d["column"] = loc["col"] if loc else None
        return d


def _finite(value: Any) -> Any:
    """NaN and infinities as strings, so the JSON output is strict JSON."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def has_errors(diags: Iterable[Diagnostic]) -> bool:
    return any(d.is_error for d in diags)


def caret_width(text: str, col: int) -> int:
    """How many characters from `col` (1-based) a finding underlines: the token there, up to a comment."""
    rest = text[col - 1 :] if col > 0 else ""
    token = rest.split(" #", 1)[0].rstrip()
    return max(1, min(len(token), 60))


def render_text(diags: list[Diagnostic], color: bool = False) -> str:
    """Compiler-style text: header, location arrow, the source line with a caret, then the fix."""
    paint = _painter(color)
    out: list[str] = []
    for d in diags:
        head = paint(d.severity, f"{d.severity}[{d.code}]") + paint("bold", f": {d.message}")
        out.append(head)
        loc = d.location
        if loc is not None:
            where = loc.file if loc.line <= 0 else f"{loc.file}:{loc.line}:{loc.col}"
            out.append(f"  --> {where}")
            if loc.text is not None:
                num = str(loc.line) if loc.line > 0 else ""
                pad = " " * max(len(num), 1)
                out.append(f" {pad} |")
                out.append(f" {num.rjust(len(pad))} | {loc.text.rstrip()}")
                if loc.col > 0:
                    caret = " " * (loc.col - 1) + "^" * caret_width(loc.text, loc.col)
                    out.append(f" {pad} | " + paint(d.severity, caret))
        if d.key:
            out.append(f"   = key: {d.key}")
        if d.hint:
            out.append("   = " + paint("help", "help") + f": {d.hint}")
        out.append("")
    errors = sum(1 for d in diags if d.severity == ERROR)
    warnings = sum(1 for d in diags if d.severity == WARNING)
    if errors or warnings:
        out.append(f"{errors} error(s), {warnings} warning(s)")
    return "\n".join(out)


def render_json(diags: list[Diagnostic], **extra: Any) -> str:
    body = {
        "ok": not has_errors(diags),
        "errors": sum(1 for d in diags if d.severity == ERROR),
        "warnings": sum(1 for d in diags if d.severity == WARNING),
        "diagnostics": [d.to_json() for d in diags],
        **extra,
    }
    return json.dumps(body, indent=2, default=str, allow_nan=False)


def _painter(color: bool):
    codes = {"error": "31;1", "warning": "33;1", "info": "36;1", "help": "32;1", "bold": "1"}

    def paint(kind: str, text: str) -> str:
        if not color:
            return text
        return f"\x1b[{codes.get(kind, '0')}m{text}\x1b[0m"

    return paint

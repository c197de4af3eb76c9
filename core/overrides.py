"""`key=value` overrides from the command line: dotted keys, YAML-typed values."""

from __future__ import annotations

import re
from typing import Any

from rlc.core.dataclass import dataclass
from rlc.core.plain import plain_yaml

KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class OverrideError(Exception):
    """A malformed override: a usage error (exit 2), not a spec error."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Override:
    key: str
    value: Any
    text: str

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


def parse_override(text: str) -> Override:
    if text.startswith("+"):
        raise OverrideError(
            f"'{text}': the '+' prefix (add a new key) is not supported",
            hint="new fields come from an extension package (entry point group 'rlc.extensions'); see `rlc explain` and the README",
        )
    if text.startswith("~"):
        raise OverrideError(
            f"'{text}': deleting keys ('~') is not supported", hint="set the key to its default instead"
        )
    if "=" not in text:
        raise OverrideError(
            f"'{text}' is not an override", hint="write overrides as dotted.key=value, e.g. trainer.seed=7"
        )
    key, raw = text.split("=", 1)
    key = key.strip()
    if not KEY.match(key):
        raise OverrideError(f"'{key}' is not a dotted key", hint="keys look like trainer.policy.model.path")
    return Override(key, _yaml_value(raw, text), text)


def _yaml_value(raw: str, text: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    if raw.strip() == "":
        return None
    try:
        value = YAML(typ="safe", pure=True).load(raw)
    except YAMLError as exc:
        raise OverrideError(
            f"'{text}': the value is not valid YAML ({getattr(exc, 'problem', None) or exc})",
            hint="quote strings that contain YAML syntax, e.g. key='a: b'",
        ) from None
    except Exception as exc:  # the safe loader refuses tags and the like
        raise OverrideError(f"'{text}': the value cannot be read ({exc})") from None
    try:
        return plain_yaml(value)
    except RecursionError:
        raise OverrideError(f"'{text}': the value refers to itself (a recursive alias)") from None


def apply_overrides(doc, overrides: list[Override]) -> None:
    """Write the overrides into the round-trip tree, remembering where each came from."""
    from ruamel.yaml.comments import CommentedMap

    for ov in overrides:
        node = doc.data
        parts = ov.path
        for i, part in enumerate(parts[:-1]):
            child = node.get(part) if isinstance(node, dict) else None
            if child is None:
                child = CommentedMap()
                node[part] = child
            elif not isinstance(child, dict):
                raise OverrideError(
                    f"'{ov.text}': {'.'.join(parts[: i + 1])} is not a section, so it has no key {parts[i + 1]}"
                )
            node = child
        node[parts[-1]] = ov.value
        doc.overrides[parts] = ov.text

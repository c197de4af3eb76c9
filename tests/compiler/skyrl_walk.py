"""Print every field of the installed skyrl's SkyRLTrainConfig as JSON: [[dotted key, type, default], ...].

Run by tests/compiler/test_skyrl_release.py with the Python of a venv that has `skyrl` installed; it imports
nothing of rlc. A section typed `Optional[X]` is listed itself (default "<section>" or its default) and then
its fields; a field without a default has "<required>". A default SkyRL builds with `os.path.expanduser` is
printed as written (`~/ckpts/`), not as the running user's path.
"""

import dataclasses
import json
import os
import sys
import typing

from skyrl.train.config.config import SkyRLTrainConfig


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "<required>"


def _section(tp: object) -> type | None:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


HOME = os.path.expanduser("~")


def _unexpanded(value: object) -> object:
    """SkyRL's `os.path.expanduser("~/...")` defaults as written: `~/...`, whoever runs the walk."""
    if isinstance(value, str) and HOME not in ("", "/", "~") and value.startswith(HOME + os.sep):
        return "~" + value[len(HOME) :]
    if isinstance(value, list):
        return [_unexpanded(v) for v in value]
    if isinstance(value, dict):
        return {k: _unexpanded(v) for k, v in value.items()}
    return value


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return _unexpanded(value)


def walk(cls: type, prefix: str, out: list) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints.get(f.name, f.type), prefix + f.name
        sec = _section(tp)
        if sec is not None and sec is not tp:  # an optional section: the key itself, then its fields
            out.append([key, repr(tp), _plain(_default(f))])
        if sec is not None:
            walk(sec, key + ".", out)
        else:
            out.append([key, repr(tp).replace("typing.", ""), _plain(_default(f))])


if __name__ == "__main__":
    fields: list = []
    walk(SkyRLTrainConfig, "", fields)
    json.dump(fields, sys.stdout)

"""Write plain data as YAML text for tests (ruamel, block style)."""

import io

from ruamel.yaml import YAML


def dump(data) -> str:
    y = YAML(typ="safe", pure=True)
    y.default_flow_style = False
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()

"""No rule crashes on a spec the schema let through: the examples with their values mutated (edges of each
type, wrong types, interpolations) never yield the internal-error diagnostic a crashing rule becomes."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlc.compiler.check import INTERNAL_ERROR
from rlc.compiler.load import load_document
from rlc.compiler.pipeline import analyze
from rlc.core.overrides import OverrideError, parse_override
from rlc.core.plain import plain_yaml as to_plain
from rlc.spec.model import SpecModel

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def _leaves(data: object, prefix: str = "") -> list[str]:
    if not isinstance(data, dict):
        return [prefix] if prefix else []
    out: list[str] = []
    for key, value in data.items():
        out += _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    return out


LEAVES = {path: _leaves(to_plain(load_document(path).data)) for path in EXAMPLES}
MODEL_PATHS = sorted(SpecModel().paths())  # keys the examples leave at their defaults too
VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "-1",
            "1",
            "2",
            "3",
            "7",
            "1000000000",
            "0.0",
            "-0.5",
            "1e-30",
            "null",
            "true",
            "false",
            "''",
            "abc",
            "[]",
            "{}",
            "[1, 2]",
            "${trainer.seed}",
            "${oc.env:X}",
            "rlc:tiny",
            "fsdp2",
            "megatron",
            "none",
        ]
    ),
    st.integers(-3, 70000).map(str),
    st.floats(-10, 10, allow_nan=False).map(repr),
)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_examples_never_crash_a_rule(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(EXAMPLES))
    keys = data.draw(
        st.lists(st.sampled_from(LEAVES[path]) | st.sampled_from(MODEL_PATHS), min_size=1, max_size=3, unique=True)
    )
    try:
        overrides = [parse_override(f"{key}={data.draw(VALUES)}") for key in keys]
        analysis = analyze(path, overrides, env={})
    except OverrideError:  # e.g. a section set to a scalar and one of its keys: the CLI reports it as usage
        return
    crashed = [d.message for d in analysis.diagnostics if d.code == INTERNAL_ERROR]
    assert not crashed, (keys, [o.text for o in overrides], crashed)

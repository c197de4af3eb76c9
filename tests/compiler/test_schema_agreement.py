"""The committed JSON Schema (for editors) and rlc's own validator give the same verdict on any document."""

from __future__ import annotations

import copy

from conftest import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from rlc.compiler.load import document_from_text
from rlc.compiler.validate import validate
from rlc.core.plain import plain_yaml as to_plain
from rlc.spec.model import SpecModel
from rlc.spec.schema import committed_schema

MODEL = SpecModel()
ORACLE = Draft202012Validator(committed_schema())
BASE_TEXT = (EXAMPLES / "gsm8k-grpo-2node.yaml").read_text()
PATHS = sorted(MODEL.paths())

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(-2, 3, allow_nan=False),
    st.sampled_from(
        [
            "",
            "x",
            "H100",
            "grpo",
            "grpoo",
            "fsdp",
            "${trainer.seed}",
            "${oc.env:HOME}",
            "a b",
            "1abc",
            "vllm",
            "token",
            "none",
            "latest",
            "ray",
            "bf16",
            "rlc-job",
            "$(rm -rf /)",
        ]
    ),
    st.lists(st.sampled_from(["a", "B_1", "1", 3, None]), max_size=3),
    st.dictionaries(st.sampled_from(["A", "b_2", "3c", "x y"]), st.sampled_from(["v", 1, None]), max_size=2),
)


def _set(data: dict, path: str, value) -> None:
    parts = path.split(".")
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def _verdicts(data: dict) -> tuple[bool, bool]:
    doc = document_from_text(BASE_TEXT, "spec.yaml")
    diags, _ = validate(doc, data, MODEL)
    return ORACLE.is_valid(data), not diags


def test_examples_agree():
    for path in EXAMPLES.glob("*.yaml"):
        data = to_plain(document_from_text(path.read_text(), path.name).data)
        if "version" in data:
            assert _verdicts(data) == (True, True), path.name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=3),
    unknown=st.sampled_from([None, "trainer.seeed", "cluster.gpus", "generator.inference_engine.num_engine"]),
)
def test_random_edits_agree(edits, unknown):
    data = copy.deepcopy(to_plain(document_from_text(BASE_TEXT, "spec.yaml").data))
    for path, value in edits:
        _set(data, path, value)
    if unknown:
        _set(data, unknown, 1)
    oracle, ours = _verdicts(data)
    assert oracle == ours, f"jsonschema says {oracle}, rlc says {ours} for {edits} {unknown}"

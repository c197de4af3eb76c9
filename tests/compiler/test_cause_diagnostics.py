"""Placement diagnostics name their cause: a cluster-size error lists the roles and keys that add up to the
demand, and a colocation mismatch points at the key the user changed (an override, or a file line)."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES
from rlc.compiler.pipeline import analyze
from rlc.core.overrides import parse_override

BASE = "version: 1\ncluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 4}\n"
SPLIT = (
    BASE
    + """trainer:
  logger: console
  placement:
    colocate_all: false
    policy_num_nodes: 2
    policy_num_gpus_per_node: 8
generator:
  inference_engine:
    num_engines: 17
"""
)


def _diag(tmp_path, text: str, code: str, *overrides: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    analysis = analyze(path, [parse_override(o) for o in overrides], env={})
    hits = [d for d in analysis.diagnostics if d.code == code]
    assert len(hits) == 1, [(d.code, d.message) for d in analysis.diagnostics]
    return hits[0]


def _line_of(text: str, needle: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if needle in line)


def test_a_cluster_too_small_names_every_role_and_key_that_adds_up(tmp_path):
    d = _diag(tmp_path, SPLIT, "RLC-E204")
    assert d.message.startswith("the job needs 33 GPUs but the cluster has 4 x 8 = 32: ")
    assert "policy 16 = trainer.placement.policy_num_nodes 2 x policy_num_gpus_per_node 8" in d.message
    assert "+ inference engines 17 = generator.inference_engine.num_engines 17" in d.message
    assert (d.key, d.location.line) == ("cluster.num_nodes", 2)
    assert "raise cluster.num_nodes to 5" in d.hint and "shrink the inference engines" in d.hint
    terms = {t["role"]: (t["gpus"], t["keys"][0]) for t in d.values["terms"]}
    assert terms == {
        "policy": (16, "trainer.placement.policy_num_nodes"),
        "inference engines": (17, "generator.inference_engine.num_engines"),
    }
    assert {"trainer.placement.policy_num_gpus_per_node", "generator.inference_engine.num_engines"} <= set(d.related)


def test_an_override_that_overfills_the_cluster_is_the_location(tmp_path):
    d = _diag(tmp_path, SPLIT, "RLC-E204", "generator.inference_engine.tensor_parallel_size=2")
    assert d.key == "generator.inference_engine.tensor_parallel_size" and d.location.line == 0
    assert "num_engines 17 x tensor_parallel_size 2" in d.message
    assert d.message.endswith("generator.inference_engine.tensor_parallel_size = 2 (on the command line)")


def test_colocated_demand_is_the_largest_role_not_the_sum(tmp_path):
    text = BASE + "trainer:\n  logger: console\n  placement: {policy_num_nodes: 5, policy_num_gpus_per_node: 8}\n"
    text += "generator: {inference_engine: {num_engines: 40}}\n"
    d = _diag(tmp_path, text, "RLC-E204")
    assert "under colocate_all the roles share GPUs, so it needs the largest of policy 40" in d.message


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            "generator:\n  inference_engine:\n    tensor_parallel_size: 3\n",
            "generator.inference_engine.tensor_parallel_size",
        ),
        ("generator:\n  inference_engine:\n    num_engines: 3\n", "generator.inference_engine.num_engines"),
    ],
)
def test_a_colocation_mismatch_points_at_the_line_the_user_changed(tmp_path, body, key):
    text = BASE.replace("num_nodes: 4", "num_nodes: 1") + "trainer: {logger: console}\n" + body
    d = _diag(tmp_path, text, "RLC-E201")
    assert d.key == key
    assert d.location.line == _line_of(text, key.rsplit(".", 1)[1])
    assert f"{key} = 3 (in the file) makes them differ" in d.message


def test_a_colocation_mismatch_points_at_the_override_that_made_it(tmp_path):
    text = (EXAMPLES / "gsm8k-grpo-2node.yaml").read_text()
    d = _diag(tmp_path, text, "RLC-E201", "trainer.placement.policy_num_gpus_per_node=6")
    assert d.key == "trainer.placement.policy_num_gpus_per_node" and d.location.line == 0
    assert "policy_num_gpus_per_node = 6 (on the command line) makes them differ" in d.message
    assert "give the policy 16 GPUs" in d.hint
    ref = _diag(tmp_path, text, "RLC-E203", "trainer.placement.policy_num_gpus_per_node=6")
    assert ref.key == "trainer.placement.policy_num_gpus_per_node" and ref.location.line == 0


def test_a_shared_ref_layout_mismatch_blames_the_overridden_side(tmp_path):
    text = (
        BASE.replace("num_nodes: 4", "num_nodes: 1")
        + """trainer:
  logger: console
  placement:
    colocate_all: false
    policy_num_gpus_per_node: 4
    ref_num_gpus_per_node: 4
generator:
  inference_engine: {num_engines: 4}
"""
    )
    d = _diag(tmp_path, text, "RLC-E202", "trainer.placement.policy_num_gpus_per_node=2")
    assert d.key == "trainer.placement.policy_num_gpus_per_node" and d.location.line == 0
    assert "set policy_num_gpus_per_node back to 4" in d.hint
    d = _diag(tmp_path, text, "RLC-E202", "trainer.placement.ref_num_gpus_per_node=2")
    assert d.key == "trainer.placement.ref_num_gpus_per_node" and "set ref_num_gpus_per_node to 4" in d.hint

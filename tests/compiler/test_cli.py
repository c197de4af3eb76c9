"""The CLI as a user meets it: validate output, exit codes, overrides, schema and explain."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.spec.model import SpecModel
from rlc.spec.schema import build_schema, committed_schema


def test_examples_validate():
    for path in sorted(EXAMPLES.glob("*.yaml")):
        result = run_rlc("validate", str(path), env={"WANDB_API_KEY": "x"})
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        assert "Traceback" not in result.stderr


def test_all_problems_reported_at_once_with_source_and_caret(spec_file):
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          train_batch_size: 1000
          policy_mini_batch_size: 256
          algorithm:
            advantage_estimator: grpoo
          seeed: 3
        generator:
          sampling_params:
            temperature: hot
        """)
    result = run_rlc("validate", str(path))
    assert result.returncode == 1
    err = result.stderr
    for code in ("RLC-E010", "RLC-E012", "RLC-E011", "RLC-E105"):
        assert f"error[{code}]" in err, err
    assert f"--> {path}:8:3" in err  # seeed
    assert "did you mean trainer.seed?" in err
    assert "did you mean 'grpo'?" in err
    assert "  seeed: 3" in err and "^^^^^" in err


def test_json_format_has_the_same_findings(spec_file):
    path = spec_file("""
        version: 1
        trainer:
          train_batch_size: 100
          policy_mini_batch_size: 30
        """)
    result = run_rlc("validate", str(path), "--format", "json")
    body = json.loads(result.stdout)
    assert result.returncode == 1 and body["ok"] is False
    d = next(d for d in body["diagnostics"] if d["code"] == "RLC-E105")
    assert d["key"] == "trainer.policy_mini_batch_size" and d["line"] == 4 and d["column"] == 27
    assert d["hint"] and d["file"] == str(path)


def test_overrides_are_yaml_typed_and_located_on_the_command_line():
    ok = run_rlc(
        "validate",
        str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"),
        "trainer.seed=7",
        "generator.sampling_params.stop=['</answer>', '\\n\\n']",
        "trainer.logger=console",
    )
    assert ok.returncode == 0, ok.stderr
    bad = run_rlc(
        "validate",
        str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"),
        "trainer.train_batch_size=1000",
        "--format",
        "json",
        env={"WANDB_API_KEY": "x"},
    )
    d = next(d for d in json.loads(bad.stdout)["diagnostics"] if d["code"] == "RLC-E105")
    assert d["file"] == "<command line>"


def test_plus_override_is_refused_with_a_hint():
    result = run_rlc("validate", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "+trainer.my_new_key=1")
    assert result.returncode == 2
    assert "extension" in result.stderr and "Traceback" not in result.stderr


def test_malformed_override_is_a_usage_error():
    assert run_rlc("validate", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "trainer.seed").returncode == 2


def test_unsupported_version(spec_file):
    result = run_rlc("validate", str(spec_file("version: 7\n")), "--format", "json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["diagnostics"][0]["code"] == "RLC-E014"


def test_bad_reference_is_reported(spec_file):
    path = spec_file("""
        version: 1
        trainer:
          run_name: "${trainer.no_such_key}"
        """)
    result = run_rlc("validate", str(path), "--format", "json")
    d = json.loads(result.stdout)["diagnostics"]
    assert result.returncode == 1 and d[0]["code"] == "RLC-E016" and d[0]["line"] == 3


@pytest.mark.parametrize("target", ["${trainer.placement}", "${trainer.algorithm.eps_clip_low}"])
def test_reference_of_the_wrong_type_is_reported(spec_file, target):
    # A section, or a float where an int goes: a located error, not an internal error in the planner.
    path = spec_file(f"""
        version: 1
        trainer:
          placement:
            critic_num_gpus_per_node: "{target}"
        """)
    result = run_rlc("validate", str(path), "--format", "json")
    d = json.loads(result.stdout)["diagnostics"]
    assert result.returncode == 1, result.stderr
    assert [(x["code"], x["line"]) for x in d if x["severity"] == "error"] == [("RLC-E016", 4)]
    assert "takes int" in d[0]["message"]


def test_schema_command_prints_the_committed_schema():
    result = run_rlc("schema")
    assert result.returncode == 0
    printed = json.loads(result.stdout)
    assert printed["$schema"].endswith("2020-12/schema")
    assert "trainer" in printed["properties"]


def test_committed_schema_matches_the_model():
    assert build_schema(SpecModel()) == committed_schema(), "spec/schema is stale: run `make schema`"


def test_explain_leaf_section_and_unknown():
    leaf = run_rlc("explain", "trainer.algorithm.policy_loss_type")
    assert leaf.returncode == 0
    assert "accepted values: regular, dual_clip" in leaf.stdout and 'default: "regular"' in leaf.stdout
    assert "RLC-E304" in leaf.stdout
    section = run_rlc("explain", "trainer.placement")
    assert "colocate_all" in section.stdout and "RLC-E201" in section.stdout
    legacy = run_rlc("explain", "generator.num_inference_engines")
    assert legacy.returncode == 0 and "generator.inference_engine.num_engines" in legacy.stdout
    unknown = run_rlc("explain", "trainer.seeed")
    assert unknown.returncode == 2 and "trainer.seed" in unknown.stdout


def test_a_first_spec_gets_the_gpus_it_names(spec_file):
    """`cluster: {accelerator: H100:8}` with tensor_parallel_size 2 and no placement count: `rlc plan` lays out 8
    policy ranks and 4 engines and says so, where it refused with RLC-E201 (issue 49); `num_nodes: 1` plans the same."""
    text = """
        version: 1
        name: first
        cluster: {accelerator: "H100:8"%s}
        trainer: {logger: console, policy: {model: {path: Qwen/Qwen2.5-1.5B-Instruct}}}
        generator: {inference_engine: {tensor_parallel_size: 2}}
        """
    result = run_rlc("plan", str(spec_file(text % "")))
    assert result.returncode == 0, result.stderr
    assert "RLC-E201" not in result.stderr and "RLC-W202" not in result.stderr
    assert "info[RLC-I201]: cluster.num_nodes is unset and the spec sets no placement count" in result.stderr
    assert "= help: set cluster.num_nodes for more nodes" in result.stderr
    assert "first: 1 node(s) x 8 GPUs (H100), 8 of 8 in use" in result.stdout
    assert "policy  P0-P7  8 rank(s)" in result.stdout
    assert "inference (vllm): 4 engine(s) of tp 2" in result.stdout
    one_node = run_rlc("plan", str(spec_file(text % ", num_nodes: 1", "one-node.yaml")))
    assert one_node.stdout == result.stdout and "RLC-I201" not in one_node.stderr

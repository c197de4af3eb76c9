"""trainer.placement.allocation: AReaL-style strings resolve to the same plan as the counts they stand for."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_rlc
from hypothesis import given, settings
from hypothesis import strategies as st
from rlc.compiler import allocation
from rlc.compiler.pipeline import compile_job
from rlc.core.overrides import parse_override

BASE = """\
version: 1
name: alloc
cluster:
  accelerator: H100
  gpus_per_node: 8
  num_nodes: {nodes}
trainer:
{strategy}  logger: console
  placement:
{placement}
  algorithm:
    use_kl_loss: true
  train_batch_size: 64
  policy_mini_batch_size: 32
generator:
  n_samples_per_prompt: 4
  inference_engine:
{engine}
"""


def _spec(tmp_path, name, nodes=1, strategy="fsdp2", placement="", engine="", extra=""):
    text = BASE.format(
        nodes=nodes,
        strategy=f"  strategy: {strategy}\n" if strategy else "",
        placement=textwrap.indent(placement or "colocate_all: true", "    "),
        engine=textwrap.indent(engine or "backend: vllm", "    "),
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(text + extra, encoding="utf-8")
    return path


def _codes(result):
    return [d.code for d in result.diagnostics if d.severity == "error"]


SAME_PLANS = [
    (
        "disaggregated, tp 2",
        2,
        "fsdp2",
        "allocation: 'vllm:d4t2+fsdp:d8'",
        "colocate_all: false\npolicy_num_nodes: 1\npolicy_num_gpus_per_node: 8",
        "num_engines: 4\ntensor_parallel_size: 2",
    ),
    (
        "colocated",
        1,
        "fsdp2",
        'allocation: "vllm:d4t2|fsdp:d8"',
        "colocate_all: true\npolicy_num_nodes: 1\npolicy_num_gpus_per_node: 8",
        "num_engines: 4\ntensor_parallel_size: 2",
    ),
    (
        "policy over two nodes, ref apart",
        4,
        "fsdp2",
        "allocation: vllm:d8+fsdp[actor]:d16+fsdp[ref]:d8",
        "colocate_all: false\ncolocate_policy_ref: false\npolicy_num_nodes: 2\npolicy_num_gpus_per_node: 8\n"
        "ref_num_nodes: 1\nref_num_gpus_per_node: 8",
        "num_engines: 8",
    ),
]


@pytest.mark.parametrize("title,nodes,strategy,short,counts,engine", SAME_PLANS, ids=[c[0] for c in SAME_PLANS])
def test_allocation_and_counts_give_the_same_plan(tmp_path, title, nodes, strategy, short, counts, engine):
    a = compile_job(_spec(tmp_path, "short", nodes, strategy, short))
    b = compile_job(_spec(tmp_path, "counts", nodes, strategy, counts, engine))
    assert a.ok, [d.message for d in a.diagnostics]
    assert b.ok, [d.message for d in b.diagnostics]
    assert a.plan is not None and b.plan is not None
    assert a.plan.to_json() == b.plan.to_json()


def test_megatron_sizes_come_from_the_string(tmp_path):
    result = compile_job(_spec(tmp_path, "m", 1, "", "allocation: vllm:d4+megatron:d2t2"))
    assert result.ok, [d.message for d in result.diagnostics]
    t = result.analysis.spec.trainer
    assert t.strategy == "megatron"
    assert t.policy.megatron_config.tensor_model_parallel_size == 2
    assert (t.placement.policy_num_nodes, t.placement.policy_num_gpus_per_node) == (1, 4)
    assert result.analysis.resolution.derived["trainer.placement.policy_num_gpus_per_node"] == [
        "trainer.placement.allocation"
    ]


def _error_at(tmp_path, value: str):
    path = _spec(tmp_path, "bad", 1, "fsdp2", f'allocation: "{value}"')
    result = compile_job(path)
    errors = [d for d in result.diagnostics if d.key == "trainer.placement.allocation"]
    assert errors, [d.message for d in result.diagnostics]
    loc = errors[0].location
    assert loc is not None and loc.text is not None
    return errors[0].code, loc.text[loc.col - 1 :]


@pytest.mark.parametrize(
    "value,code,points_at",
    [
        ("vllm:d4+fsdp:d4t2", "RLC-E222", "t2"),
        ("sglang:d4+fsdp:d4", "RLC-E221", "sglang"),
        ("vllm:d4+fsdpp:d4", "RLC-E221", "fsdpp"),
        ("vllm.d4+d4", "RLC-E220", ".d4"),
        ("vllm:d4+", "RLC-E220", '"'),
        ("vllm:d0+fsdp:d4", "RLC-E222", "d0"),
        ("vllm:d4+fsdp[critc]:d4", "RLC-E223", "critc"),
        ("vllm:d4+fsdp:d2+megatron[critic]:d2", "RLC-E224", "megatron"),
        ("vllm:d4|fsdp:d8", "RLC-E225", "vllm"),
        ("vllm:d4+fsdp:d12", "RLC-E226", "fsdp:d12"),
        ("vllm:d4+megatron:(attn:d1t4|ffn:d1e4)", "RLC-E220", "(attn"),
    ],
)
def test_errors_point_into_the_string(tmp_path, value, code, points_at):
    got_code, rest = _error_at(tmp_path, value)
    assert got_code == code
    assert rest.startswith(points_at)


def test_a_conflicting_count_is_an_error_and_an_equal_one_is_not(tmp_path):
    bad = compile_job(_spec(tmp_path, "c1", 1, "fsdp2", "allocation: vllm:d4+fsdp:d4\npolicy_num_gpus_per_node: 2"))
    conflict = [d for d in bad.diagnostics if d.code == "RLC-E227"]
    assert conflict and conflict[0].key == "trainer.placement.policy_num_gpus_per_node"
    assert conflict[0].location is not None and "policy_num_gpus_per_node" in (conflict[0].location.text or "")
    fine = compile_job(_spec(tmp_path, "c2", 1, "fsdp2", "allocation: vllm:d4+fsdp:d4\npolicy_num_gpus_per_node: 4"))
    assert fine.ok, [d.message for d in fine.diagnostics]


def test_an_override_error_points_into_the_command_line(tmp_path):
    path = _spec(tmp_path, "o", 1, "fsdp2", "colocate_all: false")
    result = compile_job(path, [parse_override("trainer.placement.allocation=vllm:d4+fsdp:d4t2")])
    (err,) = [d for d in result.diagnostics if d.key == "trainer.placement.allocation"]
    assert err.location is not None and err.location.text is not None
    assert err.location.text[err.location.col - 1 :].startswith("t2")


def test_cli_validate_and_explain(tmp_path):
    bad = _spec(tmp_path, "cli", 1, "fsdp2", "allocation: 'vllm:d4+fsdp:d4t2'")
    out = run_rlc("validate", str(bad))
    assert out.returncode == 1
    assert "RLC-E222" in out.stderr and "^^" in out.stderr
    explained = run_rlc("explain", "trainer.placement.allocation")
    assert explained.returncode == 0
    assert 'group ( "+" group )*' in explained.stdout and "RLC-E227" in explained.stdout
    assert "rlc addition" in explained.stdout


def test_an_idle_ref_or_critic_component_is_a_warning(tmp_path):
    spec = _spec(tmp_path, "w", 4, "", "allocation: vllm:d8+fsdp[actor]:d8+fsdp[ref]:d8+fsdp[critic]:d8")
    spec.write_text(spec.read_text().replace("use_kl_loss: true", "use_kl_loss: false"))
    result = compile_job(spec)
    warned = {d.code: d for d in result.diagnostics if d.code in ("RLC-W220", "RLC-W221")}
    assert set(warned) == {"RLC-W220", "RLC-W221"}
    loc = warned["RLC-W221"].location
    assert loc is not None and loc.text is not None and loc.text[loc.col - 1 :].startswith("fsdp[critic]")


TOKENS = ["vllm", "fsdp", "megatron", "sglang", ":", ".", "+", "|", "(", "[ref]", "[critic]", "[actor]", " "]
TOKENS += ["d4", "d2", "t2", "p2", "c2", "e2", "d0", "d16", "attn:d1"]


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="vlmfsdpgtrceaon0123456789[]:+|() ._", max_size=30),
        st.lists(st.sampled_from(TOKENS), max_size=9).map("".join),
    ),
    st.sampled_from([None, 1, 8]),
)
def test_any_string_parses_or_is_a_located_error(text, per_node):
    try:
        found = allocation.settings(allocation.parse(text), "fsdp2", per_node)
    except allocation.AllocationError as exc:
        assert exc.code in allocation.CODES and 0 <= exc.offset <= len(text)
    else:
        assert all(isinstance(v, (int, bool, str)) for v in found.values())

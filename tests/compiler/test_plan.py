"""`rlc plan`: where every role and engine runs, the Ray placement groups, and when the job does not fit."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from conftest import EXAMPLES, run_rlc
from hypothesis import given, settings
from hypothesis import strategies as st
from rlc.compiler.plan import plan
from rlc.spec.root import RlcSpec


def plan_json(path, *overrides, cwd):
    result = run_rlc("plan", str(path), *overrides, "--format", "json", cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def role(body, name):
    return next(r for r in body["roles"] if r["name"] == name)


def group(body, name):
    return next(g for g in body["placement_groups"] if g["name"] == name)


def gpus_of(r):
    return [(x["node"], x["gpu"]) for x in r["ranks"]]


def assert_engines_whole(body):
    """Each engine's GPUs are consecutive node-major, and on one node whenever it fits one."""
    per = body["cluster"]["gpus_per_node"]
    for e in body["inference"]["engines"]:
        flat = [n * per + g for n, g in e["gpus"]]
        assert flat == list(range(flat[0], flat[0] + len(flat))), e
        if len(flat) <= per:
            assert len(e["nodes"]) == 1 and not e["spans_nodes"] and not e["tp_spans_nodes"], e


def test_colocate_all_one_node_shares_every_gpu(tmp_path):
    body = plan_json(EXAMPLES / "gsm8k-grpo-8xh100.yaml", cwd=tmp_path)
    assert body["format"] == "rlc-plan" and body["version"] == 1 and body["fits"] is True
    assert body["cluster"] == {"nodes": 1, "gpus_per_node": 8, "accelerator": "H100", "device": "GPU"}
    [pg] = body["placement_groups"]
    assert pg["name"] == "colocate" and pg["strategy"] == "PACK" and pg["num_bundles"] == 8
    assert pg["bundle"] == {"GPU": 1, "CPU": 1}
    assert [(b["node"], b["gpus"]) for b in pg["bundles"]] == [(0, [g]) for g in range(8)]
    for name in ("policy", "ref"):
        r = role(body, name)
        assert r["world_size"] == 8 and r["placement_group"] == "colocate"
        assert (r["num_gpus"], r["num_cpus"]) == (0.2, 0.2)
        assert [(x["rank"], x["node"], x["gpu"], x["bundle"]) for x in r["ranks"]] == [(k, 0, k, k) for k in range(8)]
    assert [r["name"] for r in body["roles"]] == ["policy", "ref"]  # no critic without critic.model.path
    inf = body["inference"]
    assert inf["worker"]["num_gpus"] == 0.2 and inf["server_actor"] == {"num_gpus": 0, "num_cpus": 0.2}
    assert [e["gpus"] for e in inf["engines"]] == [[[0, g]] for g in range(8)]


def test_colocate_all_two_nodes_tp2_engines_stay_on_their_node(tmp_path):
    body = plan_json(EXAMPLES / "gsm8k-grpo-2node.yaml", cwd=tmp_path)
    every = {(n, g) for n in range(2) for g in range(8)}
    assert set(gpus_of(role(body, "policy"))) == every == set(gpus_of(role(body, "ref")))
    assert gpus_of(role(body, "policy"))[8] == (1, 0)  # node-major: rank 8 opens node 1
    engines = body["inference"]["engines"]
    assert len(engines) == 8 and all(e["tp"] == 2 for e in engines)
    assert [e["bundles"] for e in engines] == [[2 * i, 2 * i + 1] for i in range(8)]
    assert_engines_whole(body)


def test_an_engine_skips_a_node_remainder_instead_of_straddling(spec_file, tmp_path):
    # 6-GPU nodes and TP=4: the second engine must open node 1, not take 4-5 of node 0 and 0-1 of node 1.
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 6, num_nodes: 2}
        trainer:
          placement: {policy_num_nodes: 2, policy_num_gpus_per_node: 4}
          algorithm: {use_kl_loss: false}
          train_batch_size: 64
          policy_mini_batch_size: 32
        generator:
          inference_engine: {tensor_parallel_size: 4, num_engines: 2}
        """)
    body = plan_json(path, cwd=tmp_path)
    assert [e["gpus"] for e in body["inference"]["engines"]] == [[[0, g] for g in range(4)], [[1, g] for g in range(4)]]
    assert gpus_of(role(body, "policy")) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]


def test_non_colocated_policy_ref_group_critic_group_and_inference_group(spec_file, tmp_path):
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 2}
        trainer:
          placement: {colocate_all: false, policy_num_nodes: 1, policy_num_gpus_per_node: 4,
                      critic_num_nodes: 1, critic_num_gpus_per_node: 8}
          critic: {model: {path: Qwen/Qwen2.5-0.5B}}
          algorithm: {advantage_estimator: gae, use_kl_loss: true}
          train_batch_size: 64
          policy_mini_batch_size: 16
          critic_mini_batch_size: 16
        generator:
          inference_engine: {tensor_parallel_size: 2, num_engines: 2}
        """)
    body = plan_json(path, cwd=tmp_path)
    pr, critic, inf = group(body, "policy_ref"), group(body, "critic"), group(body, "inference")
    assert pr["bundle"] == {"GPU": 4, "CPU": 4} and pr["num_bundles"] == 1 and pr["strategy"] == "PACK"
    assert (
        critic["bundle"] == {"GPU": 8, "CPU": 8} and inf["bundle"] == {"GPU": 1, "CPU": 1} and inf["num_bundles"] == 4
    )
    for pg in (pr, critic):  # a whole-node bundle never crosses nodes
        assert all(len(b["gpus"]) == pg["bundle"]["GPU"] for b in pg["bundles"])
    policy, ref, crit = role(body, "policy"), role(body, "ref"), role(body, "critic")
    assert (policy["num_gpus"], ref["num_gpus"], crit["num_gpus"]) == (0.75, 0.25, 1)
    assert policy["placement_group"] == ref["placement_group"] == "policy_ref"
    assert gpus_of(policy) == gpus_of(ref) and {x["bundle"] for x in policy["ranks"]} == {0}
    engine_gpus = {tuple(g) for e in body["inference"]["engines"] for g in e["gpus"]}
    training = set(gpus_of(policy)) | set(gpus_of(crit))
    assert not engine_gpus & training and len(training) == 12 and len(engine_gpus) == 4
    assert body["inference"]["worker"]["num_gpus"] == 1
    assert_engines_whole(body)


def test_separate_models_each_get_their_own_group_or_none(spec_file, tmp_path):
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 4, num_nodes: 2}
        trainer:
          placement: {colocate_all: false, colocate_policy_ref: false, policy_num_nodes: 1, policy_num_gpus_per_node: 4,
                      ref_num_nodes: 2, ref_num_gpus_per_node: 1}
          algorithm: {use_kl_loss: true}
          train_batch_size: 64
          policy_mini_batch_size: 16
        generator:
          inference_engine: {num_engines: 2}
        """)
    body = plan_json(path, cwd=tmp_path)
    policy, ref = role(body, "policy"), role(body, "ref")
    assert policy["placement_group"] == "policy" and group(body, "policy")["bundle"] == {"GPU": 4, "CPU": 4}
    assert ref["placement_group"] is None and all(
        x["bundle"] is None for x in ref["ranks"]
    )  # 1 GPU per node: Ray places them
    assert (policy["num_gpus"], ref["num_gpus"]) == (1, 1)
    used = gpus_of(policy) + gpus_of(ref) + [tuple(g) for e in body["inference"]["engines"] for g in e["gpus"]]
    assert len(used) == len(set(used)) == 8


def test_tp16_engine_spans_two_8_gpu_nodes(spec_file, tmp_path):
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 4}
        trainer:
          train_batch_size: 64
          policy_mini_batch_size: 32
        generator:
          inference_engine: {tensor_parallel_size: 16}
        """)
    body = plan_json(path, cwd=tmp_path)
    engines = body["inference"]["engines"]
    assert [e["nodes"] for e in engines] == [[0, 1], [2, 3]]
    assert all(e["spans_nodes"] and e["tp_spans_nodes"] for e in engines)
    assert_engines_whole(body)


def test_cpu_only_spec_gets_cpu_bundles(tmp_path):
    body = plan_json(EXAMPLES / "local-cpu.yaml", cwd=tmp_path)
    assert body["cluster"]["device"] == "CPU" and body["cluster"]["accelerator"] == "none"
    assert all(pg["bundle"] == {"CPU": 1} for pg in body["placement_groups"])
    policy = role(body, "policy")
    assert policy["num_gpus"] == 0 and policy["num_cpus"] == 0.2
    assert body["inference"]["worker"]["num_gpus"] == 0 and body["inference"]["backend"] == "hf"


def test_remote_engines_take_no_gpus(spec_file, tmp_path):
    path = spec_file("""
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          placement: {colocate_all: false}
          train_batch_size: 64
          policy_mini_batch_size: 32
        generator:
          inference_engine: {run_engines_locally: false, remote_urls: ["10.0.0.1:8000", "10.0.0.2:8000"]}
        """)
    body = plan_json(path, cwd=tmp_path)
    inf = body["inference"]
    assert inf["local"] is False and inf["engines"] == [] and inf["placement_group"] is None
    assert [(r["url"], r["kind"]) for r in inf["remote_engines"]] == [
        ("10.0.0.1:8000", "server"),
        ("10.0.0.2:8000", "server"),
    ]
    assert [pg["name"] for pg in body["placement_groups"]] == ["policy_ref"]
    table = run_rlc("plan", str(path), cwd=tmp_path)
    assert table.returncode == 0 and "E0" not in table.stdout and "10.0.0.2:8000" in table.stdout


FRAGMENTED = """
    version: 1
    cluster: {gpus_per_node: 8, num_nodes: 2}
    trainer:
      placement: {colocate_all: false, policy_num_nodes: 1, policy_num_gpus_per_node: 6,
                  critic_num_nodes: 1, critic_num_gpus_per_node: 6}
      critic: {model: {path: Qwen/Qwen2.5-0.5B}}
      algorithm: {advantage_estimator: gae, use_kl_loss: false}
      train_batch_size: 96
      policy_mini_batch_size: 24
      critic_mini_batch_size: 24
    generator:
      inference_engine: {tensor_parallel_size: 4, num_engines: 1}
    """


def test_a_layout_larger_than_the_cluster_is_rlc_e210(spec_file, tmp_path):
    # 16 GPUs asked of 16, but after two 6-GPU whole-node bundles no node has 4 GPUs left for the engine.
    path = spec_file(FRAGMENTED)
    checked = run_rlc("validate", str(path))  # validate plans too: "valid" means it places
    assert checked.returncode == 1 and "error[RLC-E210]" in checked.stderr
    text = run_rlc("plan", str(path), cwd=tmp_path)
    assert text.returncode == 1 and "error[RLC-E210]" in text.stderr and "engine 0" in text.stderr
    assert "needs 3 node(s)" in text.stderr and "raise cluster.num_nodes to 3" in text.stderr
    assert not (tmp_path / "build").exists()
    body = json.loads(run_rlc("plan", str(path), "--format", "json", cwd=tmp_path).stdout)
    [d] = [d for d in body["diagnostics"] if d["code"] == "RLC-E210"]
    assert d["key"] == "cluster.num_nodes" and d["line"] == 2 and d["values"] == {"nodes_needed": 3, "missing": 4}


def test_a_derived_cluster_holds_whole_engines(spec_file, tmp_path):
    # 3 policy GPUs + 3 engines of TP=2 on 3-GPU nodes: one engine per node, so 4 nodes, not ceil(9/3) = 3.
    path = spec_file("""
        version: 1
        trainer:
          placement: {colocate_all: false, policy_num_nodes: 1, policy_num_gpus_per_node: 3}
          algorithm: {use_kl_loss: false}
          train_batch_size: 96
          policy_mini_batch_size: 24
        generator:
          inference_engine: {tensor_parallel_size: 2, num_engines: 3}
        """)
    result = run_rlc("plan", str(path), "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["cluster"]["nodes"] == 4 and body["fits"]
    assert all(not e["spans_nodes"] for e in body["inference"]["engines"])


def test_spec_errors_stop_before_planning(spec_file, tmp_path):
    path = spec_file("version: 1\ncluster: {gpus_per_node: 8, num_nodes: 1}\ntrainer: {train_batch_size: 1000}\n")
    result = run_rlc("plan", str(path), cwd=tmp_path)
    assert result.returncode == 1 and "RLC-E105" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "build").exists()


def test_json_and_svg_are_the_same_bytes_every_time(tmp_path):
    spec = EXAMPLES / "gsm8k-grpo-2node.yaml"
    runs = [
        run_rlc("plan", str(spec), "--format", "json", "--svg", str(tmp_path / f"{i}.svg"), cwd=tmp_path)
        for i in range(2)
    ]
    assert runs[0].returncode == 0 and runs[0].stdout == runs[1].stdout
    assert (tmp_path / "0.svg").read_bytes() == (tmp_path / "1.svg").read_bytes()


def test_table_and_well_formed_svg_at_the_default_path(tmp_path):
    result = run_rlc("plan", str(EXAMPLES / "gsm8k-grpo-2node.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1"]
    assert "P0 R0 E0.0" in result.stdout and "P15 R15 E7.1" in result.stdout
    svg = tmp_path / "build" / "gsm8k-grpo-2node" / "plan.svg"
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "P0" in texts and "E7.1" in texts and "node 1" in texts


def test_big_clusters_are_summarised(tmp_path):
    result = run_rlc(
        "plan",
        str(EXAMPLES / "gsm8k-grpo-2node.yaml"),
        "cluster.num_nodes=64",
        "trainer.train_batch_size=4096",
        "trainer.policy_mini_batch_size=1024",
        "trainer.micro_train_batch_size_per_gpu=1",
        "--svg",
        str(tmp_path / "big.svg"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\nmemory (")[0]  # the memory and time sections follow, a few lines each
    assert len(table.splitlines()) < 35 and "52 nodes (8-59) left out" in result.stdout
    assert "P511 R511 E255.1" in result.stdout
    ET.parse(tmp_path / "big.svg")


def test_unwritable_svg_path_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    result = run_rlc(
        "plan", str(EXAMPLES / "local-cpu.yaml"), "--svg", str(tmp_path / "file" / "plan.svg"), cwd=tmp_path
    )
    assert result.returncode == 2 and "--svg" in result.stderr and "Traceback" not in result.stderr


# -- the planner alone, over many layouts ----------------------------------------------------------------


def spec_of(nodes, per, colocate, share_ref, ref, critic, tp, pp, engines, model_nodes, model_gpn):
    s = RlcSpec()
    s.cluster.gpus_per_node, s.cluster.num_nodes = per, nodes
    p, ie = s.trainer.placement, s.generator.inference_engine
    p.colocate_all, p.colocate_policy_ref = colocate, share_ref
    s.trainer.algorithm.use_kl_loss, s.trainer.algorithm.use_kl_in_reward = ref, False
    s.trainer.critic.model.path = "critic" if critic else None
    for r in ("policy", "ref", "critic"):
        setattr(p, f"{r}_num_nodes", model_nodes)
        setattr(p, f"{r}_num_gpus_per_node", model_gpn)
    ie.tensor_parallel_size, ie.pipeline_parallel_size, ie.num_engines = tp, pp, engines
    return s


LAYOUTS = st.tuples(
    st.integers(1, 6),
    st.sampled_from([1, 2, 4, 6, 8]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.sampled_from([1, 2, 3, 4, 8, 16]),
    st.sampled_from([1, 2]),
    st.integers(1, 8),
    st.integers(1, 3),
    st.integers(1, 8),
)


@settings(max_examples=300, deadline=None)
@given(LAYOUTS)
def test_no_gpu_is_oversubscribed_and_engines_stay_whole(layout_args):
    spec = spec_of(*layout_args)
    layout, diags = plan(spec)
    body = layout.to_json()
    assert body == plan(spec)[0].to_json()
    assert body["fits"] or diags
    if diags:  # what does not fit is reported; the layout of a plan that failed promises nothing
        assert [d.code for d in diags] == ["RLC-E210"]
        return
    load = {}
    for r in body["roles"]:
        for x in r["ranks"]:
            load[(x["node"], x["gpu"])] = load.get((x["node"], x["gpu"]), 0) + r["num_gpus"]
    for e in body["inference"]["engines"]:
        for n, g in e["gpus"]:
            load[(n, g)] = load.get((n, g), 0) + body["inference"]["worker"]["num_gpus"]
    assert all(v <= 1.0 + 1e-9 for v in load.values()), load
    assert all(n < spec.cluster.num_nodes and g < spec.cluster.gpus_per_node for n, g in load)
    assert_engines_whole(body)

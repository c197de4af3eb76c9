"""kuberay/rayjob.yaml has what KubeRay requires and is sized from the plan."""

from __future__ import annotations

import json
import re

from conftest import EXAMPLES, run_rlc
from ruamel.yaml import YAML


def _docs(tmp_path, example, *extra):
    out = tmp_path / "out"
    result = run_rlc("compile", str(EXAMPLES / example), "-o", str(out), "--target", "kuberay", *extra)
    assert result.returncode == 0, result.stderr
    assert not (out / "sky.yaml").exists()  # --target writes only what was asked
    docs = list(YAML(typ="safe").load_all((out / "kuberay" / "rayjob.yaml").read_text()))
    return out, {d["kind"]: d for d in docs}


def test_rayjob_fields_kuberay_requires(tmp_path):
    out, docs = _docs(tmp_path, "gsm8k-grpo-2node.yaml")
    job = docs["RayJob"]
    assert job["apiVersion"] == "ray.io/v1"
    name = job["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 47
    spec = job["spec"]
    assert ("rayClusterSpec" in spec) != ("clusterSelector" in spec)
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] >= 0
    assert isinstance(YAML(typ="safe").load(spec["runtimeEnvYAML"]), dict)
    assert spec["entrypoint"].startswith("python -m rlc.runtime run ")
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    workers = cluster["workerGroupSpecs"][0]
    plan = json.loads((out / "plan.json").read_text())
    assert 1 + workers["replicas"] == plan["cluster"]["nodes"] == 2
    for container in (head, workers["template"]["spec"]["containers"][0]):
        assert container["resources"]["limits"]["nvidia.com/gpu"] == plan["cluster"]["gpus_per_node"] == 8
    assert {e["name"] for e in head["env"] if "valueFrom" in e} == {"WANDB_API_KEY", "HF_TOKEN"}
    assert all("value" not in e for e in head["env"] if e["name"] in ("WANDB_API_KEY", "HF_TOKEN"))
    configmap = docs["ConfigMap"]
    assert configmap["data"]["resolved.yaml"] == (out / "resolved.yaml").read_text()
    volume = cluster["headGroupSpec"]["template"]["spec"]["volumes"][0]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


def test_names_become_dns_labels(tmp_path):
    _, docs = _docs(tmp_path, "local-cpu.yaml", "name=My_Job.With.Dots-" + "x" * 40)
    name = docs["RayJob"]["metadata"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 47
    containers = docs["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in containers[0]["resources"]["limits"]  # CPU-only spec
    assert "workerGroupSpecs" not in docs["RayJob"]["spec"]["rayClusterSpec"]

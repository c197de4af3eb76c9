"""Values written in a launcher's own syntax are read as that launcher reads them, or refused with the fix."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.compiler.launch_values import Unreadable, accelerator, infra, size, slurm_time
from ruamel.yaml import YAML


@pytest.mark.parametrize(
    ("text", "read"),
    [("H100", ("H100", None)), ("H100:8", ("H100", 8)), ("A100-80GB:4", ("A100-80GB", 4)), ("L4:1.0", ("L4", 1))],
)
def test_accelerator_reads_skypilots_type_count(text, read):
    assert accelerator(text) == read


@pytest.mark.parametrize("text", ["H100:0.5", "H100:0", "H100:x", ":8", "H100:8:1"])
def test_accelerator_refuses_what_places_no_whole_gpu(text):
    with pytest.raises(Unreadable):
        accelerator(text)


@pytest.mark.parametrize(
    ("value", "key", "read"),
    [
        (64, "cluster.memory_per_node", 64),
        ("64", "cluster.memory_per_node", 64),
        ("64GB", "cluster.memory_per_node", 64),
        ("64gi", "cluster.memory_per_node", 64),
        ("512MB", "cluster.memory_per_node", 0.5),
        ("1TB+", "cluster.memory_per_node", "1024+"),
        ("7.5+", "cluster.memory_per_node", "7.5+"),
        ("8+", "cluster.cpus_per_node", "8+"),
        ("2.5", "cluster.cpus_per_node", 2.5),
    ],
)
def test_sizes_read_as_skypilot_reads_cpus_and_memory(value, key, read):
    assert size(value, key) == read


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("64G", "cluster.memory_per_node"),  # 1024-based for Slurm, 1000-based for Kubernetes
        ("500m", "cluster.cpus_per_node"),  # Kubernetes' millicores: SkyPilot reads no such CPU count
        ("8GB", "cluster.cpus_per_node"),
        ("lots", "cluster.memory_per_node"),
        (0, "cluster.cpus_per_node"),
        ("-4", "cluster.memory_per_node"),
    ],
)
def test_sizes_no_launcher_reads_alike_are_refused(value, key):
    with pytest.raises(Unreadable):
        size(value, key)


@pytest.mark.parametrize("text", ["aws", "AWS/us-east-1", "gcp/us-central1/us-central1-a", "k8s", "k8s/a:b/c", "*/eu"])
def test_infra_takes_skypilots_forms(text):
    assert infra(text) == text


@pytest.mark.parametrize(
    ("text", "hint"),
    [("aws:us-east-1", "aws/us-east-1"), ("awz", "aws"), ("gcp/a/b/c", "cloud[/region[/zone]]"), ("aws//x", "cloud")],
)
def test_infra_refuses_other_forms_with_the_fix(text, hint):
    with pytest.raises(Unreadable) as exc:
        infra(text)
    assert hint in exc.value.hint


def test_slurm_time_with_a_unit_becomes_minutes():
    assert [slurm_time(v) for v in ("90m", "4h", "1.5h", "2d", "30s", "1-12:00:00", 90)] == [
        90,
        240,
        90,
        2880,
        1,
        "1-12:00:00",
        90,
    ]


def test_skypilots_accelerator_count_compiles_to_one_count(tmp_path):
    """`H100:8` was written into sky.yaml as `H100:8:1`, planned as one GPU: now it is the type and 8 per node."""
    out = tmp_path / "out"
    spec = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
    done = run_rlc("compile", str(spec), "-o", str(out), "cluster.accelerator=H100:8", "cluster.gpus_per_node=null")
    assert done.returncode == 0, done.stderr
    task = YAML(typ="safe").load((out / "sky.yaml").read_text())
    assert task["resources"]["accelerators"] == "H100:8"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["cluster"]["gpus_per_node"] == 8


def test_a_count_that_contradicts_gpus_per_node_is_refused(tmp_path):
    done = run_rlc(
        "validate", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "cluster.accelerator=H100:4", "--format", "json"
    )
    assert done.returncode == 1
    found = [d for d in json.loads(done.stdout)["diagnostics"] if d["code"] == "RLC-E920"]
    assert found and "cluster.gpus_per_node is 8" in found[0]["message"]

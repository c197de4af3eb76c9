"""The promise of `rlc validate`: a spec it accepts launches. Hypothesis writes specs across every section that reaches
a launch file (cluster, launch with its kuberay and slurm sections, the name) on the GPU and the CPU example, rlc
compiles each for every target, and each target's files go to the tool that reads them:

- sky.yaml: SkyPilot's `Task.from_yaml` (its schema, resources, accelerators against its catalog), in its own venv;
- slurm/job.sbatch: `sbatch --test-only` on a real Slurm (tools/slurmsim.py; GPUs, features, memory and CPUs
  declared large enough that only the script's own options can fail);
- kuberay/rayjob.yaml: KubeRay's RayJob CRD schema (tests/fixtures/kuberay) and Kubernetes' name rules;
- ray/: Ray's own runtime_env validation and `ray job submit`'s argument parser.

A spec rlc accepts and a tool refuses fails the test. Many specs go to one tool process. RLC_PROPERTY_EXAMPLES sets
how many specs are drawn (a few in CI; more locally, e.g. RLC_PROPERTY_EXAMPLES=300).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlc.compiler.emit import build, write
from rlc.compiler.pipeline import compile_job
from rlc.compiler.targets import TARGETS
from ruamel.yaml import YAML

sys.path.insert(0, str(ROOT / "tools"))
import slurmsim  # noqa: E402

pytestmark = pytest.mark.slow
EXAMPLES_DRAWN = int(os.environ.get("RLC_PROPERTY_EXAMPLES", "10"))
SLURM_GPU, SLURM_FEATURES = "h100", ("a100", "h100", "rack1", "rack2")
GPUS = ("H100", "A100", "A100-80GB", "L4", "T4", "V100", "A10G", "L40S")  # names in SkyPilot's catalog
CLOUDS = ("aws", "gcp", "azure", "lambda", "runpod", "nebius", "k8s", "k8s/my-context", "*")

_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
_env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True)
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=24)
_slurm_word = st.from_regex(r"[A-Za-z0-9_.+-]{1,12}", fullmatch=True)


@st.composite
def _infra(draw):
    cloud = draw(st.sampled_from(CLOUDS))
    if cloud.startswith("k8s"):
        return cloud
    parts = [cloud.upper() if draw(st.booleans()) else cloud]
    for _ in range(draw(st.integers(0, 2))):
        parts.append(draw(st.from_regex(r"[a-z][a-z0-9-]{1,12}", fullmatch=True)))
    return "/".join(parts)


@st.composite
def _memory(draw):
    number = draw(st.sampled_from(["16", "64", "0.5", "1024", "7.5"]))
    return number + draw(st.sampled_from(["", "GB", "gb", "Gi", "MB", "TB", "+", "GB+"]))


@st.composite
def _constraint(draw) -> str:
    names = draw(st.lists(st.sampled_from(SLURM_FEATURES), min_size=1, max_size=3))
    return draw(st.sampled_from(["&", "|"])).join(names)


@st.composite
def _spec(draw) -> dict:
    gpu = draw(st.booleans())
    base = YAML(typ="safe").load((EXAMPLES / ("gsm8k-grpo-8xh100.yaml" if gpu else "local-cpu.yaml")).read_text())
    cluster = base["cluster"]
    if gpu:
        accel = draw(st.sampled_from(GPUS))
        cluster["accelerator"] = accel + (":8" if draw(st.booleans()) else "")
        cluster["infra"] = draw(st.none() | _infra())
        cluster["use_spot"] = draw(st.booleans())
        cluster["disk_size"] = draw(st.none() | st.integers(50, 2000))
        cluster["disk_tier"] = draw(st.none() | st.sampled_from(["low", "medium", "high", "best"]))
        cluster["network_tier"] = draw(st.none() | st.sampled_from(["standard", "best"]))
        cluster["image"] = draw(
            st.none() | st.sampled_from(["nvcr.io/nvidia/pytorch:25.01-py3", "rayproject/ray:2.49.0"])
        )
    cluster["cpus_per_node"] = draw(st.none() | st.integers(1, 128) | st.sampled_from(["8+", "16", "2.5"]))
    cluster["memory_per_node"] = draw(st.none() | st.integers(1, 2048) | _memory())
    slurm: dict = {
        "partition": draw(st.none() | st.just("debug")),
        "account": draw(st.none() | _slurm_word),
        "qos": draw(st.none() | _slurm_word),
        "time_limit": draw(
            st.none()
            | st.integers(0, 100_000)
            | st.sampled_from(["90", "30:00", "04:00:00", "2-12", "1-12:00", "1-12:00:00", "UNLIMITED", "4h", "90m"])
        ),
        "constraint": draw(st.none() | _constraint()),
        "gpu_type": draw(st.none() | st.just(SLURM_GPU)),
        "gpu_request": draw(st.sampled_from(["gres", "gpus-per-node"])),
        "sbatch_args": draw(
            st.lists(
                st.sampled_from(["--exclusive", "--mail-type=END", "--requeue", "--signal=B:USR1@60"])
                | _text.map(lambda t: f"--comment={t}"),
                max_size=3,
                unique_by=lambda a: a.split("=")[0],
            )
        ),
    }
    # --requeue and --signal are rlc's own lines while launch.slurm.requeue is on
    own = any(a.split("=")[0] in ("--requeue", "--signal") for a in slurm["sbatch_args"])
    slurm["requeue"] = False if own else draw(st.booleans())
    base["name"] = draw(_names)
    base.setdefault("trainer", {})["ckpt_path"] = draw(st.sampled_from(["/ckpts/run", "~/ckpts", "/mnt/shared/c"]))
    base["launch"] = {
        "target": draw(st.sampled_from(["skypilot", "ray", "kuberay", "slurm", "local"])),
        "workdir": draw(st.none() | st.just(".") | _text.filter(lambda t: t.strip() and "\n" not in t)),
        "setup": draw(st.lists(_text, max_size=2)),
        "envs": draw(st.dictionaries(_env_names, _text, max_size=3)),
        "secrets": draw(st.lists(_env_names, max_size=2, unique=True)),
        "ports": draw(st.lists(st.integers(1024, 65535), max_size=2, unique=True)),
        "ray_port": draw(st.integers(1024, 65535)),
        "kuberay": {
            "namespace": draw(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)),
            "ttl_seconds_after_finished": draw(st.integers(0, 10**6)),
            "active_deadline_seconds": draw(st.none() | st.integers(1, 10**6)),
            "checkpoint_volume_claim": draw(st.none() | st.just("rlc-checkpoints")),
        },
        "grace_period_s": draw(st.integers(5, 3600)),
        "recovery": {
            "managed": draw(st.none() | st.booleans()),
            "max_restarts_on_errors": draw(st.integers(0, 5)),
            "strategy": draw(st.none() | st.sampled_from(["FAILOVER", "EAGER_NEXT_REGION"])),
        },
        "checkpoint_bucket": draw(st.none() | st.sampled_from(["s3://my-bucket/ckpts", "gs://bucket", "r2://b/x"])),
        "slurm": {k: v for k, v in slurm.items() if v is not None},
    }
    return base


def _compile_all(tmp_path: Path) -> list[tuple[dict, Path]]:
    """Draw specs; every one rlc accepts is compiled for every target into a directory of its own."""
    accepted: list[tuple[dict, Path]] = []
    refused: list[dict] = []

    @settings(
        max_examples=EXAMPLES_DRAWN,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(_spec())
    def draw(spec: dict) -> None:
        out = tmp_path / f"job{len(accepted) + len(refused)}"
        out.mkdir()
        path = out / "spec.yaml"
        with path.open("w") as f:
            YAML(typ="safe").dump(spec, f)
        result = compile_job(path, env={})
        if not result.ok:
            refused.append(spec)
            return
        write(build(result, TARGETS, str(out)), out)
        accepted.append((spec, out))

    draw()
    assert len(accepted) >= len(refused), "most drawn specs are refused: the strategy tests little"
    return accepted


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    return _compile_all(tmp_path_factory.mktemp("property"))


def _failures(found: dict[str, str], compiled) -> str:
    specs = {str(out): spec for spec, out in compiled}
    return "\n".join(
        f"{path}: {error}\n  spec: {json.dumps(specs.get(str(Path(path).parent)), default=str)}"
        for path, error in found.items()
    )


SKY_CHECK = """
import json, sys, sky
errors = {}
for path in sys.argv[1:]:
    try:
        task = sky.Task.from_yaml(path)
        for r in task.resources:
            r.accelerators  # the count per node SkyPilot reads
    except Exception as exc:  # every refusal of SkyPilot's is the finding
        errors[path] = f"{type(exc).__name__}: {exc}"
print(json.dumps(errors))
"""


def test_skypilot_reads_every_task(compiled, sky_python, tmp_path):
    paths = [str(out / "sky.yaml") for _, out in compiled]
    env = {**os.environ, "HOME": str(tmp_path)}
    run = subprocess.run(
        [str(sky_python), "-c", SKY_CHECK, *paths], capture_output=True, text=True, env=env, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    errors = json.loads(run.stdout.strip().splitlines()[-1])
    assert not errors, _failures(errors, compiled)


@pytest.mark.skipif(slurmsim.why_unavailable(1) is not None, reason=f"no Slurm here: {slurmsim.why_unavailable(1)}")
def test_sbatch_accepts_every_batch_script(compiled, tmp_path):
    errors = {}
    with slurmsim.SlurmCluster(
        1, tmp_path / "slurm", cpus=256, gpus=8, gpu_type=SLURM_GPU, memory_mb=1_100_000_000, features=SLURM_FEATURES
    ) as cluster:
        for _, out in compiled:
            script = out / "slurm" / "job.sbatch"
            # One simulated node: the command line's --nodes=1 stands in for the script's count (an integer rlc
            # writes from the plan); every other option is the script's own.
            run = cluster.run("sbatch", "--test-only", "--nodes=1", str(script), cwd=out)
            if run.returncode != 0:
                errors[str(script)] = (run.stdout + run.stderr).strip()
    assert not errors, _failures(errors, compiled)


def _rayjob_schema() -> dict:
    crd = json.loads(gzip.decompress((ROOT / "tests/fixtures/kuberay/ray.io_rayjobs.json.gz").read_bytes()))
    return next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]


DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def test_kuberay_takes_every_rayjob(compiled):
    import jsonschema

    validator = jsonschema.Draft7Validator(_rayjob_schema())
    errors = {}
    for _, out in compiled:
        path = out / "kuberay" / "rayjob.yaml"
        docs = {d["kind"]: d for d in YAML(typ="safe").load_all(path.read_text())}
        found = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(docs["RayJob"])]
        for doc in docs.values():
            meta = doc["metadata"]
            if not (DNS_SUBDOMAIN.fullmatch(meta["name"]) and len(meta["name"]) <= 253):
                found.append(f"{doc['kind']} name {meta['name']!r} is no DNS subdomain")
            if not (DNS_LABEL.fullmatch(meta["namespace"]) and len(meta["namespace"]) <= 63):
                found.append(f"namespace {meta['namespace']!r} is no DNS label")
        job = docs["RayJob"]
        if not (DNS_LABEL.fullmatch(job["metadata"]["name"]) and len(job["metadata"]["name"]) <= 47):
            found.append("KubeRay names the RayCluster after the RayJob: a DNS label of at most 47 characters")
        YAML(typ="safe").load(job["spec"]["runtimeEnvYAML"])  # KubeRay parses it as YAML
        if found:
            errors[str(path)] = "; ".join(found)
    assert not errors, _failures(errors, compiled)


def test_ray_reads_every_runtime_env_and_submit_command(compiled):
    pytest.importorskip("ray")
    from ray.dashboard.modules.job.cli import job_cli_group
    from ray.runtime_env import RuntimeEnv

    submit = job_cli_group.commands["submit"]
    errors = {}
    for _, out in compiled:
        try:
            RuntimeEnv(**YAML(typ="safe").load((out / "ray" / "runtime_env.yaml").read_text()))
            script = (out / "ray" / "submit.sh").read_text()
            sid = re.search(r'SUBMISSION_ID="\$\{RLC_SUBMISSION_ID:-(.*)\}"', script).group(1)
            args = ["--address", "http://127.0.0.1:8265", "--submission-id", sid, "--runtime-env"]
            args += [str(out / "ray" / "runtime_env.yaml"), "--working-dir", str(out)]
            submit.make_context("submit", [*args, "--", "python", "-m", "rlc.runtime", "run", "resolved.yaml"])
        except Exception as exc:  # noqa: BLE001 - any refusal of Ray's is the finding
            errors[str(out / "ray")] = f"{type(exc).__name__}: {exc}"
    assert not errors, _failures(errors, compiled)

"""Shared test helpers: run the installed `rlc` like a user would, write specs to temporary files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CORPUS = ROOT.parent / "shared" / "corpus" / "skyrl-legacy"


def rlc_executable() -> str:
    here = Path(sys.executable).parent / "rlc"
    return str(here) if here.exists() else (shutil.which("rlc") or "rlc")


def run_rlc(
    *args: str, cwd: str | Path | None = None, env: dict | None = None, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
    full_env.pop("RLC_DEBUG", None)
    return subprocess.run(
        [rlc_executable(), *args], cwd=cwd, env=full_env, input=input, capture_output=True, text=True, timeout=timeout
    )


def multinode_overrides(tmp_path: Path, name: str, steps: int, nodes: int) -> list[str]:
    """The local example on `nodes` nodes x 1 CPU slot, its data (`steps` steps' rows, made once) and outputs in the
    test directory: what the simulated-host tests (SkyPilot, Slurm) compile."""
    data = tmp_path / "data"
    if not (data / "train.parquet").exists():
        made = run_rlc("data", "synthetic", "-o", str(data), "--train", str(steps * 16), "--validation", "16")
        assert made.returncode == 0, made.stderr
    return [
        f"cluster.num_nodes={nodes}",
        "cluster.gpus_per_node=1",
        "trainer.micro_train_batch_size_per_gpu=64",
        "trainer.micro_forward_batch_size_per_gpu=64",
        f"data.train_data=['{data / 'train.parquet'}']",
        "data.val_data=[]",
        f"trainer.log_path={tmp_path / 'runs'}",
        f"trainer.run_name={name}",
        f"trainer.ckpt_path={tmp_path / 'ckpts' / name}",
        f"trainer.export_path={tmp_path / 'exports'}",
        "launch.envs={RLC_DIST_TIMEOUT_S: '20'}",
    ]


@pytest.fixture
def spec_file(tmp_path):
    """Write YAML text (dedented) to a file and return its path."""

    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session", autouse=True)
def rlc_cache(tmp_path_factory):
    """One cache of embedded models and datasets per test session, never the user's ~/.cache/rlc."""
    path = tmp_path_factory.mktemp("rlc-cache")
    old = os.environ.get("RLC_CACHE")
    os.environ["RLC_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("RLC_CACHE", None)
    else:
        os.environ["RLC_CACHE"] = old


@pytest.fixture(scope="session")
def tiny_model(rlc_cache) -> str:
    """The embedded `rlc:tiny` model, built once per session."""
    pytest.importorskip("transformers")
    from rlc.runtime.models import local_path

    return local_path("rlc:tiny")


# A chat template for the tiny model's tokenizer (its vocabulary has <bos> and <eos>): each message is a turn of its
# own, the assistant's inside `{% generation %}` so the same template serves as a custom one.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<bos>' + m['role'] + ': ' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] + '<eos>' }}{% endgeneration %}"
    "{% else %}{{ m['content'] + '<eos>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<bos>assistant: ' }}{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_chat_model(tiny_model, tmp_path_factory) -> str:
    """`rlc:tiny` with a chat template: what multi-turn conversations are templated with."""
    import json

    target = tmp_path_factory.mktemp("tiny-chat") / "model"
    shutil.copytree(tiny_model, target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = TINY_CHAT_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return str(target)


SKY_VENV = ROOT / ".venv-sky"


@pytest.fixture(scope="session")
def sky_python():
    """SkyPilot in its own venv (it pins click < 8.2, which the runtime's Hugging Face stack cannot share), made once
    for every test file that parses with it (a lock: xdist workers may ask at once)."""
    import filelock

    py = SKY_VENV / "bin" / "python"
    with filelock.FileLock(str(SKY_VENV) + ".lock"):
        if not py.exists():
            made = subprocess.run([sys.executable, "-m", "venv", str(SKY_VENV)], capture_output=True, text=True)
            inst = made.returncode == 0 and subprocess.run(
                [str(SKY_VENV / "bin" / "pip"), "install", "-q", "skypilot"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            if not inst or inst.returncode != 0:
                pytest.skip(f"SkyPilot could not be installed here: {getattr(inst, 'stderr', '')[-300:]}")
    return py


def kill_ray_processes_under(temp: str) -> None:
    """Kill the processes of the Ray instance whose temp dir is `temp`: those naming it on their command line or
    holding a file under it open (Ray's agents retitle themselves, and their logs are under its session dir).
    `ray stop` would stop every Ray instance on the machine, other tests' included."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and (
                any(temp in part for part in proc.info["cmdline"] or ())
                or any(f.path.startswith(temp) for f in proc.open_files())
            ):
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


@pytest.fixture
def s3_bucket(monkeypatch):
    """A real S3 endpoint (moto's server on a free port) with an empty bucket, as s3://<bucket>/run-1; boto3 finds it
    by AWS_ENDPOINT_URL, set here (and so in the `rlc run` a test starts after this fixture: its env inherits it)."""
    pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "rlc-test",
        "AWS_SECRET_ACCESS_KEY": "rlc-test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    import boto3

    bucket = f"rlc-sync-{uuid.uuid4().hex[:8]}"  # moto's buckets outlive its server, in this process
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/run-1"
    server.stop()


@pytest.fixture
def run_env(tmp_path):
    """A private HOME and Ray temp dir; Ray processes a killed run leaves behind are stopped afterwards."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": ray_tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    yield env
    kill_ray_processes_under(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _rank_process(target, done, rank: int, world: int, port: int, q, *args) -> None:
    target(rank, world, port, q, *args)
    # A tensor put on the queue travels as a handle to this process's memory: stay until the parent has it.
    done.wait(timeout=600)


def run_ranks(target, world: int, *args, timeout_s: float = 300) -> list:
    """`target(rank, world, port, queue, *args)` in `world` spawned processes sharing a free port; each puts
    `(rank, result)` on the queue. Returns the results in rank order; a rank that dies fails at once, not at the
    timeout."""
    import queue
    import time

    import torch.multiprocessing as mp
    from rlc.runtime.workers.common import free_address

    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    port = free_address()[1]
    procs = [ctx.Process(target=_rank_process, args=(target, done, r, world, port, q, *args)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            try:
                rank, result = q.get(timeout=1)
                results[rank] = result
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead and time.monotonic() < deadline, f"a rank failed (exit codes {dead})"
    finally:
        done.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [results[r] for r in range(world)]


# `make test` runs the suite on two pytest-xdist workers, a whole file to a worker (`--dist loadfile`; pytest 9 ignores
# xdist's finer `xdist_group` markers), so a module's fixtures (Megatron's rank runs, SkyPilot's venv) are built once.
# The files go out in this order, longest first (their serial times on 2 cores in the comments), then the rest as
# collected, so that neither worker is left with a long file at the end. Within a file the order is unchanged.
LONGEST_FIRST = (
    "test_run.py",  # ~365 s: end-to-end runs
    "test_multinode.py",  # ~250 s: the SkyPilot task on two simulated hosts
    "test_run_options.py",  # ~175 s: a short run per algorithm option
    "test_slurm.py",  # ~250 s: batch jobs on a real Slurm of two simulated hosts
    "test_faults.py",  # ~140 s: five runs with a fault injected (docs/faults.md)
    "test_megatron.py",  # ~140 s
    "test_routing_replay.py",  # ~70 s (~3 min on a busy machine): a vLLM engine, Megatron MoE workers of 1 and 2 ranks
    "test_megatron_moe.py",  # ~150 s: MoE steps on 1, 2 and 4 ranks
    "test_megatron_qwen35.py",  # ~250 s: eleven Megatron / fsdp2 runs of tiny Qwen3.5 and Qwen3.5-MoE models
    "test_megatron_mtp.py",  # ~110 s: five steps of one or two ranks on a tiny MiMo-style model
    "test_vllm_run.py",  # ~225 s on a busy machine: the local example's 200 steps with the vllm engine
    "test_vllm_serve.py",  # ~200 s: vLLM's own server started, then a run against it
    "test_vllm_cpu.py",  # ~170 s: three vLLM engines started
    "test_multiturn.py",  # ~60 s: two multi-turn runs
    "test_generator.py",
    "test_skypilot.py",  # ~75 s, most of it building SkyPilot's venv
    "test_fsdp.py",
    "test_ulysses.py",  # ~65 s: ranks of 1, 2 and 4 processes
    "test_logprob_chunks.py",  # ~65 s: FSDP2 steps at three chunk sizes, two Megatron tensor ranks
    "test_qat.py",  # ~55 s: a Megatron-Core MoE model, a Megatron worker
    "test_megatron_qwen35_lora.py",  # ~65 s: LoRA steps of fsdp2 and Megatron (tp 1, 2) on tiny Qwen3.5 models
    "test_megatron_adapters.py",  # ~55 s: two Megatron LoRA workers on tp=2
    "test_megatron_qwen35_moe_qat_lora.py",  # ~75 s: Qwen3.5-MoE with LoRA, QAT and the fused head, one rank and tp2 x ep2
    "test_megatron_moe_adapters.py",  # ~35 s: Megatron MoE LoRA workers on ep=2 (Qwen3-MoE) and one rank (Qwen3.5-MoE)
    "test_megatron_fused_head.py",  # ~50 s: Megatron workers on one and two tensor ranks, the head fused and not
    "test_ray_job.py",
    "test_properties.py",
)


def pytest_collection_modifyitems(config, items):
    items.sort(
        key=lambda item: LONGEST_FIRST.index(item.path.name) if item.path.name in LONGEST_FIRST else len(LONGEST_FIRST)
    )


# `make test` installs every test extra and sets RLC_TESTS_FULL=1: there a test skipped because a package it imports
# is missing (pytest.importorskip) is a broken install, not a lighter venv, and fails. .ci/run's venvs of the other
# Pythons install the compiler's extras alone (no torch) and leave it unset, so those tests skip with the reason.
FULL = os.environ.get("RLC_TESTS_FULL") == "1"


def _failed_for_a_missing_package(report):
    if FULL and report.skipped and "could not import" in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"RLC_TESTS_FULL=1 but a package of rlc's test extras is missing: {report.longrepr}"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return _failed_for_a_missing_package((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return _failed_for_a_missing_package((yield))

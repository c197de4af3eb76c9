"""What every benchmark shares: facts about the machine, and its own section of bench/RESULTS.md.

A section sits between `<!-- NAME:start -->` and `<!-- NAME:end -->`; writing one replaces only that section.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
_HEADER = (
    "# Benchmark results\n\nEach section below is written by the benchmark it names (see README.md) and is "
    "replaced when that benchmark runs again.\n"
)


def write_section(name: str, body: str) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body.strip(chr(10))}\n{end}"
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else _HEADER
    if start in text and end in text and text.index(start) < text.index(end):
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    RESULTS.write_text(text, encoding="utf-8")


def publish(name: str, text: str, write: bool = True) -> None:
    """Print a benchmark's report and, unless told not to, make it section `name` of RESULTS.md."""
    print(text)
    if write:
        write_section(name, text)


def nproc() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def find_rlc() -> str | None:
    """The `rlc` next to the Python running the benchmark, else the one on PATH."""
    here = Path(sys.executable).parent / "rlc"
    return str(here) if here.exists() else shutil.which("rlc")


def require_rlc(bench: str) -> str:
    """`find_rlc()`, or exit 2 saying there is no rlc to measure."""
    rlc = find_rlc()
    if rlc is None:
        print(f"{bench}: no `rlc` next to this Python nor on PATH", file=sys.stderr)
        raise SystemExit(2)
    return rlc


def make_venv(path: Path) -> str | None:
    """Create a venv at `path` from the real interpreter; an error message, or None when it worked.

    sys._base_executable: a venv made from inside another venv is based on the real interpreter.
    """
    base = getattr(sys, "_base_executable", None) or sys.executable
    p = subprocess.run([base, "-m", "venv", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        return f"could not create the peer venv: {(p.stderr or p.stdout).strip()[-500:]}"
    return None


def run_example(rlc: str, example: Path, name: str, work: Path, *overrides: str) -> tuple[float, list[dict], list[str]]:
    """One whole `rlc run` of an example, as a user runs it, with its run, export and checkpoint directories under
    `work`: (seconds from start to exit, its metrics.jsonl rows, the sample lines of its evaluations)."""
    import json
    import time

    cmd = [rlc, "run", str(example), "-o", str(work / "build" / name), "--no-progress", f"trainer.run_name={name}"]
    cmd += [
        f"trainer.log_path={work / 'runs'}",
        f"trainer.export_path={work / 'exports' / name}",
        f"trainer.ckpt_path={work / 'ckpts' / name}",
        *overrides,
    ]
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    log = work / f"{name}.log"
    start = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    wall = time.monotonic() - start
    if code != 0:
        raise SystemExit(f"{name}: rlc run exited {code}; its log: {log}\n{log.read_text()[-3000:]}")
    metrics = [json.loads(line) for line in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    samples = [line for line in log.read_text().splitlines() if line.startswith("  [")]
    return wall, metrics, samples

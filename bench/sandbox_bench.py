"""The honest-code path: how long a trivial program takes through rlc's sandbox (goal: within 2x of the sandbox before
the jail, `runtime/sandbox.py` at commit 6ddd9c2, which ran the same supervisor under `unshare` without limits for
the whole sandbox; the module is `runtime/envs/sandbox.py` since, and the old one is read at its old path).

    python bench/sandbox_bench.py bubblewrap|unisolated|before|side-doors-open [--calls N]

One process runs N (default 10) trivial programs, `print(1)`, one after another, checks each printed 1, and prints
the median seconds per call. `before` loads the old module from git (run inside rlc's repository);
`side-doors-open` loads `runtime/envs/sandbox.py` as it was before issue 50's seccomp filters, session keyring and
user namespace (commit OPEN), at the bubblewrap level. Time the whole process of two levels alternately (e.g.
`/usr/bin/time -v`, or any timer that pairs the runs) and take the ratio.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEFORE = "6ddd9c2"  # the commit the sandbox review (issue 39) attacked
OPEN = "cb192f8"  # the jail the side-doors review (issue 50) attacked
ROOT = Path(__file__).resolve().parent.parent


def old_sandbox(at: str = f"{BEFORE}:runtime/sandbox.py"):
    """A sandbox module as it was at a commit (`commit:path`), as a module of its own."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", at], capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="rlc-bench-")) / "old_sandbox.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_sandbox", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("level", choices=("bubblewrap", "unisolated", "before", "side-doors-open"))
    parser.add_argument("--calls", type=int, default=10)
    args = parser.parse_args()
    if args.level == "before":
        run_python = old_sandbox().run_python
    elif args.level == "side-doors-open":
        run_python = old_sandbox(f"{OPEN}:runtime/envs/sandbox.py").run_python  # bubblewrap is its default level
    else:
        from rlc.runtime.envs import sandbox

        sandbox.configure(args.level)
        run_python = sandbox.run_python
    times = []
    for _ in range(args.calls):
        started = time.perf_counter()
        out = run_python("print(1)")
        times.append(time.perf_counter() - started)
        if out.stdout.strip() != "1":
            sys.exit(f"the sandbox did not run the program: {out}")
    print(f"{args.level}: median {statistics.median(times) * 1000:.0f} ms per call over {args.calls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

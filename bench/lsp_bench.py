#!/usr/bin/env python3
"""Benchmark: how long after a keystroke `rlc lsp` shows a 300-line spec's findings.

    python bench/lsp_bench.py              # measure, print, update bench/RESULTS.md
    python bench/lsp_bench.py --no-write   # measure and print only

The spec: examples/gsm8k-grpo-2node.yaml compiled, its resolved.yaml (every key written) cut to 300 lines by leaving
out keys at their defaults. The client (pygls's) starts the `rlc` next to this Python as `rlc lsp`, opens the spec,
then sends --changes edits one at a time, each flipping trainer.policy_mini_batch_size between 256 (valid) and 300
(RLC-E105/E106/E107), and times each from sending `didChange` to receiving the `publishDiagnostics` of that version:
the protocol both ways, the pipeline (load to decide) and the conversion. Goal: the median under 50 ms.

The peer is what the editor would otherwise run on save: `rlc validate` of the same file as a whole process, timed
the same number of times, interleaved with the edits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types as lsp
from pygls.lsp.client import LanguageClient
from results import cpu_model, loadavg, nproc, publish, require_rlc  # bench/results.py

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gsm8k-grpo-2node.yaml"
LINES = 300
GOAL_MS = 50.0


def spec_of(lines: int, rlc: str, tmp: Path) -> Path:
    """The example with every key written (its resolved.yaml), cut to `lines` lines by leaving out default leaves
    from the bottom up, never the last key of a section."""
    subprocess.run([rlc, "compile", str(EXAMPLE), "-o", str(tmp / "build")], check=True, capture_output=True)
    keep = (tmp / "build" / "resolved.yaml").read_text(encoding="utf-8").splitlines()
    i = len(keep) - 1
    while len(keep) > lines and i > 0:
        line = keep[i]
        indent = len(line) - len(line.lstrip())
        beside = [keep[i - 1], keep[i + 1] if i + 1 < len(keep) else ""]
        shares = any(b.strip() and len(b) - len(b.lstrip()) == indent for b in beside)
        if line.rstrip().endswith("# default") and re.match(r"^\s+\w+: \S", line) and shares:
            del keep[i]
        i -= 1
    path = tmp / f"spec-{len(keep)}-lines.yaml"
    path.write_text("\n".join(keep) + "\n", encoding="utf-8")
    return path


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time a process has used (Linux's /proc), None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def edit_latencies(
    rlc: str, spec: Path, changes: int, validate_times: list[float], server_cpu: list[float]
) -> list[float]:
    client = LanguageClient("lsp-bench", "1")
    arrived: dict[int, float] = {}
    codes: dict[int, list[str]] = {}

    @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: lsp.PublishDiagnosticsParams) -> None:
        if params.version is not None:
            arrived[params.version] = time.perf_counter()
            codes[params.version] = sorted(str(d.code) for d in params.diagnostics)

    await client.start_io(rlc, "lsp")
    await client.initialize_async(lsp.InitializeParams(capabilities=lsp.ClientCapabilities()))
    client.initialized(lsp.InitializedParams())
    text = spec.read_text(encoding="utf-8")
    if "policy_mini_batch_size: 256" not in text:
        raise SystemExit(f"lsp_bench: {spec} has no `policy_mini_batch_size: 256` to edit")
    uri = spec.as_uri()
    client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri, "yaml", 0, text)))
    await wait_for(arrived, 0)
    pid = client._server.pid if client._server else 0  # the server process pygls started
    cpu_before = cpu_seconds(pid)
    out = []
    for version in range(1, changes + 1):
        size = 300 if version % 2 else 256
        new = text.replace("policy_mini_batch_size: 256", f"policy_mini_batch_size: {size}")
        sent = time.perf_counter()
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                lsp.VersionedTextDocumentIdentifier(version, uri), [lsp.TextDocumentContentChangeWholeDocument(new)]
            )
        )
        await wait_for(arrived, version)
        out.append(arrived[version] - sent)
        expected = ["RLC-E105", "RLC-E106", "RLC-E107"] if size == 300 else []
        if codes[version] != expected:
            raise SystemExit(f"lsp_bench: version {version} showed {codes[version]}, expected {expected}")
        if version % 4 == 0:  # a whole-process validate after every fourth edit: the peer, interleaved
            t0 = time.perf_counter()
            subprocess.run([rlc, "validate", str(spec)], capture_output=True, check=True)
            validate_times.append(time.perf_counter() - t0)
    cpu_after = cpu_seconds(pid)
    if cpu_before is not None and cpu_after is not None:
        server_cpu.append((cpu_after - cpu_before) / changes)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return out


async def wait_for(arrived: dict[int, float], version: int) -> None:
    deadline = time.perf_counter() + 60
    while version not in arrived:
        if time.perf_counter() > deadline:
            raise SystemExit(f"lsp_bench: no diagnostics for version {version} within 60 s")
        await asyncio.sleep(0.0005)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=60, help="edits timed (default 60)")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = ap.parse_args()
    rlc = require_rlc("lsp_bench")
    before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rlc-lsp-bench-") as tmp:
        spec = spec_of(LINES, rlc, Path(tmp))
        lines = len(spec.read_text(encoding="utf-8").splitlines())
        validate: list[float] = []
        server_cpu: list[float] = []
        times = asyncio.run(edit_latencies(rlc, spec, args.changes, validate, server_cpu))
    ms = sorted(t * 1000 for t in times)
    median, p90 = statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]
    v_ms = statistics.median(validate) * 1000
    verdict = "met" if median < GOAL_MS else "NOT met"
    text = "\n".join(
        [
            "## `rlc lsp`: findings after an edit (bench/lsp_bench.py)",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {nproc()} cores ({cpu_model()}); "
            f"load average {before} before, {loadavg()} after.",
            "",
            f"A {lines}-line spec (the 2-node example with every key written, cut to {lines} lines), {len(ms)} edits "
            "of trainer.policy_mini_batch_size (256 <-> 300), each timed from `didChange` sent to that version's "
            "`publishDiagnostics` received, over stdio:",
            "",
            "| | median | 90th percentile | min | max |",
            "| --- | --- | --- | --- | --- |",
            f"| `rlc lsp`, edit to findings | {median:.1f} ms | {p90:.1f} ms | {ms[0]:.1f} ms | {ms[-1]:.1f} ms |",
            f"| `rlc validate` of the same file, whole process ({len(validate)} runs) | {v_ms:.1f} ms | | | |",
            "",
            "The server's own CPU time (user + system, from /proc) per edit, the part of the latency a busy machine "
            "does not stretch: "
            + (f"{server_cpu[0] * 1000:.1f} ms (mean over the edits)." if server_cpu else "not readable here."),
            "",
            f"Goal: the median under {GOAL_MS:.0f} ms: {verdict}. The server answers {v_ms / median:.1f}x sooner "
            "than a whole `rlc validate` process would.",
        ]
    )
    publish("lsp-bench", text, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())

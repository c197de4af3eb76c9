"""Peak memory and time of scoring a micro-batch's tokens: the full float32 log-softmax against `score_tokens`.

Both variants take the same bf16 logits [tokens, vocab] (what the vocabulary head hands on, a leaf that requires
grad), score the chosen tokens at a temperature, compute the entropy, and run backward through
`sum(logp * w) + 0.01 * sum(entropy)` down to the logits' gradient: one training micro-batch's scoring.

- full: `log_softmax(logits.float() / T)` gathered at the ids, and the entropy from a second log-softmax, as the
  runtime computed them before (`p * clamp(log p)`).
- chunked: `rlc.runtime.algorithms.losses.score_tokens` (512 tokens at a time).

Each variant runs in its own process (`--variant`), so one's allocations cannot hide the other's. The memory
figure is what the scoring adds on top of the logits themselves: on CUDA `torch.cuda.max_memory_allocated`; on
the CPU the peak resident set (VmHWM, reset through /proc/self/clear_refs) minus the resident set just before,
with glibc told to serve large blocks from mmap so that freed memory leaves the resident set. Without
`--variant` the script runs the two in turn, A B A B, and prints medians and the full/chunked ratios; `--write`
puts them in bench/RESULTS.md.

    nice .venv/bin/python bench/logprob_memory_bench.py --tokens 4096 --vocab 32768 --rounds 3 --write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _full(logits, ids, temperature):
    import torch

    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = log_p.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    log_q = torch.log_softmax(logits.float() / temperature, dim=-1)
    entropy = -(log_q.exp() * log_q.clamp(min=torch.finfo(log_q.dtype).min)).sum(-1)
    return logp, entropy


def run_variant(variant: str, tokens: int, vocab: int, temperature: float, device: str) -> dict:
    import torch
    from rlc.runtime.algorithms.losses import score_tokens

    torch.manual_seed(0)
    logits = (torch.randn(tokens, vocab, device=device) * 2).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, vocab, (tokens,), device=device)
    weights = torch.randn(tokens, device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        base = _status("VmRSS")
    start = time.perf_counter()
    if variant == "full":
        logp, entropy = _full(logits, ids, temperature)
    else:
        logp, entropy = score_tokens(logits, ids, temperature, entropy=True)
    ((logp * weights).sum() + 0.01 * entropy.sum()).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status("VmHWM")
    return {
        "variant": variant,
        "tokens": tokens,
        "vocab": vocab,
        "device": device,
        "peak_over_logits_bytes": peak - base,
        "logits_bytes": logits.numel() * logits.element_size(),
        "seconds": seconds,
        "checksum": float(logp.sum() + entropy.sum() + logits.grad.float().abs().sum()),
    }


def _child(variant: str, args) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, __file__, "--variant", variant, "--tokens", str(args.tokens), "--vocab", str(args.vocab)]
    cmd += ["--temperature", str(args.temperature), "--device", args.device]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", choices=["full", "chunked"], help="run one variant in this process (JSON out)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--rounds", type=int, default=3, help="A B pairs (each variant runs this many times)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = ap.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.tokens, args.vocab, args.temperature, args.device)))
        return
    runs: dict[str, list[dict]] = {"full": [], "chunked": []}
    for _ in range(args.rounds):
        for variant in ("full", "chunked"):
            runs[variant].append(_child(variant, args))
    sums = {v: {round(r["checksum"], 0) for r in rs} for v, rs in runs.items()}
    med = {
        v: {k: statistics.median(r[k] for r in rs) for k in ("peak_over_logits_bytes", "seconds")}
        for v, rs in runs.items()
    }
    logits_bytes = runs["full"][0]["logits_bytes"]
    mem_ratio = med["full"]["peak_over_logits_bytes"] / med["chunked"]["peak_over_logits_bytes"]
    time_ratio = med["full"]["seconds"] / med["chunked"]["seconds"]
    gib = 2**30
    lines = [
        f"{args.tokens} tokens x {args.vocab} vocab, bf16 logits ({logits_bytes / gib:.2f} GiB), temperature "
        f"{args.temperature}, entropy on, device {args.device}, {args.rounds} run(s) each, medians:",
        "",
        "| variant | peak memory over the logits | scoring time (forward + backward) |",
        "| --- | --- | --- |",
    ]
    for v in ("full", "chunked"):
        lines.append(f"| {v} | {med[v]['peak_over_logits_bytes'] / gib:.2f} GiB | {med[v]['seconds']:.2f} s |")
    lines += ["", f"full / chunked: memory {mem_ratio:.1f}x, time {time_ratio:.2f}x"]
    print("\n".join(lines))
    print("checksums (full, chunked):", sums)
    if args.write:
        from results import loadavg, nproc, write_section

        body = (
            "## Token log-probs: full log-softmax vs chunked `score_tokens`\n\n"
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with `nice .venv/bin/python "
            f"bench/logprob_memory_bench.py --tokens {args.tokens} --vocab {args.vocab} --rounds {args.rounds} "
            f"--write` on nproc {nproc()}, load average {loadavg()} (a shared machine: times are noisy, memory "
            "is not).\n\n" + "\n".join(lines)
        )
        write_section("logprob-memory-bench", body)


if __name__ == "__main__":
    main()

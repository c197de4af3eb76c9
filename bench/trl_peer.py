"""Peer driver for bench/grpo_bench.py: GRPO with TRL's `GRPOTrainer` on the job rlc runs.

Runs inside the peer venv (bench/.venv-trl: torch 2.13.0 CPU, trl 1.16.0), never inside rlc's venv:

    bench/.venv-trl/bin/python bench/trl_peer.py JOB.json

JOB.json (written by grpo_bench.py) names the model directory rlc built, the parquet file of prompts rlc
trains on, and the settings read from rlc's resolved config: prompts per step, group size, generation
length, temperature, learning rate, AdamW betas and weight decay, gradient clipping, PPO clip, seed, steps.

The copy-the-digit reward is written out here (the peer venv has no rlc); it is the rule of
`rlc.runtime.envs.synthetic.CopyDigit.reward`: 1 for exactly the digit followed by EOS, 0.25 for the right
digit first without a clean stop, else 0.

Timing, all in this process: a callback notes the wall clock at `on_step_begin` and `on_step_end` of every
optimizer step (generation, rewards, loss forward and backward, clipping, optimizer step; not the logging after
it), and a wrapper around the trainer's `_generate` times the generation and counts the completion tokens.
Prints one JSON line on stdout.
"""

from __future__ import annotations

import json
import sys
import time

T_START = time.perf_counter()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

T_IMPORTED = time.perf_counter()


class StepClock(TrainerCallback):
    def __init__(self):
        self.begin: list[float] = []
        self.end: list[float] = []
        self.train_begin = self.train_end = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        self.begin.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        self.end.append(time.perf_counter())

    def on_train_end(self, args, state, control, **kwargs):
        self.train_end = time.perf_counter()


def copy_digit_reward(eos_id: int):
    def copy_digit(completions, answer, completion_ids, **_):
        out = []
        for text, want, ids in zip(completions, answer, completion_ids):
            text = text.strip()
            finished = bool(ids) and ids[-1] == eos_id
            out.append(1.0 if text == want and finished else 0.25 if text[:1] == want else 0.0)
        return out

    return copy_digit


def main(job_path: str) -> int:
    job = json.loads(open(job_path, encoding="utf-8").read())
    tok = AutoTokenizer.from_pretrained(job["model"])
    rows = Dataset.from_parquet(job["data"])
    rows = rows.select_columns(["prompt", "answer"])
    completions_per_step = job["prompts_per_step"] * job["group"]
    config = GRPOConfig(
        output_dir=job["output_dir"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=completions_per_step,  # counts completions: prompts x group
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,  # one update per generation batch
        num_generations=job["group"],
        max_completion_length=job["max_generate_length"],
        temperature=job["temperature"],
        top_p=1.0,
        top_k=0,
        max_steps=job["steps"],
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=job["adam_betas"][0],
        adam_beta2=job["adam_betas"][1],
        weight_decay=job["weight_decay"],
        max_grad_norm=job["max_grad_norm"],
        beta=0.0,  # no KL term and no reference model (rlc: use_kl_loss false)
        loss_type="dapo",  # token sum / tokens of the whole batch = rlc's token_mean
        scale_rewards="group",
        epsilon=job["eps_clip"],
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=job["seed"],
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=job["model"],
        reward_funcs=copy_digit_reward(tok.eos_token_id),
        args=config,
        train_dataset=rows,
        processing_class=tok,
    )
    clock = StepClock()
    trainer.add_callback(clock)

    gen_times: list[float] = []
    gen_tokens: list[int] = []
    generate = trainer._generate

    def timed_generate(prompts):
        t0 = time.perf_counter()
        out = generate(prompts)
        gen_times.append(time.perf_counter() - t0)
        gen_tokens.append(sum(len(ids) for ids in out[1]))  # out[1]: completion ids, EOS included
        return out

    trainer._generate = timed_generate
    T_READY = time.perf_counter()
    trainer.train()
    T_DONE = time.perf_counter()

    step_times = [e - b for b, e in zip(clock.begin, clock.end)]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    report = {
        "steps": len(step_times),
        "step_times": step_times,
        "generate_times": gen_times,
        "generated_tokens": gen_tokens,
        "rewards": [h.get("reward") for h in logs],
        "trl_step_time": [h.get("step_time") for h in logs],
        "mean_length": [h.get("completions/mean_length") for h in logs],
        "loop_s": clock.train_end - clock.train_begin,
        "seconds": {"import": T_IMPORTED - T_START, "setup": T_READY - T_IMPORTED, "train": T_DONE - T_READY},
        "torch_threads": torch.get_num_threads(),
        "versions": {m: __import__(m).__version__ for m in ("trl", "transformers", "torch", "accelerate")},
        "python": sys.version.split()[0],
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

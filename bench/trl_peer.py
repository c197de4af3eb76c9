"""Peer driver for bench/grpo_bench.py: GRPO with TRL's `GRPOTrainer` on the job rlc runs.

Runs inside the peer venv (bench/.venv-trl: torch 2.13.0 CPU, trl 1.16.0), never inside rlc's venv:

    bench/.venv-trl/bin/python bench/trl_peer.py JOB.json

JOB.json (written by grpo_bench.py) names the model directory rlc uses, the parquet file of prompts rlc
trains on (text prompts, or chat messages that TRL puts through the model's chat template as rlc does), the
environment that scores them, and the settings read from rlc's resolved config: prompts per step, group size,
training micro-batch, generation length, temperature, learning rate, AdamW betas and weight decay, gradient
clipping, PPO clip, seed, steps.

The reward is rlc's own: the environment class (`copy-the-digit`'s `CopyDigit`, `arithmetic`'s `Arithmetic`) is
loaded from its source file in runtime/envs/. The peer venv has no rlc, and those modules need only the standard
library and each other, so they run here unchanged.

Timing, all in this process: a callback notes the wall clock at `on_step_begin` and `on_step_end` of every
optimizer step (generation, rewards, loss forward and backward, clipping, optimizer step; not the logging after
it), a wrapper around the trainer's `_generate` times the generation and counts the completion tokens, and the
reward function keeps every step's rewards (their mean per step, and the share of rows whose group's rewards are
all equal: their advantages are 0). Prints one JSON line on stdout.

For bench/learning_curves.py the job may also hold `eval` (a parquet file of held-out rows, the steps after which to
evaluate, the batch and generation length): greedy generation on those rows with the trainer's current weights,
before training and after each listed step, scored by the environment's own `correct`, as rlc's eval/accuracy. An
evaluation runs after the step clock's end and before the next step's begin, so the step clock leaves it out. With
`time_limit_s` the training stops (and is evaluated) after the first step whose summed step time reaches it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

T_START = time.perf_counter()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

T_IMPORTED = time.perf_counter()

ENVS = Path(__file__).resolve().parent.parent / "runtime" / "envs"
ENV_CLASSES = {"synthetic": "CopyDigit", "arithmetic": "Arithmetic"}


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


def rlc_environment(name: str):
    """An instance of rlc's environment `name`, its module run from rlc's source (registered under its own module
    name, so `from rlc.runtime.envs.gsm8k import ...` inside it resolves to the file loaded here)."""
    for module in ("gsm8k", name):
        full = f"rlc.runtime.envs.{module}"
        if full not in sys.modules:
            spec = importlib.util.spec_from_file_location(full, ENVS / f"{module}.py")
            sys.modules[full] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(sys.modules[full])
    return getattr(sys.modules[f"rlc.runtime.envs.{name}"], ENV_CLASSES[name])()


class RlcReward:
    """TRL reward function scoring with rlc's environment; keeps each generation batch's rewards."""

    def __init__(self, env_class: str, eos_id: int, group: int):
        self.env, self.eos_id, self.group = rlc_environment(env_class), eos_id, group
        self.__name__ = env_class  # TRL names the reward's metrics after it
        self.batches: list[list[float]] = []

    def __call__(self, completions, answer, completion_ids, **_):
        out = []
        for text, want, ids in zip(completions, answer, completion_ids):
            if isinstance(text, list):  # a conversational completion: [{"role": "assistant", "content": ...}]
                text = text[-1]["content"]
            finished = bool(ids) and ids[-1] == self.eos_id
            out.append(float(self.env.reward({"answer": want}, text, finished)))
        self.batches.append(out)
        return out

    def inert_fraction(self, rewards: list[float]) -> float:
        """Share of rows in groups whose rewards are all equal (TRL's rows come group by group)."""
        groups = [rewards[i : i + self.group] for i in range(0, len(rewards), self.group)]
        return sum(len(g) for g in groups if max(g) == min(g)) / len(rewards)


class HeldOut(TrainerCallback):
    """Greedy held-out accuracy before training and after the listed steps (and the step that hits the time limit)."""

    def __init__(self, job: dict, tok, clock: StepClock, env):
        from datasets import Dataset as _Dataset

        spec = job["eval"]
        self.rows = _Dataset.from_parquet(spec["data"]).to_list()
        self.at, self.batch, self.new = set(spec["at"]), spec["batch"], spec["max_generate_length"]
        self.limit = job.get("time_limit_s")
        self.tok, self.clock, self.env = tok, clock, env
        self.points: list[dict] = []
        self.trainer = None

    def evaluate(self, step: int) -> None:
        model = self.trainer.model
        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        right, rewards, samples = 0, [], []
        side = self.tok.padding_side
        self.tok.padding_side = "left"
        try:
            for i in range(0, len(self.rows), self.batch):
                chunk = self.rows[i : i + self.batch]
                texts = [
                    self.tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in chunk
                ]
                enc = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
                with torch.no_grad():
                    out = model.generate(
                        **enc,
                        max_new_tokens=self.new,
                        do_sample=False,
                        pad_token_id=self.tok.pad_token_id,
                        eos_token_id=self.tok.eos_token_id,
                    )
                for row, ids in zip(chunk, out[:, enc["input_ids"].shape[1] :].tolist()):
                    finished = self.tok.eos_token_id in ids
                    ids = ids[: ids.index(self.tok.eos_token_id)] if finished else ids
                    text = self.tok.decode(ids, skip_special_tokens=True)
                    right += bool(self.env.correct(row, text))
                    rewards.append(float(self.env.reward(row, text, finished)))
                    if len(samples) < 3:
                        samples.append(text.strip())
        finally:
            self.tok.padding_side = side
            model.train(was_training)
        clock = sum(e - b for b, e in zip(self.clock.begin, self.clock.end))
        self.points.append(
            {
                "step": step,
                "train_clock_s": clock,
                "since_start_s": time.perf_counter() - T_START,
                "accuracy": right / len(rewards),
                "reward": sum(rewards) / len(rewards),
                "eval_s": time.perf_counter() - t0,
                "samples": samples,
            }
        )
        print(
            f"trl eval at step {step}: accuracy {right / len(rewards):.3f} (train clock {clock:.0f} s)", file=sys.stderr
        )

    def on_train_begin(self, args, state, control, **kwargs):
        self.evaluate(0)

    def on_step_end(self, args, state, control, **kwargs):
        clock = sum(e - b for b, e in zip(self.clock.begin, self.clock.end))
        over = self.limit is not None and clock >= self.limit
        if state.global_step in self.at or state.global_step == args.max_steps or over:
            self.evaluate(state.global_step)
        if over:
            control.should_training_stop = True


def main(job_path: str) -> int:
    job = json.loads(open(job_path, encoding="utf-8").read())
    tok = AutoTokenizer.from_pretrained(job["model"])
    rows = Dataset.from_parquet(job["data"])
    rows = rows.select_columns(["prompt", "answer"])
    completions_per_step = job["prompts_per_step"] * job["group"]
    # rlc's micro-batches: the step's completions in passes of `micro` rows, gradients accumulated into one
    # optimizer step. TRL generates once per `steps_per_generation` micro-batches; with as many accumulation steps,
    # its dapo loss is the token mean over the whole generation batch, as rlc's token_mean.
    micro = min(job["micro_train"], completions_per_step)
    if completions_per_step % micro:
        raise SystemExit(f"trl_peer: micro-batch {micro} does not divide {completions_per_step} completions")
    passes = completions_per_step // micro
    reward = RlcReward(job["env_class"], tok.eos_token_id, job["group"])
    config = GRPOConfig(
        output_dir=job["output_dir"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=micro,  # counts completions; passes x micro = prompts x group
        gradient_accumulation_steps=passes,
        steps_per_generation=passes,
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
        reward_funcs=reward,
        args=config,
        train_dataset=rows,
        processing_class=tok,
    )
    clock = StepClock()
    trainer.add_callback(clock)  # before HeldOut: a step's clock ends before its evaluation starts
    held_out = None
    if "eval" in job:
        held_out = HeldOut(job, tok, clock, reward.env)
        held_out.trainer = trainer
        trainer.add_callback(held_out)

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
        "rewards": [sum(r) / len(r) for r in reward.batches],
        "inert_fractions": [reward.inert_fraction(r) for r in reward.batches],
        "reward_batches": [len(r) for r in reward.batches],
        "trl_rewards": [h.get("reward") for h in logs],
        "trl_step_time": [h.get("step_time") for h in logs],
        "mean_length": [h.get("completions/mean_length") for h in logs],
        "loop_s": clock.train_end - clock.train_begin,
        "seconds": {"import": T_IMPORTED - T_START, "setup": T_READY - T_IMPORTED, "train": T_DONE - T_READY},
        "torch_threads": torch.get_num_threads(),
        "versions": {m: __import__(m).__version__ for m in ("trl", "transformers", "torch", "accelerate")},
        "python": sys.version.split()[0],
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "evals": held_out.points if held_out is not None else [],
        "gradient_accumulation_steps": passes,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

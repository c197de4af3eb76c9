"""Evaluation: mean reward and accuracy over the validation rows, at the steps the driver asks for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlc.core.job import EvalSettings, Sampling
from rlc.runtime.batch import Rollout
from rlc.runtime.dumps import dump_eval_results
from rlc.runtime.paths import expand

EVAL_SAMPLES_SHOWN = 3  # decoded completions printed per evaluation


@dataclass
class Evaluation:
    """How the run evaluates (`settings`: when, the eval sampling, batch size and samples per prompt, where the
    records go), with the driver's generation and decoding."""

    settings: EvalSettings
    generate: Callable[[list, Sampling, int, int], list[Rollout]]  # (rows, sampling, n, step) -> rollouts
    decode: Callable[[list[int]], str]
    tokenizer: Any

    def before_training(self, start_step: int) -> bool:
        """Whether a fresh run evaluates at step 0, before it trains."""
        return self.settings.before_train and start_step == 0

    def due(self, step: int, total_steps: int) -> bool:
        """Every eval_interval steps and after the last one (SkyRL's order), so a run ends with its final accuracy."""
        interval = self.settings.interval
        return interval > 0 and (step % interval == 0 or step == total_steps)

    def run(self, val: list, step: int, tracker=None) -> dict:
        """Mean reward and accuracy (the environment's `correct`, else reward >= 1) over the validation rows; the
        first few decoded completions go to the log."""
        sampling, size, n = self.settings.sampling, self.settings.batch_size, self.settings.n_samples_per_prompt
        dump_to = expand(self.settings.dump_to) if self.settings.dump_to is not None else None
        rewards: list[float] = []
        right = 0
        samples: list[str] = []
        dumped: list[dict] | None = [] if dump_to is not None else None
        for i in range(0, len(val), size):
            chunk = val[i : i + size]
            # A step-wise trajectory is judged on its last turn.
            rollouts = [r for r in self.generate(chunk, sampling, n, -step - 1) if r.last_step]
            for k, r in enumerate(rollouts):
                row, prompt_ids = chunk[k // n]
                text = self.decode(r.response_ids)
                right += r.correct if r.correct is not None else r.reward >= 1.0
                rewards.append(r.reward)
                if dumped is not None:
                    dumped.append(self.record(row, prompt_ids, r))
                if len(samples) < EVAL_SAMPLES_SHOWN:
                    samples.append(
                        f"  [{len(samples) + 1}] answer {row.get('answer')!s:>6}  reward {r.reward:.2f}  "
                        f"{r.finish_reason:<6} | {text.strip()!r}"
                    )
        out = {"eval/reward": sum(rewards) / max(1, len(rewards)), "eval/accuracy": right / max(1, len(rewards))}
        if dumped is not None:
            assert dump_to is not None
            dump_eval_results(dump_to, step, dumped, out)
        if tracker is not None:
            tracker.message(
                f"eval at step {step}: reward {out['eval/reward']:.3f}  accuracy {out['eval/accuracy']:.3f} "
                f"({len(rewards)} completions)\n" + "\n".join(samples)
            )
        return out

    def record(self, row: dict, prompt_ids: list[int], rollout: Rollout) -> dict:
        """One evaluated completion as SkyRL's dump_eval_results writes it (text decoded as generated)."""
        return {
            "input_prompt": self.tokenizer.decode(prompt_ids),
            "output_response": self.tokenizer.decode(rollout.response_ids),
            "score": rollout.reward,
            "stop_reason": rollout.finish_reason,
            "env_class": row.get("env_class") or self.settings.env_class,
            "env_extras": {k: v for k, v in row.items() if k != "prompt"},
            "data_source": row.get("data_source"),
        }

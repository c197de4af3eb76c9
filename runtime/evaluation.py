"""Evaluation: mean reward and accuracy over the validation rows, at the steps the driver asks for."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlc.core.job import Sampling
from rlc.runtime.batch import Rollout
from rlc.runtime.dumps import dump_eval_results

EVAL_SAMPLES_SHOWN = 3  # decoded completions printed per evaluation


@dataclass
class Evaluation:
    """How the run evaluates: the eval sampling, batch size and samples per prompt, and where the records go."""

    sampling: Sampling
    batch_size: int  # trainer.eval_batch_size
    n: int  # generator.eval_n_samples_per_prompt
    env_class: str  # the environment of rows that name none
    dump_to: Path | None  # trainer.export_path when trainer.dump_eval_results, else None
    generate: Callable[[list, Sampling, int, int], list[Rollout]]  # (rows, sampling, n, step) -> rollouts
    decode: Callable[[list[int]], str]
    tokenizer: Any

    def run(self, val: list, step: int, tracker=None) -> dict:
        """Mean reward and accuracy (the environment's `correct`, else reward >= 1) over the validation rows; the
        first few decoded completions go to the log."""
        sampling, size, n = self.sampling, self.batch_size, self.n
        rewards: list[float] = []
        right = 0
        samples: list[str] = []
        dumped: list[dict] | None = [] if self.dump_to is not None else None
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
            assert self.dump_to is not None
            dump_eval_results(self.dump_to, step, dumped, out)
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
            "env_class": row.get("env_class") or self.env_class,
            "env_extras": {k: v for k, v in row.items() if k != "prompt"},
            "data_source": row.get("data_source"),
        }

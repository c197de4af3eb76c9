"""Debug output under `trainer.export_path`, where SkyRL writes it.

- `trainer.dump_data_batch`: each step's training batch, `dumped_data/global_step_{N}_training_input.pkl`: a
  pickled dict of the batch's tensors (on the CPU) and its prompt length.
- `trainer.dump_eval_results`: each evaluation, `dumped_evals/global_step_{N}_evals/` (`eval_only` without a step):
  one `{data_source}.jsonl` per data source (`/` in its name becomes `_`; rows without one are `unknown`) with a
  line per completion (input_prompt, output_response, score, stop_reason, env_class, env_extras, data_source),
  and `aggregated_results.jsonl` with the evaluation's metrics.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import torch
from rlc.runtime.batch import TrainBatch


def dump_training_batch(export_path: Path, step: int, batch: TrainBatch) -> Path:
    """Write the batch the step trains on; returns the file."""
    data = {
        f.name: (value.detach().cpu() if torch.is_tensor(value) else value)
        for f in dataclasses.fields(batch)
        if (value := getattr(batch, f.name)) is not None
    }
    target = export_path / "dumped_data" / f"global_step_{step}_training_input.pkl"
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        pickle.dump(data, f)
    return target


def dump_eval_results(export_path: Path, step: int | None, completions: list[dict], metrics: dict) -> Path:
    """Write an evaluation's completions by data source and its metrics; returns the directory.

    Each completion is a dict with input_prompt, output_response, score, stop_reason, env_class, env_extras and
    data_source (None: `unknown`).
    """
    target = export_path / "dumped_evals" / ("eval_only" if step is None else f"global_step_{step}_evals")
    target.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[dict]] = {}
    for entry in completions:
        source = entry.get("data_source") or "unknown"
        by_source.setdefault(str(source), []).append({**entry, "data_source": source})
    for source, entries in by_source.items():
        with (target / f"{source.replace('/', '_')}.jsonl").open("w", encoding="utf-8") as f:
            for entry in entries:
                f.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
    with (target / "aggregated_results.jsonl").open("w", encoding="utf-8") as f:
        f.write(json.dumps(metrics, ensure_ascii=False, default=str) + "\n")
    return target

"""`rlc run` with the vllm engine on this machine (vLLM 0.30 built for CPUs): the local example learns as it does
with the hf engine, on its vLLM-shaped twin model (rlc:tiny's size with heads of 32, which vLLM's CPU attention has)."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc

pytest.importorskip("ray")
pytest.importorskip("vllm")


@pytest.mark.slow
def test_local_example_learns_with_the_vllm_engine(tmp_path, run_env):
    steps = 200
    data = tmp_path / "data"
    made = run_rlc("data", "synthetic", "-o", str(data), "--train", str(steps * 16), "--validation", "16")
    assert made.returncode == 0, made.stderr
    result = run_rlc(
        "run",
        str(EXAMPLES / "local-cpu.yaml"),
        "-o",
        str(tmp_path / "build"),
        "--no-progress",
        "generator.inference_engine.backend=vllm",
        "trainer.policy.model.path=rlc:tiny-vllm",
        f"data.train_data=['{data / 'train.parquet'}']",
        f"data.val_data=['{data / 'validation.parquet'}']",
        f"trainer.log_path={tmp_path / 'runs'}",
        "trainer.ckpt_interval=-1",
        env=run_env,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "runs" / "local-cpu-grpo" / "metrics.jsonl").read_text().splitlines()
    rewards = [json.loads(line)["reward"] for line in lines]
    assert len(rewards) == steps
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last > 0.5 and last > 10 * first, (first, last)
    # vLLM's per-step chatter stays out of the run's output (VLLM_LOGGING_LEVEL=WARNING in every process).
    assert "reset prefix cache" not in result.stderr and "Failed to load weights" not in result.stderr

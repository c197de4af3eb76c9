"""`rlc run` with the vllm engine on this machine (vLLM 0.30 built for CPUs): the local example learns as it does
with the hf engine, on its vLLM-shaped twin model (rlc:tiny's size with heads of 32, which vLLM's CPU attention has)."""

from __future__ import annotations

import pytest
from conftest import run_rlc
from test_run import _args as local_example_args
from test_run import _metrics

pytest.importorskip("ray")
pytest.importorskip("vllm")


@pytest.mark.slow
def test_local_example_learns_with_the_vllm_engine(tmp_path, run_env):
    steps = 200
    extra = (
        "generator.inference_engine.backend=vllm",
        "trainer.policy.model.path=rlc:tiny-vllm",
        "trainer.ckpt_interval=-1",
    )
    result = run_rlc("run", *local_example_args(tmp_path, steps * 16, *extra), env=run_env, timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    rewards = [m["reward"] for m in _metrics(tmp_path)]
    assert len(rewards) == steps
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last > 0.5 and last > 10 * first, (first, last)
    # vLLM's per-step chatter stays out of the run's output (VLLM_LOGGING_LEVEL=WARNING in every process).
    assert "reset prefix cache" not in result.stderr and "Failed to load weights" not in result.stderr

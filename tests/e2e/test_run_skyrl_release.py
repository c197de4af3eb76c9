"""SkyRL 0.4 settings the runtime runs, in a short `rlc run` of the local example: max_training_steps stops the
run early, and the training workers start with expandable segments (PYTORCH_CUDA_ALLOC_CONF) set."""

from __future__ import annotations

import pytest
from conftest import run_rlc
from test_run import _args, _metrics

pytest.importorskip("ray")
pytest.importorskip("transformers")
pytest.importorskip("torch")


@pytest.mark.slow
def test_max_training_steps_stops_the_run_early(tmp_path, run_env):
    result = run_rlc(
        "run",
        *_args(
            tmp_path,
            64,  # 16 steps an epoch at 4 prompts a step
            "trainer.train_batch_size=4",
            "trainer.policy_mini_batch_size=4",
            "trainer.micro_train_batch_size_per_gpu=32",
            "trainer.micro_forward_batch_size_per_gpu=32",
            "trainer.epochs=1",
            "trainer.eval_interval=-1",
            "trainer.eval_before_train=false",
            "trainer.ckpt_interval=-1",
            "trainer.max_training_steps=2",
            "trainer.use_expandable_segments=true",
            "trainer.algorithm.zero_variance_filter=true",
            "trainer.algorithm.zero_variance_filter_tol=0.5",
        ),
        env=run_env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["step"] for m in _metrics(tmp_path)] == [1, 2]

"""An imported verl job trains here end to end on verl-format data: `rlc data arithmetic --format verl` writes verl's
GSM8K rows, `rlc migrate --from verl` imports the job's overrides, `rlc run` trains one step on the CPU."""

from __future__ import annotations

import json

import pytest
from conftest import run_rlc

pytest.importorskip("ray")
pytest.importorskip("transformers")
pytest.importorskip("skyrl_gym")


@pytest.mark.slow
def test_an_imported_verl_job_trains_on_verl_data(tmp_path, run_env):
    data = tmp_path / "data"
    made = run_rlc("data", "arithmetic", "--format", "verl", "-o", str(data), "--train", "4", "--validation", "2")
    assert made.returncode == 0, made.stderr
    job = tmp_path / "overrides.yaml"  # what a verl launch passes main_ppo, as Hydra saves it
    overrides = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'validation.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=512",
        "data.max_response_length=4",
        "actor_rollout_ref.model.path=rlc:tiny",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=1",
        "trainer.total_epochs=1",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.experiment_name=verl-tiny",
        f"trainer.default_local_dir={tmp_path / 'ckpts'}",
    ]
    job.write_text("".join(f"- {o}\n" for o in overrides))
    spec = tmp_path / "spec.yaml"
    imported = run_rlc("migrate", "--from", "verl", str(job), "-o", str(spec))
    assert imported.returncode == 0, imported.stderr
    result = run_rlc(
        "run", str(spec), "-o", str(tmp_path / "build"), "--no-progress", f"trainer.log_path={tmp_path / 'runs'}",
        f"trainer.export_path={tmp_path / 'exports'}", env=run_env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [step] = [json.loads(line) for line in (tmp_path / "runs" / "verl-tiny" / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and 0.0 <= step["reward"] <= 1.0 and step["env/error_fraction"] == 0.0

"""`rlc run` of multi-turn jobs end to end: a tiny chat model, rows of two SkyRL-Gym environments in one dataset
(gsm8k_multi_turn, and text2sql against a SQLite database built here), a few steps each."""

from __future__ import annotations

import json
import shutil
import sqlite3
import textwrap
from pathlib import Path

import pytest
from conftest import run_rlc

pytest.importorskip("ray")
pytest.importorskip("skyrl_gym")
pytest.importorskip("transformers")

SPEC = """\
version: 1
name: multiturn-cpu
cluster: {{accelerator: none, gpus_per_node: 1, num_nodes: 1}}
launch: {{target: local}}
data:
  train_data: ["{data}/train.parquet"]
  val_data: ["{data}/validation.parquet"]
trainer:
  strategy: fsdp2
  policy:
    model: {{path: "{model}"}}
    optimizer_config: {{lr: 1.0e-3}}
  algorithm: {{advantage_estimator: grpo, use_kl_loss: false}}
  train_batch_size: 4
  policy_mini_batch_size: 4
  micro_train_batch_size_per_gpu: 16
  micro_forward_batch_size_per_gpu: 16
  eval_batch_size: 4
  eval_before_train: false
  eval_interval: 2
  max_prompt_length: 64
  max_training_steps: 2
  ckpt_interval: -1
  resume_mode: none
  bf16: false
  flash_attn: false
  gradient_checkpointing: false
  log_path: "{runs}"
  run_name: multiturn
  ckpt_path: "{runs}/ckpts"
  export_path: "{runs}/exports"
  logger: console
generator:
  inference_engine: {{backend: hf, model_dtype: float32, weight_sync_backend: gloo}}
  n_samples_per_prompt: 4
  max_turns: 3
  max_input_length: 512
  sampling_params: {{max_generate_length: 8, temperature: 1.0}}
environment:
  env_class: gsm8k_multi_turn
  skyrl_gym:
    text2sql: {{db_path: "{data}/sql"}}
"""


def write_data(root: Path) -> None:
    from rlc.runtime.data import write_rows

    db = root / "sql" / "spider" / "database" / "shop"
    db.mkdir(parents=True)
    with sqlite3.connect(db / "shop.sqlite") as conn:
        conn.execute("CREATE TABLE fruit (name TEXT, price INTEGER)")
        conn.executemany("INSERT INTO fruit VALUES (?, ?)", [("apple", 3), ("pear", 5)])

    def math(a: int, b: int) -> dict:  # SkyRL's GSM8K row shape, for the multi-turn environment
        return {
            "prompt": [{"role": "user", "content": f"{a} plus {b}?"}],
            "env_class": "gsm8k_multi_turn",
            "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
            "extra_info": {"max_turns": 3},
        }

    def sql(threshold: int) -> dict:
        return {
            "prompt": [{"role": "user", "content": f"fruit over {threshold}?"}],
            "env_class": "text2sql",
            "db_id": "shop",
            "data": "spider",
            "reward_spec": {"ground_truth": f"SELECT name FROM fruit WHERE price > {threshold}"},
        }

    write_rows([math(2, 3), sql(1), math(4, 4), sql(2), math(1, 6), sql(3), math(3, 3), sql(4)], root / "train.parquet")
    write_rows([math(5, 2), sql(2)], root / "validation.parquet")


def run(tmp_path: Path, model: str, run_env: dict, *overrides: str) -> list[dict]:
    data, runs = tmp_path / "data", tmp_path / "runs"
    write_data(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(SPEC.format(data=data, model=model, runs=runs)))
    result = run_rlc("run", str(spec), "-o", str(tmp_path / "build"), "--no-progress", *overrides, env=run_env,
                     timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in (runs / "multiturn" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_multi_turn_job_on_two_environments_trains(tmp_path, run_env, tiny_chat_model):
    metrics = run(tmp_path, tiny_chat_model, run_env)
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["env/turns"] > 1 for m in steps)  # both environments answer and go on
    assert all(m["env/error_fraction"] == 0 for m in steps)  # text2sql found its database
    assert "eval/accuracy" in metrics[-1]


@pytest.mark.slow
def test_a_step_wise_job_generated_ahead_trains(tmp_path, run_env, tiny_chat_model):
    metrics = run(
        tmp_path,
        tiny_chat_model,
        run_env,
        "generator.step_wise_trajectories=true",
        "cluster.gpus_per_node=2",
        "trainer.placement.colocate_all=false",
        "trainer.fully_async.enabled=true",
        "trainer.fully_async.max_staleness_steps=1",
        "trainer.fully_async.num_parallel_generation_workers=8",
    )
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["env/turns"] > 1 and "policy_loss" in m for m in steps)
    assert max(m["async/staleness"] for m in steps) <= 1


@pytest.fixture(scope="module")
def tiny_vllm_chat_model(rlc_cache, tmp_path_factory) -> str:
    """`rlc:tiny-vllm` (head size 32, which vLLM's CPU attention takes) with the tiny chat template."""
    from conftest import TINY_CHAT_TEMPLATE
    from rlc.runtime.models import local_path

    target = tmp_path_factory.mktemp("tiny-vllm-chat") / "model"
    shutil.copytree(local_path("rlc:tiny-vllm"), target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = TINY_CHAT_TEMPLATE
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return str(target)


@pytest.mark.slow
def test_a_multi_turn_job_trains_with_the_vllm_engine(tmp_path, run_env, tiny_vllm_chat_model):
    """The same two-environment job with vLLM (built for CPUs) generating every turn: its token ids and log-probs
    in, the environments' observations appended, the trained weights synced back before the second step."""
    pytest.importorskip("vllm")
    metrics = run(
        tmp_path,
        tiny_vllm_chat_model,
        run_env,
        "generator.inference_engine.backend=vllm",
        "generator.max_input_length=256",  # the engine's context (input + generation) within the model's 512 positions
    )
    steps = [m for m in metrics if "reward" in m]
    assert [m["step"] for m in steps] == [1, 2]
    assert all(m["env/turns"] > 1 for m in steps)
    assert all(m["env/error_fraction"] == 0 for m in steps)
    assert "eval/accuracy" in metrics[-1]

"""examples/local-cpu-smollm2.yaml runs end to end for a few steps: evaluation before and after training with the
accuracy in the metrics and decoded answers in the log, the final weights exported as a Hugging Face model, the plot.

The real SmolLM2 weights are not needed: the model is a tiny GGUF this test writes and converts as rlc:smollm2-135m
is converted. (The full learning run is a benchmark: bench/RESULTS.md.)"""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc

pytest.importorskip("ray")
pytest.importorskip("transformers")
pytest.importorskip("gguf")


def _run_example(tmp_path, run_env, example: str, task: str, *overrides: str):
    """`rlc run` of an example for two steps on the tiny stand-in of rlc:smollm2-135m, with a small dataset of
    `rlc data <task>`."""
    from rlc.runtime.models import convert_gguf
    from tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "model")
    data = tmp_path / "data"
    made = run_rlc("data", task, "--out", str(data), "--train", "16", "--val", "4")
    assert made.returncode == 0, made.stderr
    result = run_rlc(
        "run",
        str(EXAMPLES / example),
        "-o",
        str(tmp_path / "build"),
        "--no-progress",
        f"trainer.policy.model.path={tmp_path / 'model'}",
        f"data.train_data=['{data / 'train.parquet'}']",
        f"data.val_data=['{data / 'validation.parquet'}']",
        f"trainer.log_path={tmp_path / 'runs'}",
        f"trainer.export_path={tmp_path / 'exports'}",
        "trainer.max_training_steps=2",
        "generator.sampling_params.max_generate_length=4",
        "generator.eval_sampling_params.max_generate_length=4",
        *overrides,
        env=run_env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_smollm2_example_runs_with_evals_and_export(tmp_path, run_env):
    # the tiny tokenizer spells every byte
    result = _run_example(tmp_path, run_env, "local-cpu-smollm2.yaml", "arithmetic", "trainer.max_prompt_length=512")
    run_dir = tmp_path / "runs" / "local-cpu-smollm2"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in (metrics[0], metrics[-1]):  # before training and after the last step
        assert 0.0 <= m["eval/accuracy"] <= 1.0 and "eval/reward" in m
    assert "eval/accuracy" not in metrics[1] and "reward" in metrics[1]
    for step in (0, 2):
        assert f"eval at step {step}: reward" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("  [")]) == 6  # 3 answers per eval
    exported = tmp_path / "exports" / "global_step_2" / "policy"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in exported.iterdir()}
    plotted = run_rlc("plot", str(run_dir))
    assert plotted.returncode == 0, plotted.stderr
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_multiturn_example_runs_with_tool_metrics_and_plot(tmp_path, run_env):
    """examples/local-cpu-multiturn.yaml for two steps on the tiny stand-in: the calculator environment's
    metrics each step, evaluations before and after, the plot with the multi-turn panels' data."""
    long_prompts = ("trainer.max_prompt_length=2048", "generator.max_input_length=2200")
    _run_example(tmp_path, run_env, "local-cpu-multiturn.yaml", "calculator", *long_prompts)
    run_dir = tmp_path / "runs" / "local-cpu-multiturn"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert 0.0 <= metrics[0]["eval/accuracy"] <= 1.0 and 0.0 <= metrics[-1]["eval/accuracy"] <= 1.0
    for m in metrics[1:]:
        assert m["env/turns"] >= 1.0 and m["env/error_fraction"] == 0.0
        assert {"environment/tool_calls", "environment/tool_call_success", "environment/tool_used"} <= set(m)
    plotted = run_rlc("plot", str(run_dir))
    assert plotted.returncode == 0, plotted.stderr

"""The memory-fit check as a user meets it: `rlc plan` JSON and text, and the errors of validate and compile."""

from __future__ import annotations

import json
import re

from conftest import EXAMPLES, run_rlc
from rlc.compiler.memory import capacity, estimate
from rlc.compiler.model_size import model_info
from rlc.compiler.pipeline import compile_job

SPEC = """
version: 1
cluster: {{accelerator: {accel}, gpus_per_node: 8, num_nodes: 1}}
trainer:
  logger: console
  policy:
    model: {{path: {model}}}
  micro_train_batch_size_per_gpu: {micro}
  micro_forward_batch_size_per_gpu: {micro}
  algorithm: {{use_kl_loss: true}}
generator:
  inference_engine: {{gpu_memory_utilization: {gmu}, tensor_parallel_size: {tp}}}
  sampling_params: {{max_generate_length: {gen}}}
"""


def _write(spec_file, accel="H100", model="Qwen/Qwen2.5-1.5B-Instruct", micro=4, gmu=0.5, tp=1, gen=1024):
    return spec_file(SPEC.format(accel=accel, model=model, micro=micro, gmu=gmu, tp=tp, gen=gen))


def test_plan_json_carries_the_memory_in_the_documented_shape(spec_file, tmp_path):
    result = run_rlc("plan", str(_write(spec_file)), "--format", "json", "--svg", str(tmp_path / "p.svg"))
    assert result.returncode == 0, result.stderr
    memory = json.loads(result.stdout)["memory"]
    assert set(memory) == {"fits", "models", "gpus"} and memory["fits"] is True
    assert memory["models"]["policy"] == {
        "path": "Qwen/Qwen2.5-1.5B-Instruct",
        "params": 1_543_714_304,
        "source": "table",
    }
    assert len(memory["gpus"]) == 8
    for gpu in memory["gpus"]:
        assert set(gpu) == {"node", "gpu", "capacity_bytes", "peak_bytes", "fits", "phase", "parts", "phases"}
        assert gpu["capacity_bytes"] == capacity("H100") and gpu["peak_bytes"] == sum(gpu["parts"].values())
        # every phase of a colocated step, in the order it runs; the peak is the worst of them
        assert list(gpu["phases"]) == ["generate", "forward policy", "forward ref", "train policy", "weight sync"]
        assert gpu["peak_bytes"] == max(gpu["phases"].values()) == gpu["phases"][gpu["phase"]]
        assert gpu["phases"]["train policy"] > gpu["phases"]["forward policy"] > gpu["phases"]["weight sync"]
        assert all("/" in k and isinstance(v, int) for k, v in gpu["parts"].items())
    assert "#b6d7a8" in (tmp_path / "p.svg").read_text()  # GPUs coloured by fill (green: under 70%)


def test_plan_shows_every_gpus_memory_when_it_does_not_fit(spec_file, tmp_path):
    path = str(_write(spec_file, micro=160, gen=8192))
    result = run_rlc("plan", path, "--format", "json", "--svg", str(tmp_path / "p.svg"))
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["memory"]["fits"] is False and data["ok"] is False and len(data["memory"]["gpus"]) == 8
    for gpu in data["memory"]["gpus"]:
        assert gpu["fits"] is False and gpu["peak_bytes"] > gpu["capacity_bytes"] and gpu["phase"] == "train policy"
        assert gpu["peak_bytes"] == sum(gpu["parts"].values()) and "policy/logits" in gpu["parts"]
    assert [d["code"] for d in data["diagnostics"]] == ["RLC-E702"]
    assert "#e06666" in (tmp_path / "p.svg").read_text()  # red: over capacity
    text = run_rlc("plan", path, "--svg", str(tmp_path / "p.svg"))
    assert text.returncode == 1 and "DOES NOT FIT" in text.stdout and "RLC-E702" in text.stderr


def test_plan_text_shows_peak_and_capacity(spec_file, tmp_path):
    result = run_rlc("plan", str(_write(spec_file)), "--svg", str(tmp_path / "p.svg"))
    assert result.returncode == 0, result.stderr
    assert "node 0 gpu 0-7:" in result.stdout and "/ 79.6 GiB" in result.stdout and "engine/kv_cache" in result.stdout


def test_a_micro_batch_that_does_not_fit_even_short_rows_is_an_error_at_its_key(spec_file, tmp_path):
    path = _write(spec_file, micro=160, gen=8192)
    for command in (["validate", str(path)], ["compile", str(path), "-o", str(tmp_path / "out")]):
        result = run_rlc(*command, "--format", "json")
        assert result.returncode == 1, result.stdout
        (found,) = [d for d in json.loads(result.stdout)["diagnostics"] if d["code"] == "RLC-E702"]
        assert found["key"] == "trainer.micro_train_batch_size_per_gpu" and found["line"] == 7
        assert "even with rows of 1088 tokens (1/8 of the longest, 8704)" in found["message"]
        # The fix holds for rows of the longest length, and divides the 1024*5/8 = 640 rows of a mini-batch per GPU.
        (micro,) = re.findall(r"lower trainer.micro_train_batch_size_per_gpu to (\d+)", found["hint"])
        assert 640 % int(micro) == 0
        assert found["values"]["peak_bytes"] > found["values"]["capacity_bytes"]
    assert not (tmp_path / "out").exists()


def test_a_micro_batch_that_fits_only_shorter_rows_is_a_warning_naming_the_length(spec_file):
    result = run_rlc("validate", str(_write(spec_file, micro=80, gen=8192)), "--format", "json")
    assert result.returncode == 0, result.stdout
    (found,) = json.loads(result.stdout)["diagnostics"]
    assert found["code"] == "RLC-W704" and found["key"] == "trainer.micro_train_batch_size_per_gpu"
    limit = found["values"]["fits_up_to_tokens"]
    assert 1088 < limit < 8704 and found["values"]["longest_tokens"] == 8704
    assert f"rows average at most {limit} tokens" in found["message"]
    assert "lower trainer.micro_train_batch_size_per_gpu to" in found["hint"]
    # Rows of the length it names fit; one token longer they do not.
    job = compile_job(_write(spec_file, micro=80, gen=8192))
    assert estimate(job.analysis.spec, job.plan, limit / 8704).fits
    assert not estimate(job.analysis.spec, job.plan, (limit + 1) / 8704).fits


def test_a_model_too_large_for_its_gpus_names_the_model(spec_file):
    result = run_rlc("validate", str(_write(spec_file, model="Qwen/Qwen2.5-72B-Instruct", micro=1, tp=8)))
    assert result.returncode == 1
    assert "RLC-E701" in result.stderr and "cpu_offload" in result.stderr and "RLC-E705" not in result.stderr
    result = run_rlc("validate", str(_write(spec_file, accel="L4", model="Qwen/Qwen2.5-72B-Instruct", micro=1)))
    assert "RLC-E705" in result.stderr  # 72B in bf16 on one L4 leaves no KV cache


def test_above_ninety_percent_is_a_warning(spec_file):
    result = run_rlc("validate", str(_write(spec_file, gmu=0.95)), "--format", "json")
    assert result.returncode == 0
    assert [d["code"] for d in json.loads(result.stdout)["diagnostics"]] == ["RLC-W701"]


def test_an_unknown_hub_id_is_a_warning_naming_how_to_size_it(spec_file):
    result = run_rlc("validate", str(_write(spec_file, model="someone/not-a-model")))
    assert result.returncode == 0, result.stderr
    assert "RLC-W702" in result.stderr and "model_config_kwargs" in result.stderr
    assert model_info("someone/not-a-model", {"hidden_size": 64}).shape is None  # not enough to size it


def test_unknown_accelerator_and_cpu_only_skip_the_gpu_check(spec_file, tmp_path):
    result = run_rlc("validate", str(_write(spec_file, accel="TPU-v9")))
    assert result.returncode == 0 and "RLC-W703" in result.stderr
    result = run_rlc("plan", str(EXAMPLES / "local-cpu.yaml"), "--format", "json", "--svg", str(tmp_path / "p.svg"))
    assert json.loads(result.stdout)["memory"]["gpus"] == []


def test_explain_memory_documents_the_estimate():
    result = run_rlc("explain", "memory")
    assert result.returncode == 0 and "gpu_memory_utilization" in result.stdout and "RLC-E701" in result.stdout
    result = run_rlc("explain", "trainer.micro_train_batch_size_per_gpu")
    assert "RLC-E702" in result.stdout


def test_every_example_fits():
    for example in sorted(EXAMPLES.glob("*.yaml")):
        result = run_rlc("validate", str(example), "--format", "json")
        codes = [d["code"] for d in json.loads(result.stdout)["diagnostics"]]
        assert result.returncode == 0 and not [c for c in codes if c.startswith("RLC-E7")], (example, codes)


def test_a_token_budget_and_sequence_parallelism_bound_the_activations(spec_file):
    """80 rows of 4608 tokens per micro-batch fit an H100 only at shorter rows (a warning: rows shrink, a budget does
    not); a budget of 8192 tokens fits outright. A budget of the 80 rows' tokens does not fit at all, until every row
    is split over 4 GPUs in the roles that train and score."""
    path = _write(spec_file, micro=80, gen=4096)

    def found(*overrides: str) -> list[dict]:
        result = run_rlc("validate", str(path), *overrides, "--format", "json")
        return json.loads(result.stdout)["diagnostics"]

    assert [d["code"] for d in found()] == ["RLC-W704"]
    assert found("trainer.max_tokens_per_microbatch=8192") == []
    (error,) = [d for d in found("trainer.max_tokens_per_microbatch=368640") if d["severity"] == "error"]
    assert error["code"] == "RLC-E702" and error["key"] == "trainer.max_tokens_per_microbatch"
    assert "lower trainer.max_tokens_per_microbatch to" in error["hint"]
    split = ("trainer.policy.sequence_parallel_size=4", "trainer.ref.sequence_parallel_size=4")
    assert found("trainer.max_tokens_per_microbatch=368640", *split) == []


def test_a_token_budget_bounds_megatrons_activations_and_context_parallelism_splits_them(spec_file):
    """Under megatron as under fsdp2: 80 rows of 4608 tokens fit only at shorter rows, a budget of 8192 tokens fits
    outright; one of 100000 tokens does not fit whole, and does with each row over a context group of 4 GPUs."""
    path = _write(spec_file, micro=80, gen=4096)

    def found(*overrides: str) -> list[dict]:
        result = run_rlc("validate", str(path), "trainer.strategy=megatron", *overrides, "--format", "json")
        return json.loads(result.stdout)["diagnostics"]

    assert [d["code"] for d in found()] == ["RLC-W704"]
    assert found("trainer.max_tokens_per_microbatch=8192") == []
    (error,) = [d for d in found("trainer.max_tokens_per_microbatch=100000") if d["severity"] == "error"]
    assert error["code"] == "RLC-E702" and error["key"] == "trainer.max_tokens_per_microbatch"
    assert "lower trainer.max_tokens_per_microbatch to" in error["hint"]
    split = tuple(f"trainer.{role}.megatron_config.context_parallel_size=4" for role in ("policy", "ref"))
    assert found("trainer.max_tokens_per_microbatch=100000", *split) == []

"""`rlc fit`: every proposal validates and fits by rlc's own rules, from half a billion to 72B parameters on 1 to
64 GPUs; the command prints it as overrides and a diff, and writes it into the spec only when asked."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.compiler.fit import fit
from rlc.compiler.pipeline import compile_job
from rlc.core.overrides import parse_override

SWEEP = """
version: 1
cluster: {{accelerator: H100, gpus_per_node: {per_node}, num_nodes: {nodes}}}
trainer:
  logger: console
  policy: {{model: {{path: {model}}}}}
  placement: {{colocate_all: {colocate}}}
  algorithm: {{use_kl_loss: true}}
  train_batch_size: 128
  policy_mini_batch_size: 64
  micro_train_batch_size_per_gpu: 8
  micro_forward_batch_size_per_gpu: 16
  max_prompt_length: 1024
generator:
  n_samples_per_prompt: 8
  inference_engine: {{backend: vllm, gpu_memory_utilization: 0.8{engines}}}
  sampling_params: {{max_generate_length: 4096}}
"""
MODELS = [
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen2.5-32B-Instruct",
    "Qwen/Qwen2.5-72B-Instruct",
]
LAYOUTS = [(1, True), (2, False), (8, True), (8, False), (64, True), (64, False)]  # GPUs, colocate_all


def _memory_findings(result) -> list[str]:
    return [d.code for d in result.diagnostics if d.code.startswith("RLC-E7") or d.code == "RLC-W704"]


@pytest.mark.parametrize("model", MODELS)
def test_every_proposal_validates_and_fits(spec_file, model):
    proposals = 0
    for gpus, colocate in LAYOUTS:
        per_node, nodes = (gpus, 1) if gpus <= 8 else (8, gpus // 8)
        engines = "" if colocate else f", num_engines: {gpus // 2}"  # half the GPUs generate, half train
        path = spec_file(
            SWEEP.format(per_node=per_node, nodes=nodes, model=model, colocate=str(colocate).lower(), engines=engines)
        )
        found = fit(str(path))
        where = f"{model} on {gpus} GPUs, colocate_all {colocate}"
        assert found.status in ("fits", "proposal"), f"{where}: {found.status} {found.note}"
        again = compile_job(str(path), [parse_override(o) for o in found.overrides])  # rlc's own verdict, afresh
        assert again.ok and again.memory is not None and again.memory.fits, where
        assert not _memory_findings(again), where
        if found.status == "fits":
            assert not found.changes and not _memory_findings(found.base), where
        else:
            proposals += 1
            assert _memory_findings(found.base) or not found.base.memory.fits, where
            assert all(c.cost for c in found.changes), where
    if model.endswith("72B-Instruct"):
        assert proposals == len(LAYOUTS)  # 72B fits none of these as written


def test_a_job_that_fits_says_so_and_max_grows_the_micro_batches(tmp_path):
    spec = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
    plain = run_rlc("fit", str(spec))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith(f"{spec}: fits") and "proposal" not in plain.stdout
    largest = run_rlc("fit", str(spec), "--max", "--format", "json")
    assert largest.returncode == 0, largest.stderr
    data = json.loads(largest.stdout)
    assert data["status"] == "fits" and data["after"]["fits"] is True
    grown = {c["key"]: (c["before"], c["after"]) for c in data["changes"]}
    before, after = grown["trainer.micro_forward_batch_size_per_gpu"]
    assert after > before == 40
    # the largest keeps every GPU under RLC-W701's 90%: one more row does not
    grown_job = compile_job(str(spec), [parse_override(o) for o in data["overrides"]])
    assert grown_job.ok and not grown_job.warnings
    over = compile_job(str(spec), [parse_override(f"trainer.micro_forward_batch_size_per_gpu={after + 1}")])
    assert "RLC-W701" in [d.code for d in over.diagnostics]


def test_a_proposal_is_printed_and_written_only_when_asked(tmp_path):
    spec = tmp_path / "job.yaml"
    shutil.copy(EXAMPLES / "gsm8k-grpo-8xh100.yaml", spec)
    original = spec.read_text()
    big = "trainer.policy.model.path=Qwen/Qwen2.5-32B-Instruct"
    shown = run_rlc("fit", str(spec), big)
    assert shown.returncode == 0, shown.stderr
    assert "does not fit" in shown.stdout and "proposal (" in shown.stdout
    assert (
        "overrides: trainer.micro_train_batch_size_per_gpu=" in shown.stdout
        and "x more training passes" in shown.stdout
    )
    assert "-  micro_train_batch_size_per_gpu: 40" in shown.stdout  # the diff
    assert spec.read_text() == original  # nothing written without --write
    written = run_rlc("fit", str(spec), big, "--write")
    assert written.returncode == 0 and f"wrote {spec}" in written.stdout
    text = spec.read_text()
    assert "Qwen/Qwen2.5-32B-Instruct" in text and "# SkyRL's figure; `rlc plan` shows" in text  # comments kept
    assert run_rlc("fit", str(spec)).stdout.startswith(f"{spec}: fits")


def test_out_of_memory_error_points_at_fit_and_other_errors_come_first(spec_file):
    path = spec_file(SWEEP.format(per_node=1, nodes=1, model=MODELS[2], colocate="true", engines=""))
    found = json.loads(run_rlc("validate", str(path), "--format", "json").stdout)["diagnostics"]
    assert any(d["code"].startswith("RLC-E70") and d["hint"].endswith("`rlc fit` proposes a fix") for d in found)
    broken = spec_file(
        SWEEP.format(per_node=1, nodes=1, model=MODELS[0], colocate="true", engines="").replace(
            "policy_mini_batch_size: 64", "policy_mini_batch_size: 200"
        )
    )
    result = run_rlc("fit", str(broken))
    assert result.returncode == 1 and "fix them first" in result.stderr


def test_the_editor_offers_the_proposal_on_the_line_it_changes():
    from lsprotocol import types as lsp
    from rlc.compiler.lsp import features
    from rlc.compiler.pipeline import compile_text

    text = (EXAMPLES / "gsm8k-grpo-8xh100.yaml").read_text().replace("Qwen2.5-1.5B-Instruct", "Qwen2.5-14B-Instruct")
    result = compile_text(text, "job.yaml")
    lines = text.splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("  micro_train_batch_size_per_gpu:"))
    where = lsp.Range(lsp.Position(n, 0), lsp.Position(n, len(lines[n])))
    found = {a.title: a for a in features.actions(lines, "file:///job.yaml", where, result.diagnostics, result)}
    action = found["rlc fit: micro_train_batch_size_per_gpu 40 -> 20"]
    assert action.edit.changes["file:///job.yaml"][0].new_text == "20"


def test_a_megatron_job_is_split_wider():
    spec = str(EXAMPLES / "gsm8k-grpo-megatron-8xh100.yaml")
    found = fit(spec, [parse_override("trainer.policy.model.path=Qwen/Qwen2.5-32B-Instruct")])
    assert found.status == "proposal", found.note
    assert {c.key for c in found.changes} >= {"trainer.policy.megatron_config.tensor_model_parallel_size"}
    again = compile_job(
        spec,
        [parse_override("trainer.policy.model.path=Qwen/Qwen2.5-32B-Instruct")]
        + [parse_override(o) for o in found.overrides],
    )
    assert again.ok and again.memory is not None and again.memory.fits and not _memory_findings(again)

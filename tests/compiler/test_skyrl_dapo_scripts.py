"""SkyRL's DAPO launch scripts (tests/fixtures/skyrl-dapo-scripts, SkyRL @a9564572e): each launches main_dapo (or its
fully-async or TIS variant) and imports with `rlc migrate` into a spec that carries DAPO's soft overlong penalty
(trainer.algorithm.overlong_buffer_*), then validates (given, with --env, what a script reads from the environment and
never sets)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.pipeline import compile_job

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "skyrl-dapo-scripts"
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh"))
DAPO = "examples/train/algorithms/dapo"
DELTA = "examples/train/delta_weight_sync/run_dapo_qwen3.5_35b_a3b_delta.sh"
LORA_MOE = "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora.sh"
# What a script reads from the environment and never sets, given as `rlc migrate --env` gives it.
ENV = {
    DELTA: {"SYNC_DIR": "gs://bucket/run", "RUN_ID": "20260101_000000"},
    LORA_MOE: {"REMOVE_MICROBATCH_PADDING": "true"},
}
# OVERLONG_BUFFER_LEN where it is not $((1024 * 4)); every script's penalty factor is 1.0.
BUFFERS = {
    f"{DAPO}/run_dapo_gsm8k.sh": 512,
    "examples/train/tis_correction/run_dapo_tis.sh": 512,
    "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora_int4_qat.sh": 1024,
}


def test_the_fixtures_are_skyrls_dapo_scripts():
    assert len(SCRIPTS) == 25  # 22 of main_dapo, 2 of main_dapo_fully_async, 1 of main_tis_dapo
    assert set(ENV) <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_dapo_script_imports_with_its_overlong_penalty_and_validates(name, tmp_path):
    text = (ROOT / name).read_text()
    imported, errors, _ = import_script(str(ROOT / name), ENV.get(name, {}), [])
    assert imported is not None and not errors, [d.message for d in errors]
    algorithm = yaml.safe_load(imported.text)["trainer"]["algorithm"]
    assert "trainer.algorithm.overlong_buffer_len=$OVERLONG_BUFFER_LEN" in text  # every one sets its buffer
    assert (algorithm["overlong_buffer_len"], algorithm["overlong_buffer_penalty_factor"]) == (
        BUFFERS.get(name, 4096),
        1,
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(imported.text)
    result = compile_job(spec)
    codes = {d.code for d in result.diagnostics if d.is_error}
    assert not codes, [d.message for d in result.diagnostics if d.is_error]


def test_a_value_the_script_never_sets_is_said_empty(tmp_path):
    # run_megatron_dapo_qwen3.6_35b_a3b_lora.sh passes trainer.remove_microbatch_padding=$REMOVE_MICROBATCH_PADDING
    # and sets the variable nowhere: without --env the key is empty, which rlc validate names.
    imported, errors, _ = import_script(str(ROOT / LORA_MOE), {}, [])
    assert imported is not None and not errors
    spec = tmp_path / "spec.yaml"
    spec.write_text(imported.text)
    errors = [d for d in compile_job(spec).diagnostics if d.is_error]
    assert {d.code for d in errors} == {"RLC-E016"}, [d.message for d in errors]


def test_main_tis_dapos_other_buffer_anchor_is_said_aloud():
    imported, _, _ = import_script(str(ROOT / "examples/train/tis_correction/run_dapo_tis.sh"), {}, [])
    assert imported is not None
    [note] = [c for c in imported.changes if c.severity == "error" and c.new == "trainer.algorithm.overlong_buffer_len"]
    assert "context's end" in note.reason


def test_main_dapos_defaults_are_written_where_a_script_sets_no_buffer(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text("uv run --isolated --extra fsdp -m examples.train.algorithms.dapo.main_dapo \\\n"
                      "  trainer.algorithm.advantage_estimator=grpo \\\n  $@\n")  # fmt: skip
    imported, _, _ = import_script(str(script), {}, [])
    assert imported is not None
    algorithm = yaml.safe_load(imported.text)["trainer"]["algorithm"]
    assert (algorithm["overlong_buffer_len"], algorithm["overlong_buffer_penalty_factor"]) == (512, 1.0)
    assert "main_dapo's default" in imported.text


def test_the_int4_qat_scripts_fused_lm_head_imports_to_the_spec_field():
    name = "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora_int4_qat.sh"
    assert "trainer.fused_lm_head_logprob=true" in (ROOT / name).read_text()
    imported, errors, _ = import_script(str(ROOT / name), {}, [])
    assert imported is not None and not errors
    trainer = yaml.safe_load(imported.text)["trainer"]
    assert trainer["fused_lm_head_logprob"] is True
    assert trainer.get("fused_lm_head_logprob_backend", "torch") == "torch"

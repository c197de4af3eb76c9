"""SkyRL's DAPO launch scripts (tests/fixtures/skyrl-dapo-scripts, SkyRL @a9564572e): each launches main_dapo (or its
fully-async or TIS variant) and imports with `rlc migrate` into a spec that carries DAPO's soft overlong penalty
(trainer.algorithm.overlong_buffer_*), then validates, or is judged invalid by `rlc validate` for a feature named
below that this issue does not add."""

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
ENV = {DELTA: {"SYNC_DIR": "gs://bucket/run", "RUN_ID": "20260101_000000"}}
# Qwen3.6-27B (Qwen3.5's dense hybrid) converts under Megatron, but rlc's Megatron LoRA does not cover its layers
QWEN3_5_LORA = {"RLC-E541"}
# language_model_only under Megatron for a checkpoint rlc cannot read (a third party's INT4 Qwen3.6-35B-A3B)
UNKNOWN_TEXT_MODEL = {"RLC-E811"}
# Imported, then judged invalid by `rlc validate`, with the codes it gives: inference and Megatron features that
# issues of their own add (LoRA on Qwen3.5 under Megatron, MTP, QAT), none DAPO's. Routing replay
# (router_replay/run_dapo_moonlight_16b_a3b.sh) validates: Moonlight's family is known at start-up (Megatron-Bridge).
INVALID = {
    "examples/train/megatron/run_megatron_dapo_qwen3.6_27b_lora.sh": QWEN3_5_LORA,
    # REMOVE_MICROBATCH_PADDING is read from the environment and never set: --env gives it
    "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora.sh": QWEN3_5_LORA | {"RLC-E016"},
    # the fused LM-head log-probs (fake-INT4 QAT, its bf16 masters and the unmerged Megatron LoRA it asks for run)
    "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora_int4_qat.sh": UNKNOWN_TEXT_MODEL | {"RLC-E817"},
}


# OVERLONG_BUFFER_LEN where it is not $((1024 * 4)); every script's penalty factor is 1.0.
BUFFERS = {
    f"{DAPO}/run_dapo_gsm8k.sh": 512,
    "examples/train/tis_correction/run_dapo_tis.sh": 512,
    "examples/train/megatron/run_megatron_dapo_qwen3.6_35b_a3b_lora_int4_qat.sh": 1024,
}


def test_the_fixtures_are_skyrls_dapo_scripts():
    assert len(SCRIPTS) == 25  # 22 of main_dapo, 2 of main_dapo_fully_async, 1 of main_tis_dapo
    assert set(INVALID) <= set(SCRIPTS)
    assert len(SCRIPTS) - len(INVALID) == 22  # import and validate


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
    assert codes == INVALID.get(name, set()), [d.message for d in result.diagnostics if d.is_error]


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

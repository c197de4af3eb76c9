"""SkyRL's example launch scripts that reach main_base (tests/fixtures/skyrl-scripts, SkyRL @a9564572e): each one
imports with `rlc migrate` and then validates, or is refused for a reason it names; `rlc validate` of each result
judges it as SkyRL 0.4.0's own validation does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.pipeline import compile_job
from rlc.core.plain import plain_yaml

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "skyrl-scripts"
SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh"))
RLC = Path(sys.executable).with_name("rlc")

# What the delta-weight-sync scripts require (`${SYNC_DIR:?...}`) or compute (`$(date ...)`): given with --env.
DELTA = {"SYNC_DIR": "gs://bucket/run", "RUN_ID": "20260101_000000"}
ENV = {
    "examples/train/delta_weight_sync/run_gsm8k_qwen1p5b_gcs.sh": DELTA,
    "examples/train/delta_weight_sync/run_gsm8k_qwen1p5b_nfs.sh": DELTA,
    "examples/train/delta_weight_sync/run_gsm8k_qwen1p5b_s3.sh": DELTA,
    "examples/train/delta_weight_sync/disagg/run_gsm8k_qwen1p5b_s3.sh": {
        **DELTA,
        "EXTERNAL_PROXY_URL": "http://proxy:8000",
        "EXTERNAL_SERVER_URLS": "['http://a:8001']",
    },
}
ARCTIC = "hands the job to the integration entrypoint integrations.arctic_rl.entrypoint"
# Refused at import, and why (nothing is written).
REFUSED = {
    "integrations/arctic_rl/examples/run_bird_grpo_32b_32gpu.sh": ARCTIC,
    "integrations/arctic_rl/examples/run_bird_grpo_8b_32gpu.sh": ARCTIC,
    "integrations/arctic_rl/examples/run_bird_grpo_smoke.sh": ARCTIC,
    "integrations/arctic_rl/examples/run_gsm8k_grpo_4gpu.sh": ARCTIC,
    # main_dapo's overlong-buffer fields given to main_base, whose strict config parse refuses them in SkyRL too
    "examples/train/megatron/run_megatron_dapo_qwen3_235b_a22b_lora.sh": "which skyrl.train.entrypoints.main_base's "
    "strict config parse refuses",
}
# Imported, then judged invalid by `rlc validate`, with the codes it gives.
INVALID = {
    # SkyRL's own validate_batch_sizes refuses it too: (4 prompts * 5 samples) // 4 GPUs = 5 is no multiple of 8
    "examples/train/training_backends/run_no_seq_pack.sh": {"RLC-E106"},
}
# Routing replay (R3) validates: Moonlight is DeepSeek-V3-shaped, a model whose config rlc cannot read offline, so
# whether it has experts (RLC-E537) is checked at start-up, where rlc's Megatron worker builds it with Megatron-Bridge.
ROUTER_REPLAY = "examples/train/router_replay/run_moonlight16b_router_replay.sh"


def test_the_fixtures_are_skyrls_main_base_scripts():
    assert len(SCRIPTS) == 57  # 49 direct, 4 through another script, 4 with an integration's entrypoint
    assert set(ENV) | set(REFUSED) | set(INVALID) <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_imports_and_validates_or_is_refused_by_name(name, tmp_path):
    path = ROOT / name
    try:
        imported, errors, _ = import_script(str(path), ENV.get(name, {}), [])
    except NotImportable as exc:
        assert name in REFUSED and REFUSED[name] in str(exc), exc
        return
    assert name not in REFUSED
    assert imported is not None and not errors, [d.message for d in errors]
    spec = tmp_path / "spec.yaml"
    spec.write_text(imported.text)
    result = compile_job(spec)
    codes = {d.code for d in result.diagnostics if d.is_error}
    assert codes == INVALID.get(name, set()), [d.message for d in result.diagnostics if d.is_error]


def test_the_routing_replay_script_carries_both_flags(tmp_path):
    imported, errors, _ = import_script(str(ROOT / ROUTER_REPLAY), {}, [])
    assert imported is not None and not errors
    spec = tmp_path / "spec.yaml"
    spec.write_text(imported.text)
    result = compile_job(spec)
    assert not [d for d in result.diagnostics if d.is_error]
    assert result.spec.trainer.policy.megatron_config.moe_enable_routing_replay is True
    assert result.spec.generator.inference_engine.enable_return_routed_experts is True
    assert result.decisions is not None
    engines = result.decisions.engines
    assert engines.routed_experts and engines.vllm is not None and engines.vllm.enable_return_routed_experts


@pytest.mark.parametrize("first,errors", [(20, set()), (21, {"RLC-E507"})])
def test_skyrls_pipeline_layout_keys_are_carried_and_checked(first, errors, tmp_path):
    """SkyRL sets uneven and virtual stages in transformer_config_kwargs: Qwen3-30B-A3B's 48 layers on 2 stages of 2
    virtual stages each take 20 + 28, not 21 + 27 (a stage's layers divide by the virtual stages)."""
    kwargs = "trainer.policy.megatron_config.transformer_config_kwargs"
    extra = [f"{kwargs}.num_layers_in_first_pipeline_stage={first}", f"{kwargs}.virtual_pipeline_model_parallel_size=2"]
    imported, found, _ = import_script(str(ROOT / "examples/train/megatron/run_megatron_qwen3-30b-a3b.sh"), {}, extra)
    assert imported is not None and not found and "!!" not in imported.text
    spec = tmp_path / "spec.yaml"
    spec.write_text(imported.text)
    result = compile_job(spec)
    given = result.spec.trainer.policy.megatron_config.transformer_config_kwargs
    assert (given["num_layers_in_first_pipeline_stage"], given["virtual_pipeline_model_parallel_size"]) == (first, 2)
    assert {d.code for d in result.diagnostics if d.is_error} == errors


def test_each_value_keeps_its_script_line():
    path = ROOT / "examples/train/gsm8k/run_gsm8k.sh"
    imported, errors, warnings = import_script(str(path), {}, ["trainer.epochs=3"])
    assert imported is not None and not errors
    lines = path.read_text().splitlines()
    for line in imported.text.splitlines():
        if "# line " in line:
            key = line.split(":")[0].strip()
            number = int(line.rsplit("# line ", 1)[1])
            assert key in lines[number - 1], (line, lines[number - 1])
    data = plain_yaml(load_document_text(imported.text))
    assert data["trainer"]["epochs"] == 3  # "$@" after the script's own trainer.epochs=20 wins, as in bash
    assert "  epochs: 3  # the command line" in imported.text
    # $HOME is left to the environment the job runs in, and said so
    assert data["trainer"]["ckpt_path"] == "${oc.env:HOME}/ckpts/gsm8k_1.5B_ckpt"
    assert [d.code for d in warnings] == ["RLC-W060"] and "HOME" in warnings[0].message


def load_document_text(text: str):
    from rlc.compiler.load import document_from_text

    return document_from_text(text, "imported.yaml").data


def test_a_value_only_running_the_script_gives_is_named():
    script = str(ROOT / "examples/train/delta_weight_sync/run_gsm8k_qwen1p5b_gcs.sh")
    imported, errors, warnings = import_script(script, {}, [])
    assert imported is None
    assert [d.code for d in errors] == ["RLC-E061"]
    assert "SYNC_DIR" in errors[0].message and errors[0].hint == "pass --env SYNC_DIR=VALUE"
    # RUN_ID=$(date ...) only names the run and its files: the import's date, said so
    dated = [d for d in warnings if d.code == "RLC-W061"]
    assert len(dated) == 1 and "RUN_ID" in dated[0].message and "$(date +%Y%m%d_%H%M%S)" in dated[0].message
    imported, errors, _ = import_script(script, {"SYNC_DIR": "gs://bucket/run"}, [])
    assert imported is not None and not errors
    run_name = plain_yaml(load_document_text(imported.text))["trainer"]["run_name"]
    assert re.fullmatch(r"gsm8k-qwen1p5b-delta-gcs-\d{8}_\d{6}", run_name), run_name


def test_a_date_that_changes_what_runs_is_still_an_error(tmp_path):
    script = tmp_path / "seeded.sh"
    script.write_text(
        "STAMP=$(date +%s)\nuv run -m skyrl.train.entrypoints.main_base trainer.seed=$STAMP "
        "trainer.run_name=run-$STAMP\n"
    )
    imported, errors, warnings = import_script(str(script), {}, [])
    assert imported is None and [d.code for d in errors] == ["RLC-E061"] and "STAMP" in errors[0].message
    assert not [d for d in warnings if d.code == "RLC-W061"]


def test_other_entrypoints_are_refused_by_name(tmp_path):
    script = tmp_path / "custom.sh"
    script.write_text("uv run --isolated --extra fsdp -m examples.train.algorithms.my_algo.main trainer.epochs=1\n")
    with pytest.raises(NotImportable, match="it launches examples.train.algorithms.my_algo.main; rlc imports"):
        import_script(str(script), {}, [])
    script.write_text("uv run -m skyrl.train.entrypoints.main_base +trainer.extra=1\n")
    with pytest.raises(NotImportable, match="refused by SkyRL too"):
        import_script(str(script), {}, [])


def test_the_cli_imports_a_script_and_the_result_validates(tmp_path):
    env = {**os.environ, "NO_COLOR": "1"}
    out = tmp_path / "spec.yaml"
    script = ROOT / "examples/train/algorithms/sapo/run_sapo_gsm8k.sh"  # runs examples/train/gsm8k/run_gsm8k.sh
    args = ["--env", "HOME=/data", "-o", str(out), "--", "trainer.epochs=2"]
    run = subprocess.run([RLC, "migrate", str(script), *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert f"wrote {out}" in run.stderr and "warning" not in run.stderr
    text = out.read_text()
    assert "policy_loss_type: sapo  # line 7" in text and "epochs: 2  # the command line" in text
    assert "- /data/data/gsm8k/train.parquet" in text and "run_gsm8k.sh:20" in text
    check = subprocess.run([RLC, "validate", str(out)], capture_output=True, text=True, env=env)
    assert check.returncode == 0, check.stderr
    usage = subprocess.run([RLC, "migrate", str(script), "--in-place"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "imported as a new spec" in usage.stderr

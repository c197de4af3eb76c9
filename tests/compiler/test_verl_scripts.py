"""verl's own launch scripts (its examples at main and at v0.4.1, tests/fixtures/verl) import: each one becomes a
spec that validates, or is refused for a reason named in verl's terms; none meets an internal error."""

from __future__ import annotations

import tarfile

import pytest
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.load import document_from_text
from rlc.compiler.pipeline import analyze_document
from verl_examples import FIXTURES, extract

# What a user passes with --env: the device probe's answer. What the scripts compute with `$(date ...)` names the
# run (the import's date), and `$(pwd)` is verl's repository root, found from the script.
ENV = {"HOME": "/home/user", "DEVICE": "gpu"}


# How many scripts of each set import and validate (the others are refused, each for its reason).
IMPORTED = {"main": 48, "v0.4.1": 48}


@pytest.fixture(scope="module", params=sorted(IMPORTED))
def outcomes(request, tmp_path_factory) -> tuple[str, dict[str, str]]:
    root = tmp_path_factory.mktemp(f"verl-{request.param}")
    extract(request.param, root)
    found: dict[str, str] = {}
    for script in sorted(root.rglob("*.sh")):
        name = str(script.relative_to(root))
        try:
            imported, errors, _ = import_script(str(script), ENV, [])
        except NotImportable as exc:
            found[name] = f"refused: {exc}"
            continue
        if imported is None:  # a value only running the script gives: named, with the --env that fixes it
            found[name] = "refused: " + "; ".join(f"{d.code} {d.message} ({d.hint})" for d in errors)
            continue
        analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
        errors = [f"{d.code} {d.message}" for d in analysis.diagnostics if d.severity == "error"]
        found[name] = f"invalid: {errors}" if errors else "ok"
    return request.param, found


def test_every_script_imports_and_validates_or_is_refused_by_name(outcomes):
    release, found = outcomes
    assert not [f"{k}: {v}" for k, v in found.items() if v.startswith("invalid")]
    assert sum(v == "ok" for v in found.values()) == IMPORTED[release]
    for name, outcome in found.items():
        assert outcome == "ok" or len(outcome) > len("refused: ") + 20, name


def test_what_rlc_cannot_run_is_refused_in_verls_terms(outcomes):
    _, found = outcomes
    for words in ("supervised fine-tuning (SFT)", "Ascend NPUs", "vision-language data", "generation only"):
        assert any(words in v for v in found.values()), words
    sft = {k: v for k, v in found.items() if "/sft/" in k}
    assert sft and all("supervised fine-tuning (SFT)" in v or "mlite" in v for v in sft.values()), sft


@pytest.mark.parametrize(
    "release,script,stages",
    [
        # Qwen3-235B-A22B's 94 layers: 11 on the first and last of 8 stages, 12 on each other one
        (
            "main",
            "examples/grpo_trainer/run_qwen3_235b_a22b_megatron.sh",
            {"num_layers_in_first_pipeline_stage": 11, "num_layers_in_last_pipeline_stage": 11},
        ),
        # Qwen2-7B's 28 layers on 2 stages of 2 virtual stages each
        ("v0.4.1", "examples/grpo_trainer/run_qwen2-7b_sgl_megatron.sh", {"virtual_pipeline_model_parallel_size": 2}),
    ],
)
def test_uneven_and_virtual_pipeline_stages_are_carried(release, script, stages, tmp_path):
    extract(release, tmp_path)
    imported, errors, _ = import_script(str(tmp_path / script), ENV, [])
    assert imported is not None and not errors, [d.message for d in errors]
    assert "!!" not in imported.text
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert not [d.message for d in analysis.diagnostics if d.severity == "error"]
    given = analysis.spec.trainer.policy.megatron_config.transformer_config_kwargs
    assert {k: given.get(k) for k in stages} == stages


@pytest.mark.parametrize("release", ["v0.7.0", "v0.7.1"])
def test_verls_sapo_slurm_script_imports_with_the_actors_temperatures(release):
    slurm = {"SLURM_GPUS_PER_NODE": "8", "SLURM_JOB_NUM_NODES": "1"}  # what Slurm sets where the job runs
    imported, errors, _ = import_script(str(FIXTURES / f"sapo-{release}" / "run_qwen30b_sapo.sh"), ENV | slurm, [])
    assert imported is not None and not errors, [d.message for d in errors]
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert not [d.message for d in analysis.diagnostics if d.severity == "error"]
    data = analysis.spec.trainer.algorithm
    assert data.policy_loss_type == "sapo" and (data.sapo.tau_pos, data.sapo.tau_neg) == (1.0, 1.05)
    # verl v0.7 reads SAPO's temperatures from the actor's config (later releases from policy_loss)
    assert "tau_neg: 1.05  # verl: actor_rollout_ref.actor.tau_neg (line 370)" in imported.text
    # `default_local_dir=$DATA_ROOT/checkpoint/$project_name/$experiment_name` is one assignment (tree-sitter-bash
    # reads it as an assignment and a command)
    assert "ckpt_path: ${oc.env:PWD}/checkpoint/RL4LLM/qwen3-30B-base-vanilla-fsdp" in imported.text


@pytest.fixture(scope="module")
def v041(tmp_path_factory):
    root = tmp_path_factory.mktemp("verl-v0.4.1-multiturn")
    with tarfile.open(FIXTURES / "verl-examples-v0.4.1.tar.xz") as tar:
        tar.extractall(root, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return root


def test_multi_turn_scripts_read_their_configs_from_verls_root_and_name_their_tools(v041):
    """`--config-path="$(pwd)/examples/sglang_multiturn/config"`: `$(pwd)` is the folder above the script holding
    that path (verl's repository root, where verl's docs run the scripts), said in a warning; the config and its
    tool config are read, and the tool, which no rlc environment matches, is named in verl's terms."""
    script = v041 / "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh"
    with pytest.raises(NotImportable) as refused:
        import_script(str(script), ENV, [])
    assert "Gsm8kTool (the model submits its answer to a tool (calc_gsm8k_reward)" in str(refused.value)
    assert "gsm8k_multi_turn" in str(refused.value)
    search = v041 / "examples/sglang_multiturn/search_r1_like/run_qwen2.5-3b_instruct_search_multiturn.sh"
    with pytest.raises(NotImportable, match=r"SearchTool \(a retrieval server called with hermes"):
        import_script(str(search), ENV, [])
    with pytest.raises(NotImportable, match=r"Gsm8kInteraction \(a simulated user"):
        import_script(
            str(v041 / "examples/sglang_multiturn/run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh"), ENV, []
        )
    # --cwd elsewhere: the config is not there, and the message says which file
    with pytest.raises(NotImportable, match="cannot read .*/nowhere/examples/sglang_multiturn/config/gsm8k_multiturn"):
        import_script(str(script), ENV, [], cwd=str(v041 / "nowhere"))


def test_the_found_root_is_said_and_a_loop_with_nothing_to_answer_imports(v041):
    """A multi-turn config with no tool and no interaction imports: one assistant turn, as verl runs it; the
    folder `$(pwd)` was read as is a warning (RLC-W062)."""
    script = v041 / "examples/sglang_multiturn/run_plain.sh"  # verl's config, without the tool the scripts add
    script.write_text(
        'python3 -m verl.trainer.main_ppo --config-path="$(pwd)/examples/sglang_multiturn/config" '
        "--config-name=gsm8k_multiturn_grpo actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct "
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5\n"
    )
    imported, errors, warnings = import_script(str(script), ENV, [])
    assert imported is not None and not errors, [d.message for d in errors]
    found = [d for d in warnings if d.code == "RLC-W062"]
    assert found and str(v041) in found[0].message and found[0].hint == "pass --cwd DIR to choose it"
    assert "max_turns: 1  # verl: actor_rollout_ref.rollout.multi_turn.enable" in imported.text
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert not [d.message for d in analysis.diagnostics if d.severity == "error"]

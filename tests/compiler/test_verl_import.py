"""`rlc migrate --from verl`: a verl job composed as verl composes it (a release's defaults, Hydra's override rules,
interpolations after the overrides), mapped to spec v1 with every conversion reported, refused by name where rlc
cannot run it; the spec it writes validates."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import ROOT, run_rlc
from rlc.compiler.importers.base import NotImportable
from rlc.compiler.importers.verl.compose import ComposeError, compose_overrides, defaults
from rlc.compiler.importers.verl.hydra_overrides import Override, OverrideError, value
from rlc.compiler.importers.verl.importer import Verl, import_composed, import_overrides
from rlc.compiler.load import document_from_text
from rlc.compiler.pipeline import analyze_document

# The quick-start of verl's GSM8K GRPO example, as a launch command passes it.
GRPO = [
    "algorithm.adv_estimator=grpo",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=5",
    "trainer.logger=['console','wandb']",
    "trainer.experiment_name=qwen3_8b_gsm8k",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
]


def _ov(*items: str) -> list[Override]:
    return [Override(text, n) for n, text in enumerate(items, 1)]


def _import(*extra: str):
    imported = import_overrides(_ov(*GRPO, *extra), "run.sh")
    return imported, yaml.safe_load(imported.text)


def _get(spec: dict, path: str):
    for part in path.split("."):
        spec = spec[part]
    return spec


def _change(imported, old: str):
    return [c for c in imported.changes if c.old == old]


def _validates(text: str) -> None:
    analysis = analyze_document(document_from_text(text, "imported.yaml"), env={})
    assert not [d for d in analysis.diagnostics if d.severity == "error"], [d.message for d in analysis.diagnostics]


# -- Hydra's overrides ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1e-6", 1e-6),
        ("3", 3),
        ("True", True),
        ("null", None),
        ("'1'", "1"),
        ("['console','wandb']", ["console", "wandb"]),
        ("[a, b]", ["a", "b"]),
        ("{a: 1, b: [x]}", {"a": 1, "b": ["x"]}),
        ("${data.max_prompt_length}", "${data.max_prompt_length}"),
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("", ""),
    ],
)
def test_override_values_read_as_hydra_reads_them(raw, expected):
    assert value(raw) == expected


def test_a_top_level_comma_is_a_sweep_one_job_cannot_run():
    with pytest.raises(OverrideError, match="multirun sweep"):
        value("a,b", "trainer.logger")


def test_an_absent_key_needs_a_plus_as_verl_says_and_the_line_is_kept():
    with pytest.raises(ComposeError) as err:
        compose_overrides(_ov("data.train_batch_size=8", "data.no_such_key=1"))
    assert err.value.problems == [
        (2, "Could not override 'data.no_such_key'. To append to your config use +data.no_such_key=1 (Key "
         "'no_such_key' is not in struct)"),
    ]  # fmt: skip
    composed = compose_overrides(_ov("+data.no_such_key=1"))
    assert composed.config["data"]["no_such_key"] == 1
    with pytest.raises(ComposeError, match="already at 'data.train_batch_size'"):
        compose_overrides(_ov("+data.train_batch_size=8"))


def test_deletion_and_forced_add():
    composed = compose_overrides(_ov("~trainer.balance_batch", "++data.train_batch_size=8", "++data.extra=x"))
    assert "balance_batch" not in composed.config["trainer"]
    assert composed.config["data"]["train_batch_size"] == 8 and composed.config["data"]["extra"] == "x"
    with pytest.raises(ComposeError, match="Could not delete"):
        compose_overrides(_ov("~data.no_such_key"))
    # deleting a key another one interpolates fails when the interpolations resolve, as in verl
    with pytest.raises(ComposeError, match="trainer.project_name"):
        compose_overrides(_ov("~trainer.project_name"))


def test_interpolations_resolve_after_the_overrides():
    composed = compose_overrides(_ov("data.max_response_length=3000", "actor_rollout_ref.actor.ppo_mini_batch_size=64"))
    assert composed.config["actor_rollout_ref"]["rollout"]["response_length"] == 3000
    assert composed.config["critic"]["ppo_mini_batch_size"] == 64


def test_the_newest_release_the_overrides_compose_on_is_taken_and_named():
    assert compose_overrides(_ov(*GRPO)).release == "main"
    old = compose_overrides(_ov("actor_rollout_ref.rollout.use_fire_sampling=False"))
    assert (
        old.release != "main"
        and "use_fire_sampling" in defaults(old.release)["engines"]["dp"]["actor_rollout_ref"]["rollout"]
    )
    assert compose_overrides(_ov("model_engine=megatron")).engine == "megatron"


# -- what maps how ---------------------------------------------------------------------------------------------------


def test_the_grpo_quick_start_imports_with_provenance_and_validates():
    imported, spec = _import()
    _validates(imported.text)
    assert _get(spec, "trainer.train_batch_size") == 1024
    assert _get(spec, "trainer.policy_mini_batch_size") == 256
    assert _get(spec, "generator.n_samples_per_prompt") == 5
    assert _get(spec, "environment.env_class") == "verl"
    assert "# verl: data.train_batch_size (line 4)" in imported.text
    # verl's vanilla loss is dual-clip; its defaults that differ from rlc's are written out and reported
    assert _get(spec, "trainer.algorithm.policy_loss_type") == "dual_clip"
    assert _get(spec, "trainer.epochs") == 30 and _get(spec, "generator.inference_engine.tensor_parallel_size") == 2
    assert any(c.new == "trainer.epochs" and "verl main's default" in c.reason for c in imported.changes)
    assert _get(spec, "trainer.ref.fsdp_config.cpu_offload") is True  # verl's FSDP2 reference offloads
    assert not imported.errors


def test_five_micro_batch_knobs_become_two_the_smaller_kept_and_said():
    imported, spec = _import("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8")
    assert _get(spec, "trainer.micro_train_batch_size_per_gpu") == 16
    assert _get(spec, "trainer.micro_forward_batch_size_per_gpu") == 8
    [change] = [c for c in imported.changes if c.new == "trainer.micro_forward_batch_size_per_gpu"]
    assert change.severity == "warning" and "smallest" in change.reason


def test_token_budget_micro_batches_and_the_warmup_in_optimizer_steps():
    imported, spec = _import(
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
        "actor_rollout_ref.actor.ppo_epochs=2",
    )
    assert _get(spec, "trainer.max_tokens_per_microbatch") == 24000
    # verl steps its scheduler once a training step; rlc once a mini-batch: 10 x (1024 / 256) x 2 epochs
    assert _get(spec, "trainer.policy.optimizer_config.num_warmup_steps") == 80
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps")
    assert "x 8" in warm.reason and warm.line == 22


MEGATRON_SCRIPT = ROOT / "tests/fixtures/verl-launch-scripts/examples/grpo_trainer/run_qwen3_8b_megatron.sh"


@pytest.mark.parametrize("cp", [1, 2])
def test_megatron_token_budget_micro_batches_are_carried_for_a_context_groups_whole_rows(cp):
    from rlc.compiler.importers.scripts import import_script

    argv = [f"actor_rollout_ref.actor.megatron.context_parallel_size={cp}"]
    imported, errors, _ = import_script(str(MEGATRON_SCRIPT), {"HOME": "/home/user", "DEVICE": "gpu"}, argv)
    assert imported is not None and not errors, [d.message for d in errors]
    spec = yaml.safe_load(imported.text)
    assert _get(spec, "trainer.strategy") == "megatron"
    # verl's Megatron actor runs ppo_max_token_len_per_gpu (24576) x cp tokens of whole rows per micro-batch
    assert _get(spec, "trainer.max_tokens_per_microbatch") == 24576 * cp
    assert not [p for p in imported.errors if "use_dynamic_bsz" in str(p)]
    assert "!!" not in "".join(line for line in imported.text.splitlines() if "dynamic_bsz" in line)
    [budget] = [c for c in imported.changes if c.new == "trainer.max_tokens_per_microbatch"]
    assert ("x 2 (actor_rollout_ref.actor.megatron.context_parallel_size)" in budget.reason) == (cp == 2)
    _validates(imported.text)


WARMUP_RATIO = "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"


def test_a_warmup_ratio_of_the_total_steps_verl_is_given_is_converted_with_its_sources():
    imported, spec = _import(WARMUP_RATIO, "trainer.total_training_steps=105")
    # verl: int(0.1 x 105) = 10 training steps; rlc steps once a mini-batch: x 1024 / 256
    assert _get(spec, "trainer.policy.optimizer_config.num_warmup_steps") == 40
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio")
    assert warm.severity == "info" and "= 10 training steps" in warm.reason and "x 4" in warm.reason
    assert "trainer.total_training_steps (line 21)" in imported.text
    _validates(imported.text)


def test_a_warmup_ratio_of_a_total_only_the_data_gives_is_an_error_saying_what_to_write():
    imported, spec = _import(WARMUP_RATIO, "trainer.total_epochs=2")
    assert "num_warmup_steps" not in spec["trainer"]["policy"]["optimizer_config"]
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio")
    assert warm.severity == "error" and warm.line == 20
    assert "// data.train_batch_size 1024) x total_epochs 2" in warm.reason and "not readable here" in warm.reason
    assert "trainer.total_training_steps=N" in warm.reason and "int(0.1 x N) x 4" in warm.reason
    # a total the environment gives where the job runs is asked for, the rest of the optimizer still carried
    imported, spec = _import(WARMUP_RATIO, "trainer.total_training_steps=${oc.env:STEPS}")
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio")
    assert warm.severity == "error" and "${oc.env:STEPS}" in warm.reason and "--env NAME=VALUE" in warm.reason
    assert float(_get(spec, "trainer.policy.optimizer_config.lr")) == 1e-6
    # an explicit step count wins over the ratio, as in verl
    imported, spec = _import(WARMUP_RATIO, "actor_rollout_ref.actor.optim.lr_warmup_steps=3")
    assert _get(spec, "trainer.policy.optimizer_config.num_warmup_steps") == 12
    assert not imported.errors


def _parquet(path, rows: int) -> str:
    pa = pytest.importorskip("pyarrow")  # the runtime's; the compiler reads the footer without it
    import pyarrow.parquet as pq

    prompt = [[{"role": "user", "content": f"q{i}"}] for i in range(rows)]
    table = pa.table(
        {"data_source": ["openai/gsm8k"] * rows, "prompt": prompt, "flag": [i % 2 == 0 for i in range(rows)]}
    )
    pq.write_table(table, path, row_group_size=7)
    return str(path)


def test_the_parquet_row_count_is_read_from_the_footer_as_pyarrow_reads_it(tmp_path):
    from rlc.compiler.importers.verl.parquet_rows import NotParquet, parquet_rows

    assert parquet_rows(_parquet(tmp_path / "a.parquet", 53)) == 53
    (tmp_path / "b.parquet").write_text("not parquet at all")
    with pytest.raises(NotParquet):
        parquet_rows(str(tmp_path / "b.parquet"))


def test_a_warmup_ratio_counts_the_rows_of_readable_train_files_as_verls_dataloader_does(tmp_path):
    files = [_parquet(tmp_path / "a.parquet", 50), _parquet(tmp_path / "b.parquet", 50)]
    job = (WARMUP_RATIO, f"data.train_files=[{files[0]},{files[1]}]", "data.train_batch_size=8",
           "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.total_epochs=5")  # fmt: skip
    imported, spec = _import(*job)
    # verl: (100 rows // 8, drop_last) x 5 epochs = 60 steps, int(0.1 x 60) = 6; rlc: x 8 / 2 mini-batches
    assert _get(spec, "trainer.policy.optimizer_config.num_warmup_steps") == 24
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio")
    assert warm.severity == "info" and "(100 rows of data.train_files // 8) x 5 epochs = 60" in warm.reason
    _validates(imported.text)
    # train_max_samples caps the rows; the overlong-prompt filter makes the count an upper bound, said
    imported, spec = _import(*job, "data.train_max_samples=40", "data.filter_overlong_prompts=True")
    assert _get(spec, "trainer.policy.optimizer_config.num_warmup_steps") == 8  # int(0.1 x 5 x 5) x 4
    [warm] = _change(imported, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio")
    assert warm.severity == "warning" and "filter_overlong_prompts" in warm.reason


def test_the_cosine_floor_and_cycles_rlc_lacks_are_said_with_their_effect():
    cosine = "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine"
    imported, spec = _import(cosine, "actor_rollout_ref.actor.optim.min_lr_ratio=0.1")
    assert _get(spec, "trainer.policy.optimizer_config.scheduler") == "cosine"
    [floor] = _change(imported, "actor_rollout_ref.actor.optim.min_lr_ratio")
    assert floor.severity == "error" and "below min_lr_ratio x lr (0.1 x 1e-06)" in floor.reason
    [cycles] = _change(_import(cosine, "actor_rollout_ref.actor.optim.num_cycles=1.0")[0], f"{OPTIM}.num_cycles")
    assert "1.0 cycles" in cycles.reason
    # a floor on the constant schedule changes nothing in verl either
    assert not _import("actor_rollout_ref.actor.optim.min_lr_ratio=0.1")[0].errors


OPTIM = "actor_rollout_ref.actor.optim"


def test_the_kl_and_entropy_averaging_verl_ties_to_loss_agg_mode_is_said_where_rlcs_differs():
    imported, _ = _import()  # token-mean: verl's KL is a token mean, rlc's a mean of per-response means
    [kl] = [c for c in imported.changes if c.new == "trainer.algorithm.use_kl_loss"]
    assert kl.severity == "warning" and "by token-mean" in kl.reason and "weigh less" in kl.reason
    imported, _ = _import(
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "actor_rollout_ref.actor.entropy_coeff=0.001"
    )
    [kl] = [c for c in imported.changes if c.new == "trainer.algorithm.use_kl_loss"]
    assert kl.severity == "info"  # rlc's KL is this mean
    [ent] = [c for c in imported.changes if c.new == "trainer.algorithm.entropy_loss_coef"]
    assert ent.severity == "warning" and "by seq-mean-token-mean" in ent.reason and "mini-batch's tokens" in ent.reason
    assert "loss_agg_mode (line 20)" in imported.text
    _validates(imported.text)


def test_before_v0_4_verls_kl_and_entropy_are_token_means_whatever_the_mode():
    mode = "+actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean"  # a key v0.3.0's actor does not read
    items = _ov(*GRPO, "actor_rollout_ref.actor.entropy_coeff=0.001", mode)
    old = import_composed(compose_overrides(items, release="v0.3.0"), "run.sh")
    [ent] = [c for c in old.changes if c.new == "trainer.algorithm.entropy_loss_coef"]
    [kl] = [c for c in old.changes if c.new == "trainer.algorithm.use_kl_loss"]
    assert ent.severity == "info" and kl.severity == "warning" and "verl v0.3.0 averages" in kl.reason


def test_kl_in_the_reward_takes_verls_reward_estimator_and_coefficient():
    imported, spec = _import(
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=True",
        "algorithm.kl_ctrl.kl_coef=0.005",
    )
    alg = _get(spec, "trainer.algorithm")
    assert (alg["use_kl_in_reward"], alg["use_kl_loss"]) == (True, False)
    assert (alg["kl_estimator_type"], alg["kl_loss_coef"]) == ("k1", 0.005)  # verl's kl_penalty default: kl
    both, _ = _import("algorithm.use_kl_in_reward=True")
    assert any(c.old == "algorithm.use_kl_in_reward" and c.severity == "error" for c in both.changes)


def test_gspo_averages_per_sequence_and_an_unknown_estimator_is_not_carried():
    _, spec = _import("actor_rollout_ref.actor.policy_loss.loss_mode=gspo")
    assert _get(spec, "trainer.algorithm.loss_reduction") == "sequence_mean"
    # A name only the script's own code registers with verl (register_adv_est)
    imported, _ = _import("algorithm.adv_estimator=my_estimator")
    assert [c.severity for c in _change(imported, "algorithm.adv_estimator")] == ["error"]


@pytest.mark.parametrize(
    "extra, path, expected",
    [
        ("algorithm.adv_estimator=gpg", "advantage_estimator", "gpg"),
        ("algorithm.adv_estimator=opo", "advantage_estimator", "opo"),
        ("algorithm.adv_estimator=grpo_passk", "advantage_estimator", "grpo_passk"),
        ("algorithm.adv_estimator=reinforce_plus_plus", "advantage_estimator", "reinforce++_verl"),
        ("algorithm.adv_estimator=rloo", "advantage_estimator", "rloo_verl"),
        ("algorithm.adv_estimator=remax", "advantage_estimator", "remax"),
        ("algorithm.adv_estimator=optimal_token_baseline", "advantage_estimator", "optimal_token_baseline"),
        ("algorithm.adv_estimator=tir_optimal_token_baseline", "advantage_estimator", "tir_optimal_token_baseline"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl", "policy_loss_type", "dppo_kl"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gpg", "policy_loss_type", "gpg"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean", "loss_reduction", "sequence_mean"),
    ],
)
def test_verls_estimators_and_losses_import_as_the_card_that_computes_them_as_verl_does(extra, path, expected):
    imported, spec = _import(extra)
    assert _get(spec, f"trainer.algorithm.{path}") == expected
    assert not [c for c in imported.errors if "estimator" in (c.old or "") or "loss_mode" in (c.old or "")]


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_the_optimal_token_baselines_need_no_word_to_the_actor(estimator):
    """verl computes the sum of squared probabilities the baselines read only when its actor is told to
    (calculate_sum_pi_squared); rlc's policy pass computes it for these estimators: the key is read, not kept."""
    imported, spec = _import(
        f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.actor.calculate_sum_pi_squared=True"
    )
    assert _get(spec, "trainer.algorithm.advantage_estimator") == estimator
    assert not _change(imported, "actor_rollout_ref.actor.calculate_sum_pi_squared")
    assert "calculate_sum_pi_squared" not in imported.text
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert not [d.code for d in analysis.diagnostics if d.severity == "error"]


def test_dro_takes_verls_beta_and_without_it_is_an_error_as_in_verl():
    imported, spec = _import(
        "actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.1"
    )
    assert _get(spec, "trainer.algorithm.policy_loss_type") == "dro"
    assert _get(spec, "trainer.algorithm.dro.beta") == 0.1
    imported, _ = _import("actor_rollout_ref.actor.policy_loss.loss_mode=dro")
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert "RLC-E315" in [d.code for d in analysis.diagnostics]


@pytest.mark.parametrize("estimator", ["grpo_vectorized", "gdpo"])
def test_verls_estimators_that_always_divide_by_the_std_import_so(estimator):
    _, spec = _import(f"algorithm.adv_estimator={estimator}", "algorithm.norm_adv_by_std_in_grpo=False")
    assert _get(spec, "trainer.algorithm.grpo_norm_by_std") is True
    _, spec = _import("algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=False")
    assert _get(spec, "trainer.algorithm.grpo_norm_by_std") is False


def test_gdpos_reward_components_are_carried_with_the_reward_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rlla.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                      "    return {'score': 1.0, 'acc': 1.0, 'format': 0.5}\n")  # fmt: skip
    imported, spec = _import(
        "algorithm.adv_estimator=gdpo",
        "+algorithm.gdpo_reward_keys=[acc,format]",
        "+algorithm.gdpo_reward_weights=[1.0,0.5]",
        "reward.custom_reward_function.path=rlla.py",
        "reward.reward_manager.name=gdpo",
    )
    algorithm = _get(spec, "trainer.algorithm")
    assert algorithm["advantage_estimator"] == "gdpo" and algorithm["gdpo_reward_keys"] == ["acc", "format"]
    assert algorithm["gdpo_reward_weights"] == [1.0, 0.5]
    assert not [c for c in imported.changes if c.severity == "error"], imported.lines
    _validates(imported.text)
    # without a reward function of the user's, the components have no source: RLC-E319 says so
    alone, _ = _import("algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[acc,format]")
    analysis = analyze_document(document_from_text(alone.text, "imported.yaml"), env={})
    assert "RLC-E319" in {d.code for d in analysis.diagnostics if d.severity == "error"}


RC = "algorithm.rollout_correction"
OPC = "trainer.algorithm.off_policy_correction"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ((f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=3.0"),
         {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 3.0}),
        ((f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold='0.5_5.0'", f"{RC}.rollout_is_batch_normalize=True"),
         {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 5.0, "tis_ratio_clip_low": 0.5,
          "tis_batch_normalize": True}),
        ((f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.01"),
         {"rejection_sampling": ["seq_mean_k3"], "rejection_threshold_high": [0.01]}),
        ((f"{RC}.rollout_rs='token_k1,seq_max_k2,token_k1'", f"{RC}.rollout_rs_threshold='0.5_1.5,0.02'"),
         {"rejection_sampling": ["token_k1", "seq_max_k2"], "rejection_threshold_high": [1.5, 0.02],
          "rejection_threshold_low": [0.5]}),
    ],
)  # fmt: skip
def test_verls_rollout_correction_imports_into_off_policy_correction(extra, expected):
    """Every key is carried (no !!), none kept in trainer_settings, and the spec validates."""
    imported, spec = _import("actor_rollout_ref.rollout.calculate_log_probs=True", *extra)
    assert {k: _get(spec, f"{OPC}.{k}") for k in expected} == expected
    assert not [c for c in imported.changes if c.severity == "error"], [c.describe() for c in imported.errors]
    kept = spec.get("launch", {}).get("trainer_settings", {}).get("verl", {})
    assert not [k for k in kept if "rollout_correction" in k or "calculate_log_probs" in k], kept
    _validates(imported.text)


def test_settings_verl_reads_by_nothing_are_read_quietly():
    """verl's own example (examples/rollout_correction): rollout_rs null and its threshold null, is off with its
    threshold set."""
    imported, spec = _import(f"{RC}.rollout_rs=null", f"{RC}.rollout_rs_threshold=null",
                             f"{RC}.rollout_is_threshold=3.0", f"{RC}.rollout_is_batch_normalize=True")  # fmt: skip
    assert not [c for c in imported.changes if "rollout_correction" in (c.old or "") and c.severity != "info"]
    assert "off_policy_correction" not in _get(spec, "trainer.algorithm")


def test_a_rollout_correction_verl_would_refuse_is_not_carried_aloud():
    imported, spec = _import(f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold='0.1_0.5'")
    assert [c.severity for c in _change(imported, f"{RC}.rollout_rs")] == ["error"]
    assert "rejection_sampling" not in _get(spec, "trainer.algorithm").get("off_policy_correction", {})


@pytest.mark.parametrize(
    ("rs", "expected"),
    [
        ("token", {"token_mask_is_threshold_low": 0.5, "token_mask_is_threshold_high": 2.0}),
        ("sequence", {"sequence_mask_metric": "product", "product_mask_low": 0.5, "product_mask_high": 2.0}),
        ("geometric", {"sequence_mask_metric": "geometric", "geo_mask_low": 0.5, "geo_mask_high": 2.0}),
    ],
)
def test_verl_0_6s_rejection_and_token_veto_are_skyrls_masks(rs, expected):
    """verl 0.6's ratio-band rejection (lower bound 1 / upper by default) and its token veto (a row with a token
    ratio below it leaves the loss) mean what SkyRL's token, sequence and outlier masks mean."""
    imported, spec = _import(f"{RC}.rollout_rs={rs}", f"{RC}.rollout_rs_threshold=2.0",
                             f"{RC}.rollout_token_veto_threshold=1e-4")  # fmt: skip
    assert "v0.6" in imported.text.splitlines()[1]
    opc = _get(spec, OPC)
    assert {k: opc[k] for k in expected} == expected and opc["outlier_token_is_threshold_low"] == 1e-4
    assert not [c for c in imported.changes if c.severity == "error"], [c.describe() for c in imported.errors]
    _validates(imported.text)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_verls_bypass_mode_is_the_bypass_loss(loss_type):
    imported, spec = _import(f"{RC}.bypass_mode=True", f"{RC}.loss_type={loss_type}", f"{RC}.rollout_is=token")
    alg = _get(spec, "trainer.algorithm")
    assert (alg["policy_loss_type"], alg["bypass"]["loss_type"]) == ("bypass", loss_type)
    assert alg["off_policy_correction"]["tis_ratio_type"] == "token"
    assert not [c for c in imported.changes if c.severity == "error"], [c.describe() for c in imported.errors]
    _validates(imported.text)


@pytest.mark.parametrize("method", ["pow", "max_min", "max_random"])
def test_pf_ppo_imports_with_its_reweighting_where_verl_applies_it(method):
    pf = ("algorithm.use_pf_ppo=True", f"algorithm.pf_ppo.reweight_method={method}", "algorithm.pf_ppo.weight_pow=3.0")
    imported, spec = _import("algorithm.adv_estimator=gae", "critic.model.path=Qwen/Qwen3-8B", *pf)
    expected = {"reweight_method": method, **({"weight_pow": 3.0} if method == "pow" else {})}
    assert _get(spec, "trainer.algorithm.pf_ppo") == expected  # the other methods read no power
    assert not [c for c in imported.changes if c.severity == "error"]
    _validates(imported.text)
    imported, spec = _import(*pf)  # grpo: verl's compute_advantage resamples under gae only
    assert "pf_ppo" not in _get(spec, "trainer.algorithm")
    assert [c.severity for c in _change(imported, "algorithm.use_pf_ppo")] == ["warning"]


def test_what_verl_accepts_but_never_reads_is_reported_as_such():
    imported, spec = _import("actor_rollout_ref.actor.clip_ratio=0.3", "reward_model.reward_manager=dapo")
    assert _get(spec, "trainer.algorithm.eps_clip_high") == 0.2  # clip_ratio_high wins, as in verl
    shadow = [c for c in _change(imported, "actor_rollout_ref.actor.clip_ratio") if c.kind == "dropped"]
    assert shadow and "changes nothing in verl" in shadow[0].reason
    [legacy] = _change(imported, "reward_model.reward_manager")
    assert legacy.severity == "warning" and "never reads it" in legacy.reason
    active, _ = _import("reward.reward_manager.name=dapo")  # without its overlong buffer: the naive scores
    assert [c.severity for c in _change(active, "reward.reward_manager.name")] == ["info"]
    remote, _ = _import("reward.reward_manager.name=remote")
    assert [c.severity for c in _change(remote, "reward.reward_manager.name")] == ["error"]


BUFFER = "reward_kwargs.overlong_buffer_cfg"


def _import_at(release: str, *extra: str):
    imported = import_composed(compose_overrides(_ov(*GRPO, *extra), release=release), "run.sh")
    return imported, yaml.safe_load(imported.text)


@pytest.mark.parametrize("section", ["reward", "reward_model"], ids=["main", "v0.4.1"])
def test_dapos_overlong_buffer_is_carried(section):
    manager = "reward.reward_manager.name" if section == "reward" else "reward_model.reward_manager"
    release = "main" if section == "reward" else "v0.4.1"
    imported, spec = _import_at(
        release,
        f"{manager}=dapo",
        f"+{section}.{BUFFER}.enable=True",
        f"+{section}.{BUFFER}.len=4096",
        f"+{section}.{BUFFER}.penalty_factor=0.5",
        f"+{section}.{BUFFER}.log=False",
        f"+{section}.reward_kwargs.max_resp_len=8192",
        "data.max_response_length=8192",
    )
    assert _get(spec, "trainer.algorithm.overlong_buffer_len") == 4096
    assert _get(spec, "trainer.algorithm.overlong_buffer_penalty_factor") == 0.5
    assert not [c for c in imported.changes if c.severity == "error" and "reward" in (c.old or "")]
    _validates(imported.text)
    shorter, _ = _import_at(release, f"{manager}=dapo", f"+{section}.{BUFFER}.enable=True", f"+{section}.{BUFFER}.len=512",
                         f"+{section}.reward_kwargs.max_resp_len=2048", "data.max_response_length=1024")  # fmt: skip
    assert [c.severity for c in _change(shorter, f"{section}.reward_kwargs.max_resp_len")] == ["error"]


def test_prime_scores_as_the_naive_manager_with_a_plain_note():
    imported, _ = _import("reward.reward_manager.name=prime")
    [note] = _change(imported, "reward.reward_manager.name")
    assert note.severity == "info" and "the same scores" in note.reason


@pytest.mark.parametrize("section", ["reward.custom_reward_function", "custom_reward_function"])
def test_a_custom_reward_function_is_carried_as_env_class_reward_function(section, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_reward.py").write_text("def judge(data_source, solution_str, ground_truth, extra_info=None):\n"
                                           "    return 1.0\n")  # fmt: skip
    release = "main" if section.startswith("reward.") else "v0.4.1"
    imported, spec = _import_at(release, f"{section}.path=my_reward.py", f"{section}.name=judge")
    assert _get(spec, "environment.env_class") == "reward_function"
    assert _get(spec, "environment.skyrl_gym.reward_function") == {"path": "my_reward.py", "name": "judge"}
    assert not [c for c in imported.changes if c.severity == "error" and "custom_reward" in (c.old or "")]
    _validates(imported.text)


def test_sglang_is_switched_to_vllm_aloud():
    imported, spec = _import("actor_rollout_ref.rollout.name=sglang")
    assert _get(spec, "generator.inference_engine.backend") == "vllm"
    [switch] = _change(imported, "actor_rollout_ref.rollout.name")
    assert switch.severity == "warning" and "vLLM" in switch.reason


def test_no_written_key_is_dropped_silently():
    imported, _ = _import("+actor_rollout_ref.rollout.agent.num_workers=4", "trainer.balance_batch=False")
    reported = {c.old for c in imported.changes}
    assert {"actor_rollout_ref.rollout.agent.num_workers", "trainer.balance_batch"} <= reported


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("model_engine=veomni", "veomni engine"),
        ("trainer.device=npu", "Ascend NPUs"),
        ("actor_rollout_ref.actor.strategy=fsdp_turbo", "fsdp_turbo"),
        ("actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent", "agent loops"),
        ("data.image_key=images", "vision-language data"),
        ("distillation.enabled=True", "distillation"),
        ("+hydra.searchpath=[pkg://verl_mlite.config]", "mlite engine"),
    ],
)
def test_what_rlc_cannot_run_is_refused_by_name(extra, words):
    with pytest.raises(NotImportable, match=words):
        _import(extra)


def test_a_multi_turn_loop_names_its_tools_or_runs_as_one_turn(tmp_path):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config: {}\n")
    mt = "actor_rollout_ref.rollout.multi_turn"
    with pytest.raises(NotImportable, match=r"SandboxFusionTool \(code run by a SandboxFusion server"):
        _import(f"{mt}.enable=True", f"{mt}.tool_config_path={tools}")
    tools.write_text("tools:\n  - class_name: my_tools.Calculator\n")
    with pytest.raises(NotImportable, match=r"Calculator \(a tool or user rlc has no counterpart for\)"):
        _import(f"{mt}.enable=True", f"{mt}.tool_config_path={tools}")
    imported, spec = _import(f"{mt}.enable=True")  # nothing answers the model: one turn, as verl runs it
    assert _get(spec, "generator.max_turns") == 1


# -- the other inputs: a Hydra run directory, a verl YAML, through the command ---------------------------------------


def test_a_hydra_run_directory_imports_exactly(tmp_path):
    config = json.loads(json.dumps(defaults("main")["engines"]["dp"]))  # what Hydra saved: composed, unresolved
    config["data"]["train_batch_size"] = 64
    config["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] = 16
    config["actor_rollout_ref"]["rollout"]["name"] = "vllm"
    config["actor_rollout_ref"]["model"]["path"] = "Qwen/Qwen3-0.6B"
    hydra = tmp_path / "outputs" / "2026-01-01" / "10-00-00" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text(yaml.safe_dump(config))
    (hydra / "overrides.yaml").write_text(
        "- data.train_batch_size=64\n- actor_rollout_ref.actor.ppo_mini_batch_size=16\n- actor_rollout_ref.rollout.name=vllm\n"
        "- actor_rollout_ref.model.path=Qwen/Qwen3-0.6B\n"
    )
    imported = Verl().convert_path(str(hydra.parent))
    spec = yaml.safe_load(imported.text)
    assert _get(spec, "trainer.train_batch_size") == 64 and _get(spec, "trainer.critic_mini_batch_size") == 16
    assert "# verl: data.train_batch_size (line 1)" in imported.text
    _validates(imported.text)


def test_a_verl_yaml_with_its_own_defaults_list(tmp_path):
    job = tmp_path / "my_grpo.yaml"
    job.write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\ndata:\n  train_batch_size: 32\nactor_rollout_ref:\n  actor:\n"
        "    ppo_mini_batch_size: 8\n  rollout:\n    name: vllm\n    n: 4\n  model:\n    path: Qwen/Qwen3-0.6B\n"
        "algorithm:\n  adv_estimator: grpo\n"
    )
    out = tmp_path / "spec.yaml"
    result = run_rlc("migrate", "--from", "verl", str(job), "-o", str(out))
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(out.read_text())
    assert _get(spec, "trainer.train_batch_size") == 32 and _get(spec, "generator.n_samples_per_prompt") == 4
    assert "verl: data.train_batch_size (line 5)" in out.read_text()
    sft = tmp_path / "sft.yaml"
    sft.write_text("defaults:\n  - sft_trainer\n")
    refused = run_rlc("migrate", "--from", "verl", str(sft))
    assert refused.returncode == 1 and "supervised fine-tuning (SFT)" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_interpolations_resolve_as_omegaconf_resolves_them():
    from omegaconf import OmegaConf
    from rlc.compiler.importers.verl.hydra_overrides import resolve

    for engine, tree in defaults("main")["engines"].items():
        tree = json.loads(json.dumps(tree))
        tree["critic"]["ppo_micro_batch_size"] = 4  # read by `${oc.select:.ppo_micro_batch_size,null}`, a relative key
        tree["data"]["max_response_length"] = 3000
        expected = OmegaConf.to_container(OmegaConf.create(tree), resolve=True, throw_on_missing=False)
        assert resolve(tree) == expected, engine


def test_a_launch_script_is_read_statically_with_what_env_gives(tmp_path):
    from rlc.compiler.importers.scripts import import_script

    script = str(ROOT / "tests" / "fixtures" / "verl" / "run_grpo.sh")
    imported, errors, _ = import_script(script, {"HOME": "/home/me"}, [])
    assert imported is not None and not errors
    spec = yaml.safe_load(imported.text)
    assert _get(spec, "data.train_data") == ["/home/me/data/gsm8k/train.parquet"]
    assert _get(spec, "trainer.policy_mini_batch_size") == 256  # $((TRAIN_BATCH / 4))
    assert "# verl: actor_rollout_ref.actor.ppo_mini_batch_size (line 21)" in imported.text
    # HOME unset: the environment's where the job runs, as Hydra would read ${oc.env:HOME}
    imported, _, warnings = import_script(script, {}, [])
    assert imported is not None and _get(yaml.safe_load(imported.text), "data.train_data") == [
        "${oc.env:HOME}/data/gsm8k/train.parquet"
    ]
    assert {w.code for w in warnings} == {"RLC-W060"}
    sft = tmp_path / "sft.sh"
    sft.write_text("torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer data.train_files=x\n")
    with pytest.raises(NotImportable, match=r"supervised fine-tuning \(SFT\)"):
        import_script(str(sft), {}, [])


@pytest.mark.parametrize(
    "bad",
    [
        "=",
        "+a",
        "data.train_batch_size=[1,",
        "trainer.logger=choice(a,b)",
        "actor_rollout_ref.actor.ppo_mini_batch_size=0",
        "data.train_batch_size=abc",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=abc",
        "actor_rollout_ref.rollout.n=[1]",
        "actor_rollout_ref.actor.megatron.override_transformer_config=5",
        "actor_rollout_ref.rollout.val_kwargs=5",
        "actor_rollout_ref.rollout.n=${nope.key}",
    ],
)
def test_a_value_verl_would_not_start_with_is_a_finding_never_a_crash(bad):
    try:
        imported = import_overrides(_ov(*GRPO, bad), "run.sh")
    except NotImportable as exc:
        assert str(exc)
        return
    assert imported.text.startswith("#")


def test_verl_0_6s_policy_gradient_correction_is_the_bypass_reinforce_loss():
    """verl 0.6's bypass_mode with use_policy_gradient (its examples/rollout_correction script) is what verl 0.7 named
    bypass mode with loss_type reinforce; a token veto without rollout_rs, which verl 0.6's loss left unapplied, is
    said."""
    common = (f"{RC}.bypass_mode=True", f"{RC}.use_policy_gradient=True", f"{RC}.rollout_is=token")
    imported, spec = _import(*common)
    alg = _get(spec, "trainer.algorithm")
    assert (alg["policy_loss_type"], alg["bypass"]["loss_type"]) == ("bypass", "reinforce")
    assert not [c for c in imported.changes if c.severity == "error"], [c.describe() for c in imported.errors]
    _validates(imported.text)
    vetoed, _ = _import(*common, f"{RC}.rollout_token_veto_threshold=1e-4")
    assert "warning" in {c.severity for c in vetoed.changes if c.old == f"{RC}.use_policy_gradient"}


def test_ppo_with_a_megatron_critic_imports_onto_rlcs_megatron_critic():
    """verl's PPO on Megatron (adv_estimator=gae, ppo_megatron_trainer) trains its critic on Megatron with the
    critic's own parallel sizes: both carried, nothing dropped aloud, and the spec validates."""
    overrides = _ov(
        *GRPO,
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "critic.model.path=Qwen/Qwen3-8B",
        "critic.ppo_micro_batch_size_per_gpu=8",
        "critic.megatron.tensor_model_parallel_size=4",
        "critic.megatron.pipeline_model_parallel_size=2",
    )
    imported = import_overrides(overrides, "run.sh", "ppo_megatron_trainer")
    spec = yaml.safe_load(imported.text)
    assert _get(spec, "trainer.strategy") == "megatron"
    assert "strategy" not in spec["trainer"]["critic"]  # the job's strategy: the critic follows it
    critic = _get(spec, "trainer.critic.megatron_config")
    assert (critic["tensor_model_parallel_size"], critic["pipeline_model_parallel_size"]) == (4, 2)
    assert _get(spec, "trainer.policy.megatron_config.tensor_model_parallel_size") == 2
    assert not [c for c in imported.changes if c.severity == "error"]
    analysis = analyze_document(document_from_text(imported.text, "imported.yaml"), env={})
    assert not [d for d in analysis.diagnostics if d.severity == "error"]


def test_a_critic_verl_trains_with_fsdp_beside_a_megatron_actor_keeps_its_strategy():
    overrides = _ov(*GRPO, "algorithm.adv_estimator=gae", "critic.strategy=fsdp", "critic.model.path=Qwen/Qwen3-8B")
    imported = import_overrides(overrides, "run.sh", "ppo_megatron_trainer")
    spec = yaml.safe_load(imported.text)
    assert (_get(spec, "trainer.strategy"), _get(spec, "trainer.critic.strategy")) == ("megatron", "fsdp2")


def test_router_replay_r3_is_rlcs_routing_replay():
    """verl's R3 (the Megatron router replays the rollout's routes) carries both flags, and validates on an MoE
    model; R2 (the trainer's own recorded routes) is refused by name."""
    moe = [o if not o.startswith("actor_rollout_ref.model.path=") else "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B"
           for o in GRPO]  # fmt: skip
    r3 = (
        "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
    )
    imported = import_overrides(_ov(*moe, *r3), "run.sh", "ppo_megatron_trainer")
    spec = yaml.safe_load(imported.text)
    assert _get(spec, "trainer.policy.megatron_config.moe_enable_routing_replay") is True
    assert _get(spec, "generator.inference_engine.enable_return_routed_experts") is True
    assert not [c for c in imported.changes if c.severity == "error"], [c.reason for c in imported.changes]
    _validates(imported.text)
    r2 = import_overrides(_ov(*moe, "actor_rollout_ref.actor.megatron.router_replay.mode=R2"), "run.sh",
                          "ppo_megatron_trainer")  # fmt: skip
    [refusal] = [c for c in r2.changes if c.severity == "error"]
    assert refusal.old == "actor_rollout_ref.actor.megatron.router_replay.mode" and "R2" in refusal.reason
    assert "moe_enable_routing_replay" not in yaml.safe_load(r2.text)["trainer"]["policy"].get("megatron_config", {})


def test_mtp_drafting_in_the_rollout_is_vllms_speculative_config():
    mtp = "actor_rollout_ref.model.mtp."
    imported, spec = _import(f"{mtp}enable=True", f"{mtp}enable_rollout=True", f"{mtp}num_speculative_tokens=3")
    assert _get(spec, "generator.inference_engine.speculative_config") == {"method": "mtp", "num_speculative_tokens": 3}
    assert not [c for c in imported.changes if c.severity == "error"]
    _validates(imported.text)


def test_mtp_training_with_megatrons_own_loss_is_not_carried():
    mtp = "actor_rollout_ref.model.mtp."
    imported, spec = _import(f"{mtp}enable=True", f"{mtp}enable_train=True")
    (change,) = _change(imported, f"{mtp}enable_train")
    assert change.severity == "error" and "SkyRL" in change.reason
    assert "mtp" not in spec.get("trainer", {})

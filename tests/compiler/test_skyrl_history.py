"""SkyRL's history beyond the corpus: stored base-config versions from branches and forks, and every key
in legacy_history with a harmless and a behaviour-changing value."""

from __future__ import annotations

import pytest
import yaml_helpers
from conftest import ROOT
from rlc.compiler.importers.skyrl import history as legacy_history
from rlc.compiler.importers.versions import migrate_data, migrated_text
from rlc.compiler.load import document_from_text
from rlc.compiler.pipeline import analyze
from rlc.core.plain import plain_yaml as to_plain
from rlc.spec.model import SpecModel

HISTORY = sorted((ROOT / "tests" / "fixtures" / "skyrl-history").glob("*.yaml"))
MODEL = SpecModel()


def _migrate(text: str, name: str = "legacy.yaml"):
    doc = document_from_text(text, name)
    report = migrate_data(doc.data)
    return doc, report, migrated_text(doc)


def _analyze(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return analyze(path, env={"WANDB_API_KEY": "x"})


def _nest(path: str, value):
    out: dict = {}
    node = out
    *head, last = path.split(".")
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value
    return out


# Versions whose shipped defaults turn on a fork's feature rlc does not run: migration refuses them with the
# findings named here, each on its own ALTERS WHAT RUNS line, and nothing else.
REFUSED = {
    "kanishkg-SkyRL_b4306980f55e.yaml": ["trainer.algorithm.obs_prediction_coef"],
}


# Versions whose defaults set a spec v1 (SkyRL 0.4) field this runtime does not run yet: validation refuses them
# with these "not supported yet" rules and nothing else. (Marin's fork sets fully_async.clear_kv_cache_on_weight_sync
# with fully async training off, where nothing reads it: it validates.)
NOT_SUPPORTED_YET: dict[str, list[str]] = {}


def test_history_fixture_is_not_empty():
    assert len(HISTORY) >= 2
    assert set(REFUSED) | set(NOT_SUPPORTED_YET) <= {p.name for p in HISTORY}


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_historical_version_migrates_validates_and_round_trips(tmp_path, path):
    text = path.read_text()
    legacy = to_plain(document_from_text(text, path.name).data)
    doc, report, new = _migrate(text, path.name)
    assert report is not None
    assert sorted(c.old for c in report.errors) == REFUSED.get(path.name, []), [c.describe() for c in report.errors]
    assert all(c.code.startswith("RLC-E03") for c in report.errors)
    alters = [ln for ln in report.lines() if ln.startswith("ALTERS WHAT RUNS")]
    assert len(alters) == len(report.errors)
    analysis = _analyze(tmp_path, new)
    errors = sorted(d.code for d in analysis.diagnostics if d.severity == "error")
    assert errors == NOT_SUPPORTED_YET.get(path.name, []), [(d.code, d.key, d.message) for d in analysis.diagnostics]
    # Every top-level key either survives or has a report line; a second migration changes nothing.
    accounted = {c.old.split(".")[0] for c in report.changes if c.old}
    assert set(legacy) - {"defaults"} <= set(to_plain(doc.data)) | accounted
    assert migrate_data(document_from_text(new, "again.yaml").data) is None


# -- each history key: harmless value drops quietly, a value that turns the feature on is a finding --------

ACTIVE = {
    "generator.enable_child_agents": ({"generator": {"child_openrouter_model": "openai/gpt-4o"}}, True),
    "generator.judge_reward_base_url": ({"generator": {"judge_reward_model": "gpt-4o"}}, "https://api.openai.com/v1"),
    "generator.custom_chat_templates": ({"generator": {"custom_chat_template_key": "t"}}, {"t": "{{ messages }}"}),
    "trainer.algorithm.dynamic_sampling.metric": ({}, "pass_rate"),
    "trainer.fully_async.preserve_inflight_kv_cache_on_weight_update": (
        {"trainer": {"fully_async": {"enabled": True}}},
        True,
    ),
    "trainer.anyscale_remote_upload_dir": ({"trainer": {"enable_anyscale_upload": True}}, "remote/ckpts"),
    "generator.context_warning_threshold": ({"generator": {"inject_context_status": True}}, 0.9),
    "trainer.policy.optimizer_config.muon_lr": (
        {"trainer": {"policy": {"optimizer_config": {"optimizer_type": "muon"}}}},
        0.02,
    ),
    "trainer.critic.optimizer_config.muon_lr": (
        {"trainer": {"critic": {"optimizer_config": {"optimizer": "Muon"}}}},
        0.02,
    ),
    **{
        f"trainer.policy.megatron_config.torch_profiler_config.{key}": (
            {"trainer": {"policy": {"megatron_config": {"torch_profiler_config": {"enable": True}}}}},
            3,
        )
        for key in legacy_history._PROFILER_SCHEDULE
    },
    **{
        f"trainer.algorithm.{key}": ({"trainer": {"algorithm": {"advantage_estimator": "rloo_n"}}}, 2)
        for key in ("rloo_n_min_group_size", "rloo_n_filter_zero_reward_groups")
    },
    "trainer.algorithm.icvl": ({"trainer": {"algorithm": {"advantage_estimator": "icvl"}}}, {"reward_format": "raw"}),
    "trainer.algorithm.state_action": (
        {"trainer": {"algorithm": {"advantage_estimator": "state_action_td"}}},
        {"q_loss_coef": 1.0},
    ),
    **{
        f"trainer.algorithm.{key}": ({"trainer": {"algorithm": {"value_head_type": "cross_entropy"}}}, 0.5)
        for key in ("value_min", "value_max", "value_num_bins")
    },
    **{
        f"trainer.algorithm.{key}": ({"trainer": {"algorithm": {"value_head_type": "zip"}}}, 3)
        for key in (
            "zip_distribution_token_id",
            "zip_reward_values",
            "zip_num_length_bins",
            "zip_scale_zero_one_rewards",
        )
    },
    **{
        f"trainer.{role}.model.lora.pissa_niter": (
            {"trainer": {role: {"model": {"lora": {"init_method": "pissa_niter_16"}}}}},
            16,
        )
        for role in ("policy", "critic")
    },
    **{
        f"trainer.{role}.fsdp_config.{key}": (
            {"trainer": {role: {"fsdp_config": {"expert_model_parallel_size": 2}}}},
            4,
        )
        for role in ("policy", "ref", "critic")
        for key in ("moe_token_dispatcher_type", "ep_comm_backend", "deepep_num_sms", "deepep_token_chunk_size")
    },
    "generator.reset_prompt_include_initial_prompt": ({"generator": {"reset_prompt_each_step": True}}, False),
    **{
        f"generator.debug_log_rendered_prompt_{key}": ({"generator": {"debug_log_rendered_prompt": True}}, 5)
        for key in ("every_n_steps", "max_per_step", "max_chars")
    },
    "teacher": ({}, {"model_path": "Qwen/Qwen3-8B", "top_k_logprobs": 256}),
    "generator.child_openrouter_base_url": (
        {"generator": {"child_openrouter_model": "openai/gpt-4o-mini"}},
        "https://openrouter.ai/api/v1",
    ),
    "trainer.save_optimizer_state_in_ckpt": ({}, False),
    "checkpoint_export": ({}, {"step": 10, "checkpoint_path": "/ckpts/global_step_10"}),
    "data.shuffle": ({}, False),
    **{
        f"trainer.{key}": ({}, False)
        for key in (
            "save_optimizer_states",
            "load_optimizer_states",
            "save_lr_scheduler_states",
            "load_lr_scheduler_states",
        )
    },
    "data.sampling": ({}, {"kind": "thompson"}),
    "trainer.trajectory_selector": ({}, {"type": "best_of_n"}),
    "trainer.algorithm.group_admission": ({}, {"stall_timeout": 600}),
    "trainer.algorithm.ratio_diagnostics": ({}, {"pooled": True}),
    "trainer.restore_dataloader_state": ({}, False),
    "trainer.fully_async.teacher_scoring": ({"teacher": {"model_path": "Qwen/Qwen3-8B"}}, {"workers_per_teacher": 2}),
    "generator.expert_block_sync": ({}, {"verify": True}),
    **{
        f"trainer.{key}": ({}, False)
        for key in ("training_metrics", "policy_train_spans", "generate_spans", "async_spans")
    },
    "trainer.distributed": ({}, {"placement_group_timeout_seconds": 60}),
    "trainer.model_load_retry": ({}, {"max_retries": 1}),
    "trainer.progress": ({}, {"mode": "bar"}),
    "trainer.sampler_ledger": ({}, {"path": "/tmp/ledger.jsonl"}),
    "trainer.algorithm.resolved_group_advantage": ({}, {"kind": "padded"}),
    **{
        f"trainer.algorithm.{key}": ({"trainer": {"algorithm": {"use_tis": True}}}, 0.01)
        for key in ("tis_splice", "tis_lcs_alert_threshold")
    },
    "trainer.algorithm.think_max_cost_per_turn": ({"trainer": {"algorithm": {"think_token_cost": 0.001}}}, 0.05),
    **{
        f"trainer.algorithm.{key}": ({"trainer": {"algorithm": {"policy_loss_type": "dppo"}}}, 0.2)
        for key in ("dppo_divergence_type", "dppo_divergence_threshold")
    },
    "trainer.algorithm.dynamic_sampling.informative_on": (
        {"trainer": {"algorithm": {"dynamic_sampling": {"type": "filter"}}}},
        "raw",
    ),
    **{
        f"trainer.{role}.fsdp_config.{key}": (
            {"trainer": {role: {"fsdp_config": {"context_parallel_size": 2}}}},
            "ring",
        )
        for role in ("policy", "ref", "critic")
        for key in ("cp_style", "cp_rotate_method")
    },
    **{
        f"trainer.{role}.fsdp_config.expert_loader_chunk_rows": (
            {"trainer": {role: {"fsdp_config": {"expert_model_parallel_size": 2}}}},
            4,
        )
        for role in ("policy", "ref", "critic")
    },
    **{
        f"generator.{key}": ({"trainer": {"policy": {"fsdp_config": {"moe_router_replay": True}}}}, "central")
        for key in ("r3_transport", "r3_dispatch_put_timeout_seconds")
    },
    "trainer.save_dataloader_state_in_ckpt": ({}, False),
    "generator.use_overlapped_weight_sync": ({"generator": {"backend": "sglang"}}, True),
    "generator.disaggregation": ({}, {"mode": "prefill"}),
}
HARMLESS = {
    "generator.context_warning_threshold": 0.9,
    "trainer.policy.optimizer_config.muon_lr": 0.02,
    "trainer.critic.optimizer_config.muon_lr": 0.02,
}


def _merge(into: dict, extra: dict) -> dict:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def _active_value(entry: legacy_history.Retired):
    if entry.path in ACTIVE:
        return ACTIVE[entry.path]
    leaf = entry.path.rsplit(".", 1)[-1]
    if leaf.startswith(("optimizer",)):
        return {}, "SGD"
    if leaf in ("use_hybrid_env_sampling", "inject_context_status", "deterministic", "retokenize") or leaf.startswith(
        ("dump_", "enable_")
    ):
        return {}, True
    if entry.harmless({"enabled": False}, lambda p: None) and not entry.harmless(True, lambda p: None):
        return {}, {"enabled": True, "coef": 0.5}
    return {}, 4096


@pytest.mark.parametrize("entry", legacy_history.RETIRED, ids=lambda e: e.path)
def test_retired_key_with_harmless_value_is_dropped_quietly(tmp_path, entry):
    value = HARMLESS.get(entry.path, None)
    doc, report, new = _migrate(yaml_helpers.dump(_nest(entry.path, value)))
    change = next(c for c in report.changes if c.old == entry.path)
    assert change.kind == "dropped" and change.severity == "info" and change.reason
    assert _analyze(tmp_path, new).ok


@pytest.mark.parametrize("entry", legacy_history.RETIRED, ids=lambda e: e.path)
def test_retired_key_that_turns_a_feature_on_is_a_finding(tmp_path, entry):
    context, value = _active_value(entry)
    data = _merge(_nest(entry.path, value), context)
    text = yaml_helpers.dump(data)
    doc, report, _ = _migrate(text)
    change = next(c for c in report.changes if c.old == entry.path)
    assert change.severity == entry.severity and change.code == entry.code, change.describe()
    assert ("changes what runs" in change.reason) == (entry.severity == "error"), change.reason
    assert entry.severity == "error" or legacy_history.WARNING_SAYS[entry.code] in change.reason
    line = next(ln for ln in report.lines() if entry.path in ln and "dropped" in ln)
    assert line.startswith("ALTERS WHAT RUNS") == (entry.severity == "error")
    # `rlc validate` on the legacy file reports the same code.
    codes = {d.code for d in _analyze(tmp_path, text).diagnostics}
    assert entry.code in codes


@pytest.mark.parametrize("switch", ["enable", "enabled"])
def test_a_block_switched_off_changes_nothing_whatever_else_it_holds(tmp_path, switch):
    """An off-policy block with `enable: false` (SkyRL spells its switches both ways) is dropped quietly; turned on,
    it changes what runs."""
    block = {switch: False, "max_staleness": 4, "importance_ratio_clip": 2.0}
    doc, report, new = _migrate(yaml_helpers.dump({"trainer": {"off_policy": block}}))
    change = next(c for c in report.changes if c.old == "trainer.off_policy")
    assert change.kind == "dropped" and change.severity == "info", change.describe()
    assert not [ln for ln in report.lines() if ln.startswith("ALTERS WHAT RUNS")]
    assert _analyze(tmp_path, new).ok
    doc, report, _ = _migrate(yaml_helpers.dump({"trainer": {"off_policy": {**block, switch: True}}}))
    assert next(c for c in report.changes if c.old == "trainer.off_policy").severity == "error"


def test_old_http_endpoint_names_move_to_the_engine_section(tmp_path):
    text = yaml_helpers.dump(
        {
            "generator": {
                "use_http_server_inference_engine_client": True,
                "http_server_inference_engine_client_host": "0.0.0.0",
                "http_server_inference_engine_client_port": 8011,
            }
        }
    )
    doc, report, new = _migrate(text)
    engine = to_plain(doc.data)["generator"]["inference_engine"]
    assert engine == {"enable_http_endpoint": True, "http_endpoint_host": "0.0.0.0", "http_endpoint_port": 8011}
    assert not report.errors


def test_rollout_correction_is_the_early_name_of_off_policy_correction(tmp_path):
    text = yaml_helpers.dump({"trainer": {"algorithm": {"rollout_correction": {"tis_ratio_type": "sequence"}}}})
    doc, report, new = _migrate(text)
    assert to_plain(doc.data)["trainer"]["algorithm"]["off_policy_correction"] == {"tis_ratio_type": "sequence"}
    assert _analyze(tmp_path, new).ok


def test_sampling_arguments_vllm_also_takes_move_to_additional_kwargs(tmp_path):
    sampling = {"max_generate_length": 64, "frequency_penalty": 0.5, "min_new_tokens": 4, "presence_penalty": 0.0}
    sampling |= {"skip_special_tokens": True, "no_stop_trim": True, "stop_token_ids": None}
    doc, report, new = _migrate(yaml_helpers.dump({"generator": {"sampling_params": sampling}}))
    params = to_plain(doc.data)["generator"]["sampling_params"]
    # Values other than vLLM's default reach vLLM under its names; the defaults have nothing to pass.
    assert params == {
        "max_generate_length": 64,
        "additional_kwargs": {"frequency_penalty": 0.5, "min_tokens": 4, "include_stop_str_in_output": True},
    }
    assert not report.errors
    assert _analyze(tmp_path, new).ok


def test_overlapped_weight_sync_only_matters_on_sglang_engines():
    on = {"generator": {"use_overlapped_weight_sync": True}}
    _, report, _ = _migrate(yaml_helpers.dump(on))
    assert not report.errors
    _, report, _ = _migrate(yaml_helpers.dump(_merge(on, {"generator": {"backend": "sglang"}})))
    assert [c.old for c in report.errors] == ["generator.use_overlapped_weight_sync"]


def test_unknown_hydra_group_says_whether_it_alters_what_runs(tmp_path):
    outside = (
        "defaults:\n  - _self_\n  - tbench_config: default\ntbench_config:\n  trials_dir: /tmp/t\ntrainer:\n  seed: 3\n"
    )
    doc, report, new = _migrate(outside)
    assert not report.errors
    said = [c for c in report.changes if c.code == legacy_history.HYDRA_OUTSIDE]
    assert said and "does not alter what runs" in said[0].reason
    assert "tbench_config" not in to_plain(doc.data)
    assert _analyze(tmp_path, new).ok
    inside = "defaults:\n  - _self_\n  - my_algo@trainer.algorithm: custom\ntrainer:\n  seed: 3\n"
    doc, report, _ = _migrate(inside)
    assert [c.code for c in report.errors] == [legacy_history.HYDRA_IN_SPEC]
    assert any(ln.startswith("ALTERS WHAT RUNS") and "my_algo" in ln for ln in report.lines())
    codes = {d.code for d in _analyze(tmp_path, inside).diagnostics}
    assert legacy_history.HYDRA_IN_SPEC in codes


def test_history_keys_are_not_spec_v1_keys():
    """A retired key that spec v1 gains (e.g. from SkyRL 0.4.0) must become a move instead."""
    assert [r.path for r in legacy_history.RETIRED if MODEL.lookup(r.path) is not None] == []
    assert all(MODEL.lookup(new) is not None for new in legacy_history.RENAMES.values())


@pytest.mark.parametrize(
    ("trainer", "budget", "codes"),
    [
        # The branch's test configs: the training budget and the forward passes' own.
        (
            {"use_dynamic_batching": True, "max_token_len_per_gpu_train": 300, "max_token_len_per_gpu_forward": 600},
            300,
            {legacy_history.MEMORY_ONLY},
        ),
        # Its first spelling: one budget for both.
        ({"use_dynamic_batching": True, "max_token_len_per_gpu": 4096}, 4096, set()),
        ({"use_dynamic_batching": True, "max_token_len_per_gpu_train": 512, "max_token_len_per_gpu": 512}, 512, set()),
        # Off, or the flag absent (the branch's default is off): the budgets turned nothing on.
        ({"use_dynamic_batching": False, "max_token_len_per_gpu": 4096}, None, set()),
        ({"max_token_len_per_gpu_train": 4096, "max_token_len_per_gpu_forward": 8192}, None, set()),
        # On without a budget: what it cut by is unknown here.
        ({"use_dynamic_batching": True}, None, {legacy_history.TOKEN_BUDGET}),
    ],
)
def test_dynamic_batching_migrates_onto_max_tokens_per_microbatch(tmp_path, trainer, budget, codes):
    text = yaml_helpers.dump({"trainer": trainer})
    doc, report, new = _migrate(text)
    migrated = to_plain(doc.data).get("trainer", {})
    assert migrated.get("max_tokens_per_microbatch") == budget
    assert not set(trainer) & set(migrated)
    assert {c.code for c in report.changes if c.code} == codes
    assert bool(report.errors) == (legacy_history.TOKEN_BUDGET in codes)
    if budget is not None:
        assert any(
            f"-> trainer.max_tokens_per_microbatch: {budget}" in line and "ALTERS" not in line
            for line in report.lines()
        )
    # `rlc validate` on the legacy file migrates it the same way, and the budget is one the runtime runs.
    result = _analyze(tmp_path, text)
    assert {d.code for d in result.diagnostics if d.severity == "error"} == codes & {legacy_history.TOKEN_BUDGET}


@pytest.mark.parametrize("name", ["klmckee-fleet-SkyRL_3f8c6093fffc.yaml", "klmckee-fleet-SkyRL_c14d627df2b2.yaml"])
def test_the_fleet_forks_hybrid_environment_sampling_is_carried(tmp_path, name):
    """The forks' sampler is rlc's (rlc.runtime.rollouts): their keys are the spec's, and the job compiles with it."""
    path = next(p for p in HISTORY if p.name == name)
    doc, report, new = _migrate(path.read_text(), name)
    trainer = to_plain(doc.data)["trainer"]
    assert (trainer["use_hybrid_env_sampling"], trainer["min_samples_per_env"]) == (True, 1)
    assert not [
        c for c in report.changes if c.old in ("trainer.use_hybrid_env_sampling", "trainer.min_samples_per_env")
    ]
    assert _analyze(tmp_path, new).ok

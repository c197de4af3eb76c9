"""`rlc migrate --from areal`: AReaL's own example configs import to spec v1 that validates, values kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, run_rlc
from rlc.compiler.importers.areal.importer import ImportRefused, areal_text, import_areal
from rlc.compiler.load import document_from_text, load_document
from rlc.compiler.pipeline import analyze_document, compile_text
from rlc.core.pipeline_stages import Stages
from rlc.core.plain import plain_yaml

FIXTURES = ROOT / "tests" / "fixtures" / "areal"
# file -> what the algorithm must become
RL = {
    "gsm8k_grpo.yaml": {"advantage_estimator": "grpo", "grpo_norm_by_std": True, "policy_loss_type": "regular"},
    "gsm8k_drgrpo.yaml": {"advantage_estimator": "grpo", "grpo_norm_by_std": False},
    "gsm8k_gspo.yaml": {"advantage_estimator": "grpo", "policy_loss_type": "gspo"},
    "gsm8k_dapo_dynamic_bs.yaml": {"advantage_estimator": "grpo", "eps_clip_high": 0.28, "eps_clip_low": 0.2},
    "gsm8k_rloo.yaml": {"advantage_estimator": "rloo"},
    "gsm8k_reinforce.yaml": {
        "advantage_estimator": "reinforce++",
        "use_kl_in_reward": True,
        "kl_loss_coef": 0.001,
        "kl_estimator_type": "k1",
    },
    "gsm8k_grpo_lora.yaml": {"advantage_estimator": "grpo"},
    "gsm8k_grpo_megatron.yaml": {"advantage_estimator": "grpo", "grpo_norm_by_std": True},
    "gsm8k_ppo_megatron.yaml": {"advantage_estimator": "gae", "value_clip": 0.5},
}
REFUSED = {"gsm8k_sft.yaml": "SFT", "hhrlhf_rw.yaml": "reward-model"}
CPU = {"gsm8k_grpo_cpu.yaml"}  # AReaL's CPU template: no GPU, per-engine backend fields, no allocation_mode


def _import(name: str):
    doc = load_document(FIXTURES / name)
    data = plain_yaml(doc.data)
    return data, import_areal(data, lambda p: doc.locate(tuple(p.split("."))).line)


def _leaves(node, prefix=""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix


def test_fixtures_are_all_classified():
    assert {p.name for p in FIXTURES.glob("*.yaml")} == set(RL) | set(REFUSED) | CPU


# Every example config of AReaL at one commit (head/SOURCES.md). Each imports to a spec rlc accepts, or is refused by
# name: not an RL job (nothing written).
HEAD = FIXTURES / "head"
HEAD_NOT_RL = {
    "alignment_hhrlhf_dpo.yaml": "DPO",
    "alignment_hhrlhf_rw.yaml": "reward-model",
    "math_gsm8k_sft.yaml": "SFT",
    "math_gsm8k_sft_archon_fp8.yaml": "SFT",
    "vlm_clevr_count_70k_sft.yaml": "SFT",
    "environ_ref.yaml": "generates nothing",
    "skypilot_ray_cluster.sky.yaml": "SkyPilot task",
    "skypilot_single_node.sky.yaml": "SkyPilot task",
}


def _import_head(name: str):
    doc = load_document(HEAD / name)
    return import_areal(plain_yaml(doc.data), lambda p: doc.locate(tuple(p.split("."))).line)


@pytest.mark.parametrize("name", sorted(p.name for p in HEAD.glob("*.yaml")))
def test_every_areal_example_imports_to_a_spec_rlc_accepts_or_is_refused_by_name(name):
    if name in HEAD_NOT_RL:
        with pytest.raises(ImportRefused, match=HEAD_NOT_RL[name]):
            _import_head(name)
        return
    analysis = analyze_document(document_from_text(areal_text(name, _import_head(name)), "imported.yaml"), env={})
    errors = [(d.code, d.message) for d in analysis.diagnostics if d.severity == "error"]
    assert not errors, errors


def test_areals_235b_job_gets_megatron_cores_uneven_split_no_larger_than_areals():
    """94 layers on 12 stages: AReaL balances them by its own parameter estimate; the import gives Megatron-Core's
    uneven split, whose largest stage holds no more layers than AReaL's."""
    spec = _import_head("tau2_config_235b_moe_airline.yaml").spec
    placing = spec["trainer.policy.megatron_config.transformer_config_kwargs"]
    assert placing == {"num_layers_in_first_pipeline_stage": 7, "num_layers_in_last_pipeline_stage": 7}
    ours = Stages.of(94, 12, placing).per_stage()
    assert ours == [7] + [8] * 10 + [7]
    splits = pytest.importorskip("areal.engine.megatron_utils.pipeline_parallel")
    from types import SimpleNamespace

    from rlc.compiler.model_size import find_config

    shape = find_config("Qwen/Qwen3-235B-A22B")[0]
    buckets = splits.estimate_stage_parameter_buckets(SimpleNamespace(**shape), SimpleNamespace(num_layers=94))
    areals = splits._compute_stage_layer_lengths(*buckets, 12)
    assert sum(areals) == sum(ours) == 94 and max(ours) <= max(areals), areals


@pytest.mark.parametrize(
    ("name", "ep", "etp"),
    [("math_gsm8k_grpo_megatron_lora_moe.yaml", 1, None), ("tau2_config_30b_moe_airline.yaml", 4, 1)],
)
def test_areals_megatron_moe_configs_compile_with_their_expert_layout(name, ep, etp):
    """AReaL's Megatron MoE configs keep the ffn part's expert sizes and fit their GPUs: the LoRA one (Qwen3-30B-A3B
    on 6 GPUs) trains adapters only, so no GPU holds gradients or optimizer state for the frozen 30B base."""
    result = compile_text(areal_text(name, _import_head(name)), "imported.yaml", env={})
    assert not [d for d in result.diagnostics if d.severity == "error"], [d.message for d in result.diagnostics]
    spec = result.analysis.spec
    mc = spec.trainer.policy.megatron_config
    assert (mc.expert_model_parallel_size, mc.expert_tensor_parallel_size) == (ep, etp)
    assert result.memory is not None and result.memory.fits
    if spec.trainer.policy.model.lora.rank:
        trainer = [g for g in result.memory.gpus if "policy/weights" in g.parts]
        assert trainer and all(g.parts["policy/optimizer"] < g.parts["policy/weights"] / 2 for g in trainer)


def test_areal_asynchronous_jobs_import_as_rlc_asynchronous_jobs_on_areals_gpus():
    """AReaL trains asynchronously with rollout and training on GPUs of their own: so does the import, on the GPUs
    AReaL's allocation gives (its archon engine as fsdp), the cluster grown where AReaL's is smaller."""
    tau2 = _import_head("tau2_config_8b_airline.yaml").spec
    assert tau2["trainer.fully_async.enabled"] is True and tau2["trainer.fully_async.max_staleness_steps"] == 2
    assert tau2["trainer.placement.allocation"] == "vllm:d16+fsdp:d8"
    assert (tau2["cluster.num_nodes"], tau2["cluster.gpus_per_node"]) == (3, 8)
    small = _import_head("scaffolding_gsm8k_rlvr_scaffolding.yaml")  # sglang:d1+d1 on a cluster of 1 GPU
    assert small.spec["trainer.placement.allocation"] == "vllm:d1+fsdp:d1"
    assert small.spec["cluster.num_nodes"] == 2 and small.spec["trainer.fully_async.enabled"] is True
    grown = next(c for c in small.changes if c.new == "cluster.num_nodes" and c.severity == "warning")
    assert "sized for the allocation" in grown.reason


@pytest.mark.parametrize("name", sorted(RL))
def test_rl_config_imports_and_validates_with_its_values(name):
    areal, result = _import(name)
    text = areal_text(name, result)
    analysis = analyze_document(document_from_text(text, "imported.yaml"), env={})
    errors = [(d.code, d.message) for d in analysis.diagnostics if d.severity == "error"]
    assert not errors, errors
    s = analysis.spec
    actor, opt = areal["actor"], areal["actor"]["optimizer"]
    assert s.trainer.policy.model.path == actor["path"]
    assert (s.cluster.num_nodes, s.cluster.gpus_per_node) == (
        areal["cluster"]["n_nodes"],
        areal["cluster"]["n_gpus_per_node"],
    )
    assert s.trainer.train_batch_size == areal["train_dataset"]["batch_size"]
    assert s.generator.n_samples_per_prompt == areal["gconfig"]["n_samples"]
    assert s.generator.sampling_params.max_generate_length == areal["gconfig"]["max_new_tokens"]
    assert s.generator.sampling_params.temperature == areal["gconfig"]["temperature"]
    oc = s.trainer.policy.optimizer_config
    assert (oc.lr, oc.weight_decay, oc.max_grad_norm) == (
        float(opt["lr"]),
        opt["weight_decay"],
        opt["gradient_clipping"],
    )
    assert oc.adam_betas == [opt["beta1"], opt["beta2"]]
    for key, want in RL[name].items():
        assert getattr(s.trainer.algorithm, key) == want, key
    # Every key of the AReaL file is accounted for in the report: mapped, or dropped with a reason.
    reported = {c.old for c in result.changes if c.old} | {src for srcs in result.sources.values() for src in srcs}
    missing = [leaf for leaf in _leaves(areal) if leaf not in reported]
    assert not missing, missing
    assert "# AReaL: actor.path" in text


def test_lora_megatron_and_placement_details():
    _, lora = _import("gsm8k_grpo_lora.yaml")
    assert lora.spec["trainer.policy.model.lora.rank"] == 32
    assert lora.spec["trainer.policy.model.lora.target_modules"] == "all-linear"
    _, rloo = _import("gsm8k_rloo.yaml")  # AReaL's older `sglang.d4p1t1+d4p1t1` spelling
    assert rloo.spec["trainer.placement.allocation"] == "vllm:d4p1t1+fsdp:d4p1t1"
    _, megatron = _import("gsm8k_grpo_megatron.yaml")
    assert megatron.spec["trainer.strategy"] == "megatron"
    assert megatron.spec["trainer.placement.allocation"] == "vllm:d4p1t1+megatron:d4p1t1"
    # AReaL's token budget per micro-batch is rlc's, under megatron as under fsdp2
    assert megatron.spec["trainer.max_tokens_per_microbatch"] == 10240
    _, grpo = _import("gsm8k_grpo.yaml")
    assert grpo.spec["trainer.max_tokens_per_microbatch"] == 10240
    assert grpo.sources["trainer.max_tokens_per_microbatch"] == ["actor.mb_spec.max_tokens_per_mb"]
    _, ppo = _import("gsm8k_ppo_megatron.yaml")
    assert ppo.spec["trainer.strategy"] == "megatron"  # the critic trains on Megatron as the actor does
    assert ppo.spec["trainer.placement.allocation"] == "vllm:d4p1t1+megatron:d2p1t1+megatron[critic]:d2p1t1"
    assert {c.new for c in ppo.errors} == {"trainer.placement.allocation"}  # GPUs of its own: half the actor's
    _, dapo = _import("gsm8k_dapo_dynamic_bs.yaml")
    assert {c.old for c in dapo.errors} >= {"rollout.max_head_offpolicyness"}
    assert not {c.old for c in dapo.errors} & {"actor.overlong_reward_penalty", "actor.overlong_tokens"}
    assert dapo.spec["trainer.algorithm.dynamic_sampling.type"] == "filter"
    assert dapo.spec["trainer.algorithm.overlong_buffer_len"] == 512  # DAPO's soft overlong penalty, verl's arithmetic
    assert dapo.spec["trainer.algorithm.overlong_buffer_penalty_factor"] == 1.0


@pytest.mark.parametrize("name,what", sorted(REFUSED.items()))
def test_non_rl_configs_are_refused(name, what):
    with pytest.raises(ImportRefused, match=what):
        _import(name)


def test_a_dpo_config_is_refused():
    data = {"experiment_name": "x", "actor": {"path": "m"}, "train_dataset": {"type": "dpo", "path": "p"}}
    with pytest.raises(ImportRefused, match="DPO"):
        import_areal(data)


def test_cli_writes_a_new_file_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "spec.yaml"
    done = run_rlc("migrate", "--from", "areal", str(FIXTURES / "gsm8k_grpo.yaml"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "moved    actor.optimizer.lr (line 51) -> trainer.policy.optimizer_config.lr" in done.stderr
    assert "dropped  cluster.name_resolve.type (line 14)" in done.stderr
    before = out.read_text()
    again = run_rlc("migrate", "--from", "areal", str(FIXTURES / "gsm8k_grpo.yaml"), "-o", str(out))
    assert again.returncode == 2 and "--force" in again.stderr
    assert out.read_text() == before
    refused_out = tmp_path / "sft.yaml"
    refused = run_rlc("migrate", "--from", "areal", str(FIXTURES / "gsm8k_sft.yaml"), "-o", str(refused_out))
    assert refused.returncode == 1 and "nothing was written" in refused.stderr
    assert not refused_out.exists()


def _import_with_allocation(tmp_path, allocation_mode: str):
    text = (FIXTURES / "gsm8k_grpo.yaml").read_text().replace("sglang:d4p1t1+d4p1t1", allocation_mode)
    path = Path(tmp_path / "alloc.yaml")
    path.write_text(text)
    doc = load_document(path)
    return import_areal(plain_yaml(doc.data), lambda p: doc.locate(tuple(p.split("."))).line)


def test_an_unsupported_allocation_is_reported_not_fatal(tmp_path):
    result = _import_with_allocation(tmp_path, "sglang:d4+fsdp:d2p2")  # AReaL's FSDP has no pipeline either
    assert "trainer.placement.allocation" not in result.spec
    assert [c.old for c in result.errors] == ["allocation_mode"]
    assert result.spec["trainer.placement.colocate_all"] is False  # rollout and training still on GPUs of their own


@pytest.mark.parametrize(
    ("areal", "rlc", "etp"),
    [
        ("sglang:d4+megatron:(attn:d1t4|ffn:d1e4)", "vllm:d4+megatron:d1t4e4", 1),
        ("sglang:d4+megatron:attn:d2t2|ffn:d1t2e2", "vllm:d4+megatron:d2t2e2", None),
        ("sglang:d4+archon:d4", "vllm:d4+fsdp:d4", None),
        ("sglang:d4+archon:d2p2", "vllm:d4+megatron:d2p2", None),
    ],
)
def test_hybrid_moe_and_archon_allocations_keep_areals_gpus(tmp_path, areal, rlc, etp):
    """AReaL's hybrid MoE form is the attention part's sizes with the experts' (their own tensor-parallel size as
    the Megatron setting); its archon engine trains as fsdp, or megatron where it pipelines."""
    result = _import_with_allocation(tmp_path, areal)
    assert not result.errors, [c.describe() for c in result.errors]
    assert result.spec["trainer.placement.allocation"] == rlc
    assert result.spec.get("trainer.policy.megatron_config.expert_tensor_parallel_size") == etp


@pytest.mark.parametrize(
    ("areal", "said"),
    [
        ("sglang:d4+megatron:(attn:d2p2t2|ffn:d2p2e4)", "attn part covers 8 GPUs (d x t x p x c) and the ffn part 16"),
        ("sglang:d4+megatron:(attn:d1p4t2|ffn:d1p2e4)", "attn part has 4 pipeline stages and the ffn part 2"),
    ],
)
def test_hybrid_moe_parts_must_cover_the_same_gpus(tmp_path, areal, said):
    """Megatron-Core splits one world both ways (tp x cp x dp x pp = etp x ep x edp x pp): parts that disagree are
    an import error naming both, not a layout that loses one of them."""
    result = _import_with_allocation(tmp_path, areal)
    assert "trainer.placement.allocation" not in result.spec
    assert [c.old for c in result.errors] == ["allocation_mode"]
    assert said in result.errors[0].reason


def test_areals_cpu_example_imports_and_validates(tmp_path):
    """AReaL's examples/math/gsm8k_grpo_cpu.yaml (n_gpus_per_node: 0) imported a ZeroDivisionError."""
    out = tmp_path / "cpu.yaml"
    result = run_rlc("migrate", "--from", "areal", str(FIXTURES / "gsm8k_grpo_cpu.yaml"), "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    checked = run_rlc("validate", str(out), "--format", "json")
    assert checked.returncode == 0, checked.stdout
    doc = plain_yaml(load_document(out).data)
    assert doc["cluster"]["accelerator"] == "none" and "gpus_per_node" not in doc["cluster"]
    assert doc["trainer"]["placement"]["allocation"] == "vllm:d1p1t1+fsdp:d1p1t1"
    assert doc["trainer"]["logger"] == "console"  # stats_logger.wandb.mode: disabled


def test_a_config_without_a_node_count_takes_it_from_the_allocation(tmp_path):
    text = (FIXTURES / "gsm8k_grpo.yaml").read_text().replace("  n_nodes: 1\n", "")
    doc = document_from_text(text, "no-nodes.yaml")
    result = import_areal(plain_yaml(doc.data), lambda p: 0)
    assert result.spec["cluster.num_nodes"] == 1 and "8 GPUs on nodes of 8" in next(
        c.reason for c in result.changes if c.new == "cluster.num_nodes"
    )
    analysis = analyze_document(document_from_text(areal_text("x", result), "imported.yaml"), env={})
    assert analysis.ok and not [d for d in analysis.diagnostics if d.severity != "info"], analysis.diagnostics


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("  adv_norm:\n", "  adv_norm: 0.5\n  old_adv_norm:\n", "actor.adv_norm"),
        ("gconfig:\n", "gconfig: [1, 2]\nold_gconfig:\n", "gconfig"),
    ],
)
def test_a_section_of_another_shape_is_a_finding_that_names_it(tmp_path, old, new, key):
    """An import never crashes: what it cannot keep, it names with the reason (an error finding, exit 1)."""
    text = (FIXTURES / "gsm8k_grpo.yaml").read_text()
    assert old in text
    path = tmp_path / "odd.yaml"
    path.write_text(text.replace(old, new, 1))
    result = run_rlc("migrate", "--from", "areal", str(path), "-o", str(tmp_path / "out.yaml"))
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    assert f"!! dropped  {key}" in report and "where AReaL writes a section; not carried" in report


def test_m2po_imports_into_the_off_policy_correction_and_validates(tmp_path):
    """actor.m2_threshold (M2PO) is off_policy_correction.m2po_threshold, carried without a word of change."""
    text = (FIXTURES / "gsm8k_grpo.yaml").read_text().replace("  use_decoupled_loss: true\n",
                                                              "  use_decoupled_loss: true\n  m2_threshold: 0.04\n")  # fmt: skip
    path = tmp_path / "m2po.yaml"
    path.write_text(text)
    doc = load_document(path)
    result = import_areal(plain_yaml(doc.data), lambda p: doc.locate(tuple(p.split("."))).line)
    assert result.spec["trainer.algorithm.off_policy_correction.m2po_threshold"] == 0.04
    assert "actor.m2_threshold" not in {c.old for c in result.changes if c.severity != "info"}
    spec = areal_text("m2po.yaml", result)
    analysis = analyze_document(document_from_text(spec, "imported.yaml"), env={})
    assert not [d.message for d in analysis.diagnostics if d.severity == "error"]
    assert analysis.spec.trainer.algorithm.off_policy_correction.m2po_threshold == 0.04


@pytest.mark.parametrize(("method", "severity"), [("recompute", "info"), ("loglinear", "error")])
def test_reward_clip_is_carried_and_a_loglinear_proximal_policy_is_said_to_alter_the_run(tmp_path, method, severity):
    text = (
        (FIXTURES / "gsm8k_grpo.yaml")
        .read_text()
        .replace(
            "  use_decoupled_loss: true\n",
            f"  use_decoupled_loss: true\n  reward_clip: 5.0\n  prox_logp_method: {method}\n",
        )
    )
    path = tmp_path / "clip.yaml"
    path.write_text(text)
    doc = load_document(path)
    result = import_areal(plain_yaml(doc.data), lambda p: doc.locate(tuple(p.split("."))).line)
    assert result.spec["trainer.algorithm.reward_clip"] == 5.0
    assert [c.severity for c in result.changes if c.old == "actor.prox_logp_method"] == [severity]
    analysis = analyze_document(document_from_text(areal_text("clip.yaml", result), "imported.yaml"), env={})
    assert not [d.message for d in analysis.diagnostics if d.severity == "error"]

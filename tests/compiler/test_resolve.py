"""Derived values: SkyRL's post-init derivations, cluster <-> placement, ${...} references."""

from __future__ import annotations

import json

from conftest import run_rlc
from rlc.compiler.pipeline import analyze


def _resolve(spec_file, text):
    analysis = analyze(spec_file(text), env={})
    # Derivations are checked for every spec value, including ones the runtime refuses (RLC-E9xx).
    errors = [
        (d.code, d.message) for d in analysis.diagnostics if d.severity == "error" and not d.code.startswith("RLC-E9")
    ]
    assert not errors and analysis.spec is not None, errors
    return analysis


def test_skyrl_derivations(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          logger: console
          max_prompt_length: 300
          policy: {model: {path: my/model}}
          algorithm: {use_tis: true, tis_imp_ratio_cap: 4.0}
        generator:
          sampling_params: {temperature: 0.7, max_generate_length: 700}
        """,
    )
    s, derived = a.spec, a.resolution.derived
    assert s.trainer.ref.model.path == "my/model" and derived["trainer.ref.model.path"] == ["trainer.policy.model.path"]
    assert s.generator.max_input_length == 300
    assert s.trainer.algorithm.temperature == 0.7
    assert s.trainer.algorithm.max_seq_len == 1000
    assert (
        s.generator.eval_sampling_params.temperature == 0.0
        and s.generator.eval_sampling_params.max_generate_length == 700
    )
    opc = s.trainer.algorithm.off_policy_correction
    assert opc.tis_ratio_type == "token" and opc.token_tis_ratio_clip_high == 4.0
    assert s.trainer.policy.megatron_config.transformer_config_kwargs["recompute_granularity"] == "full"


def test_rollout_is_asks_the_engines_for_their_log_probs(spec_file):
    """rollout_is weighs each token by its ratio to the engine's log-probs (SkyRL asserts they are there)."""
    text = """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer: {logger: console, algorithm: {policy_loss_type: %s}}
        generator: {sampling_params: {logprobs: null}}
        """
    a = _resolve(spec_file, text % "rollout_is")
    assert a.spec.generator.sampling_params.logprobs == 1
    assert a.resolution.derived["generator.sampling_params.logprobs"] == ["trainer.algorithm.policy_loss_type"]
    assert _resolve(spec_file, text % "importance_sampling").spec.generator.sampling_params.logprobs is None


def test_a_reference_to_a_number_in_a_text_field_is_its_text(spec_file, tmp_path):
    """As OmegaConf types it: `name: ${trainer.epochs}` is the name "20", which every target can quote."""
    from rlc.compiler.pipeline import compile_job

    text = """
        version: 1
        name: ${trainer.epochs}
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer: {logger: console, epochs: 20, policy: {model: {path: "${trainer.train_batch_size}"}}}
        """
    s = _resolve(spec_file, text).spec
    assert s.name == "20" and s.trainer.policy.model.path == "1024" and s.trainer.epochs == 20
    assert compile_job(spec_file(text)).plan is not None


def test_a_reference_resolving_outside_the_fields_values_is_an_error(spec_file):
    """The schema checks what is written (`${...}`); the resolved value must be one the field accepts as well."""
    from rlc.compiler.pipeline import analyze

    path = spec_file(
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer: {logger: "${trainer.seed}", epochs: 20}
        generator: {inference_engine: {gpu_memory_utilization: "${trainer.epochs}"}}
        """
    )
    found = {d.key: d.message for d in analyze(path, env={}).diagnostics if d.code == "RLC-E016"}
    assert "takes one of wandb, tensorboard, mlflow, console" in found["trainer.logger"]
    assert "resolves to 20" in found["generator.inference_engine.gpu_memory_utilization"]


def test_user_megatron_kwargs_are_back_filled(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          logger: console
          policy: {megatron_config: {transformer_config_kwargs: {recompute_granularity: selective}}}
        """,
    )
    kw = a.spec.trainer.policy.megatron_config.transformer_config_kwargs
    assert kw["recompute_granularity"] == "selective" and kw["recompute_num_layers"] == 1


def test_placement_and_engines_from_cluster(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 2}
        trainer: {logger: console}
        generator: {inference_engine: {tensor_parallel_size: 4}}
        """,
    )
    p, ie = a.spec.trainer.placement, a.spec.generator.inference_engine
    assert (p.policy_num_nodes, p.policy_num_gpus_per_node) == (2, 8)
    assert (p.ref_num_nodes, p.ref_num_gpus_per_node) == (2, 8)
    assert ie.num_engines == 4
    assert a.resolution.derived["generator.inference_engine.num_engines"][:2] == [
        "cluster.gpus_per_node",
        "cluster.num_nodes",
    ]


def test_separate_groups_share_what_the_engines_leave(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 2}
        trainer:
          logger: console
          placement: {colocate_all: false}
          micro_train_batch_size_per_gpu: 1
        generator: {inference_engine: {num_engines: 8}}
        """,
    )
    p = a.spec.trainer.placement
    assert (p.policy_num_nodes, p.policy_num_gpus_per_node) == (1, 8)
    assert (p.ref_num_nodes, p.ref_num_gpus_per_node) == (1, 8)  # colocate_policy_ref


def test_cluster_from_placement_copies_shared_layouts(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        trainer:
          logger: console
          placement: {policy_num_nodes: 1, policy_num_gpus_per_node: 4}
        generator: {inference_engine: {num_engines: 4}}
        """,
    )
    s = a.spec
    assert (s.cluster.num_nodes, s.cluster.gpus_per_node) == (1, 4)
    assert (s.trainer.placement.ref_num_nodes, s.trainer.placement.ref_num_gpus_per_node) == (1, 4)


def test_references_resolve_and_env_stays(spec_file):
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          logger: console
          run_name: "grpo-${trainer.train_batch_size}"
          ckpt_path: "${oc.env:CKPT_ROOT,/tmp}/ckpts"
        generator:
          max_input_length: ${trainer.max_prompt_length}
        """,
    )
    assert a.spec.trainer.run_name == "grpo-1024"
    assert a.spec.trainer.ckpt_path == "${oc.env:CKPT_ROOT,/tmp}/ckpts"
    assert a.spec.generator.max_input_length == 512


def test_provenance_names_each_origin(tmp_path):
    from conftest import EXAMPLES
    from rlc.compiler.emit_resolved import render
    from rlc.compiler.provenance import trace
    from rlc.core.digest import content_hash
    from rlc.core.overrides import parse_override

    a = analyze(EXAMPLES / "legacy-skyrl.yaml", [parse_override("trainer.seed=7")], env={})
    origin = trace(a.resolution, a.doc, a.migration)
    assert str(origin["trainer.seed"]) == "override trainer.seed=7"
    assert origin["generator.inference_engine.num_engines"].kind == "migrated"
    assert "generator.num_inference_engines" in origin["generator.inference_engine.num_engines"].detail
    assert origin["trainer.algorithm.temperature"].kind == "derived"
    assert origin["trainer.train_batch_size"].kind == "spec"
    assert origin["trainer.eval_interval"].kind == "default"
    text = render(a.spec, origin, "legacy-skyrl.yaml")
    assert f"# content-hash: {content_hash(a.spec)}" in text
    assert "seed: 7  # override trainer.seed=7" in text


def test_a_field_whose_reference_fails_is_reported_once_and_the_rules_read_its_default(spec_file):
    """A number that refers to a section, or to a key that is not there, is RLC-E016 at its line; the rules that read
    it see its default, not the text of the reference (rule RLC-E602 compared the text with 0 and crashed: found by
    test_properties' mutations)."""
    from rlc.compiler.pipeline import analyze

    path = spec_file(
        """
        version: 1
        cluster: {gpus_per_node: 8, num_nodes: 1}
        trainer:
          policy: {model: {path: Qwen/Qwen2.5-0.5B-Instruct, lora: {rank: "${trainer}", alpha: "${trainer.nowhere}"}}}
        """
    )
    analysis = analyze(path, env={})
    errors = [d for d in analysis.diagnostics if d.is_error]
    assert sorted(d.key for d in errors) == ["trainer.policy.model.lora.alpha", "trainer.policy.model.lora.rank"]
    assert all(d.code == "RLC-E016" and d.location is not None for d in errors)
    lora = analysis.resolution.spec.trainer.policy.model.lora
    assert (lora.rank, lora.alpha) == (0, 16) and analysis.resolution.failed == {
        "trainer.policy.model.lora.rank",
        "trainer.policy.model.lora.alpha",
    }


# -- a first spec: the cluster named by its node alone (issue 49) ---------------------------------------------------

FIRST_SPEC = """
    version: 1
    cluster: {accelerator: "H100:8"%s}
    trainer:
      logger: console
      algorithm: {use_kl_loss: true}
    generator: {inference_engine: {tensor_parallel_size: %d}}
    """


def _placement(analysis) -> tuple:
    p, ie = analysis.spec.trainer.placement, analysis.spec.generator.inference_engine
    return (
        analysis.spec.cluster.num_nodes,
        (p.policy_num_nodes, p.policy_num_gpus_per_node),
        (p.ref_num_nodes, p.ref_num_gpus_per_node),
        ie.num_engines,
    )


def test_a_cluster_named_by_its_node_alone_is_one_node_the_placement_fills(spec_file):
    """`H100:8` and nothing else: the job takes the 8 GPUs asked for (8 policy and ref ranks, 8 engines), as with
    `num_nodes: 1` written, not SkyRL's one-GPU default with 7 idle; a notice says what was derived."""
    from rlc.compiler.provenance import trace

    a = _resolve(spec_file, FIRST_SPEC % ("", 1))
    assert _placement(a) == (1, (1, 8), (1, 8), 8)
    assert not [d for d in a.diagnostics if d.code == "RLC-W202"]
    origin = trace(a.resolution, a.doc)
    assert str(origin["cluster.gpus_per_node"]) == "derived from cluster.accelerator"
    assert str(origin["cluster.num_nodes"]) == "derived from cluster.gpus_per_node"
    assert str(origin["trainer.placement.policy_num_gpus_per_node"]) == (
        "derived from cluster.gpus_per_node, cluster.num_nodes"
    )
    assert str(origin["generator.inference_engine.num_engines"]).startswith(
        "derived from cluster.gpus_per_node, cluster.num_nodes, generator.inference_engine.tensor_parallel_size"
    )
    (notice,) = [d for d in a.diagnostics if d.code == "RLC-I201"]
    assert notice.severity == "info" and notice.key == "cluster.num_nodes"
    assert notice.message == (
        "cluster.num_nodes is unset and the spec sets no placement count: the job takes one node of 8 GPUs and its "
        "placement follows it (policy 1 x 8 GPUs, ref 1 x 8 GPUs, 8 inference engine(s) of 1 GPU(s))"
    )
    assert "set cluster.num_nodes for more nodes" in notice.hint
    assert notice.values["derived"]["generator.inference_engine.num_engines"] == 8


def test_a_first_spec_with_tensor_parallel_engines_derives_them_instead_of_refusing(spec_file):
    """tp 2 on `H100:8` gave RLC-E201 ("set tensor_parallel_size back") against SkyRL's 1-GPU policy; now 4 engines
    of 2 GPUs under 8 policy ranks, exactly as the same file with `num_nodes: 1` added."""
    a = _resolve(spec_file, FIRST_SPEC % ("", 2))
    assert _placement(a) == (1, (1, 8), (1, 8), 4)
    assert not [d for d in a.diagnostics if d.code in ("RLC-E201", "RLC-W202")]
    b = _resolve(spec_file, FIRST_SPEC % (", num_nodes: 1", 2))
    assert _placement(b) == _placement(a)
    assert (
        b.resolution.derived["generator.inference_engine.num_engines"]
        == (a.resolution.derived["generator.inference_engine.num_engines"])
    )
    assert not [d for d in b.diagnostics if d.code == "RLC-I201"]  # nothing taken for the user: no notice


def test_gpus_per_node_alone_and_a_cpu_cluster_are_one_node_too(spec_file):
    a = _resolve(spec_file, FIRST_SPEC.replace('accelerator: "H100:8"%s', "gpus_per_node: 4") % 1)
    assert _placement(a) == (1, (1, 4), (1, 4), 4)
    cpu = """
        version: 1
        cluster: {accelerator: none, gpus_per_node: 2}
        trainer: {logger: console}
        generator: {inference_engine: {backend: hf}}
        """
    assert _placement(_resolve(spec_file, cpu))[:2] == (1, (1, 2))


def test_a_placement_count_written_keeps_the_cluster_derived_from_the_placement(spec_file):
    """Where the user set a count, rlc keeps SkyRL's reading of the others and sizes the cluster from them."""
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {accelerator: "H100:8"}
        trainer: {logger: console, placement: {policy_num_gpus_per_node: 2}}
        generator: {inference_engine: {num_engines: 2}}
        """,
    )
    assert a.spec.cluster.num_nodes == 1 and a.resolution.derived["cluster.num_nodes"][0].startswith("trainer.")
    assert a.spec.trainer.placement.policy_num_gpus_per_node == 2
    assert not [d for d in a.diagnostics if d.code == "RLC-I201"]


def test_separate_groups_on_a_node_named_alone_keep_skyrls_counts(spec_file):
    """colocate_all: false would split the node 7 + 1, which SkyRL's default batch sizes do not divide: the job keeps
    SkyRL's counts (and runs, as under SkyRL), with RLC-W202 saying how much of the cluster stays idle."""
    a = _resolve(
        spec_file,
        """
        version: 1
        cluster: {accelerator: "H100:8"}
        trainer: {logger: console, placement: {colocate_all: false}}
        """,
    )
    p = a.spec.trainer.placement
    assert (p.policy_num_gpus_per_node, a.spec.generator.inference_engine.num_engines) == (1, 1)
    assert [d.code for d in a.diagnostics] == ["RLC-W202"]


def test_a_node_the_batch_sizes_do_not_divide_keeps_skyrls_placement_and_says_what_is_idle(spec_file):
    # SkyRL runs this job on one GPU; three policy ranks would split 1024 prompts unevenly (RLC-E107).
    path = spec_file(
        """
        version: 1
        name: three
        cluster: {accelerator: H100, gpus_per_node: 3}
        trainer: {logger: console, policy: {model: {path: Qwen/Qwen2.5-0.5B-Instruct}}}
        """
    )
    done = run_rlc("validate", str(path), "--format", "json")
    assert done.returncode == 0, done.stdout
    codes = {d["code"]: d for d in json.loads(done.stdout)["diagnostics"]}
    assert "RLC-I201" not in codes and "RLC-E107" not in codes
    idle = codes["RLC-W202"]
    assert "2 stay idle" in idle["message"] and "cluster.gpus_per_node: 1" in idle["hint"]
    assert "to use all 3 GPUs" not in idle["hint"]

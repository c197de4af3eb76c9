"""What the runtime refuses at start-up, `rlc validate` refuses first: one case per config-error row of
docs/runtime-refusals.md, run through the CLI's click entry point as a user would see it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rlc.compiler.check import INTERNAL_ERROR, RULES, check
from rlc.compiler.cli import cli
from rlc.compiler.rules.base import Context, rule

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _validate(spec: Path | str, *overrides: str) -> tuple[int, list[dict]]:
    result = CliRunner().invoke(cli, ["validate", str(spec), *overrides, "--format", "json"])
    return result.exit_code, json.loads(result.output)["diagnostics"]


def _errors(diags: list[dict], code: str) -> list[dict]:
    return [d for d in diags if d["code"] == code and d["severity"] == "error"]


# (spec, override that makes the runtime refuse, code, key)
REFUSALS = [
    (
        "gsm8k-grpo-2node.yaml",
        "trainer.policy.fsdp_config.fsdp_size=3",
        "RLC-E505",
        "trainer.policy.fsdp_config.fsdp_size",
    ),
    ("gsm8k-grpo-8xh100.yaml", "trainer.ref.fsdp_config.fsdp_size=3", "RLC-E505", "trainer.ref.fsdp_config.fsdp_size"),
    (
        "gsm8k-grpo-megatron-8xh100.yaml",
        "trainer.policy.megatron_config.tensor_model_parallel_size=3",
        "RLC-E104",
        "trainer.policy.megatron_config.tensor_model_parallel_size",
    ),
    (
        "gsm8k-grpo-megatron-8xh100.yaml",
        "trainer.policy.sequence_parallel_size=2",
        "RLC-E504",
        "trainer.policy.sequence_parallel_size",
    ),
    # envs/gym.py:make, driver.py:Driver._rows: an environment no package registers
    ("gsm8k-grpo-8xh100.yaml", "environment.env_class=gsm8k_multiturn", "RLC-E902", "environment.env_class"),
    # envs/judge.py:LLMJudgeEnv: the judge's key is not on the node
    ("gsm8k-grpo-8xh100.yaml", "environment.env_class=llm_as_a_judge", "RLC-E904", "environment.env_class"),
    # envs/reward_function.py:RewardFunctionEnv: a reward function without its file
    (
        "gsm8k-grpo-8xh100.yaml",
        "environment.env_class=reward_function",
        "RLC-E905",
        "environment.skyrl_gym.reward_function.path",
    ),  # fmt: skip
    # scoring.py:Scoring.components: GDPO's components from an environment whose reward is one number
    (
        "gsm8k-grpo-8xh100.yaml",
        "trainer.algorithm.gdpo_reward_keys=[acc]",
        "RLC-E319",
        "trainer.algorithm.advantage_estimator",
    ),  # fmt: skip
    # chat.py:custom_template: a template name rlc does not have
    (
        "gsm8k-grpo-8xh100.yaml",
        "generator.chat_template.name_or_path=qwen3",
        "RLC-E410",
        "generator.chat_template.name_or_path",
    ),
]


# Refusals that take more than one override: (spec, overrides, code, key)
MEGATRON, VLLM_GPU, CPU = "gsm8k-grpo-megatron-8xh100.yaml", "gsm8k-grpo-8xh100.yaml", "local-cpu.yaml"
VLLM_CPU = ("generator.inference_engine.backend=vllm", "trainer.policy.model.path=rlc:tiny-vllm")
LORA = ("trainer.policy.model.lora.rank=8", "trainer.policy.model.lora.alpha=16")
REFUSALS_MANY = [
    # Qwen2.5-7B has 28 layers: 8 pipeline stages cannot take the same number each (megatron_weights.stage_layers).
    (
        MEGATRON,
        (
            "trainer.policy.megatron_config.tensor_model_parallel_size=1",
            "trainer.policy.megatron_config.pipeline_model_parallel_size=8",
        ),
        "RLC-E507",
        "trainer.policy.megatron_config.pipeline_model_parallel_size",
    ),
    # rlc:tiny has 2 layers: a vLLM engine of 4 pipeline stages would hold stages without one.
    (
        VLLM_GPU,
        ("trainer.policy.model.path=rlc:tiny", "generator.inference_engine.pipeline_parallel_size=4"),
        "RLC-E508",
        "generator.inference_engine.pipeline_parallel_size",
    ),
    # workers/ulysses.py: groups of sp ranks split each row, each rank taking whole heads (Qwen2.5-1.5B has 12).
    (VLLM_GPU, ("trainer.policy.sequence_parallel_size=3",), "RLC-E110", "trainer.policy.sequence_parallel_size"),
    (VLLM_GPU, ("trainer.policy.sequence_parallel_size=8",), "RLC-E512", "trainer.policy.sequence_parallel_size"),
    # Megatron-Core's allgather MoE dispatcher wants one micro-batch shape on every rank, token budgets vary it.
    (
        MEGATRON,
        (
            "trainer.max_tokens_per_microbatch=8192",
            "trainer.policy.megatron_config.moe_token_dispatcher_type=allgather",
            "trainer.policy.megatron_config.pipeline_model_parallel_size=2",
        ),
        "RLC-E903",
        "trainer.max_tokens_per_microbatch",
    ),
    # vLLM's CPU attention has no head size 16 ("Unsupported CPU attention configuration" at start-up).
    (
        CPU,
        ("generator.inference_engine.backend=vllm", "trainer.policy.model.path=rlc:tiny"),
        "RLC-E513",
        "trainer.policy.model.path",
    ),
    # vLLM's ModelConfig: "Sleep mode is not supported on current platform".
    (
        CPU,
        (*VLLM_CPU, "generator.inference_engine.engine_init_kwargs={enable_sleep_mode: true}"),
        "RLC-E514",
        "generator.inference_engine.engine_init_kwargs",
    ),
    # vLLM's EngineArgs has no max_lora_rank above 512.
    (
        VLLM_GPU,
        ("trainer.policy.model.lora.rank=1024", "trainer.policy.model.lora.alpha=2048"),
        "RLC-E509",
        "trainer.policy.model.lora.rank",
    ),
    # megatron_lora.add_adapters finds no layer for these names; an unknown name beside known ones would be ignored.
    (
        MEGATRON,
        (*LORA, "trainer.policy.model.lora.target_modules=qkv_proj"),
        "RLC-E510",
        "trainer.policy.model.lora.target_modules",
    ),
    (
        MEGATRON,
        (*LORA, "trainer.policy.model.lora.target_modules=q_proj,attn.c_attn"),
        "RLC-E510",
        "trainer.policy.model.lora.target_modules",
    ),
    (
        MEGATRON,
        (*LORA, "trainer.policy.model.lora.target_modules=q_proj", "trainer.policy.model.lora.exclude_modules=q_proj"),
        "RLC-E510",
        "trainer.policy.model.lora.target_modules",
    ),
    # workers/megatron.py:_check_fused_head: the fused head's entropy has no gradient; MTP distils from whole logits.
    (
        MEGATRON,
        ("trainer.fused_lm_head_logprob=true", "trainer.algorithm.use_entropy_loss=true"),
        "RLC-E570",
        "trainer.algorithm.use_entropy_loss",
    ),
    (MEGATRON, ("trainer.fused_lm_head_logprob=true", "trainer.mtp.enabled=true"), "RLC-E571", "trainer.mtp.enabled"),
    # workers/megatron.py: TransformerConfig(**...) / OptimizerConfig(**...) refuse these at start-up (TypeError).
    (
        MEGATRON,
        ("trainer.policy.megatron_config.transformer_config_kwargs.hidden_dropoutt=0.0",),
        "RLC-E511",
        "trainer.policy.megatron_config.transformer_config_kwargs.hidden_dropoutt",
    ),
    (
        MEGATRON,
        ("trainer.ref.megatron_config.transformer_config_kwargs.turbo=true",),
        "RLC-E511",
        "trainer.ref.megatron_config.transformer_config_kwargs.turbo",
    ),
    (
        MEGATRON,
        ("trainer.policy.megatron_config.optimizer_config_kwargs.adam_epsilon=1.0e-6",),
        "RLC-E511",
        "trainer.policy.megatron_config.optimizer_config_kwargs.adam_epsilon",
    ),
    (
        MEGATRON,
        ("trainer.policy.megatron_config.optimizer_config_kwargs.lr=0.1",),
        "RLC-E511",
        "trainer.policy.megatron_config.optimizer_config_kwargs.lr",
    ),
]


@pytest.mark.parametrize(("example", "override", "code", "key"), REFUSALS)
def test_validate_refuses_what_the_runtime_refuses(example: str, override: str, code: str, key: str) -> None:
    rc, diags = _validate(EXAMPLES / example, override)
    hits = _errors(diags, code)
    assert rc == 1 and hits, diags
    assert hits[0]["key"] == key and hits[0]["file"], hits[0]


@pytest.mark.parametrize(("example", "overrides", "code", "key"), REFUSALS_MANY)
def test_validate_refuses_what_the_runtime_refuses_with_several_overrides(
    example: str, overrides: tuple[str, ...], code: str, key: str
) -> None:
    rc, diags = _validate(EXAMPLES / example, *overrides)
    hits = _errors(diags, code)
    assert rc == 1 and hits, diags
    assert hits[0]["key"] == key and hits[0]["file"] == "<command line>", hits[0]
    assert hits[0]["hint"], hits[0]


MG = "trainer.policy.megatron_config"
TCK = f"{MG}.transformer_config_kwargs"
# Pipeline layouts Megatron-Core refuses for Qwen2.5-7B's 28 layers (TransformerConfig.__post_init__,
# initialize_model_parallel), keyed where the fix goes.
PIPELINE_REFUSALS = [
    ((f"{MG}.tensor_model_parallel_size=1", f"{MG}.pipeline_model_parallel_size=8"), f"{MG}.pipeline_model_parallel_size"),
    (  # 28 - 5 = 23 layers do not split over 7 stages
        (f"{MG}.tensor_model_parallel_size=1", f"{MG}.pipeline_model_parallel_size=8", f"{TCK}.num_layers_in_first_pipeline_stage=5"),
        f"{TCK}.num_layers_in_first_pipeline_stage",
    ),
    (  # 7 layers a stage do not split into 2 virtual stages
        (f"{MG}.pipeline_model_parallel_size=4", f"{TCK}.virtual_pipeline_model_parallel_size=2"),
        f"{TCK}.virtual_pipeline_model_parallel_size",
    ),
    ((f"{TCK}.virtual_pipeline_model_parallel_size=2",), f"{TCK}.virtual_pipeline_model_parallel_size"),  # pp 1
    ((f"{MG}.pipeline_model_parallel_size=2", f"{TCK}.num_layers_in_last_pipeline_stage=0"), f"{TCK}.num_layers_in_last_pipeline_stage"),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "key"), PIPELINE_REFUSALS)
def test_pipeline_layouts_megatron_core_refuses_are_refused(overrides: tuple[str, ...], key: str) -> None:
    rc, diags = _validate(EXAMPLES / MEGATRON, *overrides)
    hits = _errors(diags, "RLC-E507")
    assert rc == 1 and hits and hits[0]["key"] == key and hits[0]["hint"], diags


@pytest.mark.parametrize(
    ("example", "overrides", "code"),
    [
        # 28 layers: 7 on the first of 8 stages, 3 on each other (Megatron-Core's uneven split).
        (
            MEGATRON,
            (
                f"{MG}.tensor_model_parallel_size=1",
                f"{MG}.pipeline_model_parallel_size=8",
                f"{TCK}.num_layers_in_first_pipeline_stage=7",
            ),
            "RLC-E507",
        ),
        # 28 layers: 4 on the first and last of 4 stages, 10 on each middle one, 2 virtual stages of 2 and 5.
        (
            MEGATRON,
            (
                f"{MG}.pipeline_model_parallel_size=4",
                f"{TCK}.num_layers_in_first_pipeline_stage=4",
                f"{TCK}.num_layers_in_last_pipeline_stage=4",
                f"{TCK}.virtual_pipeline_model_parallel_size=2",
            ),
            "RLC-E507",
        ),
        # 28 layers over 4 stages, 7 each.
        (
            MEGATRON,
            (
                "trainer.policy.megatron_config.tensor_model_parallel_size=2",
                "trainer.policy.megatron_config.pipeline_model_parallel_size=4",
            ),
            "RLC-E507",
        ),
        (VLLM_GPU, ("generator.inference_engine.pipeline_parallel_size=2",), "RLC-E508"),
        (CPU, VLLM_CPU, "RLC-E513"),
        (CPU, VLLM_CPU, "RLC-E514"),
        (CPU, ("trainer.policy.model.path=rlc:smollm2-135m", "generator.inference_engine.backend=vllm"), "RLC-E513"),
        (VLLM_GPU, ("trainer.policy.model.path=rlc:tiny",), "RLC-E513"),  # GPU attention takes head size 16
        (VLLM_GPU, ("trainer.policy.model.lora.rank=20", "trainer.policy.model.lora.alpha=40"), "RLC-E509"),
        (VLLM_GPU, ("trainer.policy.model.lora.rank=512", "trainer.policy.model.lora.alpha=1024"), "RLC-E509"),
        (MEGATRON, (*LORA, "trainer.policy.model.lora.target_modules=linear_qkv,o_proj"), "RLC-E510"),
        (MEGATRON, (*LORA, "trainer.policy.model.lora.target_modules=all-linear"), "RLC-E510"),
        (MEGATRON, ("trainer.policy.megatron_config.transformer_config_kwargs.hidden_dropout=0.0",), "RLC-E511"),
        (MEGATRON, ("trainer.policy.megatron_config.optimizer_config_kwargs.adam_eps=1.0e-6",), "RLC-E511"),
        (
            MEGATRON,
            ("trainer.policy.megatron_config.optimizer_config_kwargs.use_distributed_optimizer=false",),
            "RLC-E511",
        ),
        (VLLM_GPU, ("trainer.policy.sequence_parallel_size=4", "trainer.ref.sequence_parallel_size=2"), "RLC-E110"),
        (VLLM_GPU, ("trainer.policy.sequence_parallel_size=4", "trainer.ref.sequence_parallel_size=2"), "RLC-E512"),
        (VLLM_GPU, ("trainer.max_tokens_per_microbatch=8192",), "RLC-E903"),
        # Token-budget micro-batches under Megatron: stages send each one's shape first (variable_seq_lengths).
        (
            MEGATRON,
            ("trainer.max_tokens_per_microbatch=8192", "trainer.policy.megatron_config.pipeline_model_parallel_size=2"),
            "RLC-E903",
        ),
        (
            MEGATRON,
            (
                "trainer.max_tokens_per_microbatch=8192",
                "trainer.policy.megatron_config.moe_token_dispatcher_type=allgather",
            ),
            "RLC-E903",
        ),
        # fsdp2 hands target_modules to PEFT, which knows the model's own module names.
        (VLLM_GPU, (*LORA, "trainer.policy.model.lora.target_modules=qkv_proj"), "RLC-E510"),
    ],
)
def test_what_the_runtime_runs_passes_those_rules(example: str, overrides: tuple[str, ...], code: str) -> None:
    _rc, diags = _validate(EXAMPLES / example, *overrides)
    assert not _errors(diags, code), diags


def test_fsdp_size_that_divides_the_world_is_valid() -> None:
    rc, diags = _validate(EXAMPLES / "gsm8k-grpo-2node.yaml", "trainer.policy.fsdp_config.fsdp_size=8")
    assert rc == 0, diags


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", ".NaN", "+.Inf"])
def test_non_finite_override_is_refused(text: str) -> None:
    rc, diags = _validate(EXAMPLES / "gsm8k-grpo-2node.yaml", f"trainer.policy.optimizer_config.lr={text}")
    hits = _errors(diags, "RLC-E015")
    assert rc == 1 and hits and hits[0]["key"] == "trainer.policy.optimizer_config.lr", diags
    assert hits[0]["file"] == "<command line>"


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf"])
def test_non_finite_value_in_a_file_is_refused_at_its_line(tmp_path: Path, text: str) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "version: 1\ncluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}\n"
        f"generator:\n  sampling_params:\n    temperature: {text}\n"
    )
    rc, diags = _validate(spec)
    hits = _errors(diags, "RLC-E015")
    assert rc == 1 and hits and hits[0]["key"] == "generator.sampling_params.temperature", diags
    assert hits[0]["file"] == str(spec) and hits[0]["line"] == 5


def test_a_crashing_rule_is_an_internal_error_not_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    # A real rule made the way every rule is; it fails the way a rule with a bug would.
    @rule("RLC-E998", "divides by the train batch size", "trainer.train_batch_size")
    def crashes(c: Context):
        yield c.error("RLC-E998", "trainer.train_batch_size", str(1 // 0), "none")

    monkeypatch.setattr("rlc.compiler.check.RULES", (*RULES, crashes))

    from rlc.compiler.pipeline import analyze

    spec = analyze(EXAMPLES / "local-cpu.yaml").spec
    out = check(spec, lambda key, related=(): None, env={})
    internal = [d for d in out if d.code == INTERNAL_ERROR]
    assert internal and "RLC-E998" in internal[0].message and "crashes" in internal[0].message
    assert internal[0].is_error and "report" in internal[0].hint


def test_megatron_tensor_parallel_must_divide_a_local_models_heads(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = {
        "model_type": "qwen2",
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "hidden_size": 896,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "hidden_act": "silu",
    }
    (model / "config.json").write_text(json.dumps(config))
    rc, diags = _validate(
        EXAMPLES / "gsm8k-grpo-megatron-8xh100.yaml",
        f"trainer.policy.model.path={model}",
        "trainer.policy.megatron_config.tensor_model_parallel_size=4",
    )
    hits = _errors(diags, "RLC-E506")
    assert rc == 1 and hits and hits[0]["key"] == "trainer.policy.megatron_config.tensor_model_parallel_size", diags
    assert "num_attention_heads=14" in hits[0]["message"]
    rc, diags = _validate(
        EXAMPLES / "gsm8k-grpo-megatron-8xh100.yaml",
        f"trainer.policy.model.path={model}",
        "trainer.policy.megatron_config.tensor_model_parallel_size=2",
    )
    assert not _errors(diags, "RLC-E506"), diags
    # The runtime's own conversion check refuses the same layout (it reads the config by attribute, no weights).
    megatron_weights = pytest.importorskip("rlc.runtime.workers.megatron_weights")
    from types import SimpleNamespace

    with pytest.raises(megatron_weights.UnsupportedModel, match="num_attention_heads=14"):
        megatron_weights.layout_from_hf(SimpleNamespace(**config), tp_size=4)


def test_a_feature_value_that_turns_nothing_on_is_not_refused():
    """RLC-E903 fires on what would run differently, not on a value that turns nothing on (or a debug dump the
    runtime writes)."""
    spec = EXAMPLES / "local-cpu.yaml"
    inert = (
        "generator.max_turns=1",
        "generator.chat_template.name_or_path=''",
        "trainer.rope_scaling={}",
        "trainer.policy.sequence_parallel_size=1",
        "generator.sampling_params.additional_kwargs={}",
        "trainer.dump_data_batch=true",
        "trainer.dump_eval_results=false",
    )
    code, diags = _validate(spec, *inert)
    assert code == 0 and not _errors(diags, "RLC-E903"), diags
    on = ("trainer.rope_scaling={type: linear, factor: 2}",)
    code, diags = _validate(spec, *on)
    assert code == 1
    assert {d["key"] for d in _errors(diags, "RLC-E903")} == {"trainer.rope_scaling"}
    # A custom chat template runs (issue 29): a named one rlc has is accepted, one it lacks is RLC-E410.
    assert _validate(spec, "generator.chat_template.name_or_path=qwen3_without_thinking")[0] == 0
    code, diags = _validate(spec, "generator.chat_template.name_or_path=my/template.jinja")
    assert code == 1 and [d["code"] for d in diags if d["severity"] == "error"] == ["RLC-E410"]

"""`rlc explain KEY` lists every rule the key takes part in, with code and title."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from rlc.compiler.cli import cli


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("trainer.policy.fsdp_config.fsdp_size", {"RLC-E505"}),
        ("trainer.algorithm.advantage_estimator", {"RLC-E301", "RLC-E307"}),
        ("trainer.placement.colocate_all", {"RLC-E201", "RLC-E311"}),
        ("trainer.policy.megatron_config.tensor_model_parallel_size", {"RLC-E104"}),
        ("trainer.policy.megatron_config.pipeline_model_parallel_size", {"RLC-E507"}),
        ("generator.inference_engine.pipeline_parallel_size", {"RLC-E508"}),
        ("trainer.policy.model.lora.rank", {"RLC-E509", "RLC-E510", "RLC-E602"}),
        ("trainer.policy.model.lora.target_modules", {"RLC-E510"}),
        ("trainer.policy.model.path", {"RLC-E506", "RLC-E507", "RLC-E508", "RLC-E513"}),
        ("generator.inference_engine.backend", {"RLC-E508", "RLC-E509", "RLC-E513", "RLC-E514"}),
        ("generator.inference_engine.tensor_parallel_size", {"RLC-E514"}),
    ],
)
def test_explain_lists_the_rules_of_a_key(key: str, expected: set[str]) -> None:
    result = CliRunner().invoke(cli, ["explain", key])
    assert result.exit_code == 0, result.output
    listed = result.output.split("rules:", 1)[1] if "rules:" in result.output else ""
    codes = {word for word in listed.split() if word.startswith("RLC-")}
    assert expected <= codes, result.output
    assert "fsdp_size divides the role's world size" in result.output or "RLC-E505" not in expected


def test_every_rule_declares_the_keys_it_reads_and_explain_lists_it_under_each() -> None:
    """Each rule names its keys; `rlc explain` of any of them lists the rule's code and what it checks."""
    from rlc.compiler.check import RULES
    from rlc.compiler.explain import explain_key

    by_key: dict[str, set[str]] = {}
    for r in RULES:
        assert r.keys, f"{r.code} declares no spec keys"
        for key in r.keys:
            by_key.setdefault(key, set()).add(r.code)
    for key in ["trainer.policy.model.lora.target_modules", "generator.inference_engine.pipeline_parallel_size"]:
        text, ok = explain_key(key)
        assert ok, text
        for code in by_key[key]:
            title = next(r.title for r in RULES if r.code == code)
            assert code in text and title in text, (code, text)


# What `rlc explain` says of each multi-turn key: a word of its doc, and a rule it takes part in (if any).
MULTI_TURN_KEYS = {
    "generator.max_turns": ("observation", "RLC-E407"),
    "generator.max_input_length": ("length", "RLC-E401"),
    "generator.use_conversation_multi_turn": ("plain tokens", "RLC-E408"),
    "generator.append_eos_token_after_stop_str_in_multi_turn": ("stop string", "RLC-W402"),
    "generator.step_wise_trajectories": ("advantage", "RLC-E408"),
    "generator.batched": ("Single-turn", "RLC-E407"),
    "generator.chat_template.name_or_path": ("{% generation %}", "RLC-E410"),
    "generator.chat_template.source": ("qwen3_with_thinking", "RLC-E410"),
    "generator.chat_template_kwargs": ("apply_chat_template", "RLC-E407"),
    "environment.env_class": ("gsm8k_multi_turn", "RLC-E902"),
    "environment.skyrl_gym.max_env_workers": ("parallel", None),
    "environment.skyrl_gym.search.search_url": ("retrieval", "RLC-E904"),
    "environment.skyrl_gym.text2sql.db_path": ("db_id", None),
}


@pytest.mark.parametrize("key", sorted(MULTI_TURN_KEYS))
def test_explain_documents_each_multi_turn_key(key):
    from rlc.compiler.explain import explain_key

    word, code = MULTI_TURN_KEYS[key]
    text, found = explain_key(key)
    assert found and word in text, text
    assert code is None or code in text, text

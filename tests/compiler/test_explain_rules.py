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
    ],
)
def test_explain_lists_the_rules_of_a_key(key: str, expected: set[str]) -> None:
    result = CliRunner().invoke(cli, ["explain", key])
    assert result.exit_code == 0, result.output
    listed = result.output.split("rules:", 1)[1] if "rules:" in result.output else ""
    codes = {word for word in listed.split() if word.startswith("RLC-")}
    assert expected <= codes, result.output
    assert "fsdp_size divides the role's world size" in result.output or "RLC-E505" not in expected

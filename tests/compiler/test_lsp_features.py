"""The language server's answers as functions of a spec's text and its compile result (rlc.compiler.lsp.features):
the edits that fix findings, and the hook through which another command's proposals (`rlc fit`'s) become code
actions."""

from __future__ import annotations

from lsprotocol import types as lsp
from rlc.compiler.lsp import features
from rlc.compiler.pipeline import compile_text

from tests.conftest import EXAMPLES

URI = "file:///job.yaml"
TEXT = (EXAMPLES / "gsm8k-grpo-2node.yaml").read_text(encoding="utf-8")


def on_line(text: str, line: str) -> tuple[list[str], lsp.Range]:
    lines = text.splitlines()
    n = lines.index(line)
    return lines, lsp.Range(lsp.Position(n, 0), lsp.Position(n, len(line)))


def test_a_legacy_key_in_a_v1_spec_is_renamed_in_place():
    text = TEXT.replace("    use_kl_loss: true\n", "    use_kl_loss: true\n    ppo_loss_type: regular\n")
    result = compile_text(text, "job.yaml")
    lines, where = on_line(text, "    ppo_loss_type: regular")
    found = features.actions(lines, URI, where, result.diagnostics, result)
    rename = next(a for a in found if a.title == "rename ppo_loss_type to policy_loss_type")
    edit = rename.edit.changes[URI][0]
    assert (edit.range.start.character, edit.range.end.character, edit.new_text) == (4, 17, "policy_loss_type")


def test_a_proposed_value_replaces_the_value_and_keeps_the_comment():
    text = TEXT.replace("  policy_mini_batch_size: 256", "  policy_mini_batch_size: 300  # prompts a step")
    result = compile_text(text, "job.yaml")
    lines, where = on_line(text, "  policy_mini_batch_size: 300  # prompts a step")
    found = {a.title: a for a in features.actions(lines, URI, where, result.diagnostics, result)}
    edit = found["set trainer.policy_mini_batch_size to 256"].edit.changes[URI][0]
    line = lines[edit.range.start.line]
    fixed = line[: edit.range.start.character] + edit.new_text + line[edit.range.end.character :]
    assert fixed == "  policy_mini_batch_size: 256  # prompts a step"


def test_another_commands_proposal_is_offered_on_the_lines_it_changes(monkeypatch):
    """The hook `rlc fit` uses: a proposer returns (title, {key: value}) for a compiled spec."""
    monkeypatch.setattr(
        features,
        "PROPOSERS",
        [lambda result: [("fit: 4 engines of TP 4", {"generator.inference_engine.tensor_parallel_size": 4})]],
    )
    result = compile_text(TEXT, "job.yaml")
    lines, where = on_line(TEXT, "    tensor_parallel_size: 2")
    found = features.actions(lines, URI, where, result.diagnostics, result)
    assert [(a.title, a.edit.changes[URI][0].new_text) for a in found] == [("fit: 4 engines of TP 4", "4")]
    elsewhere = on_line(TEXT, "  epochs: 20")[1]
    assert features.actions(lines, URI, elsewhere, result.diagnostics, result) == []

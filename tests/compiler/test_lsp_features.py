"""The language server's answers as functions of a spec's text and its compile result (rlc.compiler.lsp.features):
the edits that fix findings, and the hook through which another command's proposals (`rlc fit`'s) become code
actions."""

from __future__ import annotations

from conftest import EXAMPLES
from lsprotocol import types as lsp
from rlc.compiler.lsp import features
from rlc.compiler.pipeline import compile_text

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


def test_idle_gpus_offer_the_counts_that_use_them_as_one_action():
    """RLC-W202 with placement counts written: the editor's fix sets the counts `rlc validate`'s help proposes."""
    text = (
        "version: 1\n"
        "cluster:\n"
        "  accelerator: H100:8\n"
        "trainer:\n"
        "  logger: console\n"
        "  placement:\n"
        "    policy_num_gpus_per_node: 2\n"
        "    ref_num_gpus_per_node: 2\n"
        "  algorithm:\n"
        "    use_kl_loss: true\n"
        "generator:\n"
        "  inference_engine:\n"
        "    num_engines: 2\n"
    )
    result = compile_text(text, "job.yaml")
    (idle,) = [d for d in result.diagnostics if d.code == "RLC-W202"]
    lines, where = on_line(text, "  accelerator: H100:8")  # where the warning is: the cluster's line
    found = {a.title: a for a in features.actions(lines, URI, where, result.diagnostics, result)}
    fix = found["set policy_num_gpus_per_node to 8, ref_num_gpus_per_node to 8, num_engines to 8"]
    edits = fix.edit.changes[URI]
    assert [(lines[e.range.start.line].split(":")[0].strip(), e.new_text) for e in edits] == [
        ("policy_num_gpus_per_node", "8"),
        ("ref_num_gpus_per_node", "8"),
        ("num_engines", "8"),
    ]
    assert "to use all 8 GPUs, set trainer.placement.policy_num_gpus_per_node: 8" in idle.hint

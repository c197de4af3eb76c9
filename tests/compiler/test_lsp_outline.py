"""Where the cursor is in a spec, from indentation alone (rlc.compiler.lsp.outline): the key a line sets, the
mapping a key being typed joins, the keys already written there; half-typed lines included."""

from __future__ import annotations

from rlc.compiler.lsp.outline import path_at, siblings, typing_at

SPEC = """\
version: 1
trainer:
  # a comment
  policy:
    model:
      path: Qwen/Qwen2.5-0.5B   # trailing comment
  strategy: fsdp2

  epochs: 3
launch:
  setup:
    - echo one
  envs:
    "QUOTED": 1
generator:
  inference_engine:
    backend: vllm
  polic
""".splitlines()


def test_each_line_sets_its_dotted_key():
    assert path_at(SPEC, SPEC.index("      path: Qwen/Qwen2.5-0.5B   # trailing comment"))[0] == [
        "trainer",
        "policy",
        "model",
        "path",
    ]
    assert path_at(SPEC, SPEC.index("  epochs: 3"))[0] == ["trainer", "epochs"]  # past a blank line
    assert path_at(SPEC, SPEC.index('    "QUOTED": 1'))[0] == ["launch", "envs", "QUOTED"]
    assert path_at(SPEC, SPEC.index("  # a comment")) is None
    assert path_at(SPEC, SPEC.index("    - echo one")) is None


def test_a_key_being_typed_joins_the_mapping_its_indentation_says():
    line = SPEC.index("  polic")
    typing = typing_at(SPEC, line, len("  polic"))
    assert typing is not None and not typing.value
    assert (typing.parent, typing.word, typing.start) == (["generator"], "polic", 2)
    assert siblings(SPEC, line, 2) == {"inference_engine"}
    assert siblings(SPEC, SPEC.index("  strategy: fsdp2"), 2) == {"policy", "epochs"}  # not the line being typed


def test_a_value_being_typed_belongs_to_its_key():
    line = SPEC.index("    backend: vllm")
    typing = typing_at(SPEC, line, len("    backend: vl"))
    assert typing is not None and typing.value
    assert (typing.parent, typing.word) == (["generator", "inference_engine", "backend"], "vl")
    assert typing_at(SPEC, SPEC.index("      path: Qwen/Qwen2.5-0.5B   # trailing comment"), 40) is None  # in a comment

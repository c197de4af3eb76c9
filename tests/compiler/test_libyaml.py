"""The language server's parse (`compiler/libyaml.py`: libyaml's events, ruamel's composer and constructor) gives the
tree ruamel's own parser gives, minus comments: the same keys in the same order, the same value types and values,
the same line and column of every key, value and item. What it does not carry over it declines, and the text is read
by ruamel alone, so a broken text gets the same diagnostic either way."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES
from rlc.compiler import libyaml
from rlc.compiler.load import LoadError, parse
from ruamel.yaml.comments import CommentedMap, CommentedSeq

ROOT = Path(__file__).resolve().parents[2]
HISTORY = sorted((ROOT / "tests" / "fixtures" / "skyrl-history").glob("*.yaml"))
FILES = sorted(EXAMPLES.glob("*.yaml")) + sorted((ROOT / "tests" / "fixtures" / "areal").glob("*.yaml")) + HISTORY[::12]

# Texts that reach every construct a spec may use: each must take the libyaml path and give ruamel's tree.
TAKEN = {
    "scalars": "a: 1\nb: 1.0e-6\nc: 0o17\nd: 1_000\ne: .inf\nf: yes\ng: ~\nh: null\ni: true\nj: 0x1F\nk: -0.0\n",
    "quoted": "a: 'single'\nb: \"double \\u00e9 \\n\"\nc: \"\"\nd: ''\n",
    "blocks": "a: |\n  line one\n  line two\nc: |+\n  kept\n\nd: |-\n  x\n",
    "flow": "a: [1, 'two', {b: 3, c: [4]}]\nb: {}\nc: []\n",
    "empty values": "a:\nb:\n  c:\n  d: 1\ne:\n",
    "empty value before a comment line": "a:\n# a note\nb: 1\n",
    "nested lists": "a:\n- x\n- - y\n  - z\n- k: v\n  l: w\nb:\n  - 1\n  -   2\n",
    "anchors and merge keys": "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\nlist: &l [1, 2]\nagain: *l\n",
    "unicode": 'name: "d\u00e9j\u00e0 vu"  # \u2014 a comment\nemoji: \U0001f600\nafter: 1\n',
    "crlf": "a: 1\r\nb:\r\n  c: 2\r\n",
    "document markers": "---\na: 1\n...\n",
    "comments everywhere": "# head\na: 1  # eol\n\n# between\nb:\n  # inside\n  c: 2\n# tail\n",
    "complex key": "? a\n: 1\n",
    "empty": "",
}
# Texts it declines: ruamel's parser reads them (and words the error where there is one).
DECLINED = {
    "a tab": "a:\tb\n",
    "a tag": "a: !!str 1\n",
    "a folded scalar (ruamel keeps where its lines folded)": "a: >\n  folded\n  text\n",
    "a directive": "%YAML 1.2\n---\na: 1\n",
    "an empty value before a comment on its line": "a:   # nothing yet\nb: 1\n",
    "an empty list item": "a:\n-\n- 1\n",
    "a syntax error": "a: [1, 2\nb: 3\n",
    "a duplicate key": "a: 1\na: 2\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "an undefined alias": "a: *nothing\n",
    "bad indentation": "a:\n  b: 1\n c: 2\n",
}


def same_tree(fast, slow, path: str = "$") -> None:
    assert type(fast) is type(slow), path
    if isinstance(fast, (CommentedMap, CommentedSeq)):
        assert (fast.lc.line, fast.lc.col, fast.lc.data) == (slow.lc.line, slow.lc.col, slow.lc.data), path
        assert fast.fa.flow_style() == slow.fa.flow_style(), path
        assert getattr(fast.anchor, "value", None) == getattr(slow.anchor, "value", None), path
        if isinstance(fast, CommentedMap):
            assert list(fast) == list(slow), path
            for key in fast:
                same_tree(fast[key], slow[key], f"{path}.{key}")
        else:
            assert len(fast) == len(slow), path
            for i, (a, b) in enumerate(zip(fast, slow)):
                same_tree(a, b, f"{path}[{i}]")
        return
    assert repr(fast) == repr(slow), path
    assert _state(fast) == _state(slow), path  # e.g. a float's width, precision and exponent as written


def _state(value) -> dict:
    slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ()) if s != "__weakref__"]
    return {s: repr(getattr(value, s, None)) for s in slots}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_and_yaml_fixture_reads_the_same_through_libyaml(path: Path) -> None:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        slow = parse(text, path.name)
    except LoadError as exc:
        with pytest.raises(LoadError) as fast:
            parse(text, path.name, comments=False)
        assert fast.value.diagnostic == exc.diagnostic
        return
    same_tree(parse(text, path.name, comments=False), slow)


def test_the_examples_in_the_current_version_take_the_libyaml_path() -> None:
    for path in EXAMPLES.glob("*.yaml"):
        if not path.name.startswith("legacy"):  # its `num_warmup_steps:  # comment` is for ruamel's parser
            libyaml.load(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", TAKEN)
def test_each_construct_takes_the_libyaml_path_and_gives_ruamels_tree(name: str) -> None:
    text = TAKEN[name]
    same_tree(libyaml.load(text), parse(text, "t.yaml"))


@pytest.mark.parametrize("name", DECLINED)
def test_what_libyaml_does_not_carry_is_read_by_ruamel_with_the_same_result(name: str) -> None:
    text = DECLINED[name]
    with pytest.raises(libyaml.Declined):
        libyaml.load(text)
    try:
        slow = parse(text, "t.yaml")
    except LoadError as exc:
        with pytest.raises(LoadError) as fast:
            parse(text, "t.yaml", comments=False)
        assert fast.value.diagnostic == exc.diagnostic
        return
    same_tree(parse(text, "t.yaml", comments=False), slow)


def test_the_300_line_spec_the_benchmark_edits_takes_the_libyaml_path() -> None:
    """The shape of bench/lsp_bench.py's spec (explicit nulls, flow lists, a comment on every line)."""
    lines = ["version: 1  # spec", "cluster:", '  accelerator: "H100"  # spec', "  image: null  # default"]
    lines += ["trainer:"] + [f'  key_{i}: [{i}, "x"]  # default' for i in range(300)]
    text = "\n".join(lines) + "\n"
    same_tree(libyaml.load(text), parse(text, "t.yaml"))

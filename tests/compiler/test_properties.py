"""Property-based robustness of `rlc validate`: whatever the file or the overrides, the answer is a
diagnosis (exit 0, 1, or 2 for usage errors) and never a traceback or an internal error.

Three families of inputs go through the installed CLI in a subprocess (few examples each, every run
costs a process start):

  (a) random YAML: random nested mappings/lists/scalars rendered to YAML, YAML token soup, raw bytes,
      and the example spec with a random stretch replaced by token soup;
  (b) the example spec (sometimes the legacy SkyRL example) with values of the wrong type, or of the right
      type at the edges (0, negative, huge, NaN, interpolations), written at random keys of the spec model;
  (c) random `key=value` overrides (model keys, legacy keys, random dotted keys, junk; YAML-ish values;
      '+'/'~' prefixes, missing '=') on the example and on the legacy example.

The same inputs then go through `rlc.compiler.pipeline.analyze` in-process, with many more examples.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_rlc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlc.compiler.importers.skyrl import legacy
from rlc.compiler.pipeline import analyze
from rlc.core.diagnostics import render_json, render_text
from rlc.core.overrides import OverrideError, parse_override
from rlc.spec.model import SpecModel, type_label

EXAMPLE = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
EXAMPLE_TEXT = EXAMPLE.read_text(encoding="utf-8")
LEGACY = EXAMPLES / "legacy-skyrl.yaml"
LEGACY_TEXT = LEGACY.read_text(encoding="utf-8")  # no `version`: runs the migration
PATHS = sorted(SpecModel().paths())  # the brief: keys of the spec model
LEGACY_PATHS = sorted(set(legacy.MOVES) | set(legacy.SPLITS) | {d[0] for d in legacy.DROPS})
NAMES = sorted({p.rsplit(".", 1)[-1] for p in PATHS})
TOP = sorted({p.split(".", 1)[0] for p in PATHS})

CLI = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IN_PROCESS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CRASH_MARKERS = ("Traceback", "internal error")


# --------------------------------------------------------------------------- strategies


def _text(max_size: int = 20) -> st.SearchStrategy[str]:
    # no NUL (cannot go into argv) and no surrogates (cannot be encoded); everything else is fair game
    return st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=max_size)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    _text(),
    st.sampled_from(
        [
            "",
            " ",
            "-1",
            "0",
            "1e400",
            "yes",
            "no",
            "on",
            "null",
            "~",
            ".inf",
            "H100",
            "vllm",
            "grpo",
            "fsdp2",
            "2020-01-01",
            "0x10",
            "0o17",
            "1_000",
            "~/data/x.parquet",
            "a" * 300,
            # interpolations, which resolve follows (self-references, env lookups, junk)
            "${trainer.epochs}",
            "${trainer.train_batch_size}",
            "${trainer}",
            "${oc.env:HOME}",
            "${oc.env:NOPE_NOT_SET}",
            "${oc.env:X,3}",
            "${",
            "${}",
            "${a.b}",
            "${${x}}",
            "x${cluster.num_nodes}y",
            "${trainer.policy.model.path}",
            "${generator.n_samples_per_prompt}",
        ]
    ),
)
keys = st.one_of(st.sampled_from(TOP + NAMES), _text(max_size=12), st.integers(-3, 3), st.booleans(), st.none())


def _containers(children):
    return st.one_of(st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5))


values = st.recursive(scalars, _containers, max_leaves=30)


@st.composite
def documents(draw):
    """A random document: usually a mapping (often with `version: 1` so the v1 path runs), sometimes not."""
    if draw(st.integers(0, 9)) == 0:
        return draw(values)
    doc = {}
    version = draw(st.sampled_from(["one", "one", "one", "absent", "absent", "junk"]))
    if version == "one":
        doc["version"] = 1
    elif version == "junk":
        doc["version"] = draw(scalars)
    for key in draw(st.lists(st.sampled_from(TOP), max_size=6, unique=True)):
        doc[key] = draw(values)
    doc.update(draw(st.dictionaries(keys, values, max_size=3)))
    return doc


def dump(data, flow) -> str:
    from ruamel.yaml import YAML

    y = YAML(typ="safe", pure=True)
    y.default_flow_style = flow
    y.allow_unicode = True
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


@st.composite
def rendered_documents(draw) -> str:
    data = draw(documents())
    style = draw(st.sampled_from(["block", "flow", "auto", "json"]))
    if style == "json":
        return json.dumps(data, default=str)  # JSON is YAML (NaN/Infinity become strings or junk: fine)
    return dump(data, {"block": False, "flow": True, "auto": None}[style])


FRAGMENTS = [
    "version: 1\n",
    "version: 2\n",
    "name: x\n",
    "trainer:\n",
    "cluster:\n",
    "  ",
    "    ",
    "\n",
    "\n  ",
    "- ",
    "? ",
    ": ",
    ":",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "!t ",
    "!!str ",
    "!!int ",
    "!!map ",
    "!!set ",
    "!!binary ",
    "!!python/name:os.system ",
    "!!python/object/apply:os.system ",
    "<<: ",
    "<<: *a\n",
    "# c\n",
    "'",
    '"',
    "|\n",
    ">-\n",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "%TAG !e! tag:e.com,2000:\n",
    "!e!x ",
    "\t",
    "\\",
    "\ufeff",
    "é",
    "1",
    "-1.5e3",
    ".inf",
    ".nan",
    "null",
    "~",
    "true",
    "gpus_per_node",
    "epochs: ",
    "0x1F",
    "2020-01-01",
    "=",
    "@",
    "`",
    "%",
    "\r\n",
    "\u2028",
    "\x85",
]
token_soup = st.lists(st.one_of(st.sampled_from(FRAGMENTS), _text(max_size=5)), max_size=40).map("".join)


@st.composite
def spliced_example(draw) -> str:
    """The example spec with a random stretch replaced by token soup."""
    n = len(EXAMPLE_TEXT)
    start = draw(st.integers(0, n))
    end = draw(st.integers(start, min(n, start + 80)))
    return EXAMPLE_TEXT[:start] + draw(token_soup) + EXAMPLE_TEXT[end:]


# raw file contents: text (written as UTF-8) or bytes (written as is)
random_files = st.one_of(
    rendered_documents(),
    rendered_documents(),
    token_soup,
    spliced_example(),
    st.binary(max_size=200),
    st.binary(max_size=60).map(lambda b: b"version: 1\nname: " + b),
)

wrong_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(_text(max_size=8), scalars, max_size=3),
    st.sampled_from([[], {}, [[1]], {"a": {"b": None}}, [None], [{"x": 1}]]),
)


MODEL = SpecModel()
MEGATRON_KWARGS = {
    f"trainer.{role}.megatron_config.{name}"
    for role in ("policy", "ref")
    for name in ("transformer_config_kwargs", "optimizer_config_kwargs")
}
EXTREME = {
    "int": [0, -1, 1, 2, 3, 7, 2**31, 2**63, 10**30, -(10**30)],
    "float": [0.0, -0.0, -1.0, 1e-300, 1e300, float("inf"), float("-inf"), float("nan"), 0.5, 2.0],
    "str": ["", " ", "x", "a" * 1000, "é✓", "../../etc/passwd", "$(rm -rf /)", "${trainer.epochs}", "a b\tc"],
    "bool": [True, False],
}


def extreme_values(path: str) -> st.SearchStrategy:
    """Values of the right type but at the edges (0, negative, huge, NaN, empty, ...), so checks run on them."""
    spec = MODEL.lookup(path)
    label = type_label(spec.tp) if spec is not None and spec.section is None else ""
    options: list = [None] if "null" in label else []
    allowed = MODEL.allowed_values(spec) if spec is not None else None
    options += [a for a in (allowed or []) if a is not None]
    for word, vals in EXTREME.items():
        if word in label.replace("list[", "").replace("]", ""):
            options += [[], [vals[0]], vals[:3]] if label.startswith("list") else vals
    return st.sampled_from(options) if options else wrong_values


@st.composite
def mutated_example(draw) -> str:
    """The example spec (or, one time in four, the legacy SkyRL example, which is migrated in memory) with
    wrong-typed values written at random model keys (sections included) or random keys removed."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    y = YAML(typ="rt")
    is_legacy = draw(st.integers(0, 3)) == 0
    data = y.load(LEGACY_TEXT if is_legacy else EXAMPLE_TEXT)
    pick = st.sampled_from(PATHS + LEGACY_PATHS) if is_legacy else st.sampled_from(PATHS)
    for path in draw(st.lists(pick, min_size=1, max_size=3)):
        parts = path.split(".")
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = CommentedMap()
                node[part] = child
            node = child
        if draw(st.integers(0, 9)) == 0:
            node.pop(parts[-1], None)
            continue
        node[parts[-1]] = draw(st.one_of(wrong_values, extreme_values(path)))
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


ident = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
good_keys = st.one_of(
    st.sampled_from(PATHS),
    st.sampled_from(PATHS),
    st.sampled_from(LEGACY_PATHS + ["version"]),  # legacy keys in overrides are migrated on the fly
    st.lists(ident, min_size=1, max_size=4).map(".".join),
    st.tuples(st.sampled_from(PATHS), ident).map(".".join),  # below a model key, often below a scalar
)
junk_keys = st.one_of(
    _text(max_size=10).filter(lambda s: not s.startswith("-")),  # '-...' would be read by click as an option
    st.sampled_from(["", " ", ".", "a..b", "1abc", "a.", ".a", "a-b", "a b", "ä"]),
)
override_values = st.one_of(
    st.sampled_from(
        [
            "",
            "1",
            "-1",
            "0",
            "1.5",
            "1e400",
            ".nan",
            "true",
            "null",
            "~",
            "[1, 2]",
            "[",
            "]",
            "{a: 1}",
            "{",
            "'",
            '"',
            "a: b",
            "- x",
            "!!python/object/apply:os.system [ls]",
            "!custom x",
            "&a 1",
            "*a",
            "[&a 1, *a]",
            "|",
            "2020-01-01",
            "2020-02-30",
            "!!int ",
            "H100",
            "vllm",
            "grpo",
            "x=y",
            "a,b",
            "#c",
            "%x",
        ]
    ),
    _text(max_size=12),
    scalars.map(str),
)
well_formed_override = st.tuples(good_keys, override_values).map("=".join)
malformed_override = st.one_of(
    st.tuples(st.sampled_from(["+", "~"]), good_keys, override_values).map(lambda t: f"{t[0]}{t[1]}={t[2]}"),
    good_keys,  # no '='
    st.tuples(junk_keys, override_values).map("=".join),
    st.tuples(good_keys, override_values).map(" = ".join),
)


@st.composite
def override_lists(draw) -> list[str]:
    """1-3 overrides, each well-formed five times in six (values may still be bad YAML: a usage error)."""
    return [
        draw(malformed_override if draw(st.integers(0, 5)) == 0 else well_formed_override)
        for _ in range(draw(st.integers(1, 3)))
    ]


# --------------------------------------------------------------------------- helpers


def write(dirname: str, content: str | bytes) -> Path:
    path = Path(dirname) / "spec.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _strict_json(text: str):
    """RFC 8259 JSON: no NaN / Infinity tokens."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check_cli(proc, fmt: str, allowed: tuple[int, ...]) -> None:
    for stream in (proc.stdout, proc.stderr):
        for marker in CRASH_MARKERS:
            assert marker not in stream, f"{marker!r} in output (rc={proc.returncode}):\n{stream}"
    assert proc.returncode in allowed, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    if fmt == "json" and proc.returncode in (0, 1):
        payload = _strict_json(proc.stdout)
        assert payload["ok"] is (proc.returncode == 0)
        assert (payload["errors"] > 0) is (proc.returncode == 1)
        for d in payload["diagnostics"]:
            assert d["code"].startswith("RLC-") and d["severity"] in ("error", "warning", "info")


def cli_validate(content: str | bytes, overrides: list[str] = (), fmt: str = "text"):
    with tempfile.TemporaryDirectory() as tmp:
        path = write(tmp, content)
        args = ["validate", str(path), *overrides] + (["--format", "json"] if fmt == "json" else [])
        return run_rlc(*args, cwd=tmp)


def analyze_in_process(content: str | bytes, overrides=()):
    with tempfile.TemporaryDirectory() as tmp:
        analysis = analyze(write(tmp, content), list(overrides), env={})
    # whatever was found must render in both formats
    render_text(analysis.diagnostics)
    _strict_json(render_json(analysis.diagnostics))
    for d in analysis.diagnostics:
        assert d.code.startswith("RLC-"), d
    return analysis


def classify(texts: list[str]) -> tuple[str, list]:
    """'usage' when rlc must refuse the overrides with exit 2, else 'spec' and the parsed overrides."""
    try:
        return "spec", [parse_override(t) for t in texts]
    except OverrideError:
        return "usage", []


def expected_exit(texts: list[str], base: Path) -> tuple[int, ...]:
    """2 when rlc must refuse the overrides as a usage error, else 0 or 1.

    Usage errors: what parse_override refuses ('+'/'~' prefixes, no '=', keys that are not dotted names,
    values that are not YAML), and overrides that cannot apply to the spec, e.g. a key below a scalar
    (found here by applying them to a scratch copy of the document, as the CLI does)."""
    from rlc.compiler.importers.versions import upgrade
    from rlc.compiler.load import load_document

    kind, parsed = classify(texts)
    if kind == "usage":
        return (2,)
    try:
        upgrade(load_document(base), parsed)
    except OverrideError:
        return (2,)
    return (0, 1)


# --------------------------------------------------------------------------- (a) random YAML through the CLI


@CLI
@given(content=random_files, fmt=st.sampled_from(["text", "json"]))
def test_cli_random_yaml_is_diagnosed(content, fmt):
    check_cli(cli_validate(content, fmt=fmt), fmt, (0, 1))


# --------------------------------------------------------------------------- (b) wrong types at known keys through the CLI


@CLI
@given(content=mutated_example(), fmt=st.sampled_from(["text", "json"]))
def test_cli_wrong_types_are_diagnosed(content, fmt):
    check_cli(cli_validate(content, fmt=fmt), fmt, (0, 1))


# --------------------------------------------------------------------------- (c) random overrides through the CLI


bases = st.sampled_from([EXAMPLE, EXAMPLE, LEGACY])


@CLI
@given(texts=override_lists(), base=bases, fmt=st.sampled_from(["text", "json"]))
def test_cli_random_overrides(texts, base, fmt):
    allowed = expected_exit(texts, base)
    proc = cli_validate(base.read_text(encoding="utf-8"), texts, fmt=fmt)
    check_cli(proc, fmt, allowed)
    if allowed == (2,):
        assert "Usage:" in proc.stderr and "Error:" in proc.stderr, proc.stderr


def test_plus_prefix_is_a_usage_error():
    proc = cli_validate(EXAMPLE_TEXT, ["+trainer.epochs=3"])
    check_cli(proc, "text", (2,))
    assert "'+' prefix" in proc.stderr


# --------------------------------------------------------------------------- in-process: many more examples


@IN_PROCESS
@given(content=random_files)
def test_analyze_never_raises_on_random_files(content):
    analyze_in_process(content)


@IN_PROCESS
@given(content=mutated_example())
def test_analyze_never_raises_on_wrong_types(content):
    analysis = analyze_in_process(content)
    # the example itself is valid, so anything found comes from the mutation; a mutation may also be harmless
    assert all(d.location is not None for d in analysis.diagnostics if d.is_error)


@IN_PROCESS
@given(texts=override_lists(), base=bases)
def test_analyze_never_raises_on_random_overrides(texts, base):
    kind, parsed = classify(texts)
    if kind == "usage":
        return
    try:
        analyze_in_process(base.read_text(encoding="utf-8"), parsed)
    except OverrideError:
        pass  # an override that cannot apply (below a scalar): the CLI turns this into a usage error, exit 2


# --------------------------------------------------------------------------- regressions found by these properties


@pytest.mark.parametrize("override", ["name.x=1", "cluster.accelerator.foo=1", "trainer.epochs.x=1"])
def test_override_below_a_scalar_is_a_usage_error(override):
    # used to raise OverrideError inside analyze -> 'rlc: internal error', exit 3
    proc = cli_validate(EXAMPLE_TEXT, [override])
    check_cli(proc, "text", (2,))
    assert "is not a section" in proc.stderr


def test_section_set_to_a_scalar_then_a_child_is_a_usage_error():
    proc = cli_validate(EXAMPLE_TEXT, ["trainer=1", "trainer.epochs=2"])
    check_cli(proc, "text", (2,))


def test_recursive_alias_in_override_value_is_a_usage_error():
    # used to make load.to_plain recurse forever -> RecursionError -> exit 3
    proc = cli_validate(EXAMPLE_TEXT, ["trainer.epochs=&a [*a]"])
    check_cli(proc, "text", (2,))


@pytest.mark.parametrize("value", ["${oc.env:HOME}", "${trainer}"])
@pytest.mark.parametrize("path", sorted(MEGATRON_KWARGS))
def test_interpolated_megatron_kwargs_is_not_an_internal_error(path, value):
    # resolve.skyrl did `k not in current` on the value, which the schema lets be a `${...}` string -> exit 3
    parts = path.split(".")
    text = "version: 1\nname: x\n" + "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parts[:-1]))
    text += f"{'  ' * (len(parts) - 1)}{parts[-1]}: {value}\n"
    check_cli(cli_validate(text), "text", (0, 1))


@pytest.mark.parametrize("override", ["version=1", "version=2", "version=abc", "version="])
def test_version_override_on_a_legacy_file(override):
    # upgrade() raised VersionError (version != 1) or AttributeError on a None report (version=1) -> exit 3
    check_cli(cli_validate(LEGACY_TEXT, [override]), "text", (0, 1))


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_json_output_is_strict_json_for_non_finite_values(value):
    # render_json printed a bare NaN token, which strict JSON parsers (JavaScript, Go, serde) reject
    proc = cli_validate(EXAMPLE_TEXT, [f"trainer.epochs={value}"], fmt="json")
    check_cli(proc, "json", (1,))
    _strict_json(proc.stdout)


@pytest.mark.skipif(os.name != "posix", reason="argv handling")
def test_override_with_newlines_and_unicode_values():
    proc = cli_validate(EXAMPLE_TEXT, ["name=a\nb", "trainer.run_name=é✓", "trainer.project_name=\t"])
    check_cli(proc, "text", (0, 1))

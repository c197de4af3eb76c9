"""Hostile and broken spec files: each is refused with a stable code, at the right line, never a traceback.

The CLI tests run the installed `rlc validate --format json` like a user would; the unit tests at the
end check how `document_from_text` / `Document.locate` point at nested keys and list items.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_rlc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlc.compiler.load import MAX_BYTES, LoadError, document_from_text, prescan

# --------------------------------------------------------------------------- helpers


def assert_no_crash(proc) -> None:
    for stream in (proc.stdout, proc.stderr):
        assert "Traceback" not in stream, stream
        assert "internal error" not in stream, stream


def validate_json(path: Path | str, *overrides: str):
    """`rlc validate --format json PATH`; returns (process, parsed JSON)."""
    proc = run_rlc("validate", "--format", "json", str(path), *overrides)
    assert_no_crash(proc)
    try:
        payload = json.loads(proc.stdout)
    except json.JSONDecodeError:  # pragma: no cover - shown on failure only
        pytest.fail(f"stdout is not JSON (rc={proc.returncode}):\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc, payload


def diagnostic(payload: dict, code: str) -> dict:
    found = [d for d in payload["diagnostics"] if d["code"] == code]
    assert found, f"no {code} in {[(d['code'], d['message']) for d in payload['diagnostics']]}"
    return found[0]


def refused(path: Path | str, code: str) -> dict:
    """Run validate on PATH; assert exit 1, `ok: false` and a `code` error; return that diagnostic."""
    proc, payload = validate_json(path)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert payload["ok"] is False
    assert payload["errors"] >= 1
    d = diagnostic(payload, code)
    assert d["severity"] == "error"
    assert d["file"] == str(path)
    return d


def write_bytes(tmp_path: Path, data: bytes, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- sanity: the examples are valid


def test_example_is_valid():
    proc, payload = validate_json(EXAMPLES / "gsm8k-grpo-8xh100.yaml")
    assert proc.returncode == 0, proc.stdout
    assert payload["ok"] is True and payload["errors"] == 0


# --------------------------------------------------------------------------- RLC-E002 duplicate keys


def test_duplicate_top_level_key_points_at_second_occurrence(spec_file):
    path = spec_file("""
        version: 1
        name: first
        cluster:
          gpus_per_node: 8
        name: second
    """)
    d = refused(path, "RLC-E002")
    assert d["line"] == 5
    assert d["column"] == 1
    assert "name" in d["message"]


def test_duplicate_nested_key_points_at_second_occurrence(spec_file):
    path = spec_file("""
        version: 1
        name: dup
        cluster:
          accelerator: H100
          gpus_per_node: 8
          num_nodes: 1
          gpus_per_node: 4
    """)
    d = refused(path, "RLC-E002")
    assert d["line"] == 7
    assert d["column"] == 3
    assert "gpus_per_node" in d["message"]


def test_duplicate_key_hint_names_the_first_occurrence(spec_file):
    path = spec_file("""
        version: 1
        name: first
        cluster:
          gpus_per_node: 8
        name: second
    """)
    d = refused(path, "RLC-E002")
    assert "line 2" in (d["hint"] or ""), d["hint"]


def test_duplicate_nested_key_hint_names_the_first_occurrence(spec_file):
    path = spec_file("""
        version: 1
        cluster:
          accelerator: H100
          gpus_per_node: 8
          num_nodes: 1
          gpus_per_node: 4
    """)
    d = refused(path, "RLC-E002")
    assert "line 4" in (d["hint"] or ""), d["hint"]


def test_duplicate_key_inside_list_item_mapping(spec_file):
    path = spec_file("""
        version: 1
        items:
          - a: 1
            b: 2
            a: 3
    """)
    d = refused(path, "RLC-E002")
    assert d["line"] == 5


def test_duplicate_key_in_flow_mapping(spec_file):
    path = spec_file("""
        version: 1
        cluster: {num_nodes: 1, num_nodes: 2}
    """)
    d = refused(path, "RLC-E002")
    assert d["line"] == 2


# --------------------------------------------------------------------------- RLC-E003 unknown tags


def test_python_object_tag_is_refused_and_never_executed(tmp_path, spec_file):
    marker = tmp_path / "PWNED"
    path = spec_file(f"""
        version: 1
        name: ok
        trainer:
          run_name: !!python/object/apply:os.system ["touch {marker}"]
    """)
    d = refused(path, "RLC-E003")
    assert d["line"] == 4
    assert d["column"] == 13
    assert "python/object/apply:os.system" in d["message"]
    assert not marker.exists(), "a YAML tag ran a command"


def test_python_object_new_tag_on_mapping_is_refused(spec_file):
    path = spec_file("""
        version: 1
        cluster: !!python/object/new:os.system {}
    """)
    d = refused(path, "RLC-E003")
    assert d["line"] == 2


@pytest.mark.parametrize(
    "text, line",
    [
        ("version: 1\nname: !custom foo\n", 2),
        ("version: 1\ncluster: !custom\n  num_nodes: 1\n", 2),
        ("version: 1\nlaunch:\n  secrets: [A, !custom B]\n", 3),
        ("version: 1\nlaunch:\n  setup:\n    - echo hi\n    - !custom echo there\n", 5),
        ("version: 1\nname: !<tag:example.com,2000:app/foo> x\n", 2),
    ],
    ids=["scalar", "mapping", "flow-list-item", "block-list-item", "verbatim"],
)
def test_custom_tag_is_refused_at_its_line(spec_file, text, line):
    d = refused(spec_file(text), "RLC-E003")
    assert d["line"] == line
    assert "tag" in d["message"]


def test_tag_on_the_whole_document_is_refused(spec_file):
    refused(spec_file("--- !custom\nversion: 1\nname: x\n"), "RLC-E003")


def test_tag_on_a_key_is_refused_as_a_tag(spec_file):
    d = refused(spec_file("version: 1\n!custom name: x\n"), "RLC-E003")
    assert d["line"] == 2
    assert "TaggedScalar" not in d["message"]


def test_reused_anchor_prints_no_python_warning(spec_file):
    path = spec_file("version: 1\nname: &a x\ntrainer: &a {epochs: 1}\n")
    proc = run_rlc("validate", str(path))
    assert_no_crash(proc)
    assert "Warning:" not in proc.stderr and "composer.py" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- RLC-E004 alias bombs and nesting


def billion_laughs(levels: int = 10, width: int = 9) -> str:
    lines = ["version: 1", "a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_quickly(spec_file):
    path = spec_file(billion_laughs())
    start = time.monotonic()
    d = refused(path, "RLC-E004")
    elapsed = time.monotonic() - start
    assert elapsed < 3.0, f"the alias bomb took {elapsed:.1f}s"
    assert "alias" in d["message"] or "nodes" in d["message"]


def test_alias_bomb_of_mappings_is_refused_quickly(spec_file):
    lines = ["version: 1", "m0: &m0 {" + ", ".join(f"k{j}: lol" for j in range(9)) + "}"]
    for i in range(1, 9):
        lines.append(f"m{i}: &m{i} {{" + ", ".join(f"k{j}: *m{i - 1}" for j in range(9)) + "}")
    start = time.monotonic()
    refused(spec_file("\n".join(lines) + "\n"), "RLC-E004")
    assert time.monotonic() - start < 3.0


def test_modest_aliases_are_fine(spec_file):
    # a few aliases that expand to little are plain YAML, not an attack
    path = spec_file("""
        version: 1
        name: aliases
        data:
          train_data: &files ["a.parquet", "b.parquet"]
          val_data: *files
    """)
    proc, payload = validate_json(path)
    assert not any(d["code"] == "RLC-E004" for d in payload["diagnostics"])


@pytest.mark.parametrize("depth", [300, 400])
def test_deep_nesting_is_refused(spec_file, depth):
    # deeper than the 200 levels the loader allows
    path = spec_file("version: 1\nname: " + "[" * depth + "]" * depth + "\n")
    d = refused(path, "RLC-E004")
    assert "deep" in d["message"]


@pytest.mark.parametrize(
    "body",
    [
        "data: " + "[" * 3000 + "]" * 3000,  # 6 KB that cost ruamel.yaml 6 s of CPU before it was read from the text
        "data: " + "{a: " * 1500 + "1" + "}" * 1500,
        "data:\n" + "".join(" " * i + "k:\n" for i in range(1, 400)),
        "data:\n  " + "- " * 3000 + "x",
    ],
    ids=["brackets", "braces", "indentation", "dashes"],
)
def test_deep_nesting_is_refused_from_the_text_at_its_place(spec_file, body):
    """Refused before the parser runs: the diagnostic points at the line and column where the limit is passed
    (the parser's own refusal, a RecursionError, has no place)."""
    d = refused(spec_file("version: 1\nname: x\n" + body + "\n"), "RLC-E004")
    assert d["line"] >= 3 and d["column"] > 1 and "200 levels" in d["message"]


def test_a_megabyte_of_one_line_values_is_refused_from_the_text(tmp_path):
    path = write_bytes(tmp_path, b"version: 1\nname: x\ndata:\n" + b"  - 1\n" * 170_000)
    d = refused(path, "RLC-E004")
    assert "100000 values" in d["message"]


@settings(
    max_examples=int(os.environ.get("RLC_HYPOTHESIS_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.recursive(
        st.one_of(st.integers(), st.text("ab #'\"[]{}:,-|>\n", max_size=8), st.none()),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text("abk", min_size=1, max_size=3), inner, max_size=3)
        ),
        max_leaves=30,
    ),
    st.sampled_from([None, True, False]),
)
def test_the_text_scan_refuses_no_document_within_the_limits(value, flow):
    """Whatever YAML writes (quotes, block scalars, comments' characters in strings, either style), the scan passes."""
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.default_flow_style = flow
    stream = io.StringIO()
    yaml.dump({"version": 1, "data": value}, stream)
    prescan(stream.getvalue(), "generated.yaml")


def test_nesting_within_the_limit_is_not_e004(spec_file):
    path = spec_file("version: 1\nname: " + "[" * 150 + "]" * 150 + "\n")
    proc, payload = validate_json(path)
    assert proc.returncode == 1
    assert not any(d["code"] == "RLC-E004" for d in payload["diagnostics"])
    diagnostic(payload, "RLC-E011")  # name should be a string


# --------------------------------------------------------------------------- RLC-E005 oversize files


def test_file_over_one_mib_is_refused(tmp_path):
    path = write_bytes(tmp_path, b"version: 1\n# " + b"x" * MAX_BYTES + b"\n")
    d = refused(path, "RLC-E005")
    assert str(MAX_BYTES) in d["message"]


def test_file_of_exactly_one_mib_is_read(tmp_path):
    # many short comment lines: ruamel.yaml's round-trip scanner is quadratic in the length of one
    # comment line (a single 1 MiB comment line takes ~30 s), so the padding is spread over lines
    head = b"version: 1\nname: big-comment\n"
    line = b"# " + b"x" * 77 + b"\n"
    body = line * ((MAX_BYTES - len(head)) // len(line))
    rest = MAX_BYTES - len(head) - len(body)
    path = write_bytes(tmp_path, head + body + (b"#" + b"y" * (rest - 2) + b"\n" if rest >= 2 else b"\n" * rest))
    assert path.stat().st_size == MAX_BYTES
    proc, payload = validate_json(path)
    assert not any(d["code"] == "RLC-E005" for d in payload["diagnostics"])


def test_one_byte_over_the_limit_is_refused(tmp_path):
    head = b"version: 1\n# "
    path = write_bytes(tmp_path, head + b"x" * (MAX_BYTES - len(head)) + b"\n")
    assert path.stat().st_size == MAX_BYTES + 1
    refused(path, "RLC-E005")


# --------------------------------------------------------------------------- RLC-E006 not UTF-8


def test_latin1_byte_is_refused_at_its_line_and_column(tmp_path):
    path = write_bytes(tmp_path, b"version: 1\nname: ok\ntrainer:\n  run_name: caf\xe9\n")
    d = refused(path, "RLC-E006")
    assert d["line"] == 4
    assert d["column"] == len("  run_name: caf") + 1
    assert "0xe9" in d["message"]


def test_invalid_byte_on_first_line(tmp_path):
    d = refused(write_bytes(tmp_path, b"\xff\xfeversion: 1\n"), "RLC-E006")
    assert d["line"] == 1 and d["column"] == 1


def test_utf16_file_is_refused(tmp_path):
    refused(write_bytes(tmp_path, "version: 1\nname: x\n".encode("utf-16")), "RLC-E006")


def test_nul_byte_is_refused_at_its_line(tmp_path):
    d = refused(write_bytes(tmp_path, b"version: 1\nname: ok\ncluster:\n  infra: a\x00ws\n"), "RLC-E006")
    assert d["line"] == 4


def test_utf8_bom_is_accepted(tmp_path):
    text = (EXAMPLES / "gsm8k-grpo-8xh100.yaml").read_text(encoding="utf-8")
    path = write_bytes(tmp_path, b"\xef\xbb\xbf" + text.encode("utf-8"))
    proc, payload = validate_json(path)
    assert proc.returncode == 0, payload
    assert payload["ok"] is True


# --------------------------------------------------------------------------- RLC-E007 top level not a mapping


@pytest.mark.parametrize(
    "text, word",
    [
        ("- version: 1\n- name: x\n", "list"),
        ("just a string\n", "str"),
        ("42\n", "int"),
        ("[1, 2, 3]\n", "list"),
    ],
    ids=["block-list", "string", "int", "flow-list"],
)
def test_top_level_that_is_not_a_mapping(spec_file, text, word):
    d = refused(spec_file(text), "RLC-E007")
    assert d["line"] == 1
    assert word in d["message"]


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "# only a comment\n", "---\n", "~\n", "null\n"],
    ids=["empty", "blank-lines", "comment", "doc-marker", "tilde", "null"],
)
def test_empty_spec(spec_file, text):
    path = spec_file("x")
    path.write_text(text, encoding="utf-8")
    d = refused(path, "RLC-E007")
    assert "empty" in d["message"]


# --------------------------------------------------------------------------- RLC-E001 syntax errors


def test_unclosed_flow_list_points_at_the_line(spec_file):
    path = spec_file("""
        version: 1
        name: syntax
        cluster:
          gpus: [1, 2
          num_nodes: 1
    """)
    d = refused(path, "RLC-E001")
    assert d["line"] == 5


def test_bad_indentation(spec_file):
    path = spec_file("version: 1\ncluster:\n    num_nodes: 1\n  gpus_per_node: 8\n")
    d = refused(path, "RLC-E001")
    assert d["line"] == 4


def test_tab_indentation(spec_file):
    path = spec_file("version: 1\ncluster:\n\tnum_nodes: 1\n")
    d = refused(path, "RLC-E001")
    assert d["line"] == 3


def test_unterminated_quote(spec_file):
    d = refused(spec_file('version: 1\nname: "unterminated\n'), "RLC-E001")
    assert d["line"] >= 2


def test_undefined_alias(spec_file):
    d = refused(spec_file("version: 1\nname: *nowhere\n"), "RLC-E001")
    assert d["line"] == 2


def test_two_documents_in_one_file(spec_file):
    d = refused(spec_file("version: 1\n---\nversion: 1\n"), "RLC-E001")
    assert d["line"] == 2


@pytest.mark.parametrize(
    "text",
    ["version: 1\n[[a]]: x\n", "version: 1\n? [{a: 1}]\n: x\n", "? {a: [1]}\n: x\n"],
    ids=["list-in-list-key", "map-in-list-key", "list-in-map-key"],
)
def test_nested_collection_as_a_key(spec_file, text):
    # ruamel.yaml raises TypeError (unhashable) for these; that used to escape as an internal error
    refused(spec_file(text), "RLC-E001")


@pytest.mark.parametrize(
    "value",
    [
        "2020-02-30",
        "2020-13-01",
        "!!int",
        "!!int abc",
        "!!int 0x",
        "!!float x",
        "!!bool maybe",
        "!!set x",
        "!!omap x",
        "!!timestamp 2020-99-99",
    ],
)
def test_scalars_ruamel_cannot_construct(spec_file, value):
    # ruamel.yaml raises ValueError/IndexError/KeyError/AttributeError (not YAMLError) for these; they used to
    # escape as `rlc: internal error` (exit 3)
    d = refused(spec_file(f"version: 1\nname: ok\ntrainer:\n  run_name: {value}\n"), "RLC-E001")
    assert d["message"]


# --------------------------------------------------------------------------- paths that are not spec files


def test_path_that_does_not_exist(tmp_path):
    path = tmp_path / "missing.yaml"
    proc = run_rlc("validate", "--format", "json", str(path))
    assert_no_crash(proc)
    assert proc.returncode == 1
    d = diagnostic(json.loads(proc.stdout), "RLC-E008")
    assert d["file"] == str(path)


def test_path_that_does_not_exist_text(tmp_path):
    proc = run_rlc("validate", str(tmp_path / "missing.yaml"))
    assert_no_crash(proc)
    assert proc.returncode == 1
    assert "error[RLC-E008]" in proc.stderr


def test_path_that_is_a_directory(tmp_path):
    # click.Path(dir_okay=False) refuses it before rlc reads anything: a usage error
    proc = run_rlc("validate", "--format", "json", str(tmp_path))
    assert_no_crash(proc)
    assert proc.returncode == 2
    assert "directory" in proc.stderr


def test_unreadable_special_file():
    # a character device is neither a directory nor a regular file
    if not Path("/dev/null").exists():
        pytest.skip("no /dev/null")
    proc = run_rlc("validate", "--format", "json", "/dev/null")
    assert_no_crash(proc)
    assert proc.returncode in (1, 2)
    if proc.returncode == 1:
        diagnostic(json.loads(proc.stdout), "RLC-E008")


# --------------------------------------------------------------------------- text output carries the code and the place


def test_text_output_names_code_and_place(spec_file):
    path = spec_file("version: 1\nname: a\nname: b\n")
    proc = run_rlc("validate", str(path))
    assert_no_crash(proc)
    assert proc.returncode == 1
    assert "error[RLC-E002]" in proc.stderr
    assert f"{path}:3:1" in proc.stderr
    assert proc.stdout == ""


# --------------------------------------------------------------------------- in-process: LoadError carries the diagnostic


@pytest.mark.parametrize(
    "text, code",
    [
        ("a: [1\n", "RLC-E001"),
        ("a: 1\na: 2\n", "RLC-E002"),
        ("a: !x 1\n", "RLC-E003"),
        ("- 1\n", "RLC-E007"),
        ("", "RLC-E007"),
    ],
)
def test_document_from_text_raises_load_error(text, code):
    with pytest.raises(LoadError) as info:
        document_from_text(text, "mem.yaml")
    assert info.value.diagnostic.code == code
    assert info.value.diagnostic.location.file == "mem.yaml"


# --------------------------------------------------------------------------- Document.locate


LOCATE_TEXT = """\
version: 1
trainer:
  policy:
    model:
      path: Qwen/x
  epochs: 3
launch:
  secrets: [A, B]
  setup:
    - echo hi
    - echo there
data:
  train_data:
    - a.parquet
    - b.parquet
"""


@pytest.fixture(scope="module")
def doc():
    return document_from_text(LOCATE_TEXT, "s.yaml")


@pytest.mark.parametrize(
    "path, key, line, col",
    [
        (("version",), True, 1, 1),
        (("version",), False, 1, 10),
        (("trainer", "policy", "model", "path"), True, 5, 7),
        (("trainer", "policy", "model", "path"), False, 5, 13),
        (("trainer", "epochs"), True, 6, 3),
        (("trainer", "epochs"), False, 6, 11),
        (("launch", "secrets", 0), False, 8, 13),
        (("launch", "secrets", 1), False, 8, 16),
        (("launch", "setup", 0), False, 10, 7),
        (("launch", "setup", 1), False, 11, 7),
        (("data", "train_data", 1), False, 15, 7),
    ],
)
def test_locate_nested_keys_and_list_items(doc, path, key, line, col):
    loc = doc.locate(path, key=key)
    assert (loc.file, loc.line, loc.col) == ("s.yaml", line, col)
    assert loc.text == LOCATE_TEXT.splitlines()[line - 1]


def test_locate_absent_key_falls_back_to_written_ancestor(doc):
    # trainer.missing is not written: point inside the trainer section, not at 0 and not elsewhere
    loc = doc.locate(("trainer", "missing", "deeper"))
    assert loc.line in (2, 3)
    # launch.secrets[5] does not exist: the list itself
    loc = doc.locate(("launch", "secrets", 5))
    assert loc.line == 8
    # a child of a scalar: the scalar
    loc = doc.locate(("trainer", "epochs", "x"))
    assert (loc.line, loc.col) == (6, 11)


def test_locate_empty_value_points_at_its_key():
    # `name:` with nothing after it: ruamel places the (absent) value at the next token, i.e. the next line
    d = document_from_text("version: 1\nname:\ncluster:\n  num_nodes:\n  gpus_per_node: 8\n", "n.yaml")
    assert (d.locate(("name",)).line, d.locate(("name",)).col) == (2, 1)
    assert (d.locate(("cluster", "num_nodes")).line, d.locate(("cluster", "num_nodes")).col) == (4, 3)
    # an explicit null is on its own line either way
    d = document_from_text("version: 1\nname: null\ncluster: ~\n", "n.yaml")
    assert d.locate(("name",)).line == 2
    assert d.locate(("cluster", "num_nodes")).line == 3


def test_empty_value_is_reported_on_its_own_line(spec_file):
    proc, payload = validate_json(spec_file("version: 1\nname:\ncluster:\n  accelerator: H100\n"))
    assert proc.returncode == 1
    d = [d for d in payload["diagnostics"] if d["key"] == "name"][0]
    assert (d["code"], d["line"]) == ("RLC-E011", 2)


def test_locate_unwritten_top_level_is_unknown(doc):
    loc = doc.locate(("cluster", "num_nodes"))
    assert (loc.file, loc.line, loc.col) == ("s.yaml", 0, 0)
    assert doc.locate(()).line == 0


def test_locate_prefers_overrides(doc):
    d = document_from_text(LOCATE_TEXT, "s.yaml")
    d.overrides[("trainer", "epochs")] = "trainer.epochs=4"
    loc = d.locate(("trainer", "epochs"))
    assert (loc.file, loc.line, loc.text) == ("<command line>", 0, "trainer.epochs=4")
    # anything below an overridden key is reported at the override too
    assert d.locate(("trainer", "epochs", "x")).text == "trainer.epochs=4"
    # siblings still point into the file
    assert d.locate(("trainer", "policy", "model", "path")).line == 5


def test_locate_in_flow_style_and_after_comments():
    text = "# header\n\nversion: 1  # v\ncluster: {num_nodes: 2, gpus_per_node: 8}\n"
    d = document_from_text(text, "f.yaml")
    assert (d.locate(("version",)).line, d.locate(("version",)).col) == (3, 10)
    loc = d.locate(("cluster", "gpus_per_node"))
    assert (loc.line, loc.col) == (4, 40)
    loc = d.locate(("cluster", "gpus_per_node"), key=True)
    assert (loc.line, loc.col) == (4, 25)


def test_locate_with_crlf_line_ends():
    d = document_from_text("version: 1\r\ncluster:\r\n  num_nodes: 2\r\n", "w.yaml")
    loc = d.locate(("cluster", "num_nodes"))
    assert (loc.line, loc.col) == (3, 14)
    assert loc.text == "  num_nodes: 2"


def test_a_giant_line_is_refused_quickly(tmp_path):
    path = tmp_path / "long.yaml"
    path.write_text("version: 1\n# " + "x" * 500_000 + "\n")
    start = time.monotonic()
    proc = run_rlc("validate", str(path), "--format", "json")
    assert time.monotonic() - start < 10
    d = json.loads(proc.stdout)["diagnostics"][0]
    assert proc.returncode == 1 and d["code"] == "RLC-E005" and d["line"] == 2


def test_plan_with_an_override_below_a_scalar_is_a_usage_error(tmp_path):
    proc = run_rlc("plan", str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"), "name.x=1", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr

"""`rlc lsp` driven over the protocol as an editor drives it (pytest-lsp starts the installed command): findings on
open and change equal to `rlc validate`'s, hover, completion, code actions, bad input, shutdown. One server serves
the whole module."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import pytest_lsp
from conftest import EXAMPLES, ROOT, rlc_executable, run_rlc
from lsprotocol import types as lsp
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities
from rlc.compiler.pipeline import compile_job

pytestmark = pytest.mark.asyncio(loop_scope="module")

TWO_NODE = EXAMPLES / "gsm8k-grpo-2node.yaml"
# The two edits that break the 2-node example (bench/validate_bench.py makes the same): a batch size that does not
# divide, a misspelt key.
BREAKAGES = [
    ("policy_mini_batch_size: 256", "policy_mini_batch_size: 300"),
    ("micro_forward_batch_size_per_gpu:", "micro_forward_batch_size_per_gpus:"),
]


def broken(text: str) -> str:
    for old, new in BREAKAGES:
        text = text.replace(old, new)
    return text


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[rlc_executable(), "lsp"], server_env={"NO_COLOR": "1"}),
    scope="module",
    loop_scope="module",
)
async def client(lsp_client: LanguageClient):
    _record_published_versions(lsp_client)
    await lsp_client.initialize_session(
        lsp.InitializeParams(capabilities=client_capabilities("visual-studio-code"), root_uri=ROOT.as_uri())
    )
    yield
    await lsp_client.shutdown_session()


_versions: dict[str, int] = {}  # uri -> the version of the text last sent
_published: dict[str, int | None] = {}  # uri -> the version whose findings the server published last


def _record_published_versions(client: LanguageClient) -> None:
    """Note the document version of every publishDiagnostics (pytest-lsp keeps only the findings): after a burst of
    changes the server may publish an earlier version's findings before the last one's, and a test waits for the
    version it sent."""
    handle = client.protocol._handle_notification

    def recording(method: str, params) -> None:
        if method == lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS:
            _published[params.uri] = params.version
        handle(method, params)

    client.protocol._handle_notification = recording  # type: ignore[method-assign]


async def publish(client: LanguageClient, path: Path, text: str) -> list[lsp.Diagnostic]:
    """Open (or change) the document at `path` to `text` and wait for the findings of that version."""
    uri = path.as_uri()
    client.diagnostics.pop(uri, None)
    if uri in _versions:
        _versions[uri] += 1
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                lsp.VersionedTextDocumentIdentifier(_versions[uri], uri),
                [lsp.TextDocumentContentChangeWholeDocument(text)],
            )
        )
    else:
        _versions[uri] = 1
        client.text_document_did_open(lsp.DidOpenTextDocumentParams(lsp.TextDocumentItem(uri, "yaml", 1, text)))
    while True:
        # the waiter is registered before the check, so a publication between the two is not missed
        waiter = client.protocol.wait_for_notification(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        if uri in client.diagnostics and _published.get(uri) == _versions[uri]:
            return list(client.diagnostics[uri])
        await asyncio.wait_for(asyncio.wrap_future(waiter), 60)


def validate_findings(path: Path) -> list[tuple]:
    """What `rlc validate PATH` reports (its pipeline, in this process): code, severity, message, line, column."""
    out = []
    for d in compile_job(path).diagnostics:
        loc = d.location
        if loc is not None and loc.file != str(path) and loc.line > 0:
            continue  # a finding in another file (none of these specs have one)
        line, col = (loc.line, loc.col) if loc is not None and loc.line > 0 else (0, 0)
        message = d.message + (f"\nkey: {d.key}" if d.key else "")
        out.append((d.code, d.severity, message, line, col, d.hint))
    return out


def shown(diags: list[lsp.Diagnostic]) -> list[tuple]:
    severity = {lsp.DiagnosticSeverity.Error: "error", lsp.DiagnosticSeverity.Warning: "warning"}
    out = []
    for d in diags:
        hint = d.related_information[0].message.removeprefix("help: ") if d.related_information else None
        place = (d.range.start.line + 1, d.range.start.character + 1)
        whole_file = d.data and d.data.get("whole_file")
        out.append((d.code, severity.get(d.severity, "info"), d.message, *((0, 0) if whole_file else place), hint))
    return out


def corpus(tmp_path_factory) -> list[Path]:
    """Every example, SkyRL's released legacy base configs, and broken copies of the examples."""
    history = ROOT / "tests/fixtures/skyrl-history"
    out = sorted(EXAMPLES.glob("*.yaml")) + [history / "skyrl-train_0.3.1.yaml", history / "skyrl-train_0.2.0.yaml"]
    tmp = tmp_path_factory.mktemp("broken")
    for example in sorted(EXAMPLES.glob("*.yaml")):
        text = example.read_text(encoding="utf-8")
        for n, (old, new) in enumerate(
            [
                *BREAKAGES,
                ("\n", "\n  : bad: [\n"),  # invalid YAML
                ("trainer:", "trainer:\n  strategy: fsdp3\n  strategy: fsdp2"),  # duplicate key
                ("trainer:", "trainer:\n  epochs: !!python/object 1"),  # a tag
            ]
        ):
            if old in text:
                path = tmp / f"{example.stem}-broken{n}.yaml"
                path.write_text(text.replace(old, new, 1), encoding="utf-8")
                out.append(path)
    return out


async def test_the_editor_shows_what_rlc_validate_reports_for_every_example_and_broken_spec(
    client: LanguageClient, tmp_path_factory
):
    files = corpus(tmp_path_factory)
    assert len(files) > 20
    for path in files:
        got = shown(await publish(client, path, path.read_text(encoding="utf-8")))
        assert got == validate_findings(path), path


async def test_findings_follow_each_change_with_the_fix_as_related_information(client: LanguageClient, tmp_path):
    path = tmp_path / "job.yaml"
    text = TWO_NODE.read_text(encoding="utf-8")
    first = await publish(client, path, broken(text))
    assert sorted(str(d.code) for d in first) == ["RLC-E010", "RLC-E105", "RLC-E106", "RLC-E107"]
    e105 = next(d for d in first if d.code == "RLC-E105")
    line = broken(text).splitlines()[e105.range.start.line]
    assert line[e105.range.start.character : e105.range.end.character] == "300"
    assert e105.related_information[0].message == "help: use a divisor of 1024, e.g. 256"
    assert e105.severity == lsp.DiagnosticSeverity.Error
    assert await publish(client, path, text) == []


async def test_the_findings_are_rlc_validates_own(client: LanguageClient, tmp_path):
    path = tmp_path / "validate.yaml"
    path.write_text(broken(TWO_NODE.read_text(encoding="utf-8")), encoding="utf-8")
    got = shown(await publish(client, path, path.read_text(encoding="utf-8")))
    report = json.loads(run_rlc("validate", "--format", "json", str(path)).stdout)
    expected = [
        (d["code"], d["severity"], d["message"] + f"\nkey: {d['key']}", d["line"], d["column"], d["hint"])
        for d in report["diagnostics"]
    ]
    assert got == expected


async def test_a_burst_of_changes_ends_with_the_findings_of_the_last_text(client: LanguageClient, tmp_path):
    path = tmp_path / "burst.yaml"
    text = TWO_NODE.read_text(encoding="utf-8")
    await publish(client, path, text)
    uri = path.as_uri()
    for size in range(250, 301):  # 51 changes sent at once, as fast typing does; only the last is 300
        _versions[uri] += 1
        client.text_document_did_change(
            lsp.DidChangeTextDocumentParams(
                lsp.VersionedTextDocumentIdentifier(_versions[uri], uri),
                [
                    lsp.TextDocumentContentChangeWholeDocument(
                        text.replace("mini_batch_size: 256", f"mini_batch_size: {size}")
                    )
                ],
            )
        )
    got = await publish(client, path, broken(text).replace("_per_gpus:", "_per_gpu:"))
    assert [d.code for d in got if d.code == "RLC-E105"] == ["RLC-E105"]
    assert "(300)" in next(d.message for d in got if d.code == "RLC-E105")


async def hover_text(client: LanguageClient, path: Path, line: int, col: int = 4) -> str:
    found = await client.text_document_hover_async(
        lsp.HoverParams(lsp.TextDocumentIdentifier(path.as_uri()), lsp.Position(line, col))
    )
    assert found is not None
    assert isinstance(found.contents, lsp.MarkupContent)
    return found.contents.value


async def test_hover_says_what_rlc_explain_says_and_the_values_derived_under_a_section(
    client: LanguageClient, tmp_path
):
    path = tmp_path / "hover.yaml"
    text = TWO_NODE.read_text(encoding="utf-8")
    await publish(client, path, text)
    lines = text.splitlines()
    tp = await hover_text(client, path, lines.index("    tensor_parallel_size: 2"))
    assert "generator.inference_engine.tensor_parallel_size" in tp and "type: int" in tp
    assert "**generator.inference_engine.tensor_parallel_size** = `2`: spec" in tp
    engine = await hover_text(client, path, lines.index("  inference_engine:"))
    assert "**generator.inference_engine.num_engines** = `8`: derived from" in engine


async def test_a_code_lens_above_cluster_gives_rlc_plans_gpu_memory_verdict(client: LanguageClient, tmp_path):
    path = tmp_path / "lens.yaml"
    text = TWO_NODE.read_text(encoding="utf-8")
    await publish(client, path, text)
    lenses = await client.text_document_code_lens_async(lsp.CodeLensParams(lsp.TextDocumentIdentifier(path.as_uri())))
    assert [lens.range.start.line for lens in lenses] == [text.splitlines().index("cluster:")]
    plan = run_rlc("plan", str(TWO_NODE), "--svg", str(tmp_path / "plan.svg")).stdout
    peak, capacity, fill, phase = re.findall(r": ([\d.]+) / ([\d.]+) GiB \((\d+)%, fits\) at (\S+):", plan)[0]
    expected = f"GPU memory: peak {peak} / {capacity} GiB ({fill}%) at {phase}; every GPU of 16 fits"
    assert lenses[0].command.title.startswith(expected)


async def test_completion_offers_the_unwritten_keys_of_a_section_and_the_values_of_an_enumerated_key(
    client: LanguageClient, tmp_path
):
    path = tmp_path / "complete.yaml"
    text = TWO_NODE.read_text(encoding="utf-8").replace("  strategy: fsdp2\n", "  strategy: \n  \n")
    await publish(client, path, text)
    lines = text.splitlines()
    doc = lsp.TextDocumentIdentifier(path.as_uri())

    keys = await client.text_document_completion_async(
        lsp.CompletionParams(doc, lsp.Position(lines.index("  strategy: ") + 1, 2))
    )
    labels = {item.label for item in keys.items}
    assert {"critic", "ref", "placement", "eval_interval"} <= labels
    assert "policy" not in labels and "epochs" not in labels  # written already
    values = await client.text_document_completion_async(
        lsp.CompletionParams(doc, lsp.Position(lines.index("  strategy: "), 12))
    )
    assert {"fsdp2", "megatron"} <= {item.label for item in values.items}
    assert all(item.documentation for item in values.items)


async def test_code_actions_rename_a_misspelt_key_and_set_the_divisor_a_rule_proposes(client: LanguageClient, tmp_path):
    path = tmp_path / "fix.yaml"
    text = broken(TWO_NODE.read_text(encoding="utf-8"))
    await publish(client, path, text)
    lines = text.splitlines()
    doc = lsp.TextDocumentIdentifier(path.as_uri())

    async def fixes(line: int) -> dict[str, lsp.TextEdit]:
        where = lsp.Range(lsp.Position(line, 0), lsp.Position(line, 0))
        found = await client.text_document_code_action_async(
            lsp.CodeActionParams(doc, where, lsp.CodeActionContext(diagnostics=[]))
        )
        return {a.title: a.edit.changes[doc.uri][0] for a in found or [] if isinstance(a, lsp.CodeAction)}

    rename = await fixes(lines.index("  micro_forward_batch_size_per_gpus: 32"))
    edit = rename["rename micro_forward_batch_size_per_gpus to micro_forward_batch_size_per_gpu"]
    assert (edit.range.start.character, edit.range.end.character) == (2, 2 + len("micro_forward_batch_size_per_gpus"))
    divisor = await fixes(lines.index("  policy_mini_batch_size: 300"))
    edit = divisor["set trainer.policy_mini_batch_size to 256"]
    assert edit.new_text == "256" and edit.range.start.character == len("  policy_mini_batch_size: ")
    fixed = text.replace("300", "256").replace("_per_gpus:", "_per_gpu:")
    assert await publish(client, path, fixed) == []


async def test_a_legacy_file_gets_its_migration_as_a_code_action(client: LanguageClient, tmp_path):
    path = tmp_path / "legacy.yaml"
    text = (EXAMPLES / "legacy-skyrl.yaml").read_text(encoding="utf-8")
    found = await publish(client, path, text)
    assert [d.code for d in found][:1] == ["RLC-W010"]
    doc = lsp.TextDocumentIdentifier(path.as_uri())
    actions = await client.text_document_code_action_async(
        lsp.CodeActionParams(doc, lsp.Range(lsp.Position(0, 0), lsp.Position(0, 0)), lsp.CodeActionContext([]))
    )
    migrate = next(a for a in actions if a.title.startswith("migrate this file to spec v1"))
    new_text = migrate.edit.changes[doc.uri][0].new_text
    assert new_text.startswith("version: 1") or "\nversion: 1\n" in new_text
    assert await publish(client, path, new_text) == []


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("version: 1\ntrainer:\n  polic", "RLC-E011"),  # half-typed: a key without its colon
        ("version: 1\ntrainer: [\n", "RLC-E001"),
        ("version: 1\nname: " + "x" * 10_500_000 + "\n", "RLC-E005"),  # a 10 MB file
        ("\x00\x01\x02\xff binary", "RLC-E006"),
        ("", "RLC-E007"),
    ],
    ids=["half-typed", "invalid-yaml", "10MB", "binary", "empty"],
)
async def test_bad_input_gets_a_finding_and_the_server_keeps_serving(
    client: LanguageClient, tmp_path, text: str, code: str
):
    path = tmp_path / "bad.yaml"
    found = await publish(client, path, text)
    assert code in [d.code for d in found]
    assert await publish(client, path, TWO_NODE.read_text(encoding="utf-8")) == []


async def test_a_yaml_file_that_is_no_spec_gets_no_findings(client: LanguageClient, tmp_path):
    path = tmp_path / "workflow.yaml"
    assert await publish(client, path, "on: push\njobs:\n  test:\n    runs-on: ubuntu-latest\n") == []
    compose = tmp_path / "compose.yaml"
    assert await publish(client, compose, "name: web\nservices:\n  app:\n    image: nginx\n") == []


async def test_an_areal_config_shows_what_its_import_reports_and_the_findings_of_the_spec_it_becomes(
    client: LanguageClient, tmp_path
):
    path = tmp_path / "areal.yaml"
    source = ROOT / "tests/fixtures/areal/gsm8k_grpo.yaml"
    text = source.read_text(encoding="utf-8").replace("n_gpus_per_node: 8", "n_gpus_per_node: 6")
    found = await publish(client, path, text)
    assert found[0].code == "RLC-W010" and "is an AReaL config, not spec v1" in found[0].message
    assert "rlc migrate --from areal" in found[0].related_information[0].message
    as_v1 = [d for d in found if d.message.startswith("as spec v1: ")]
    # its 4 + 4 GPUs do not fit a node of 6: the import sizes the cluster for AReaL's allocation (2 nodes of 6),
    # which leaves 4 GPUs unused
    assert [d.code for d in as_v1] == ["RLC-W202"]
    assert as_v1[0].range.start.line == 0
    path.write_text(text, encoding="utf-8")
    report = run_rlc("migrate", "--from", "areal", str(path), "-o", str(tmp_path / "spec.yaml")).stderr
    imports = [d for d in found if d.message.startswith("import: ")]
    assert imports  # the changes that alter what runs or warn, at their lines
    for d in imports:
        assert d.message.split("\nkey:")[0].removeprefix("import: ") in report
        assert f"(line {d.range.start.line + 1})" in d.message


async def test_hover_and_completion_answer_while_a_long_compile_runs(client: LanguageClient, tmp_path):
    small = tmp_path / "small.yaml"
    text = TWO_NODE.read_text(encoding="utf-8")
    await publish(client, small, text)
    big = tmp_path / "big.yaml"
    env = "".join(f"    RLC_VAR_{i}: value{i}\n" for i in range(6_000))  # a 6,000-line spec: a second to compile
    client.diagnostics.pop(big.as_uri(), None)
    client.text_document_did_open(
        lsp.DidOpenTextDocumentParams(
            lsp.TextDocumentItem(big.as_uri(), "yaml", 1, text.replace("  envs:\n", "  envs:\n" + env))
        )
    )
    line = text.splitlines().index("  train_batch_size: 1024")
    assert "trainer.train_batch_size" in await hover_text(client, small, line)
    keys = await client.text_document_completion_async(
        lsp.CompletionParams(lsp.TextDocumentIdentifier(small.as_uri()), lsp.Position(line, 2))
    )
    assert keys.items
    assert big.as_uri() not in client.diagnostics  # both answered before the long compile ended
    _versions[big.as_uri()] = 1
    assert await publish(client, big, text) == []

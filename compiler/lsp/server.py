"""`rlc lsp`: the language server (pygls over stdio). The compiler stays loaded; each open spec is compiled in one
worker thread, newest text first: a result computed for a text the user has since changed is dropped and the new
text compiled, and requests (hover, completion, code actions) answer from the last result without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import field
from importlib.metadata import PackageNotFoundError, version

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange
from rlc.compiler.check import INTERNAL_ERROR
from rlc.compiler.lsp import features
from rlc.compiler.pipeline import CompileResult, compile_text
from rlc.core.dataclass import dataclass
from rlc.core.diagnostics import ERROR, Diagnostic
from rlc.spec.model import default_model

log = logging.getLogger(__name__)

# Top-level keys of an rlc spec or a legacy SkyRL config (`cluster` and `name` are other frameworks' keys too).
SECTIONS = {"version", "launch", "data", "trainer", "generator", "environment"}
SHARED = {"cluster", "name"}
_TOP_KEY = re.compile(r"^([A-Za-z_][\w\-]*)[ ]*:", re.MULTILINE)


def findings_of(text: str, name: str) -> CompileResult | list[Diagnostic] | None:
    """What the editor shows for a document: the pipeline's result for a spec, a legacy SkyRL config or a file that is
    no YAML mapping at all (its load error is the finding); the import's findings for another framework's config
    rlc imports; None for any other YAML (a CI workflow, a compose file, a chart)."""
    keys = set(_TOP_KEY.findall(text[:200_000]))
    if not keys or keys & SECTIONS:
        return compile_text(text, name)
    imported = features.imported_findings(text, name)
    if imported is not None:
        return imported
    return compile_text(text, name) if keys <= SECTIONS | SHARED else None  # a spec begun with its cluster


@dataclass
class Compiled:
    """The last result of a document and the text (version) it was computed from."""

    version: int | None
    lines: list[str]
    result: CompileResult | None
    findings: list[Diagnostic] = field(default_factory=list)


class RlcServer(LanguageServer):
    def __init__(self) -> None:
        try:
            own = version("rlc")
        except PackageNotFoundError:
            own = "0"
        super().__init__("rlc", own)
        self.compiled: dict[str, Compiled] = {}
        self.running: dict[str, asyncio.Task] = {}
        self.dirty: set[str] = set()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlc-compile")

    def changed(self, uri: str) -> None:
        """Compile the document again; while a compile of it runs, the newest text is compiled once it ends."""
        self.dirty.add(uri)
        if uri not in self.running:
            self.running[uri] = asyncio.get_running_loop().create_task(self._compile(uri))

    async def _compile(self, uri: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            while uri in self.dirty:
                self.dirty.discard(uri)
                doc = self.workspace.get_text_document(uri)
                text, seen = doc.source, doc.version
                name = to_fs_path(uri) or uri
                result = await loop.run_in_executor(self.worker, _compile_or_crash, text, name)
                if uri in self.dirty or uri not in self.workspace.text_documents:
                    continue  # stale: the text changed (or closed) while it compiled
                self.publish(uri, seen, text, result)
        finally:
            self.running.pop(uri, None)

    def publish(self, uri: str, seen: int | None, text: str, result: CompileResult | list[Diagnostic] | None) -> None:
        lines = text.splitlines()
        findings = result.diagnostics if isinstance(result, CompileResult) else result or []
        compiled = result if isinstance(result, CompileResult) else None
        self.compiled[uri] = Compiled(seen, lines, compiled, findings)
        codec = self.workspace.get_text_document(uri).position_codec
        shown = [features.to_lsp(d, lines, uri) for d in findings if _in_file(d, uri)]
        for d in shown:  # columns in the units the editor counts (UTF-16 unless it said otherwise)
            d.range = codec.range_to_client_units(lines, _server_range(d.range))
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, shown, seen))


def _server_range(r: lsp.Range) -> ServerTextRange:
    return ServerTextRange(
        ServerTextPosition(r.start.line, r.start.character), ServerTextPosition(r.end.line, r.end.character)
    )


def _in_file(d: Diagnostic, uri: str) -> bool:
    return d.location is None or d.location.file in (to_fs_path(uri), uri) or d.location.line == 0


def _compile_or_crash(text: str, name: str) -> CompileResult | list[Diagnostic] | None:
    """`findings_of` the document, or one finding saying rlc itself failed on it."""
    try:
        return findings_of(text, name)
    except Exception as exc:  # noqa: BLE001 - a bug in rlc shows in the editor, the server keeps serving
        log.exception("compiling %s", name)
        message = f"rlc crashed on this file: {type(exc).__name__}: {exc}"
        return [Diagnostic(INTERNAL_ERROR, ERROR, message, hint="this is a bug in rlc: please report it with the file")]


server = RlcServer()


@server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: RlcServer, params: lsp.DidOpenTextDocumentParams) -> None:
    ls.changed(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: RlcServer, params: lsp.DidChangeTextDocumentParams) -> None:
    ls.changed(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: RlcServer, params: lsp.DidSaveTextDocumentParams) -> None:
    ls.changed(params.text_document.uri)


@server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: RlcServer, params: lsp.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.compiled.pop(uri, None)
    ls.dirty.discard(uri)
    ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri, []))


@server.feature(lsp.TEXT_DOCUMENT_HOVER)
def hover(ls: RlcServer, params: lsp.HoverParams) -> lsp.Hover | None:
    doc = ls.workspace.get_text_document(params.text_document.uri)
    last = ls.compiled.get(params.text_document.uri)
    if last is None:
        return None  # not a document rlc reads (or not compiled yet)
    at = doc.position_from_client_units(params.position)
    text = features.hover([line.rstrip("\r\n") for line in doc.lines], at.line, last.result)
    return lsp.Hover(lsp.MarkupContent(lsp.MarkupKind.Markdown, text)) if text else None


@server.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=[":", " "]))
def completion(ls: RlcServer, params: lsp.CompletionParams) -> lsp.CompletionList | None:
    if params.text_document.uri not in ls.compiled:
        return None
    doc = ls.workspace.get_text_document(params.text_document.uri)
    at = doc.position_from_client_units(params.position)
    lines = [line.rstrip("\r\n") for line in doc.lines]
    return lsp.CompletionList(False, features.completions(lines, at.line, at.character, default_model()))


@server.feature(
    lsp.TEXT_DOCUMENT_CODE_ACTION,
    lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix, lsp.CodeActionKind.RefactorRewrite]),
)
def code_action(ls: RlcServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction] | None:
    uri = params.text_document.uri
    last = ls.compiled.get(uri)
    doc = ls.workspace.get_text_document(uri)
    if last is None or doc.version != last.version:
        return None  # the findings are of an older text: their places may have moved
    out = features.actions(last.lines, uri, params.range, last.findings, last.result)
    if any(d.code == "RLC-W010" for d in last.findings):
        migrate = features.migration_action(doc.source, to_fs_path(uri) or uri, uri, last.lines)
        if migrate is not None:
            out.append(migrate)
    return out


@server.feature(lsp.TEXT_DOCUMENT_CODE_LENS)
def code_lens(ls: RlcServer, params: lsp.CodeLensParams) -> list[lsp.CodeLens] | None:
    last = ls.compiled.get(params.text_document.uri)
    lens = features.fit_lens(last.lines, last.result) if last else None
    return [lens] if lens else None


def serve() -> None:
    """Serve the editor on stdin and stdout until it says exit."""
    default_model()  # load the spec model before the first document arrives
    server.start_io()

"""The architecture's arrows, read from every module's imports (function-level ones included): the spec knows nothing
of the compiler or the runtime, core is the bottom layer, the compiler starts the runtime only from the CLI's
commands that run it, no light part imports a heavy library, and no two modules import each other round a circle.
The driver and placement act on the compiler's decisions and read no spec field themselves. Each source format's
importers (a folder of compiler/importers/) import no other format's modules, and say why an import waits in a
function."""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
from deferred_imports import MARK, deferred_comment, function_imports
from rlc.core.job import LoopSettings

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"core": "rlc.core", "spec": "rlc.spec", "compiler": "rlc.compiler", "runtime": "rlc.runtime"}
# skyrl: a trainer the compiler writes commands for (compiler/trainers/skyrl.py), never imports
HEAVY = ("torch", "ray", "vllm", "transformers", "pandas", "skyrl")
# The CLI commands that start the runtime (lazily, so that `rlc` starts without it).
RUNTIME_COMMANDS = {"run", "plot", "data_write", "data_gsm8k"}
# The runtime's modules that decide nothing: what they act on comes in the job's decisions (compiler/decide.py), the
# sub-configs they hand on in runtime/sections.py.
NO_SPEC_READS = ("runtime/driver.py", "runtime/placement.py")
IMPORTERS = ROOT / "compiler" / "importers"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module, as named (`from a.b import c` is a.b.c when that is a module, else a.b)
    function: str | None  # the function it sits in, None at module level


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, source: str, known: set[str], is_package: bool) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Import):
                found.extend(Import(name, alias.name, function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = name if is_package else name.rsplit(".", 1)[0]
                    for _ in range(child.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    found.append(Import(name, full if full in known else base, function))
            visit(child, inner)

    visit(ast.parse(source), None)
    return found


def all_imports() -> list[Import]:
    mods = modules()
    known = set(mods)
    out = []
    for name, path in mods.items():
        out += imports_of(name, path.read_text(encoding="utf-8"), known, path.name == "__init__.py")
    return out


def within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def module_graph(imports: list[Import]) -> dict[str, set[str]]:
    known = set(modules())
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports:
        target = imp.target
        while target and target not in known:  # `from rlc.spec.model import to_plain` is an arrow to rlc.spec.model
            target = target.rpartition(".")[0]
        if target and target != imp.module:
            graph[imp.module].add(target)
    return graph


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


def test_every_package_folder_is_read(imports):
    names = set(modules())
    assert {"rlc.spec.model", "rlc.core.job", "rlc.compiler.pipeline", "rlc.runtime.driver"} <= names
    assert len(imports) > 500


def test_the_spec_imports_nothing_of_the_compiler_or_the_runtime(imports):
    wrong = [i for i in imports if within(i.module, "rlc.spec") and within(i.target, "rlc.compiler")]
    wrong += [i for i in imports if within(i.module, "rlc.spec") and within(i.target, "rlc.runtime")]
    assert not wrong


def test_core_imports_nothing_of_the_spec_the_compiler_or_the_runtime(imports):
    wrong = [
        i
        for i in imports
        if within(i.module, "rlc.core")
        and any(within(i.target, above) for above in ("rlc.spec", "rlc.compiler", "rlc.runtime"))
    ]
    assert not wrong


def test_the_compiler_starts_the_runtime_only_from_the_commands_that_run_it(imports):
    wrong = [
        i
        for i in imports
        if within(i.module, "rlc.compiler")
        and within(i.target, "rlc.runtime")
        and not (i.module == "rlc.compiler.cli" and i.function in RUNTIME_COMMANDS)
    ]
    assert not wrong
    started = {i.function for i in imports if i.module == "rlc.compiler.cli" and within(i.target, "rlc.runtime")}
    assert started == RUNTIME_COMMANDS  # the exception above is used, and only by these commands


def test_compiler_spec_and_core_import_no_heavy_library(imports):
    light = ("rlc.compiler", "rlc.spec", "rlc.core")
    wrong = [
        i
        for i in imports
        if any(within(i.module, p) for p in light) and any(within(i.target, heavy) for heavy in HEAVY)
    ]
    assert not wrong


def test_no_training_module_imports_an_inference_module(imports):
    """The trainer's ranks and the engines meet only in what both build on (`runtime/weights/`, the batch types)."""
    wrong = [
        i for i in imports if within(i.module, "rlc.runtime.workers") and within(i.target, "rlc.runtime.inference")
    ]
    wrong += [
        i for i in imports if within(i.module, "rlc.runtime.inference") and within(i.target, "rlc.runtime.workers")
    ]
    assert not wrong


def test_the_weight_transports_stand_below_trainers_and_engines(imports):
    """Each transport's sending and receiving halves are used by both sides and import neither, nor the driver's
    half (`weights.updates`, which the driver alone uses)."""
    transports = ("tensors", "broadcast", "ipc", "payload", "lora")
    wrong = [
        i
        for i in imports
        if any(i.module == f"rlc.runtime.weights.{t}" for t in transports)
        and within(i.target, "rlc")
        and not within(i.target, "rlc.runtime.weights")
    ]
    wrong += [i for i in imports if i.target == "rlc.runtime.weights.updates" and i.module != "rlc.runtime.driver"]
    assert not wrong
    assert any(
        within(i.target, "rlc.runtime.weights.broadcast") for i in imports if within(i.module, "rlc.runtime.workers")
    )
    assert any(
        within(i.target, "rlc.runtime.weights.broadcast") for i in imports if within(i.module, "rlc.runtime.inference")
    )


def test_no_import_cycle_among_rlc_modules(imports):
    assert cycles(module_graph(imports)) == []


def formats() -> list[str]:
    """The source formats: the folders of compiler/importers (SkyRL, AReaL, verl)."""
    return sorted(p.parent.name for p in IMPORTERS.glob("*/__init__.py"))


def cross_format(imports: list[Import], names: list[str]) -> list[Import]:
    """The imports by which one format's module reaches into another format's folder."""

    def format_of(module: str) -> str | None:
        return next((n for n in names if within(module, f"rlc.compiler.importers.{n}")), None)

    return [i for i in imports if format_of(i.module) and format_of(i.target) not in (None, format_of(i.module))]


def test_no_importer_format_imports_another(imports):
    """What two formats share (ImportResult, leaves, environment_reference, ...) is in importers/base.py; a format
    builds on it, the shell reader and the spec versions, never on another format's modules."""
    assert {"skyrl", "areal", "verl"} <= set(formats())
    wrong = cross_format(imports, formats())
    assert not wrong, "\n".join(
        f"{i.module} imports {i.target}: move what they share to importers/base.py" for i in wrong
    )


def unmarked_deferred(source: str) -> list[int]:
    """The lines of the imports inside functions that have no `# deferred: <reason>` comment on their line or on
    the comment lines just above (one comment may head a run of imports)."""
    lines = source.splitlines()
    imports = function_imports(ast.parse(source))
    return [node.lineno for node in imports if not (deferred_comment(lines, node, imports) or "").strip(MARK + " ")]


def test_every_deferred_import_of_the_compiler_says_why():
    """An import waits in a function to keep a heavy or rarely needed part (jinja2, rich, tree-sitter, omegaconf,
    SkyRL's legacy tables, a command's own modules in the CLI) out of another command's start-up, and says which;
    any other import is at the module top."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "compiler").rglob("*.py"))
        for line in unmarked_deferred(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"imports in a function without a `{MARK} <reason>` comment: " + ", ".join(found)


def spec_reads(source: str) -> list[str]:
    """Every place a source reaches into a spec: a name `spec` (a parameter, a local) or an attribute `.spec`
    (`self.spec`, `job.spec`), whatever is read through it then."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Name) and node.id == "spec") or (isinstance(node, ast.arg) and node.arg == "spec"):
            found.append(f"line {node.lineno}: spec")
        elif isinstance(node, ast.Attribute) and node.attr == "spec":
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda place: int(place.split(":")[0].split()[1]))


@pytest.mark.parametrize("path", NO_SPEC_READS)
def test_the_driver_and_placement_read_no_spec_field(path):
    """Their values reach them as typed settings (`decisions.loop`, `decisions.envs`, `sections.Sections`), each
    decided once in compiler/decide.py."""
    found = spec_reads((ROOT / path).read_text(encoding="utf-8"))
    assert not found, f"{path} reads the spec (decide it in compiler/decide.py instead): " + "; ".join(found)


# The settings of the loop's components, each decided in compiler/decide.py and handed on whole by the driver.
COMPONENT_SETTINGS = ("data", "tracking", "checkpoints", "evaluation", "ahead", "scoring", "generator")


def relayed_reads(source: str, loop_fields: set[str]) -> list[str]:
    """Where a source reads a field of a component's settings (`decisions.scoring.kl`) instead of handing the
    settings on whole, or a field of `loop` (`self.loop.x`, `loop.x`) that the loop's own settings do not have."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = ast.unparse(node.value)
        if node.attr in COMPONENT_SETTINGS and owner.split(".")[-1] == "decisions":
            parent = parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                found.append(f"line {node.lineno}: {ast.unparse(parent)}")
        elif owner.split(".")[-1] == "loop" and node.attr not in loop_fields:
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda place: int(place.split(":")[0].split()[1]))


def test_the_driver_hands_each_component_its_settings_whole():
    """The driver reads the loop's own settings only: a component's values reach it in its own settings."""
    fields = {f.name for f in dataclasses.fields(LoopSettings)}
    found = relayed_reads((ROOT / "runtime/driver.py").read_text(encoding="utf-8"), fields)
    assert not found, "runtime/driver.py relays a component's settings (hand them on whole): " + "; ".join(found)
    assert relayed_reads("a = self.decisions.scoring.kl\nb = job.decisions.data\nc = self.loop.nope\n", {"seed"}) == [
        "line 1: self.decisions.scoring.kl",
        "line 3: self.loop.nope",
    ]


def test_the_checks_see_what_they_look_for():
    """The reading finds function-level and relative imports, and the cycle search finds a circle."""
    source = "from . import b\n\ndef f():\n    from rlc.compiler import cli\n    import torch\n"
    found = imports_of("rlc.spec.a", source, {"rlc.spec.b", "rlc.compiler.cli"}, is_package=False)
    assert Import("rlc.spec.a", "rlc.spec.b", None) in found
    assert Import("rlc.spec.a", "rlc.compiler.cli", "f") in found
    assert Import("rlc.spec.a", "torch", "f") in found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    crossing = [
        Import("rlc.compiler.importers.verl.script", "rlc.compiler.importers.skyrl.script", "f"),
        Import("rlc.compiler.importers.verl.script", "rlc.compiler.importers.verl.importer", None),
        Import("rlc.compiler.importers.verl.script", "rlc.compiler.importers.base", None),
        Import("rlc.compiler.importers.scripts", "rlc.compiler.importers.skyrl.script", None),
    ]
    assert cross_format(crossing, ["skyrl", "verl"]) == crossing[:1]
    source = "def f():\n    import a  # deferred: a\n    # deferred: b and c\n    import b\n\n    import c\n    x = 1\n    import d\n"
    assert unmarked_deferred(source) == [8]
    assert unmarked_deferred("def f():\n    import a  # deferred: a\n    import b\n") == [3]
    source = "def f(job, spec):\n    a = self.spec.trainer.seed\n    b = job.spec.data\n    c = spec.x\n    d = find_spec('x')\n"
    assert spec_reads(source) == [
        "line 1: spec",
        "line 2: self.spec",
        "line 3: job.spec",
        "line 4: spec",
    ]

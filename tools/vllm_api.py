"""rlc's calls into vLLM, read from rlc's sources, checked against a vLLM release's API read from its wheel's sources.

Neither side is imported: both are parsed with `ast`. rlc's side is every `from vllm... import`, every attribute of
a module it imports from vllm, every attribute and keyword argument it uses on the vLLM objects named in
`RECEIVERS`, and every attribute its worker extension takes from the vLLM worker it is mixed into. vLLM's side
(`facts`) is, for the modules and classes those uses reach, the names a module defines or imports and the members a
class has (methods with their parameters, class attributes and dataclass fields, attributes its methods assign on
`self`), with their base classes inside vLLM.

`tools/gpu_kit.py build` writes the facts of the vLLM 0.26.0 wheel to tests/runtime/vllm-0.26-api.json, which
tests/runtime/test_vllm_026_api.py checks rlc against in CI (the wheel is 290 MiB, the facts a few KiB).
"""

from __future__ import annotations

import ast
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tests" / "runtime" / "vllm-0.26-api.json"
SOURCES = ("runtime",)  # where rlc calls vLLM

# The vLLM object each of these expressions of rlc's code holds (runtime/inference/vllm.py, vllm_worker.py).
RECEIVERS = {
    "self.llm": "vllm.entrypoints.llm.LLM",
    "self.llm.llm_engine": "vllm.v1.engine.llm_engine.LLMEngine",
    "self.model_runner": "vllm.v1.worker.gpu_model_runner.GPUModelRunner",
    "self.model_runner.model": "vllm.model_executor.models.llama.LlamaForCausalLM",
    "self.parallel_config": "vllm.config.parallel.ParallelConfig",
}
# rlc classes vLLM mixes into one of its own (`worker_extension_cls`): what they read on `self` is that class's.
MIXED_INTO = {"WeightSyncExtension": "vllm.v1.worker.gpu_worker.Worker"}
# Keyword dicts rlc builds for a vLLM class (`engine_kwargs` for `LLM(**...)`, `sampling_kwargs`): checked by the test.
KWARG_CLASSES = ("vllm.engine.arg_utils.EngineArgs", "vllm.sampling_params.SamplingParams")


@dataclass(frozen=True)
class Use:
    """One name rlc uses: `owner` is a vLLM module or class, `name` a member of it; `keywords` the keyword arguments
    of a call to it; `guarded` when rlc reaches it through getattr/hasattr and copes with its absence."""

    where: str
    owner: str
    name: str
    keywords: tuple[str, ...] = ()
    guarded: bool = False


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def uses_in(source: str, where: str) -> list[Use]:
    """The vLLM names one rlc module uses."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> vLLM module
    found: list[Use] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "vllm":
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            for alias in node.names:
                line = f"{where}:{node.lineno}"
                found.append(Use(line, node.module, alias.name))
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"  # a submodule, if it is one
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = _dotted(node.targets[0]), _dotted(node.value)
            if target and value in modules and target.startswith("self."):
                modules[target] = modules[value]  # self._vllm = vllm
    methods = (ast.FunctionDef, ast.AsyncFunctionDef)
    for fn in [n for n in tree.body if isinstance(n, methods)]:
        found += _uses_in_function(fn, where, modules, None, set())
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        own = {n.name for n in cls.body if isinstance(n, methods)}
        # What the class assigns itself; a bare annotation (`device: Any`) declares what the vLLM class supplies.
        assigned = [n for n in cls.body if isinstance(n, ast.Assign) or (isinstance(n, ast.AnnAssign) and n.value)]
        own |= {t.id for n in assigned for t in _targets(n)}
        for fn in [n for n in cls.body if isinstance(n, methods)]:
            found += _uses_in_function(fn, where, modules, MIXED_INTO.get(cls.name), own)
    return found


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.Name]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t for t in targets if isinstance(t, ast.Name)]


def _uses_in_function(fn, where: str, modules: dict, host: str | None, own: set) -> list[Use]:
    receivers = dict(RECEIVERS)
    for node in ast.walk(fn):  # pc = self.parallel_config
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _dotted(node.value)
            if value in receivers:
                receivers[node.targets[0].id] = receivers[value]
    found: list[Use] = []
    guarded: set[int] = set()
    for node in ast.walk(fn):
        line = f"{where}:{getattr(node, 'lineno', fn.lineno)}"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            owner = _owner(_dotted(node.args[0]), receivers, modules, host, own)
            if owner and not _own(owner, node.args[1].value, host, own):
                found.append(Use(line, owner, node.args[1].value, guarded=True))
            guarded.add(id(node.args[0]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = _owner(_dotted(node.func.value), receivers, modules, host, own)
            keywords = tuple(k.arg for k in node.keywords if k.arg)
            if owner and keywords:
                found.append(Use(line, owner, node.func.attr, keywords))
        if isinstance(node, ast.Attribute) and id(node) not in guarded:
            owner = _owner(_dotted(node.value), receivers, modules, host, own)
            if owner and not _own(owner, node.attr, host, own):
                found.append(Use(line, owner, node.attr))
    return found


def _own(owner: str, attr: str, host: str | None, own: set) -> bool:
    """An attribute of rlc's own on the vLLM class its extension is mixed into."""
    return owner == host and (attr in own or attr.startswith(("rlc_", "_rlc")))


def _owner(expr: str | None, receivers: dict, modules: dict, host: str | None, own: set) -> str | None:
    if expr is None:
        return None
    if expr in receivers:
        return receivers[expr]
    if expr in modules:
        return modules[expr]
    if expr == "self" and host:
        return host
    return None


def rlc_uses(root: Path = ROOT) -> list[Use]:
    """Every vLLM name rlc's runtime uses, file by file."""
    found: list[Use] = []
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "vllm" in text:
                found += uses_in(text, path.relative_to(root).as_posix())
    return sorted(set(found), key=lambda u: (u.where, u.owner, u.name))


# -- vLLM's side, from its wheel -----------------------------------------------------------------------------------


class Wheel:
    """The Python modules of a vLLM wheel, parsed on demand."""

    def __init__(self, path: Path):
        self.zip = zipfile.ZipFile(path)
        self.files = {n for n in self.zip.namelist() if n.endswith(".py")}
        info = next(n for n in self.zip.namelist() if n.endswith(".dist-info/METADATA")).split("/")[0]
        self.version = info.removesuffix(".dist-info").split("-")[1]
        self._trees: dict[str, ast.Module | None] = {}

    def file_of(self, module: str) -> str | None:
        path = module.replace(".", "/")
        return next((f for f in (f"{path}.py", f"{path}/__init__.py") if f in self.files), None)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            name = self.file_of(module)
            self._trees[module] = ast.parse(self.zip.read(name)) if name else None
        return self._trees[module]

    def imports(self, module: str) -> dict[str, str]:
        """Local name -> what it imports (a dotted path), for a module's imports at any depth of its top level."""
        tree, out = self.tree(module), {}
        package = module if (self.file_of(module) or "").endswith("__init__.py") else module.rpartition(".")[0]
        for node in _top_level(tree.body if tree else []):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    out[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    out[alias.asname or alias.name.split(".")[0]] = (
                        alias.asname and alias.name or alias.name.split(".")[0]
                    )
        return out

    def names(self, module: str) -> dict[str, list[str] | None]:
        """What a module defines or imports at its top level (inside `if`/`try` too); functions with their
        parameters. A package's submodules count as its names."""
        tree = self.tree(module)
        out: dict[str, list[str] | None] = {}
        for node in _top_level(tree.body if tree else []):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = _params(node)
            elif isinstance(node, ast.ClassDef):
                out[node.name] = None
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                out.update((t.id, None) for t in _targets(node))
        out.update((name, None) for name in self.imports(module))
        prefix = module.replace(".", "/") + "/"
        for f in self.files:
            if f.startswith(prefix):
                out.setdefault(f[len(prefix) :].split("/")[0].removesuffix(".py"), None)
        out.pop("__init__", None)
        return dict(sorted(out.items()))

    def find_class(self, dotted: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        """Where `module.Class` is defined, following re-exports."""
        module, _, name = dotted.rpartition(".")
        tree = self.tree(module)
        if tree is None or depth > 8:
            return None
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef) and node.name == name:
                return f"{module}.{name}", node
        target = self.imports(module).get(name)
        return self.find_class(target, depth + 1) if target and target.startswith("vllm.") else None

    def class_facts(self, dotted: str) -> dict[str, dict]:
        """The class and its bases inside vLLM: {qualified name: {"bases": [...], "members": {name: params}}}."""
        out: dict[str, dict] = {}
        todo = [dotted]
        while todo:
            found = self.find_class(todo.pop())
            if found is None or found[0] in out:
                continue
            qualified, node = found
            module = qualified.rpartition(".")[0]
            imports = self.imports(module)
            bases = []
            for base in node.bases:
                text = _dotted(base)
                if text is None:
                    continue
                head, _, rest = text.partition(".")
                full = imports.get(head, f"{module}.{head}") + (f".{rest}" if rest else "")
                resolved = self.find_class(full)
                bases.append(resolved[0] if resolved else text)
                if resolved:
                    todo.append(resolved[0])
            out[qualified] = {"bases": bases, "members": _members(node)}
        return out


def _top_level(body: list[ast.stmt]):
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(part)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if a.vararg:
        names.append("*" + a.vararg.arg)
    if a.kwarg:
        names.append("**" + a.kwarg.arg)
    return names


def _members(cls: ast.ClassDef) -> dict[str, list[str] | str | None]:
    """Methods (their parameters), class-level attributes and fields (None), attributes set on `self` ("self")."""
    out: dict[str, list[str] | str | None] = {}
    for node in _top_level(cls.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = _params(node)
            for inner in ast.walk(node):
                targets = inner.targets if isinstance(inner, ast.Assign) else [getattr(inner, "target", None)]
                if isinstance(inner, (ast.Assign, ast.AnnAssign)):
                    for t in targets:
                        if isinstance(t, ast.Attribute) and _dotted(t.value) == "self":
                            out.setdefault(t.attr, "self")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            out.update((t.id, None) for t in _targets(node))
    return dict(sorted(out.items()))


def facts(wheel_path: Path, uses: list[Use] | None = None) -> dict:
    """The API facts of the wheel that rlc's uses (by default, today's) reach. `aliases` maps a name a class is
    reached by (a re-export such as `vllm.SamplingParams`) to where it is defined."""
    wheel = Wheel(wheel_path)
    uses = rlc_uses() if uses is None else uses
    modules: dict[str, dict] = {}
    classes: dict[str, dict] = {}
    aliases: dict[str, str] = {}

    def add_class(name: str) -> None:
        found = wheel.find_class(name)
        if found is None:
            return
        if found[0] != name:
            aliases[name] = found[0]
        classes.update(wheel.class_facts(found[0]))

    for owner in sorted({u.owner for u in uses} | set(KWARG_CLASSES)):
        if wheel.file_of(owner):
            modules[owner] = wheel.names(owner)
        else:
            add_class(owner)
    for use in uses:  # a class rlc calls out of a module (SamplingParams, TokensPrompt, LoRARequest)
        if use.owner in modules and use.keywords:
            add_class(f"{use.owner}.{use.name}")
    return {"vllm": wheel.version, "modules": modules, "classes": dict(sorted(classes.items())), "aliases": aliases}


def write_facts(wheel_path: Path, path: Path = FACTS) -> Path:
    text = json.dumps(facts(wheel_path), indent=1, sort_keys=True) + "\n"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


# -- the check -----------------------------------------------------------------------------------------------------


def members_of(known: dict, cls: str) -> tuple[dict[str, list[str] | str | None], list[str]]:
    """A class's members with those of its bases inside vLLM, and its bases outside vLLM (whose members are not
    known)."""
    members: dict[str, list[str] | str | None] = {}
    outside: list[str] = []
    todo, seen = [known["aliases"].get(cls, cls)], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        entry = known["classes"].get(name)
        if entry is None:
            outside.append(name)
            continue
        for member, params in entry["members"].items():
            members.setdefault(member, params)
        todo += entry["bases"]
    return members, outside


def _takes(params: list[str] | str | None, keywords: tuple[str, ...]) -> list[str]:
    if not isinstance(params, list) or any(p.startswith("**") for p in params):
        return []
    return [k for k in keywords if k not in params]


def problems(uses: list[Use], known: dict) -> list[str]:
    """What rlc uses that the release described by `known` lacks (its guarded uses excepted), one line each."""
    out = []
    for use in uses:
        if use.owner in known["modules"]:
            names = known["modules"][use.owner]
            if use.name not in names:
                if not use.guarded:
                    out.append(f"{use.where}: {use.owner} has no {use.name!r} in vLLM {known['vllm']}")
                continue
            cls = known["aliases"].get(f"{use.owner}.{use.name}", f"{use.owner}.{use.name}")
            # A class is called through its __init__ or its fields.
            params = _init_params(known, cls) if cls in known["classes"] else names[use.name]
            if bad := _takes(params, use.keywords):
                out.append(f"{use.where}: {use.owner}.{use.name} takes no {', '.join(bad)} in vLLM {known['vllm']}")
        elif known["aliases"].get(use.owner, use.owner) in known["classes"]:
            members, _ = members_of(known, use.owner)
            if use.name not in members:
                if not use.guarded:
                    out.append(f"{use.where}: {use.owner} has no {use.name!r} in vLLM {known['vllm']}")
            elif bad := _takes(members[use.name], use.keywords):
                out.append(f"{use.where}: {use.owner}.{use.name} takes no {', '.join(bad)} in vLLM {known['vllm']}")
        else:
            out.append(f"{use.where}: {use.owner} is not in the facts of vLLM {known['vllm']}: rebuild them")
    return out


def _init_params(known: dict, cls: str) -> list[str] | None:
    members, _ = members_of(known, cls)
    init = members.get("__init__")
    if isinstance(init, list):
        return init
    return sorted(fields(known, cls)) or None


def fields(known: dict, cls: str) -> set[str]:
    """The fields of a dataclass-like vLLM class (its class-level attributes, its bases' included)."""
    members, _ = members_of(known, cls)
    return {m for m, p in members.items() if p is None}


def load_facts(path: Path = FACTS) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))

"""What a package imports for certain when some of its modules are imported, read from its sources (nothing runs).

From the entry modules, every import at a module's top level is followed: into the package's own modules (and
each one's parent packages, which Python imports first), and collected when it names another top-level package.
Imports under an `if` or a `try` are conditional (a backend switch, an optional extra, TYPE_CHECKING) and neither
followed nor collected: what is left is what `import` needs for certain. tools/gpu_kit.py checks vLLM's offline
`LLM` path against what kit-b and the device image hold with it.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

# vLLM 0.26's offline LLM on one GPU with a dense Llama/Qwen model, as rlc's VLLMEngine and worker extension use it.
VLLM_OFFLINE = (
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.core_client",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.qwen2",
    "vllm.model_executor.models.qwen3",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.sample.sampler",
    "vllm.model_executor.model_loader.default_loader",
    "vllm.model_executor.model_loader.reload",
    "vllm.device_allocator.cumem",
    "vllm.platforms.cuda",
    "vllm.lora.request",
    "vllm.sampling_params",
    "vllm.inputs",
    "vllm.outputs",
    "vllm._custom_ops",
)


def _file(site: Path, module: str) -> Path | None:
    base = site / module.replace(".", "/")
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.exists()), None)


def _certain(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        if isinstance(node, ast.With):
            yield from _certain(node.body)
        elif not isinstance(node, (ast.If, ast.Try)):
            yield node


def _imported(node: ast.stmt, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    return []


def third_party(site: Path, entry: Iterable[str]) -> dict[str, set[str]]:
    """Top-level packages other than the entry modules' own and the standard library that importing `entry`
    imports for certain, each with the modules that import it."""
    own = {m.split(".")[0] for m in entry}
    todo, seen = list(entry), set()
    found: dict[str, set[str]] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]
        path = _file(site, module)
        if path is None:
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _certain(ast.parse(path.read_bytes()).body):
            for name in _imported(node, package):
                top = name.split(".")[0]
                if top in own:
                    if _file(site, name):
                        todo.append(name)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, set()).add(module)
    return found

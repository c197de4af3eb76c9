"""Deferred imports in the runtime: an import inside a function keeps a heavy or optional package out of a process
that does not need it, and says which in a `# deferred: ...` comment on its line or just above (issue 40). Anything
else goes at the module top, where the arrows between modules show. Read with `ast`; nothing here imports the runtime.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from deferred_imports import MARK, deferred_comment, function_imports

ROOT = Path(__file__).resolve().parents[2]
# Slow to import, or not installed for every job: the packages a deferred import may keep out.
HEAVY = (
    "torch",
    "ray",
    "transformers",
    "vllm",
    "megatron",
    "peft",
    "safetensors",
    "pyarrow",
    "pandas",
    "matplotlib",
    "wandb",
    "tensorboard",
    "skyrl_gym",
    "tokenizers",
    "rich",
    "psutil",
    # the clients delta weight sync needs for some sync_dirs and checksums only
    "huggingface_hub",
    "xxhash",
    "boto3",
    "botocore",
    "google",
)


def _named(comment: str, package: str) -> bool:
    text = comment.lower().replace("-", "_")
    return re.search(rf"(?<![a-z]){re.escape(package)}(?![a-z])", text) is not None


def _modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." * node.level + (node.module or "")]


def problems(path: Path, source: str) -> list[str]:
    """What is wrong with the function-level imports of one module, each as `path:line: ...`."""
    tree = ast.parse(source)
    lines = source.splitlines()
    imports = function_imports(tree)
    found = []
    for node in imports:
        where = f"{path}:{node.lineno}"
        comment = deferred_comment(lines, node, imports)
        relative = isinstance(node, ast.ImportFrom) and node.level > 0
        for module in _modules(node):
            parts = module.split(".")
            if not relative and parts[0] in sys.stdlib_module_names:
                found.append(f"{where}: {module} is the standard library: import it at the module top")
                continue
            heavy = [p for p in parts if p in HEAVY]
            own = relative or parts[0] == "rlc"
            if not heavy and not own:
                found.append(f"{where}: {module} is no heavy package ({', '.join(HEAVY)}): import it at the module top")
            elif comment is None:
                found.append(
                    f"{where}: {module} is imported in a function without a `{MARK} ...` comment saying "
                    "which heavy package it keeps out of what"
                )
            elif heavy and not any(_named(comment, p) for p in heavy):
                found.append(f"{where}: the comment of {module} does not name {heavy[0]}")
            elif own and not any(_named(comment, p) for p in (*HEAVY, "cycle")):
                found.append(
                    f"{where}: {module} is rlc's own: its comment names no heavy package it keeps out (nor a "
                    "cycle), else import it at the module top"
                )
    return found


def test_every_deferred_import_of_the_runtime_says_which_heavy_package_it_keeps_out():
    found = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        found += problems(path.relative_to(ROOT), path.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("body", "wanted"),
    [
        ("    import os\n", "os is the standard library"),
        ("    from importlib.metadata import entry_points  # deferred: costly\n", "importlib.metadata is the standard"),
        ("    import ray\n", "ray is imported in a function without"),
        ("    import ray  # deferred: torch, not needed here\n", "does not name ray"),
        ("    from torch.utils.tensorboard import SummaryWriter  # deferred: wandb\n", "does not name torch"),
        ("    from rlc.runtime.envs import gsm8k\n", "rlc.runtime.envs is imported in a function without"),
        ("    from rlc.runtime.envs import gsm8k  # deferred: saves time\n", "rlc's own"),
        ("    import yaml  # deferred: torch\n", "yaml is no heavy package"),
        # a run of imports under one comment: the comment covers the run, not an import after another comment
        (
            "    # deferred: vLLM is optional\n    import vllm\n    import ray  # deferred: Ray\n    import psutil\n",
            "psutil is imported in a function without",
        ),
    ],
)
def test_a_deferred_import_that_hides_an_arrow_or_names_no_heavy_package_is_named_by_file_and_line(body, wanted):
    found = problems(Path("runtime/m.py"), "def f():\n" + body + "    return 1\n")
    assert len(found) == 1 and wanted in found[0] and found[0].startswith("runtime/m.py:"), found


@pytest.mark.parametrize(
    "body",
    [
        "    import ray  # deferred: Ray, not needed to parse arguments\n",
        "    # deferred: Megatron-Core is optional (FSDP jobs lack it)\n    from megatron.core import parallel_state as ps\n",
        "    # deferred: vLLM is optional\n    import vllm\n    from vllm import envs\n",
        "    from torch.utils.tensorboard import SummaryWriter  # deferred: tensorboard is optional\n",
        "    from rlc.runtime.envs.calculator import rows  # deferred: skyrl-gym, only for its rows\n",
        "    # deferred: an import cycle (a imports b)\n    from rlc.runtime import a\n",
        "    import torch.distributed.checkpoint as dcp  # deferred: torch.distributed.checkpoint, slow\n",
    ],
)
def test_a_deferred_import_that_names_what_it_keeps_out_passes(body):
    assert problems(Path("runtime/m.py"), "def f():\n" + body + "    return 1\n") == []

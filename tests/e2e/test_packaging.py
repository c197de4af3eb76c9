"""The folder -> `rlc.*` namespace mapping works both as an editable install and as a built wheel."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest
from conftest import ROOT


def test_editable_install_maps_folders_to_rlc_namespace():
    import rlc.compiler
    import rlc.runtime
    import rlc.spec
    import rlc.templates

    assert Path(rlc.spec.__file__).resolve().parent == ROOT / "spec"
    assert Path(rlc.compiler.__file__).resolve().parent == ROOT / "compiler"
    assert (files("rlc.spec") / "schema" / "rlc-spec-v1.schema.json").is_file()
    assert files("rlc.templates").is_dir()


def test_compiler_imports_no_heavy_runtime_dependencies():
    code = (
        "import sys, rlc.compiler.pipeline, rlc.compiler.check, rlc.compiler.cli, rlc.compiler.importers.versions;"
        "import rlc.compiler.importers.registry, rlc.compiler.importers.scripts;"
        "heavy = [m for m in ('torch', 'ray', 'vllm', 'transformers') if m in sys.modules];"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_built_wheel_contains_only_the_rlc_namespace(tmp_path):
    out = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    wheel = next(out.glob("rlc-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"rlc"}, tops
    for needed in (
        "rlc/spec/model.py",
        "rlc/compiler/cli.py",
        "rlc/spec/schema/rlc-spec-v1.schema.json",
        "rlc/templates/__init__.py",
        "rlc/runtime/__init__.py",
        "rlc/compiler/importers/skyrl/legacy.py",
        "rlc/compiler/importers/areal/importer.py",
        "rlc/compiler/importers/verl/importer.py",
        "rlc/compiler/importers/verl/defaults/main.json",  # the verl defaults travel with the verl importer
    ):
        assert needed in names
    # Installed into a bare venv, the namespace imports and its package data reads.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    inst = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], capture_output=True, text=True, timeout=300
    )
    assert inst.returncode == 0, inst.stderr
    code = (
        "import rlc.spec.model, rlc.compiler, rlc.templates, rlc.runtime, json;"
        "from importlib.resources import files;"
        "s = json.loads((files('rlc.spec') / 'schema' / 'rlc-spec-v1.schema.json').read_text());"
        "assert s['title'] == 'rlc spec v1';"
        "assert (files('rlc.compiler.importers.verl') / 'defaults' / 'v0.9.0.json').is_file();"
        "import importlib.util as u; assert u.find_spec('spec') is None and u.find_spec('compiler') is None"
    )
    run = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr

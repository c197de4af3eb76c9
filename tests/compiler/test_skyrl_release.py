"""Spec v1 covers SkyRL's newest release field for field: every field exists, each one is run or refused with a
located "not supported yet" error, and `rlc explain` names the defaults v1 keeps differently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES
from rlc.compiler.explain import explain_key
from rlc.compiler.pipeline import analyze
from rlc.compiler.rules.upstream import UNSUPPORTED
from rlc.spec.model import SpecModel, to_plain
from rlc.spec.schema import committed_schema
from rlc.spec.skyrl_release import DEFAULT_CHANGES, SKYRL_RELEASE
from upstream_cases import ALL_KEYS, CONDITIONAL_KEYS, group_of, nested_yaml, non_default, refused_case

MODEL = SpecModel()
BASE = "version: 1\ncluster: {accelerator: H100, gpus_per_node: 8, num_nodes: 1}\n"
WALK = Path(__file__).with_name("skyrl_walk.py")


def _analyze(tmp_path, text: str):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return analyze(path, env={"WANDB_API_KEY": "set"})


@pytest.mark.parametrize(("code", "key"), ALL_KEYS, ids=[k for _, k in ALL_KEYS])
def test_a_refused_setting_is_named_with_its_line_and_a_fix(tmp_path, code, key):
    text = BASE + refused_case(key)
    line = next(i + 1 for i, t in enumerate(text.splitlines()) if "# <-" in t)
    hits = [d for d in _analyze(tmp_path, text).diagnostics if d.code == code and d.key == key]
    assert [(d.key, d.location.line, d.severity) for d in hits] == [(key, line, "error")]
    assert "not support" in hits[0].message and "SkyRL 0.4" in hits[0].message
    assert f"remove {key.rsplit('.', 1)[1]}" in hits[0].hint


@pytest.mark.parametrize(("code", "key"), CONDITIONAL_KEYS, ids=[k for _, k in CONDITIONAL_KEYS])
def test_a_setting_of_a_feature_that_is_off_is_not_refused(tmp_path, code, key):
    """The same value, without what turns its feature on (a profiler save_path with enable: false, a Megatron
    option under fsdp2, a LoRA serving option without LoRA): nothing reads it, so nothing is refused."""
    off = {c.key: c.off for c in group_of(key).when(key)}
    hits = [d for d in _analyze(tmp_path, BASE + nested_yaml(key, non_default(key), off)).diagnostics if d.code == code]
    assert not hits, [(d.key, d.message) for d in hits]


def test_skyrls_megatron_example_profiler_block_passes(tmp_path):
    """SkyRL's Megatron examples set a save_path and leave the profiler off."""
    body = "trainer:\n  logger: console\n  policy:\n    torch_profiler_config:\n      enable: false\n"
    body += "      save_path: /tmp/megatron_profiles\n      ranks: [0, 1]\n"
    assert not [d.code for d in _analyze(tmp_path, BASE + body).diagnostics if d.severity == "error"]
    on = body.replace("enable: false", "enable: true")
    assert {d.key for d in _analyze(tmp_path, BASE + on).diagnostics if d.code == "RLC-E804"} == {
        "trainer.policy.torch_profiler_config.enable",
        "trainer.policy.torch_profiler_config.save_path",
        "trainer.policy.torch_profiler_config.ranks",
    }


def test_defaults_and_the_values_the_runtime_runs_pass(tmp_path):
    text = BASE + "trainer: {logger: console, max_training_steps: 3, use_expandable_segments: false}\n"
    text += "data: {dataloader: {num_workers: 0}}\n"
    analysis = _analyze(tmp_path, text)
    assert analysis.ok, [(d.code, d.message) for d in analysis.diagnostics]
    assert not [d for d in analysis.diagnostics if d.code.startswith("RLC-E8")]


def test_an_override_is_refused_at_the_command_line(tmp_path):
    from conftest import run_rlc

    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "local-cpu.yaml").read_text())
    overrides = ("trainer.strategy=megatron", "trainer.policy.megatron_config.moe_router_dtype=fp64")
    result = run_rlc("validate", str(spec), *overrides)
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert "RLC-E805" in out and "<command line>" in out, out


def test_every_group_has_a_distinct_code_in_range_and_known_keys():
    codes = [g.code for g in UNSUPPORTED]
    assert len(set(codes)) == len(codes)
    assert all("RLC-E801" <= c <= "RLC-E849" for c in codes)
    keys = [k for g in UNSUPPORTED for k in g.keys]
    assert len(set(keys)) == len(keys)
    assert all(MODEL.lookup(k) is not None for k in keys)


@pytest.mark.parametrize("key", sorted(DEFAULT_CHANGES))
def test_explain_says_how_skyrl_differs_where_v1_keeps_its_default(key):
    upstream, _ = DEFAULT_CHANGES[key]
    field = MODEL.lookup(key)
    assert field is not None and to_plain(field.default()) != upstream
    text, ok = explain_key(key)
    assert ok and f"SkyRL {SKYRL_RELEASE} defaults to {json.dumps(upstream)}" in text


# -- the installed release itself --------------------------------------------------------------------------

# Pure-Python packages skyrl's config module imports (its own GPU dependencies are never installed).
CONFIG_DEPS = ("omegaconf", "pyyaml", "pandas", "requests", "loguru")


def _venv_with_skyrl(tmp_root: Path) -> Path:
    """A Python with skyrl==SKYRL_RELEASE: this one where `make venv` installed it (the referee of the SkyRL trainer's
    commands), else a venv of its own (no dependencies of its own) cached under ~/.cache/rlc/test-venvs."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        if version("skyrl") == SKYRL_RELEASE:
            return Path(sys.executable)
    except PackageNotFoundError:
        pass
    cache = (
        Path.home()
        / ".cache"
        / "rlc"
        / "test-venvs"
        / f"skyrl-{SKYRL_RELEASE}-py{sys.version_info[0]}{sys.version_info[1]}"
    )
    python = cache / "bin" / "python"
    if (cache / "READY").exists():
        return python
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        target = cache
    except OSError:
        target = tmp_root / "skyrl-venv"
        python = target / "bin" / "python"
    made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(target)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a venv to install skyrl into: {made.stderr.strip()[-300:]}")
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # skyrl 0.4 declares Python >= 3.12; its config module runs on rlc's Python too
    for args in (["--no-deps", "--ignore-requires-python", f"skyrl=={SKYRL_RELEASE}"], list(CONFIG_DEPS)):
        done = subprocess.run(pip + args, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
            pytest.skip(f"cannot install skyrl=={SKYRL_RELEASE} from the package registry: {last}")
    (target / "READY").write_text("ok\n")
    return python


@pytest.fixture(scope="session")
def skyrl_fields(tmp_path_factory) -> list:
    python = _venv_with_skyrl(tmp_path_factory.mktemp("skyrl"))
    site = subprocess.run(
        [str(python), "-c", "import skyrl, os; print(os.path.dirname(os.path.dirname(skyrl.__file__)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the wheel ships skyrl_gym (which the config module imports) in a folder of its own
    env = {**os.environ, "PYTHONPATH": os.path.join(site, "skyrl-gym")}
    done = subprocess.run([str(python), str(WALK)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _schema_has(schema: dict, key: str) -> bool:
    node = schema
    for part in key.split("."):
        node = _object(schema, node)
        if node is None or part not in node.get("properties", {}):
            return False
        node = node["properties"][part]
    return True


def _object(schema: dict, node: dict) -> dict | None:
    for branch in [node, *node.get("anyOf", [])]:
        if "$ref" in branch:
            branch = schema["$defs"][branch["$ref"].rsplit("/", 1)[1]]
        if branch.get("type") == "object" and "properties" in branch:
            return branch
    return None


@pytest.mark.slow
def test_spec_v1_has_every_field_of_skyrls_newest_release(skyrl_fields):
    assert len(skyrl_fields) > 300, "the walk found too few fields: is this SkyRLTrainConfig?"
    schema = committed_schema()
    lacking = [key for key, _, _ in skyrl_fields if MODEL.lookup(key) is None or not _schema_has(schema, key)]
    assert not lacking, f"spec v1 lacks {len(lacking)} fields of skyrl {SKYRL_RELEASE}: {lacking}"


@pytest.mark.slow
def test_every_default_agrees_or_explain_says_why_not(skyrl_fields):
    differing = {}
    for key, _, upstream in skyrl_fields:
        field = MODEL.lookup(key)
        if field is None or upstream == "<required>" or (field.section is not None and upstream is None):
            continue
        if field.section is None and to_plain(field.default()) != upstream:
            differing[key] = upstream
    assert differing == {k: v for k, (v, _) in DEFAULT_CHANGES.items()}


def test_remove_microbatch_padding_is_skyrl_04s_name_of_sample_packing():
    from rlc.compiler.decide import worker_settings

    def packing(**trainer) -> bool:
        spec = MODEL.to_typed({"version": 1, "trainer": trainer})
        return worker_settings(spec, "policy", "cuda", None).sample_packing

    assert packing() and not packing(remove_microbatch_padding=False) and not packing(use_sample_packing=False)


def test_a_key_both_legacy_and_v1_means_what_v1_says_in_an_override(tmp_path):
    from conftest import run_rlc

    spec = tmp_path / "spec.yaml"
    spec.write_text((EXAMPLES / "local-cpu.yaml").read_text())
    result = run_rlc("validate", str(spec), "trainer.policy.torch_profiler_config.enable=true")
    out = result.stdout + result.stderr
    assert result.returncode == 1 and "RLC-E804" in out and "RLC-W010" not in out, out

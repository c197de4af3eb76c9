"""Legacy migration: the corpus, one snippet per legacy-keys.json mapping, the CLI modes, the guarantees."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from conftest import CORPUS, EXAMPLES, ROOT, run_rlc
from rlc.compiler.importers.versions import migrate_data, migrated_text
from rlc.compiler.load import document_from_text
from rlc.compiler.pipeline import analyze
from rlc.core.plain import plain_yaml as to_plain
from rlc.spec.model import SpecModel

LEGACY_KEYS = ROOT.parent / "shared" / "reference" / "legacy-keys.json"
CORPUS_FILES = sorted(CORPUS.glob("*.yaml"))
MODEL = SpecModel()

needs_corpus = pytest.mark.skipif(not CORPUS_FILES, reason="../shared/corpus is not beside this checkout")


def _migrate_text(text: str, name: str = "legacy.yaml"):
    doc = document_from_text(text, name)
    report = migrate_data(doc.data)
    return doc, report, migrated_text(doc)


def _leaves(node, prefix=()):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, prefix + (str(k),))
    else:
        yield ".".join(prefix), node


def _comments(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        m = re.search(r"(?:^|\s)#\s?(.*)$", line)
        if m and not re.search(r"[\"'][^\"']*#", line):
            out.append(m.group(1).strip())
    return out


@needs_corpus
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_file_migrates_validates_and_keeps_comments(tmp_path, path):
    text = path.read_text()
    doc, report, new = _migrate_text(text, path.name)
    assert report is not None and not report.errors, report.lines()
    out = tmp_path / "migrated.yaml"
    out.write_text(new)
    analysis = analyze(out, env={"WANDB_API_KEY": "x"})
    assert analysis.ok, [(d.code, d.key, d.message) for d in analysis.diagnostics]
    assert not analysis.migration, "a migrated file is current"
    # Comments survive, except those on lines of keys the report says were dropped.
    dropped_lines = set()
    lines = text.splitlines()
    for c in report.changes:
        if c.kind in ("dropped", "defaults") and c.line:
            dropped_lines.add(c.line)
            if isinstance(c.old_value, dict):  # a dropped block takes its own comments along
                indent = len(lines[c.line - 1]) - len(lines[c.line - 1].lstrip())
                n = c.line
                while n < len(lines) and (not lines[n].strip() or len(lines[n]) - len(lines[n].lstrip()) > indent):
                    if lines[n].strip() and not lines[n].lstrip().startswith("#"):
                        dropped_lines.add(n + 1)
                    elif lines[n].strip():
                        nxt = next((m for m in lines[n + 1 :] if m.strip() and not m.lstrip().startswith("#")), "")
                        if len(nxt) - len(nxt.lstrip()) > indent:
                            dropped_lines.add(n + 1)
                    n += 1
    dropped_comment_text = set()
    for i, line in enumerate(text.splitlines(), 1):
        if i in dropped_lines:
            dropped_comment_text.update(_comments(line))
    defaults_block = re.search(r"^defaults:\n((?:[ \t].*\n|\n)*)", text, re.M)
    if defaults_block:
        dropped_comment_text.update(_comments(defaults_block.group(0)))
    kept = _comments(new)
    lost = [c for c in _comments(text) if c not in kept and c not in dropped_comment_text]
    assert not lost, lost
    # Idempotent: a second migration changes nothing.
    doc2 = document_from_text(new, "again.yaml")
    assert migrate_data(doc2.data) is None


@needs_corpus
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_values_are_preserved(path):
    text = path.read_text()
    legacy = to_plain(document_from_text(text, path.name).data)
    doc, report, _ = _migrate_text(text, path.name)
    new = to_plain(doc.data)
    new_leaves = dict(_leaves(new))
    accounted = {c.old for c in report.changes if c.old}
    for key, value in _leaves(legacy):
        if key.startswith("defaults") or any(key == a or key.startswith(a + ".") for a in accounted):
            continue
        assert key in new_leaves, f"{key} vanished without a report line"
        assert new_leaves[key] == value, f"{key}: {value!r} became {new_leaves[key]!r}"
    for c in report.changes:
        if c.kind == "moved":
            assert _get(new, c.new) == c.old_value, f"{c.old} -> {c.new} lost its value"


def _get(data, path):
    for part in path.split("."):
        data = data[part]
    return data


# -- one snippet per mapping in legacy-keys.json -------------------------------------------------------


def _mappings():
    return json.loads(LEGACY_KEYS.read_text()) if LEGACY_KEYS.exists() else []


SAMPLES = {
    "trainer.algorithm.use_kl_estimator_k3": True,
    "trainer.algorithm.use_abs_kl": True,
    "trainer.algorithm.use_tis": True,
    "trainer.algorithm.tis_imp_ratio_cap": 3.0,
    "trainer.algorithm.ppo_loss_type": "dual_clip",
    "generator.backend": "vllm",
    "generator.inference_engine.backend": "vllm",
    "generator.model_dtype": "float16",
    "generator.weight_sync_backend": "gloo",
    "generator.override_existing_update_group": "enable",
    "generator.inference_engine.override_existing_update_group": "enable",
    "generator.remote_inference_engine_urls": ["127.0.0.1:8001"],
    "generator.inference_engine.remote_urls": ["127.0.0.1:8001"],
    "generator.external_server_urls": ["http://127.0.0.1:8001"],
    "generator.external_proxy_url": "http://127.0.0.1:8000",
    "generator.engine_init_kwargs": {"max_model_len": 4096},
    "generator.http_endpoint_host": "0.0.0.0",
    "generator.served_model_name": "policy",
    "generator.model_name": "${trainer.policy.model.path}",
    "environment.skygym": {"max_env_workers": 8},
    "megatron_config.policy": {"tensor_model_parallel_size": 2},
    "megatron_config.ref": {"tensor_model_parallel_size": 2},
    "trainer.target_modules": "all-linear",
    "trainer.exclude_modules": "lm_head",
    "trainer.algorithm.kl_target": 0.05,
    "trainer.algorithm.init_kl_coef": 0.0,
    "trainer.strategy": "fsdp2",
    "trainer.rope_scaling": {"rope_type": "yarn", "factor": 2.0},
    "generator.rope_scaling": {"rope_type": "yarn", "factor": 2.0},
    "trainer.rope_theta": 1000000.0,
    "generator.rope_theta": 1000000.0,
    "trainer.algorithm.max_seq_len": 1536,
    "trainer.use_sample_packing": True,
    "trainer.step_wise_training": True,
    "trainer.log_example_interval": 1,
    "trainer.policy.megatron_config.torch_profiler_config": {"enable": False, "ranks": [0]},
    "generator.inference_engine.router_type": "vllm",
    "generator.inference_engine.async_engine": True,
    "generator.inference_engine.enable_http_endpoint": False,
    "generator.inference_engine.http_endpoint_host": "127.0.0.1",
    "generator.inference_engine.http_endpoint_port": 8000,
    "trainer.algorithm.cispo.clip_low": 0.2,
    "trainer.algorithm.cispo.clip_high": 0.3,
    "deepspeed_config.train": {"zero_optimization": {"stage": 3}},
    "deepspeed_config.eval": {"zero_optimization": {"stage": 3}},
    "trainer.rope_parameters": None,
    "trainer.reward.model.path": None,
    "trainer.reward.fsdp_config.cpu_offload": True,
    "trainer.placement.colocate_critic_reward": False,
    "trainer.use_orm_score": False,
    "trainer.algorithm.normalize_reward": True,
    "generator.enforce_eager": False,
}


def _nest(path: str, value):
    out: dict = {}
    node = out
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def _sample(old: str):
    if old in SAMPLES:
        return SAMPLES[old]
    leaf = old.rsplit(".", 1)[-1]
    if leaf.startswith(("enable_", "use_", "run_", "async_", "fully_", "vllm_", "colocate")) or leaf.endswith(
        "_config"
    ):
        return True if not leaf.endswith("_config") else {}
    if "size" in leaf or "num" in leaf or "max_" in leaf or "port" in leaf:
        return 2
    if "utilization" in leaf or "GB" in leaf:
        return 0.5
    return 2


@pytest.mark.skipif(not LEGACY_KEYS.exists(), reason="../shared/reference is not beside this checkout")
@pytest.mark.parametrize("entry", _mappings(), ids=lambda e: f"{e['old']}->{e['new']}@{e['since']}")
def test_each_legacy_mapping(tmp_path, entry):
    old, new = entry["old"], entry["new"]
    value = _sample(old)
    text = _dump(_nest(old, value))
    doc, report, out_text = _migrate_text(text)
    data = to_plain(doc.data)
    mentioned = [c for c in report.changes if c.old and (c.old == old or old.startswith(c.old + "."))]
    mentioned.sort(key=lambda c: c.new != new)  # the change that lands on the documented key first
    if MODEL.lookup(old) is not None and not mentioned:
        # Still a spec v1 key (v1 predates the rename): the value stays where it was.
        assert _get(data, old) == value
        return
    assert mentioned, f"migration says nothing about {old}: {report.lines()}"
    change = mentioned[0]
    if change.kind == "moved":
        assert change.new and _get(data, change.new) == value
        if new and MODEL.lookup(new) is not None:
            assert change.new == new or change.new in new
    elif change.kind == "transformed":
        assert change.new and MODEL.lookup(change.new) is not None
        assert _get(data, change.new) == change.new_value
    else:
        assert change.kind == "dropped" and change.reason
    path = tmp_path / "m.yaml"
    path.write_text(out_text)
    analysis = analyze(path, env={"WANDB_API_KEY": "x"})
    schema_errors = [d for d in analysis.diagnostics if d.code in ("RLC-E010", "RLC-E011", "RLC-E012")]
    assert not schema_errors, [(d.code, d.key, d.message) for d in schema_errors]


def test_kl_flags_become_one_enum():
    for flags, expected in (
        ({"use_abs_kl": True, "use_kl_estimator_k3": True}, "abs"),
        ({"use_kl_estimator_k3": True}, "k3"),
        ({"use_kl_estimator_k3": False, "use_abs_kl": False}, "k1"),
    ):
        doc, report, _ = _migrate_text(_dump({"trainer": {"algorithm": flags}}))
        assert to_plain(doc.data)["trainer"]["algorithm"]["kl_estimator_type"] == expected
    # Kept next to the new key as false overrides (2025-08 .. 2026-01): the enum decides.
    doc, _, _ = _migrate_text(
        _dump(
            {"trainer": {"algorithm": {"kl_estimator_type": "k2", "use_kl_estimator_k3": False, "use_abs_kl": False}}}
        )
    )
    assert to_plain(doc.data)["trainer"]["algorithm"]["kl_estimator_type"] == "k2"


def test_use_tis_maps_to_off_policy_correction():
    doc, report, _ = _migrate_text(_dump({"trainer": {"algorithm": {"use_tis": True, "tis_imp_ratio_cap": 3.5}}}))
    opc = to_plain(doc.data)["trainer"]["algorithm"]["off_policy_correction"]
    assert opc == {"tis_ratio_type": "token", "token_tis_ratio_clip_high": 3.5}


def test_interpolations_follow_moved_keys_and_env_stays():
    text = textwrap.dedent("""\
        trainer:
          ckpt_path: "${oc.env:CKPT_DIR,/tmp/ckpts}"
          run_name: "engines-${generator.num_inference_engines}"
        generator:
          num_inference_engines: 2
          max_input_length: ${trainer.max_prompt_length}
        """)
    doc, report, out = _migrate_text(text)
    data = to_plain(doc.data)
    assert data["trainer"]["run_name"] == "engines-${generator.inference_engine.num_engines}"
    assert data["trainer"]["ckpt_path"] == "${oc.env:CKPT_DIR,/tmp/ckpts}"
    assert data["generator"]["max_input_length"] == "${trainer.max_prompt_length}"
    assert any(c.kind == "reference" for c in report.changes)


@pytest.mark.parametrize("logger", [None, "wandb"])
def test_a_wandb_run_names_its_api_key_as_a_launch_secret(tmp_path, logger):
    """SkyRL logs to wandb by default and reads WANDB_API_KEY from the environment: the migrated spec names it in
    launch.secrets (a report line says so), so it validates without the key set here."""
    trainer = {"seed": 3, **({"logger": logger} if logger else {})}
    doc, report, out = _migrate_text(_dump({"trainer": trainer}))
    assert to_plain(doc.data)["launch"]["secrets"] == ["WANDB_API_KEY"]
    (change,) = [c for c in report.changes if c.new == "launch.secrets"]
    assert change.kind == "added" and "WANDB_API_KEY" in change.describe()
    path = tmp_path / "new.yaml"
    path.write_text(out)
    assert not [d.code for d in analyze(path, env={}).diagnostics], [d.message for d in analyze(path).diagnostics]


def test_a_console_run_gets_no_secret():
    doc, report, _ = _migrate_text(_dump({"trainer": {"logger": "console"}}))
    assert "launch" not in to_plain(doc.data) and not [c for c in report.changes if c.new == "launch.secrets"]


def test_defaults_list_is_removed_with_a_report_line():
    text = "defaults:\n  - _self_\n  - deepspeed_config@deepspeed_config.train: train\n  - skyrl_gym_config: default\ntrainer:\n  seed: 3\n"
    doc, report, out = _migrate_text(text)
    assert "defaults" not in out
    line = next(c for c in report.changes if c.kind == "defaults")
    assert "deepspeed_config" in line.reason and "skyrl_gym_config" in line.reason


def test_behaviour_changing_drop_is_an_error(spec_file):
    path = spec_file("""
        trainer:
          reward:
            model:
              path: my-org/reward-model
          strategy: deepspeed
        """)
    result = run_rlc("validate", str(path), "--format", "json")
    assert result.returncode == 1
    codes = [d["code"] for d in json.loads(result.stdout)["diagnostics"]]
    assert codes.count("RLC-E020") >= 2
    migrated = run_rlc("migrate", str(path))
    assert migrated.returncode == 1
    assert "alter what runs" in migrated.stderr


# -- CLI modes ---------------------------------------------------------------------------------------

LEGACY = EXAMPLES / "legacy-skyrl.yaml"


def test_migrate_to_stdout_touches_nothing(tmp_path):
    src = tmp_path / "old.yaml"
    src.write_text(LEGACY.read_text())
    before = src.read_bytes()
    result = run_rlc("migrate", str(src))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("# A config") and "version: 1" in result.stdout
    assert "moved    generator.num_inference_engines" in result.stderr
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["old.yaml"]


def test_migrate_check_mode(tmp_path):
    src = tmp_path / "old.yaml"
    src.write_text(LEGACY.read_text())
    assert run_rlc("migrate", str(src), "--check").returncode == 1
    assert src.read_text() == LEGACY.read_text()
    assert run_rlc("migrate", str(EXAMPLES / "gsm8k-grpo-2node.yaml"), "--check").returncode == 0


def test_migrate_diff_mode(tmp_path):
    src = tmp_path / "old.yaml"
    src.write_text(LEGACY.read_text())
    result = run_rlc("migrate", str(src), "--diff")
    assert result.returncode == 0
    assert "-  num_inference_engines: 4" in result.stdout and "+    num_engines: 4" in result.stdout
    assert src.read_text() == LEGACY.read_text()


def test_migrate_output_file_and_no_overwrite(tmp_path):
    src, dst = tmp_path / "old.yaml", tmp_path / "new.yaml"
    src.write_text(LEGACY.read_text())
    assert run_rlc("migrate", str(src), "-o", str(dst)).returncode == 0
    assert dst.read_text().count("version: 1") == 1 and src.read_text() == LEGACY.read_text()
    dst.write_text("mine\n")
    refused = run_rlc("migrate", str(src), "-o", str(dst))
    assert refused.returncode == 2 and dst.read_text() == "mine\n"
    assert run_rlc("migrate", str(src), "-o", str(dst), "--force").returncode == 0
    assert run_rlc("validate", str(dst)).returncode == 0


@pytest.mark.parametrize("source", ["skyrl", "areal"])
def test_migrate_into_a_missing_directory_is_a_usage_error(tmp_path, source):
    src = LEGACY if source == "skyrl" else sorted((ROOT / "tests" / "fixtures" / "areal").glob("*.yaml"))[0]
    result = run_rlc("migrate", "--from", source, str(src), "-o", str(tmp_path / "nowhere" / "new.yaml"))
    assert result.returncode == 2 and "cannot write" in result.stderr and "internal error" not in result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_migrate_in_place_is_idempotent(tmp_path):
    src = tmp_path / "old.yaml"
    src.write_text(LEGACY.read_text())
    assert run_rlc("migrate", str(src), "--in-place").returncode == 0
    once = src.read_text()
    assert "# old spelling of kl_estimator_type: k3" in once or "kl_estimator_type: k3" in once
    again = run_rlc("migrate", str(src), "--in-place")
    assert again.returncode == 0 and "already spec v1" in again.stderr
    assert src.read_text() == once


def test_legacy_override_on_the_command_line():
    result = run_rlc(
        "validate",
        str(EXAMPLES / "gsm8k-grpo-8xh100.yaml"),
        "generator.num_inference_engines=4",
        "--format",
        "json",
        env={"WANDB_API_KEY": "x"},
    )
    body = json.loads(result.stdout)
    assert result.returncode == 1
    codes = {d["code"]: d for d in body["diagnostics"]}
    assert "RLC-W010" in codes and "RLC-E201" in codes
    assert codes["RLC-E201"]["key"] == "generator.inference_engine.num_engines"
    assert codes["RLC-E201"]["file"] == "<command line>"


def test_validate_reads_legacy_file_with_one_warning():
    result = run_rlc("validate", str(LEGACY))
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("RLC-W010") == 1 and "rlc migrate" in result.stderr


def _dump(data) -> str:
    import yaml_helpers

    return yaml_helpers.dump(data)


def test_invalid_legacy_file_stays_invalid_and_names_inherited_defaults(spec_file):
    path = spec_file("""
        trainer:
          placement:
            policy_num_gpus_per_node: 4
          algorithm:
            advantage_estimator: gae
        generator:
          num_inference_engines: 2
        """)
    result = run_rlc("validate", str(path), "--format", "json", env={"WANDB_API_KEY": "x"})
    assert result.returncode == 1
    diags = {d["code"]: d for d in json.loads(result.stdout)["diagnostics"]}
    assert diags["RLC-E201"]["key"] == "generator.inference_engine.num_engines"
    assert diags["RLC-E201"]["line"] == 7
    assert "SkyRL's default" not in diags["RLC-E201"]["hint"]  # the file wrote num_inference_engines itself


def test_rule_broken_by_an_inherited_legacy_default_says_so(spec_file):
    path = spec_file("""
        trainer:
          train_batch_size: 128
        generator:
          num_inference_engines: 1
        """)
    result = run_rlc("validate", str(path), "--format", "json", env={"WANDB_API_KEY": "x"})
    diags = {d["code"]: d for d in json.loads(result.stdout)["diagnostics"]}
    assert result.returncode == 1
    assert diags["RLC-E101"]["key"] == "trainer.policy_mini_batch_size"
    assert "SkyRL's default" in diags["RLC-E101"]["hint"]

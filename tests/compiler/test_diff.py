"""`rlc diff`: differences after resolving both sides, with provenance and placement; equal when only form differs."""

from __future__ import annotations

import json

from conftest import EXAMPLES, run_rlc


def test_legacy_file_and_its_migration_are_equal(tmp_path):
    migrated = tmp_path / "migrated.yaml"
    assert run_rlc("migrate", str(EXAMPLES / "legacy-skyrl.yaml"), "-o", str(migrated)).returncode == 0
    result = run_rlc("diff", str(EXAMPLES / "legacy-skyrl.yaml"), str(migrated))
    assert result.returncode == 0 and "resolve to the same job" in result.stdout


def test_comments_order_and_written_defaults_do_not_count(spec_file):
    a = spec_file(
        "version: 1\ncluster: {gpus_per_node: 8, num_nodes: 1}\ntrainer: {logger: console, seed: 42}\n", "a.yaml"
    )
    b = spec_file(
        """
        # the same job, written differently
        trainer:
          seed: 42          # SkyRL's default, written out
          logger: console
          eval_interval: 5  # default too
        cluster: {num_nodes: 1, gpus_per_node: 8}
        version: 1
        """,
        "b.yaml",
    )
    result = run_rlc("diff", str(a), str(b))
    assert result.returncode == 0, result.stdout


def test_changes_grouped_with_provenance_and_placement(spec_file):
    a = spec_file("version: 1\ncluster: {gpus_per_node: 8, num_nodes: 1}\ntrainer: {logger: console}\n", "a.yaml")
    b = spec_file(
        "version: 1\ncluster: {gpus_per_node: 8, num_nodes: 1}\ntrainer: {logger: console}\n"
        "generator: {inference_engine: {tensor_parallel_size: 2}}\n",
        "b.yaml",
    )
    result = run_rlc("diff", str(a), str(b), "--format", "json")
    assert result.returncode == 1
    body = json.loads(result.stdout)
    changes = {c["key"]: c for c in body["changes"]}
    tp = changes["generator.inference_engine.tensor_parallel_size"]
    assert (tp["old"], tp["new"]) == (1, 2) and tp["old_origin"] == "default" and tp["new_origin"].startswith("spec ")
    engines = changes["generator.inference_engine.num_engines"]
    assert (engines["old"], engines["new"]) == (8, 4) and engines["new_origin"].startswith("derived from")
    assert engines["section"] == "generator.inference_engine"
    assert any(line.startswith("engine 4: removed") for line in body["placement"])
    text = run_rlc("diff", str(a), str(b)).stdout
    assert "[generator.inference_engine]" in text and "[placement]" in text


def test_overrides_apply_to_both_sides():
    spec = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
    assert run_rlc("diff", str(spec), str(spec), "trainer.seed=3").returncode == 0


def test_a_broken_side_reports_its_errors(spec_file):
    good = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
    bad = spec_file("version: 1\ntrainer: {train_batch_size: 1000}\n")
    result = run_rlc("diff", str(good), str(bad))
    assert result.returncode == 1 and "RLC-E105" in result.stderr

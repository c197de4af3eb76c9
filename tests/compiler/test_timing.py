"""`rlc plan`'s time and cost estimate: every phase of a step, the run's totals, and every assumption overridable."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.compiler.pipeline import compile_job
from rlc.compiler.timing import PRICES, estimate_time
from rlc.core.overrides import parse_override

GSM8K = str(EXAMPLES / "gsm8k-grpo-8xh100.yaml")


def _time(*overrides: str, spec: str = GSM8K):
    result = compile_job(spec, [parse_override(o) for o in overrides])
    assert result.ok, [d.message for d in result.diagnostics]
    return estimate_time(result.spec, result.plan, result.memory)


def test_every_phase_and_the_run_with_its_price():
    est = _time("estimate.dataset_rows=7473")
    assert [p.name for p in est.phases] == ["generate", "log-prob forwards", "train", "weight sync", "overhead"]
    assert all(p.seconds > 0 for p in est.phases) and est.step_s == pytest.approx(sum(p.seconds for p in est.phases))
    assert est.steps == 20 * (7473 // 1024)  # epochs x the batches of the data
    assert est.gpus == 8 and est.price == PRICES["H100"]
    assert est.gpu_hours == pytest.approx(est.steps * est.step_s / 3600 * 8)
    assert est.cost == pytest.approx(est.gpu_hours * PRICES["H100"])


def test_each_assumption_moves_its_phase():
    base = {p.name: p.seconds for p in _time().phases}
    faster = {p.name: p.seconds for p in _time("estimate.train_mfu=0.7").phases}
    assert faster["train"] == pytest.approx(base["train"] / 2)
    assert faster["log-prob forwards"] == pytest.approx(base["log-prob forwards"] / 2)
    assert faster["generate"] == base["generate"]
    longer = {p.name: p.seconds for p in _time("estimate.response_fill=1.0").phases}
    assert longer["generate"] > 1.5 * base["generate"] and longer["train"] > base["train"]
    assert _time("estimate.step_overhead_s=0").phases[-1].seconds == 0
    priced = _time("estimate.gpu_hour_price=1.5", "trainer.max_training_steps=100")
    assert priced.price == 1.5 and priced.cost == pytest.approx(priced.gpu_hours * 1.5)
    assert priced.steps == 100
    # gradient checkpointing runs the forward twice (8 x params x tokens, not 6), and turns off prompt sharing: a group's
    # 5 rows of 256 prompt + 512 response tokens train as 256 + 5 x 512 without it
    plain = {p.name: p.seconds for p in _time("trainer.gradient_checkpointing=false").phases}
    assert plain["train"] == pytest.approx(base["train"] * 6 / 8 * (256 + 5 * 512) / (5 * (256 + 512)))


def test_without_a_step_count_or_a_price_the_run_says_what_to_set(tmp_path):
    est = _time("cluster.accelerator=L4", "trainer.policy.model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert est.steps is None and est.cost is None
    result = run_rlc("plan", GSM8K, "--svg", str(tmp_path / "p.svg"))
    assert result.returncode == 0, result.stderr
    assert "set trainer.max_training_steps or estimate.dataset_rows" in result.stdout
    assert "by phase: generate" in result.stdout and "assumptions: device H100" in result.stdout
    data = json.loads(
        run_rlc(
            "plan", GSM8K, "estimate.dataset_rows=7473", "--format", "json", "--svg", str(tmp_path / "p.svg")
        ).stdout
    )
    assert set(data["time"]["phases"]) == {"generate", "log-prob forwards", "train", "weight sync", "overhead"}
    assert data["time"]["cost"] > 0 and "https://" in data["time"]["price_source"]


def test_explain_time_names_every_assumption():
    result = run_rlc("explain", "time")
    assert result.returncode == 0
    for key in ("estimate.gpu_hour_price", "estimate.train_mfu", "estimate.response_fill", "estimate.link_gbs"):
        assert key in result.stdout

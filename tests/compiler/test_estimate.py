"""`rlc plan`'s time and cost estimate: every phase of a step, the run's totals, and every assumption overridable."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, run_rlc
from rlc.compiler.estimate import CPU, PRICES, _drain, estimate_time, lengths
from rlc.compiler.pipeline import compile_job
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
    assert longer["generate"] > 1.3 * base["generate"] and longer["train"] > base["train"]
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


LOCAL_CPU = str(EXAMPLES / "local-cpu.yaml")


def test_accelerator_none_takes_the_cpu_profile_and_its_calls_add_up():
    est = _time(spec=LOCAL_CPU)
    a = est.assumptions
    assert a["device"] == "CPU" and a["peak_tflops"] == CPU.tflops and a["memory_bandwidth_gbs"] == CPU.bandwidth_gbs
    assert a["decode_step_overhead_ms"] == CPU.decode_step_ms and a["step_overhead_s"] == CPU.step_overhead_s
    assert a["call_overhead_ms"] == CPU.call_ms > 0 and est.gpus == 0 and est.cost is None
    assert est.step_s == pytest.approx(sum(p.seconds for p in est.phases))
    # each call into the workers costs the profile's call_ms: one generate, one train mini-batch, one weight sync
    base = {p.name: p.seconds for p in est.phases}
    bare = {p.name: p.seconds for p in _time("estimate.call_overhead_ms=0", spec=LOCAL_CPU).phases}
    call = CPU.call_ms / 1000
    for name, calls in {"generate": 1, "log-prob forwards": 0, "train": 1, "weight sync": 1, "overhead": 0}.items():
        assert base[name] == pytest.approx(bare[name] + calls * call), name
    # 4 mini-batches of 4 prompts: 4 train calls, and the policy's old log-probs take a forward call
    minis = ("trainer.policy_mini_batch_size=4", "trainer.micro_train_batch_size_per_gpu=32")
    split = {p.name: p.seconds for p in _time(*minis, spec=LOCAL_CPU).phases}
    bare = {p.name: p.seconds for p in _time(*minis, "estimate.call_overhead_ms=0", spec=LOCAL_CPU).phases}
    assert split["train"] == pytest.approx(bare["train"] + 4 * call)
    assert split["log-prob forwards"] == pytest.approx(bare["log-prob forwards"] + call)


def test_a_gpu_profile_counts_its_calls_in_the_step_overhead():
    base = _time()
    assert base.assumptions["call_overhead_ms"] == 0
    called = {p.name: p.seconds for p in _time("estimate.call_overhead_ms=100").phases}
    plain = {p.name: p.seconds for p in base.phases}
    assert called["weight sync"] == pytest.approx(plain["weight sync"] + 0.1)
    assert called["log-prob forwards"] == pytest.approx(plain["log-prob forwards"] + 2 * 0.1)  # ref and policy


MULTITURN = str(EXAMPLES / "local-cpu-multiturn.yaml")


def test_a_multi_turn_row_is_its_prompt_its_turns_and_the_answers_between():
    # max_prompt_length 384 bounds the first prompt; max_input_length 640 the whole conversation; max_turns 4
    n = lengths(compile_job(MULTITURN).spec)
    assert (n.prompt, n.response, n.turns, n.observation) == (192, 24, 2.0, 24) and n.multi
    assert n.after == 2 * 24 + 24  # two responses and the answer between them
    set_ = lengths(
        compile_job(
            MULTITURN, [parse_override("estimate.turns=3"), parse_override("estimate.observation_tokens=10")]
        ).spec
    )
    assert (set_.turns, set_.after) == (3.0, 3 * 24 + 2 * 10)
    # no more turns than fit before the conversation passes max_input_length: (640 - 192) / (24 + 200) + 1 = 3
    long = lengths(
        compile_job(
            MULTITURN, [parse_override("estimate.turns=4"), parse_override("estimate.observation_tokens=200")]
        ).spec
    )
    assert long.turns == pytest.approx(3.0)
    single = lengths(compile_job(LOCAL_CPU).spec)
    assert single.turns == 1 and single.after == single.response and not single.multi


def test_training_sees_every_turn_and_generation_prefills_each_prompt_once():
    base = _time(spec=MULTITURN)
    bare = {p.name: p.seconds for p in base.phases}
    more = {p.name: p.seconds for p in _time("estimate.observation_tokens=96", spec=MULTITURN).phases}
    # 8 prompts of 192 tokens shared by their groups, 64 rows of 2 x 24 + 24 after them; then 96-token answers
    assert more["train"] - 0.01 == pytest.approx((bare["train"] - 0.01) * (8 * 192 + 64 * 144) / (8 * 192 + 64 * 72))
    assert "x 2 turns" in base.phases[0].how and "+ 2 call(s)" in base.phases[0].how
    # the hf engine runs a group's prompt once: 8 prompts, not 64 rows, then each later turn's new tokens
    assert f"({8 * 192 + 64 * (24 + 24)} tokens an engine)" in base.phases[0].how
    # vLLM runs every sample's prompt; a later turn runs its new tokens (the last response, the answer), or the whole
    # context again without the prefix cache: 640 rows an engine, prompts of 256, 2 turns of 512, no answer tokens
    multi = (
        "generator.batched=false",
        "generator.max_turns=3",
        "generator.max_input_length=4096",
        "estimate.turns=2",
        "estimate.observation_tokens=0",
    )
    assert f"({640 * 256 + 640 * 512} tokens an engine)" in _time(*multi).phases[0].how
    plain = _time(*multi, "generator.inference_engine.enable_prefix_caching=false")
    assert f"({640 * 256 + 640 * (256 + 512)} tokens an engine)" in plain.phases[0].how


def test_a_mixture_of_experts_counts_the_experts_a_token_runs_through():
    dense = _time("trainer.policy.model.path=Qwen/Qwen3-8B")
    moe = _time("trainer.policy.model.path=Qwen/Qwen3-30B-A3B")
    assert "3.35B params" in moe.phases[2].how  # of 30.5B: 8 of 128 experts a token
    assert moe.phases[2].seconds < dense.phases[2].seconds
    assert moe.phases[3].seconds > dense.phases[3].seconds  # the weight sync sends all 30.5B


def test_the_rows_an_update_leaves_out_are_not_trained_where_the_trainer_leaves_them_out():
    every = {p.name: p.seconds for p in _time("estimate.inert_fraction=0", spec=MULTITURN).phases}
    inert = _time("estimate.inert_fraction=0.625", spec=MULTITURN)
    call = CPU.call_ms / 1000
    assert inert.phases[2].seconds - call == pytest.approx((every["train"] - call) * 0.375)
    assert inert.assumptions["inert_fraction"] == 0.625 and "0.375 of the policy's rows" in inert.phases[2].how
    # a KL loss is fed by every row: none is left out, whatever the assumption says
    kl = _time("estimate.inert_fraction=0.625", "trainer.algorithm.use_kl_loss=true", spec=MULTITURN)
    assert kl.phases[2].seconds == pytest.approx(every["train"]) and "inert_fraction" not in kl.assumptions


def test_unstated_inert_rows_are_expected_of_groups_of_a_right_or_wrong_reward():
    """The calculator's reward is 1 or 0 and GRPO measures a row against its group: of groups of 8, 2/9 are expected
    to agree. A graded reward, a KL in the reward, normalised advantages, refilled groups or another estimator expect
    none; a stated share wins."""
    call = CPU.call_ms / 1000
    every = _time("estimate.inert_fraction=0", spec=MULTITURN).phases[2].seconds - call
    written = _time(spec=MULTITURN)
    assert written.assumptions["inert_fraction"] == round(2 / 9, 3)
    assert written.phases[2].seconds - call == pytest.approx(every * 7 / 9)
    assert "0.778 of the policy's rows (the rest inert, expected)" in written.phases[2].how
    four = _time("generator.n_samples_per_prompt=4", "estimate.inert_fraction=0", spec=MULTITURN)
    assert _time("generator.n_samples_per_prompt=4", spec=MULTITURN).phases[2].seconds - call == pytest.approx(
        (four.phases[2].seconds - call) * 3 / 5
    )
    for change in (
        "environment.env_class=gsm8k_multi_turn",  # a format score each turn: graded
        "trainer.algorithm.use_kl_in_reward=true",
        "trainer.algorithm.advantage_batch_normalize=true",
        "trainer.algorithm.dynamic_sampling.type=filter",
        "trainer.algorithm.advantage_estimator=reinforce++",
        "trainer.algorithm.use_kl_loss=true",
    ):
        est = _time(change, spec=MULTITURN)
        assert "inert_fraction" not in est.assumptions, change
    stated = _time("estimate.inert_fraction=0.5", spec=MULTITURN)
    assert "(the rest inert, estimate.inert_fraction)" in stated.phases[2].how


def test_the_expected_share_is_the_mean_chance_that_a_group_agrees():
    """2/(n+1) is the mean over a success rate p, uniform on [0, 1], of p^n + (1-p)^n: every sample right or every
    one wrong (the midpoint rule over a fine grid)."""
    from rlc.compiler.estimate import expected_inert

    grid = [(i + 0.5) / 20000 for i in range(20000)]
    for n in (2, 5, 8, 16):
        agree = sum(p**n + (1 - p) ** n for p in grid) / len(grid)
        spec = compile_job(MULTITURN, [parse_override(f"generator.n_samples_per_prompt={n}")]).spec
        assert expected_inert(spec) == pytest.approx(agree, rel=1e-6), n


def test_a_batch_decodes_until_its_longest_row_ends():
    """Response lengths spread evenly over a range with the stated mean and none past the limit: the longest of k rows
    is the range's k/(k+1) point, the rows end at an even pace, and the row-steps they decode add up to the mean's."""
    longest, active = _drain(10, 100, 9)  # lengths over [0, 20]
    assert longest == pytest.approx(18) and active(0) == 9 and active(5) == pytest.approx(6.75)
    longest, active = _drain(80, 100, 9)  # over [60, 100]: every row decodes for 60 steps
    assert longest == pytest.approx(96) and active(59) == 9 and active(80) == pytest.approx(4.5)
    assert _drain(100, 100, 9)[0] == 100  # every row at the limit
    for mean, limit, rows in ((24, 48, 64), (287, 1024, 1024), (400, 500, 640)):
        longest, active = _drain(mean, limit, rows)
        steps = 20000
        decoded = sum(active((i + 0.5) * longest / steps) for i in range(steps)) * longest / steps
        assert decoded == pytest.approx(rows * mean, rel=0.02), (mean, limit, rows)
    # GSM8K's default rows (mean 512 of 1024, 640 rows an engine): 1022 steps, not the mean's 512, at a cost between
    # every row running the mean's steps and every row running to the limit
    gen = _time().phases[0]
    assert "1022 steps (mean 512)" in gen.how
    full = _time("estimate.response_fill=1.0").phases[0].seconds
    assert _time("estimate.response_fill=0.5").phases[0].seconds < full


def test_what_an_estimator_reads_is_counted_where_it_is_made():
    """remax's greedy response per prompt is generated beside the step's rows; the optimal token baselines read the
    policy's old-log-prob pass, which a step of one optimizer step otherwise skips."""
    one_step = ("trainer.policy_mini_batch_size=1024",)
    base = {p.name: p for p in _time(*one_step).phases}
    remax = {p.name: p for p in _time(*one_step, "trainer.algorithm.advantage_estimator=remax").phases}
    otb = {p.name: p for p in _time(*one_step, "trainer.algorithm.advantage_estimator=optimal_token_baseline").phases}
    assert remax["generate"].seconds > base["generate"].seconds
    assert otb["generate"].seconds == base["generate"].seconds
    assert "policy" not in base["log-prob forwards"].how and "policy" in otb["log-prob forwards"].how
    assert otb["log-prob forwards"].seconds > base["log-prob forwards"].seconds

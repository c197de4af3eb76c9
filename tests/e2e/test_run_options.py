"""Every algorithm option of the spec in a short seeded `rlc run` of the local example.

Split from test_run.py so that the two files' end-to-end runs can go to different pytest-xdist workers.
"""

from __future__ import annotations

import pytest
from conftest import run_rlc
from test_run import _args, _metrics

pytest.importorskip("ray")
pytest.importorskip("transformers")
pytest.importorskip("torch")

ALG = "trainer.algorithm"
OPC = f"{ALG}.off_policy_correction"
SMALL_BATCH = (
    "trainer.train_batch_size=4",
    "trainer.policy_mini_batch_size=4",
    "trainer.micro_train_batch_size_per_gpu=32",
    "trainer.micro_forward_batch_size_per_gpu=32",
)

# Every algorithm option of the spec, each in a short seeded run of the local example: (overrides, metrics every
# step must log, a check over all steps' metrics). The bf16 engine makes the rollout log-probs differ a little
# from the fp32 trainer's, as vLLM's do, so importance ratios are not all exactly 1.
OPTION_RUNS = {
    "gspo + token TIS + geometric mask + zero-variance filter + overlong filter": (
        (
            "generator.inference_engine.model_dtype=bfloat16",
            f"{ALG}.policy_loss_type=gspo",
            f"{OPC}.tis_ratio_type=token",
            f"{OPC}.token_tis_ratio_clip_high=1.001",
            f"{OPC}.sequence_mask_metric=geometric",
            f"{OPC}.geo_mask_high=1.001",
            f"{OPC}.geo_mask_low=0.999",
            f"{ALG}.zero_variance_filter=true",
            "generator.apply_overlong_filtering=true",
        ),
        (
            "ratio_mean",
            "off_policy/is_ratio_mean",
            "off_policy/tis_token_clip_high_ratio",
            "off_policy/geo_sequence_mask_masked_ratio",
            "zero_variance_fraction",
            "overlong_filtered_fraction",
            "inert_row_fraction",
        ),
        lambda ms: (
            any(m["off_policy/tis_token_clip_high_ratio"] > 0 for m in ms)
            and any(m["off_policy/geo_sequence_mask_masked_ratio"] > 0 for m in ms)
            and any(m["off_policy/is_ratio_max"] != 1.0 for m in ms)
        ),
    ),
    "cispo + sequence TIS + product mask + dynamic sampling filter": (
        (
            "generator.inference_engine.model_dtype=bfloat16",
            f"{ALG}.policy_loss_type=cispo",
            f"{OPC}.tis_ratio_type=sequence",
            f"{OPC}.sequence_tis_ratio_clip_high=1.001",
            f"{OPC}.sequence_mask_metric=product",
            f"{OPC}.product_mask_high=1.003",
            f"{OPC}.product_mask_low=0.997",
            f"{ALG}.dynamic_sampling.type=filter",
            f"{ALG}.dynamic_sampling.max_sample_batches=-1",
            *SMALL_BATCH,
        ),
        (
            "clipped_ratio_mean",
            "off_policy/tis_seq_clip_high_ratio",
            "off_policy/product_sequence_mask_masked_ratio",
            "dynamic_sampling/sample_batches",
            "dynamic_sampling/kept_groups",
        ),
        lambda ms: (
            all(m["dynamic_sampling/kept_groups"] == 4 for m in ms)
            and any(m["dynamic_sampling/sample_batches"] > 1 for m in ms)
            and any(m["off_policy/tis_seq_clip_high_ratio"] > 0 for m in ms)
        ),
    ),
    "sapo + dynamic sampling replace": (
        (
            f"{ALG}.policy_loss_type=sapo",
            f"{ALG}.dynamic_sampling.type=replace",
            f"{ALG}.dynamic_sampling.min_replace_ratio=0.05",
        ),
        ("gate_weight_mean", "dynamic_sampling/replaced_groups"),
        lambda ms: all(m["dynamic_sampling/replaced_groups"] + m["dynamic_sampling/kept_groups"] == 16 for m in ms),
    ),
    "clip_cov + adaptive KL in reward + rloo": (
        (
            f"{ALG}.policy_loss_type=clip_cov",
            f"{ALG}.use_kl_loss=false",
            f"{ALG}.use_kl_in_reward=true",
            f"{ALG}.kl_ctrl.type=adaptive",
            f"{ALG}.advantage_estimator=rloo",
        ),
        ("cov_clip_fraction", "kl_in_reward", "kl_coef"),
        # The KL stays far under kl_target (0.1), so the adaptive controller lowers the coefficient every step.
        lambda ms: all(b["kl_coef"] < a["kl_coef"] for a, b in zip(ms[1:], ms[2:])) and ms[-1]["kl_in_reward"] > 0,
    ),
    "kl_cov + batch-normalized advantages + outlier and token masks + zero reward without a stop": (
        (
            "generator.inference_engine.model_dtype=bfloat16",
            f"{ALG}.policy_loss_type=kl_cov",
            f"{ALG}.advantage_batch_normalize=true",
            "generator.zero_reward_on_non_stop=true",
            f"{OPC}.outlier_token_is_threshold_low=0.5",
            f"{OPC}.outlier_token_is_threshold_high=2.0",
            f"{OPC}.token_mask_is_threshold_low=0.999",
            f"{OPC}.token_mask_is_threshold_high=1.001",
        ),
        (
            "kl_cov_fraction",
            "off_policy/outlier_seq_masked_ratio",
            "off_policy/token_mask_ratio",
            "zeroed_non_stop_fraction",
        ),
        # Only completions that stopped (1.0 at most each) keep a reward.
        lambda ms: (
            all(m["kl_cov_fraction"] > 0 for m in ms)
            and any(m["off_policy/token_mask_ratio"] > 0 for m in ms)
            and any(m["zeroed_non_stop_fraction"] > 0 for m in ms)
            and all(m["reward"] <= m["stop_fraction"] for m in ms)
        ),
    ),
    "an extension's policy loss and advantage estimator (entry points)": (
        (
            f"{ALG}.policy_loss_type=demo_loss",
            f"{ALG}.advantage_estimator=demo_advantage",
            f"{ALG}.demo_bonus_coef=0.01",
        ),
        ("demo_ratio_mean",),
        lambda ms: all(m["demo_ratio_mean"] == pytest.approx(1.0) for m in ms),
    ),
    "Ulysses sequence parallelism for the policy and the ref, micro-batches cut by a token budget": (
        (
            "cluster.gpus_per_node=2",
            "trainer.policy.sequence_parallel_size=2",
            "trainer.ref.sequence_parallel_size=2",
            f"{ALG}.use_kl_loss=true",
            "trainer.max_tokens_per_microbatch=64",
        ),
        ("kl", "grad_norm"),
        # One sequence-parallel group of two ranks per role: its first rank's results are the step's.
        lambda ms: all(m["grad_norm"] > 0 for m in ms) and any(m["kl"] > 0 for m in ms[1:]),
    ),
    "fully async: generation runs ahead by at most max_staleness_steps": (
        (
            "cluster.gpus_per_node=2",
            "trainer.placement.colocate_all=false",
            "trainer.fully_async.enabled=true",
            "trainer.fully_async.max_staleness_steps=2",
            "trainer.fully_async.num_parallel_generation_workers=48",
        ),
        ("async/staleness",),
        lambda ms: all(m["async/staleness"] <= 2 for m in ms) and max(m["async/staleness"] for m in ms) == 2,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OPTION_RUNS))
def test_algorithm_option_runs(tmp_path, run_env, name):
    overrides, keys, check = OPTION_RUNS[name]
    if "demo_loss" in " ".join(overrides):
        pytest.importorskip("rlc_ext_demo", reason="the demo extension (tests/fixtures/rlc-ext-demo) is not installed")
    steps = 5
    result = run_rlc(
        "run",
        *_args(tmp_path, steps * 16, "trainer.ckpt_interval=-1", "trainer.epochs=1", *overrides),
        env=run_env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert len(metrics) >= 3
    for m in metrics:
        missing = [k for k in keys if k not in m]
        assert not missing, (m["step"], missing)
    assert check(metrics), metrics

"""Off-policy correction (TIS weights and masks) against values worked out by hand on tiny tensors.

Log-probs are built as log(ratio) against a rollout log-prob of 0, so every token's ratio is the
number written in the test; NAN/INF sit only in masked slots and must never show up in a result.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from rlc.core.runtime_facts import off_policy_section_corrects as is_active  # noqa: E402
from rlc.runtime.algorithms.off_policy import off_policy_correction, options_from_config  # noqa: E402
from rlc.spec.algorithm import OffPolicyCorrectionConfig  # noqa: E402

F64 = torch.float64
NAN, INF = math.nan, math.inf


def log_probs(ratios):
    """Old log-probs whose ratio to a rollout log-prob of 0 is each given number (NAN stays NAN)."""
    return torch.tensor([[math.log(r) if r == r and r > 0 else r for r in row] for row in ratios], dtype=F64)


def rollout_like(old, masked_value=-INF):
    """Rollout log-probs of 0, with `masked_value` where old is not finite."""
    return torch.where(torch.isfinite(old), 0.0, masked_value).to(F64)


def mask_of(rows):
    return torch.tensor(rows, dtype=torch.float32)


def close(actual, expected, tol=1e-9):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=tol, rtol=0)


def assert_finite(metrics):
    for name, value in metrics.items():
        assert value.dim() == 0 and torch.isfinite(value), name


def test_nothing_configured_gives_weight_one_and_the_same_mask():
    old = log_probs([[2.0, NAN], [0.5, 4.0]])
    mask = mask_of([[1, 0], [1, 1]])
    weight, new_mask, metrics = off_policy_correction(old, rollout_like(old), mask)
    close(weight, torch.ones(2, 2))
    assert torch.equal(new_mask, mask)
    assert metrics == {}


def test_a_single_token_mask_bound_is_not_active_as_in_skyrl():
    old = log_probs([[4.0, 0.25]])
    mask = mask_of([[1, 1]])
    weight, new_mask, metrics = off_policy_correction(old, rollout_like(old), mask, token_mask_is_threshold_low=0.5)
    close(weight, torch.ones(1, 2))
    assert torch.equal(new_mask, mask) and metrics == {}


def test_is_active_follows_skyrl():
    assert not is_active(OffPolicyCorrectionConfig())
    assert is_active(OffPolicyCorrectionConfig(tis_ratio_type="token"))
    assert is_active(OffPolicyCorrectionConfig(sequence_mask_metric="geometric"))
    assert is_active(OffPolicyCorrectionConfig(outlier_token_is_threshold_high=10.0))
    assert not is_active(OffPolicyCorrectionConfig(token_mask_is_threshold_low=0.5))
    assert is_active(OffPolicyCorrectionConfig(token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0))


def test_options_from_config_drive_the_function():
    cfg = OffPolicyCorrectionConfig(tis_ratio_type="token", token_tis_ratio_clip_high=3.0)
    options = options_from_config(cfg)
    assert options["tis_ratio_type"] == "token" and options["token_tis_ratio_clip_high"] == 3.0
    old = log_probs([[4.0, 2.0]])
    weight, _, _ = off_policy_correction(old, rollout_like(old), mask_of([[1, 1]]), **options)
    close(weight, [[3.0, 2.0]])


def test_token_tis_caps_each_ratio_and_ignores_masked_slots():
    old = log_probs([[4.0, 0.5, 2.0, NAN], [1.0, 1.0, 3.0, 3.0]])
    rollout = rollout_like(old)
    rollout[1, 2] = INF  # a masked slot holding inf
    mask = mask_of([[1, 1, 1, 0], [1, 1, 0, 0]])
    weight, new_mask, metrics = off_policy_correction(old, rollout, mask, tis_ratio_type="token")
    # The cap is 2: 4 -> 2, 2 stays 2 (on the cap), masked slots weigh 1.
    close(weight, [[2.0, 0.5, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(new_mask, mask)
    close(metrics["tis_token_clip_high_ratio"], 1 / 5)
    # Valid ratios 4, 0.5, 2, 1, 1: mean 1.7, squared deviations 5.29+1.44+0.09+0.49+0.49 = 7.8.
    close(metrics["is_ratio_mean"], 1.7, tol=1e-6)
    close(metrics["is_ratio_std"], math.sqrt(7.8 / 4), tol=1e-6)
    close(metrics["is_ratio_max"], 4.0, tol=1e-6)
    close(metrics["is_ratio_min"], 0.5, tol=1e-6)
    assert_finite(metrics)


def test_sequence_tis_weighs_every_token_by_the_capped_product():
    old = log_probs([[4.0, 0.5, 2.0], [2.0, 2.0, 2.0], [NAN, NAN, NAN]])
    mask = mask_of([[1, 1, 1], [1, 1, 1], [0, 0, 0]])
    weight, new_mask, metrics = off_policy_correction(old, rollout_like(old, NAN), mask, tis_ratio_type="sequence")
    # Row products: 4*0.5*2 = 4 (under the cap 5); 2*2*2 = 8 -> 5; the empty row weighs 1.
    close(weight, [[4.0] * 3, [5.0] * 3, [1.0] * 3])
    assert torch.equal(new_mask, mask)
    close(metrics["tis_seq_clip_high_ratio"], 1 / 3)
    assert_finite(metrics)


def test_geometric_mask_keeps_rows_on_the_bounds():
    old = log_probs(
        [
            [2.0, 2.0, NAN],  # geometric mean 2: on the upper bound, kept
            [0.5, NAN, NAN],  # 0.5: on the lower bound, kept
            [4.0, 1.0, 4.0],  # (4*1*4)^(1/3) = 2.52 > 2: masked
            [0.25, 0.25, NAN],  # 0.25 < 0.5: masked
            [4.0, 0.25, NAN],  # 1: kept
        ]
    )
    mask = mask_of([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]])
    weight, new_mask, metrics = off_policy_correction(
        old, rollout_like(old, NAN), mask, sequence_mask_metric="geometric", geo_mask_low=0.5, geo_mask_high=2.0
    )
    close(weight, torch.ones(5, 3))
    assert torch.equal(new_mask, mask_of([[1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0], [1, 1, 0]]))
    close(metrics["geo_sequence_mask_masked_ratio"], 2 / 5)
    close(metrics["geo_sequence_mask_over_high_ratio"], 1 / 5)
    close(metrics["geo_sequence_mask_under_low_ratio"], 1 / 5)


def test_geometric_mask_defaults_are_a_narrow_band_around_one():
    old = log_probs([[2.0, 0.5], [1.02, 1.0], [0.98, 1.0]])
    mask = mask_of([[1, 1], [1, 1], [1, 1]])
    _, new_mask, _ = off_policy_correction(old, rollout_like(old), mask, sequence_mask_metric="geometric")
    # Means 1, sqrt(1.02) = 1.00995 (inside 1.01) and sqrt(0.98) = 0.98995 (below 0.99).
    assert torch.equal(new_mask, mask_of([[1, 1], [1, 1], [0, 0]]))


def test_product_mask_and_a_fully_masked_row():
    old = log_probs(
        [
            [2.0, 1.0],  # product 2: on the upper bound, kept
            [0.5, NAN],  # 0.5: on the lower bound, kept
            [2.0, 2.0],  # 4 > 2: masked
            [0.5, 0.5],  # 0.25 < 0.5: masked
            [NAN, NAN],  # no tokens: product 1, stays empty
        ]
    )
    mask = mask_of([[1, 1], [1, 0], [1, 1], [1, 1], [0, 0]])
    _, new_mask, metrics = off_policy_correction(old, rollout_like(old, INF), mask, sequence_mask_metric="product")
    assert torch.equal(new_mask, mask_of([[1, 1], [1, 0], [0, 0], [0, 0], [0, 0]]))
    close(metrics["product_sequence_mask_masked_ratio"], 2 / 5)
    close(metrics["product_sequence_mask_over_high_ratio"], 1 / 5)
    close(metrics["product_sequence_mask_under_low_ratio"], 1 / 5)
    assert_finite(metrics)


def test_outlier_tokens_mask_their_whole_row():
    old = log_probs(
        [
            [2.0, 0.5, 1.0],  # on both bounds: kept
            [1.0, 4.0, 1.0],  # 4 > 2: masked
            [0.25, 1.0, 1.0],  # 0.25 < 0.5: masked
            [1.0, 1.0, 100.0],  # the outlier sits in a masked slot: kept
        ]
    )
    mask = mask_of([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]])
    rollout = rollout_like(old)
    options = dict(outlier_token_is_threshold_low=0.5, outlier_token_is_threshold_high=2.0)
    _, new_mask, metrics = off_policy_correction(old, rollout, mask, **options)
    assert torch.equal(new_mask, mask_of([[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 0]]))
    close(metrics["outlier_seq_masked_ratio"], 2 / 4)
    close(metrics["outlier_seq_over_high_ratio"], 1 / 4)
    close(metrics["outlier_seq_under_low_ratio"], 1 / 4)
    # One bound alone is enough.
    _, high_only, _ = off_policy_correction(old, rollout, mask, outlier_token_is_threshold_high=2.0)
    assert torch.equal(high_only, mask_of([[1, 1, 1], [0, 0, 0], [1, 1, 1], [1, 1, 0]]))


def test_token_mask_drops_only_the_tokens_outside_the_band():
    old = log_probs([[2.0, 4.0, 0.5, 0.25], [1.0, 1.0, NAN, NAN]])
    mask = mask_of([[1, 1, 1, 1], [1, 1, 0, 0]])
    _, new_mask, metrics = off_policy_correction(
        old, rollout_like(old, NAN), mask, token_mask_is_threshold_low=0.5, token_mask_is_threshold_high=2.0
    )
    assert torch.equal(new_mask, mask_of([[1, 0, 1, 0], [1, 1, 0, 0]]))
    close(metrics["token_mask_ratio"], 2 / 6)


def test_tis_and_sequence_masks_read_the_mask_left_by_the_token_mask():
    old = log_probs([[2.0, 4.0, 2.0], [2.0, 8.0, 1.0]])
    mask = mask_of([[1, 1, 1], [1, 1, 1]])
    weight, new_mask, _ = off_policy_correction(
        old,
        rollout_like(old),
        mask,
        token_mask_is_threshold_low=0.5,
        token_mask_is_threshold_high=2.0,
        tis_ratio_type="sequence",
        sequence_mask_metric="product",
        product_mask_high=4.0,
    )
    # 4 and 8 are dropped first: row products become 2*2 = 4 (cap 5 untouched, on the product bound)
    # and 2*1 = 2; with them the products would have been 16 and 16.
    close(weight, [[4.0] * 3, [2.0] * 3])
    assert torch.equal(new_mask, mask_of([[1, 0, 1], [1, 0, 1]]))


def test_huge_log_ratios_are_clamped_before_exp():
    old = torch.tensor([[100.0, -100.0], [15.0, 15.0]], dtype=F64)
    rollout = torch.zeros_like(old)
    mask = mask_of([[1, 1], [1, 1]])
    weight, _, metrics = off_policy_correction(old, rollout, mask, tis_ratio_type="token")
    close(weight, [[2.0, math.exp(-20.0)], [2.0, 2.0]], tol=1e-15)
    assert math.isclose(float(metrics["is_ratio_max"]), math.exp(20.0), rel_tol=1e-6)
    weight, _, metrics = off_policy_correction(old, rollout, mask, tis_ratio_type="sequence")
    # Row log sums 0 and 30 (clamped to 20 before exp, then capped at 5).
    close(weight, [[1.0, 1.0], [5.0, 5.0]])
    assert_finite(metrics)


def test_a_fully_masked_batch_leaks_nothing():
    old = torch.full((2, 3), NAN, dtype=F64)
    rollout = torch.full((2, 3), INF, dtype=F64)
    mask = mask_of([[0, 0, 0], [0, 0, 0]])
    weight, new_mask, metrics = off_policy_correction(
        old,
        rollout,
        mask,
        tis_ratio_type="sequence",
        sequence_mask_metric="geometric",
        outlier_token_is_threshold_low=0.5,
        token_mask_is_threshold_low=0.5,
        token_mask_is_threshold_high=2.0,
    )
    close(weight, torch.ones(2, 3))
    assert torch.equal(new_mask, mask)
    assert_finite(metrics)
    assert all(float(v) == 0.0 for v in metrics.values())


def test_weight_is_detached_and_mask_keeps_its_dtype():
    old = log_probs([[4.0, 1.0]]).requires_grad_()
    bool_mask = torch.tensor([[True, True]])
    weight, new_mask, _ = off_policy_correction(
        old,
        torch.zeros(1, 2, dtype=F64),
        bool_mask,
        tis_ratio_type="token",
        token_mask_is_threshold_low=0.5,
        token_mask_is_threshold_high=2.0,
    )
    assert not weight.requires_grad and weight.dtype == F64
    assert new_mask.dtype == torch.bool and new_mask.tolist() == [[False, True]]


def test_unknown_options_are_refused():
    old = log_probs([[1.0]])
    with pytest.raises(ValueError, match="tis_ratio_type"):
        off_policy_correction(old, old, mask_of([[1]]), tis_ratio_type="tokens")
    with pytest.raises(ValueError, match="sequence_mask_metric"):
        off_policy_correction(old, old, mask_of([[1]]), sequence_mask_metric="mean")

"""The KL-in-reward coefficient controller: fixed never moves; adaptive moves towards the target, at most 20%
of n_rows / horizon per update (SkyRL's AdaptiveKLController)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from rlc.runtime.algorithms.kl import KLController  # noqa: E402
from rlc.spec.algorithm import AlgorithmConfig  # noqa: E402


def test_a_fixed_controller_never_moves():
    ctrl = KLController("fixed", 0.05, target=0.1, horizon=100)
    for kl in (0.0, 0.1, 5.0, 1e9):
        assert ctrl.update(kl, 64) == 0.05
    assert ctrl.value == 0.05


@pytest.mark.parametrize("kl, direction", [(0.5, 1), (0.11, 1), (0.02, -1), (0.0, -1)])
def test_an_adaptive_controller_moves_towards_the_target(kl, direction):
    ctrl = KLController("adaptive", 0.05, target=0.1, horizon=1000)
    before = ctrl.value
    after = ctrl.update(kl, 100)
    assert (after - before) * direction > 0


def test_one_update_moves_by_at_most_the_clip():
    ctrl = KLController("adaptive", 1.0, target=0.1, horizon=1000)
    assert ctrl.update(100.0, 100) == pytest.approx(1.0 * (1 + 0.2 * 100 / 1000))  # far above: +20% of 0.1
    ctrl = KLController("adaptive", 1.0, target=0.1, horizon=1000)
    assert ctrl.update(0.0, 100) == pytest.approx(1.0 * (1 - 0.2 * 100 / 1000))
    ctrl = KLController("adaptive", 1.0, target=0.1, horizon=1000)
    assert ctrl.update(0.11, 100) == pytest.approx(1.0 * (1 + 0.1 * 100 / 1000))  # inside the clip: proportional


def test_at_the_target_it_stays_and_repeated_updates_settle_towards_it():
    ctrl = KLController("adaptive", 0.3, target=0.1, horizon=10)
    assert ctrl.update(0.1, 5) == pytest.approx(0.3)
    # a KL that grows with the coefficient (kl = coef / 3): the coefficient converges where kl hits the target
    for _ in range(200):
        ctrl.update(ctrl.value / 3, 5)
    assert ctrl.value / 3 == pytest.approx(0.1, rel=1e-3)


def test_a_nan_kl_or_a_zero_target_cannot_break_it():
    ctrl = KLController("adaptive", 0.05, target=0.1, horizon=100)
    assert ctrl.update(math.nan, 10) == 0.05 and ctrl.update(math.inf, 10) == 0.05
    zero = KLController("adaptive", 0.05, target=0.0, horizon=100)
    assert zero.update(0.01, 10) == pytest.approx(0.05 * 1.02) and zero.update(0.0, 10) == pytest.approx(0.05 * 1.02)


def test_it_is_built_from_the_specs_knobs():
    alg = AlgorithmConfig()
    alg.kl_loss_coef, alg.kl_ctrl.type, alg.kl_ctrl.kl_target, alg.kl_ctrl.horizon = 0.02, "adaptive", 0.5, 200
    ctrl = KLController.from_algorithm(alg)
    assert (ctrl.kind, ctrl.value, ctrl.target, ctrl.horizon) == ("adaptive", 0.02, 0.5, 200)
    assert KLController.from_algorithm(AlgorithmConfig()).kind == "fixed"

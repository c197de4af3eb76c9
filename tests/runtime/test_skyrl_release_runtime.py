"""The SkyRL 0.4 settings the runtime runs: max_training_steps stops the run, use_expandable_segments sets the
training workers' allocator, zero_variance_filter_tol is the filter's tolerance."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from rlc.compiler.decide import process_envs  # noqa: E402
from rlc.runtime.algorithms.filtering import zero_variance_groups  # noqa: E402
from rlc.runtime.driver import planned_steps  # noqa: E402
from rlc.spec.model import SpecModel  # noqa: E402

MODEL = SpecModel()


def _spec(**sections):
    return MODEL.to_typed({"version": 1, **sections})


def test_max_training_steps_stops_before_the_last_epoch():
    assert planned_steps(10, 3, None) == 30
    assert planned_steps(10, 3, 7) == 7
    assert planned_steps(10, 3, 99) == 30  # never more than the epochs give


def trainer_env(spec) -> dict[str, str]:
    return process_envs(spec).trainer


def test_expandable_segments_reach_the_training_workers_unless_the_user_set_the_allocator():
    assert trainer_env(_spec())["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in trainer_env(_spec(trainer={"use_expandable_segments": False}))
    mine = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "A": 1}
    assert trainer_env(_spec(launch={"trainer_envs": mine})) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128",
        "A": "1",
    }
    assert "PYTORCH_CUDA_ALLOC_CONF" not in trainer_env(_spec(launch={"envs": {"PYTORCH_CUDA_ALLOC_CONF": "x"}}))


def test_zero_variance_tolerance_decides_which_groups_are_flat():
    rewards = torch.tensor([1.0, 1.0005, 0.0, 1.0])
    group = torch.tensor([0, 0, 1, 1])
    assert zero_variance_groups(rewards, group, tol=1e-6).tolist() == [False, False, False, False]
    assert zero_variance_groups(rewards, group, tol=1e-3).tolist() == [True, True, False, False]

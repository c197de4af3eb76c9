"""When a run evaluates: every eval_interval steps, after its last step, and before it trains when asked."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rlc.core.job import EvalSettings, Sampling  # noqa: E402
from rlc.runtime.evaluation import Evaluation  # noqa: E402


@pytest.mark.parametrize(("interval", "before", "due"), [(2, True, [0, 2, 4, 5]), (-1, False, []), (-1, True, [0])])
def test_evaluation_is_due_every_interval_after_the_last_step_and_before_training(interval, before, due):
    settings = EvalSettings(
        interval=interval,
        before_train=before,
        batch_size=1,
        n_samples_per_prompt=1,
        sampling=Sampling(),
        env_class="synthetic",
        dump_to=None,
    )
    evaluation = Evaluation(settings, generate=lambda *a: [], decode=str, tokenizer=None)
    steps = [0] if evaluation.before_training(0) else []
    assert steps + [s for s in range(1, 6) if evaluation.due(s, 5)] == due
    assert not evaluation.before_training(3)  # a resumed run does not evaluate before it goes on

"""trainer.dump_data_batch and trainer.dump_eval_results write what SkyRL writes, where it writes it."""

from __future__ import annotations

import json
import pickle

import pytest

torch = pytest.importorskip("torch")

from rlc.runtime.batch import TrainBatch  # noqa: E402
from rlc.runtime.dumps import dump_eval_results, dump_training_batch  # noqa: E402


def test_a_training_batch_is_pickled_under_dumped_data(tmp_path):
    batch = TrainBatch(
        input_ids=torch.tensor([[5, 6, 7]]),
        attention_mask=torch.ones(1, 3, dtype=torch.long),
        response_ids=torch.tensor([[7]]),
        loss_mask=torch.ones(1, 1),
        rollout_logprobs=torch.tensor([[-0.5]]),
        token_rewards=torch.tensor([[1.0]]),
        group=torch.tensor([0]),
        prompt_len=2,
        advantages=torch.tensor([[0.25]]).requires_grad_(),
    )
    path = dump_training_batch(tmp_path, 3, batch)
    assert path == tmp_path / "dumped_data" / "global_step_3_training_input.pkl"
    with path.open("rb") as f:
        data = pickle.load(f)
    assert data["prompt_len"] == 2 and "old_logprobs" not in data  # what the step did not compute is absent
    torch.testing.assert_close(data["advantages"], torch.tensor([[0.25]]))
    assert not data["advantages"].requires_grad
    assert torch.equal(data["input_ids"], batch.input_ids)


def test_eval_results_are_written_by_data_source_with_the_aggregated_metrics(tmp_path):
    def entry(source, score):
        return {
            "input_prompt": "2+2?",
            "output_response": "4<|im_end|>",
            "score": score,
            "stop_reason": "stop",
            "env_class": "gsm8k",
            "env_extras": {"answer": "4", "data_source": source},
            "data_source": source,
        }

    entries = [entry("openai/gsm8k", 1.0), entry(None, 0.0), entry("openai/gsm8k", 0.0)]
    out = dump_eval_results(tmp_path, 0, entries, {"eval/reward": 1 / 3})
    assert out == tmp_path / "dumped_evals" / "global_step_0_evals"
    assert sorted(p.name for p in out.iterdir()) == ["aggregated_results.jsonl", "openai_gsm8k.jsonl", "unknown.jsonl"]
    lines = [json.loads(x) for x in (out / "openai_gsm8k.jsonl").read_text().splitlines()]
    assert [x["score"] for x in lines] == [1.0, 0.0] and lines[0]["output_response"] == "4<|im_end|>"
    assert json.loads((out / "unknown.jsonl").read_text())["data_source"] == "unknown"
    assert json.loads((out / "aggregated_results.jsonl").read_text()) == {"eval/reward": 1 / 3}
    assert dump_eval_results(tmp_path, None, [], {}).name == "eval_only"

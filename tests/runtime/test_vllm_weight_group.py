"""The vllm engine in a second weight-update group: refused without override, the old group left with it
(over test_vllm_engine's stand-in for vLLM, whose workers run rlc's real extension and gloo groups)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("torch")

from rlc.runtime.inference.vllm import VLLMEngine  # noqa: E402
from rlc.runtime.weight_sync import WeightGroupExists, close_group, init_group, metas_of, send_weights  # noqa: E402
from rlc.runtime.workers.fsdp import free_address  # noqa: E402
from test_vllm_engine import _weights, fake_vllm  # noqa: E402, F401

TIMEOUT = 30


def _join(engine: VLLMEngine, override: bool = False):
    port = free_address()[1]
    with ThreadPoolExecutor(1) as pool:
        trainer = pool.submit(init_group, "127.0.0.1", port, 0, 2, "gloo", timeout_s=TIMEOUT)
        engine.init_weight_group("127.0.0.1", port, 1, 2, "gloo", override_existing=override)
        return port, trainer.result(timeout=TIMEOUT)


def test_a_second_group_is_refused_without_override_and_replaces_the_first_with_it(fake_vllm):  # noqa: F811
    fake_vllm(multiproc=False)
    engine = VLLMEngine("/models/m", engine_args={})
    first, old = _join(engine)
    with pytest.raises(WeightGroupExists, match=f"master is 127.0.0.1:{first}"):
        engine.init_weight_group("127.0.0.1", free_address()[1], 1, 2, "gloo")
    _, new = _join(engine, override=True)
    assert ("collective_rpc", "rlc_close_weight_update_group") in engine.llm.calls
    weights = _weights()
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send_weights, new, weights.items())
        assert engine.receive_weights(metas_of(weights.items()), version=3) == 3
        sent.result(timeout=TIMEOUT)
    assert list(engine.llm.worker.model_runner.model.loaded) == list(weights)
    for group in (old, new):
        close_group(group)

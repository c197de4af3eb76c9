"""rlc's calls into vLLM against vLLM 0.26.0, the release the GPU kit carries (the last one built on the device's
torch 2.11; rlc is written against 0.30).

Both sides are read from sources, nothing of vLLM is imported (tools/vllm_api.py): rlc's from runtime/, 0.26's from
the facts `make gpu-kit` extracted from its wheel into tests/runtime/vllm-0.26-api.json. Where the wheel itself is
at hand (.gpu-deps/wheels/, after `make gpu-kit`), the facts are checked to be what it holds today.
"""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import vllm_api  # noqa: E402

WHEEL = next(iter(sorted((ROOT / ".gpu-deps" / "wheels").glob("vllm-0.26.0-*.whl"))), None)


@pytest.fixture(scope="module")
def known() -> dict:
    return vllm_api.load_facts()


@pytest.fixture(scope="module")
def uses() -> list:
    return vllm_api.rlc_uses()


def test_the_facts_describe_vllm_0_26(known):
    assert known["vllm"] == "0.26.0"


def test_every_vllm_name_rlc_uses_is_in_0_26(known, uses):
    # The scan sees the engine's LLM, the worker it is mixed into, and the layerwise reload.
    owners = {u.owner for u in uses}
    assert {"vllm.entrypoints.llm.LLM", "vllm.v1.worker.gpu_worker.Worker", "vllm.config.parallel.ParallelConfig"} <= (
        owners
    )
    assert vllm_api.problems(uses, known) == []


def test_what_0_26_lacks_is_reached_only_through_a_guard(known, uses):
    """0.30's `reset_lora_state` (runtime/inference/vllm_worker.py) is absent in 0.26: rlc calls it only if there."""
    guarded = [u for u in uses if u.guarded]
    assert ("vllm.v1.worker.gpu_model_runner.GPUModelRunner", "reset_lora_state") in {
        (u.owner, u.name) for u in guarded
    }
    members, _ = vllm_api.members_of(known, "vllm.v1.worker.gpu_model_runner.GPUModelRunner")
    assert "reset_lora_state" not in members and "load_model" in members


UNGUARDED = """
from vllm.config import set_current_vllm_config, no_such_function

class WeightSyncExtension:
    def rlc_finish_weight_update(self):
        self.model_runner.reset_lora_state()
        self.model_runner.model.load_weights(weights=[], strict=True)

class Engine:
    def go(self):
        self.llm.wake_up(tags=["weights"], level=2)
        self.llm.sleep(level=1)
"""


def test_a_call_absent_in_0_26_is_reported_with_its_place(known):
    found = vllm_api.problems(vllm_api.uses_in(UNGUARDED, "x.py"), known)
    assert set(found) == {
        "x.py:2: vllm.config has no 'no_such_function' in vLLM 0.26.0",
        "x.py:6: vllm.v1.worker.gpu_model_runner.GPUModelRunner has no 'reset_lora_state' in vLLM 0.26.0",
        "x.py:7: vllm.model_executor.models.llama.LlamaForCausalLM.load_weights takes no strict in vLLM 0.26.0",
        "x.py:11: vllm.entrypoints.llm.LLM.wake_up takes no level in vLLM 0.26.0",
    }


def test_the_engine_and_sampling_keywords_are_0_26_fields(known):
    pytest.importorskip("ray")  # rlc's vLLM engine module imports it
    from rlc.runtime.inference.vllm import sampling_kwargs
    from test_vllm_engine import _all_options_kwargs, _sampling

    engine = set(_all_options_kwargs("/models/m"))
    assert engine - vllm_api.fields(known, "vllm.engine.arg_utils.EngineArgs") == set()
    sampling = set(sampling_kwargs(_sampling(stop=["x"]), n=2, seed=1))
    assert sampling - vllm_api.fields(known, "vllm.sampling_params.SamplingParams") == set()
    # What 0.26 names otherwise is caught too.
    assert "max_num_seqz" not in vllm_api.fields(known, "vllm.engine.arg_utils.EngineArgs")


@pytest.mark.skipif(WHEEL is None, reason="the vLLM 0.26.0 wheel is not in .gpu-deps/wheels (`make gpu-kit`)")
def test_the_committed_facts_are_the_wheels(known, uses):
    fresh = vllm_api.facts(WHEEL, uses)
    assert fresh == known
    assert vllm_api.problems(uses, fresh) == []

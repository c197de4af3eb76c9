"""RLC-E515: the prefill/decode split's settings, checked before launch as SkyRL checks them at start-up."""

from __future__ import annotations

import json

import pytest
from rlc.compiler.pipeline import analyze

NIXL = {"kv_transfer_config": {"kv_connector": "NixlConnector"}}
FILES = {"kv_transfer_config": {"kv_connector": "ExampleConnector"}}


@pytest.fixture
def errors(tmp_path):
    def check(inference_engine: dict, cluster: str = "cluster: {accelerator: H100, gpus_per_node: 8}") -> dict:
        spec = tmp_path / "spec.yaml"
        spec.write_text(f"version: 1\n{cluster}\ngenerator:\n  inference_engine: {json.dumps(inference_engine)}\n")
        return {d.key: d.message for d in analyze(spec).diagnostics if d.code == "RLC-E515"}

    return check


def test_skyrls_split_validates(errors):
    assert errors({"num_engines": 4, "enable_pd": True, "num_prefill": 2, "engine_init_kwargs": NIXL}) == {}


def test_a_split_needs_engines_on_both_sides(errors):
    found = errors({"num_engines": 2, "enable_pd": True, "num_prefill": 2, "engine_init_kwargs": NIXL})
    assert "at least one prefill engine and one decode engine" in found["generator.inference_engine.num_prefill"]


def test_role_kwargs_replace_engine_init_kwargs_and_each_names_its_connector(errors):
    found = errors(
        {
            "num_engines": 2,
            "enable_pd": True,
            "num_prefill": 1,
            "engine_init_kwargs": {"max_num_seqs": 8},
            "prefill_init_kwargs": NIXL,
            "decode_init_kwargs": {"max_num_seqs": 8},
        }
    )
    assert set(found) == {
        "generator.inference_engine.engine_init_kwargs",
        "generator.inference_engine.decode_init_kwargs",
    }
    assert "no kv_transfer_config" in found["generator.inference_engine.decode_init_kwargs"]


def test_role_kwargs_without_a_split_and_a_split_of_remote_engines_are_refused(errors):
    assert "enable_pd is off" in errors({"prefill_init_kwargs": NIXL})["generator.inference_engine.prefill_init_kwargs"]
    remote = errors({"enable_pd": True, "num_prefill": 1, "run_engines_locally": False, "remote_urls": ["h:8000"]})
    assert "remote engines" in remote["generator.inference_engine.enable_pd"]


def test_on_a_cpu_the_kv_cache_goes_through_files(errors):
    cpu = "cluster: {accelerator: none, gpus_per_node: 2}\ntrainer: {policy: {model: {path: 'rlc:tiny-vllm'}}}"
    split = {"num_engines": 2, "enable_pd": True, "num_prefill": 1}
    found = errors({**split, "engine_init_kwargs": NIXL}, cpu)
    assert "ExampleConnector" in found["generator.inference_engine.engine_init_kwargs"]
    assert errors({**split, "engine_init_kwargs": FILES}, cpu) == {}

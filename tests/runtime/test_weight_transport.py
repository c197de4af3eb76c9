"""Which path the driver sends weights by for each combination of device, placement, LoRA, strategy and
engine location, and whether an engine's existing weight-update group is replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rlc.runtime.config import CompiledJob  # noqa: E402
from rlc.runtime.driver import Driver  # noqa: E402
from rlc.spec.model import default_model  # noqa: E402


def _driver(*, device: str = "GPU", colocate: bool = True, remote: bool = False, lora: int = 0, backend: str = "nccl",
            strategy: str = "fsdp2", override: str = "auto") -> Driver:
    spec = default_model().to_typed({"version": 1, "trainer": {
        "strategy": strategy, "placement": {"colocate_all": colocate}, "policy": {"model": {"lora": {"rank": lora}}}},
        "generator": {"inference_engine": {
            "backend": "hf", "run_engines_locally": not remote, "remote_urls": ["10.0.0.9:8000"] if remote else [],
            "weight_sync_backend": backend, "override_existing_update_group": override}}})
    return Driver(CompiledJob(spec, {"cluster": {"device": device}}, "", Path(".")), progress=False)


@pytest.mark.parametrize(("case", "expected"), [
    ({}, "ipc"),  # colocated on GPUs: NCCL cannot pair two ranks on one GPU
    ({"colocate": False}, "nccl"),
    ({"backend": "gloo"}, "gloo"),  # asked for explicitly: over the host network even when colocated
    ({"lora": 8}, "payload"),  # only the adapters travel
    ({"lora": 8, "colocate": False}, "payload"),
    ({"lora": 8, "backend": "gloo"}, "payload"),
    ({"strategy": "megatron"}, "payload"),  # no IPC buckets from the megatron policy
    ({"strategy": "megatron", "colocate": False}, "nccl"),
    ({"strategy": "megatron", "lora": 8}, "payload"),  # merged weights, but colocated
    ({"strategy": "megatron", "lora": 8, "colocate": False}, "nccl"),  # merged weights: a plain broadcast
    ({"device": "CPU", "backend": "gloo"}, "gloo"),
    ({"device": "CPU", "colocate": False, "backend": "gloo"}, "gloo"),
    ({"device": "CPU"}, "payload"),  # nccl on a CPU run
    ({"device": "CPU", "colocate": False}, "payload"),
    ({"remote": True}, "nccl"),  # a remote server is never on the trainer's GPU
    ({"remote": True, "colocate": False}, "nccl"),
    ({"remote": True, "backend": "gloo"}, "gloo"),
    ({"remote": True, "device": "CPU", "backend": "gloo"}, "gloo"),
    ({"remote": True, "device": "CPU"}, "payload"),  # HTTP bodies
    ({"remote": True, "lora": 8, "backend": "gloo"}, "payload"),
], ids=lambda v: str(v) if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "colocated-cuda")
def test_the_weight_transport_of_each_combination(case, expected):
    driver = _driver(**case)
    assert driver._weight_transport() == expected
    assert driver._broadcast_backend() == (expected if expected in ("gloo", "nccl") else None)


@pytest.mark.parametrize(("override", "remote", "expected"), [
    ("enable", False, True), ("enable", True, True),
    ("disable", False, False), ("disable", True, False),
    ("auto", True, True),  # SkyRL: remote servers outlive runs, so a new run takes them over
    ("auto", False, False),  # local engines are this run's own
])
def test_override_existing_update_group(override, remote, expected):
    assert _driver(override=override, remote=remote, backend="gloo")._override_update_group() is expected

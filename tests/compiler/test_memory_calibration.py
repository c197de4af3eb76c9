"""The memory verdict against jobs whose outcome is published: example jobs SkyRL and AReaL ship (and run) must not
be refused, and out-of-memory reports must not be judged to fit.

Each case is written as data: the model, GPUs, placement, micro-batches and lengths of the published job, and where
it comes from. A job that runs may get RLC-W704 (its rows fit only below the longest length the spec allows: GSM8K
answers are a few hundred tokens of the 1024 allowed) but never an RLC-E7xx error. An out-of-memory report must not
fit at the lengths it ran with (the longest: SFT rows are all full, long-CoT ones reach the limit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import pytest
from rlc.compiler.memory import estimate
from rlc.compiler.pipeline import compile_job


@dataclass
class Job:
    source: str  # where the configuration (and that it ran, or ran out of memory) is published
    model: str
    accelerator: str
    gpus_per_node: int
    nodes: int
    prompt: int
    response: int
    micro_train: int
    micro_forward: int
    train_batch: int
    mini_batch: int
    samples: int
    engines: int  # vLLM engines and their tensor-parallel size
    engine_tp: int
    gmu: float
    colocate: bool = True
    kl: bool = False  # use_kl_loss: a reference model
    strategy: str = "fsdp2"
    full_rows: bool = False  # every row is the longest (SFT): the job's rows must fit at that length
    trainer: dict = field(default_factory=dict)  # further trainer settings (placement, parallel sizes, ...)


def _spec(job: Job) -> dict:
    placement = {"colocate_all": job.colocate}
    if job.colocate:
        placement.update(policy_num_gpus_per_node=job.gpus_per_node, policy_num_nodes=job.nodes)
        if job.kl:
            placement.update(ref_num_gpus_per_node=job.gpus_per_node, ref_num_nodes=job.nodes)
    trainer = {
        "strategy": job.strategy,
        "logger": "console",
        "policy": {"model": {"path": job.model}},
        "algorithm": {"use_kl_loss": job.kl},
        "placement": placement,
        "train_batch_size": job.train_batch,
        "policy_mini_batch_size": job.mini_batch,
        "micro_train_batch_size_per_gpu": job.micro_train,
        "micro_forward_batch_size_per_gpu": job.micro_forward,
        "max_prompt_length": job.prompt,
    }
    for key, value in job.trainer.items():  # dotted keys under trainer
        *path, last = key.split(".")
        node = trainer
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return {
        "version": 1,
        "cluster": {"accelerator": job.accelerator, "gpus_per_node": job.gpus_per_node, "num_nodes": job.nodes},
        "trainer": trainer,
        "generator": {
            "n_samples_per_prompt": job.samples,
            "sampling_params": {"max_generate_length": job.response},
            "inference_engine": {
                "num_engines": job.engines,
                "tensor_parallel_size": job.engine_tp,
                "gpu_memory_utilization": job.gmu,
            },
        },
    }


SKYRL = "https://github.com/NovaSky-AI/SkyRL/blob/844019ecd894f13e31a6d4ad3f04a3b2503c485e/"
AREAL = "https://github.com/inclusionAI/AReaL/blob/f49d4556f1e5eda33d26068c30d34383bf913f6c/"

# Published jobs that run. AReaL's micro-batches are token budgets (mb_spec.max_tokens_per_mb: 10240): here the
# rows that budget holds at the longest length, rounded down to a divisor of the mini-batch per GPU.
RUNS = {
    "skyrl-gsm8k-quickstart-4xh100": Job(
        SKYRL + "examples/train/gsm8k/run_gsm8k.sh",
        "Qwen/Qwen2.5-1.5B-Instruct", "H100", 4, 1, 512, 1024, 64, 64, 1024, 256, 5, 2, 2, 0.8, kl=True,
    ),
    # The same job on 4 x 48 GB GPUs, as SkyRL's SkyPilot tutorial launches it (skyrl-train/docs/tutorials/
    # skypilot.rst, with screenshots of the run; PR NovaSky-AI/SkyRL#484).
    "skyrl-gsm8k-quickstart-4xl40s": Job(
        "https://github.com/NovaSky-AI/SkyRL/pull/484",
        "Qwen/Qwen2.5-1.5B-Instruct", "L40S", 4, 1, 512, 1024, 64, 64, 1024, 256, 5, 4, 1, 0.8, kl=True,
    ),
    "skyrl-gsm8k-32b-2x8xh100": Job(
        SKYRL + "examples/train/gsm8k/run_32b_gsm8k.sh",
        "Qwen/Qwen2.5-32B-Instruct", "H100", 8, 2, 512, 1024, 8, 8, 32, 32, 4, 4, 4, 0.8,
    ),
    "skyrl-dapo-qwen2.5-math-7b-8xh100": Job(
        SKYRL + "examples/train/algorithms/dapo/run_dapo_qwen2.5_math_7b_aime.sh",
        "Qwen/Qwen2.5-Math-7B", "H100", 8, 1, 2048, 8192, 16, 16, 512, 32, 16, 2, 4, 0.8,
    ),
    "skyrl-megatron-dapo-qwen3-30b-a3b-2x8xh100": Job(
        SKYRL + "examples/train/megatron/run_megatron_dapo_qwen3_30b_a3b.sh",
        "Qwen/Qwen3-30B-A3B-Base", "H100", 8, 2, 2048, 8192, 2, 4, 512, 32, 16, 2, 8, 0.7,
        strategy="megatron",
        trainer={
            "policy.megatron_config.tensor_model_parallel_size": 4,
            "policy.megatron_config.expert_model_parallel_size": 8,
            "policy.megatron_config.expert_tensor_parallel_size": 1,
        },
    ),
    # AReaL's configs do not name the GPU; its documentation runs them on 80 GB cards: an H100 here. 4 GPUs of
    # SGLang engines (vLLM in rlc), 4 of training.
    "areal-gsm8k-grpo": Job(
        AREAL + "examples/math/gsm8k_grpo.yaml",
        "Qwen/Qwen2.5-1.5B-Instruct", "H100", 8, 1, 1024, 1024, 4, 4, 256, 256, 4, 4, 1, 0.8,
        colocate=False, trainer={"placement.policy_num_gpus_per_node": 4},
    ),
    "areal-gsm8k-grpo-megatron": Job(
        AREAL + "examples/math/gsm8k_grpo_megatron.yaml",
        "Qwen/Qwen2.5-1.5B-Instruct", "H100", 8, 1, 1024, 1024, 4, 4, 256, 256, 4, 4, 1, 0.9,
        colocate=False, strategy="megatron",
        trainer={"placement.policy_num_gpus_per_node": 4, "gradient_checkpointing": False},
    ),
    "areal-gsm8k-dapo-dynamic-bs": Job(
        "https://github.com/inclusionAI/AReaL/blob/133b8d40bce2214d910cd16c500c5cadeacb944c/"
        "examples/math/gsm8k_dapo_dynamic_bs.yaml",
        "Qwen/Qwen2.5-1.5B", "H100", 8, 1, 1024, 4096, 2, 2, 256, 256, 4, 4, 1, 0.9,
        colocate=False, trainer={"placement.policy_num_gpus_per_node": 4},
    ),
}  # fmt: skip

S1_32B = Job(
    "https://github.com/simplescaling/s1/issues/13",
    "Qwen/Qwen2.5-32B-Instruct", "H100", 8, 1, 1024, 31744, 1, 1, 16, 16, 1, 1, 8, 0.5, full_rows=True,
)  # fmt: skip
# s1.1 was trained on 16 H100s at 20K tokens (s1's README: "we set it to 20K for s1.1").
RUNS["s1.1-32b-20k-rows-on-16xh100"] = replace(
    S1_32B, nodes=2, response=19456, train_batch=32, mini_batch=32, engines=2, source=S1_32B.source
)

# Published out-of-memory reports whose cause is memory rlc's runtime holds too. (Reports from trainers that hold
# more, e.g. OpenRLHF#887's float32 copy of the logits, are no evidence about rlc: docs/memory.md.)
OOMS = {
    # s1's SFT of Qwen2.5-32B, fully sharded, rows of 32768 tokens (its block size; SFT rows are all full): out of
    # memory on one node of 8 H100s "even I reduce micro_batch_size to 1"; the authors trained on 16. Weights,
    # gradients and AdamW state take ~61 GiB of each of 8 GPUs, the rows the rest.
    "s1-32b-32k-rows-on-8xh100": S1_32B,
    # ... and on those 16 with s1.1's longer data ("s1.1 dataset with cutoff len=32000 cause oom with 16 * h100").
    "s1.1-32b-32k-rows-on-16xh100": replace(S1_32B, nodes=2, train_batch=32, mini_batch=32, engines=2),
}  # fmt: skip


def _compile(spec_file, job: Job):
    result = compile_job(spec_file(json.dumps(_spec(job))))
    front = [d for d in result.diagnostics if d.severity == "error" and not d.code.startswith("RLC-E7")]
    assert not front and result.plan is not None, [(d.code, d.message) for d in front]
    return result


@pytest.mark.parametrize("name", sorted(RUNS))
def test_published_jobs_that_run_are_not_refused(name, spec_file):
    result = _compile(spec_file, RUNS[name])
    errors = [(d.code, d.message) for d in result.diagnostics if d.severity == "error"]
    assert not errors, errors
    assert result.memory is not None and result.memory.gpus
    if RUNS[name].full_rows:
        assert result.memory.fits


@pytest.mark.parametrize("name", sorted(OOMS))
def test_published_out_of_memory_reports_do_not_fit(name, spec_file):
    job = OOMS[name]
    result = _compile(spec_file, job)
    assert not estimate(result.analysis.spec, result.plan).fits
    codes = {d.code for d in result.diagnostics}
    assert codes & {"RLC-W704", "RLC-E702"}, codes  # what does not fit is the rows, whose length it names

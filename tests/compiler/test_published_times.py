"""`rlc plan`'s time estimate held against published step and phase times of named jobs (docs/estimate.md, "Held
against measured steps"): each job is the framework's own launch script imported by `rlc migrate` (SkyRL's scripts in
tests/fixtures/skyrl-scripts) or an example with the job's sizes as overrides, its row lengths set to the published
means, and the estimate's phase beside the published figure. Where the estimate is off, the band says by how much and
the assumption that accounts for it is checked too (docs/estimate.md says why)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from conftest import EXAMPLES
from rlc.compiler.estimate import estimate_time
from rlc.compiler.importers.scripts import import_script
from rlc.compiler.pipeline import compile_job
from rlc.core.overrides import parse_override

SKYRL = Path(__file__).resolve().parents[1] / "fixtures" / "skyrl-scripts" / "examples" / "train"
SEARCH = SKYRL / "search" / "run_search.sh"
SEARCH_MOE = SKYRL / "megatron" / "run_search_megatron.sh"
MEGATRON_DOC = "https://github.com/NovaSky-AI/SkyRL/blob/main/skyrl-train/docs/examples/megatron.rst"
# Search-R1's rows (SkyRL's searchr1_dataset.py): a prompt of about 150 tokens (the instructions, 116 tokens, a system
# line, a question and the chat template); turns of a search and an answer, each search answered by 3 passages of
# about 130 tokens. The published mean of the tokens after the prompt (what training sees) is met by each turn's
# response: turns x response + (turns - 1) x observation = the mean.
ROWS = ("estimate.prompt_fill=0.0732", "estimate.turns=2", "estimate.observation_tokens=400")


@dataclass(frozen=True)
class Published:
    job: str
    source: str
    spec: Path  # a launch script (imported) or a spec
    overrides: tuple[str, ...]
    phase: str  # the estimate's phase compared ("step": the whole step)
    seconds: float  # the published figure
    band: tuple[float, float]  # estimate / published, as docs/estimate.md states it


def skyrl_search(model: str, strategy: str, fill: str, phase: str, seconds: float) -> Published:
    return Published(
        f"SkyRL Search-R1 {model} {strategy} 8xH100 {phase}",
        MEGATRON_DOC,
        SEARCH,
        (
            f"trainer.policy.model.path=Qwen/{model}",
            f"trainer.strategy={strategy}",
            *ROWS,
            f"estimate.response_fill={fill}",
        ),
        phase,
        seconds,
        (0.2, 0.8),  # at the default train_mfu (0.35) the estimate is faster: these runs reach less of the peak
    )


# SkyRL's table (train batch 512 x 5 samples, micro-batches tuned to the largest that fit, 8 H100): "Policy Training Time" is the train
# phase, "Forward Pass Time" the log-prob forwards (reference and old policy); "Avg Num Tokens" after the prompt is 658
# (3B), 834 (7B FSDP2) and 819 (7B Megatron): response_fill 0.258, 0.434 and 0.419 of 500 tokens a turn.
SKYRL_JOBS = [
    skyrl_search("Qwen2.5-3B-Instruct", "fsdp2", "0.258", "train", 42),
    skyrl_search("Qwen2.5-3B-Instruct", "fsdp2", "0.258", "log-prob forwards", 28),
    skyrl_search("Qwen2.5-3B-Instruct", "megatron", "0.258", "train", 48),
    skyrl_search("Qwen2.5-3B-Instruct", "megatron", "0.258", "log-prob forwards", 39),
    skyrl_search("Qwen2.5-7B-Instruct", "fsdp2", "0.434", "train", 100),
    skyrl_search("Qwen2.5-7B-Instruct", "fsdp2", "0.434", "log-prob forwards", 33),
    skyrl_search("Qwen2.5-7B-Instruct", "megatron", "0.419", "train", 93),
    skyrl_search("Qwen2.5-7B-Instruct", "megatron", "0.419", "log-prob forwards", 46),
]
VERL_H200 = Published(
    "verl Qwen3-0.6B GRPO GSM8K on 2 H200 (THUDM/slime#385)",
    "https://github.com/THUDM/slime/issues/385",
    EXAMPLES / "gsm8k-grpo-8xh100.yaml",
    (
        "cluster.accelerator=H200",
        "cluster.gpus_per_node=2",
        "trainer.policy.model.path=Qwen/Qwen3-0.6B",
        "trainer.train_batch_size=1152",
        "trainer.policy_mini_batch_size=1152",
        "estimate.prompt_fill=0.2",
        "estimate.response_fill=0.28",
    ),
    "step",
    33.6,
    (0.5, 2.0),
)
MOE = Published(
    "SkyRL Search-R1 Qwen3-30B-A3B megatron 4x8xH100 train",
    MEGATRON_DOC,
    SEARCH_MOE,
    (*ROWS, "estimate.response_fill=0.758"),  # 1158 tokens after the prompt
    "train",
    189,
    (0.5, 2.0),  # the expert layers' exchanges and grouped GEMMs per micro-batch of one row (docs/estimate.md)
)
MOE_FORWARDS = Published(
    "SkyRL Search-R1 Qwen3-30B-A3B megatron 4x8xH100 log-prob forwards",
    MEGATRON_DOC,
    SEARCH_MOE,
    MOE.overrides,
    "log-prob forwards",
    145,
    (0.5, 2.0),
)

# Weight syncs as their frameworks timed them (docs/estimate.md, "Weight sync"): the estimate counts the gather, the
# transport and vLLM's load; what a framework adds around them (pausing, barriers) it does not.
GSM8K = EXAMPLES / "gsm8k-grpo-8xh100.yaml"
SYNCS = [
    Published(
        "SkyRL 14B colocated CUDA IPC sync, 1 GB buckets, 8xH100 engine TP 2 (NovaSky-AI/SkyRL#161)",
        "https://github.com/NovaSky-AI/SkyRL/pull/161",
        GSM8K,
        (
            "trainer.policy.model.path=Qwen/Qwen2.5-14B-Instruct",
            "generator.inference_engine.tensor_parallel_size=2",
            "generator.inference_engine.num_engines=4",
        ),
        "weight sync",
        1.6,
        (0.5, 1.0),
    ),
    Published(
        "slime Qwen3-30B-A3B colocated CUDA IPC sync loop, 8xH200 (vllm-project/vime#175)",
        "https://github.com/vllm-project/vime/issues/175",
        GSM8K,
        (
            "cluster.accelerator=H200",
            "trainer.policy.model.path=Qwen/Qwen3-30B-A3B",
            "generator.inference_engine.tensor_parallel_size=4",
            "generator.inference_engine.num_engines=2",
        ),
        "weight sync",
        3.0,
        (0.5, 1.0),
    ),
    Published(
        "open-instruct Llama-3.1-8B gloo sync (vllm-project/vllm#5723)",
        "https://github.com/vllm-project/vllm/issues/5723",
        GSM8K,
        (
            "trainer.policy.model.path=meta-llama/Llama-3.1-8B",
            "trainer.placement.colocate_all=false",
            "trainer.placement.policy_num_gpus_per_node=4",
            "trainer.placement.ref_num_gpus_per_node=4",
            "generator.inference_engine.num_engines=4",
            "generator.inference_engine.weight_sync_backend=gloo",
        ),
        "weight sync",
        5.5,  # "5-6 seconds"
        (0.7, 1.3),
    ),
    Published(
        "TRL Qwen3-0.6B NCCL sync, one trainer GPU and one vLLM GPU (huggingface/trl#5892)",
        "https://github.com/huggingface/trl/pull/5892",
        GSM8K,
        (
            "trainer.policy.model.path=Qwen/Qwen3-0.6B",
            "cluster.gpus_per_node=2",
            "trainer.placement.colocate_all=false",
            "trainer.placement.policy_num_gpus_per_node=1",
            "trainer.placement.ref_num_gpus_per_node=1",
            "generator.inference_engine.num_engines=1",
        ),
        "weight sync",
        0.18,
        (0.1, 0.4),  # a small model's sync is vLLM's update lifecycle (pause, start, finish), which is not counted
    ),
]
JOBS = [VERL_H200, *SKYRL_JOBS, MOE, MOE_FORWARDS, *SYNCS]


@cache
def imported(script: Path) -> str:
    """The spec `rlc migrate` writes for a launch script."""
    spec, errors, _ = import_script(str(script), {}, [])
    assert spec is not None and not errors, [d.message for d in errors]
    return spec.text


def estimate(job: Published, *extra: str, tmp_path: Path):
    spec = job.spec
    if spec.suffix == ".sh":
        spec = tmp_path / "job.yaml"
        spec.write_text(imported(job.spec))
    result = compile_job(spec, [parse_override(o) for o in (*job.overrides, *extra)])
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    est = estimate_time(result.spec, result.plan, result.memory)
    assert est is not None
    return est.step_s if job.phase == "step" else {p.name: p.seconds for p in est.phases}[job.phase]


@pytest.mark.parametrize("job", JOBS, ids=[j.job for j in JOBS])
def test_each_published_job_is_within_its_stated_band(job, tmp_path):
    ratio = estimate(job, tmp_path=tmp_path) / job.seconds
    low, high = job.band
    assert low <= ratio <= high, f"{job.job}: estimate {ratio:.2f}x of the published {job.seconds} s ({job.source})"


@pytest.mark.parametrize("job", SKYRL_JOBS, ids=[j.job for j in SKYRL_JOBS])
def test_skyrl_search_phases_are_within_2x_at_the_utilisation_they_reach(job, tmp_path):
    """The dense Search-R1 phases run at about 0.15 of the H100's peak (gradient checkpointing, the reference offloaded
    to the CPU), not the 0.35 the default assumes: with that one assumption changed each is within 2x."""
    ratio = estimate(job, "estimate.train_mfu=0.15", tmp_path=tmp_path) / job.seconds
    assert 0.5 <= ratio <= 2.0, f"{job.job}: {ratio:.2f}x at train_mfu 0.15"


MULTITURN = EXAMPLES / "local-cpu-multiturn.yaml"
# The multi-turn example's mean steps, 3 seeds x 16 steps each, measured by bench/multiturn_learning.py on two machines of
# this kind (bench/RESULTS.md has the newest), and what the runs' metrics measured of their rows (docs/estimate.md,
# "Multi-turn jobs"): the prompt's 271 tokens, about 2 turns, 53-55 tokens after the prompt (18 a response, 19 an
# answer) and the share of rows left out of the update (a 3-step run's 0.54 on 2026-11-26; 0.72-0.86 by seed on
# 2026-11-28). The CPU profile is the 2026-11-28 machine's (AMD EPYC, measured there on 2026-11-27); the 2026-11-26
# machine (Intel Xeon) ran the same steps faster (the SmolLM2 example's 14.7 s against 24.6 s), and the estimate as
# written is 2.2x of its fastest seed: each run is held within 2x at its measured rows, this machine's as written too.
ROWS_MEASURED = ("estimate.prompt_fill=0.706", "estimate.response_fill=0.37", "estimate.observation_tokens=19")
MULTITURN_RUNS = {
    "2026-11-26": ((21.9, 30.1), (*ROWS_MEASURED, "estimate.turns=1.96", "estimate.inert_fraction=0.54"), 2.25),
    "2026-11-28": ((26.6, 27.1, 34.7), (*ROWS_MEASURED, "estimate.turns=1.99", "estimate.inert_fraction=0.8"), 2.0),
}


def multiturn_step(*overrides: str) -> float:
    result = compile_job(MULTITURN, [parse_override(o) for o in overrides])
    est = estimate_time(result.spec, result.plan, result.memory)
    assert est is not None
    return est.step_s


@pytest.mark.parametrize("day", sorted(MULTITURN_RUNS))
def test_the_multi_turn_example_is_within_2x_of_its_measured_steps(day):
    """At the rows its runs measured, and as written (2/9 of the rows expected inert, the default lengths)."""
    steps, measured_rows, written_band = MULTITURN_RUNS[day]
    measured = multiturn_step(*measured_rows)
    assert all(0.5 <= measured / s <= 2.0 for s in steps), (measured, steps)
    written = multiturn_step()
    assert all(0.5 <= written / s <= written_band for s in steps), (written, steps)
    # every row counted, as the estimate did before it expected groups of right-or-wrong rewards to agree, is further
    assert multiturn_step("estimate.inert_fraction=0") > 1.15 * written


def test_the_moe_jobs_expert_layers_cost_per_micro_batch(tmp_path):
    """The MoE row's estimate is mostly its expert layers' exchanges, paid per micro-batch: four rows a micro-batch
    pay a quarter of one row's; no exchange cost leaves the FLOPs and the grouped GEMMs' reads, far below the
    published time (docs/estimate.md)."""

    def exchanges(*more: str) -> float:
        return estimate(MOE, *more, tmp_path=tmp_path) - estimate(
            MOE, *more, "estimate.moe_exchange_ms=0", tmp_path=tmp_path
        )

    one_row = exchanges()
    assert one_row == pytest.approx(4 * exchanges("trainer.micro_train_batch_size_per_gpu=4"), rel=0.05)
    assert estimate(MOE, "estimate.moe_exchange_ms=0", tmp_path=tmp_path) < 0.2 * MOE.seconds < one_row

"""Peer driver for bench/validate_bench.py: build and validate a SkyRL config, the way SkyRL does.

Runs inside the peer venv (bench/.venv-skyrl, skyrl-train 0.3.1), never inside rlc's venv:

    bench/.venv-skyrl/bin/python bench/skyrl_peer.py good|broken

What it does, in this order, all in one process (the benchmark times the whole process):
  1. imports SkyRL's validator (`skyrl_train.utils.utils.validate_cfg`; importing it pulls in torch and ray)
     and SkyRL's config location (`skyrl_train.config.utils`, which imports Hydra);
  2. builds the config the way `skyrl_train.entrypoints.main_base` does (Hydra, base config
     `ppo_base_config.yaml`), with the job below given as Hydra command-line overrides, like SkyRL's run scripts;
  3. calls `validate_cfg(cfg)`, the function `main_base.main` calls before it starts Ray.

Nothing here starts Ray, touches CUDA or the network: `validate_cfg` only reads the config, and its
registry look-ups stay local while Ray is not initialized. The driver checks this afterwards and reports it.

Prints one JSON line on stdout. Exit status: 0 valid, 1 rejected by SkyRL, 2 the driver itself failed.
"""

from __future__ import annotations

import json
import sys
import time

T_START = time.perf_counter()

# The job of examples/gsm8k-grpo-2node.yaml, in SkyRL's own keys: 2 nodes x 8 H100, 16 policy GPUs
# (policy and ref colocated with 8 vLLM engines of TP=2), GRPO with a KL loss, Qwen2.5-7B-Instruct.
JOB = [
    "data.train_data=['~/data/gsm8k/train.parquet']",
    "data.val_data=['~/data/gsm8k/validation.parquet']",
    "trainer.placement.colocate_all=true",
    "trainer.placement.policy_num_nodes=2",
    "trainer.placement.policy_num_gpus_per_node=8",
    "trainer.placement.ref_num_nodes=2",
    "trainer.placement.ref_num_gpus_per_node=8",
    "trainer.strategy=fsdp2",
    "trainer.policy.model.path=Qwen/Qwen2.5-7B-Instruct",
    "trainer.policy.optimizer_config.lr=1.0e-6",
    "trainer.policy.fsdp_config.cpu_offload=false",
    "trainer.algorithm.advantage_estimator=grpo",
    "trainer.algorithm.use_kl_loss=true",
    "trainer.epochs=20",
    "trainer.train_batch_size=1024",
    "trainer.policy_mini_batch_size=256",
    "trainer.micro_train_batch_size_per_gpu=16",
    "trainer.micro_forward_batch_size_per_gpu=32",
    "trainer.max_prompt_length=512",
    "trainer.ckpt_interval=10",
    "trainer.ckpt_path=/mnt/shared/ckpts/gsm8k-grpo-2node",
    "trainer.logger=wandb",
    "trainer.project_name=gsm8k",
    "generator.backend=vllm",
    "generator.num_inference_engines=8",
    "generator.inference_engine_tensor_parallel_size=2",
    "generator.gpu_memory_utilization=0.7",
    "generator.n_samples_per_prompt=8",
    "generator.batched=true",
    "generator.sampling_params.max_generate_length=1024",
    "environment.env_class=gsm8k",
]

VARIANTS = {
    "good": JOB,
    # The same job with policy_mini_batch_size 300, which does not divide train_batch_size 1024.
    "broken": [o.replace("policy_mini_batch_size=256", "policy_mini_batch_size=300") for o in JOB],
}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in VARIANTS:
        print(f"usage: skyrl_peer.py {{{'|'.join(VARIANTS)}}}", file=sys.stderr)
        return 2
    variant = argv[0]
    report: dict = {"variant": variant, "overrides": VARIANTS[variant]}

    from importlib.metadata import version

    from hydra import compose, initialize_config_dir
    from skyrl_train.config.utils import CONFIG_DIR, DEFAULT_CONFIG_NAME  # imports Hydra
    from skyrl_train.utils.utils import validate_cfg  # imports torch and ray

    t_imported = time.perf_counter()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name=DEFAULT_CONFIG_NAME, overrides=VARIANTS[variant])
    t_composed = time.perf_counter()

    try:
        validate_cfg(cfg)
        report.update(valid=True, error=None)
    except (AssertionError, ValueError, NotImplementedError) as exc:
        report.update(valid=False, error=f"{type(exc).__name__}: {exc}")
    t_validated = time.perf_counter()

    import ray
    import torch

    report.update(
        seconds={
            "import": t_imported - T_START,
            "compose": t_composed - t_imported,
            "validate": t_validated - t_composed,
        },
        ray_initialized=ray.is_initialized(),
        cuda_initialized=torch.cuda.is_initialized(),
        versions={p: version(p) for p in ("skyrl-train", "hydra-core", "omegaconf", "torch", "ray")},
        python=sys.version.split()[0],
    )
    print(json.dumps(report))
    return 0 if report["valid"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException as exc:  # the driver failed (import error, Hydra error): say so, exit 2
        print(json.dumps({"driver_error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(2)

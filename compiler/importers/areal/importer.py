"""`rlc migrate --from areal`: an AReaL experiment config turned into spec v1, every key accounted for.

AReaL's config (its dataclasses `GRPOConfig`/`PPOConfig`) and rlc's spec describe the same job in different
words: allocation_mode strings instead of placement counts, reward/advantage normalisation levels instead of
an advantage estimator, a decoupled loss instead of off-policy correction. Each key of the file is mapped to
its spec v1 key, dropped with the reason it has no effect in rlc, or reported as not carried; those whose loss
changes what runs are error-level lines of the report. SFT, DPO and reward-model configs are refused.
"""

from __future__ import annotations

from typing import Any

from rlc.compiler.importers.areal.record import ArealImport
from rlc.compiler.importers.areal.sections import map_sections
from rlc.compiler.importers.base import Imported, ImportResult, NotImportable, leaves, spec_text
from rlc.compiler.load import Document
from rlc.core.plain import plain_yaml

# Keys whose whole subtree has no effect in rlc, with the reason.
DROPPED_SECTIONS = {
    "cluster.name_resolve": "rlc's nodes find each other through Ray",
    "scheduler": "rlc places workers from the allocation; AReaL's single-controller scheduler has no counterpart",
    "perf_tracer": "AReaL's performance tracer has no rlc counterpart",
    "launcher.slurm": "rlc launches through SkyPilot, Ray or KubeRay, not Slurm",
    "stats_logger.swanlab": "rlc logs to wandb, tensorboard, mlflow or the console",
    "rollout.scheduling_spec": "rlc places workers from the allocation",
    "actor.scheduling_spec": "rlc places workers from the allocation",
    "actor.scheduling_strategy": "rlc places workers from the allocation",
    "ref.scheduling_spec": "rlc places workers from the allocation",
    "ref.scheduling_strategy": "the reference model shares the policy's GPUs (trainer.placement.colocate_policy_ref)",
    "critic.scheduling_spec": "rlc places workers from the allocation",
    "actor.megatron": "AReaL's Megatron engine options have no one-to-one rlc counterpart; set "
    "trainer.policy.megatron_config by hand",
}
# Single keys with no effect in rlc (or copies of other keys), with the reason.
DROPPED_KEYS = {
    "experiment_name": "used as the job name",
    "trial_name": "used as trainer.run_name",
    "enable_offload": "rlc offloads per role (fsdp_config.cpu_offload)",
    "rollout.queue_size": "rlc's generation queue has no size to set",
    "rollout.consumer_batch_size": "rlc consumes trainer.train_batch_size prompts per step",
    "rollout.enable_rollout_tracing": "debug tracing",
    "rollout.check_trajectory_format": "debug check",
    "rollout.schedule_policy": "rlc spreads requests over its engines itself",
    "rollout.setup_timeout": "rlc waits for its engines itself",
    "rollout.request_timeout": "rlc's engines run in-process, without HTTP requests",
    "rollout.request_retries": "rlc's engines run in-process, without HTTP requests",
    "rollout.pause_grace_period": "rlc pauses generation for weight updates itself",
    "actor.init_from_scratch": "false: rlc loads the pretrained weights",
    "actor.is_critic": "false: the actor is the policy",
    "actor.pad_to_maximum": "rlc packs sequences without padding (trainer.use_sample_packing)",
    "actor.disable_dropout": "rlc trains with the model config's dropout",
    "actor.grad_reduce_dtype": "float32 is rlc's reduce dtype too",
    "actor.weight_update_mode": "rlc sends weights to its engines over NCCL (inference_engine.weight_sync_backend)",
    "actor.log_agent_stats": "agent statistics logging",
    "actor.log_agent_stats_keys": "agent statistics logging",
    "actor.peft_type": "lora is the only PEFT type",
    "actor.recompute_logprob": "rlc recomputes log-probs with the trainer",
    "actor.mb_spec.granularity": "rlc packs micro batches by count",
    "actor.optimizer.initial_loss_scale": "fp16 loss scaling; rlc trains in bf16",
    "actor.optimizer.min_loss_scale": "fp16 loss scaling; rlc trains in bf16",
    "actor.optimizer.loss_scale_window": "fp16 loss scaling; rlc trains in bf16",
    "actor.optimizer.hysteresis": "fp16 loss scaling; rlc trains in bf16",
    "saver.experiment_name": "a copy",
    "saver.trial_name": "a copy",
    "saver.fileroot": "a copy of cluster.fileroot",
    "recover.retries": "rlc relaunches through the launcher's own retries",
    "stats_logger.fileroot": "a copy of cluster.fileroot",
    "train_dataset.type": "rl: an RL dataset of prompts",
    "valid_dataset.type": "rl: an RL dataset of prompts",
    "launcher.inference_server_cpus_per_gpu": "rlc sizes nodes with cluster.cpus_per_node",
    "launcher.inference_server_mem_per_gpu": "rlc sizes nodes with cluster.memory_per_node",
    "launcher.trainer_cpus_per_gpu": "rlc sizes nodes with cluster.cpus_per_node",
    "launcher.trainer_mem_per_gpu": "rlc sizes nodes with cluster.memory_per_node",
}
for _sec in ("evaluator", "recover", "checkpointer", "stats_logger", "rollout", "actor", "ref", "critic"):
    DROPPED_KEYS.setdefault(f"{_sec}.experiment_name", "a copy")
    DROPPED_KEYS.setdefault(f"{_sec}.trial_name", "a copy")
    DROPPED_KEYS.setdefault(f"{_sec}.fileroot", "a copy of cluster.fileroot")
for _ds in ("train_dataset", "valid_dataset"):
    for _k, _why in (
        ("shuffle", "rlc shuffles the training data each epoch"),
        ("pin_memory", "a data-loader detail"),
        ("num_workers", "a data-loader detail"),
        ("drop_last", "rlc drops the last incomplete batch too"),
    ):
        DROPPED_KEYS[f"{_ds}.{_k}"] = _why


class ImportRefused(NotImportable):
    """The file is not an RL config rlc can compile; nothing is written."""


def refusal(data: dict, line_of) -> str | None:
    """Why an AReaL config is not an RL job rlc compiles (SFT, DPO, reward model), or None."""
    for key in ("train_dataset.type", "valid_dataset.type"):
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        kind = str(node).lower() if isinstance(node, str) else ""
        if kind in ("sft", "dpo", "rw", "rm", "reward"):
            what = {"sft": "supervised fine-tuning (SFT)", "dpo": "DPO"}.get(kind, "reward-model training")
            line = line_of(key)
            return f"{key}: {node}{f' (line {line})' if line else ''} makes this an AReaL {what} config"
    actor = data.get("actor")
    if isinstance(actor, dict) and actor.get("is_critic") is True:
        return "actor.is_critic: true makes this an AReaL reward-model config"
    if "model" in data and "actor" not in data:
        return "a top-level `model` section and no `actor` make this an AReaL SFT or reward-model config"
    if "run" in data and ("resources" in data or "num_nodes" in data):
        return "its `run` and `resources` make this a SkyPilot task, not an AReaL experiment config"
    if "gconfig" not in data and "rollout" not in data:
        return "it has no `gconfig` or `rollout` section, so it generates nothing: an SFT, DPO or reward-model config"
    return None


def import_areal(data: dict, line_of=lambda path: 0) -> ImportResult:
    """Map the plain data of an AReaL experiment config to spec v1; raises ImportRefused for non-RL configs."""
    why = refusal(data, line_of)
    if why:
        raise ImportRefused(why)
    imp = ArealImport(data, line_of)
    map_sections(imp)
    _leftovers(imp)
    return imp.result


def _leftovers(imp: ArealImport) -> None:
    """Every AReaL key no section mapped: dropped with the reason it has no effect in rlc, or not carried."""
    for leaf, value in leaves(imp.raw):
        if leaf in imp.used:
            continue
        section = next((s for s in DROPPED_SECTIONS if leaf == s or leaf.startswith(s + ".")), None)
        if section is not None:
            imp.drop(leaf, DROPPED_SECTIONS[section])
        elif leaf in DROPPED_KEYS:
            imp.drop(leaf, DROPPED_KEYS[leaf])
        elif value is None or value == [] or value == {}:
            imp.drop(leaf, "empty")
        else:
            imp.drop(leaf, "no rlc counterpart; not carried", severity="warning")


def areal_text(source: str, result: ImportResult) -> str:
    """Spec v1 YAML of an AReaL import, each key commented with the AReaL keys it came from."""
    comments = {
        path: f"AReaL: {', '.join(s for s in sources if s)}" for path, sources in result.sources.items() if any(sources)
    }
    return spec_text(
        result.spec,
        comments,
        f"Imported from the AReaL config {source} by `rlc migrate --from areal`.\n"
        "Comments name the AReaL keys each value came from; the report lists what was dropped.",
    )


class AReaL:
    """An AReaL experiment config (RL only) written as a new spec v1 file, each key commented with its AReaL keys."""

    name = "areal"
    what = "AReaL config"
    rewrites = False  # a new spec is written: no --in-place, --check or --diff

    def convert(self, doc: Document) -> Imported:
        data = plain_yaml(doc.data)
        if not isinstance(data, dict):
            raise NotImportable("not an AReaL experiment config (the top level is not a mapping)")
        try:
            result = import_areal(data, lambda path: doc.locate(tuple(path.split("."))).line)
        except ImportRefused as exc:
            raise NotImportable(
                f"{exc}; rlc compiles RL post-training jobs (GRPO, PPO, DAPO, Dr.GRPO, GSPO, REINFORCE, RLOO) only, "
                "so nothing was written"
            ) from None
        return Imported(
            areal_text(doc.name, result),
            "AReaL config -> spec v1",
            result.changes,
            [f"{'  !! ' if c.severity == 'error' else '  '}{c.describe()}" for c in result.changes],
            f"{len(result.errors)} change(s) alter what runs (marked !!); review them before launching",
        )

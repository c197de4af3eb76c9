"""`rlc migrate --from areal`: an AReaL experiment config turned into spec v1, every key accounted for.

AReaL's config (its dataclasses `GRPOConfig`/`PPOConfig`) and rlc's spec describe the same job in different
words: allocation_mode strings instead of placement counts, reward/advantage normalisation levels instead of
an advantage estimator, a decoupled loss instead of off-policy correction. Each key of the file is mapped to
its spec v1 key, dropped with the reason it has no effect in rlc, or reported as not carried; those whose loss
changes what runs are error-level lines of the report. SFT, DPO and reward-model configs are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rlc.compiler.importers.skyrl import Change

REF = re.compile(r"\$\{([^{}]+)\}")
_MISSING = object()

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


class ImportRefused(Exception):
    """The file is not an RL config rlc can compile; nothing is written."""


@dataclass
class ImportResult:
    spec: dict[str, Any]  # dotted spec path -> value, in writing order
    sources: dict[str, list[str]]  # dotted spec path -> the AReaL keys it came from
    changes: list[Change] = field(default_factory=list)

    @property
    def errors(self) -> list[Change]:
        return [c for c in self.changes if c.severity == "error"]


def _leaves(node: Any, prefix: str = ""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


class _Importer:
    def __init__(self, data: dict, line_of):
        self.raw = data
        self.line_of = line_of
        self.used: set[str] = set()
        self.result = ImportResult({}, {})

    # -- reading the AReaL file, ${...} references resolved ----------------------------------

    def _raw(self, path: str) -> Any:
        node: Any = self.raw
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def get(self, path: str, default: Any = None) -> Any:
        value = self._resolve(self._raw(path), [path])
        return default if value is _MISSING or value is None else value

    def has(self, path: str) -> bool:
        return self._raw(path) not in (_MISSING, None)

    def _resolve(self, value: Any, chain: list[str]) -> Any:
        if isinstance(value, dict):
            return {k: self._resolve(v, chain) for k, v in value.items()}
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = REF.fullmatch(value)
        if whole and ":" not in whole.group(1):
            ref = whole.group(1)
            return _MISSING if ref in chain else self._resolve(self._raw(ref), chain + [ref])
        return REF.sub(lambda m: self._text(m.group(1), chain), value)

    def _text(self, ref: str, chain: list[str]) -> str:
        if ":" in ref or ref in chain:
            return "${" + ref + "}"
        target = self._resolve(self._raw(ref), chain + [ref])
        return "${" + ref + "}" if target is _MISSING else str(target)

    # -- recording ------------------------------------------------------------------------------

    def put(self, new: str, value: Any, *old: str, reason: str = "", severity: str = "info") -> None:
        """Write spec key `new` from AReaL keys `old` (the first one is the one reported)."""
        self.result.spec[new] = value
        self.result.sources[new] = list(old)
        self.used.update(old)
        if not old:
            self.result.changes.append(Change("added", None, new, new_value=value, reason=reason, severity=severity))
            return
        first = old[0]
        if len(old) > 1:
            reason = f"{reason}; with {', '.join(old[1:])}" if reason else f"with {', '.join(old[1:])}"
        if self._raw(first) is _MISSING:
            why = f"AReaL's default of {first}" + (f"; {reason}" if reason else "")
            self.result.changes.append(Change("added", None, new, new_value=value, reason=why, severity=severity))
            return
        before = self.get(first)
        kind = "moved" if not reason and before == value else "transformed"
        self.result.changes.append(Change(kind, first, new, self.line_of(first), before, value, reason, severity))

    def drop(self, old: str, reason: str, severity: str = "info") -> None:
        if self._raw(old) is _MISSING:
            return
        for leaf, _ in _leaves(self._raw(old), old):
            if leaf in self.used:
                continue
            self.used.add(leaf)
            self.result.changes.append(
                Change("dropped", leaf, None, self.line_of(leaf), reason=reason, severity=severity)
            )

    def leftovers(self) -> None:
        for leaf, value in _leaves(self.raw):
            if leaf in self.used:
                continue
            section = next((s for s in DROPPED_SECTIONS if leaf == s or leaf.startswith(s + ".")), None)
            if section is not None:
                self.drop(leaf, DROPPED_SECTIONS[section])
            elif leaf in DROPPED_KEYS:
                self.drop(leaf, DROPPED_KEYS[leaf])
            elif value is None or value == [] or value == {}:
                self.drop(leaf, "empty")
            else:
                self.drop(leaf, "no rlc counterpart; not carried", severity="warning")


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
    if "gconfig" not in data and "rollout" not in data:
        return "it has no `gconfig` or `rollout` section, so it generates nothing: an SFT, DPO or reward-model config"
    return None


def import_areal(data: dict, line_of=lambda path: 0) -> ImportResult:
    """Map the plain data of an AReaL experiment config to spec v1; raises ImportRefused for non-RL configs."""
    why = refusal(data, line_of)
    if why:
        raise ImportRefused(why)
    imp = _Importer(data, line_of)
    from rlc.compiler.importers.areal_sections import map_sections

    map_sections(imp)
    imp.leftovers()
    return imp.result

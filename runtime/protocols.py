"""What the driver calls on an inference engine and on a training worker, written down.

The driver talks to Ray actors, so nothing enforces these; tests/test_protocols.py checks every engine and worker
class against them. An engine runs either in the job (hf, vLLM: `LocalEngineProtocol`) or behind a URL
(`RemoteEngineProtocol`); a worker streams weights over CUDA IPC only where it implements
`IPCWeightSourceProtocol` (FSDP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlc.runtime.batch import TrainBatch


@runtime_checkable
class EngineProtocol(Protocol):
    """Every inference engine: rollouts, sleeping between them, and taking new weights."""

    def generate(self, prompts: list[list[int]], sampling: Any, n: int = 1, seed: int = 0) -> list[list[Any]]:
        """`n` completions (Completion) for each prompt of token ids, in prompt order."""
        ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...

    def reset_prefix_cache(self) -> None: ...

    def update_weights(self, state_dict: dict, version: int | None = None) -> int:
        """Load a full state dict (a Ray object ref resolved by Ray); returns the tensors loaded."""
        ...

    def init_weight_group(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        backend: str,
        *,
        override_existing: bool = False,
    ) -> Any:
        """Join the broadcast group the policy's rank 0 leads, as ranks rank..rank+tp-1."""
        ...

    def receive_weights(self, metas: list, version: int | None = None) -> int: ...


@runtime_checkable
class LocalEngineProtocol(EngineProtocol, Protocol):
    """An engine the job starts itself (hf, vLLM): placed on a node, and able to take weights over CUDA IPC."""

    def node_ip(self) -> str: ...

    def update_weights_ipc(self, handles_by_gpu_uuid: dict, entries: list) -> Any: ...

    def finish_weight_update(self, version: int | None = None) -> int: ...


@runtime_checkable
class WorkerProtocol(Protocol):
    """A training rank of one role (policy, ref, critic)."""

    def node_ip(self) -> str: ...

    def address(self) -> tuple[str, int]: ...

    def setup(self, master_addr: str, master_port: int) -> None: ...

    def layout(self) -> dict: ...

    def forward(self, batch: TrainBatch) -> Any:
        """Log-probs (or values) of this rank's shard."""
        ...

    def train_mini_batch(self, batch: TrainBatch, totals: dict) -> dict: ...

    def init_weight_group(self, master_address: str, master_port: int, world_size: int, backend: str) -> None: ...

    def weight_metas(self, dtype: str | None = None) -> list: ...

    def broadcast_weights(self, dtype: str | None = None) -> int: ...

    def packed_state_dict(self, dtype: str | None = None) -> dict | None: ...

    def save_checkpoint(self, directory: str) -> None: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def export_hf(self, directory: str, tokenizer_path: str) -> None: ...

    def offload(self, model: bool = True, optimizer: bool = True) -> None: ...

    def backload(self, model: bool = True, optimizer: bool = True) -> None: ...


@runtime_checkable
class IPCWeightSourceProtocol(WorkerProtocol, Protocol):
    """A worker that hands weights to colocated engines over CUDA IPC, one bucket of whole modules at a time."""

    def start_ipc_weights(self, dtype: str | None, threshold_bytes: int) -> None: ...

    def next_ipc_bucket(self) -> tuple[dict, list] | None: ...


@runtime_checkable
class RemoteEngineProtocol(EngineProtocol, Protocol):
    """An engine behind a URL, started by someone else: the driver first waits for it to answer."""

    def connect(self) -> str:
        """The served model's name, once the server answers."""
        ...

"""The delta transport (weight_sync_backend delta), in SkyRL 0.4's format: the trainer publishes what changed since
its last publish to a store (`weights.storage`), and each engine patches a local copy of the checkpoint and loads it.

Under `sync_dir`, version v is the directory `delta-{v:08d}`: `manifest.json` (version, base_version, one record
per changed tensor: name, dtype, shape, sizes, payload file and key, checksum of the new bytes) and safetensors
payload files of uint8 tensors, each a zstd-compressed XOR of the tensor's raw bytes (in the checkpoint's dtype)
against version v-1. Version 0 is the base checkpoint, a directory of safetensors files both sides have.

`Publisher` is the trainer's half (rank 0), `LocalCheckpoint` the engine's: it applies versions in order to its
copy of the base checkpoint under a file lock (engines on one node share one copy) and checks each patched tensor
against the manifest's checksum. A new publisher (a new run) has a new `sync_id`; a local copy patched under another
starts over from the base checkpoint.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import mmap
import os
import shutil
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import zstandard
from rlc.runtime.weights.storage import StoreError, join, open_store
from safetensors import safe_open
from safetensors.numpy import load as load_arrays
from safetensors.numpy import save as save_arrays

MANIFEST = "manifest.json"
CHECKSUM = "sha256"  # SkyRL's reader takes sha256 or xxh3-128; hashlib has the first on every Python
_DTYPES = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}


class DeltaSyncError(RuntimeError):
    """A publish or a load that cannot go on: a missing checkpoint or object, versions out of order, a bad checksum."""


def version_name(version: int) -> str:
    return f"delta-{version:08d}"


@dataclass(frozen=True)
class Location:
    """Where a tensor's bytes sit in a safetensors file."""

    path: Path
    offset: int
    nbytes: int
    shape: list[int]
    dtype: str


def locations(checkpoint: Path) -> dict[str, Location]:
    """Every tensor of a checkpoint directory's safetensors files, from their headers."""
    out = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                out[name] = Location(path, 8 + size + begin, end - begin, list(info["shape"]), info["dtype"])
    if not out:
        raise DeltaSyncError(f"delta weight sync needs a safetensors checkpoint, and {checkpoint} has none")
    return out


def checkpoint_dir(model: str | Path) -> Path:
    """The local directory of a checkpoint path or Hugging Face hub id (its safetensors files and configs)."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    from huggingface_hub import snapshot_download  # deferred: huggingface_hub, only a hub id needs it

    return Path(snapshot_download(str(model), allow_patterns=["*.json", "*.safetensors"]))


def receiver(base: str | Path, settings: dict) -> LocalCheckpoint:
    """An engine's local copy, from the receiving half of the job's delta settings (`Transport` sends them)."""
    return LocalCheckpoint(checkpoint_dir(base), settings["local_checkpoint_dir"], settings["cloud_download_workers"])


def checksum(data, algorithm: str) -> str:
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "xxh3-128":
        try:
            import xxhash  # deferred: xxhash, for deltas SkyRL's own publisher wrote (checked with it) only
        except ImportError:
            raise DeltaSyncError(
                "this delta's checksums are xxh3-128, which needs xxhash (pip install xxhash)"
            ) from None
        return xxhash.xxh3_128_hexdigest(data)
    raise DeltaSyncError(f"unknown delta checksum algorithm {algorithm!r}")


def tensor_bytes(tensor: torch.Tensor, loc: Location) -> np.ndarray:
    """A tensor's raw bytes in the checkpoint's dtype (a writable copy)."""
    if list(tensor.shape) != loc.shape:
        raise DeltaSyncError(f"a tensor of shape {list(tensor.shape)} for one of {loc.shape} in {loc.path}")
    t = tensor.detach().to(device="cpu", dtype=_DTYPES[loc.dtype]).contiguous()
    return t.view(torch.uint8).reshape(-1).numpy().copy()


class Publisher:
    """Trainer rank 0's half: keeps the bytes it last published (at first, the base checkpoint's) and publishes the
    XOR of each new tensor against them."""

    def __init__(self, base: Path, sync_dir: str, max_file_bytes: int, workers: int | None = None):
        self.sync_dir, self.max_file_bytes = sync_dir, max_file_bytes
        self.locations = locations(base)
        self.snapshot: dict[str, np.ndarray] = {}
        self.version = 0
        self.sync_id = uuid.uuid4().hex
        self.workers = workers or min(8, os.cpu_count() or 1)
        self.pool = ThreadPoolExecutor(max_workers=self.workers)

    def _base_bytes(self, name: str) -> np.ndarray:
        if name not in self.snapshot:
            loc = self.locations[name]
            with loc.path.open("rb") as f:
                f.seek(loc.offset)
                self.snapshot[name] = np.frombuffer(f.read(loc.nbytes), dtype=np.uint8).copy()
        return self.snapshot[name]

    def _patch(self, name: str, current: np.ndarray) -> tuple[str, np.ndarray, str, bytes | None]:
        base = self._base_bytes(name)
        digest = checksum(current.data, CHECKSUM)
        np.bitwise_xor(current, base, out=current)
        changed = bool(current.any())
        compressed = zstandard.ZstdCompressor(level=1).compress(current.data) if changed else None
        np.bitwise_xor(base, current, out=base)  # the snapshot is now this version
        return name, current, digest, compressed

    def publish(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> dict:
        """Publish the tensors (every one the trainer holds; those the checkpoint lacks, such as a tied head, are
        left out) as the next version; what the engines need to load it."""
        target = self.version + 1
        store = open_store(join(self.sync_dir, version_name(target)))
        records: list[dict] = []
        files: list[str] = []
        payload: dict[str, np.ndarray] = {}
        size = 0

        def flush() -> None:
            nonlocal payload, size
            if payload:
                files.append(f"delta-rank00000-file{len(files):06d}.safetensors")
                store.put(files[-1], save_arrays(payload))
                payload, size = {}, 0

        def consume(future: Future) -> None:
            nonlocal size
            name, current, digest, compressed = future.result()
            if compressed is None:
                return
            if payload and size + len(compressed) > self.max_file_bytes:
                flush()
            loc = self.locations[name]
            payload[name] = np.frombuffer(compressed, dtype=np.uint8)
            size += len(compressed)
            records.append(
                {
                    "name": name,
                    "dtype": str(_DTYPES[loc.dtype]).removeprefix("torch."),
                    "shape": loc.shape,
                    "uncompressed_num_bytes": loc.nbytes,
                    "compressed_num_bytes": len(compressed),
                    "payload_file": f"delta-rank00000-file{len(files):06d}.safetensors",
                    "payload_key": name,
                    "checksum": digest,
                    "checksum_algorithm": CHECKSUM,
                }
            )

        pending: deque[Future] = deque()
        for name, tensor in tensors:
            if name not in self.locations:
                continue
            pending.append(self.pool.submit(self._patch, name, tensor_bytes(tensor, self.locations[name])))
            if len(pending) >= self.workers:
                consume(pending.popleft())
        while pending:
            consume(pending.popleft())
        flush()
        manifest = {
            "version": target,
            "base_version": self.version,
            "tensors": records,
            "total_uncompressed_num_bytes": sum(r["uncompressed_num_bytes"] for r in records),
            "total_compressed_num_bytes": sum(r["compressed_num_bytes"] for r in records),
            "payload_files": files,
        }
        store.put(MANIFEST, json.dumps(manifest).encode())  # last: a version is there once its manifest is
        self.version = target
        return {
            "target_version": target,
            "version": target,
            "sync_dir": self.sync_dir,
            "uri": store.uri,
            "sync_id": self.sync_id,
            "changed_tensors": len(records),
        }


class LocalCheckpoint:
    """An engine's half: a patched copy of the base checkpoint under `root/weights`, its version in
    `root/.skyrl_weight_sync/state.json` (SkyRL's layout)."""

    def __init__(self, base: str | Path, root: str | Path, download_workers: int = 4):
        self.base, self.root = Path(base), Path(root)
        self.weights = self.root / "weights"
        self.state_path = self.root / ".skyrl_weight_sync" / "state.json"
        self.download_workers = max(1, download_workers)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.state_path.with_name("writer.lock"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _state(self) -> dict:
        try:
            return json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return {}

    def _write_state(self, version: int, sync_id: str | None, in_progress: bool = False) -> None:
        state = {"version": version, "write_in_progress": in_progress, "base_model_path": str(self.base)}
        self.state_path.write_text(json.dumps({**state, "sync_id": sync_id}))

    def fetch(self, update: dict) -> dict:
        """Bring the copy to the update's version (`Publisher.publish`'s answer, or SkyRL's), applying every
        version in between; what it did."""
        target = int(update["target_version"] if "target_version" in update else update["version"])
        sync_id = update.get("sync_id")
        with self._lock():
            state = self._state()
            patched = int(state.get("version", 0)) > 0
            if (
                state.get("write_in_progress")
                or state.get("sync_id") != sync_id
                or (patched and not self.weights.exists())
            ):
                # a new run, a patch cut short, or a copy removed under us: start over from the base checkpoint
                shutil.rmtree(self.weights, ignore_errors=True)
                state = {"version": 0}
            start = int(state.get("version", 0))
            if start > target:
                raise DeltaSyncError(f"{self.root} holds version {start}, past the requested {target}")
            self._write_state(start, sync_id, in_progress=True)
            if start < target and not self.weights.exists():
                _copy_tree(self.base, self.weights)
            for version in range(start + 1, target + 1):
                uri = update.get("uri") if version == target and update.get("uri") else None
                self._apply(uri or join(update["sync_dir"], version_name(version)), version)
            self._write_state(target, sync_id)
        return {"from_version": start, "version": target}

    def _apply(self, uri: str, version: int) -> None:
        store = open_store(uri)
        try:
            manifest = json.loads(store.get(MANIFEST))
        except StoreError as exc:
            raise DeltaSyncError(f"delta version {version} is not published: {exc}") from None
        if manifest["version"] != version or manifest["base_version"] != version - 1:
            raise DeltaSyncError(
                f"{uri} is version {manifest['version']} on {manifest['base_version']}, where {version} on "
                f"{version - 1} was expected"
            )
        with ThreadPoolExecutor(max_workers=self.download_workers) as pool:
            payloads = dict(zip(manifest["payload_files"], pool.map(store.get, manifest["payload_files"])))
        arrays = {name: load_arrays(data) for name, data in payloads.items()}
        where = locations(self.weights)
        bad = []
        for record in manifest["tensors"]:
            loc = where.get(record["name"])
            if loc is None:
                continue  # SkyRL's loader too leaves out a tensor the checkpoint lacks
            patch = zstandard.ZstdDecompressor().decompress(
                arrays[record["payload_file"]][record["payload_key"]].tobytes(),
                max_output_size=record["uncompressed_num_bytes"],
            )
            if len(patch) != loc.nbytes:
                raise DeltaSyncError(f"{uri}: the patch of {record['name']} has {len(patch)} bytes, not {loc.nbytes}")
            with loc.path.open("r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
                region = np.ndarray((loc.nbytes,), dtype=np.uint8, buffer=mm, offset=loc.offset)
                region ^= np.frombuffer(patch, dtype=np.uint8)
                if checksum(region.data, record.get("checksum_algorithm", "sha256")) != record["checksum"]:
                    bad.append(record["name"])
                del region
        if bad:
            raise DeltaSyncError(f"{uri}: after patching, {len(bad)} tensors differ from the published, e.g. {bad[:3]}")

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) of the current version, file by file."""
        directory = self.weights if self.weights.exists() else self.base
        for path in sorted(directory.glob("*.safetensors")):
            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)


def _copy_tree(src: Path, dst: Path) -> None:
    """A writable copy of the base checkpoint (never hard links: patching in place must not touch the base)."""
    if not any(src.glob("*.safetensors")):
        raise DeltaSyncError(f"delta weight sync needs a safetensors checkpoint, and {src} has none")
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file():
            shutil.copyfile(path, dst / path.name)

"""A checkpoint's manifest: the size and SHA-256 of every file in it, written once the files are, checked on resume.

A checksum proves the bytes are the ones written (a bit flip, a truncated copy, a half-synced bucket); it says nothing
of what was written, so the values a shard holds are the trainer's (docs/faults.md). SHA-256 (hashlib's, in OpenSSL,
with the CPU's SHA instructions where it has them) releases the GIL, so the files are hashed on up to 8 threads at
once; what it costs against other digests is measured in docs/faults.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = "manifest.json"
_CHUNK = 4 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)


def _threads() -> int:
    return min(8, os.cpu_count() or 1)


def write(directory: Path) -> dict:
    """Hash every file under `directory` and write the manifest beside them (whole, then renamed into place)."""
    names = _files(directory)
    with ThreadPoolExecutor(_threads()) as pool:
        digests = list(pool.map(lambda n: sha256(directory / n), names))
    files = {n: {"size": (directory / n).stat().st_size, "sha256": d} for n, d in zip(names, digests)}
    manifest = {"algorithm": "sha256", "files": files}
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=directory)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
    return manifest


def read(directory: Path) -> dict | None:
    """The manifest, or None when it is missing or unreadable."""
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return None
    return data


def problems(directory: Path, *, digests: bool) -> list[str]:
    """What is wrong with the files of `directory` against its manifest (nothing: []): a file missing, of another
    size, or (`digests`) with other bytes. Sizes alone cost a stat per file; digests read every byte."""
    manifest = read(directory)
    if manifest is None:
        return [f"{MANIFEST} is missing or unreadable"]
    found: list[str] = []
    checked: list[str] = []
    for name, entry in sorted(manifest["files"].items()):
        try:
            size = (directory / name).stat().st_size
        except OSError:
            found.append(f"{name} is missing")
            continue
        if size != entry.get("size"):
            found.append(f"{name} has {size} bytes, the manifest says {entry.get('size')}")
        else:
            checked.append(name)
    if digests and checked:
        with ThreadPoolExecutor(_threads()) as pool:
            actual = list(pool.map(lambda n: _digest_or_error(directory / n), checked))
        for name, digest in zip(checked, actual):
            if digest != manifest["files"][name].get("sha256"):
                found.append(f"{name}: its SHA-256 differs from the manifest's (the bytes changed after the save)")
    return found


def _digest_or_error(path: Path) -> str:
    try:
        return sha256(path)
    except OSError as exc:
        return f"unreadable: {exc}"

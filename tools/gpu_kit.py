#!/usr/bin/env python3
"""Build the kits that carry what rlc's GPU proof needs to the lent H100 (docs/gpu.md), and dry-run them here.

    python tools/gpu_kit.py build      # download the pinned wheels, unpack, prune, pack into .gpu-deps/kit-*/
    python tools/gpu_kit.py verify     # reassemble every kit in a temporary directory and import its pure Python

The device has Python 3.12 with torch 2.11.0+cu130 and transformers 5.17 but no Ray and no vLLM, and a call carries
at most 64 MiB with the working tree. So each kit is one site directory, unpacked here with
`pip install --no-deps --target` from cp312 manylinux wheels, pruned by deleting files the GPU proof never loads,
and packed as one tar.xz (`xz -9`: its 64 MiB window spans the uncompressed sm_90 kernels that deflate cannot):

- kit-a: rlc's pure-Python dependencies the device lacks, megatron-core, and core Ray without its Java jar and the
  dashboard's web client (`pytest -m gpu`, and `rlc run` under Ray);
- kit-b: vLLM 0.26.0 (the last release built on torch 2.11) cut to one H100 and a dense Llama/Qwen model, with the
  small packages an offline `LLM` imports; in its `_C` the fatbin entries an sm_90 GPU never loads are zeroed;
- kit-b-orig: that `_C` unmodified, the fallback when the zeroed one does not load (a call of its own: the two do
  not fit one call together).

What each kit holds is tools/gpu_kits.py; the zeroing is tools/fatbin.py. Each kit folder holds its archive and a
manifest.json (the wheels with versions and sha256, what was pruned and
zeroed, every file with its size and sha256). A part over 60 MiB is an error. Packing is cached by a key over
everything that goes in: a rebuild with nothing changed packs nothing. `build` also writes the facts the CPU test
of rlc's vLLM calls reads (tools/vllm_api.py) from the vLLM wheel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import vllm_api
from fatbin import FatbinError, zero_unloaded_entries
from gpu_kits import DEVICE_IMAGE, KITS, SDIST_ONLY, Kit
from import_closure import third_party

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / ".gpu-deps"
WHEELS = DEPS / "wheels"
PART_LIMIT = 60 * 2**20  # the device carries 64 MiB a call, the working tree (about 3.5 MiB) included
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    arg
    for tag in (*(f"manylinux_2_{v}_x86_64" for v in (5, 12, 17, 28, 31, 34, 35)), "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
]
FORMAT = 1  # bump when the layout of a kit changes without its inputs changing


class KitError(Exception):
    """A kit cannot be built or does not check out; the message says which and why."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"pip {' '.join(args[:2])} failed:\n{done.stderr.strip()[-2000:]}")


# -- wheels ------------------------------------------------------------------------------------------------------


def _find(name: str, version: str) -> Path | None:
    for path in sorted(WHEELS.glob("*.whl")):
        dist, ver = path.name.split("-")[:2]
        if _norm(dist) == _norm(name) and ver == version:
            return path
    return None


def download(pins: set[str]) -> dict[str, Path]:
    """The wheel of every pin, downloaded into .gpu-deps/wheels/ unless it is there (an sdist-only pin is built)."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    missing = sorted(p for p in pins if _find(*p.split("==")) is None)
    binary = [p for p in missing if p.split("==")[0] not in SDIST_ONLY]
    if binary:
        log(f"downloading {len(binary)} wheels into {WHEELS.relative_to(ROOT)}")
        _pip("download", "-q", "--no-deps", *TARGET, "-d", str(WHEELS), *binary)
    for pin in missing:
        if pin.split("==")[0] in SDIST_ONLY:
            log(f"building {pin} into a wheel (PyPI has its sdist only)")
            _pip("wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(WHEELS), pin)
    found = {p: _find(*p.split("==")) for p in pins}
    lost = sorted(p for p, w in found.items() if w is None)
    if lost:
        raise KitError(f"no wheel for {', '.join(lost)} in {WHEELS}")
    return {p: w for p, w in found.items() if w is not None}


def _pure(wheel: Path) -> bool:
    return wheel.name.endswith("-none-any.whl")


# -- building ------------------------------------------------------------------------------------------------------


@dataclass
class Built:
    kit: str
    key: str
    note: str
    parts: dict[str, dict] = field(default_factory=dict)  # archive name -> bytes, sha256
    wheels: dict[str, dict] = field(default_factory=dict)  # pin -> file, sha256, bytes, pure, top-level names
    pruned: dict[str, int] = field(default_factory=dict)  # path -> bytes deleted
    zeroed: dict[str, int] = field(default_factory=dict)  # path -> payload bytes zeroed
    unpacked_bytes: int = 0
    files: list[list] = field(default_factory=list)  # [path, bytes, sha256] of every file in the archive


def _key(kit: Kit, wheels: dict[str, Path]) -> str:
    # What goes into the archive; `imports` only steers the dry run.
    content = {k: v for k, v in asdict(kit).items() if k != "imports"}
    inputs = {"format": FORMAT, "kit": content, "wheels": {p: sha256(w) for p, w in sorted(wheels.items())}}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _top_level(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = {n.split("/")[0] for n in z.namelist()}
    return sorted(n.removesuffix(".py") for n in names if not n.endswith((".dist-info", ".data")))


def _delete(site: Path, pattern: str) -> int:
    size = 0
    for path in sorted(site.glob(pattern)):
        if path.is_dir() and not path.is_symlink():
            size += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        else:
            size += path.stat().st_size
            path.unlink()
    return size


def _pack(site: Path, archive: Path) -> None:
    """A reproducible tar.xz of `site`: sorted names, no owners or times, xz -9 on two threads."""
    tmp = archive.with_suffix(".tmp")
    with open(tmp, "wb") as out:
        tar = subprocess.Popen(
            [
                "tar",
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                "--mtime=@0",
                "-C",
                str(site),
                "-cf",
                "-",
                ".",
            ],
            stdout=subprocess.PIPE,
        )
        xz = subprocess.run(["xz", "-9", "-T2", "-c"], stdin=tar.stdout, stdout=out)
        tar.stdout.close()  # type: ignore[union-attr]
        if tar.wait() != 0 or xz.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise KitError(f"packing {archive.name} failed")
    tmp.replace(archive)


def manifest_path(kit: Kit) -> Path:
    return DEPS / kit.name / "manifest.json"


def read_manifest(kit: Kit) -> dict | None:
    path = manifest_path(kit)
    return json.loads(path.read_text()) if path.exists() else None


def build(kit: Kit, wheels: dict[str, Path]) -> dict:
    """Build one kit unless its folder already holds what the same inputs make; returns its manifest."""
    folder = DEPS / kit.name
    key = _key(kit, wheels)
    old = read_manifest(kit)
    if (
        old
        and old["key"] == key
        and all((folder / n).exists() and (folder / n).stat().st_size == p["bytes"] for n, p in old["parts"].items())
    ):
        parts = ", ".join(f"{name} {mib(part['bytes'])}" for name, part in old["parts"].items())
        log(f"{kit.name}: up to date ({parts})")
        return old
    built = Built(kit.name, key, kit.note)
    with tempfile.TemporaryDirectory(prefix=f"rlc-{kit.name}-", dir=DEPS) as tmp:
        site = Path(tmp) / "site"
        log(f"{kit.name}: unpacking {len(wheels)} wheels")
        _pip(
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--no-index",
            *TARGET,
            "--target",
            str(site),
            *map(str, wheels.values()),
        )
        for pin, wheel in sorted(wheels.items()):
            built.wheels[pin] = {
                "file": wheel.name,
                "bytes": wheel.stat().st_size,
                "sha256": sha256(wheel),
                "pure": _pure(wheel),
                "top_level": _top_level(wheel),
            }
        for pattern in kit.prune:
            if removed := _delete(site, pattern):
                built.pruned[pattern] = removed
        if kit.only:
            keep = {site / p for p in kit.only}
            for path in sorted(site.rglob("*"), reverse=True):
                if path.is_file() and path not in keep:
                    path.unlink()
                elif path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
        for rel in kit.zero:
            path = site / rel
            data = bytearray(path.read_bytes())
            try:
                built.zeroed[rel] = zero_unloaded_entries(data)
            except FatbinError as e:
                raise KitError(f"{kit.name}: {rel}: {e}") from None
            path.write_bytes(data)
        for path in sorted(site.rglob("*")):
            if path.is_file():
                rel, size = path.relative_to(site).as_posix(), path.stat().st_size
                built.files.append([rel, size, sha256(path)])
                built.unpacked_bytes += size
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.tar.xz"):
            stale.unlink()
        log(f"{kit.name}: packing {mib(built.unpacked_bytes)} with xz -9 (minutes for big binaries)")
        _pack(site, folder / kit.archive)
    archive = folder / kit.archive
    built.parts[kit.archive] = {"bytes": archive.stat().st_size, "sha256": sha256(archive)}
    manifest = asdict(built)
    manifest_path(kit).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def check_sizes(folder: Path) -> int:
    """The bytes a call carrying `folder` carries; a KitError when a part or the whole is over 60 MiB."""
    files = [p for p in folder.iterdir() if p.is_file()]
    for path in files:
        if path.stat().st_size > PART_LIMIT:
            raise KitError(f"{path} is {mib(path.stat().st_size)}, over the {mib(PART_LIMIT)} limit of a part")
    total = sum(p.stat().st_size for p in files)
    if total > PART_LIMIT:
        raise KitError(f"{folder} holds {mib(total)}, over the {mib(PART_LIMIT)} a call may carry with the tree")
    return total


def tracked_tree_bytes() -> int:
    """What the device copies of the working tree besides a kit: the files git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    ).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in listed if n and (ROOT / n.decode()).is_file())


def cmd_build(kits: list[Kit]) -> None:
    pins = {p for kit in kits for p in kit.pins}
    wheels = download(pins)
    for kit in kits:
        build(kit, {p: wheels[p] for p in kit.pins})
    tree = tracked_tree_bytes()
    for kit in kits:
        carried = check_sizes(DEPS / kit.name)
        log(f"{kit.name}: {mib(carried)} in .gpu-deps/{kit.name}, {mib(carried + tree)} carried with the tree")
    vllm = wheels.get("vllm==0.26.0")
    if vllm is not None:
        path = vllm_api.write_facts(vllm)
        log(f"vLLM 0.26 API facts: {path.relative_to(ROOT)}")


# -- the dry run -----------------------------------------------------------------------------------------------------


def verify(kit: Kit, into: Path) -> dict:
    """Reassemble `kit` under `into` as the device does (tarfile, 'data' filter), check every file against the
    manifest, and import each pure-Python package of it here; returns what was checked."""
    manifest = read_manifest(kit)
    if manifest is None:
        raise KitError(f"{kit.name} is not built: run `make gpu-kit`")
    folder = DEPS / kit.name
    for name, part in manifest["parts"].items():
        if sha256(folder / name) != part["sha256"]:
            raise KitError(f"{folder / name} does not match its manifest's sha256")
        with tarfile.open(folder / name, "r:xz") as tar:
            # checked file by file against the manifest below; the 'data' filter where the Python has it (3.11.4+)
            tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for rel, size, digest in manifest["files"]:
        path = into / rel
        if not path.is_file() or path.stat().st_size != size or sha256(path) != digest:
            raise KitError(f"{kit.name}: {rel} did not come out of the archive as it went in")
    pure = sorted(
        {
            n
            for w in manifest["wheels"].values()
            if w["pure"]
            for n in w["top_level"]
            if (into / n).exists() or (into / f"{n}.py").exists()
        }
    )
    imported = []
    if pure:
        only = into.parent / f"{kit.name}-pure"
        only.mkdir()
        for name in pure:
            src = into / name if (into / name).exists() else into / f"{name}.py"
            (only / src.name).symlink_to(src)
        # A namespace package (ruamel) is imported through its packages (ruamel.yaml).
        modules: list[str] = []
        for name in pure:
            folder = into / name
            if folder.is_dir() and not (folder / "__init__.py").exists():
                modules += [f"{name}.{p.parent.name}" for p in sorted(folder.glob("*/__init__.py"))]
            else:
                modules.append(name)
        code = "import importlib, sys\nfor n in sys.argv[1:]: importlib.import_module(n)"
        done = subprocess.run(
            [sys.executable, "-c", code, *modules],
            env={**os.environ, "PYTHONPATH": str(only)},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise KitError(f"{kit.name}: its pure-Python packages do not import:\n{done.stderr.strip()[-1500:]}")
        imported = modules
    needed = third_party(into, kit.imports)
    lacking = {
        name: sorted(importers)[:3]
        for name, importers in needed.items()
        if name not in DEVICE_IMAGE and not ((into / name).exists() or any(into.glob(f"{name}.*")))
    }
    if lacking:
        raise KitError(f"{kit.name}: imported for certain, neither in the kit nor on the device: {lacking}")
    return {"kit": kit.name, "files": len(manifest["files"]), "imported": imported, "needs": sorted(needed)}


def cmd_verify(kits: list[Kit]) -> None:
    with tempfile.TemporaryDirectory(prefix="rlc-gpu-kit-verify-") as tmp:
        for kit in kits:
            site, started = Path(tmp) / kit.name, time.monotonic()
            got = verify(kit, site)
            took = time.monotonic() - started
            imported = ", ".join(got["imported"]) or "none"
            log(f"{kit.name}: {got['files']} files reassembled and checked in {took:.0f} s; imported here: {imported}")
            if kit.imports:
                log(
                    f"{kit.name}: what {kit.imports[0]} imports for certain is in the kit or on the device: {got['needs']}"
                )
            shutil.rmtree(site)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("build", "verify"))
    parser.add_argument("--kit", action="append", choices=[k.name for k in KITS], help="only these kits")
    args = parser.parse_args(argv)
    kits = [k for k in KITS if not args.kit or k.name in args.kit]
    try:
        (cmd_build if args.command == "build" else cmd_verify)(kits)
    except KitError as e:
        log(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

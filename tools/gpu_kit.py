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

Each kit folder holds its archive and a manifest.json (the wheels with versions and sha256, what was pruned and
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
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import vllm_api
from import_closure import VLLM_OFFLINE, third_party

ROOT = Path(__file__).resolve().parent.parent
DEPS = ROOT / ".gpu-deps"
WHEELS = DEPS / "wheels"
PART_LIMIT = 60 * 2**20  # the device carries 64 MiB a call, the working tree (about 3.5 MiB) included
SM = 90  # the H100's compute capability
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"] + [
    arg
    for tag in (*(f"manylinux_2_{v}_x86_64" for v in (5, 12, 17, 28, 31, 34, 35)), "manylinux2014_x86_64", "any")
    for arg in ("--platform", tag)
]
FORMAT = 1  # bump when the layout of a kit changes without its inputs changing

# rlc's runtime and tests on the device, besides what its image holds (KINDS.md): the jsonschema set, ruamel.yaml,
# skyrl-gym with omegaconf and func_timeout (an sdist only, built into a wheel here), megatron-core for the three
# megatron GPU tests.
RLC_DEPS = (
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",
    "rpds-py==2026.9.1",
    "ruamel.yaml==0.19.1",
    "omegaconf==2.4.0",
    "skyrl-gym==0.4.0",
    "func_timeout==4.3.5",
)
SDIST_ONLY = {"func_timeout"}
# What vLLM 0.26's offline `LLM` imports that the device lacks (gpu-kit.md §2). openai 2.54 rather than the newest:
# it uses the device's httpx. mistral_common (numpy<2.4) and numba's pin (numpy<2.5) are left unmet on purpose.
VLLM_DEPS = (
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
    "fastapi==0.136.3",
    "starlette==1.10.0",
    "openai==2.54.0",
    "distro==1.9.0",
    "jiter==0.19.0",
    "sniffio==1.3.1",
    "openai-harmony==0.0.8",
    "msgspec==0.22.0",
    "pyzmq==27.3.0",
    "cbor2==6.3.0",
    "pybase64==1.5.1",
    "partial-json-parser==0.2.1.1.post7",
    "cachetools==8.0.2",
    "blake3==1.0.11",
    "setproctitle==1.3.8",
    "python-json-logger==4.2.0",
    "compressed-tensors==0.17.0",
    "loguru==0.7.3",
    "depyf==0.20.0",
    "astor==0.8.1",
    "dill==0.4.1",
)
VLLM_C = "vllm/_C_stable_libtorch.abi3.so"
# The import names of the packages the device image holds (KINDS.md's list of 2026-11-17).
DEVICE_IMAGE = frozenset(
    """absl accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated_doc anyio attr attrs botorch build certifi
    charset_normalizer chex click cloudpickle cmake colorama contourpy coverage cuda cupy cycler Cython diffrax e3nn
    einops equinox etils execnet filelock flatbuffers flax fontTools formulaic frozenlist fsspec gpytorch grpc h11 h5py
    hf_xet httpcore httpx huggingface_hub humanize hypothesis idna imageio iniconfig interface_meta jax jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy_loader lightning lightning_utilities linear_operator lineax llvmlite lxml
    markdown markdown_it markupsafe matplotlib mdurl mesonbuild ml_dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy_extensions nanobind narwhals networkx ninja numba numpy numpyro nvidia onnx onnx_ir
    onnxruntime onnxscript cv2 optax opt_einsum opt_einsum_fx optimistix orbax packaging pandas pathspec patsy peft
    PIL pip pluggy portalocker prometheus_client propcache google psutil pyarrow pybind11 cpuinfo pygments pyparsing
    pyproject_hooks pyre_extensions pytest pytest_benchmark pytest_cov pytest_mock pytest_timeout xdist dateutil
    pytorch_lightning yaml regex requests rich sacrebleu safetensors scikit_build_core skimage sklearn scipy seaborn
    sentencepiece sentence_transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
    tabulate tensorboard tensorboard_data_server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch_geometric torchmetrics torchvision tqdm transformers treescope triton typer
    typing_extensions typing_inspect urllib3 uvloop wadler_lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)


@dataclass(frozen=True)
class Kit:
    name: str  # its folder under .gpu-deps/
    pins: tuple[str, ...]
    prune: tuple[str, ...] = ()  # globs under the site directory, deleted
    zero: tuple[str, ...] = ()  # shared objects whose fatbin entries sm_90 never loads are zeroed
    only: tuple[str, ...] = ()  # keep only these paths (the fallback part)
    imports: tuple[str, ...] = ()  # modules whose certain imports the kit and the device image must hold (verify)
    note: str = ""

    @property
    def archive(self) -> str:
        return f"{self.name}.tar.xz"


KITS = (
    Kit(
        "kit-a",
        (*RLC_DEPS, "megatron-core==0.16.1", "ray==2.60.0"),
        prune=(
            "bin",
            "ray/jars",  # Java workers
            "ray/dashboard/client",  # the dashboard's web UI; rlc starts Ray with include_dashboard=False
            "ray/rllib",
            "ray/serve",
            "ray/llm",
            "ray/cpp",
        ),
        imports=("ray", "ray.util.placement_group", "ray.util.scheduling_strategies", "skyrl_gym"),
        note="rlc's pure-Python dependencies, megatron-core 0.16 and core Ray 2.60: `pytest -m gpu`",
    ),
    Kit(
        "kit-b",
        ("vllm==0.26.0", *VLLM_DEPS, *RLC_DEPS[:5]),
        prune=(
            "bin",
            "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",  # sm_80 only: an H100 runs FA3
            "vllm/_moe_C_stable_libtorch.abi3.so",  # mixture-of-experts kernels: dense models only
            "vllm/vllm-rs",  # the Rust server front end
            "vllm/third_party/fmha_sm100",  # Blackwell attention
            "vllm/third_party/deep_gemm",  # FP8 GEMMs
            "vllm/_flashmla_C.abi3.so",  # MLA (DeepSeek) and FP4
            "vllm/_flashmla_extension_C.abi3.so",
            "vllm/_qutlass_C.abi3.so",
            "vllm/entrypoints/serve/instrumentator/static",  # swagger UI
        ),
        zero=(VLLM_C,),
        imports=VLLM_OFFLINE,
        note="vLLM 0.26.0 for one H100 and a dense model, its small dependencies, the jsonschema set",
    ),
    Kit(
        "kit-b-orig",
        ("vllm==0.26.0",),
        only=(VLLM_C,),
        note=f"{VLLM_C} unmodified: the fallback when kit-b's zeroed copy fails to load",
    ),
)


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


# -- the fatbin entries an sm_90 GPU never loads -------------------------------------------------------------------

FATBIN_MAGIC = 0xBA55ED50
PTX, SASS = 1, 2


def _fatbin_section(data: bytes | bytearray) -> tuple[int, int]:
    """Offset and size of the ELF file's .nv_fatbin section."""
    (section_headers,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", data, section_headers + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    for name, *_, offset, size in headers:
        if data[names + name : data.index(b"\0", names + name)] == b".nv_fatbin":
            return offset, size
    raise KitError("no .nv_fatbin section")


def _fatbin_units(data: bytes | bytearray):
    """Each compiled unit of the section: its entries as (kind, arch, payload offset, payload size)."""
    pos, end = _fatbin_section(data)
    end += pos
    while pos + 16 <= end:
        magic, _version, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # units are 8-byte aligned
            continue
        entry, stop, entries = pos + header, pos + header + size, []
        while entry < stop:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (arch,) = struct.unpack_from("<I", data, entry + 28)
            entries.append((kind, arch, entry + entry_header, payload))
            entry += entry_header + payload
        yield entries
        pos = stop


def zero_unloaded_entries(data: bytearray, sm: int = SM) -> int:
    """Zero in place the payload of every fatbin entry a GPU of compute capability `sm` never loads, returning the
    bytes zeroed. The driver loads a unit's SASS for `sm`, or else JIT-compiles its newest PTX for an arch up to
    `sm`; so a unit with `sm` SASS keeps that entry alone, one without keeps that PTX alone. Headers, offsets and
    sizes are left as they were: only payload bytes change."""
    zeroed = 0
    for entries in _fatbin_units(data):
        sass = [e for e in entries if e[0] == SASS and e[1] == sm]
        ptx = [e for e in entries if e[0] == PTX and e[1] <= sm]
        keep = set(sass) if sass else {max(ptx, key=lambda e: e[1])} if ptx else set()
        for e in entries:
            if e not in keep:
                data[e[2] : e[2] + e[3]] = bytes(e[3])
                zeroed += e[3]
    return zeroed


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
    inputs = {"format": FORMAT, "kit": asdict(kit), "wheels": {p: sha256(w) for p, w in sorted(wheels.items())}}
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
            built.zeroed[rel] = zero_unloaded_entries(data)
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
            tar.extractall(into, filter="data")
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

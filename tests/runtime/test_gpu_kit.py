"""The GPU kits and the calls that run them on a lent GPU (tools/gpu_kit.py, tools/gpu/, docs/gpu.md), checked without
a GPU and without building the kits (CI never downloads them): the fatbin zeroing on a synthetic shared object, the
60 MiB limit, the device calls as the docs show them (under 2,000 characters, scripts that parse, carried folders
git ignores), and the kits themselves where `make gpu-kit` built them here.
"""

from __future__ import annotations

import re
import shlex
import struct
import subprocess
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import fatbin  # noqa: E402
import gpu_kit  # noqa: E402
import gpu_kits  # noqa: E402

COMMAND_LIMIT = 2000  # characters of one device call's command line
CARRY_LIMIT = 64 * 2**20


def _entry(kind: int, arch: int, payload: bytes) -> bytes:
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0, 64, len(payload))
    struct.pack_into("<I", head, 28, arch)
    return bytes(head) + payload


def _unit(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


def _shared_object(fatbin: bytes) -> bytearray:
    """An ELF64 file with a section-name table and a .nv_fatbin section holding `fatbin`."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    names += bytes(-len(names) % 8)
    fat_at = 64 + len(names)
    headers_at = fat_at + len(fatbin) + (-len(fatbin) % 8)
    elf = bytearray(b"\x7fELF" + bytes(60)) + names + fatbin + bytes(-len(fatbin) % 8)
    struct.pack_into("<Q", elf, 0x28, headers_at)
    struct.pack_into("<HHH", elf, 0x3A, 64, 3, 1)

    def section(name: int, kind: int, offset: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, offset, size, 0, 0, 8, 0)

    return elf + bytes(64) + section(1, 3, 64, len(names)) + section(11, 1, fat_at, len(fatbin))


def test_zeroing_keeps_exactly_what_an_sm90_gpu_loads():
    sass, ptx = fatbin.SASS, fatbin.PTX
    units = [
        _unit(_entry(sass, 80, b"\x91" * 96), _entry(sass, 90, b"\x92" * 96), _entry(ptx, 90, b"\x93" * 48)),
        bytes(8),  # padding between units
        _unit(_entry(ptx, 80, b"\x94" * 40), _entry(ptx, 86, b"\x95" * 40), _entry(sass, 100, b"\x96" * 72)),
        _unit(_entry(sass, 100, b"\x97" * 24)),  # nothing an H100 can run
    ]
    original = _shared_object(b"".join(units))
    data = bytearray(original)
    assert fatbin.zero_unloaded_entries(data) == 96 + 48 + 40 + 72 + 24
    assert len(data) == len(original)
    kept = {bytes([b]) for b in data if b in b"\x91\x92\x93\x94\x95\x96\x97"}
    assert kept == {b"\x92", b"\x95"}  # unit 1's sm_90 SASS, unit 2's newest PTX up to 9.0
    assert data.count(b"\x92" * 96) == 1 and data.count(b"\x95" * 40) == 1
    changed = [i for i, (a, b) in enumerate(zip(original, data)) if a != b]
    assert all(original[i] in b"\x91\x93\x94\x96\x97" for i in changed)  # payload bytes only, headers untouched


def test_a_shared_object_without_a_fatbin_is_refused():
    elf = _shared_object(b"")
    struct.pack_into("<I", elf, len(elf) - 64, 1)  # the section is renamed: no .nv_fatbin left
    with pytest.raises(fatbin.FatbinError, match="no .nv_fatbin"):
        fatbin.zero_unloaded_entries(elf)


def test_a_part_or_a_kit_over_60_mib_fails_loudly(tmp_path):
    part = tmp_path / "big.tar.xz"
    with open(part, "wb") as f:
        f.truncate(61 * 2**20)  # sparse: nothing is written
    with pytest.raises(gpu_kit.KitError, match=r"big.tar.xz is 61.0 MiB, over the 60.0 MiB limit"):
        gpu_kit.check_sizes(tmp_path)
    part.unlink()
    for name in ("a.tar.xz", "b.tar.xz"):
        with open(tmp_path / name, "wb") as f:
            f.truncate(31 * 2**20)
    with pytest.raises(gpu_kit.KitError, match="holds 62.0 MiB"):
        gpu_kit.check_sizes(tmp_path)
    (tmp_path / "b.tar.xz").unlink()
    assert gpu_kit.check_sizes(tmp_path) == 31 * 2**20


def test_verifying_kits_that_were_never_built_says_how_to_build_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_kit, "DEPS", tmp_path)
    assert gpu_kit.main(["verify", "--kit", "kit-a"]) == 1
    assert capsys.readouterr().err.strip() == "error: kit-a is not built: run `make gpu-kit`"


def _device_calls() -> list[dict]:
    """The device calls docs/gpu.md shows: ```device blocks of `key: value` lines."""
    text = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```device\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return [dict(line.split(": ", 1) for line in block.strip().splitlines()) for block in blocks]


def test_each_device_call_is_one_short_command_whose_scripts_parse():
    calls = _device_calls()
    assert {c["carry"] for c in calls} == {f".gpu-deps/{kit.name}" for kit in gpu_kits.KITS}
    for call in calls:
        command = call["command"]
        assert len(command) < COMMAND_LIMIT, command
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command
        scripts = [w for w in shlex.split(command) if w.endswith(".sh")]
        assert scripts, command
        for script in scripts + ["tools/gpu/common.sh"]:
            assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0, script
        assert 0 < int(call["timeout_s"]) <= 600
        ignored = subprocess.run(["git", "check-ignore", "-q", call["carry"]], cwd=ROOT)
        assert ignored.returncode == 0, f"{call['carry']} would travel as part of the tree too"


BUILT = [kit for kit in gpu_kits.KITS if gpu_kit.manifest_path(kit).exists()]


@pytest.mark.skipif(not BUILT, reason="no kit is built here (`make gpu-kit`)")
@pytest.mark.parametrize("kit", BUILT, ids=[k.name for k in BUILT])
def test_a_built_kit_fits_one_call_with_the_tree(kit):
    manifest = gpu_kit.read_manifest(kit)
    folder = gpu_kit.DEPS / kit.name
    for name, part in manifest["parts"].items():
        assert (folder / name).stat().st_size == part["bytes"]
    assert gpu_kit.check_sizes(folder) + gpu_kit.tracked_tree_bytes() < CARRY_LIMIT
    assert {p.split("==")[0] for p in manifest["wheels"]} == {p.split("==")[0] for p in kit.pins}


def test_the_import_closure_follows_certain_imports_only(tmp_path):
    from import_closure import third_party

    files = {
        "pkg/__init__.py": "import json\nfrom .core import run\n",
        "pkg/core.py": "import numpy\nfrom pkg.sub import helper\ntry:\n    import flash\nexcept ImportError:\n    pass\n",
        "pkg/sub/__init__.py": "if False:\n    import never\n",
        "pkg/sub/helper.py": "from ..extra import thing\nimport zmq.asyncio\n",
        "pkg/extra.py": "def thing():\n    import lazy\n",
        "pkg/unused.py": "import unreached\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = third_party(tmp_path, ["pkg"])
    assert found == {"numpy": {"pkg.core"}, "zmq": {"pkg.sub.helper"}}

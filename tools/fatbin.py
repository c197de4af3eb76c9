"""The fatbin entries of a CUDA shared object that a GPU of one compute capability never loads, zeroed in a copy.

A `.nv_fatbin` section holds compiled units, each with entries of machine code (SASS) for some archs and PTX for
others. The driver loads a unit's SASS for the GPU's arch, or else JIT-compiles its newest PTX for an arch up to it;
every other entry's payload is never read there and zeroes compress to nothing. Only payload bytes change.
"""

from __future__ import annotations

import struct

SM = 90  # the H100's compute capability


class FatbinError(ValueError):
    """The file is not a shared object with a .nv_fatbin section."""


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
    raise FatbinError("no .nv_fatbin section")


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

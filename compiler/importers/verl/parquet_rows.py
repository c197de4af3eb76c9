"""The row count of a Parquet file, read from its footer without a Parquet library (the compiler imports none).

A Parquet file ends with its FileMetaData (Thrift compact protocol), the metadata's length (4 bytes, little
endian) and `PAR1`. FileMetaData's field 3 is `num_rows` (i64); the fields before it (version, schema) are
skipped by their Thrift types.
"""

from __future__ import annotations

import os

MAGIC = b"PAR1"


class NotParquet(ValueError):
    """The file is not a Parquet file this reader can read."""


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise NotParquet("the footer ends early")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 70:
                raise NotParquet("a malformed integer in the footer")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, kind: int) -> None:
        if kind in (1, 2):  # a boolean field: the value is in the type
            return
        if kind == 3:
            self.pos += 1
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.pos += 8
        elif kind == 8:
            length = self.varint()  # read before pos is: the length's own bytes count
            self.pos += length
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(3 if head & 0x0F in (1, 2) else head & 0x0F)  # list booleans take a byte each
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4)
                    self.skip(types & 0x0F)
        elif kind == 12:
            self.struct_fields(lambda fid, k: self.skip(k))
        else:
            raise NotParquet(f"an unknown Thrift type {kind} in the footer")

    def struct_fields(self, visit) -> None:
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return
            delta, kind = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            last = fid
            if visit(fid, kind) is True:
                return


def parquet_rows(path: str) -> int:
    """Rows in the Parquet file at `path` (OSError when it cannot be read, NotParquet when it is not Parquet)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < 12:
            raise NotParquet("too short to be a Parquet file")
        f.seek(size - 8)
        tail = f.read(8)
        if tail[4:] != MAGIC:
            raise NotParquet("no Parquet footer (PAR1)")
        length = int.from_bytes(tail[:4], "little")
        if length <= 0 or length > size - 12:
            raise NotParquet("a footer length past the file's start")
        f.seek(size - 8 - length)
        reader = _Reader(f.read(length))
    found: list[int] = []

    def visit(fid: int, kind: int):
        if fid == 3 and kind == 6:
            found.append(reader.zigzag())
            return True
        reader.skip(kind)
        return None

    reader.struct_fields(visit)
    if not found:
        raise NotParquet("no row count in the footer")
    return found[0]

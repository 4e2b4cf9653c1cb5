"""pwal files: a stream of little-endian entries with no header, no magic and no CRC.

`iter_entries` walks a file entry by entry with bounded memory: it reads entry headers from a
buffer and seeks past values it is not asked for, so a file of any size is walked in constant
memory and values cost nothing unless wanted (the state rebuild wants them; verify does not).
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

# Entry types (limestone log_entry.h).
PUT, SNIPPET_HEADER, SNIPPET_END, DURABLE_EPOCH, REMOVE = 1, 2, 3, 4, 5
CANCELED_HEADER, CLEAR_STORAGE, ADD_STORAGE, REMOVE_STORAGE, PUT_BLOB = 6, 7, 8, 9, 10
ENTRY_NAMES = {PUT: "put", SNIPPET_HEADER: "snippet_header", SNIPPET_END: "snippet_end",
               DURABLE_EPOCH: "durable_epoch", REMOVE: "remove", CANCELED_HEADER: "canceled_snippet_header",
               CLEAR_STORAGE: "clear_storage", ADD_STORAGE: "add_storage", REMOVE_STORAGE: "remove_storage",
               PUT_BLOB: "put_blob"}
HEADERS = frozenset({SNIPPET_HEADER, CANCELED_HEADER})
STORAGE_OPS = frozenset({CLEAR_STORAGE, ADD_STORAGE, REMOVE_STORAGE})

_PUT = struct.Struct("<IIQ")  # key_len, value_len, storage_id
_REMOVE = struct.Struct("<IQ")  # key_len, storage_id
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_WV = struct.Struct("<QQ")
_STORAGE_OP = struct.Struct("<QQQ")  # storage_id, wv_major, wv_minor
BLOB_IDS_CHUNK = 64 << 10
_END = struct.Struct("<QB")  # epoch, crc_type

CHUNK = 1 << 20


class Entry(NamedTuple):
    """One entry. Fields that a type lacks are None; key/value only when asked for."""

    offset: int
    type: int
    size: int
    epoch: int | None = None  # snippet header/end
    storage_id: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    wv_major: int | None = None
    wv_minor: int | None = None
    blob_count: int = 0  # put_blob: its blob ids are blob_count u64s at blob_ids_at (see read_blob_ids)
    blob_ids_at: int | None = None
    crc_type: int | None = None  # snippet end


class Broken(NamedTuple):
    """Where the walk cannot go on: an entry cut by the end of the file, or an unknown type byte."""

    offset: int
    code: str  # short_entry | unknown_entry
    message: str
    type: int


class _Buffer:
    def __init__(self, f, size: int):
        self.f, self.size = f, size
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.i = 0

    def ensure(self, n: int) -> bool:
        """Make n bytes available at the cursor; False if the file ends first."""
        if len(self.buf) - self.i >= n:
            return True
        pos = self.base + self.i
        if pos + n > self.size:
            return False
        self.f.seek(pos)
        self.buf = self.f.read(max(n, CHUNK))
        self.base, self.i = pos, 0
        return len(self.buf) >= n

    def take(self, n: int) -> bytes:
        """n bytes at the cursor (read directly when larger than the buffer holds)."""
        if self.ensure(n) if n <= CHUNK else False:
            data = self.buf[self.i:self.i + n]
            self.i += n
            return data
        pos = self.base + self.i
        self.f.seek(pos)
        data = self.f.read(n)
        self.buf, self.base, self.i = b"", pos + n, 0
        return data

    def skip_to(self, pos: int) -> None:
        if self.base <= pos <= self.base + len(self.buf):
            self.i = pos - self.base
        else:
            self.buf, self.base, self.i = b"", pos, 0


def read_blob_ids(fd: int, at: int, count: int):
    """The `count` u64 blob ids at file offset `at`, read in bounded chunks (a damaged count can be huge)."""
    step = BLOB_IDS_CHUNK // 8
    for first in range(0, count, step):
        n = min(step, count - first)
        yield from struct.unpack(f"<{n}Q", os.pread(fd, 8 * n, at + 8 * first))


def iter_entries(path, *, with_data: bool = False, start: int = 0):
    """Yield each Entry of a pwal file in order, then a Broken if the file does not end on an entry
    boundary. Never raises on bad data (only OSError)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        b = _Buffer(f, size)
        b.skip_to(start)
        while True:
            pos = b.base + b.i
            if pos >= size:
                return
            b.ensure(1)
            kind = b.buf[b.i]
            if kind in (PUT, PUT_BLOB):
                fixed = 17
                if not b.ensure(fixed):
                    yield _short(pos, kind, size)
                    return
                key_len, value_len, storage = _PUT.unpack_from(b.buf, b.i + 1)
                end = pos + fixed + key_len + 16 + value_len
                if end + (4 if kind == PUT_BLOB else 0) > size:
                    yield _short(pos, kind, size)
                    return
                count, ids_at = 0, None
                if with_data:
                    b.i += fixed
                    key = b.take(key_len)
                    major, minor = _WV.unpack(b.take(16))
                    value = b.take(value_len)
                else:
                    b.skip_to(pos + fixed + key_len)
                    if not b.ensure(16):
                        yield _short(pos, kind, size)
                        return
                    major, minor = _WV.unpack_from(b.buf, b.i)
                    key = value = None
                    b.skip_to(end)
                if kind == PUT_BLOB:
                    b.skip_to(end)
                    b.ensure(4)
                    (count,) = _U32.unpack_from(b.buf, b.i)
                    end += 4 + 8 * count
                    if end > size:
                        yield _short(pos, kind, size)
                        return
                    ids_at = end - 8 * count
                b.skip_to(end)
                yield Entry(pos, kind, end - pos, None, storage, key, value, major, minor, count, ids_at)
            elif kind == REMOVE:
                if not b.ensure(13):
                    yield _short(pos, kind, size)
                    return
                key_len, storage = _REMOVE.unpack_from(b.buf, b.i + 1)
                end = pos + 13 + key_len + 16
                if end > size:
                    yield _short(pos, kind, size)
                    return
                b.i += 13
                if with_data:
                    key = b.take(key_len)
                else:
                    key = None
                    b.skip_to(pos + 13 + key_len)
                b.ensure(16)
                major, minor = _WV.unpack_from(b.buf, b.i)
                b.skip_to(end)
                yield Entry(pos, kind, end - pos, None, storage, key, None, major, minor)
            elif kind in HEADERS or kind == DURABLE_EPOCH:
                if not b.ensure(9):
                    yield _short(pos, kind, size)
                    return
                (epoch,) = _U64.unpack_from(b.buf, b.i + 1)
                b.i += 9
                yield Entry(pos, kind, 9, epoch)
            elif kind == SNIPPET_END:
                if not b.ensure(10):
                    yield _short(pos, kind, size)
                    return
                epoch, crc_type = _END.unpack_from(b.buf, b.i + 1)
                b.i += 10
                yield Entry(pos, kind, 10, epoch, crc_type=crc_type)
            elif kind in STORAGE_OPS:
                if not b.ensure(25):
                    yield _short(pos, kind, size)
                    return
                storage, major, minor = _STORAGE_OP.unpack_from(b.buf, b.i + 1)
                b.i += 25
                yield Entry(pos, kind, 25, None, storage, None, None, major, minor)
            else:
                yield Broken(pos, "unknown_entry", f"byte 0x{kind:02x} is not an entry type", kind)
                return


def _short(pos: int, kind: int, size: int) -> Broken:
    return Broken(pos, "short_entry", f"{ENTRY_NAMES.get(kind, kind)} entry is cut off by the end of the file "
                  f"({size - pos} bytes left)", kind)

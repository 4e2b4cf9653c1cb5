"""Write limestone directories the way limestone does, in any persistent format version (1–7).

Used by tests and benchmarks to make data of any size. Entry encoders return bytes; `LogDir`
writes a directory's manifest, pwal channels and epoch file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .epoch import DURABLE_EPOCH, EPOCH_NAME, RECORD
from .manifest import MANIFEST_NAME
from .pwal import (ADD_STORAGE, CANCELED_HEADER, CLEAR_STORAGE, PUT, PUT_BLOB, REMOVE, REMOVE_STORAGE,
                   SNIPPET_END, SNIPPET_HEADER)

NO_CRC = 1


def snippet_header(epoch: int, *, canceled: bool = False) -> bytes:
    return struct.pack("<BQ", CANCELED_HEADER if canceled else SNIPPET_HEADER, epoch)


def snippet_end(epoch: int) -> bytes:
    return struct.pack("<BQB", SNIPPET_END, epoch, NO_CRC)


def put(storage_id: int, key: bytes, value: bytes, wv: tuple[int, int], blob_ids: tuple[int, ...] = ()) -> bytes:
    kind = PUT_BLOB if blob_ids else PUT
    out = struct.pack("<BIIQ", kind, len(key), len(value), storage_id) + key + struct.pack("<QQ", *wv) + value
    if blob_ids:
        out += struct.pack(f"<I{len(blob_ids)}Q", len(blob_ids), *blob_ids)
    return out


def remove(storage_id: int, key: bytes, wv: tuple[int, int]) -> bytes:
    return struct.pack("<BIQ", REMOVE, len(key), storage_id) + key + struct.pack("<QQ", *wv)


def storage_op(kind: int, storage_id: int, wv: tuple[int, int]) -> bytes:
    assert kind in (CLEAR_STORAGE, ADD_STORAGE, REMOVE_STORAGE)
    return struct.pack("<BQQQ", kind, storage_id, *wv)


def durable_epoch(epoch: int) -> bytes:
    return RECORD.pack(DURABLE_EPOCH, epoch)


def manifest_bytes(version: int, instance_uuid: str | None = "00000000-0000-4000-8000-00000000abcd") -> bytes:
    """Compact JSON with sorted keys, as limestone writes it (v1 manifests carry no uuid)."""
    obj = {"format_version": "1.0" if version == 1 else "1.1", "persistent_format_version": version}
    if version > 1 and instance_uuid:
        obj["instance_uuid"] = instance_uuid
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class LogDir:
    """A limestone log directory being written: one open file per channel, plus the epoch file."""

    def __init__(self, path, *, version: int = 7, channels: int = 1, manifest: bool = True):
        """`manifest`: write one; False: the directory's own is kept and its files are appended to."""
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.version = version
        self.end_markers = version >= 6
        if manifest:
            (self.path / MANIFEST_NAME).write_bytes(manifest_bytes(version))
        self.channels = [open(self.path / f"pwal_{n:04d}", "ab") for n in range(channels)]
        self.epoch_file = open(self.path / EPOCH_NAME, "ab")

    def session(self, channel: int, epoch: int, entries: list[bytes], *, finished: bool = True) -> None:
        """One snippet: header, entries, and (v6+) the end marker when the session finished."""
        f = self.channels[channel]
        f.write(snippet_header(epoch))
        f.write(b"".join(entries))
        if finished and self.end_markers:
            f.write(snippet_end(epoch))

    def raw(self, channel: int, data: bytes) -> None:
        self.channels[channel].write(data)

    def make_durable(self, epoch: int) -> None:
        for f in self.channels:
            f.flush()
        self.epoch_file.write(durable_epoch(epoch))
        self.epoch_file.flush()

    def close(self) -> None:
        for f in self.channels + [self.epoch_file]:
            f.flush()
            os.fsync(f.fileno())
            f.close()

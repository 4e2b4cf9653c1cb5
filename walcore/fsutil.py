"""Durable file operations: every write of walvault's is a temporary file, fsync, rename, and an
fsync of the directory."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, chunks: Iterable[bytes]) -> None:
    """Write `chunks` to `path` so that it either does not change or holds all of them (no temporary file is
    left behind on an error)."""
    tmp = path.with_name(f".{path.name}.walvault-tmp")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_chunks(path: Path, offset: int = 0, size: int = 1 << 20):
    """The bytes of `path` from `offset` to its end, in chunks of bounded size."""
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(size):
            yield chunk


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            h.update(data)
    return h.hexdigest()

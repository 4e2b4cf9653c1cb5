"""Stored files written out of the repository into a directory, each checked against its recorded hashes: where a
restore stages them and what a restore that was interrupted left (the reverse of Repository.put_object; the
restore, snapshot and expire commands and the point-in-time restore read through it). The name each file takes in
its family's layout is the family's (walcore.family)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..findings import Refused
from ..fsutil import file_sha256, fsync_dir
from . import Repository
from .manifest import BackupManifest, FileEntry
from .storage import check_name

WRITEBACK_BYTES = 8 << 20  # a big file's writeback to disk is started at every this many bytes written
STAGING_MARK = ".walvault-restore.json"  # in the staging directory: which restore it holds (removed at the end)


def staging_dir(target: Path) -> Path:
    """Where a restore into `target` writes before it is whole: a hidden sibling of it."""
    return target.parent / f".{target.name}.walvault-restore"


def _inside(root: Path, name: str) -> Path:
    check_name(name)
    path = root / name
    real_root = os.path.realpath(root)
    if not os.path.realpath(path).startswith(real_root + os.sep):
        raise Refused(f"the manifest names {name!r}, which leads out of the restore directory", "damaged")
    return path


def materialize(repo: Repository, entries: list[tuple[str, FileEntry]], root: Path, progress) -> int:
    """Write each (name, entry) under root from the repository, checked; returns how many were there already.
    Files are written on every core at once, the biggest first (reading, zstd and SHA-256 release the GIL); the
    first error is raised once the others stopped. `progress` (a backup_common.Progress) advances by each file."""
    from ..runner import LocalRunner

    paths = [(_inside(root, name), entry) for name, entry in entries]  # every name checked before a write
    paths.sort(key=lambda p: -p[1].size)
    reused = 0
    for (_path, entry), was_there in LocalRunner().map(lambda p: _write_checked(repo, *p), paths, threads=True):
        reused += was_there
        progress.advance(entry.size)
    return reused


def _write_checked(repo: Repository, path: Path, entry: FileEntry) -> bool:
    """One stored file written at `path`, made durable; True when the file there held its bytes already."""
    if path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256:
        return True
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".walvault-part")
    try:
        with open(part, "wb") as f, _Writeback(f.fileno(), entry.size) as writeback:
            for chunk in repo.read_entry(entry, check_stored=False):  # what is written is checked
                f.write(chunk)
                writeback.written(len(chunk))
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return False


class _Writeback:
    """A big file's writeback to disk started as it is written, every WRITEBACK_BYTES, on a thread of its own (the
    call waits for the disk's queue): its fsync then waits for the last few MiB, not for all of it (on a 256 MB
    file, 0.18 s of a 0.65 s restore). Linux starts the writeback of a range's dirty pages on POSIX_FADV_DONTNEED
    (sync_file_range's SYNC_FILE_RANGE_WRITE, which Python lacks); the pages still dirty then stay cached. Where
    there is no posix_fadvise (macOS), the fsync does it all, as before. `written(n)` after n more bytes written."""

    def __init__(self, fd: int, size: int):
        self._fd, self._written, self._started, self._thread = fd, 0, 0, None
        if size >= 2 * WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            import queue
            import threading

            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="walvault-writeback", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        start = 0
        while (end := self._queue.get()) is not None:
            try:
                os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass  # only a head start: the fsync writes what this did not
            start = end

    def written(self, nbytes: int) -> None:
        self._written += nbytes
        if self._thread is not None and self._written - self._started >= WRITEBACK_BYTES:
            self._queue.put(self._written)
            self._started = self._written

    def __enter__(self) -> _Writeback:
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()


def fsync_tree(root: Path) -> None:
    """Every directory of a tree made durable."""
    for dirpath, _dirs, _names in os.walk(root):
        fsync_dir(Path(dirpath))


def reuse_staging(staging: Path, mark: dict) -> list[str]:
    """Create the staging directory, or reuse what an interrupted run of this same restore left there. One left
    by another restore (another backup or point, or no mark) is discarded: its files must not join this one."""
    notes = []
    if staging.is_dir():
        try:
            same = json.loads((staging / STAGING_MARK).read_text()) == mark
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(staging)
            notes.append(f"{staging} was left by an interrupted restore of something else: discarded")
    staging.mkdir(exist_ok=True)
    mark_path = staging / STAGING_MARK
    if not mark_path.exists():
        with open(mark_path, "w") as f:
            json.dump(mark, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(staging)
    return notes


def wal_dir_of(m: BackupManifest) -> Path:
    """Where a Tarantool backup's log goes: where it keeps its xlogs; a snapshot holds none, so where its source
    kept them (recorded), else beside its .snap."""
    xlog = next((e.name for e in m.files if e.kind == "xlog"), None)
    if xlog is not None:
        return Path(xlog).parent
    snap = m.checks.get("snapshot", {})
    return Path(snap["wal_dir"]) if snap.get("wal_dir") else Path(snap["name"]).parent

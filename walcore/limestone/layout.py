"""What the files of a limestone log directory are (limestone-files.md, 'Directory')."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
from pathlib import Path

from .catalog import CATALOG_BACKUP, CATALOG_NAME
from .epoch import EPOCH_NAME
from .manifest import MANIFEST_NAME

BLOB_NAME = re.compile(r"[0-9a-f]{16}\.blob")
ROTATED_EPOCH = re.compile(r"epoch\.\d{14}\.\d+")  # what limestone names a rotated epoch file


# Work and derived parts limestone rebuilds itself: never backed up, not checked.
DERIVED = ("data", "compaction_temp", "ctrl")


# Rewritten in place by limestone: each content is another version of the file.
REWRITTEN_KINDS = ("compacted", "catalog", "manifest")
_ROTATION_MS = re.compile(r"(?:pwal_\d{4}|epoch)\.(\d{14})\.\d+")


def is_limestone_dir(path: Path) -> bool:
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return MANIFEST_NAME in names or any(n.startswith("pwal_") for n in names)


def kind_of(name: str) -> str | None:
    """The kind of a top-level file of a log directory, or None for one limestone does not write."""
    if name in (MANIFEST_NAME, MANIFEST_NAME + ".back"):
        return "manifest"
    if name == EPOCH_NAME:
        return "epoch"
    if name.startswith(EPOCH_NAME):
        # epoch.<ms14>.<E>, or any other name limestone reads as a rotated epoch file (and deletes at startup)
        return "epoch_rotated"
    if name.startswith("pwal_"):
        # limestone reads every pwal_* file; a name of 9 bytes or fewer is an active channel.
        if ".compacted" in name:
            return "compacted"
        return "pwal" if len(os.fsencode(name)) <= 9 else "pwal_rotated"
    if name in (CATALOG_NAME, CATALOG_BACKUP):
        return "catalog"
    if BLOB_NAME.fullmatch(name):
        return "blob"  # a flat backup copy puts blob files at the top
    return None


def blob_path(root: Path, blob_id: int) -> Path:
    return root / "blob" / f"dir_{blob_id % 100:02d}" / f"{blob_id:016x}.blob"


def restored_name(name: str, kind: str) -> str:
    """Where a file of a backup is restored: its name there; a blob kept flat goes to blob/dir_NN/ as limestone
    reads it."""
    if kind == "blob" and "/" not in name:
        blob_id = int(name.split(".")[0], 16)
        return f"blob/dir_{blob_id % 100:02d}/{name}"
    return name


def is_live(root: Path) -> bool:
    """Whether a running limestone holds its exclusive lock on the manifest.

    A shared lock is tried and at once released: it can fail only against an exclusive holder, and
    it writes nothing.
    """
    try:
        fd = os.open(root / MANIFEST_NAME, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class LiveError(RuntimeError):
    """A running limestone holds the directory."""


@contextlib.contextmanager
def exclusive_lock(root: Path):
    """Hold limestone's own lock (flock LOCK_EX on the manifest) so that no limestone starts meanwhile."""
    fd = os.open(root / MANIFEST_NAME, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LiveError(f"{root} is in use by a running limestone (its manifest is locked)") from None
            raise
        yield
    finally:
        os.close(fd)


def rotated_name(root: Path, name: str, now_ms: int) -> str:
    """`<name>.<ms14>.<n>` with the first n whose name is free, as limestone names detached files."""
    n = 0
    while (root / f"{name}.{now_ms:014d}.{n}").exists():
        n += 1
    return f"{name}.{now_ms:014d}.{n}"


def rotation_time(name: str) -> float | None:
    """When limestone rotated a file, from its name (`pwal_NNNN.<ms14>.<n>`, `epoch.<ms14>.<E>`): the log's own
    time for retention (every entry in it was written before)."""
    m = _ROTATION_MS.fullmatch(Path(name).name)
    return int(m.group(1)) / 1000 if m else None


def path_instance(root: Path) -> str:
    """The instance of a directory whose manifest names none: derived from its real path."""
    return "path-" + hashlib.sha256(os.fsencode(os.path.realpath(root))).hexdigest()[:16]


def dir_instance(d) -> str:
    """The instance of a checked directory (a LimestoneDir): its manifest's, else derived from its path."""
    return d.manifest.instance_uuid or path_instance(Path(d.path))

"""Which Tarantool files are under a path, and how they group into data dirs and wal chains."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

SUFFIXES = {".xlog": "xlog", ".snap": "snap", ".vylog": "vylog", ".run": "run", ".index": "index"}
INPROGRESS = ".inprogress"
# Kinds whose files hold vclocks and name a data dir (runs and indexes live below vinyl_dir).
DIR_KINDS = frozenset({"xlog", "snap", "vylog"})


def kind_of(path: Path) -> tuple[str, bool] | None:
    """(kind, in progress) from a file name, or None for a file that is not Tarantool's."""
    name = path.name
    inprogress = name.endswith(INPROGRESS)
    if inprogress:
        name = name[: -len(INPROGRESS)]
    kind = SUFFIXES.get(os.path.splitext(name)[1])
    return (kind, inprogress) if kind else None


def name_number(path: Path) -> int | None:
    stem = path.name.split(".", 1)[0]
    return int(stem) if stem.isascii() and stem.isdigit() else None


@dataclass
class DataDir:
    """Files that belong to one instance's data dir (memtx_dir + wal_dir + vinyl_dir, or one dir)."""

    path: Path
    xlog_dirs: dict[Path, list[Path]] = field(default_factory=dict)  # wal dir -> xlogs, oldest first
    snaps: list[Path] = field(default_factory=list)  # oldest first
    vylogs: list[Path] = field(default_factory=list)


@dataclass
class Layout:
    files: list[Path]  # every Tarantool file once, in a stable order
    data_dirs: list[DataDir]
    ignored: list[Path]  # other files met while walking directories
    walked: set[str] = field(default_factory=set)  # real paths of the directories walked


def discover(paths: list[Path], claimed=lambda d: False) -> Layout:
    """Walk the given files and directories, leaving out directories `claimed` by another family.

    Symlinked directories are followed (a wal_dir on another disk), and each real file is listed once
    however many ways it is reached. Raises FileNotFoundError for a path that does not exist.
    """
    files: list[Path] = []
    ignored: list[Path] = []
    walked: set[str] = set()
    for path in paths:
        if path.is_dir():
            for root, dirs, names in os.walk(path, onerror=_raise, followlinks=True):
                real = os.path.realpath(root)
                if real in walked:  # a symlink loop, or a directory reached before
                    dirs[:] = []
                    continue
                walked.add(real)
                dirs[:] = sorted(d for d in dirs if not claimed(Path(root) / d))
                for name in sorted(names):
                    p = Path(root) / name
                    # only regular files: opening a FIFO or a device would block or read forever
                    (files if kind_of(p) and p.is_file() else ignored).append(p)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise OSError(f"{path}: not a regular file")
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    # Each real file once, and each real directory under one spelling (the first met), so that files of one
    # directory reached two ways still form one chain.
    unique: dict[str, Path] = {}
    spelling: dict[str, Path] = {}
    for p in files:
        real = os.path.realpath(p)
        if real not in unique:
            unique[real] = spelling.setdefault(os.path.realpath(p.parent), p.parent) / p.name
    files = list(unique.values())
    return Layout(files, _group(files), ignored, walked)


def _raise(error: OSError) -> None:
    raise error


def _group(files: list[Path]) -> list[DataDir]:
    """Group files into data dirs: a directory alone, or memtx_dir, wal_dir and vinyl_dir side by side
    (their parent) when no kind is in two of them — the parent's own files counted too, so that a work_dir
    holding the snapshots joins a wal_dir below it. Instances or copies of one kept side by side (each
    directory with its own xlogs and snapshots) each stand alone.
    """
    by_dir: dict[Path, list[Path]] = {}
    for p in files:
        k = kind_of(p)
        if k and not k[1] and k[0] in DIR_KINDS:
            by_dir.setdefault(p.parent, []).append(p)
    by_parent: dict[Path, list[Path]] = {}
    for d in by_dir:
        by_parent.setdefault(d.parent, []).append(d)
    groups: dict[Path, DataDir] = {}
    key_of: dict[Path, Path] = {}  # directory -> the data dir it belongs to; parents are decided first
    for parent in sorted(by_parent, key=lambda d: len(d.parts)):
        dirs = by_parent[parent]
        members = dirs + [parent] if key_of.get(parent) == parent else dirs
        kinds = [{kind_of(p)[0] for p in by_dir[d]} for d in members]
        one_data_dir = len(members) > 1 and sum(map(len, kinds)) == len(set().union(*kinds))
        for d in dirs:
            key = key_of[d] = parent if one_data_dir else d
            group = groups.setdefault(key, DataDir(key))
            order = sorted(by_dir[d], key=lambda p: (name_number(p) is None, name_number(p) or 0, p.name))
            if xlogs := [p for p in order if kind_of(p)[0] == "xlog"]:
                group.xlog_dirs[d] = xlogs
            group.snaps += [p for p in order if kind_of(p)[0] == "snap"]
            group.vylogs += [p for p in order if kind_of(p)[0] == "vylog"]
    for group in groups.values():
        group.snaps.sort(key=lambda p: (name_number(p) or 0, p.name))
    return [groups[k] for k in sorted(groups)]

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
    return int(stem) if stem.isdigit() else None


@dataclass
class DataDir:
    """Files that belong to one instance's data dir (memtx_dir + wal_dir + vinyl_dir, or one dir)."""

    path: Path
    xlog_dirs: dict[Path, list[Path]] = field(default_factory=dict)  # wal dir -> xlogs, oldest first
    snaps: list[Path] = field(default_factory=list)  # oldest first


@dataclass
class Layout:
    files: list[Path]  # every Tarantool file, in a stable order
    data_dirs: list[DataDir]
    ignored: list[Path]  # other files met while walking directories


def discover(paths: list[Path], claimed=lambda d: False) -> Layout:
    """Walk the given files and directories, leaving out directories `claimed` by another family.

    Raises FileNotFoundError for a path that does not exist.
    """
    files: list[Path] = []
    ignored: list[Path] = []
    for path in paths:
        if path.is_dir():
            for root, dirs, names in os.walk(path, onerror=_raise):
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
    files = list(dict.fromkeys(files))
    return Layout(files, _group(files), ignored)


def _raise(error: OSError) -> None:
    raise error


def _group(files: list[Path]) -> list[DataDir]:
    by_dir: dict[Path, list[Path]] = {}
    for p in files:
        k = kind_of(p)
        if k and not k[1] and k[0] in DIR_KINDS:
            by_dir.setdefault(p.parent, []).append(p)
    # memtx/, wal/ and vinyl/ side by side form one data dir: their parent.
    siblings: dict[Path, int] = {}
    for d in by_dir:
        siblings[d.parent] = siblings.get(d.parent, 0) + 1
    groups: dict[Path, DataDir] = {}
    for d, members in by_dir.items():
        key = d.parent if siblings[d.parent] > 1 else d
        group = groups.setdefault(key, DataDir(key))
        order = sorted(members, key=lambda p: (name_number(p) is None, name_number(p) or 0, p.name))
        xlogs = [p for p in order if kind_of(p)[0] == "xlog"]
        if xlogs:
            group.xlog_dirs[d] = xlogs
        group.snaps += [p for p in order if kind_of(p)[0] == "snap"]
    for group in groups.values():
        group.snaps.sort(key=lambda p: (name_number(p) or 0, p.name))
    return [groups[k] for k in sorted(groups)]

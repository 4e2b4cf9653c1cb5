"""Which files of a Tarantool data dir make a restorable set, and the verdict on that set.

A set is the newest snapshot, every xlog from the one replay starts from to the newest (for an
incremental backup also those since its parent's newest xlog, so that the log stays unbroken across
backups), and for vinyl the newest vylog and every run file it needs. It is chosen from the files' meta
blocks and names alone (cheap), so that the heavy work — reading, hashing, compressing, verifying — is done
once per file, on the chosen files only; `judge` then runs walcore's own chain, snapshot and vinyl checks on
exactly the chosen set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Refused
from .check import TarantoolFile, check_chains, check_vinyl
from .layout import DataDir, discover, kind_of
from .meta import MAX_META_SIZE, MetaError, Vclock, format_vclock, parse_meta, vclock_leq
from .vinyl import VylogError, replay
from .xlog import Span, read_rows


@dataclass
class SetFile:
    path: Path  # in the source
    name: str  # relative to the data dir root: where a restore puts it
    kind: str
    mutable: bool  # the newest xlog: Tarantool appends to it
    vclock: Vclock | None = None
    prev_vclock: Vclock | None = None


@dataclass
class TarantoolSet:
    root: Path
    instance: str
    files: list[SetFile]
    snapshot: SetFile | None
    notes: list[str] = field(default_factory=list)



def read_head(path: Path):
    with open(path, "rb") as f:
        head = f.read(MAX_META_SIZE)
    try:
        return parse_meta(head)
    except MetaError as e:
        raise Refused(f"{path}: its meta block is damaged ({e}): not backed up", "damaged") from None


def instance_of(root: Path) -> str:
    """The instance UUID of a data dir, from the meta block of its newest snapshot or xlog."""
    data_dir = _one_data_dir(root)
    candidates = data_dir.snaps[::-1] + [x for xs in data_dir.xlog_dirs.values() for x in xs[::-1]]
    for p in candidates:
        meta = read_head(p)
        if meta is not None and meta.instance:
            return meta.instance
    raise Refused(f"{root}: no snapshot or xlog names its instance", "cannot_check")


def _one_data_dir(root: Path) -> DataDir:
    layout = discover([root])
    if len(layout.data_dirs) != 1:
        raise Refused(f"{root} holds {len(layout.data_dirs)} Tarantool data dirs: back up one at a time",
                      "cannot_check")
    return layout.data_dirs[0]


def select(root: Path, *, since_xlog: str | None = None, checkpoint: list[Path] | None = None) -> TarantoolSet:
    """The set to back up. `since_xlog`: the parent backup's newest xlog (name), from which the log is kept
    unbroken; `checkpoint`: the files box.backup.start() returned (a live instance), else the newest snapshot."""
    root = Path(root)
    data_dir = _one_data_dir(root)
    if len(data_dir.xlog_dirs) > 1:
        raise Refused(f"{root} holds xlogs in {len(data_dir.xlog_dirs)} directories", "cannot_check")
    notes = []
    if checkpoint is not None:
        pinned = {os.path.realpath(p) for p in checkpoint}
        snaps = [p for p in data_dir.snaps if os.path.realpath(p) in pinned]
        vylogs = [p for p in data_dir.vylogs if os.path.realpath(p) in pinned]
    else:
        snaps, vylogs = data_dir.snaps, data_dir.vylogs
    if not snaps:
        raise Refused(f"{root} holds no snapshot: Tarantool would start an empty instance from it", "damaged")
    snap_path = snaps[-1]
    snap_meta = read_head(snap_path)
    if snap_meta is None or snap_meta.vclock is None:
        raise Refused(f"{snap_path} has no vclock in its meta block", "damaged")
    instance = snap_meta.instance
    files = [SetFile(snap_path, _rel(root, snap_path), "snap", False, snap_meta.vclock)]
    xlog_paths = next(iter(data_dir.xlog_dirs.values()), [])
    xlogs = []
    for p in xlog_paths:
        meta = read_head(p)
        if meta is None or meta.vclock is None:
            raise Refused(f"{p} is not an xlog Tarantool can read (no meta block)", "damaged")
        xlogs.append(SetFile(p, _rel(root, p), "xlog", False, meta.vclock, meta.prev_vclock))
    # Replay starts from the last xlog that begins at or before the snapshot (its rows past the snapshot count).
    first = max((i for i, x in enumerate(xlogs) if vclock_leq(x.vclock, snap_meta.vclock)), default=0)
    if since_xlog is not None:
        names = [x.name for x in xlogs]
        if since_xlog in names:
            first = min(first, names.index(since_xlog))
        else:
            notes.append(f"the parent's newest xlog {since_xlog} is gone from the source: the log between the "
                         "parent and this backup is not in the repository unless it was archived")
    chosen = xlogs[first:]
    if chosen:
        chosen[-1].mutable = True
    files += chosen
    if vylogs:
        vylog = vylogs[-1]
        # The newest vylog of a stopped data dir is appended to by the next dump; the one box.backup.start()
        # names is sealed (rotated after the checkpoint).
        files.append(SetFile(vylog, _rel(root, vylog), "vylog", checkpoint is None))
        for name in _needed_runs(vylog):
            files.append(SetFile(vylog.parent / name, _rel(root, vylog.parent / name), kind_of(Path(name))[0], False))
    elif any(kind_of(p) and kind_of(p)[0] in ("run", "index") for p in _walk_files(root)):
        raise Refused(f"{root} holds vinyl run files but no vylog: Tarantool cannot load them", "damaged")
    for f in files:
        if not f.path.is_file():
            raise Refused(f"{f.path} is needed for a restore but is missing", "damaged")
    return TarantoolSet(root, instance, files, files[0], notes)


def _rel(root: Path, path: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _walk_files(root: Path):
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            yield Path(dirpath) / n


def _needed_runs(vylog: Path) -> list[str]:
    try:
        runs = replay((pos, row.body) for pos, row in read_rows(vylog))
    except VylogError as e:
        raise Refused(f"{vylog}: {e}: Tarantool refuses this vylog", "damaged") from None
    except ValueError as e:
        raise Refused(f"{vylog}: {e}", "damaged") from None
    if runs is None:
        return []
    return sorted({name for run in runs.needed for name in run.file_names()})


def judge(tset: TarantoolSet, reports: dict[str, TarantoolFile]) -> dict:
    """Run walcore's chain, snapshot and vinyl checks on exactly the set; Refused with every reason when the
    set would not restore. Returns the set's verdict for the manifest."""
    by_kind: dict[str, list[Path]] = {}
    for f in tset.files:
        by_kind.setdefault(f.kind, []).append(f.path)
    xlogs = by_kind.get("xlog", [])
    data_dir = DataDir(tset.root, {xlogs[0].parent: xlogs} if xlogs else {}, by_kind.get("snap", []),
                       by_kind.get("vylog", []))
    check_vinyl(data_dir, reports, {os.path.realpath(p.parent) for p in by_kind.get("vylog", [])})
    chains = check_chains(data_dir, reports) if xlogs else []
    problems = [f"{Path(p).name} is {f.status}: " + "; ".join(f"{x.code} at {x.offset}: {x.message}"
                                                           for x in f.findings[:3])
                for p, f in reports.items() if f.status not in ("ok", "open")]
    problems += [x.message for chain in chains for x in chain.findings if x.code != "damaged_file"]
    snap = reports[str(tset.snapshot.path)]
    snapshot = chains[0].snapshots[0] if chains else {"covers": [], "replay_from": None}
    if xlogs and snapshot["replay_from"] is None and not vclock_leq(reports[str(xlogs[-1])].end_vclock() or {},
                                                              snap.vclock or {}):
        problems.append(f"no xlog continues from the snapshot at {format_vclock(snap.vclock)}")
    if problems:
        raise Refused("the set would not restore: " + "; ".join(dict.fromkeys(problems)), "damaged")
    position = snap.vclock
    if xlogs:
        end = reports[str(xlogs[-1])].end_vclock()
        position = {k: max(end.get(k, 0), snap.vclock.get(k, 0)) for k in set(end) | set(snap.vclock)}
    return {"position": {str(k): v for k, v in sorted(position.items())},
            "snapshot": {"name": _rel(tset.root, tset.snapshot.path),
                         "vclock": {str(k): v for k, v in sorted(snap.vclock.items())},
                         "replay_from": snapshot["replay_from"] and _rel(tset.root, Path(snapshot["replay_from"])),
                         "covers": [_rel(tset.root, Path(p)) for p in snapshot["covers"]]},
            "chain": "ok" if xlogs else "no xlogs",
            "vinyl": "ok" if by_kind.get("vylog") else "no vinyl"}


def verdict_record(f: TarantoolFile) -> dict:
    """What the manifest and the ledger keep of a file's verdict: enough to run the chain checks again."""
    out = f.to_json()
    del out["path"]
    out["lsns"] = {str(c): r for c, r in f.lsns.items()}
    out["edge_blocks"] = f.edge_blocks
    return out


def verdict_from_record(path: str, record: dict) -> TarantoolFile:
    def vclock(obj):
        return None if obj is None else {int(k): v for k, v in obj.items()}

    return TarantoolFile(path, record["kind"], record["status"], record["size"], record.get("rows"),
                         record.get("blocks"), record.get("zstd_blocks"), record.get("eof", False),
                         record.get("instance"), vclock(record.get("vclock")), vclock(record.get("prev_vclock")),
                         {int(c): list(r) for c, r in record.get("lsns", {}).items()},
                         edge_blocks=record.get("edge_blocks"))


def span_from_record(record: dict, size: int) -> Span | None:
    """The span of the first `size` bytes of an xlog as its verdict recorded them, for a scan of what was appended
    since to continue (None when the record cannot say: no block in it, or not a clean open xlog)."""
    edges = record.get("edge_blocks")
    if record.get("kind") != "xlog" or record.get("status") != "open" or record.get("eof") or not edges \
            or record.get("size") != size:
        return None
    # open and clean: its last row committed its transaction (else it would have been found damaged)
    return Span(first_pos=edges[0], end_pos=size, blocks=record["blocks"], zstd_blocks=record["zstd_blocks"],
                rows=record["rows"], lsns={int(c): list(r) for c, r in record["lsns"].items()}, last_commit=True,
                last_block_pos=edges[1])


__all__ = ["SetFile", "TarantoolSet", "select", "judge", "instance_of", "verdict_record", "verdict_from_record",
           "span_from_record"]

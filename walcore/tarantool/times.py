"""The time range of a file's rows: the first row's timestamp and the last one's.

Retention judges an xlog by the log's own time (the rows' timestamps), never by its name or mtime. Only the
first and the last block are decoded, found where the file's scan saw them (or, for a record of an older
walvault, by stepping over the blocks' fixed headers).
"""

from __future__ import annotations

from pathlib import Path

from .block import FIXHEADER_SIZE
from .cursor import BLOCK, BlockCursor, CrcMismatch
from .meta import MAX_META_SIZE, parse_meta, vclock_leq
from .row import TIMESTAMP, RowError, iter_rows


def row_times(path: Path | str, *, stop: int | None = None, edges: list[int] | None = None) -> list[float] | None:
    """[first, last] row timestamp of a checked file (of its blocks before byte `stop`), or None when its rows
    carry none. `edges`: the offsets of its first and last block, as its scan found them (else the blocks are
    stepped over to find them). ValueError when a block it decodes is damaged (a file that verified clean has
    none)."""
    with open(path, "rb") as f:
        if edges:
            first_block, last_block = edges
        else:
            first_block, last_block = _edges(f, path, stop)
        if first_block is None:
            return None
        first = _block_times(f, first_block, path)
        last = first if last_block == first_block else _block_times(f, last_block, path)
    if first is None or last is None:
        return None
    return [first[0], last[1]]


def _edges(f, path, stop: int | None) -> tuple[int | None, int | None]:
    meta = parse_meta(f.read(MAX_META_SIZE))
    if meta is None:
        raise ValueError(f"{path}: no meta block")
    size = f.seek(0, 2) if stop is None else stop
    cursor = BlockCursor(f, meta.size)
    next_block = cursor.next
    last_block = None
    while cursor.end + FIXHEADER_SIZE <= size and next_block() is BLOCK:  # not the EOF marker
        last_block = cursor.pos
    return (meta.size if last_block is not None else None), last_block


def _block_times(f, pos: int, path) -> tuple[float, float] | None:
    cursor = BlockCursor(f, pos)
    if cursor.next() is not BLOCK:
        raise ValueError(f"{path}: no block starts at {pos}")
    try:
        rows = cursor.read_block()
    except CrcMismatch:
        raise ValueError(f"{path}: block at {pos} is truncated or fails its CRC") from None
    stamps = []
    try:
        for row in iter_rows(rows, require_lsn=False):
            stamp = row.header.get(TIMESTAMP)
            if isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
                stamps.append(float(stamp))
    except RowError as e:
        raise ValueError(f"{path}: block at {pos}: {e}") from None
    return (min(stamps), max(stamps)) if stamps else None


def snapshot_time(path: Path) -> float | None:
    """When the checkpoint was taken: every row of a snapshot carries that time (a point-in-time restore picks
    its base by it)."""
    from .xlog import read_rows

    for _pos, row in read_rows(path):
        stamp = row.header.get(TIMESTAMP)
        return float(stamp) if isinstance(stamp, (int, float)) else None
    return None


def file_range(f, path: Path) -> dict:
    """A file's range in the log: its vclock from and to, and for an xlog or a snapshot the time of its rows
    (what retention judges it by)."""
    if f.vclock is None:
        return {}
    end = f.end_vclock() if f.kind == "xlog" else f.vclock
    out = {"vclock": [{str(k): v for k, v in sorted(f.vclock.items())}, {str(k): v for k, v in sorted(end.items())}]}
    if f.kind == "xlog":
        try:
            out["time"] = row_times(path, stop=f.size, edges=f.edge_blocks)
        except (OSError, ValueError):  # changed since it was checked: judged by its archive time instead
            out["time"] = None
    elif f.kind == "snap":
        taken = snapshot_time(path)
        out["time"] = None if taken is None else [taken, taken]
    return out


def snapshot_taken(vclock: dict[int, int], recorded: float | None, ranges: list[dict], *, started: float,
                   finished: float) -> float:
    """When a snapshot at `vclock`, stored by a backup that ran from `started` to `finished` (recorded to the
    second), holds rows up to: a time no earlier than its last row's commit. Tarantool 2.6 stamps the rows of
    every checkpoint a running instance makes after its first with that first one's time, so the snapshot's own
    row time (`recorded`) may say too early a time: a restore to a point before the checkpoint would take it for a
    base and hold rows committed after the point. The log says better, from xlogs' ranges
    ({"vclock": [from, to], "time": [first, last]}): the first row of the xlog that starts at the snapshot, or the
    last row of one that holds the snapshot's last row, was committed no earlier; the earliest of those. When the
    log says nothing (a snapshot backup, the xlog the checkpoint sealed removed), the snapshot existed when its
    backup finished (`recorded` is no bound: `walvault snapshot --connect` makes a checkpoint of the running
    instance); with no row time recorded at all, it was taken before the backup started."""
    def nonzero(v: dict) -> dict[int, int]:
        return {int(k): n for k, n in v.items() if n}

    snap = nonzero(vclock)
    bounds = []
    for r in ranges:
        times, span = r.get("time"), r.get("vclock")
        if not times or not span:
            continue
        begins, ends = nonzero(span[0]), nonzero(span[1])
        if begins == snap:
            bounds.append(times[0])
        elif vclock_leq(begins, snap) and vclock_leq(snap, ends):
            bounds.append(times[1])
    if bounds:
        return min(bounds)
    return started + 1 if recorded is None else finished + 1

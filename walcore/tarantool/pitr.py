"""Point-in-time cut of an xlog chain: the xlogs Tarantool must replay after a snapshot to stop at a point.

Tarantool replays every xlog it finds and has no setting to stop early, so the log itself must end at the
point: the xlogs before it are copied as they are, the one holding it is rewritten up to the last whole
transaction at or before it, and the later ones are left out.

Synchronous replication writes a transaction before a quorum has it: a ROLLBACK row after it may undo it (and
every transaction written after it), and a replay that ends before that row keeps it. So the log past the point is
read on up to the row that decides what the point keeps (a CONFIRM at or past it, a ROLLBACK, a PROMOTE or DEMOTE);
when that row undoes kept transactions, the point moves back to before them: a transaction the master undid is
never a restore point.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..fsutil import fsync_dir, write_atomic
from .cursor import BLOCK, EOF_MARKER, SHORT, BlockCursor, CrcMismatch
from .meta import MAX_META_SIZE, Meta, Vclock, format_vclock, parse_meta, parse_vclock, vclock_leq
from .iproto import CONFIRM, DEMOTE, PROMOTE, ROLLBACK
from .row import LSN, REPLICA_ID, TIMESTAMP, iter_rows
from .writer import TarantoolWriter

COPY_CHUNK = 1 << 20

_VCLOCK_ITEMS = re.compile(r"\d+ *: *\d+( *, *\d+ *: *\d+)*")
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
# A row header is a map whose first key is its type: a block holds a row deciding synchronous transactions
# (PROMOTE 31, DEMOTE 32, CONFIRM 40, ROLLBACK 41) only where these bytes are
# (a match elsewhere only costs decoding the block).
_DECIDING = re.compile(rb"[\x80-\x8f]\x00[\x1f\x20\x28\x29]")


@dataclass(frozen=True)
class Point:
    """Where a restore stops: after every transaction at or before a vclock, or at or before a time."""

    vclock: Vclock | None = None  # a row is at or before it when its lsn <= vclock.get(replica_id, 0)
    time: float | None = None  # unix seconds, compared with the rows' timestamps

    def __post_init__(self):
        if (self.vclock is None) == (self.time is None):
            raise ValueError("a point is either a vclock or a time")

    def describe(self) -> str:
        if self.vclock is not None:
            return f"vclock {format_vclock(self.vclock)}"
        return f"time {format_time(self.time)}"


class PointError(ValueError):
    """The chain cannot reach the point (the log ends before it, a gap, the snapshot is after it)."""


@dataclass
class CutResult:
    files: list[str]  # names written to out_dir, oldest first
    cut_file: str | None  # the xlog rewritten up to the point; None when the point is at an xlog's end
    rows: int  # rows kept in total, those already in the snapshot included
    vclock: Vclock  # after the last kept row: what box.info.vclock shows once Tarantool replayed the files
    last_time: float | None  # timestamp of the last kept transaction


def format_time(seconds: float) -> str:
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds").replace("+00:00", "Z")


def parse_point(text: str) -> Point:
    """'{1: 120, 0: 5}' or '1:120,0:5' -> a vclock; an ISO-8601 time ('2026-11-23T21:00:00Z',
    '2026-11-23 21:00:00+01:00'; no zone means UTC) or '@<unix seconds>' -> a time."""
    text = text.strip()
    if text.startswith("{"):
        return Point(vclock=parse_vclock(text))
    if _VCLOCK_ITEMS.fullmatch(text):
        return Point(vclock=parse_vclock("{" + text + "}"))
    if text.startswith("@"):
        try:
            seconds = float(text[1:])
        except ValueError:
            raise ValueError(f"{text!r}: '@' must be followed by unix seconds") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"{text!r}: unix seconds must be a finite number >= 0")
        return Point(time=seconds)
    if _DATE_TIME.match(text):
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as e:
            raise ValueError(f"{text!r} is not an ISO-8601 time: {e}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return Point(time=moment.timestamp())
    raise ValueError(f"{text!r} is not a point: give a vclock ('{{1: 120, 0: 5}}' or '1:120,0:5'), "
                     "an ISO-8601 time ('2026-11-23T21:00:00Z') or '@<unix seconds>'")



def _nonzero(vclock: Vclock) -> Vclock:
    return {component: lsn for component, lsn in vclock.items() if lsn}


def _at_or_before(point: Point, tx: list[tuple[int, int, float | None]]) -> bool:
    """Whether a transaction, as (component, lsn, timestamp) of its rows, is entirely at or before the point."""
    if point.vclock is not None:
        return all(lsn <= point.vclock.get(component, 0) for component, lsn, _ in tx)
    # A row without a timestamp cannot be shown to be before the point.
    return all(ts is not None and ts <= point.time for _, _, ts in tx)


def _where(point: Point, vclock: Vclock, last_time: float | None) -> str:
    """Where the log ends, in the point's terms first."""
    if last_time is None:
        return f"vclock {format_vclock(vclock)}"
    if point.time is not None:
        return f"{format_time(last_time)} (vclock {format_vclock(vclock)})"
    return f"vclock {format_vclock(vclock)} ({format_time(last_time)})"


@dataclass
class _Xlog:
    """One source xlog as the scan left it."""

    path: Path
    meta: Meta
    end: int  # bytes read: the meta, every whole block and the EOF marker when there is one
    eof: bool = False
    cut: int | None = None  # offset of the block holding the first transaction past the point
    kept: bytes = b""  # that block's rows before that transaction


def _blocks(f, xlog: _Xlog, size: int):
    """Yield (offset, rows) of each block from xlog.end on, moving xlog.end past what was read.

    `size` is the file's size when opened: a file still being appended to is read as it was then."""
    cursor = BlockCursor(f, xlog.end)
    while xlog.end < size:
        pos = xlog.end
        found = cursor.next()
        if found is EOF_MARKER:
            xlog.end, xlog.eof = cursor.end, True
            return
        if found is SHORT:
            raise ValueError(f"{xlog.path}: truncated block header at {pos}")
        if cursor.end > size:
            raise ValueError(f"{xlog.path}: block at {pos} is cut off by the end of the file")
        try:
            rows = cursor.read_block()
        except CrcMismatch:
            raise ValueError(f"{xlog.path}: block at {pos} fails its CRC") from None
        xlog.end = cursor.end
        yield pos, rows


def _scan(xlogs: list[Path], point: Point, start: Vclock) -> tuple[list[_Xlog], Vclock, int, float | None]:
    """Read the chain up to the first transaction past the point; refuse when it cannot reach the point.

    Returns the xlogs read (the last one marked with where to cut it, when the point is inside the chain),
    the vclock after the last kept row, the rows kept and the last kept transaction's timestamp."""
    vclock = _nonzero(start)
    rows = 0
    last_time = None
    log_end: Vclock | None = None  # where the previous xlog's rows end: where the next xlog must start
    scanned: list[_Xlog] = []
    for path in xlogs:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            meta = parse_meta(f.read(MAX_META_SIZE))
            if meta is None or meta.kind != "xlog":
                raise ValueError(f"{path}: not an xlog")
            begins = _nonzero(meta.vclock)
            if log_end is None and not vclock_leq(begins, vclock):
                raise PointError(f"{path.name} starts at {format_vclock(begins)}, after the snapshot at "
                                 f"{format_vclock(vclock)}: the rows between them are missing")
            if log_end is not None and begins != log_end:
                raise PointError(f"{path.name} starts at {format_vclock(begins)} but the log before it ends at "
                                 f"{format_vclock(log_end)}: a gap")
            log_end = dict(begins)
            xlog = _Xlog(path, meta, meta.size)
            scanned.append(xlog)
            for pos, payload in _blocks(f, xlog, size):
                tx: list[tuple[int, int, float | None]] = []
                tx_offset = 0
                for row in iter_rows(payload, require_lsn=True):
                    if not tx:
                        tx_offset = row.offset
                    tx.append((row.replica_id, row.lsn, row.header.get(TIMESTAMP)))
                    if not row.commit:
                        continue
                    if not _at_or_before(point, tx):
                        if any(lsn <= start.get(component, 0) for component, lsn, _ in tx):
                            raise PointError(f"the snapshot at {format_vclock(start)} holds a transaction after "
                                             f"the point ({path.name}, block at {pos}): no base before the point")
                        xlog.cut, xlog.kept = pos, bytes(payload[:tx_offset])
                        return scanned, vclock, rows, last_time
                    for component, lsn, _ in tx:
                        log_end[component] = lsn
                        vclock[component] = max(vclock.get(component, 0), lsn)
                    rows += len(tx)
                    last_time = tx[-1][2]
                    tx = []
                if tx:
                    raise ValueError(f"{path}: the block at {pos} ends inside a transaction")
    # No transaction past the point. A vclock point is reached when the log gets to it: later xlogs only hold
    # greater LSNs. A time point is not: an xlog always follows (Tarantool opens the next one when it closes
    # one, and reopens the empty one a clean shutdown leaves), and it may hold transactions before the point.
    if point.time is not None:
        after = "the snapshot"
        if scanned:
            newest = scanned[-1]
            after = f"its newest xlog {newest.path.name} ({'sealed' if newest.eof else 'still open'})"
        raise PointError(f"the archived log ends at {_where(point, vclock, last_time)}, before the point: no "
                         f"transaction in it is later, and what follows {after} may not be archived yet")
    if not vclock_leq(point.vclock, vclock):
        raise PointError(f"the log ends at {_where(point, vclock, last_time)}, before the point")
    return scanned, vclock, rows, last_time


def _undone(paths: list[Path], scanned: list[_Xlog], kept: Vclock) -> Vclock | None:
    """Where the kept log must end instead when a row past the point undoes some of it (None: nothing kept is
    undone). The rows after the cut are read up to the first that decides the kept transactions of its owner."""
    cut = scanned[-1] if scanned else None
    if cut is None or cut.cut is None:
        return None  # the log ends at the point: nothing after it decides anything
    for path in paths[len(scanned) - 1:]:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            meta = parse_meta(f.read(MAX_META_SIZE))
            cursor = BlockCursor(f, cut.cut if path == cut.path else meta.size)
            try:
                while cursor.next() == BLOCK and cursor.end <= size:
                    payload = cursor.read_block()
                    if _DECIDING.search(payload):
                        for row in iter_rows(payload, require_lsn=True):
                            if row.type in (PROMOTE, DEMOTE, CONFIRM, ROLLBACK) \
                                    and row.lsn > kept.get(row.replica_id, 0) \
                                    and (decided := _decided(row, kept)) is not False:
                                return decided
            except ValueError:
                return None  # unreadable past the kept part (a torn end): nothing read undoes it
    return None


def _decided(row, kept: Vclock) -> Vclock | None | bool:
    """What a deciding row past the kept log says of it: where the kept log must end instead, None (all of its
    owner's is committed: nothing kept is undone), or False (it decides none of it: read on)."""
    body = row.body if isinstance(row.body, dict) else {}
    owner, lsn = body.get(REPLICA_ID), body.get(LSN)
    if not isinstance(lsn, int):
        return False
    mine = kept.get(owner, 0)
    if row.type == CONFIRM:  # commits its owner's transactions ending at lsn or before
        return None if lsn >= mine else False
    if row.type == ROLLBACK:  # undoes its owner's transactions ending at lsn or later
        return {**kept, owner: lsn - 1} if lsn <= mine else None
    return {**kept, owner: lsn} if lsn < mine else None  # a new owner: the old one's after lsn undone


def _chunks(path: Path, start: int, stop: int):
    """The bytes of path[start:stop], in chunks of bounded size."""
    with open(path, "rb") as f:
        f.seek(start)
        left = stop - start
        while left:
            chunk = f.read(min(COPY_CHUNK, left))
            if not chunk:
                raise ValueError(f"{path} is shorter than when it was read")
            left -= len(chunk)
            yield chunk


def _rewrite(xlog: _Xlog, dst: Path) -> None:
    """The xlog up to the cut: its meta, its whole blocks before the cut as they are, the kept rows of the
    cut block as one block, the EOF marker."""
    meta = xlog.meta
    writer = TarantoolWriter(dst, "XLOG", instance=meta.instance, vclock=meta.vclock, prev_vclock=meta.prev_vclock)
    try:
        for chunk in _chunks(xlog.path, meta.size, xlog.cut):
            writer.write_raw(chunk)
        if xlog.kept:
            writer.write_rows(xlog.kept)
        writer.close()
    except BaseException:
        writer.abort()
        raise


def cut_chain(xlogs: list[Path], out_dir: Path, point: Point, *, start_vclock: dict[int, int]) -> CutResult:
    """Write to `out_dir` (an existing, empty directory) the xlogs that make a replay from a snapshot at
    `start_vclock` stop at `point`.

    `xlogs` is one unbroken chain, oldest first, from the xlog holding `start_vclock`; rows before it are kept
    (Tarantool skips them). What is kept is a prefix of the log: everything before the first transaction not
    entirely at or before the point. With several masters writing, a later transaction of another replica
    that is at or before the point is therefore not kept. A time point is reached only when the chain holds
    a transaction after it; a vclock point also when the chain ends exactly at it. A time point before the
    snapshot is found only when the chain holds rows from before the snapshot (the caller picks a snapshot
    taken before the point). Nothing is written when the point cannot be reached (PointError says why);
    every file is written under a temporary name and renamed once synced.
    """
    out_dir = Path(out_dir)
    if point.vclock is not None and not vclock_leq(start_vclock, point.vclock):
        absent = [str(c) for c, lsn in sorted(start_vclock.items()) if lsn and c not in point.vclock]
        hint = ""
        if absent:
            hint = f" (the point has no component {', '.join(absent)}: 0 there; component 0 counts local-space rows)"
        raise PointError(f"the snapshot at {format_vclock(start_vclock)} is after the point {point.describe()}: "
                         f"no base before the point{hint}")
    paths = [Path(p) for p in xlogs]
    scanned, vclock, rows, last_time = _scan(paths, point, start_vclock)
    if (before_undone := _undone(paths, scanned, vclock)) is not None:
        scanned, vclock, rows, last_time = _scan(paths, Point(vclock=before_undone), start_vclock)
    files: list[str] = []
    cut_file = None
    for xlog in scanned:
        name = xlog.path.name
        if xlog.cut is None:
            write_atomic(out_dir / name, _chunks(xlog.path, 0, xlog.end))  # up to the size it was read at
        elif xlog.cut == xlog.meta.size and not xlog.kept:
            break  # its first transaction is past the point: the point is the end of the previous xlog
        else:
            _rewrite(xlog, out_dir / name)
            cut_file = name
        files.append(name)
    fsync_dir(out_dir)
    return CutResult(files, cut_file, rows, vclock, last_time)

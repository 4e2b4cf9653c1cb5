"""Stream segments: xlogs that `walvault stream` writes from the rows a master sends, and their local spool.

A segment is an xlog as Tarantool writes one (meta with the master's instance UUID and the full vclock it starts
at, PrevVClock the segment before it; blocks of whole transactions, the rows byte for byte as received; the EOF
marker), named as Tarantool names an xlog: `<sum of its start vclock:020d>.xlog`. The open one is
written in the spool (`<spool>/<instance>/open.xlog`), a block per batch of transactions, each flushed and
fsynced, so that a streamer killed and started again seals what it had received whole and goes on after it.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from ..fsutil import fsync_dir
from .block import EOF_MAGIC
from .cursor import BLOCK, EOF_MARKER, BlockCursor, CrcMismatch
from .meta import MAX_META_SIZE, Vclock, parse_meta
from .receiver import Transaction
from .row import LSN, REPLICA_ID, iter_rows
from .writer import TarantoolWriter, file_name

OPEN_NAME = "open.xlog"


class SpoolBusy(OSError):
    """Another streamer of the instance works in the spool directory."""


class Spool:
    """The open segment of one master's stream, in a directory of its own, locked (flock) while it is used: two
    streamers of one instance (into two repositories) with one spool would write one file and take each other's
    segments. Leaving its context unlocks it."""

    def __init__(self, directory: Path, instance: str):
        self.dir = Path(directory) / instance
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.dir, os.O_RDONLY)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise SpoolBusy(f"{self.dir} is the spool of another walvault stream of instance {instance}: give "
                            "each stream its own --spool") from None
        self.instance = instance
        self._writer: TarantoolWriter | None = None
        self.start: Vclock | None = None
        self.prev: Vclock | None = None  # the start of the segment sealed before this one
        self.size = 0
        self.last_time: float | None = None  # the commit time of its last transaction

    def append(self, transactions: list[Transaction], vclock: Vclock) -> None:
        """Write whole transactions as one block, made durable; `vclock`: the stream's after them."""
        if not transactions:
            return
        if self._writer is None:
            self.start = _before(vclock, transactions)
            self._writer = TarantoolWriter(self.dir / OPEN_NAME, "XLOG", instance=self.instance, vclock=self.start,
                                           prev_vclock=self.prev)
        payload = b"".join(row for tx in transactions for row in tx.rows)
        self._writer.write_rows(payload)
        self._writer.f.flush()
        os.fsync(self._writer.f.fileno())
        self.size = self._writer.f.tell()
        self.last_time = transactions[-1].timestamp

    def seal(self) -> Path | None:
        """Close the open segment under its name in the spool (None: nothing open)."""
        if self._writer is None:
            return None
        path = self._writer.close()
        sealed = path.with_name(file_name(self.start, "xlog"))
        os.replace(path, sealed)
        fsync_dir(self.dir)
        self._writer = None
        self.prev, self.size = self.start, 0
        return sealed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        os.close(self._lock)

    def sealed(self) -> list[Path]:
        """Segments sealed and not yet stored (a streamer stopped between the two), oldest first."""
        return sorted(p for p in self.dir.glob("*.xlog") if p.name != OPEN_NAME)

    def recover(self) -> Path | None:
        """A segment a killed streamer left open: its whole blocks sealed as a segment (None: there is none, or
        it held no whole block). Its torn last block, if any, is dropped: those rows are received again."""
        tmp = self.dir / (OPEN_NAME + ".walvault-tmp")
        if not tmp.exists():
            return None
        with open(tmp, "rb") as f:
            head = f.read(MAX_META_SIZE)
            meta = parse_meta(head)
            if meta is None or meta.vclock is None:
                tmp.unlink()
                return None
            cursor, end, vclock = BlockCursor(f, meta.size), meta.size, dict(meta.vclock)
            while cursor.next() == BLOCK:
                try:
                    payload = cursor.read_block()
                except CrcMismatch:
                    break
                for header, _row in split_rows(payload):
                    vclock[header.get(REPLICA_ID, 0)] = header[LSN]
                end = cursor.end
        if end == meta.size:
            tmp.unlink()
            return None
        with open(tmp, "r+b") as f:
            f.truncate(end)
            f.seek(end)
            f.write(EOF_MAGIC)
            f.flush()
            os.fsync(f.fileno())
        sealed = self.dir / file_name(meta.vclock, "xlog")
        os.replace(tmp, sealed)
        fsync_dir(self.dir)
        return sealed


def _before(after: Vclock, transactions: list[Transaction]) -> Vclock:
    """The vclock before `transactions`, contiguous (the stream's is `after` them)."""
    before = dict(after)
    for tx in transactions:
        before[tx.replica_id] = min(before.get(tx.replica_id, tx.first_lsn), tx.first_lsn - 1)
    return before


def split_rows(payload: bytes) -> Iterator[tuple[dict, bytes]]:
    """Each row of a block's payload: its header decoded, and its bytes (header and body) as they are; RowError
    (a ValueError) at a malformed one."""
    rows = list(iter_rows(payload, require_lsn=True))
    ends = [r.offset for r in rows[1:]] + [len(payload)]
    for row, end in zip(rows, ends):
        yield row.header, bytes(payload[row.offset:end])


def build_tail(segments: list[Path], after: Vclock, out: Path, *, instance: str, prev: Vclock | None) -> Vclock:
    """One xlog at `out` continuing a log that ends at `after`: the rows of `segments` (contiguous, oldest first)
    past it, as they are, a block per segment block. Its meta starts at `after` (component 0 included: a replay
    checks it against the snapshot's) and names `prev` as PrevVClock. Returns the vclock after its last row; when
    no row is past `after`, nothing is written and `after` is returned. ValueError: the rows do not continue
    `after` (a gap), or a segment is damaged."""
    end = dict(after)
    writer = None
    try:
        for path in segments:
            for payload in _payloads(path):
                kept = []
                for header, row in split_rows(payload):
                    replica_id, lsn = header.get(REPLICA_ID, 0), header[LSN]
                    if lsn <= end.get(replica_id, 0):
                        continue  # the log before holds it already
                    if lsn != end.get(replica_id, 0) + 1:
                        raise ValueError(f"{path.name}: row {replica_id}:{lsn} does not follow {end.get(replica_id, 0)}"
                                         f": a gap")
                    end[replica_id] = lsn
                    kept.append(row)
                if kept:
                    if writer is None:
                        writer = TarantoolWriter(out, "XLOG", instance=instance, vclock=after, prev_vclock=prev)
                    writer.write_rows(b"".join(kept))
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    return end


def _payloads(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        meta = parse_meta(f.read(MAX_META_SIZE))
        if meta is None:
            raise ValueError(f"{path}: no xlog meta")
        cursor = BlockCursor(f, meta.size)
        while (found := cursor.next()) == BLOCK:
            try:
                yield cursor.read_block()
            except CrcMismatch as e:
                raise ValueError(f"{path}: block at {cursor.pos}: {e}") from None
        if found != EOF_MARKER:
            raise ValueError(f"{path}: no EOF marker after its last block at {cursor.pos}")


def file_rows(path: Path) -> Iterator[tuple[dict, bytes]]:
    """Each row of a sealed xlog (a segment, or the source's own), in order: its header decoded, and its bytes;
    ValueError at a damaged block or without the EOF marker."""
    for payload in _payloads(path):
        yield from split_rows(payload)

"""Rows: a msgpack header map, then a body (box/xrow.c: xrow_header_decode).

Two walks over a block's rows, which must agree on every block they both accept:
- `RowWalker.walk`, the fast one: one reused Unpacker per file, the header of each row decoded
  and its body skipped in C, with type and value checks folded into a few operations per row; it
  gives up (returns None) on anything unusual — local rows, a NOP, a gap, bad msgpack.
- `summarize_rows` over `iter_rows`, the exact one: it decides every block the fast one gave up on,
  so that each finding comes with the offset of its row.
What a row must be, as Tarantool's xrow layer reads it: a header map with an integer type (0x00),
integer lsn and replica_id where present (an lsn in every xlog row), then a body that is any valid
msgpack object (none for NOP, or at the end of the block).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from .block import MAX_BLOCK_SIZE

# Header keys.
TYPE, REPLICA_ID, LSN, TIMESTAMP, GROUP_ID, TSN, FLAGS = 0x00, 0x02, 0x03, 0x04, 0x07, 0x08, 0x09
# Body keys.
SPACE_ID = 0x10

ROW_TYPES = {
    2: "INSERT", 3: "REPLACE", 4: "UPDATE", 5: "DELETE", 9: "UPSERT", 12: "NOP",
    40: "CONFIRM", 41: "ROLLBACK", 100: "RUNINFO", 101: "PAGEINFO", 102: "ROWINDEX",
}
NOP = 12
# Header keys whose values Tarantool requires to be unsigned ints (xrow_header_decode).
UINT_KEYS = (REPLICA_ID, LSN, GROUP_ID, TSN, FLAGS)
_U64 = 1 << 64


class RowError(ValueError):
    def __init__(self, offset: int, code: str, message: str):
        super().__init__(message)
        self.offset = offset
        self.code = code


@dataclass(slots=True)
class Row:
    offset: int  # in the block's (decompressed) rows
    header: dict
    body: object  # a map for every request Tarantool writes; None for NOP

    @property
    def type(self) -> int:
        return self.header[TYPE]

    @property
    def type_name(self) -> str:
        return ROW_TYPES.get(self.type, str(self.type))

    @property
    def lsn(self) -> int:
        return self.header.get(LSN, 0)

    @property
    def replica_id(self) -> int:
        return self.header.get(REPLICA_ID, 0)

    @property
    def group_id(self) -> int:
        return self.header.get(GROUP_ID, 0)

    @property
    def tsn(self) -> int:
        raw = self.header.get(TSN)
        if raw is None:
            return self.lsn
        # Stored as lsn - tsn in a uint64, which wraps when tsn > lsn (local rows in a global tx).
        return (self.lsn - raw) % _U64

    @property
    def commit(self) -> bool:
        return commits(self.header)

    @property
    def space_id(self) -> int | None:
        return self.body.get(SPACE_ID) if isinstance(self.body, dict) else None


def _unpacker(payload) -> msgpack.Unpacker:
    size = max(len(payload), 1024)
    return msgpack.Unpacker(None, raw=True, use_list=False, strict_map_key=False, max_buffer_size=size)


def _check_header(header, offset: int, require_lsn: bool) -> None:
    if not isinstance(header, dict):
        raise RowError(offset, "bad_row", f"row header is a {type(header).__name__}, not a map")
    rtype = header.get(TYPE)
    if type(rtype) is not int:
        raise RowError(offset, "missing_row_key", "row header has no integer type (key 0x00)")
    for key in UINT_KEYS:
        if key in header:
            value = header[key]
            if type(value) is not int or value < 0:
                raise RowError(offset, "bad_row", f"row header key 0x{key:02x} is {value!r}, not an unsigned int")
    if require_lsn and not header.get(LSN):
        raise RowError(offset, "missing_row_key", "xlog row has no lsn (key 0x03)")


def commits(header: dict) -> bool:
    """Whether a row ends its transaction (the header's fields are known to be well-typed)."""
    return TSN not in header or bool(header.get(FLAGS, 0) & 1)


def iter_rows(payload, *, require_lsn: bool = False):
    """Yield each Row of a block's rows; raise RowError at the first malformed one."""
    unpacker = _unpacker(payload)
    unpacker.feed(payload)
    end = len(payload)
    pos = 0
    while pos < end:
        try:
            header = unpacker.unpack()
        except msgpack.OutOfData:
            raise RowError(pos, "bad_row", f"row header is cut off by the end of the block ({end - pos} bytes left)") from None
        except Exception as e:  # msgpack raises several types for malformed input
            raise RowError(pos, "bad_row", f"row header is not valid msgpack: {e}") from None
        _check_header(header, pos, require_lsn)
        body = None
        body_pos = unpacker.tell()
        if header[TYPE] != NOP and body_pos < end:
            try:
                body = unpacker.unpack()
            except msgpack.OutOfData:
                raise RowError(body_pos, "bad_row", "row body is cut off by the end of the block") from None
            except Exception as e:
                raise RowError(body_pos, "bad_row", f"row body is not valid msgpack: {e}") from None
        yield Row(pos, header, body)
        pos = unpacker.tell()


@dataclass(slots=True)
class RowSummary:
    """What verification keeps of a block's rows."""

    rows: int
    # component -> [first, last, min, max] LSN, in row order
    lsns: dict[int, list[int]]
    last_commit: bool
    # (offset in the rows, row number from 1, code, message) of each problem found
    errors: list[tuple[int, int, str, str]] = field(default_factory=list)


def summarize_rows(payload, *, xlog: bool) -> RowSummary:
    """The exact walk over one block's rows, for verification.

    It stops at a row it cannot read; an LSN out of sequence is noted and the walk goes on.
    """
    summary = RowSummary(0, {}, True)
    lsns = summary.lsns
    try:
        for row in iter_rows(payload, require_lsn=xlog):
            summary.rows += 1
            lsn = row.lsn
            r = lsns.get(row.replica_id)
            if r is None:
                lsns[row.replica_id] = [lsn, lsn, lsn, lsn]
            else:
                if xlog and lsn != r[1] + 1:
                    code, what = ("lsn_order", "goes back") if lsn <= r[1] else ("lsn_gap", "skips ahead")
                    summary.errors.append((row.offset, summary.rows, code,
                                           f"lsn {lsn} of component {row.replica_id} {what} after {r[1]}"))
                r[1] = lsn
                r[2] = min(r[2], lsn)
                r[3] = max(r[3], lsn)
            summary.last_commit = row.commit
    except RowError as e:
        summary.errors.append((e.offset, summary.rows + 1, e.code, str(e)))
    return summary


class _GiveUp(Exception):
    pass


class RowWalker:
    """The fast walk over the rows of a file's blocks, one block after another."""

    def __init__(self, xlog: bool):
        self.xlog = xlog
        self.reset()

    def reset(self) -> None:
        self.unpacker = msgpack.Unpacker(None, raw=True, use_list=False, strict_map_key=False,
                                         max_buffer_size=MAX_BLOCK_SIZE)
        self.consumed = 0

    def walk(self, payload) -> tuple[int, int, int, int, int, int, bool] | None:
        """(rows, component, first, last, min, max LSN, last row commits) of a block's rows, or None
        when the exact walk must decide."""
        unpacker = self.unpacker
        try:
            unpacker.feed(payload)  # BufferFull past MAX_BLOCK_SIZE (a zstd frame can unpack to more)
            self.consumed += len(payload)
            summary = self._walk_xlog(unpacker) if self.xlog else self._walk_other(unpacker)
            if unpacker.tell() != self.consumed:
                raise _GiveUp
            # tell() also counts the bytes of an object begun and not finished (rows cut off at the end of the
            # block): a nil fed now must come back as one, not finish that object
            unpacker.feed(b"\xc0")
            self.consumed += 1
            if next(unpacker) is not None:
                raise _GiveUp
            return summary
        except Exception:  # _GiveUp, or anything msgpack or a malformed header raises
            self.reset()
            return None

    @staticmethod
    def _walk_xlog(unpacker) -> tuple:
        # One component, contiguous LSNs, no NOP: what nearly every WAL block is. Every row is checked with
        # as few operations as can be: `^` and `|` raise TypeError on anything but an int, so they check
        # the type and the value at once. The one thing they let through is a msgpack bool, read as the
        # int it equals (the exact walk rejects it, as Tarantool does; only a writer's bug can put one
        # under a valid CRC, and finding it in every row would cost this walk a tenth of its speed).
        # A header of exactly type, replica_id, lsn and timestamp (a single-statement transaction: most rows)
        # needs no look at tsn, flags and group_id; `h[REPLICA_ID]` leaves local rows (component 0, no
        # replica_id) to the exact walk. `h[TIMESTAMP]` (not `TIMESTAMP in h`) also stops a header that is
        # a 4-item array, which `h[LSN]` and the rest would read by position (longer ones have no `get`).
        skip = unpacker.skip
        h = next(unpacker)
        first = last = h[LSN] | 0  # | 0: a bool goes on as the int it equals, as the compiled core keeps it
        comp = h[REPLICA_ID] | 0
        if first <= 0 or (first | comp | h.get(TSN, 0) | h.get(FLAGS, 0) | h.get(GROUP_ID, 0)) < 0 \
                or not h[TYPE] ^ NOP:
            raise _GiveUp
        skip()
        for h in unpacker:
            last += 1
            if h[LSN] ^ last or h[REPLICA_ID] ^ comp or not h[TYPE] ^ NOP:
                raise _GiveUp
            if (len(h) != 4 or h[TIMESTAMP] is None) and (h.get(TSN, 0) | h.get(FLAGS, 0) | h.get(GROUP_ID, 0)) < 0:
                raise _GiveUp
            skip()
        return last - first + 1, comp, first, last, first, last, commits(h)

    @staticmethod
    def _walk_other(unpacker) -> tuple:
        # .snap/.vylog/.run/.index: one component; LSNs in any order (runs are sorted by key).
        skip = unpacker.skip
        h = next(unpacker)
        comp = h.get(REPLICA_ID, 0) | 0
        first = lo = hi = lsn = h.get(LSN, 0) | 0
        if (first | comp | h.get(TSN, 0) | h.get(FLAGS, 0) | h.get(GROUP_ID, 0)) < 0 or not h[TYPE] ^ NOP:
            raise _GiveUp
        skip()
        rows = 1
        for h in unpacker:
            lsn = h.get(LSN, 0) | 0
            if h.get(REPLICA_ID, 0) ^ comp or not h[TYPE] ^ NOP or (lsn | h.get(TSN, 0) | h.get(FLAGS, 0) | h.get(GROUP_ID, 0)) < 0:
                raise _GiveUp
            if lsn > hi:
                hi = lsn
            elif lsn < lo:
                lo = lsn
            skip()
            rows += 1
        return rows, comp, first, lsn, lo, hi, commits(h)

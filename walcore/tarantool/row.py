"""Rows: a msgpack header map, then a body map (box/xrow.c: xrow_header_decode).

Two ways through a block's rows, which must agree:
- `iter_rows` walks row by row and knows each row's offset: the reader, and the judge of damage.
- `RowDecoder` + `summarize_batch` check many blocks at once in C-level passes (msgpack, map, min,
  max) and give up whenever anything is unusual; `summarize_rows` (over `iter_rows`) then decides,
  so that a finding always comes from the exact walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat
from operator import itemgetter

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
DML_TYPES = frozenset({2, 3, 4, 5, 9})
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
    body: dict | None

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
        return self.body.get(SPACE_ID) if self.body else None


def _unpacker(payload) -> msgpack.Unpacker:
    size = max(len(payload), 1024)
    return msgpack.Unpacker(None, raw=True, use_list=False, strict_map_key=False, max_buffer_size=size)


def _check_header(header, offset: int, require_lsn: bool) -> None:
    if not isinstance(header, dict):
        raise RowError(offset, "bad_row", f"row header is a {type(header).__name__}, not a map")
    rtype = header.get(TYPE)
    if type(rtype) is not int:
        raise RowError(offset, "missing_row_key", "row header has no integer type (key 0x00)")
    for key in (LSN, REPLICA_ID):
        value = header.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise RowError(offset, "bad_row", f"row header key 0x{key:02x} is {value!r}, not an unsigned int")
    if require_lsn and not header.get(LSN):
        raise RowError(offset, "missing_row_key", "xlog row has no lsn (key 0x03)")


def commits(header: dict) -> bool:
    """Whether a row ends its transaction; raises TypeError on a malformed tsn or flags field."""
    if TSN not in header:
        return True
    flags = header.get(FLAGS, 0)
    if type(flags) is not int or type(header[TSN]) is not int:
        raise TypeError("tsn and flags must be unsigned ints")
    return bool(flags & 1)


def iter_rows(payload, *, require_lsn: bool = False, dml_space_id: bool = False):
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
            if not isinstance(body, dict):
                raise RowError(body_pos, "bad_row", f"row body is a {type(body).__name__}, not a map")
        if dml_space_id and header[TYPE] in DML_TYPES and (body is None or type(body.get(SPACE_ID)) is not int):
            raise RowError(body_pos, "missing_row_key", f"{ROW_TYPES[header[TYPE]]} row has no space_id (key 0x10)")
        yield Row(pos, header, body)
        pos = unpacker.tell()


@dataclass(slots=True)
class RowSummary:
    """What verification keeps of a block's rows."""

    rows: int
    # component -> [first, last, min, max] LSN, in row order
    lsns: dict[int, list[int]]
    last_commit: bool
    # (offset in the rows, code, message) of the first malformed row, or None
    error: tuple[int, str, str] | None = None


def summarize_rows(payload, *, xlog: bool, dml_space_id: bool) -> RowSummary:
    """The exact walk over one block's rows, for verification."""
    lsns: dict[int, list[int]] = {}
    rows = 0
    last_commit = True
    try:
        for row in iter_rows(payload, require_lsn=xlog, dml_space_id=dml_space_id):
            rows += 1
            lsn = row.lsn
            r = lsns.get(row.replica_id)
            if r is None:
                lsns[row.replica_id] = [lsn, lsn, lsn, lsn]
            else:
                if xlog and lsn != r[1] + 1:
                    what = "goes back" if lsn <= r[1] else "skips ahead"
                    raise RowError(row.offset, "lsn_order" if lsn <= r[1] else "lsn_gap",
                                   f"lsn {lsn} of component {row.replica_id} {what} after {r[1]}")
                r[1] = lsn
                r[2] = min(r[2], lsn)
                r[3] = max(r[3], lsn)
            try:
                last_commit = row.commit
            except TypeError as e:
                raise RowError(row.offset, "bad_row", str(e)) from None
    except RowError as e:
        return RowSummary(rows, lsns, last_commit, (e.offset, e.code, str(e)))
    return RowSummary(rows, lsns, last_commit)


class RowDecoder:
    """Decodes the rows of a file's blocks, one after another, with one reused Unpacker (all in C)."""

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self.unpacker = msgpack.Unpacker(None, raw=True, use_list=False, strict_map_key=False,
                                         max_buffer_size=MAX_BLOCK_SIZE)
        self.consumed = 0

    def decode(self, payload) -> list | None:
        """Header and body objects of a block's rows; None if anything is odd (the exact walk decides)."""
        self.unpacker.feed(payload)
        self.consumed += len(payload)
        try:
            objs = list(self.unpacker)
        except Exception:  # malformed msgpack of any kind
            self._reset()
            return None
        if self.unpacker.tell() != self.consumed or not objs or len(objs) % 2:
            self._reset()
            return None
        return objs


def summarize_batch(blocks: list[list], *, xlog: bool, dml_space_id: bool) -> RowSummary | None:
    """Check the decoded rows of consecutive blocks in a few C-level passes.

    Returns the summary of all of them when every row is well-formed (and, in an xlog, the LSNs are
    contiguous and every block ends a transaction); None whenever the exact walk must decide.
    """
    batch = blocks[0] if len(blocks) == 1 else list(chain.from_iterable(blocks))
    headers, bodies = batch[0::2], batch[1::2]
    n = len(headers)
    try:
        # Unbound dict methods raise TypeError on anything that is not a map.
        if xlog:
            lsns = list(map(dict.get, headers, repeat(LSN)))
            kinds = set(map(itemgetter(TYPE, REPLICA_ID), headers))
        else:
            lsns = list(map(dict.get, headers, repeat(LSN), repeat(0)))
            kinds = set(zip(map(dict.get, headers, repeat(TYPE)), map(dict.get, headers, repeat(REPLICA_ID), repeat(0))))
        if dml_space_id:
            if not all(map(dict.__contains__, bodies, repeat(SPACE_ID))):
                return None
        else:
            any(map(dict.__contains__, bodies, repeat(None)))  # only to raise on a body that is not a map
        end = 0
        for objs in blocks:
            end += len(objs)
            if not commits(batch[end - 2]):
                return None
        if type(sum(lsns)) is not int:  # a None (missing lsn) raises, a float gives a float
            return None
    except (TypeError, KeyError):
        return None
    types = {t for t, _ in kinds}
    replicas = {r for _, r in kinds}
    if len(replicas) != 1 or NOP in types or {type(t) for t in types | replicas} != {int} or min(replicas) < 0:
        return None
    first, last = lsns[0], lsns[-1]
    if xlog:
        if first <= 0 or lsns != list(range(first, first + n)):
            return None
        lo, hi = first, last
    else:
        lo, hi = min(lsns), max(lsns)
        if lo < 0:
            return None
    return RowSummary(n, {replicas.pop(): [first, last, lo, hi]}, True)

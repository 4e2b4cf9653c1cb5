"""One Tarantool file, streamed: meta -> blocks -> rows (the layering of xlog.c).

`scan_file` checks a whole file or a byte range of it with bounded memory (one block at a time)
and returns a `FileScan`; ranges of one file scanned apart merge into the same result as one scan.
`read_rows` yields every row, for tools and tests that need the rows themselves.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field

from .. import scancore
from ..findings import FindingList
from .block import (EOF_MAGIC, FIXHEADER_SIZE, MAGIC_PREFIX, BlockError, decompress, parse_fixheader,
                    tarantool_crc32c)
from .cursor import BLOCK, EOF_MARKER, SHORT, BlockCursor, CrcMismatch
from .meta import MAX_META_SIZE, Meta, MetaError, parse_meta
from .row import RowError, RowSummary, RowWalker, iter_rows, summarize_rows

READ_BUFFER = 1 << 20
# Kinds written whole under a temporary name and renamed: no EOF marker means damage.
SEALED_KINDS = frozenset({"snap", "run", "index"})


@dataclass(slots=True)
class Span:
    """Blocks scanned in order: where they start and end, their rows and LSNs per component."""

    first_pos: int | None = None  # offset of the first block
    end_pos: int | None = None  # offset just past the last block (or the EOF marker)
    blocks: int = 0
    zstd_blocks: int = 0
    rows: int = 0
    # component -> [first, last, min, max]
    lsns: dict[int, list[int]] = field(default_factory=dict)
    last_commit: bool = True
    last_block_pos: int | None = None
    eof: bool = False  # the EOF marker was read
    stopped: bool = False  # scanning stopped early (damage it cannot read past)


def merge_spans(a: Span, b: Span, findings: FindingList, *, xlog: bool) -> None:
    """Append span b (which follows a) to a, checking the links between them."""
    if b.blocks == 0 and not b.eof:
        a.end_pos = b.end_pos if b.end_pos is not None else a.end_pos
        a.stopped |= b.stopped
        return
    if a.blocks and xlog and not a.last_commit:
        findings.add("unterminated_transaction", a.last_block_pos,
                     "the block's last row does not commit its transaction (a transaction never spans blocks)")
    for comp, (first, last, lo, hi) in b.lsns.items():
        r = a.lsns.get(comp)
        if r is None:
            a.lsns[comp] = [first, last, lo, hi]
            continue
        if xlog and first != r[1] + 1:
            code, what = ("lsn_order", "goes back") if first <= r[1] else ("lsn_gap", "skips ahead")
            findings.add(code, b.first_pos, f"lsn {first} of component {comp} {what} after {r[1]} of the previous block")
        r[1] = last
        r[2] = min(r[2], lo)
        r[3] = max(r[3], hi)
    if a.first_pos is None:
        a.first_pos = b.first_pos
    a.end_pos = b.end_pos
    a.blocks += b.blocks
    a.zstd_blocks += b.zstd_blocks
    a.rows += b.rows
    if b.blocks:
        a.last_commit = b.last_commit
        a.last_block_pos = b.last_block_pos
    a.eof = b.eof
    a.stopped |= b.stopped


class _File:
    """The file object a BlockCursor reads in order, plus random reads for resynchronisation."""

    def __init__(self, path):
        self.f = open(path, "rb", buffering=READ_BUFFER)
        self.size = os.fstat(self.f.fileno()).st_size

    def grown(self) -> int:
        """The size now: a live instance appends to its newest xlog while it is read."""
        self.size = os.fstat(self.f.fileno()).st_size
        return self.size

    def pread(self, n: int, pos: int) -> bytes:
        return os.pread(self.f.fileno(), n, pos)

    def close(self) -> None:
        self.f.close()


def _valid_block_at(f: _File, pos: int) -> bool:
    head = f.pread(FIXHEADER_SIZE, pos)
    if head[:4] == EOF_MAGIC:
        return pos + 4 == f.size
    if len(head) < FIXHEADER_SIZE:
        return False
    try:
        _, length, crc = parse_fixheader(head)
    except BlockError:
        return False
    if pos + FIXHEADER_SIZE + length > f.size:
        return False
    return tarantool_crc32c(f.pread(length, pos + FIXHEADER_SIZE)) == crc


def find_block(f: _File, start: int) -> int | None:
    """The offset of the first whole, CRC-valid block (or final EOF marker) at or after `start`."""
    chunk = READ_BUFFER
    pos = start
    while pos < f.size:
        data = f.pread(chunk + 3, pos)
        i = 0
        while True:
            hits = [j for j in (data.find(MAGIC_PREFIX, i), data.find(EOF_MAGIC, i)) if 0 <= j < chunk]
            if not hits:
                break
            j = min(hits)
            if _valid_block_at(f, pos + j):
                return pos + j
            i = j + 1
        pos += chunk
    return None


def _scan_blocks(f: _File, pos: int, span: Span, findings: FindingList, *, kind: str, stop: int | None) -> None:
    # Row headers decode into many small acyclic objects; cyclic GC passes over them would only cost time.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        _read_blocks(f, BlockCursor(f.f, pos), span, findings, kind == "xlog", stop)
    finally:
        if gc_was_enabled:
            gc.enable()


def _check_rows(span: Span, findings: FindingList, walker: RowWalker, pos: int, end: int, compressed: bool,
                payload) -> None:
    """Add a block's rows to the span, with their findings (a block _take_plain_blocks did not take)."""
    walked = walker.walk(payload)
    if walked is not None:
        rows, comp, first, last, lo, hi, commit = walked
        summary = RowSummary(rows, {comp: [first, last, lo, hi]}, commit)
    else:
        summary = summarize_rows(payload, xlog=walker.xlog)
    # What is inside this block, then its links to the previous one: the order verify._join keeps too.
    for offset, number, code, message in summary.errors:
        if compressed:
            findings.add(code, pos, f"row {number} of zstd block, at byte {offset} of its rows: {message}")
        else:
            findings.add(code, pos + FIXHEADER_SIZE + offset, f"row {number} of block at {pos}: {message}")
    merge_spans(span, Span(pos, end, 1, int(compressed), summary.rows, summary.lsns, summary.last_commit, pos),
                findings, xlog=walker.xlog)


def _take_plain_blocks(f: _File, cursor: BlockCursor, span: Span, walker: RowWalker, stop: int | None) -> None:
    """Take the blocks that continue the span as nearly every block does, and leave the cursor at the first
    one that does not (or at `stop`, or at the end): the careful loop in _read_blocks decides it.

    A block is taken when its header, CRC and zstd frame are sound, the fast row walk accepts its rows,
    and they continue the span's one component (in LSN order for an xlog) after a committed block.
    What it takes, it adds to the span exactly as _check_rows and merge_spans would, with less work:
    the span's running values are held in locals.
    """
    if not span.last_commit or len(span.lsns) != 1:
        return
    (comp, r), = span.lsns.items()
    xlog = walker.xlog
    size = f.size
    next_block = cursor.next
    read_block = cursor.read_block
    walk = walker.walk
    pos = cursor.end
    last, lo, hi = r[1], r[2], r[3]
    rows = blocks = zstd_blocks = 0
    last_block_pos = span.last_block_pos
    while stop is None or pos < stop:
        try:  # the EOF marker, the end, or damage: for the careful loop
            if next_block() is not BLOCK or cursor.end > size:
                break
            payload = read_block()
        except BlockError:
            break
        walked = walk(payload)
        if walked is None:
            break
        n, c, first, block_last, block_lo, block_hi, commit = walked
        if c != comp or (xlog and first != last + 1):
            walker.reset()
            break
        last = block_last
        if block_lo < lo:
            lo = block_lo
        if block_hi > hi:
            hi = block_hi
        rows += n
        blocks += 1
        zstd_blocks += cursor.compressed
        last_block_pos = pos
        pos = cursor.end
        if not commit:
            span.last_commit = False
            break
    r[1], r[2], r[3] = last, lo, hi
    span.rows += rows
    span.blocks += blocks
    span.zstd_blocks += zstd_blocks
    span.last_block_pos = last_block_pos
    if blocks:
        span.end_pos = pos
    cursor.seek(pos)


class _CompiledBlocks:
    """_take_plain_blocks in compiled code (walcore._scan.BlockScanner, the same rules), reading the file in
    chunks of its own. The bytes read stay held, so that after a block the careful loop decided the walk goes
    on from them; the chunk is no larger than the file, and grows to the largest block, no further."""

    def __init__(self, core, xlog: bool):
        self.scanner = core.BlockScanner(xlog, decompress)
        self.chunk = bytearray()
        self.base = self.held = 0  # the file's bytes [base, base + held) are in the chunk

    def __call__(self, f: _File, cursor: BlockCursor, span: Span, walker: RowWalker, stop: int | None) -> None:
        scanner = self.scanner
        if not scanner.begin(span.lsns, span.last_commit, span.blocks > 0):
            return
        pos = cursor.end
        size = f.size
        view = memoryview(self.chunk)
        while pos < size and (stop is None or pos < stop):
            fresh = not self.base <= pos < self.base + self.held
            if fresh:
                if not self.chunk:
                    self.chunk = bytearray(max(min(READ_BUFFER, size - pos), FIXHEADER_SIZE))
                    view = memoryview(self.chunk)
                self.base, self.held = pos, os.preadv(f.f.fileno(), [view], pos)
                if not self.held:
                    break  # the file shrank
            off = pos - self.base
            limit = self.held if stop is None else min(self.held, stop - self.base)
            taken, need = scanner.take(view[off:self.held], pos, limit - off, size)
            pos += taken
            if need == 0:
                break
            if need > 0:  # the block at pos runs past the bytes held
                if fresh and taken == 0 and need <= len(self.chunk):
                    break  # a whole chunk read, and still short: the file shrank; the careful loop says so
                if need > len(self.chunk):
                    view.release()
                    self.chunk = bytearray(need)
                    view = memoryview(self.chunk)
                self.held = 0
        view.release()
        lsns, last_commit, rows, blocks, zstd_blocks, first_pos, last_block_pos = scanner.end()
        if blocks:
            for comp, first, last, lo, hi in lsns:
                span.lsns[comp] = [first, last, lo, hi]
            span.last_commit = last_commit
            span.rows += rows
            span.blocks += blocks
            span.zstd_blocks += zstd_blocks
            if span.first_pos is None:
                span.first_pos = first_pos
            span.last_block_pos = last_block_pos
            span.end_pos = pos
        cursor.seek(pos)


def _read_blocks(f: _File, cursor: BlockCursor, span: Span, findings: FindingList, xlog: bool,
                 stop: int | None) -> None:
    size = f.size
    walker = RowWalker(xlog)
    core = scancore.compiled()
    take_blocks = _CompiledBlocks(core, xlog) if core is not None else _take_plain_blocks
    while stop is None or cursor.end < stop:
        take_blocks(f, cursor, span, walker, stop)
        pos = cursor.end
        if stop is not None and pos >= stop:
            break
        if pos >= size:
            # The end, as the file was when opened (a live file may have grown since: the scan is of that moment).
            span.end_pos = pos
            return
        try:
            found = cursor.next()
        except BlockError as e:
            findings.add(e.code, pos, f"block header: {e}")
            if not _resync(f, cursor, span, findings, pos):
                return
            continue
        if found is EOF_MARKER:
            span.eof = True
            span.end_pos = cursor.end
            if pos + 4 != size:
                findings.add("data_after_eof", pos + 4, f"{size - pos - 4} bytes follow the EOF marker")
            return
        if found is SHORT:
            findings.add("truncated_block", pos,
                         f"the file ends {cursor.end - pos} bytes into a 19-byte block header")
            span.end_pos, span.stopped = f.size, True
            return
        next_pos, length = cursor.end, cursor.length
        if next_pos > size and next_pos <= f.grown():
            size = f.size  # a block being appended when the file was opened: whole now
        if next_pos > size:
            findings.add("truncated_block", pos,
                         f"block of {length} bytes is cut off: the file ends {size - pos - FIXHEADER_SIZE} bytes into it")
            # A damaged length also looks like this; a valid block further on tells the two apart.
            if not _resync(f, cursor, span, findings, pos, tail_reported=True):
                return
            continue
        try:
            payload = cursor.read_block()
        except CrcMismatch as e:
            findings.add(e.code, pos, str(e))
            # A damaged payload keeps the framing; a damaged header field does not.
            if next_pos != size and not _valid_block_at(f, next_pos) and not _resync(f, cursor, span, findings, pos):
                return
            continue
        except BlockError as e:
            findings.add(e.code, pos, f"zstd block of {length} bytes: {e}")
            continue
        _check_rows(span, findings, walker, pos, next_pos, cursor.compressed, payload)
    # Stopped at `stop`: the next range starts where this one's scan got to, damaged blocks included.
    span.end_pos = cursor.end


def _resync(f: _File, cursor: BlockCursor, span: Span, findings: FindingList, bad_pos: int,
            tail_reported: bool = False) -> bool:
    """Continue at the next valid block after damage at bad_pos; False when there is none."""
    nxt = find_block(f, bad_pos + 1)
    if nxt is None:
        if not tail_reported:
            findings.add("unreadable_tail", bad_pos, f"no valid block follows: {f.size - bad_pos} bytes to the end are unreadable")
        span.end_pos, span.stopped = f.size, True
        return False
    findings.add("skipped_bytes", bad_pos, f"{nxt - bad_pos} bytes skipped to the next valid block at {nxt}")
    cursor.seek(nxt)
    return True


@dataclass(slots=True)
class FileScan:
    path: str
    kind: str | None
    size: int
    meta: Meta | None
    span: Span
    findings: FindingList


def read_meta(f: _File) -> Meta:
    meta = parse_meta(f.pread(MAX_META_SIZE, 0))
    if meta is None:
        raise MetaError(f.size, "the file ends inside the meta block" if f.size else "the file is empty")
    return meta


def scan_file(path, *, start: int | None = None, stop: int | None = None, search: bool = True) -> FileScan:
    """Check the blocks of a file (all, or those starting in [start, stop)); never raises on bad data.

    With `start`, scanning begins at the first valid block at or after it when `search` is set (a worker
    taking a slice of a big file), or exactly at it otherwise.
    """
    findings = FindingList()
    span = Span()
    f = _File(path)
    try:
        try:
            meta = read_meta(f)
        except MetaError as e:
            findings.add(e.code, e.offset, str(e))
            return FileScan(str(path), None, f.size, None, span, findings)
        if start is None or start <= meta.size:
            first = meta.size
        elif not search:
            first = start
        else:
            first = find_block(f, start)
            if first is None or (stop is not None and first >= stop):
                span.end_pos = first if first is not None else f.size
                return FileScan(str(path), meta.kind, f.size, meta, span, findings)
        _scan_blocks(f, first, span, findings, kind=meta.kind, stop=stop)
        return FileScan(str(path), meta.kind, f.size, meta, span, findings)
    finally:
        f.close()


def read_rows(path, *, stop: int | None = None):
    """Yield (block offset, Row) for every row of a file, or of its blocks before byte `stop` (the size it
    had when it was checked: a live instance may be appending); raise ValueError at the first damage."""
    f = _File(path)
    try:
        meta = read_meta(f)
        cursor = BlockCursor(f.f, meta.size)
        xlog = meta.kind == "xlog"
        while stop is None or cursor.end < stop:
            pos = cursor.end
            found = cursor.next()
            if found is EOF_MARKER or cursor.end == pos:  # the EOF marker, or no more bytes
                return
            if found is SHORT:
                raise ValueError(f"{path}: truncated block header at {pos}")
            try:
                payload = cursor.read_block()
            except CrcMismatch:
                raise ValueError(f"{path}: block at {pos} is truncated or fails its CRC") from None
            try:
                for row in iter_rows(payload, require_lsn=xlog):
                    yield pos, row
            except RowError as e:
                raise ValueError(f"{path}: block at {pos}, byte {e.offset} of its rows: {e}") from None
    finally:
        f.close()

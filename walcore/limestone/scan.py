"""One pwal file judged as limestone judges it (dblog_scan.cpp), plus what limestone does not say.

The walk follows limestone's scan state machine (tests/limestone_spec.md) exactly, so that verdicts agree with
`tglogutil inspect` and repair plans with `tglogutil repair [--cut]`; on top of it every problem
becomes a finding with its byte offset, and entries are counted per type. Three deliberate
differences, all stricter: the worse of two codes in a file is kept (tglogutil lets a later
repairable tail overwrite an earlier unrepairable one); a byte 0x2a (the newest limestone's
marker_chunk, which tglogutil's scanner stops at without a word) is an unknown entry; and once a
file shows end markers (format 6+), a durable snippet without one lost its end — a cut on an entry
boundary, or a type byte turned into a header — and is unrepairable (tglogutil sees nothing there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .. import scancore
from ..findings import FindingList
from .layout import blob_path
from .pwal import (ADD_STORAGE, CANCELED_HEADER, CLEAR_STORAGE, DURABLE_EPOCH, ENTRY_NAMES, PUT, PUT_BLOB, REMOVE,
                   REMOVE_STORAGE, SNIPPET_END, SNIPPET_HEADER, Broken, Entry, iter_entries, read_blob_ids)

# limestone's parse error codes, in its order of severity (the worst one per file wins).
OK, REPAIRED, TOBE_CUT, BROKEN_AFTER_MARKED, NONDURABLE, BROKEN_AFTER, CORRUPTED, UNEXPECTED = (
    0x00, 0x01, 0x08, 0x11, 0x40, 0x41, 0x42, 0x81)
STATUS_OF_CODE = {OK: "ok", REPAIRED: "ok", BROKEN_AFTER_MARKED: "repairable", NONDURABLE: "repairable",
                  BROKEN_AFTER: "repairable", CORRUPTED: "unrepairable", UNEXPECTED: "unrepairable"}
DATA_TYPES = frozenset({PUT, REMOVE, CLEAR_STORAGE, ADD_STORAGE, REMOVE_STORAGE, PUT_BLOB})
DURABLE_COUNT_NAMES = {PUT: "put", REMOVE: "remove", PUT_BLOB: "put_blob", CLEAR_STORAGE: "clear_storage",
                       ADD_STORAGE: "add_storage", REMOVE_STORAGE: "remove_storage"}
_NO_EPOCH = (1 << 64) - 1
_CHUNK = 256 << 10
# The compiled walk's buffer: a call's overhead is lost in it, it stays in the CPU's cache, and a value longer
# than what is left of it is skipped unread (on an OLTP-like mix 256 KiB beat 1 MiB by 7 %, 4 MiB by 17 %).
_COMPILED_CHUNK = 256 << 10
_FIELDS = struct.Struct("<II")
# More missing blobs than a report lists (FindingList.limit) need not be remembered.
MISSING_BLOBS = FindingList.limit + 1
_PRESENT_CACHE = 1 << 16


@dataclass
class PwalScan:
    path: str
    size: int
    code: int = OK  # as `tglogutil inspect` sees the file
    max_epoch: int = 0  # highest snippet header epoch, canceled ones included
    min_epoch: int | None = None
    durable: dict[int, int] = field(default_factory=dict)  # entry type -> count in durable snippets
    entries: int = 0  # every entry read, headers included
    snippets: dict[str, int] = field(default_factory=lambda: {"durable": 0, "nondurable": 0, "canceled": 0})
    # blob id -> offset of the first durable put referring to it, for blobs whose file is missing (at most
    # MISSING_BLOBS of them: a damaged id count can refer to millions)
    missing_blobs: dict[int, int] = field(default_factory=dict)
    findings: FindingList = field(default_factory=FindingList)
    # What `tglogutil repair` would write: headers to cancel (2 -> 6), and the broken tail.
    marks: list[int] = field(default_factory=list)
    tail_mark: int | None = None  # repair without --cut writes 6 here
    cut_at: int | None = None  # repair --cut truncates here
    repair_code: int = OK  # the file's code under repair (mark mode)
    canceled_tail: int | None = None  # damage inside a canceled snippet: ignored by limestone

    @property
    def epoch_range(self) -> list[int] | None:
        return None if self.min_epoch is None else [self.min_epoch, self.max_epoch]


def scan_pwal(path, durable_epoch: int, on_durable=None) -> PwalScan:
    """Walk one pwal file; never raises on bad data (only OSError).

    `on_durable`, if given, is called with every data Entry (key and value included) of the durable
    snippets, in file order: the entries limestone itself would apply. Without it, a fast walk
    handles well-formed files and gives way to the exact one at the first thing out of the ordinary.
    """
    if on_durable is None:
        fast = _scan_fast(path, durable_epoch)
        if fast is not None:
            return fast
    return _scan_exact(path, durable_epoch, on_durable)


class _BlobCheck:
    """Whether the blobs durable puts refer to have their files, in bounded memory: ids found present are
    remembered up to a limit (then forgotten and looked up again), missing ones up to MISSING_BLOBS."""

    def __init__(self, path, missing: dict[int, int]):
        self.path = path
        self.root = Path(path).parent  # blob/dir_NN/<id>.blob, or at the top in a flat backup copy
        self.missing = missing
        self.present: set[int] = set()
        self.file = None  # the pwal file, for check_ids_at

    def check_ids_at(self, at: int, count: int, offset: int) -> None:
        """Check the `count` blob ids stored at `at` in the pwal file."""
        if self.file is None:
            self.file = open(self.path, "rb", buffering=0)
        self.check(read_blob_ids(self.file.fileno(), at, count), offset)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()

    def check(self, blob_ids, offset: int) -> None:
        for blob in blob_ids:
            if len(self.missing) >= MISSING_BLOBS:
                return  # more than a report lists: the rest need no look
            if blob in self.present or blob in self.missing:
                continue
            where = blob_path(self.root, blob)
            if where.exists() or (self.root / where.name).exists():
                if len(self.present) >= _PRESENT_CACHE:
                    self.present.clear()
                self.present.add(blob)
            else:
                self.missing[blob] = offset


def _nondurable(scan: PwalScan, offset: int, epoch: int, durable_epoch: int) -> None:
    scan.snippets["nondurable"] += 1
    scan.marks.append(offset)
    scan.findings.add("nondurable_snippet", offset, f"snippet of epoch {epoch} is past the durable epoch "
                      f"{durable_epoch}: never committed (repairable: repair cancels it)")


def _scan_fast(path, durable_epoch: int) -> PwalScan | None:
    """The walk of a well-formed file, without building an entry object: headers parsed from a large
    buffer, values skipped. None at anything the exact walk must judge (a short or unknown entry, an
    entry where a header must come, a durable-epoch record)."""
    core = scancore.compiled()
    if core is not None:
        return _scan_compiled(core, path, durable_epoch)
    ld = durable_epoch
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        scan = PwalScan(str(path), size)
        blobs = _BlobCheck(path, scan.missing_blobs)
        counts = [0] * 11  # durable entries per type, puts and removes aside
        puts = removes = entries = durable = canceled = 0
        valid, first, markers_seen = True, True, False
        lo = hi = None
        # Never past `size`: what limestone appends meanwhile is for the next scan (the other walks stop there too).
        buf = f.read(min(_CHUNK, size))
        blen = len(buf)
        base = i = 0
        unpack_from = _FIELDS.unpack_from
        while True:
            if blen - i < 25:  # keep a whole fixed part in the buffer
                if base + blen < size:
                    base += i
                    f.seek(base)
                    buf, i = f.read(min(_CHUNK, size - base)), 0
                    blen = len(buf)
                if i >= blen:
                    break
            kind = buf[i]
            entries += 1
            if kind == PUT:
                if blen - i < 17 or first:
                    return None
                key_len, value_len = unpack_from(buf, i + 1)
                i += 33 + key_len + value_len
                if valid:
                    puts += 1
            elif kind == REMOVE:
                if blen - i < 5 or first:
                    return None
                i += 29 + int.from_bytes(buf[i + 1:i + 5], "little")
                if valid:
                    removes += 1
            elif kind == SNIPPET_HEADER or kind == CANCELED_HEADER:
                if blen - i < 9 or valid and not first and markers_seen:  # a durable snippet left unclosed
                    return None
                epoch = int.from_bytes(buf[i + 1:i + 9], "little")
                if lo is None:
                    lo = hi = epoch
                elif epoch > hi:
                    hi = epoch
                elif epoch < lo:
                    lo = epoch
                if kind == CANCELED_HEADER:
                    valid = False
                    canceled += 1
                elif epoch <= ld:
                    valid = True
                    durable += 1
                else:
                    valid = False
                    _nondurable(scan, base + i, epoch, ld)
                first = False
                i += 9
                continue
            elif kind == SNIPPET_END:
                if first or blen - i < 10:
                    return None
                valid, first, markers_seen = False, True, True
                i += 10
                continue
            elif CLEAR_STORAGE <= kind <= REMOVE_STORAGE:
                if first:
                    return None
                i += 25
                if valid:
                    counts[kind] += 1
            elif kind == PUT_BLOB:
                if blen - i < 17 or first:
                    return None
                pos = base + i
                key_len, value_len = unpack_from(buf, i + 1)
                n = 33 + key_len + value_len
                tail = os.pread(f.fileno(), 4, pos + n)
                if len(tail) < 4:
                    return None
                count = int.from_bytes(tail, "little")
                if pos + n + 4 + 8 * count > size:
                    return None
                if valid:
                    counts[kind] += 1
                    blobs.check(read_blob_ids(f.fileno(), pos + n + 4, count), pos)
                i += n + 4 + 8 * count
            else:
                return None
            if i > blen:  # past the buffer: a value longer than what is left of it; skip it unread
                if base + i > size:
                    return None
                base += i
                f.seek(base)
                buf, i = f.read(min(_CHUNK, size - base)), 0
                blen = len(buf)
    if valid and not first and markers_seen:
        return None  # the last durable snippet has no end marker
    counts[PUT], counts[REMOVE] = puts, removes
    return _fast_result(scan, entries, counts, durable, canceled, lo, hi)


def _scan_compiled(core, path, durable_epoch: int) -> PwalScan | None:
    """_scan_fast's walk by the compiled core (walcore._scan.limestone_scan), over the file read in chunks into
    one buffer; the blob ids of durable put_blob entries are checked here, as _scan_fast does."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        scan = PwalScan(str(path), size)
        blobs = _BlobCheck(path, scan.missing_blobs)
        counts = [0] * 11
        entries = durable = canceled = 0
        lo = hi = None
        buf = bytearray(_COMPILED_CHUNK)  # one buffer read into again and again: bounded memory at any size
        view = memoryview(buf)
        at, state = 0, None
        while at < size:
            n = os.preadv(fd, [buf], at)
            walked = core.limestone_scan(fd, view[:n], at, size, durable_epoch, state)
            if walked is None:
                return None
            at, state, walked_entries, walked_counts, snippets, epochs, nondurable, blob_puts = walked
            entries += walked_entries
            durable += snippets[0]
            canceled += snippets[1]
            counts = [a + b for a, b in zip(counts, walked_counts)]
            if epochs is not None:
                lo = epochs[0] if lo is None else min(lo, epochs[0])
                hi = epochs[1] if hi is None else max(hi, epochs[1])
            for offset, epoch in nondurable:
                _nondurable(scan, offset, epoch, durable_epoch)
            for offset, ids_at, count in blob_puts:
                blobs.check(read_blob_ids(fd, ids_at, count), offset)
    return _fast_result(scan, entries, counts, durable, canceled, lo, hi)


def _fast_result(scan: PwalScan, entries: int, counts: list[int], durable: int, canceled: int, lo, hi) -> PwalScan:
    """`scan` filled with what a fast walk counted (counts: durable entries per type)."""
    scan.entries = entries
    scan.snippets["durable"] += durable
    scan.snippets["canceled"] += canceled
    if lo is not None:
        scan.min_epoch, scan.max_epoch = lo, hi
    scan.durable = {t: n for t, n in enumerate(counts) if n}
    if scan.marks:
        scan.code, scan.repair_code = NONDURABLE, REPAIRED
    return scan


def _scan_exact(path, durable_epoch: int, on_durable=None) -> PwalScan:
    """The walk of anything, entry by entry, following limestone's state machine (see the module doc)."""
    scan = PwalScan(str(path), os.path.getsize(path))
    for e in _walk(path, durable_epoch, scan, with_data=on_durable is not None):
        on_durable(e)
    return scan


def durable_entries(path, durable_epoch: int) -> Iterator[Entry]:
    """Every data Entry (key and value included) of the durable snippets, in file order, as `on_durable` gets
    them, one at a time (a consumer that keeps none holds one entry)."""
    return _walk(path, durable_epoch, PwalScan(str(path), os.path.getsize(path)), with_data=True)


def _walk(path, durable_epoch: int, scan: PwalScan, *, with_data: bool) -> Iterator[Entry]:
    """Fill `scan`, yielding the durable data entries when `with_data`."""
    blobs = _BlobCheck(path, scan.missing_blobs)
    ld = durable_epoch
    valid, first, marked_before = True, True, False
    cur, snip = _NO_EPOCH, 0
    codes = [OK, OK]  # inspect, repair (mark mode)
    findings = scan.findings
    # Once a file shows end markers, a durable snippet that ends without one lost its end (walvault's check).
    markers_seen, open_durable = False, None

    def unclosed() -> None:
        worse(CORRUPTED, CORRUPTED)
        findings.add("unclosed_durable_snippet", open_durable, "durable snippet has no end marker although this "
                     "file's sessions end with one: its end was lost (unrepairable)")

    def worse(inspect: int, repair: int) -> None:
        codes[0] = max(codes[0], inspect)
        codes[1] = max(codes[1], repair)

    def broken_at_header(x: int, why: str) -> None:
        # A tail that starts where a snippet header must be (tglogutil HDR): repair marks it canceled.
        worse(BROKEN_AFTER, BROKEN_AFTER_MARKED)
        findings.add("broken_tail", x, f"{why} (repairable: repair marks this byte as a canceled snippet header, "
                     "repair --cut truncates the file here)")
        scan.tail_mark = scan.cut_at = x

    def broken_in_snippet(pos: int, why: str) -> None:
        # A tail broken inside a snippet that is not durable (tglogutil TRUNC).
        scan.cut_at = snip
        if valid:
            worse(BROKEN_AFTER, BROKEN_AFTER_MARKED)
            scan.tail_mark = snip
        elif marked_before:
            worse(BROKEN_AFTER_MARKED, BROKEN_AFTER_MARKED)
            scan.canceled_tail = pos  # limestone ignores what follows a canceled header
            return
        else:
            worse(BROKEN_AFTER, BROKEN_AFTER_MARKED)
        findings.add("broken_tail", pos, f"{why}, in the snippet at {snip} (repairable: repair cancels the "
                     "snippet, repair --cut truncates the file there)")

    for e in iter_entries(path, with_data=with_data):
        if type(e) is Broken:
            pos, kind = e.offset, e.type
            short = e.code == "short_entry"
            if short and kind == CANCELED_HEADER:
                pass  # a partial canceled header: limestone stops without a word
            elif short and kind == SNIPPET_HEADER:
                marked_before = False
                if not first and cur <= ld:
                    worse(CORRUPTED, CORRUPTED)
                    findings.add("corrupted_durable_snippet", pos, f"{e.message}, right after durable snippet "
                                 f"{snip} of epoch {cur} (unrepairable)")
                else:
                    snip = pos
                    broken_at_header(pos, e.message)
            elif short and (first or kind == DURABLE_EPOCH):
                worse(UNEXPECTED, UNEXPECTED)
                findings.add("unexpected_entry", pos, f"{e.message}, where a snippet header must come")
            elif first:  # an unknown byte (zero fill) at the start of the file or after an end marker
                broken_at_header(pos, f"{e.message}, where a snippet header must come")
            elif valid and cur <= ld:
                worse(CORRUPTED, CORRUPTED)
                findings.add("corrupted_durable_snippet", pos, f"{e.message}, inside durable snippet {snip} of "
                             f"epoch {cur} (unrepairable)")
            else:
                broken_in_snippet(pos, e.message)
            break
        kind = e.type
        scan.entries += 1
        if kind in DATA_TYPES:
            if first:
                worse(UNEXPECTED, UNEXPECTED)
                findings.add("unexpected_entry", e.offset, f"{ENTRY_NAMES[kind]} entry where a snippet header "
                             "must come (unrepairable)")
            elif valid:
                scan.durable[kind] = scan.durable.get(kind, 0) + 1
                if with_data:
                    yield e
                if kind == PUT_BLOB:
                    blobs.check_ids_at(e.blob_ids_at, e.blob_count, e.offset)
        elif kind == SNIPPET_HEADER or kind == CANCELED_HEADER:
            if open_durable is not None and markers_seen:
                unclosed()
            open_durable = e.offset if kind == SNIPPET_HEADER and e.epoch <= ld else None
            snip = e.offset
            scan.max_epoch = max(scan.max_epoch, e.epoch)
            scan.min_epoch = e.epoch if scan.min_epoch is None else min(scan.min_epoch, e.epoch)
            if kind == CANCELED_HEADER:
                marked_before, valid = True, False
                scan.snippets["canceled"] += 1
            elif e.epoch <= ld:
                cur, marked_before, valid = e.epoch, False, True
                scan.snippets["durable"] += 1
            else:
                cur, marked_before, valid = e.epoch, False, False
                worse(NONDURABLE, REPAIRED)
                _nondurable(scan, e.offset, e.epoch, ld)
        elif kind == SNIPPET_END:
            if first:
                worse(UNEXPECTED, UNEXPECTED)
                findings.add("unexpected_entry", e.offset, "snippet end marker where a snippet header must come")
                break
            valid, first = False, True
            markers_seen, open_durable = True, None
            continue
        else:  # a durable-epoch record belongs in the epoch file, not here
            worse(UNEXPECTED, UNEXPECTED)
            findings.add("unexpected_entry", e.offset, f"{ENTRY_NAMES[kind]} entry in a pwal file")
        first = False
    else:
        if open_durable is not None and markers_seen:
            unclosed()
    scan.code, scan.repair_code = codes
    scan.durable = dict(sorted(scan.durable.items()))  # by type, as the fast walks list them
    blobs.close()

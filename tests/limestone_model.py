"""An independent model of limestone log directories, for the randomized tests.

Written from tests/limestone_spec.md (tglogutil's scan, repair and recovery rules, reverse-engineered
from limestone's source) and shared/docs/limestone-files.md -- not from walcore, and without calling
it. Two halves:

1. Operation level (`expect`): given what the test generator did -- sessions per channel (epoch,
   entries, finished or crashed, canceled), durable-epoch records, zero tails, stray entries --
   the expected verdict, durable epoch, max appeared epoch, durable entry counts and state. It
   never looks at bytes.
2. Byte level (`parse_pwal`, `spec_dir`, `spec_state`): a plain parser of pwal bytes and
   tglogutil's `inspect` state machine (spec 1.2-1.4) and recovery rules (spec 9) applied to
   it, used as the oracle for randomly damaged real fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

# ---------------------------------------------------------------------------------------------
# 1. Operation level
# ---------------------------------------------------------------------------------------------

PUT, PUT_BLOB, REMOVE = "put", "put_blob", "remove"
CLEAR, ADD, REMOVE_STORAGE = "clear_storage", "add_storage", "remove_storage"
EPOCH_RECORD = "epoch_record"  # a durable-epoch record (type 4) written into a pwal file: never legal
COUNT_KINDS = (PUT, REMOVE, PUT_BLOB, CLEAR, ADD, REMOVE_STORAGE)

OK, REPAIRABLE, UNREPAIRABLE = "ok", "repairable", "unrepairable"
_LEVEL = {OK: 0, REPAIRABLE: 1, UNREPAIRABLE: 2}


def worst(*statuses: str) -> str:
    return max(statuses, key=_LEVEL.__getitem__)


@dataclass
class Op:
    kind: str
    storage: int = 0
    key: bytes = b""
    value: bytes = b""
    wv: tuple[int, int] = (0, 0)
    blobs: tuple[int, ...] = ()
    epoch: int = 0  # EPOCH_RECORD only


@dataclass
class Session:
    """One snippet: header (02, or 06 when canceled), the ops, an end marker when `ended` (v6+).

    `cut` is a crash: 'entry' = only the first `cut_len` bytes of the last op were written;
    'end' = all ops were written, then only `cut_len` bytes of the end marker.
    """

    epoch: int
    ops: list[Op]
    ended: bool
    canceled: bool = False
    cut: str | None = None
    cut_len: int = 0


@dataclass
class PartialHeader:
    """A crash while writing a new snippet header: `length` (1..8) of its 9 bytes."""

    epoch: int
    length: int


@dataclass
class ZeroTail:
    length: int


@dataclass
class Stray:
    """An entry where only a snippet header may come (file start or right after an end marker):
    what='data' (the op) or what='end' (an end marker)."""

    what: str
    op: Op | None = None
    epoch: int = 0


@dataclass
class Workload:
    version: int
    channels: list[list]  # per channel: Session | PartialHeader | ZeroTail | Stray, in file order
    records: list[int]  # durable-epoch records, in the order written to `epoch`
    blobs_present: set[int] = field(default_factory=set)
    detached: set[int] = field(default_factory=set)  # channels whose file was renamed pwal_NNNN.<ms14>.0
    rotated_records: list[int] = field(default_factory=list)  # records of a rotated epoch.<ms14>.<E> file
    epoch_file: bool = True  # False: no `epoch` file at all (then `records` is empty)

    @property
    def durable_epoch(self) -> int:
        """Spec 3: the maximum record of `epoch`; only when it has none, of the rotated epoch files."""
        return max(self.records) if self.records else max(self.rotated_records, default=0)


@dataclass
class Expected:
    status: str
    durable_epoch: int
    max_appeared_epoch: int
    durable_entries: dict[str, int]
    state: dict[tuple[int, bytes], bytes]
    blob_refs: set[int]  # blob ids referred to by durable puts
    blobs_present: set[int]
    # why repairable: 'nondurable' (a nondurable snippet), 'tail' (a broken tail tglogutil repair
    # marks), 'canceled_tail' (a broken tail inside a canceled snippet of an active file: limestone
    # ignores it once the file is detached)
    reasons: set[str]

    @property
    def count_durable_wal_entries(self) -> int:
        return self.durable_entries[PUT] + self.durable_entries[REMOVE]

    @property
    def missing_blobs(self) -> set[int]:
        return self.blob_refs - self.blobs_present


class _State:
    """Recovery (spec 9): per (storage, key) the highest write version wins (a later one on a tie);
    clear_storage/remove_storage at V drop the storage's entries below V; removes are not rows."""

    def __init__(self):
        self.latest: dict[tuple[int, bytes], tuple[tuple[int, int], Op]] = {}
        self.cleared: dict[int, tuple[int, int]] = {}

    def apply(self, op: Op) -> None:
        if op.kind in (CLEAR, REMOVE_STORAGE):
            self.cleared[op.storage] = max(self.cleared.get(op.storage, (0, 0)), op.wv)
        elif op.kind in (PUT, PUT_BLOB, REMOVE):
            k = (op.storage, op.key)
            if k not in self.latest or op.wv >= self.latest[k][0]:
                self.latest[k] = (op.wv, op)

    def rows(self) -> dict[tuple[int, bytes], bytes]:
        return {k: op.value for k, (wv, op) in self.latest.items()
                if op.kind != REMOVE and not wv < self.cleared.get(k[0], (0, 0))}


def expect(w: Workload) -> Expected:
    """What tglogutil inspect (and walvault's verify/state) must say about the written directory."""
    d = w.durable_epoch
    counts = dict.fromkeys(COUNT_KINDS, 0)
    state = _State()
    out = {"max": d, "blobs": set(), "reasons": set()}

    def durable_op(op: Op) -> None:
        if op.kind in counts:
            counts[op.kind] += 1
        if op.kind == PUT_BLOB:
            out["blobs"].update(op.blobs)
        state.apply(op)

    status = OK
    for ch, items in enumerate(w.channels):
        status = worst(status, _channel(items, d, durable_op, out, ch in w.detached))
    return Expected(status, d, out["max"], counts, state.rows(), out["blobs"], set(w.blobs_present),
                    out["reasons"])


def _channel(items: list, d: int, durable_op, out: dict, detached: bool) -> str:
    """The verdict on one channel's file, walking the generator's items with the spec's rules:
    - a complete 02 header of epoch E > D: nondurable snippet -> repairable;
    - a short entry or short end marker: inside a durable snippet -> unrepairable, else repairable;
    - a partial 02 header: right after a durable snippet with no end marker in between (the
      last 02 header is what counts, 06 headers leave it) -> unrepairable, else repairable;
    - an unknown byte (zero fill): where a header must come (file start, after an end marker)
      -> repairable; inside a durable snippet -> unrepairable; inside any other -> repairable;
    - a data entry where a header must come -> unrepairable (the scan goes on);
      an end marker there -> unrepairable and the scan stops;
    - a durable-epoch record in a pwal file -> unrepairable (the scan goes on);
    - except: a broken tail inside a canceled snippet of a detached file is ok (limestone never
      reads past a canceled header there).
    """
    status = OK
    first = True  # at the file start, or right after an end marker: only a header may come
    last_02 = None  # epoch of the last 02 header ("cur")
    snippet = None  # 'durable' | 'nondurable' | 'canceled': the snippet being read (None after an end marker)
    ends_seen = False  # walvault: after an end marker, a durable snippet must end with one too
    for item in items:
        if isinstance(item, Session):
            if ends_seen and snippet == "durable":
                status = worst(status, UNREPAIRABLE)
            out["max"] = max(out["max"], item.epoch)
            if item.canceled:
                snippet = "canceled"
            else:
                last_02 = item.epoch
                snippet = "durable" if item.epoch <= d else "nondurable"
                if snippet == "nondurable":
                    status = worst(status, REPAIRABLE)
                    out["reasons"].add("nondurable")
            first = False
            complete = item.ops[:-1] if item.cut == "entry" else item.ops
            for op in complete:
                if op.kind == EPOCH_RECORD:
                    status = worst(status, UNREPAIRABLE)
                elif snippet == "durable":
                    durable_op(op)
            if item.cut is not None:
                return worst(status, _tail(snippet == "durable", snippet == "canceled", out, detached))
            if item.ended:
                first, snippet, ends_seen = True, None, True
        elif isinstance(item, PartialHeader):
            after_durable = not first and last_02 is not None and last_02 <= d
            return worst(status, _tail(after_durable, False, out, detached))
        elif isinstance(item, ZeroTail):
            if first:
                return worst(status, _tail(False, False, out, detached))
            return worst(status, _tail(snippet == "durable", snippet == "canceled", out, detached))
        elif isinstance(item, Stray):
            assert first, "the generator puts stray entries only where a header must come"
            status = UNREPAIRABLE
            if item.what == "end":
                return status
            first = False
        else:
            raise TypeError(item)
    if ends_seen and snippet == "durable":
        status = worst(status, UNREPAIRABLE)
    return status


def _tail(durable: bool, canceled: bool, out: dict, detached: bool) -> str:
    if durable:
        return UNREPAIRABLE
    if canceled and detached:
        return OK
    out["reasons"].add("canceled_tail" if canceled else "tail")
    return REPAIRABLE


# ---------------------------------------------------------------------------------------------
# 2. Byte level: parser and tglogutil inspect / recovery rules
# ---------------------------------------------------------------------------------------------

T_PUT, T_HEADER, T_END, T_EPOCH, T_REMOVE, T_CANCELED, T_CLEAR, T_ADD, T_REMOVE_STORAGE, T_PUT_BLOB = range(1, 11)
T_CHUNK = 42  # marker_chunk: read fine, but tglogutil's lexer turns it into end-of-file
DATA = frozenset({T_PUT, T_REMOVE, T_CLEAR, T_ADD, T_REMOVE_STORAGE, T_PUT_BLOB})
U64_MAX = (1 << 64) - 1

# limestone's parse error codes (spec 1.2), ordered by severity
C_OK, C_BROKEN_AFTER_MARKED, C_NONDURABLE, C_BROKEN_AFTER, C_CORRUPTED, C_UNEXPECTED = (
    0x00, 0x11, 0x40, 0x41, 0x42, 0x81)
STATUS_OF = {C_OK: OK, C_BROKEN_AFTER_MARKED: REPAIRABLE, C_NONDURABLE: REPAIRABLE, C_BROKEN_AFTER: REPAIRABLE,
             C_CORRUPTED: UNREPAIRABLE, C_UNEXPECTED: UNREPAIRABLE}


class Tok(NamedTuple):
    offset: int
    type: int
    size: int
    epoch: int | None = None
    storage: int | None = None
    key: bytes | None = None
    value: bytes | None = None
    wv: tuple[int, int] | None = None
    blobs: tuple[int, ...] = ()


class Bad(NamedTuple):
    offset: int
    kind: str  # 'short' | 'unknown'
    type: int


def _u32(b: bytes, p: int) -> int:
    return int.from_bytes(b[p:p + 4], "little")


def _u64(b: bytes, p: int) -> int:
    return int.from_bytes(b[p:p + 8], "little")


def parse_pwal(data: bytes) -> tuple[list[Tok], Bad | None]:
    """Entries as limestone-files.md lays them out; stops at the first short or unknown entry."""
    toks: list[Tok] = []
    n = len(data)
    pos = 0
    while pos < n:
        t = data[pos]
        if t in (T_PUT, T_PUT_BLOB):
            if pos + 17 > n:
                return toks, Bad(pos, "short", t)
            klen, vlen, sid = _u32(data, pos + 1), _u32(data, pos + 5), _u64(data, pos + 9)
            k0 = pos + 17
            w0 = k0 + klen
            v0 = w0 + 16
            end = v0 + vlen
            if end > n:
                return toks, Bad(pos, "short", t)
            blobs: tuple[int, ...] = ()
            if t == T_PUT_BLOB:
                if end + 4 > n:
                    return toks, Bad(pos, "short", t)
                count = _u32(data, end)
                if end + 4 + 8 * count > n:
                    return toks, Bad(pos, "short", t)
                blobs = tuple(_u64(data, end + 4 + 8 * i) for i in range(count))
                end += 4 + 8 * count
            toks.append(Tok(pos, t, end - pos, None, sid, data[k0:w0], data[v0:v0 + vlen],
                            (_u64(data, w0), _u64(data, w0 + 8)), blobs))
        elif t == T_REMOVE:
            if pos + 13 > n:
                return toks, Bad(pos, "short", t)
            klen, sid = _u32(data, pos + 1), _u64(data, pos + 5)
            w0 = pos + 13 + klen
            end = w0 + 16
            if end > n:
                return toks, Bad(pos, "short", t)
            toks.append(Tok(pos, t, end - pos, None, sid, data[pos + 13:w0], None,
                            (_u64(data, w0), _u64(data, w0 + 8))))
        elif t in (T_CLEAR, T_ADD, T_REMOVE_STORAGE):
            end = pos + 25
            if end > n:
                return toks, Bad(pos, "short", t)
            toks.append(Tok(pos, t, 25, None, _u64(data, pos + 1), None, None,
                            (_u64(data, pos + 9), _u64(data, pos + 17))))
        elif t in (T_HEADER, T_CANCELED, T_EPOCH, T_CHUNK):
            end = pos + 9
            if end > n:
                return toks, Bad(pos, "short", t)
            toks.append(Tok(pos, t, 9, _u64(data, pos + 1)))
        elif t == T_END:
            end = pos + 10  # 03 u64 epoch u8 crc_type (v7)
            if end > n:
                return toks, Bad(pos, "short", t)
            toks.append(Tok(pos, t, 10, _u64(data, pos + 1)))
        else:
            return toks, Bad(pos, "unknown", t)
        pos = end
    return toks, None


@dataclass
class SpecFile:
    code: int
    max_epoch: int
    count: int  # types 1 and 5 added (tglogutil's count)
    applied: list[Tok]  # every data entry added (what recovery applies)
    chunk: bool  # a marker_chunk (42) ended the walk: tglogutil stops silently there


def spec_scan(data: bytes, ld: int, *, detached: bool, keep_worse: bool) -> SpecFile:
    """tglogutil inspect on one pwal file (spec 1.2), plus the detached-file downgrade (1.3).

    keep_worse=True applies walvault's documented deviations: a later repairable code never
    overwrites an earlier unrepairable one (tglogutil's `pe=X` assignments can lower it); and once the
    file has shown an end marker, a durable snippet that ends (at the next header, or at the end of
    the file) without one is unrepairable."""
    toks, bad = parse_pwal(data)
    pe = C_OK

    def assign(x: int) -> None:  # pe=X
        nonlocal pe
        pe = max(pe, x) if keep_worse else x

    def raise_to(x: int) -> None:  # pe up to X
        nonlocal pe
        pe = max(pe, x)

    valid, first, marked, cur, max_e = True, True, False, U64_MAX, 0
    applied: list[Tok] = []
    chunk = False
    stopped = False
    ends_seen, durable_open = False, False
    for e in toks:
        t = e.type
        if t in (T_HEADER, T_CANCELED):
            if keep_worse and ends_seen and durable_open:
                raise_to(C_CORRUPTED)
            durable_open = t == T_HEADER and e.epoch <= ld
        elif t == T_END:
            ends_seen, durable_open = True, False
        if t in DATA:
            if first:
                assign(C_UNEXPECTED)
            elif valid:
                applied.append(e)
            first = False
        elif t == T_HEADER:
            cur, marked = e.epoch, False
            max_e = max(max_e, e.epoch)
            if e.epoch <= ld:
                valid = True
            else:
                raise_to(C_NONDURABLE)
                valid = False
            first = False
        elif t == T_CANCELED:
            max_e = max(max_e, e.epoch)
            marked, valid, first = True, False, False
        elif t == T_END:
            if first:
                assign(C_UNEXPECTED)
                stopped = True
                break
            valid, first = False, True
        elif t == T_EPOCH:
            assign(C_UNEXPECTED)
            first = False
        elif t == T_CHUNK:
            chunk = stopped = True
            break

    def trunc() -> None:
        if valid:
            assign(C_BROKEN_AFTER)
        elif marked:
            raise_to(C_BROKEN_AFTER_MARKED)
        else:
            assign(C_BROKEN_AFTER)

    if bad is None and not stopped and keep_worse and ends_seen and durable_open:
        raise_to(C_CORRUPTED)
    if bad is not None and not stopped:
        t = bad.type
        if bad.kind == "short":
            if t in DATA or t == T_END:
                if first:
                    assign(C_UNEXPECTED)
                elif valid and cur <= ld:
                    assign(C_CORRUPTED)
                else:
                    trunc()
            elif t == T_HEADER:
                if not first and cur <= ld:
                    assign(C_CORRUPTED)
                else:
                    trunc()
            elif t == T_CANCELED:
                pass
            else:  # 4 or 42
                chunk = chunk or t == T_CHUNK
                assign(C_UNEXPECTED)
        else:
            if first:
                assign(C_BROKEN_AFTER)
            elif valid and cur <= ld:
                assign(C_CORRUPTED)
            else:
                trunc()
    if pe == C_BROKEN_AFTER_MARKED and detached:
        pe = C_OK
    return SpecFile(pe, max_e, sum(1 for e in applied if e.type in (T_PUT, T_REMOVE)), applied, chunk)


def durable_epoch_of(root: Path) -> int:
    """Spec 3: the maximum record of `epoch`; if it is empty or missing, of every non-empty epoch* file."""
    def records(data: bytes) -> list[int]:
        assert len(data) % 9 == 0 and all(data[i] == 4 for i in range(0, len(data), 9)), "bad epoch file"
        return [_u64(data, i + 1) for i in range(0, len(data), 9)]

    main = root / "epoch"
    if main.is_file() and main.stat().st_size:
        return max(records(main.read_bytes()))
    found = [max(records(p.read_bytes())) for p in root.iterdir()
             if p.name.startswith("epoch") and p.is_file() and p.stat().st_size]
    return max(found, default=0)


def pwal_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("pwal_") and p.is_file())


@dataclass
class SpecDir:
    status: str
    durable_epoch: int
    max_appeared_epoch: int
    count: int
    chunk: bool
    files: dict[str, SpecFile]


def spec_dir(root: Path, *, keep_worse: bool = True, cache: dict | None = None) -> SpecDir:
    """tglogutil inspect on a directory (spec 1.3/1.4). `cache` maps (name, bytes) -> SpecFile."""
    ld = durable_epoch_of(root)
    files = {}
    for name in pwal_names(root):
        data = (root / name).read_bytes()
        key = (name, data, ld, keep_worse)
        if cache is not None and key in cache:
            files[name] = cache[key]
            continue
        files[name] = spec_scan(data, ld, detached=len(name) > 9, keep_worse=keep_worse)
        if cache is not None:
            cache[key] = files[name]
    code = max((f.code for f in files.values()), default=C_OK)
    return SpecDir(STATUS_OF[code], ld, max([ld] + [f.max_epoch for f in files.values()]),
                   sum(f.count for f in files.values()), any(f.chunk for f in files.values()), files)


def covered_names(root: Path) -> set[str]:
    """DETACHED_PWAL names of the compaction catalog (or of its backup when the catalog is bad)."""
    for name in ("compaction_catalog", "compaction_catalog.back"):
        try:
            lines = (root / name).read_text().split("\n")
        except OSError:
            continue
        if lines[:1] != ["COMPACTION_CATALOG_HEADER"] or "COMPACTION_CATALOG_FOOTER" not in lines:
            continue
        return {ln.split()[1] for ln in lines if ln.startswith("DETACHED_PWAL ")}
    return set()


def spec_state(root: Path, spec: SpecDir) -> dict[tuple[int, bytes], bytes]:
    """Spec 9 on the entries the scan added: the snapshot inputs (every pwal file but the compacted
    one and those the catalog lists), latest version per key, clear/remove_storage drop strictly
    older versions; then the compacted file's puts where the snapshot has no entry for the key."""
    covered = covered_names(root)
    latest: dict[tuple[int, bytes], tuple[tuple[int, int], int, bytes | None]] = {}
    cleared: dict[int, tuple[int, int]] = {}
    base: dict[tuple[int, bytes], bytes] = {}
    for name, f in sorted(spec.files.items()):
        if name in covered:
            continue
        for e in f.applied:
            if ".compacted" in name:
                if e.type in (T_PUT, T_PUT_BLOB):
                    base[(e.storage, e.key)] = e.value
            elif e.type in (T_CLEAR, T_REMOVE_STORAGE):
                cleared[e.storage] = max(cleared.get(e.storage, (0, 0)), e.wv)
            elif e.type in (T_PUT, T_PUT_BLOB, T_REMOVE):
                k = (e.storage, e.key)
                if k not in latest or e.wv >= latest[k][0]:
                    latest[k] = (e.wv, e.type, e.value)
    rows = {k: v for k, (wv, t, v) in latest.items() if t != T_REMOVE and not wv < cleared.get(k[0], (0, 0))}
    for k, v in base.items():
        if k not in latest and not (0, 0) < cleared.get(k[0], (0, 0)):
            rows[k] = v
    return rows


def snippet_extents(toks: list[Tok], size: int, ld: int) -> list[tuple[int, int, str]]:
    """(start, end, 'durable'|'nondurable'|'canceled') of every snippet of a well-formed file: from
    its header to the end of its end marker, or to the next header, or to the end of the file."""
    out = []
    start = kind = None
    for e in toks:
        if e.type in (T_HEADER, T_CANCELED):
            if start is not None:
                out.append((start, e.offset, kind))
            start = e.offset
            kind = "canceled" if e.type == T_CANCELED else ("durable" if e.epoch <= ld else "nondurable")
        elif e.type == T_END and start is not None:
            out.append((start, e.offset + e.size, kind))
            start = None
    if start is not None:
        out.append((start, size, kind))
    return out


def structure(toks: list[Tok], bad: Bad | None) -> tuple:
    return tuple((e.offset, e.type, e.size) for e in toks), bad

"""Compaction: fold rotated pwal files (and the previous compacted file) into a new `pwal_0000.compacted` and its
`compaction_catalog`, in limestone's own format (limestone-files.md, "Compaction, as limestone's source does it"),
written into a directory of its own, never into a source.

A compacted entry has write version 0, so whatever is left unfolded applies after all of it: a clear_storage in a
file left out would drop compacted entries newer than itself. `plan_fold` therefore folds only files whose
snippets are all older than every snippet of the files left out.

The state rule is state.py's (`newer`, `is_live`, files numbered as `applied_files` numbers them). Memory: one
dict entry per key of the folded files (its key, write version and where its newest entry lies), never a value
and never a whole file: the winning entries are copied from their source files as the compacted file is written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..fsutil import write_atomic
from .catalog import CATALOG_NAME, FOOTER, HEADER, Catalog, parse_catalog
from .pwal import (CANCELED_HEADER, CLEAR_STORAGE, ENTRY_NAMES, HEADERS, PUT, PUT_BLOB, REMOVE, REMOVE_STORAGE,
                   SNIPPET_END, SNIPPET_HEADER, Broken, iter_entries, read_blob_ids)
from .scan import STATUS_OF_CODE, durable_entries, scan_pwal
from .state import applied_files, is_live, newer
from .writer import snippet_header

COMPACTED_NAME = "pwal_0000.compacted"
ROTATED_PWAL = re.compile(r"pwal_\d{4}\.\d{14}\.\d+")
_COPY_CHUNK = 1 << 20
_OPEN_FILES = 256  # source files held open at once while the compacted file is written
# state.Write with, instead of the value, where the entry lies: (source index, offset, size), None for a remove.
_Located = tuple[tuple[int, int, int, int], tuple[int, int, int] | None]


@dataclass
class Compaction:
    folded: list[str]  # names of the pwal files folded by this compaction (sorted)
    detached: list[str]  # every DETACHED_PWAL line written: the previous catalog's plus `folded`
    epoch: int  # MAX_EPOCH_ID written: every entry folded has an epoch <= it
    max_blob_id: int  # MAX_BLOB_ID written
    blob_ids: list[int]  # blob ids the entries of the new compacted file reference (sorted)
    entries: int  # entries written to the compacted file
    skipped: dict[str, str] = field(default_factory=dict)  # pwal name -> why it was not folded
    reached: int = 0  # the highest snippet epoch among the files folded now: the state is exact from there on


def plan_fold(files: dict[str, list[int] | None], durable_epoch: int) -> tuple[list[str], int]:
    """files: pwal name -> [min, max] epoch of its non-canceled snippets (None: it holds none). Returns the names
    to fold and the fold epoch E: every snippet of a folded file is <= E, every one of a file left out is > E.

    A file with a snippet past the durable epoch never folds; a file left out with a snippet <= E lowers E below
    it (which may leave out more files), until the files left out are all newer than E."""
    epoch = durable_epoch
    while True:
        low = min((r[0] for r in files.values() if r is not None and r[1] > epoch), default=epoch + 1)
        if low > epoch:
            return sorted(n for n, r in files.items() if r is None or r[1] <= epoch), epoch
        epoch = low - 1


def compact(pwal_paths: list[Path], durable_epoch: int, out_dir: Path, *,
            previous: Path | None = None) -> Compaction:
    """Fold the foldable ones of `pwal_paths` (rotated files only) and the previous compacted file into
    out_dir/pwal_0000.compacted and out_dir/compaction_catalog (the catalog last: it is what makes the file count).

    `previous`: a directory holding the previous pwal_0000.compacted and its compaction_catalog, or None. Raises
    ValueError for a file that is not a rotated pwal, is already detached, cannot be read whole (unrepairable), or
    when out_dir is a source directory; even with nothing to fold the files are written (the caller decides)."""
    paths = [Path(p) for p in pwal_paths]
    out_dir = Path(out_dir)
    catalog, base = _previous(previous)
    _refuse_inputs(paths, out_dir, previous, catalog)
    ranges = {p.name: snippet_range(p, durable_epoch) for p in paths}
    names, fold_epoch = plan_fold(ranges, durable_epoch)
    chosen = set(names)
    skipped: dict[str, str] = {}
    for name, r in sorted(ranges.items()):
        if name not in chosen:
            skipped[name] = (f"not durable: holds epoch {r[1]}, past the durable epoch {durable_epoch}"
                             if r[1] > durable_epoch else f"holds epochs past {fold_epoch} (from {r[0]})")
    order = applied_files([p for p in paths if p.name in chosen], set())
    readers = _Readers(([base] if base else []) + [p for p, _ in order])
    try:
        latest: dict[tuple[int, bytes], _Located] = {}
        cleared: dict[int, tuple[int, int]] = {}
        max_blob = catalog.max_blob_id
        if base:  # the base: its entries carry version (0, 0) and lose a tie to any folded file
            max_blob = max(max_blob, _fold_file(readers, 0, -1, 0, latest, cleared))
        for index, (_, number) in enumerate(order, start=len(readers.paths) - len(order)):
            max_blob = max(max_blob, _fold_file(readers, index, number, durable_epoch, latest, cleared))
        live = sorted((storage.to_bytes(8, "little") + key, key, write[1])
                      for (storage, key), write in latest.items() if is_live(storage, write, cleared))
        del latest
        blob_ids: set[int] = set()
        out_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(out_dir / COMPACTED_NAME, _compacted_chunks(readers, live, blob_ids))
    finally:
        readers.close()
    detached = sorted(set(catalog.detached_pwals) | set(names))
    epoch = max(fold_epoch, catalog.max_epoch_id, 0)
    lines = [HEADER, f"COMPACTED_FILE {COMPACTED_NAME} 1".encode()]
    lines += [b"DETACHED_PWAL " + os.fsencode(n) for n in detached]
    lines += [f"MAX_EPOCH_ID {epoch}".encode(), f"MAX_BLOB_ID {max_blob}".encode(), FOOTER]
    write_atomic(out_dir / CATALOG_NAME, [b"".join(line + b"\n" for line in lines)])
    reached = max((ranges[n][1] for n in names if ranges[n]), default=0)
    return Compaction(names, detached, epoch, max_blob, sorted(blob_ids), len(live), skipped, reached)


def _previous(previous: Path | None) -> tuple[Catalog, Path | None]:
    """The previous catalog and compacted file (limestone merges a pwal_0000.compacted whenever it exists)."""
    if previous is None:
        return Catalog(), None
    previous = Path(previous)
    catalog = parse_catalog((previous / CATALOG_NAME).read_bytes())
    if set(catalog.compacted_files) - {COMPACTED_NAME} or catalog.carry_file:
        raise ValueError(f"{previous / CATALOG_NAME}: names compacted files other than {COMPACTED_NAME}, which "
                         "this compaction does not fold")
    base = previous / COMPACTED_NAME
    if not base.exists():
        if catalog.compacted_files:
            raise ValueError(f"{base} does not exist although its catalog names it: the keys it held are lost")
        return catalog, None
    if findings := check_compacted(base):
        code, offset, message = findings[0]
        raise ValueError(f"{base}: {code} at {offset}: {message}")
    return catalog, base


def _refuse_inputs(paths: list[Path], out_dir: Path, previous: Path | None, catalog: Catalog) -> None:
    detached = set(catalog.detached_pwals)
    seen: set[str] = set()
    for p in paths:
        if not ROTATED_PWAL.fullmatch(p.name):
            raise ValueError(f"{p.name}: only rotated pwal files (pwal_NNNN.<ms14>.<n>) are folded: an active file is "
                             "still written, a compacted one is the previous compaction's")
        if p.name in detached:
            raise ValueError(f"{p.name}: the previous catalog lists it as detached: it is folded already")
        if p.name in seen:
            raise ValueError(f"{p.name}: given twice (the catalog covers files by name)")
        seen.add(p.name)
    sources = {p.parent.resolve() for p in paths} | ({Path(previous).resolve()} if previous is not None else set())
    if out_dir.resolve() in sources:
        raise ValueError(f"{out_dir}: the output directory is a source directory, which is never written")


def snippet_range(path: Path, durable_epoch: int) -> list[int] | None:
    """[min, max] epoch of the file's non-canceled snippets (None: it has none); refuses a file limestone cannot
    read whole."""
    scan = scan_pwal(path, durable_epoch)
    if STATUS_OF_CODE[scan.code] == "unrepairable":
        why = scan.findings[0].message if scan.findings else "unrepairable"
        raise ValueError(f"{path}: limestone cannot read it whole ({why})")
    if not scan.snippets["canceled"]:
        return scan.epoch_range
    lo = hi = None
    for e in iter_entries(path):
        if type(e) is not Broken and e.type == SNIPPET_HEADER:
            lo, hi = (e.epoch, e.epoch) if lo is None else (min(lo, e.epoch), max(hi, e.epoch))
    return None if lo is None else [lo, hi]


class _Readers:
    """Source files opened by index, at most _OPEN_FILES at once (a fold may take more files than a process opens)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.fds: dict[int, int] = {}  # in order of use, the latest last

    def fd(self, index: int) -> int:
        fd = self.fds.pop(index, None)
        if fd is None:
            if len(self.fds) >= _OPEN_FILES:
                os.close(self.fds.pop(next(iter(self.fds))))
            fd = os.open(self.paths[index], os.O_RDONLY)
        self.fds[index] = fd
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _fold_file(readers: _Readers, index: int, number: int, durable_epoch: int,
               latest: dict[tuple[int, bytes], _Located], cleared: dict[int, tuple[int, int]]) -> int:
    """Apply one file's durable entries, as state.file_records reads them, each put remembered by where it lies
    (index, offset, size) rather than by its value; returns the highest blob id of its puts."""
    max_blob = 0
    for e in durable_entries(readers.paths[index], durable_epoch):
        if e.type in (CLEAR_STORAGE, REMOVE_STORAGE):
            cleared[e.storage_id] = max(cleared.get(e.storage_id, (0, 0)), (e.wv_major, e.wv_minor))
        elif e.key is not None:
            where = None if e.type == REMOVE else (index, e.offset, e.size)
            write = ((e.wv_major, e.wv_minor, number, e.offset), where)
            old = latest.get((e.storage_id, e.key))
            latest[(e.storage_id, e.key)] = write if old is None else newer(old, write)
            if e.type == PUT_BLOB and e.blob_count:
                max_blob = max(max_blob, max(read_blob_ids(readers.fd(index), e.blob_ids_at, e.blob_count)))
    return max_blob


def _compacted_chunks(readers: _Readers, live: list, blob_ids: set[int]):
    """Header 02 + epoch 0, then each live entry copied from its source with both version words zeroed; the blob ids
    of the entries copied are added to `blob_ids`."""
    yield snippet_header(0)
    for _, key, (index, offset, size) in live:
        fd = readers.fd(index)
        at = 17 + len(key)  # type, key_len, value_len, storage_id, key: then the write version
        head = os.pread(fd, at, offset)
        yield head
        yield bytes(16)
        for pos in range(offset + at + 16, offset + size, _COPY_CHUNK):
            yield os.pread(fd, min(_COPY_CHUNK, offset + size - pos), pos)
        if head[0] == PUT_BLOB:
            value_len = int.from_bytes(head[5:9], "little")
            ids_at = offset + at + 16 + value_len
            count = int.from_bytes(os.pread(fd, 4, ids_at), "little")
            blob_ids.update(read_blob_ids(fd, ids_at + 4, count))


def check_compacted(path: Path) -> list[tuple[str, int | None, str]]:
    """Findings (code, byte offset, message) against what limestone writes as a compacted file and its reader
    relies on: header 02 + epoch 0, one snippet with no end marker and no other header, only put (01) and
    put-with-blobs (0a) entries with both version words zero, in strictly ascending unsigned bytes of
    storage_id (8 bytes little-endian) || key ("Key order violation" in limestone), nothing cut short."""
    findings: list[tuple[str, int | None, str]] = []
    previous = None
    first = True
    for e in iter_entries(path, with_data=True):
        if type(e) is Broken:
            findings.append((e.code, e.offset, e.message))
            break
        if first:
            first = False
            if e.type == SNIPPET_HEADER:
                if e.epoch:
                    findings.append(("header_epoch", e.offset, f"the header carries epoch {e.epoch}; limestone "
                                     "writes 0"))
                continue
            findings.append(("missing_header", e.offset, f"the file starts with a {ENTRY_NAMES[e.type]} entry, "
                             "not a snippet header of epoch 0"))
        if e.type in HEADERS:
            what = "canceled snippet header" if e.type == CANCELED_HEADER else "second snippet header"
            findings.append(("extra_header", e.offset, f"a {what}: a compacted file is one snippet"))
        elif e.type == SNIPPET_END:
            findings.append(("end_marker", e.offset, "a snippet end marker: a compacted file has none"))
        elif e.type not in (PUT, PUT_BLOB):
            findings.append(("not_a_put", e.offset, f"a {ENTRY_NAMES[e.type]} entry: a compacted file holds puts "
                             "only"))
        else:
            if e.wv_major or e.wv_minor:
                findings.append(("nonzero_version", e.offset, f"write version ({e.wv_major}, {e.wv_minor}); "
                                 "compacted entries carry (0, 0)"))
            sort_key = e.storage_id.to_bytes(8, "little") + e.key
            if previous is not None and sort_key <= previous:
                findings.append(("key_order", e.offset, f"Key order violation: storage {e.storage_id} key "
                                 f"{e.key.hex() or '(empty)'} does not sort after the entry before it"))
            previous = sort_key
    if first:
        findings.append(("missing_header", 0, "the file is empty: a compacted file starts with a snippet header"))
    return findings

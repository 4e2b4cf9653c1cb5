"""The durable state of a limestone directory: the latest value of every key (datastore_snapshot.cpp).

Per (storage, key) the highest write version (major, minor) wins, a remove included; a
clear_storage or remove_storage at version V drops every entry of its storage below V; canceled and
nondurable snippets do not count; pwal_0000.compacted is the base (its versions are zero) and the
rotated files its catalog lists as compacted are left out.
"""

from __future__ import annotations

from pathlib import Path

from .pwal import CLEAR_STORAGE, REMOVE, REMOVE_STORAGE
from .scan import scan_pwal


def build_state(pwal_paths: list[Path], durable_epoch: int, covered: set[str]):
    """Live (storage_id, key, value) rows, sorted by storage_id, then key bytes; and the scan of every
    file (files the compaction covers are scanned for their verdict but not applied)."""
    latest: dict[tuple[int, bytes], tuple[int, int, int, bytes | None]] = {}
    cleared: dict[int, tuple[int, int]] = {}

    def apply(e) -> None:
        version = (e.wv_major, e.wv_minor)
        if e.type in (CLEAR_STORAGE, REMOVE_STORAGE):
            if version > cleared.get(e.storage_id, (0, 0)):
                cleared[e.storage_id] = version
        elif e.key is not None:  # put, put with blobs, remove
            k = (e.storage_id, e.key)
            old = latest.get(k)
            if old is None or version >= old[:2]:
                latest[k] = (*version, e.type, None if e.type == REMOVE else e.value)

    scans = {str(path): scan_pwal(path, durable_epoch, on_durable=None if path.name in covered else apply)
             for path in sorted(pwal_paths)}
    rows = []
    for (storage, key), (major, minor, kind, value) in latest.items():
        if kind == REMOVE or (major, minor) < cleared.get(storage, (0, 0)):
            continue
        rows.append((storage, key, value))
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows, scans


def format_tsv(rows) -> str:
    return "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for s, k, v in rows)

"""The durable state of a limestone directory: the latest value of every key (datastore_snapshot.cpp).

Per (storage, key) the highest write version (major, minor) wins, a remove included; a
clear_storage or remove_storage at version V drops every entry of its storage below V; canceled and
nondurable snippets do not count; pwal_0000.compacted is the base (its versions are zero) and the
rotated files its catalog lists as compacted are left out.

The rule is stated per record so that it can run anywhere: `file_records` turns one pwal file into records,
`newer` picks the winner of two writes of one key, `is_live` drops removes and cleared writes. `build_state`
applies them in one process; spark_jobs applies the same functions as a reduction by key over a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .pwal import CLEAR_STORAGE, REMOVE, REMOVE_STORAGE
from .scan import durable_entries

# A write: (storage_id, key) -> (order, value or None for a remove). `order` is (major, minor, file number,
# offset): of two writes of one version, the later one in the log wins, as limestone applies them in order.
Write = tuple[tuple[int, int, int, int], bytes | None]


def file_records(path: Path | str, file_number: int, durable_epoch: int) -> Iterator[tuple]:
    """The durable entries of one pwal file as records: ("write", (storage_id, key), Write) for a put (blobs
    included) or a remove, ("clear", storage_id, (major, minor)) for clear_storage and remove_storage."""
    for e in durable_entries(path, durable_epoch):
        if e.type in (CLEAR_STORAGE, REMOVE_STORAGE):
            yield "clear", e.storage_id, (e.wv_major, e.wv_minor)
        elif e.key is not None:
            yield "write", (e.storage_id, e.key), ((e.wv_major, e.wv_minor, file_number, e.offset),
                                                   None if e.type == REMOVE else e.value)


def newer(a: Write, b: Write) -> Write:
    return a if a[0] >= b[0] else b


def is_live(storage_id: int, write: Write, cleared: dict[int, tuple[int, int]]) -> bool:
    order, value = write
    return value is not None and order[:2] >= cleared.get(storage_id, (0, 0))


def applied_files(pwal_paths: list[Path], covered: set[str]) -> list[tuple[Path, int]]:
    """The files whose entries make the state, each with its number in the order limestone applies them."""
    return [(p, n) for n, p in enumerate(sorted(pwal_paths)) if p.name not in covered]


def build_state(pwal_paths: list[Path], durable_epoch: int, covered: set[str]) -> list[tuple[int, bytes, bytes]]:
    """Live (storage_id, key, value) rows, sorted by storage_id, then key bytes."""
    latest: dict[tuple[int, bytes], Write] = {}
    cleared: dict[int, tuple[int, int]] = {}
    for path, number in applied_files(pwal_paths, covered):
        for kind, key, value in file_records(path, number, durable_epoch):
            if kind == "clear":
                cleared[key] = max(cleared.get(key, (0, 0)), value)
            else:
                old = latest.get(key)
                latest[key] = value if old is None else newer(old, value)
    rows = [(storage, key, write[1]) for (storage, key), write in latest.items() if is_live(storage, write, cleared)]
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def format_tsv(rows) -> str:
    return "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for s, k, v in rows)

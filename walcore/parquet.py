"""Parquet results written through the repository's storage layer (a path or any fsspec URL), atomically.

A result is a directory of `part-NNNNN.parquet` files, each written whole by whoever holds its rows (one
process, or each Spark executor its partition), then `_SUCCESS.json` naming the parts and their row counts,
written last: a directory without it is no result. The location must be empty at the start, so that parts of
an older result never mix with a newer one's.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable

from .fsutil import read_chunks
from .repository.storage import RepositoryError, open_storage

SUCCESS = "_SUCCESS.json"


def state_schema():
    import pyarrow as pa  # imported only when Parquet is written

    return pa.schema([("storage_id", pa.uint64()), ("key", pa.binary()), ("value", pa.binary())])


class ParquetOutput:
    """Where a result's parts go; picklable, so that executors write their own parts."""

    def __init__(self, url: str, options: dict | None = None):
        self.storage = open_storage(url, options)

    def check_empty(self) -> None:
        try:
            found = self.storage.fs.ls(self.storage.root, detail=False)
        except FileNotFoundError:
            return
        if found:
            raise RepositoryError(f"{self.storage.display} is not empty: a Parquet result goes to an empty location")

    def write_part(self, index: int, rows: Iterable[tuple[int, bytes, bytes]], batch: int = 65536) -> dict:
        """One part from (storage_id, key, value) rows, in bounded memory (a local temporary file, then one
        atomic write); {"part", "rows"}."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = state_schema()
        name = f"part-{index:05d}.parquet"
        count = 0

        def table(chunk):
            return pa.Table.from_arrays([pa.array([r[0] for r in chunk], pa.uint64()),
                                         pa.array([r[1] for r in chunk], pa.binary()),
                                         pa.array([r[2] for r in chunk], pa.binary())], schema=schema)

        fd, tmp = tempfile.mkstemp(prefix="walvault-part-", suffix=".parquet")
        os.close(fd)
        try:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                chunk: list[tuple] = []
                for row in rows:
                    chunk.append(row)
                    if len(chunk) == batch:
                        writer.write_table(table(chunk))
                        count += len(chunk)
                        chunk = []
                if chunk or count == 0:
                    writer.write_table(table(chunk))
                    count += len(chunk)
            self.storage.write(name, read_chunks(tmp))
        finally:
            os.unlink(tmp)
        return {"part": name, "rows": count}

    def finish(self, parts: list[dict]) -> None:
        parts = sorted(parts, key=lambda p: p["part"])
        self.storage.write_bytes(SUCCESS, json.dumps({"parts": parts, "rows": sum(p["rows"] for p in parts)},
                                                     indent=1).encode())

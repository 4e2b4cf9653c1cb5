"""The durable state of a limestone log directory as Parquet, through DataFrames (SparkRunner.state_rows, for
the `limestone_state` job): the directory is judged first (one task per pwal file), then each applied pwal file
is one task that turns its durable entries into records (walcore's `file_records`), which are reduced by
(storage, key) with walcore's `newer` — hash-partitioned, so no executor holds the whole key space — then
sorted by range into partitions that each executor writes as one Parquet part. The driver only sees the
storages' clear versions (a few) and, when it prints the TSV, one partition at a time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

from walcore.limestone.state import applied_files, file_records, is_live, newer

ROWS_PER_PARTITION = 500_000
PARTITION_BYTES = 64 << 20


def state_rows(runner, pwal_paths: list[Path], durable_epoch: int, covered: set[str], *,
               parquet=None) -> Iterator[tuple[int, bytes, bytes]]:
    """The rows, sorted, one partition at a time; the Parquet parts written first when `parquet` is given."""
    from pyspark import StorageLevel
    from pyspark.sql.types import BinaryType, DecimalType, StructField, StructType

    spark, sc = runner.spark, runner.sc
    # absolute: the executors' working directories are not the driver's
    files = [(os.path.abspath(p), n) for p, n in applied_files(pwal_paths, covered)]
    # A clear is reduced with the writes, keyed by its storage alone: its version is the order of a write with
    # no value, so `newer` keeps the highest.
    records = sc.parallelize(files, max(1, len(files))).flatMap(
        lambda f: (((("w",) + key), value) if kind == "write" else (("c", key), ((*value, 0, 0), None))
                   for kind, key, value in file_records(f[0], f[1], durable_epoch)))
    reduced = records.reduceByKey(newer).persist(StorageLevel.MEMORY_AND_DISK)
    cleared = dict(reduced.filter(lambda kv: kv[0][0] == "c").map(lambda kv: (kv[0][1], kv[1][0][:2])).collect())
    live = reduced.filter(lambda kv: kv[0][0] == "w" and is_live(kv[0][1], kv[1], cleared)).map(
        lambda kv: (Decimal(kv[0][1]), kv[0][2], kv[1][1]))
    schema = StructType([StructField("storage_id", DecimalType(20, 0), False),
                         StructField("key", BinaryType(), False), StructField("value", BinaryType(), False)])
    # Partitions of bounded size, however big the state: the driver prints the TSV one partition at a time.
    rows, nbytes = live.map(lambda r: (1, len(r[1]) + len(r[2]) + 16)).fold((0, 0), lambda a, b: (a[0] + b[0],
                                                                                               a[1] + b[1]))
    partitions = max(1, math.ceil(rows / ROWS_PER_PARTITION), math.ceil(nbytes / PARTITION_BYTES))
    # Spark orders binary columns as unsigned bytes, as `walvault state` sorts keys; a u64 storage id does not
    # fit a long, so it travels as a decimal.
    frame = spark.createDataFrame(live, schema).repartitionByRange(partitions, "storage_id", "key") \
        .sortWithinPartitions("storage_id", "key").persist(StorageLevel.MEMORY_AND_DISK)
    frame.count()  # kept before `reduced` goes: else the files would be read again
    reduced.unpersist()
    if parquet is not None:
        parts = frame.rdd.mapPartitionsWithIndex(
            lambda index, it: [parquet.write_part(index, ((int(r[0]), bytes(r[1]), bytes(r[2])) for r in it))]
        ).collect()
        parquet.finish(parts)
    return _local_rows(frame)


def _local_rows(frame) -> Iterator[tuple[int, bytes, bytes]]:
    try:
        for row in frame.toLocalIterator():
            yield int(row[0]), bytes(row[1]), bytes(row[2])
    finally:
        frame.unpersist()

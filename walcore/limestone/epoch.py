"""The epoch file: durable-epoch records (`04 <u64 epoch>`); the durable epoch is their maximum."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ..findings import FindingList

DURABLE_EPOCH = 4
RECORD = struct.Struct("<BQ")
EPOCH_NAME = "epoch"


@dataclass(slots=True)
class EpochScan:
    records: int = 0
    durable_epoch: int | None = None  # the maximum record; None when there is none
    min_epoch: int | None = None
    findings: FindingList = field(default_factory=FindingList)


def scan_epoch(data: bytes) -> EpochScan:
    scan = EpochScan()
    whole = len(data) - len(data) % RECORD.size
    for offset in range(0, whole, RECORD.size):
        kind, epoch = RECORD.unpack_from(data, offset)
        if kind != DURABLE_EPOCH:
            scan.findings.add("bad_epoch_record", offset, f"record type {kind}, not {DURABLE_EPOCH} (durable epoch)")
            return scan
        scan.records += 1
        if scan.durable_epoch is None or epoch > scan.durable_epoch:
            scan.durable_epoch = epoch
        if scan.min_epoch is None or epoch < scan.min_epoch:
            scan.min_epoch = epoch
    if whole != len(data):
        scan.findings.add("partial_epoch_record", whole, f"the file ends {len(data) - whole} bytes into a "
                          f"{RECORD.size}-byte record")
    return scan

"""Which vinyl run files a vylog needs: its records replayed the way vy_log.c recovers them.

A vylog row's body holds `{0x21: [record type, {key: value}]}`, keys left out when zero. A vylog file
starts with every live object, so the newest one alone tells what recovery loads: for each LSM tree
that is created and not dropped, every run a slice of one of its ranges points at. vy_lsm_recover
opens `<vinyl_dir>/<space_id>/<index_id>/<run_id>.index` and `.run` of each, and Tarantool does not
start when one is missing (tarantool-files.md). Runs that are dropped but not yet forgotten only wait
for garbage collection: their files may be gone.
"""

from __future__ import annotations

from dataclasses import dataclass

# Record types (enum vy_log_record_type).
CREATE_LSM, DROP_LSM, INSERT_RANGE, DELETE_RANGE, PREPARE_RUN, CREATE_RUN, DROP_RUN, FORGET_RUN = range(8)
INSERT_SLICE, DELETE_SLICE = 8, 9
FORGET_LSM, PREPARE_LSM, REBOOTSTRAP, ABORT_REBOOTSTRAP = 14, 15, 16, 17
# Record keys (enum vy_log_key).
LSM_ID, RANGE_ID, RUN_ID, INDEX_ID, SPACE_ID, SLICE_ID = 0, 1, 2, 5, 6, 8
TUPLE = 0x21


class VylogError(ValueError):
    """A record that recovery would refuse (ER_INVALID_VYLOG_FILE): malformed, or naming an unknown object."""

    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class NeededRun:
    space_id: int
    index_id: int
    run_id: int
    offset: int  # of the block holding the record that created the run

    def file_names(self) -> tuple[str, str]:
        base = f"{self.space_id}/{self.index_id}/{self.run_id:020d}"
        return f"{base}.index", f"{base}.run"


@dataclass
class _Lsm:
    space_id: int
    index_id: int
    created: bool = False
    dropped: bool = False


@dataclass
class _Run:
    lsm_id: int
    created_at: int  # block offsets of the records that created and dropped (or forgot) it
    dropped_at: int | None = None


def _record(offset: int, body) -> tuple[int, dict]:
    record = body.get(TUPLE) if isinstance(body, dict) else None
    if not (isinstance(record, (list, tuple)) and len(record) == 2 and type(record[0]) is int
            and isinstance(record[1], dict)):
        raise VylogError(offset, f"vylog row body {body!r:.80} is not {{0x21: [type, {{key: value}}]}}")
    fields = record[1]
    if not all(type(k) is int for k in fields):
        raise VylogError(offset, f"vylog record {record!r:.80} has a key that is not an integer")
    return record[0], fields


def _id(fields: dict, key: int, offset: int, what: str) -> int:
    value = fields.get(key, 0)
    if type(value) is not int or value < 0:
        raise VylogError(offset, f"vylog record has {what} {value!r}, not an unsigned integer")
    return value


def needed_runs(records) -> list[NeededRun] | None:
    """The runs recovery loads, from (block offset, row body) pairs of one vylog in order.

    None when the log holds a rebootstrap record: what it leaves live is not judged here.
    Raises VylogError at the first record recovery would refuse.
    """
    lsms: dict[int, _Lsm] = {}
    ranges: dict[int, int] = {}  # range id -> LSM id
    runs: dict[int, _Run] = {}  # a forgotten run stays, as dropped (run ids are never reused)
    slices: dict[int, tuple[int, int]] = {}  # slice id -> (range id, run id)
    for offset, body in records:
        rtype, fields = _record(offset, body)
        if rtype in (REBOOTSTRAP, ABORT_REBOOTSTRAP):
            return None
        if rtype in (PREPARE_LSM, CREATE_LSM):
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            lsm = lsms.get(lsm_id)
            if lsm is None:  # a new vylog file names each live LSM tree in one CREATE_LSM, with no PREPARE_LSM
                lsm = lsms[lsm_id] = _Lsm(_id(fields, SPACE_ID, offset, "space id"),
                                          _id(fields, INDEX_ID, offset, "index id"))
            lsm.created |= rtype == CREATE_LSM
        elif rtype in (DROP_LSM, FORGET_LSM):
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            if lsm_id not in lsms:
                raise VylogError(offset, f"vylog drops LSM tree {lsm_id}, which it never created")
            if rtype == DROP_LSM:
                lsms[lsm_id].dropped = True
            else:
                del lsms[lsm_id]
        elif rtype == INSERT_RANGE:
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            if lsm_id not in lsms:
                raise VylogError(offset, f"vylog inserts a range into LSM tree {lsm_id}, which it never created")
            ranges[_id(fields, RANGE_ID, offset, "range id")] = lsm_id
        elif rtype == DELETE_RANGE:
            ranges.pop(_id(fields, RANGE_ID, offset, "range id"), None)
        elif rtype in (PREPARE_RUN, CREATE_RUN):
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            if lsm_id not in lsms:
                raise VylogError(offset, f"vylog adds a run to LSM tree {lsm_id}, which it never created")
            runs[_id(fields, RUN_ID, offset, "run id")] = _Run(lsm_id, offset)
        elif rtype in (DROP_RUN, FORGET_RUN):
            run_id = _id(fields, RUN_ID, offset, "run id")
            if run_id not in runs:
                raise VylogError(offset, f"vylog drops run {run_id}, which it never created")
            runs[run_id].dropped_at = offset
        elif rtype == INSERT_SLICE:
            range_id = _id(fields, RANGE_ID, offset, "range id")
            run_id = _id(fields, RUN_ID, offset, "run id")
            if range_id not in ranges or run_id not in runs:
                raise VylogError(offset, f"vylog inserts a slice of run {run_id} into range {range_id}, "
                                 "but the log has no such " + ("range" if range_id not in ranges else "run"))
            slices[_id(fields, SLICE_ID, offset, "slice id")] = (range_id, run_id)
        elif rtype == DELETE_SLICE:
            slices.pop(_id(fields, SLICE_ID, offset, "slice id"), None)
    needed: dict[int, NeededRun] = {}
    for range_id, run_id in slices.values():
        lsm = lsms.get(ranges.get(range_id, -1))
        if lsm is None or not lsm.created or lsm.dropped or run_id in needed:
            continue
        run = runs[run_id]
        if run.dropped_at is not None:
            raise VylogError(run.dropped_at, f"vylog drops run {run_id}, but a slice of a live range still uses it")
        needed[run_id] = NeededRun(lsm.space_id, lsm.index_id, run_id, run.created_at)
    return sorted(needed.values(), key=lambda r: r.run_id)

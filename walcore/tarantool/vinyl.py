"""Which vinyl run files a vylog needs: its records replayed the way vy_log.c recovers them.

A vylog row's body holds `{0x21: [record type, {key: value}]}`, keys left out when zero. A vylog file
starts with every live object, so the newest one alone tells what recovery loads: for each LSM tree
that is created and not dropped, every run a slice of one of its ranges points at. vy_lsm_recover
opens `<vinyl_dir>/<space_id>/<index_id>/<run_id>.index` and `.run` of each, and Tarantool does not
start when one is missing (tarantool-files.md). Runs that are dropped but not yet forgotten only wait
for garbage collection: their files may be gone. A run prepared but never created is a dump or compaction
a crash cut short: recovery deletes its files unread. A record vy_log.c refuses (a tree dropped twice, a
range, slice or run deleted that the log does not hold, ...) stops Tarantool: it is a VylogError here.
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
class VinylRun:
    space_id: int
    index_id: int
    run_id: int
    offset: int  # of the block holding the record that created the run (prepared it, if unfinished)

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
    created_at: int  # block offset of the record that created it (or prepared it, while unfinished)
    committed: bool  # CREATE_RUN seen (PREPARE_RUN alone: a dump or compaction still being written)
    dropped: bool = False
    forgotten: bool = False  # FORGET_RUN: gone from the log, as if never created


@dataclass
class VylogRuns:
    needed: list[VinylRun]  # every run a live range's slice uses: recovery opens its files
    unfinished: list[VinylRun]  # prepared, never created: recovery deletes its files unread


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


def replay(records) -> VylogRuns | None:
    """The runs of one vylog, from (block offset, row body) pairs in order.

    None when the log holds a rebootstrap record: what it leaves live is not judged here.
    Raises VylogError at the first record recovery would refuse.
    """
    lsms: dict[int, _Lsm] = {}
    ranges: dict[int, int] = {}  # range id -> LSM id
    range_slices: dict[int, int] = {}  # range id -> how many slices it holds
    runs: dict[int, _Run] = {}  # forgotten ones too, so that a slice can still name its LSM tree
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
            if rtype == FORGET_LSM:
                del lsms[lsm_id]
            elif lsms[lsm_id].dropped:
                raise VylogError(offset, f"vylog drops LSM tree {lsm_id} twice")
            else:
                lsms[lsm_id].dropped = True
        elif rtype == INSERT_RANGE:
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            range_id = _id(fields, RANGE_ID, offset, "range id")
            if lsm_id not in lsms:
                raise VylogError(offset, f"vylog inserts a range into LSM tree {lsm_id}, which it never created")
            if range_id in ranges:
                raise VylogError(offset, f"vylog inserts range {range_id} twice")
            ranges[range_id] = lsm_id
            range_slices[range_id] = 0
        elif rtype == DELETE_RANGE:
            range_id = _id(fields, RANGE_ID, offset, "range id")
            if range_id not in ranges:
                raise VylogError(offset, f"vylog deletes range {range_id}, which it does not hold")
            if range_slices[range_id]:
                raise VylogError(offset, f"vylog deletes range {range_id}, which still has run slices")
            del ranges[range_id], range_slices[range_id]
        elif rtype in (PREPARE_RUN, CREATE_RUN):
            lsm_id = _id(fields, LSM_ID, offset, "lsm id")
            run_id = _id(fields, RUN_ID, offset, "run id")
            if lsm_id not in lsms:
                raise VylogError(offset, f"vylog adds a run to LSM tree {lsm_id}, which it never created")
            run = runs.get(run_id)
            if run is not None and run.forgotten:
                run = None
            if run is not None and (rtype == PREPARE_RUN or run.dropped):
                raise VylogError(offset, f"vylog {'prepares' if rtype == PREPARE_RUN else 'creates'} run {run_id}, "
                                 + ("which it has dropped" if run.dropped else "which it already holds"))
            if run is None:
                runs[run_id] = _Run(lsm_id, offset, rtype == CREATE_RUN)
            elif rtype == CREATE_RUN:
                run.committed, run.created_at = True, offset
        elif rtype in (DROP_RUN, FORGET_RUN):
            run_id = _id(fields, RUN_ID, offset, "run id")
            run = runs.get(run_id)
            if run is None or run.forgotten:
                raise VylogError(offset, f"vylog {'drops' if rtype == DROP_RUN else 'forgets'} run {run_id}, "
                                 "which it does not hold")
            if rtype == DROP_RUN and run.dropped:
                raise VylogError(offset, f"vylog drops run {run_id} twice")
            run.dropped = True
            run.forgotten = rtype == FORGET_RUN
        elif rtype == INSERT_SLICE:
            range_id = _id(fields, RANGE_ID, offset, "range id")
            run_id = _id(fields, RUN_ID, offset, "run id")
            slice_id = _id(fields, SLICE_ID, offset, "slice id")
            if range_id not in ranges or run_id not in runs or runs[run_id].forgotten:
                raise VylogError(offset, f"vylog inserts a slice of run {run_id} into range {range_id}, "
                                 "but the log has no such " + ("range" if range_id not in ranges else "run"))
            if slice_id in slices:
                raise VylogError(offset, f"vylog inserts slice {slice_id} twice")
            slices[slice_id] = (range_id, run_id)
            range_slices[range_id] += 1
        elif rtype == DELETE_SLICE:
            slice_id = _id(fields, SLICE_ID, offset, "slice id")
            if slice_id not in slices:
                raise VylogError(offset, f"vylog deletes slice {slice_id}, which it does not hold")
            range_slices[slices.pop(slice_id)[0]] -= 1
    needed: dict[int, VinylRun] = {}
    for range_id, run_id in slices.values():
        lsm = lsms.get(ranges[range_id])
        # A run dropped while a live slice still uses it is loaded all the same (Tarantool 2.6 starts on it).
        if lsm is not None and lsm.created and not lsm.dropped and run_id not in needed:
            needed[run_id] = VinylRun(lsm.space_id, lsm.index_id, run_id, runs[run_id].created_at)
    unfinished = [VinylRun(lsms[r.lsm_id].space_id, lsms[r.lsm_id].index_id, run_id, r.created_at)
                  for run_id, r in runs.items() if not (r.committed or r.forgotten) and r.lsm_id in lsms]
    return VylogRuns(sorted(needed.values(), key=lambda r: r.run_id), unfinished)

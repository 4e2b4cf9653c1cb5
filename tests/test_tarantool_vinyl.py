"""Which run files a vylog needs: records replayed as vy_log.c recovers them, and the check on a data dir.

Real Tarantool proves the rule on real data (test_tarantool_real: a missing run in use stops it, one that
compaction replaced does not); here are the record-level cases and the bundled fixture.
"""

from __future__ import annotations

import json

import pytest

from conftest import TARANTOOL_FIXTURES, append_vylog_records, copy_tree, require_shared, run_main
from walcore.tarantool.check import check_vinyl, file_verdict
from walcore.tarantool.layout import discover
from walcore.tarantool.vinyl import (CREATE_LSM, CREATE_RUN, DELETE_RANGE, DELETE_SLICE, DROP_LSM, DROP_RUN,
                                     FORGET_RUN, INSERT_RANGE, INSERT_SLICE, PREPARE_LSM, PREPARE_RUN, REBOOTSTRAP,
                                     VinylRun, VylogError, replay)
from walcore.tarantool.xlog import scan_file

# Every test once on each scan core (compiled and pure-Python reference).
pytestmark = pytest.mark.usefixtures("scan_core")

LSM, RANGE, RUN, INDEX, SPACE, SLICE = 0, 1, 2, 5, 6, 8


def rec(rtype: int, **fields) -> dict:
    keys = {"lsm": LSM, "range": RANGE, "run": RUN, "index": INDEX, "space": SPACE, "slice": SLICE}
    return {0x21: (rtype, {keys[k]: v for k, v in fields.items()})}


def base() -> list[dict]:
    """Space 512: index 0 (LSM 1) with runs 3 and 4 in range 2; index 1 (LSM 5) with run 7 in range 6."""
    return [
        rec(PREPARE_LSM, lsm=1, space=512), rec(INSERT_RANGE, lsm=1, range=2), rec(CREATE_LSM, lsm=1),
        rec(CREATE_RUN, lsm=1, run=3), rec(INSERT_SLICE, range=2, run=3, slice=10),
        rec(CREATE_RUN, lsm=1, run=4), rec(INSERT_SLICE, range=2, run=4, slice=11),
        rec(CREATE_LSM, lsm=5, space=512, index=1), rec(INSERT_RANGE, lsm=5, range=6),
        rec(CREATE_RUN, lsm=5, run=7), rec(INSERT_SLICE, range=6, run=7, slice=12),
    ]


def needed(bodies: list[dict], which: str = "needed"):
    runs = replay((i * 100, b) for i, b in enumerate(bodies))
    return None if runs is None else [(r.space_id, r.index_id, r.run_id, r.offset) for r in getattr(runs, which)]


def test_runs_with_a_live_slice_are_needed():
    assert needed(base()) == [(512, 0, 3, 300), (512, 0, 4, 500), (512, 1, 7, 900)]
    assert VinylRun(512, 1, 7, 0).file_names() == ("512/1/00000000000000000007.index",
                                                    "512/1/00000000000000000007.run")


def test_compaction_replaces_runs():
    """Compaction: a new run sliced into the range, the old slices deleted and their runs dropped."""
    log = base() + [rec(CREATE_RUN, lsm=1, run=8), rec(INSERT_SLICE, range=2, run=8, slice=13),
                    rec(DELETE_SLICE, slice=10), rec(DELETE_SLICE, slice=11),
                    rec(DROP_RUN, run=3), rec(DROP_RUN, run=4), rec(FORGET_RUN, run=3)]
    assert needed(log) == [(512, 1, 7, 900), (512, 0, 8, 1100)]


def test_dropped_index_and_deleted_range_need_nothing():
    assert needed(base() + [rec(DROP_LSM, lsm=5)]) == [(512, 0, 3, 300), (512, 0, 4, 500)]
    assert needed(base() + [rec(DELETE_SLICE, slice=12), rec(DELETE_RANGE, range=6)]) == \
        [(512, 0, 3, 300), (512, 0, 4, 500)]


def test_index_being_built_is_not_judged():
    """A prepared LSM tree not yet created (an index build cut by a crash) is recovered only if the WAL
    holds the index: its runs are not counted as needed."""
    log = base() + [rec(PREPARE_LSM, lsm=20, space=512, index=2), rec(INSERT_RANGE, lsm=20, range=21),
                    rec(CREATE_RUN, lsm=20, run=22), rec(INSERT_SLICE, range=21, run=22, slice=23)]
    assert needed(log) == needed(base())


def test_prepared_runs_are_unfinished_until_created():
    """A dump or compaction a crash cut short: PREPARE_RUN without CREATE_RUN. Recovery deletes its files."""
    log = base() + [rec(PREPARE_RUN, lsm=1, run=30), rec(PREPARE_RUN, lsm=5, run=31), rec(CREATE_RUN, lsm=5, run=31)]
    assert needed(log, "unfinished") == [(512, 0, 30, 1100)]
    assert needed(log) == needed(base())
    assert needed(log + [rec(FORGET_RUN, run=30)], "unfinished") == []


def test_run_dropped_while_a_slice_uses_it_is_still_needed():
    # Tarantool 2.6 starts on such a log (found by a review against real Tarantool) and loads the run.
    assert needed(base() + [rec(DROP_RUN, run=3)]) == needed(base())


def test_rebootstrap_is_not_judged():
    assert needed(base() + [rec(REBOOTSTRAP)]) is None


@pytest.mark.parametrize("extra, offset, words", [
    (rec(INSERT_SLICE, range=99, run=3, slice=30), 1100, "no such range"),
    (rec(INSERT_SLICE, range=2, run=99, slice=30), 1100, "no such run"),
    (rec(CREATE_RUN, lsm=99, run=30), 1100, "LSM tree 99"),
    (rec(DROP_RUN, run=99), 1100, "run 99"),
    # what vy_log.c's vy_recovery_* handlers refuse (ER_INVALID_VYLOG_FILE)
    (rec(DELETE_RANGE, range=99), 1100, "range 99, which it does not hold"),
    (rec(DELETE_RANGE, range=2), 1100, "range 2, which still has run slices"),
    (rec(DELETE_SLICE, slice=99), 1100, "slice 99, which it does not hold"),
    (rec(INSERT_RANGE, lsm=1, range=6), 1100, "range 6 twice"),
    (rec(INSERT_SLICE, range=2, run=4, slice=12), 1100, "slice 12 twice"),
    (rec(PREPARE_RUN, lsm=1, run=4), 1100, "prepares run 4, which it already holds"),
    (rec(FORGET_RUN, run=99), 1100, "forgets run 99"),
    ({0x21: (CREATE_RUN, {LSM: 1, RUN: -1})}, 1100, "not an unsigned integer"),
    ({0x21: (CREATE_RUN, {"run": 1})}, 1100, "key that is not an integer"),
    ({0x21: [CREATE_RUN]}, 1100, "is not {0x21: [type"),
    ({0x10: 1}, 1100, "is not {0x21: [type"),
    (None, 1100, "is not {0x21: [type"),
])
def test_records_tarantool_refuses(extra, offset, words):
    with pytest.raises(VylogError) as e:
        needed(base() + [extra])
    assert e.value.offset == offset
    assert words in str(e.value)


@pytest.mark.parametrize("log, words", [
    ([rec(DELETE_SLICE, slice=12), rec(DROP_LSM, lsm=5), rec(DROP_LSM, lsm=5)], "drops LSM tree 5 twice"),
    ([rec(DELETE_SLICE, slice=12), rec(DROP_RUN, run=7), rec(CREATE_RUN, lsm=5, run=7)], "creates run 7, which it has dropped"),
    ([rec(DELETE_SLICE, slice=12), rec(DROP_RUN, run=7), rec(DROP_RUN, run=7)], "drops run 7 twice"),
    ([rec(DELETE_SLICE, slice=12), rec(FORGET_RUN, run=7), rec(DROP_RUN, run=7)], "drops run 7, which it does not hold"),
    ([rec(DELETE_SLICE, slice=12), rec(FORGET_RUN, run=7), rec(INSERT_SLICE, range=6, run=7, slice=40)], "no such run"),
])
def test_record_sequences_tarantool_refuses(log, words):
    with pytest.raises(VylogError) as e:
        needed(base() + log)
    assert e.value.offset == 1300 and words in str(e.value)


def test_a_forgotten_run_id_may_be_created_again():
    log = base() + [rec(DELETE_SLICE, slice=12), rec(FORGET_RUN, run=7), rec(CREATE_RUN, lsm=5, run=7),
                    rec(INSERT_SLICE, range=6, run=7, slice=40)]
    assert needed(log) == [(512, 0, 3, 300), (512, 0, 4, 500), (512, 1, 7, 1300)]


# --------------------------------------------------------------------------- the bundled fixture

# features/vinyl: space 513, index 0 and 1. Its newest vylog, 361, holds run 15 (index 1, created in the
# block at 110, the log's first) and run 18 (index 0, created by the compaction in the block at 468);
# runs 4 and 8, 6, 10 and 14 were compacted away and wait for garbage collection.
NEWEST = "00000000000000000361.vylog"


def _verify(root, *paths):
    proc = run_main("verify", *(paths or (root,)), "--json")
    return proc.returncode, {p["path"].rsplit("/", 1)[-1]: p for p in json.loads(proc.stdout)["files"]}


@require_shared
@pytest.mark.parametrize("gone, offset", [("513/0/00000000000000000018.run", 468),
                                          ("513/1/00000000000000000015.index", 110)])
def test_fixture_run_in_use_missing(tmp_path, gone, offset):
    root = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    (root / "vinyl" / gone).unlink()
    rc, files = _verify(root)
    assert rc == 1
    f = files[NEWEST]
    assert f["status"] == "damaged"
    assert [(x["code"], x["offset"]) for x in f["findings"]] == [("missing_run_file", offset)]
    assert gone in f["findings"][0]["message"]


@require_shared
def test_fixture_runs_compacted_away_may_be_gone(tmp_path):
    root = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    for run in (4, 8):
        for suffix in (".run", ".index"):
            (root / "vinyl" / "513" / "1" / f"{run:020d}{suffix}").unlink()
    rc, files = _verify(root)
    assert rc == 0
    assert files[NEWEST]["status"] == "ok"


@require_shared
def test_fixture_only_the_newest_vylog_of_a_checked_dir_is_followed(tmp_path):
    """Runs an older vylog names may be gone rightly; a vylog given alone is checked as a file only."""
    root = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    (root / "vinyl" / "513" / "0" / "00000000000000000006.run").unlink()  # in use at 197, not at 361
    older = root / "vinyl" / "00000000000000000197.vylog"
    rc, files = _verify(root)
    assert rc == 0 and files[older.name]["status"] == "ok"
    (root / "vinyl" / NEWEST).unlink()
    rc, files = _verify(root, older)
    assert rc == 0 and files[older.name]["status"] == "ok"
    rc, files = _verify(root / "vinyl")
    assert rc == 1
    assert [x["code"] for x in files[older.name]["findings"]] == ["missing_run_file"]


@require_shared
def test_fixture_vylog_record_tarantool_refuses(tmp_path):
    root = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    offset = append_vylog_records(root / "vinyl" / NEWEST, [rec(INSERT_SLICE, range=1, run=99, slice=100)])
    rc, files = _verify(root)
    assert rc == 1
    assert [(x["code"], x["offset"]) for x in files[NEWEST]["findings"]] == [("bad_vylog_record", offset)]
    assert "run 99" in files[NEWEST]["findings"][0]["message"]


@require_shared
def test_vylog_changed_after_its_check_is_a_finding_not_a_traceback(tmp_path):
    root = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    newest = root / "vinyl" / NEWEST
    layout = discover([root])
    reports = {str(p): file_verdict(scan_file(p)) for p in layout.files}
    assert reports[str(newest)].status == "ok"
    data = newest.read_bytes()
    newest.write_bytes(data[:len(data) // 2])  # cut by something else after walvault checked it
    (data_dir,) = [d for d in layout.data_dirs if d.vylogs]
    check_vinyl(data_dir, reports, layout.walked)
    f = reports[str(newest)]
    assert f.status == "damaged"
    assert [x.code for x in f.findings] == ["unreadable_file"]

"""Point-in-time restores of real Tarantool through the CLI: a vclock and a time between two backups, each
restored, started, and compared row by row with the data dir as it was at that moment."""

from __future__ import annotations

import json
import shutil
import time

import pytest

import tarantool_real as tr
import test_tarantool_live
from conftest import require_tarantool, run_cli_at, run_main

pytestmark = require_tarantool
live = test_tarantool_live.live  # the writing instance on a loopback port (a fixture)


@pytest.fixture(scope="module")
def two_backups(tmp_path_factory):
    """A full backup, then writes up to moment M (kept as a copy, and the time just after it), more writes
    crossing a snapshot and many xlogs after a restart, and an incremental backup."""
    root = tmp_path_factory.mktemp("pitr")
    src, repo = root / "src", root / "repo"
    tr.generate_instance(src, wal_max_size=16384, scale=1, snapshots=1)
    assert run_main("init", "--repo", repo).returncode == 0
    assert run_main("backup", src, "--repo", repo).returncode == 0
    tr.write_more(src, rows=800, snapshot=False, seed=1)
    moment = root / "moment"
    shutil.copytree(src, moment)
    time.sleep(0.3)
    after_moment = time.time()
    time.sleep(0.3)
    tr.write_more(src, rows=1500, snapshot=True, seed=2)
    proc = run_main("backup", src, "--repo", repo, "--type", "incremental")
    assert proc.returncode == 0, proc.stderr
    return {"repo": repo, "src": src, "expected": tr.dump_data_dir(moment), "time": after_moment,
            "end": tr.dump_data_dir(src)}


def _restore_to(two_backups, point: str, target):
    proc = run_main("restore", "latest", target, "--repo", two_backups["repo"], "--to", point, "--json")
    assert "Traceback" not in proc.stderr
    return proc


def test_restore_to_a_vclock_between_backups(two_backups, tmp_path):
    vclock = two_backups["expected"]["vclock"]
    point = "{" + ", ".join(f"{k}: {v}" for k, v in sorted(vclock.items())) + "}"
    proc = _restore_to(two_backups, point, tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {int(k): v for k, v in result["point"]["vclock"].items()} == vclock
    dump = tr.dump_data_dir(tmp_path / "r")
    assert dump["vclock"] == vclock
    assert dump["spaces"] == two_backups["expected"]["spaces"]
    assert dump["spaces"] != two_backups["end"]["spaces"], "the point is before the end"


def test_restore_to_a_time_between_backups(two_backups, tmp_path):
    proc = _restore_to(two_backups, f"@{two_backups['time']:.3f}", tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    dump = tr.dump_data_dir(tmp_path / "r")
    assert dump["vclock"] == two_backups["expected"]["vclock"]
    assert dump["spaces"] == two_backups["expected"]["spaces"]


def test_restore_to_the_end_equals_the_latest_backup(two_backups, tmp_path):
    vclock = two_backups["end"]["vclock"]
    point = ",".join(f"{k}:{v}" for k, v in sorted(vclock.items()))
    proc = _restore_to(two_backups, point, tmp_path / "r")
    assert proc.returncode == 0, proc.stderr
    assert tr.dump_data_dir(tmp_path / "r") == two_backups["end"]


@pytest.mark.parametrize("point, reason, code", [("@1000", "no backup", 1), ("past the end", "ends", 1),
                                                 ("not a point", "--to", 2)])  # 2: a bad command line
def test_unreachable_points_are_refused(two_backups, tmp_path, point, reason, code):
    if point == "past the end":
        end = two_backups["end"]["vclock"]
        point = ",".join(f"{k}:{v + 1000 if k == 1 else v}" for k, v in sorted(end.items()))
    proc = _restore_to(two_backups, point, tmp_path / "r")
    assert proc.returncode == code, proc.stderr
    assert reason in proc.stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / ".r.walvault-restore").exists()


def test_the_base_of_a_restore_to_the_end_is_the_newest_position_not_the_latest_clock(tmp_path):
    """An older backup made on a host whose clock ran 72 h ahead finished "after" a newer one (`latest` names it):
    the base of a restore to the end, or to a vclock, is the snapshot furthest along the log, never the one with the
    latest clock (from the older one the restore ended short of the newer backup's own position: the instance had
    removed the xlogs between the two, as its garbage collection does)."""
    src, repo = tmp_path / "src", tmp_path / "repo"
    tr.generate_instance(src, wal_max_size=16384, scale=1, snapshots=1)
    assert run_main("init", "--repo", repo).returncode == 0
    skewed = run_cli_at(time.time() + 72 * 3600, "backup", src, "--repo", repo)
    assert skewed.returncode == 0, skewed.stderr
    tr.write_more(src, rows=800, snapshot=True, seed=3)
    snapshot = max(p.name for p in (src / "memtx").glob("*.snap")).replace(".snap", ".xlog")
    for xlog in (src / "wal").glob("*.xlog"):
        if xlog.name < snapshot:
            xlog.unlink()
    newer = run_main("backup", src, "--repo", repo)
    assert newer.returncode == 0, newer.stderr
    end = tr.dump_data_dir(src)
    vclock = ",".join(f"{k}:{v}" for k, v in sorted(end["vclock"].items()))
    for point in ("end", vclock):
        target = tmp_path / f"r-{point}"
        proc = run_main("restore", "latest", target, "--repo", repo, "--to", point, "--json")  # the skewed one
        assert proc.returncode == 0, proc.stderr
        assert tr.dump_data_dir(target) == end, point


def test_a_time_before_a_checkpoint_of_the_running_instance_is_not_restored_from_that_checkpoint(live, tmp_path):
    from test_backup_live import _call_mark

    repo = tmp_path / "repo"
    assert run_main("init", "--repo", repo).returncode == 0
    for kind in ("full", "incremental"):
        if kind == "incremental":
            _call_mark(live, 910001)
            time.sleep(0.3)
            point = time.time()
            time.sleep(0.3)
            _call_mark(live, 910002)  # after the point
            live.eval("box.snapshot()")
        proc = run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri, "--type", kind)
        assert proc.returncode == 0, proc.stderr
    proc = run_main("restore", "latest", tmp_path / "r", "--repo", repo, "--to", f"@{point:.3f}")
    # The base can only be the full backup's snapshot. The log from it to the point is in the repository only
    # when the incremental found the xlog the checkpoint sealed (checkpoint_count = 1: Tarantool removes it soon
    # after box.snapshot()); without it the restore is refused, naming where the log ends.
    if proc.returncode == 0:
        rows = tr.dump_data_dir(tmp_path / "r")["spaces"]["mem"]
        assert [910001, "marker"] in rows and [910002, "marker"] not in rows
    else:
        assert proc.returncode == 1 and "before the point" in proc.stderr, proc.stderr



def test_a_snapshot_backup_of_the_running_instance_is_no_base_for_a_time_before_it(live, tmp_path):
    """`walvault snapshot --connect` runs box.snapshot(): its rows carry the first checkpoint's time (Tarantool
    2.6) and it holds no xlog to date it by. Taken for a base of a time before it, a restore to a point the full
    backup and the incremental's log cover was refused (a transaction of the snapshot after the point), from the
    incremental named too."""
    from test_backup_live import _call_mark

    repo = tmp_path / "repo"
    assert run_main("init", "--repo", repo).returncode == 0
    proc = run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri)
    assert proc.returncode == 0, proc.stderr
    _call_mark(live, 910001)
    time.sleep(0.3)
    point = time.time()
    time.sleep(0.3)
    _call_mark(live, 910002)  # after the point
    proc = run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri, "--type", "incremental")
    assert proc.returncode == 0, proc.stderr
    proc = run_main("snapshot", live.work_dir, "--repo", repo, "--connect", live.uri)
    assert proc.returncode == 0, proc.stderr
    proc = run_main("restore", "latest", tmp_path / "r", "--repo", repo, "--to", f"@{point:.3f}")
    assert proc.returncode == 0, proc.stderr
    rows = tr.dump_data_dir(tmp_path / "r")["spaces"]["mem"]
    assert [910001, "marker"] in rows and [910002, "marker"] not in rows

"""Which files walvault finds under a path and how it groups them into data dirs: instances and copies
side by side, symlinked directories, one directory reached twice, odd names, vylogs.

Every case is built from the real files of ../shared/fixtures/tarantool (or a real Tarantool's), and the
expected verdicts come from verifying each directory alone, which the fixture tests pin to what
Tarantool's own reader reports.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import TARANTOOL_FIXTURES, copy_tree, require_shared, run_main
from walcore.tarantool.block import EOF_MAGIC

# Every test once on each scan core (compiled and pure-Python reference).
pytestmark = [require_shared, pytest.mark.usefixtures("scan_core")]


def verify_json(*paths) -> tuple[int, dict]:
    proc = run_main("verify", "--json", *paths)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def flat_copy(dst: Path, *dirs: str) -> Path:
    """One directory holding the files of fixture dirs (memtx_dir = wal_dir = one dir)."""
    dst.mkdir(parents=True)
    for d in dirs:
        for p in (TARANTOOL_FIXTURES / d).iterdir():
            if p.is_file():
                shutil.copy(p, dst / p.name)
    return dst


def chains_of(report: dict) -> list[tuple[str, str, list[str]]]:
    return sorted((Path(c["path"]).name, c["status"], [f["code"] for f in c["findings"]]) for c in report["chains"])


def test_instances_side_by_side_stand_alone(tmp_path):
    # /var/lib/tarantool/<instance>/: two instances under one parent are two data dirs, never one mixed one
    # (siblings join only when no kind of file is in two of them, as memtx/, wal/ and vinyl/).
    root = tmp_path / "instances"
    flat_copy(root / "a", "concurrent")
    flat_copy(root / "b", "features/memtx", "features/wal")
    alone = [verify_json(root / name) for name in ("a", "b")]
    assert [rc for rc, _ in alone] == [0, 0]
    rc, together = verify_json(root)
    assert rc == 0, together["chains"]
    assert chains_of(together) == sorted(c for _, r in alone for c in chains_of(r))
    assert {len(c["snapshots"]) for c in together["chains"]} == {1, 4}  # each chain has its own snapshots


def test_copies_of_one_instance_side_by_side_stand_alone(tmp_path):
    # Two backups of one instance kept side by side: same instance, but both hold xlogs and snapshots.
    root = tmp_path / "backups"
    flat_copy(root / "day1", "features/memtx", "features/wal")
    flat_copy(root / "day2", "features/memtx", "features/wal")
    for p in sorted((root / "day1").glob("*.xlog"))[-2:]:
        p.unlink()  # day1 is an older copy: fewer xlogs
    rc, report = verify_json(root)
    assert rc == 0, report["chains"]
    assert chains_of(report) == [("day1", "ok", []), ("day2", "ok", [])]
    for chain in report["chains"]:  # each copy's snapshots cover its own xlogs only
        assert {str(Path(s["path"]).parent) for s in chain["snapshots"]} == {chain["path"]}
        assert len(chain["snapshots"]) == 4


def test_memtx_wal_vinyl_siblings_form_one_data_dir(tmp_path):
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    rc, report = verify_json(work)
    assert rc == 0
    (chain,) = report["chains"]
    assert Path(chain["path"]).name == "wal"
    assert [Path(s["path"]).parent.name for s in chain["snapshots"]] == ["memtx"] * 4


def test_symlinked_wal_dir_is_followed(tmp_path):
    # The WAL on another disk through a symlink: its damage must be found, and its chain linked.
    real_wal = copy_tree(TARANTOOL_FIXTURES / "features" / "wal", tmp_path / "other-disk" / "wal")
    work = tmp_path / "data"
    copy_tree(TARANTOOL_FIXTURES / "features" / "memtx", work / "memtx")
    (work / "wal").symlink_to(real_wal, target_is_directory=True)
    damaged = real_wal / "00000000000000000123.xlog"
    size = damaged.stat().st_size
    with open(damaged, "ab") as f:
        f.write(b"garbage")
    rc, report = verify_json(work)
    assert rc == 1
    (f,) = [f for f in report["files"] if Path(f["path"]).name == damaged.name]
    assert [(x["code"], x["offset"]) for x in f["findings"]] == [("data_after_eof", size)]
    (chain,) = report["chains"]
    assert len(chain["xlogs"]) == 5 and len(chain["snapshots"]) == 4


def test_one_directory_reached_twice_is_listed_once(tmp_path):
    work = copy_tree(TARANTOOL_FIXTURES / "concurrent", tmp_path / "c")
    (tmp_path / "link").symlink_to(work, target_is_directory=True)
    _, once = verify_json(work)
    rc, twice = verify_json(work, tmp_path / "c" / ".." / "c", tmp_path / "link", work / "00000000000000000000.xlog")
    assert rc == 0
    assert len(twice["files"]) == len(once["files"]) == len({f["path"] for f in twice["files"]})
    assert chains_of(twice) == chains_of(once)


def test_one_directory_spelled_two_ways_is_one_chain(tmp_path):
    # A file named through a link, then its directory by its own name: one chain, not two halves
    # (the second half would start after the snapshot: a false snapshot_gap).
    work = copy_tree(TARANTOOL_FIXTURES / "concurrent", tmp_path / "c")
    (tmp_path / "link").symlink_to(work, target_is_directory=True)
    first = sorted(work.glob("*.xlog"))[0].name
    _, alone = verify_json(work)
    rc, report = verify_json(tmp_path / "link" / first, work)
    assert rc == 0
    assert len(report["chains"]) == 1 and [c[1:] for c in chains_of(report)] == [c[1:] for c in chains_of(alone)]


def test_symlink_loop_ends(tmp_path):
    work = copy_tree(TARANTOOL_FIXTURES / "concurrent", tmp_path / "c")
    (work / "loop").symlink_to(work, target_is_directory=True)
    rc, report = verify_json(work)
    assert rc == 0
    assert len(report["files"]) == len(list(work.glob("*.*")))


def test_non_ascii_digits_in_a_name(tmp_path):
    # str.isdigit() accepts '²' and '٠', int() does not take the first; Tarantool's names are ASCII digits.
    work = tmp_path / "odd"
    work.mkdir()
    src = TARANTOOL_FIXTURES / "concurrent" / "00000000000000000000.xlog"
    for name in ("².xlog", "٠٠.xlog"):
        shutil.copy(src, work / name)
    rc, report = verify_json(work)
    assert sorted(Path(f["path"]).name for f in report["files"]) == sorted(["².xlog", "٠٠.xlog"])
    # Names without a number sort by name; two copies of one xlog then make a chain that does not link.
    assert (rc, chains_of(report)) == (1, [("odd", "damaged", ["prev_vclock_mismatch", "rows_lost"])])


def test_older_vylog_without_eof_is_open(tmp_path):
    # A real crash can leave one: Tarantool SIGKILLed with a vylog open, restarted, then a checkpoint with
    # no vinyl change since starts a new vylog without reopening the old one (a review reproduced it).
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    older = sorted((work / "vinyl").glob("*.vylog"))[1]
    data = older.read_bytes()
    assert data.endswith(EOF_MAGIC)
    older.write_bytes(data[:-len(EOF_MAGIC)])  # cut at the last block boundary: every block whole
    rc, report = verify_json(work)
    assert rc == 0
    assert {Path(f["path"]).name: f["status"] for f in report["files"]}[older.name] == "open"


def test_vylog_of_another_instance_is_a_mismatch(tmp_path, real_instance):
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    stranger = sorted((real_instance / "vinyl").glob("*.vylog"))[-1]
    shutil.copy(stranger, work / "vinyl" / "00000000000000099999.vylog")
    rc, report = verify_json(work)
    assert rc == 1
    (chain,) = report["chains"]
    # Being the newest vylog, the stranger also names runs this vinyl dir does not have.
    assert [(f["code"], Path(f["file"]).name) for f in chain["findings"]] == [
        ("instance_mismatch", "00000000000000099999.vylog"), ("damaged_file", "00000000000000099999.vylog")]

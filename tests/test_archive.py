"""walvault archive: sealed files only, each verified first; the same file twice is a no-op, the same name
with other bytes a conflict that keeps both; what it verified goes to the ledger, so a backup of the same
bytes reads them once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import (copy_limestone_fixture, new_repository, require_limestone, require_tarantool, run_main,
                      tree_snapshot)


def _archive(*args):
    proc = run_main("archive", *args, "--json")
    assert "Traceback" not in proc.stderr
    return proc, (json.loads(proc.stdout) if proc.stdout.strip() else None)


@require_tarantool
def test_tarantool_sealed_files_only_then_a_no_op(real_instance, repo_target, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(real_instance, src)
    before = tree_snapshot(src)
    repo_target.repository(create=True)
    proc, result = _archive(src, *repo_target.cli)
    assert proc.returncode == 0, proc.stderr
    assert tree_snapshot(src) == before, "archive wrote to the source"
    stored = {Path(p).name for p in result["stored"]}
    xlogs = sorted(p.name for p in (src / "wal").glob("*.xlog"))
    vylogs = sorted(p.name for p in (src / "vinyl").glob("*.vylog"))
    assert set(xlogs[:-1]) <= stored and xlogs[-1] not in stored
    assert set(vylogs[:-1]) <= stored and vylogs[-1] not in stored
    assert {p.name for p in (src / "memtx").glob("*.snap")} <= stored
    assert any(n.endswith(".run") for n in stored) and any(n.endswith(".index") for n in stored)
    assert str(src / "wal" / xlogs[-1]) in result["not_sealed"]
    # every archived file is verified and recorded
    report = json.loads(run_main("verify", *repo_target.cli, "--json").stdout)
    assert report["intact"] and report["archive"][0]["files"] == len(stored)
    again_proc, again = _archive(src, *repo_target.cli)
    assert again_proc.returncode == 0
    assert again["stored"] == [] and sorted(again["already"]) == sorted(result["stored"])


@require_tarantool
def test_damaged_file_is_refused_with_its_findings(real_instance, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(real_instance, src)
    xlog = sorted((src / "wal").glob("*.xlog"))[1]
    data = bytearray(xlog.read_bytes())
    data[len(data) // 2] ^= 0xFF
    xlog.write_bytes(bytes(data))
    proc, result = _archive(src, "--repo", new_repository(tmp_path / "repo"))
    assert proc.returncode == 1
    refused = {r["path"]: r for r in result["refused"]}
    assert str(xlog) in refused
    finding = refused[str(xlog)]["findings"][0]
    assert finding["code"] in ("crc_mismatch", "bad_row", "zstd_error") and finding["offset"] > 0
    assert str(xlog) not in result["stored"]
    names = [p.name for p in (tmp_path / "repo").rglob("*.zst")]
    assert xlog.name + ".zst" not in names


@require_tarantool
def test_same_name_other_bytes_is_a_conflict_that_keeps_both(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    uuid = "11111111-2222-4333-8444-555555555555"
    tr.generate_instance(first, wal_max_size=16384, scale=1, snapshots=1, instance_uuid=uuid)
    repo = new_repository(tmp_path / "repo")
    proc, _ = _archive(first, "--repo", repo)
    assert proc.returncode == 0, proc.stderr
    # the same instance's files with other bytes under one name: a snapshot rewritten (another history)
    tr.generate_instance(second, wal_max_size=16384, scale=1, snapshots=1, instance_uuid=uuid)
    snap = sorted((second / "memtx").glob("*.snap"))[0]
    target = first / "memtx" / snap.name
    if not target.exists():
        pytest.skip("the two runs' first snapshots got different names")
    assert target.read_bytes() != snap.read_bytes()
    shutil.copy(snap, target)
    proc, result = _archive(first, "--repo", repo)
    assert proc.returncode == 1
    conflict = next(c for c in result["conflicts"] if c["path"] == str(target))
    assert ".conflict-" in conflict["kept_as"] and conflict["sha256"] != conflict["archived_sha256"]
    objects = {p.name for p in repo.rglob(f"{snap.name}*.zst")}
    assert snap.name + ".zst" in objects and any(".conflict-" in n for n in objects)
    report = json.loads(run_main("verify", "--repo", repo, "--json").stdout)
    assert any(f["code"] == "conflict" for a in report["archive"] for f in a["findings"])


@require_tarantool
def test_backup_after_archive_reads_verified_bytes_once(real_instance, tmp_path):
    """Files the archive verified are not scanned again by the backup: their verdict comes from the ledger."""
    from walcore.repository import Repository

    repo = new_repository(tmp_path / "repo")
    assert run_main("archive", real_instance, "--repo", repo).returncode == 0
    proc = run_main("backup", real_instance, "--repo", repo, "--json")
    assert proc.returncode == 0, proc.stderr
    manifest = Repository(str(repo)).find(json.loads(proc.stdout)["id"]).manifest
    checked = {e.name: e.verification["checked_by"] for e in manifest.files}
    sealed = [e.name for e in manifest.files if not e.mutable]
    assert sealed and all(checked[n] == "ledger" for n in sealed)
    assert all(checked[e.name] == "scan" for e in manifest.files if e.mutable)


@require_limestone
def test_limestone_rotated_files_and_versioned_catalog(tmp_path):
    src = copy_limestone_fixture("11-online-compaction", tmp_path)
    proc, result = _archive(src, "--repo", new_repository(tmp_path / "repo"))
    assert proc.returncode == 0, proc.stderr
    stored = {Path(p).name for p in result["stored"]}
    assert stored, result
    assert not any(n == "epoch" or (n.startswith("pwal_") and len(n) <= 9) for n in stored)
    assert {Path(p).name for p in result["not_sealed"]} >= {n.name for n in src.iterdir()
                                                          if n.name == "epoch" or (n.name.startswith("pwal_")
                                                                                   and len(n.name) <= 9)}
    objects = [p.name for p in (tmp_path / "repo").rglob("*.zst")]
    assert any(n.startswith("compaction_catalog@") for n in objects)

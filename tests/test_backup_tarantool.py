"""Backups of real Tarantool data dirs, proven by restoring them and starting Tarantool on the restore.

Every space is compared row by row, and the vclock, with the source as it was when the backup was taken
(a copy of the source is dumped at that moment). The repository is a local path and a bucket on a real
S3 API on 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil

import pytest

import tarantool_real as tr
from conftest import new_repository, require_tarantool, run_main, tree_snapshot

pytestmark = require_tarantool


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A data dir at two moments: after generate_instance (A), then after more writes crossing a snapshot and
    many xlogs (B); each moment kept as a copy with its dump."""
    root = tmp_path_factory.mktemp("history")
    src = root / "src"
    tr.generate_instance(src, wal_max_size=16384, scale=2, snapshots=2)
    moment_a = root / "a"
    shutil.copytree(src, moment_a)
    tr.write_more(src, rows=3000, snapshot=True, seed=1)
    moment_b = root / "b"
    shutil.copytree(src, moment_b)
    return {"a": moment_a, "b": moment_b, "dump_a": tr.dump_data_dir(moment_a), "dump_b": tr.dump_data_dir(moment_b)}


def _restore_and_dump(repo_target, backup_id, target, expected_id):
    proc = run_main("restore", backup_id, target, *repo_target.cli, "--json")
    result = _json(proc)
    assert result["backup"] == expected_id
    return tr.dump_data_dir(target)


def test_full_then_incremental_restore_row_by_row(history, repo_target, tmp_path):
    repo_target.repository(create=True)
    src = tmp_path / "src"
    shutil.copytree(history["a"], src)
    before = tree_snapshot(src)
    full = _json(run_main("backup", src, *repo_target.cli, "--json"))
    assert tree_snapshot(src) == before, "backup wrote to the source"
    assert full["type"] == "full" and full["parent"] is None
    assert full["position"] == {"vclock": {str(k): v for k, v in sorted(history["dump_a"]["vclock"].items())}}
    # the source moves on to moment B: new xlogs and a new snapshot
    shutil.rmtree(src)
    shutil.copytree(history["b"], src)
    incr = _json(run_main("backup", src, *repo_target.cli, "--type", "incremental", "--json"))
    assert incr["type"] == "incremental" and incr["parent"] == full["id"]
    assert incr["position"] == {"vclock": {str(k): v for k, v in sorted(history["dump_b"]["vclock"].items())}}
    assert 0 < incr["stored_bytes"] < incr["bytes"], "an incremental stores only what its parent does not hold"

    listed = _json(run_main("backups", *repo_target.cli, "--json"))["backups"]
    assert [b["id"] for b in listed] == [full["id"], incr["id"]]
    assert {b["status"] for b in listed} == {"ok"}
    assert set(listed[0]) >= {"id", "type", "parent", "source", "family", "status", "files", "bytes", "stored_bytes",
                              "started", "finished", "position"}

    restored_a = _restore_and_dump(repo_target, full["id"], tmp_path / "restored-a", full["id"])
    assert restored_a["vclock"] == history["dump_a"]["vclock"]
    assert restored_a["spaces"] == history["dump_a"]["spaces"]
    restored_b = _restore_and_dump(repo_target, "latest", tmp_path / "restored-b", incr["id"])
    assert restored_b["vclock"] == history["dump_b"]["vclock"]
    assert restored_b["spaces"] == history["dump_b"]["spaces"]
    assert restored_b["instance_uuid"] == history["dump_b"]["instance_uuid"]

    report = _json(run_main("verify", *repo_target.cli, "--json"))
    assert report["intact"] is True and len(report["backups"]) == 2
    assert report["objects"] > 0


def test_incremental_references_the_parent_and_keeps_the_log_unbroken(history, tmp_path):
    """The incremental's manifest references the parent's objects for sealed files it already holds, and holds
    every xlog since the parent's newest, so that the log runs on from one backup to the next."""
    from walcore.repository import Repository

    src = tmp_path / "src"
    shutil.copytree(history["a"], src)
    repo_dir = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo_dir, "--json"))
    shutil.rmtree(src)
    shutil.copytree(history["b"], src)
    incr = _json(run_main("backup", src, "--repo", repo_dir, "--type", "incremental", "--json"))
    repo = Repository(str(repo_dir))
    full_m = repo.find(full["id"]).manifest
    incr_m = repo.find(incr["id"]).manifest
    referenced = [e for e in incr_m.files if e.reference is not None]
    assert all(e.reference == full_m.id and e.stored.startswith(f"tarantool/{full_m.instance}/backups/{full_m.id}/")
               for e in referenced)
    xlogs = [e for e in incr_m.files if e.kind == "xlog"]
    full_newest = [e for e in full_m.files if e.kind == "xlog"][-1]
    assert xlogs[0].name <= full_newest.name, "the log since the parent's newest xlog is in the incremental"
    for prev, nxt in zip(xlogs, xlogs[1:]):
        assert nxt.verification["prev_vclock"] == prev.verification["vclock"]
    # the parent's newest xlog was mutable: stored again now that it has grown
    assert next(e for e in incr_m.files if e.name == full_newest.name).reference is None
    assert [e.mutable for e in xlogs] == [False] * (len(xlogs) - 1) + [True]


def test_incremental_without_full_is_refused(history, tmp_path):
    proc = run_main("backup", history["a"], "--repo", new_repository(tmp_path / "repo"), "--type", "incremental")
    assert proc.returncode == 1
    assert "no full backup" in proc.stderr and "Traceback" not in proc.stderr


def test_incremental_of_another_instance_is_refused(history, tmp_path):
    other = tmp_path / "other"
    tr.generate_instance(other, wal_max_size=16384, scale=1, snapshots=1)
    repo = new_repository(tmp_path / "repo")
    _json(run_main("backup", history["a"], "--repo", repo, "--json"))
    proc = run_main("backup", other, "--repo", repo, "--type", "incremental")
    assert proc.returncode == 1 and "no full backup" in proc.stderr
    assert tr.read_manifest(other)["instance_uuid"] in proc.stderr


def test_crashed_source_restores(crashed_instance, tmp_path):
    """A data dir Tarantool was killed in: the newest xlog has no EOF marker and is stored as it is; the restore
    starts with every committed row."""
    src = tmp_path / "src"
    shutil.copytree(crashed_instance, src)
    expected = tr.dump_data_dir(src)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    proc = run_main("restore", full["id"], tmp_path / "restored", "--repo", repo)
    assert proc.returncode == 0, proc.stderr
    restored = tr.dump_data_dir(tmp_path / "restored")
    assert restored["vclock"] == expected["vclock"]
    assert restored["spaces"] == expected["spaces"]


def test_a_newest_xlog_that_ends_inside_a_block_is_stored_cut_and_restores_cut(crashed_instance, repo_target,
                                                                                encryption, monkeypatch, tmp_path):
    """The spooled copy is stored while it is scanned; found torn, it is cut after its last whole block and stored
    again: the stored object, the manifest's record and the restored file are the cut bytes, and the note says so."""
    import hashlib

    from conftest import encrypted_target
    from tarantool_bytes import tear_newest_xlog

    target = encrypted_target(repo_target, monkeypatch) if encryption == "encrypted" else repo_target
    if encryption == "plain":
        target.repository(create=True)
    src = tmp_path / "src"
    shutil.copytree(crashed_instance, src)
    name, whole = tear_newest_xlog(src)
    torn_size = (src / name).stat().st_size
    full = _json(run_main("backup", src, *target.cli, "--json"))
    assert [n for n in full["notes"] if "ends inside a block" in n] == [
        f"{name} ends inside a block at byte {len(whole)} (being written, or torn by a crash): the "
        f"{torn_size - len(whole)} bytes after its last whole block are not stored"]
    repo = target.repository(create=False)
    entry = next(e for e in repo.find(full["id"]).manifest.files if e.name == name)
    assert (entry.size, entry.sha256) == (len(whole), hashlib.sha256(whole).hexdigest())
    stored = b"".join(repo.read_object(entry.stored, size=entry.size, sha256=entry.sha256,
                                       stored_sha256=entry.stored_sha256))
    assert stored == whole
    assert entry.verification["status"] == "open" and not entry.verification.get("findings"), entry.verification
    restored = tmp_path / "restored"
    proc = run_main("restore", full["id"], restored, *target.cli)
    assert proc.returncode == 0, proc.stderr
    assert (restored / name).read_bytes() == whole
    assert _json(run_main("verify", *target.cli, "--json"))["intact"] is True

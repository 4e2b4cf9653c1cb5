"""walvault drill: a backup restored into a scratch directory and proven; the verdict recorded beside it."""

from __future__ import annotations

import json

from conftest import copy_limestone_fixture, new_repository, require_limestone, require_tarantool, run_main


def _backups(repo) -> dict:
    return {b["id"]: b for b in json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]}


@require_tarantool
def test_a_tarantool_backup_starts_at_its_recorded_vclock(real_instance, tmp_path):
    repo = new_repository(tmp_path / "repo")
    backup = json.loads(run_main("backup", real_instance, "--repo", repo, "--json").stdout)
    proc = run_main("drill", backup["id"], "--repo", repo, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "ok" and any("tarantool started on it at the recorded vclock" in c
                                            for c in result["checks"])
    assert _backups(repo)[backup["id"]]["drill"]["status"] == "ok"


@require_limestone
def test_a_damaged_object_fails_the_drill_and_marks_the_backup(tmp_path):
    src = copy_limestone_fixture("20-random-small", tmp_path, "src")
    repo = new_repository(tmp_path / "repo")
    backup = json.loads(run_main("backup", src, "--repo", repo, "--json").stdout)
    assert run_main("drill", "latest", "--repo", repo).returncode == 0
    victim = max(repo.rglob("backups/*/pwal_*.zst"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    proc = run_main("drill", "latest", "--repo", repo)
    assert proc.returncode == 1 and "FAILED" in proc.stdout and victim.name in proc.stdout
    assert _backups(repo)[backup["id"]]["drill"]["status"] == "failed"
    assert "DRILL FAILED" in run_main("backups", "--repo", repo).stdout

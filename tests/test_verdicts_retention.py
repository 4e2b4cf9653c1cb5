"""The verdicts kept beside backups (verify.json, drill.json) and what retention and status make of them, on a real
Tarantool history (test_retention_tarantool's): a verdict says whether a backup is counted on to restore; it never
makes expire delete what it would have kept, and only a backup that was checked gets one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tarantool_real as tr
from conftest import clock_at, require_tarantool, run_main
from test_retention_tarantool import DAY, generated, history, repo  # noqa: F401 (fixtures)

pytestmark = require_tarantool


def _backup_dir(repo: Path, backup_id: str) -> Path:
    (found,) = Path(repo).glob(f"tarantool/*/backups/{backup_id}")
    return found


def _listed(repo: Path) -> dict[str, dict]:
    return {b["id"]: b for b in json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]}


def _own_object(repo: Path, backup_id: str) -> Path:
    """An object the backup stored itself (no other backup's manifest names it)."""
    manifest = json.loads((_backup_dir(repo, backup_id) / "backup.manifest").read_text())
    (own, *_) = [e["stored"] for e in manifest["files"] if e["reference"] is None]
    return Path(repo) / own


def test_the_newest_backup_a_verification_once_found_damaged_is_not_expired(repo, history, tmp_path):
    """An object of the newest backup is away while `verify --repo` runs (an object store's outage, an rsync of
    the repository in progress), then back: every byte is there, yet the verdict says damaged until the next
    verification. The expiry judged by it must not delete the newest backup of the source: its rows written
    since the previous backup are in no other backup."""
    ids = history["ids"]
    victim = _own_object(repo, ids["I2"])
    away = tmp_path / "away"
    shutil.move(victim, away)
    assert run_main("verify", "--repo", repo).returncode == 1
    shutil.move(away, victim)
    assert _listed(repo)[ids["I2"]]["verification"]["status"] == "damaged"
    with clock_at(history["done"] + 400 * DAY):
        proc = run_main("expire", "--repo", repo, "--days", "30", "--apply", "--json")
    assert proc.returncode == 0, proc.stderr
    assert ids["I2"] in _listed(repo), "the newest backup of the source was deleted"
    restored = tmp_path / "restored"
    assert run_main("restore", ids["I2"], restored, "--repo", repo).returncode == 0
    assert tr.dump_data_dir(restored) == history["end"]


def test_verifying_a_backup_still_being_written_gives_it_no_verdict(repo, history):
    """`verify --repo URL ID` of a backup whose writer has not committed its manifest yet (simulated: the manifest
    put aside, then committed): what the verification found is that there was no manifest yet, which says nothing
    of the backup once committed; it must not be marked damaged for it."""
    ids = history["ids"]
    backup = _backup_dir(repo, ids["I2"])
    manifest, copy = backup / "backup.manifest", backup / "backup.manifest.copy"
    held = {p: p.read_bytes() for p in (manifest, copy)}
    for p in held:
        p.unlink()
    assert run_main("verify", ids["I2"], "--repo", repo).returncode == 1
    for p, data in held.items():
        p.write_bytes(data)
    assert _listed(repo)[ids["I2"]]["verification"] is None
    with clock_at(history["done"] + 60):
        status = json.loads(run_main("status", "--repo", repo, "--json").stdout)
    (source,) = status["sources"]
    assert source["backup"]["id"] == ids["I2"], source["problems"]


def test_a_backup_expired_while_it_was_verified_is_not_left_behind_by_its_verdict(repo, history):
    """An expiry deletes a backup while `verify --repo` checks the repository (simulated: the backup removed when
    the verdict is out, before the verdicts are kept): its verdict must not bring a directory of it back."""
    from walcore.command.repo_verify import verify_backups
    from walcore.repository import Repository
    from walcore.runner import LocalRunner

    gone = _backup_dir(repo, history["ids"]["F1"])
    verify_backups(Repository(str(repo)), None, runner=LocalRunner(1), show=lambda report: shutil.rmtree(gone))
    assert not gone.exists()
    assert history["ids"]["F1"] not in _listed(repo)


def test_a_doubted_anchor_leaves_the_window_uncovered_not_anchored_on_an_older_snapshot(repo, history, tmp_path):
    """An expiry anchored on S1 and deleted the log its checkpoint covers; then a verification finds the copies of
    that checkpoint (in S1 and in I1) damaged. F1 is older and restorable, but the log from it on is gone: the window
    must be reported uncovered (and nothing of it deleted), not covered by F1, from which its start does not
    restore."""
    ids = history["ids"]
    with clock_at(history["mid"] + 30 * DAY):
        first = json.loads(run_main("expire", "--repo", repo, "--days", "30", "--apply", "--json").stdout)
    assert first["sources"][0]["anchor"]["name"] == ids["S1"] and first["deleted"] > 0
    for backup_id in (ids["I1"], ids["S1"]):
        manifest = json.loads((_backup_dir(repo, backup_id) / "backup.manifest").read_text())
        (snap,) = [Path(repo) / e["stored"] for e in manifest["files"] if e["kind"] == "snap"]
        damaged = bytearray(snap.read_bytes())
        damaged[len(damaged) // 2] ^= 0x10
        snap.write_bytes(bytes(damaged))
    assert run_main("verify", "--repo", repo).returncode == 1
    assert run_main("policy", "--repo", repo, "--days", "30").returncode == 0
    with clock_at(history["mid"] + 30 * DAY):
        status = json.loads(run_main("status", "--repo", repo, "--json").stdout)
        plan = json.loads(run_main("expire", "--repo", repo, "--json").stdout)
    (source,) = status["sources"]
    assert source["window"]["covered"] is False and source["window"]["anchor"] is None
    assert any(ids["S1"] in p and "is doubted" in p for p in source["problems"]), source["problems"]
    assert plan["sources"][0]["anchor"] is None and plan["sources"][0]["delete"] == []
    # what status said: the start of the window does not restore from F1
    proc = run_main("restore", ids["F1"], tmp_path / "r", "--repo", repo, "--to", f"@{history['mid']:.3f}")
    assert proc.returncode != 0 and "archived log ends" in proc.stderr

"""An incremental stores of the parent's newest xlog, grown since, only the bytes appended: the file is kept as the
parent's pieces plus one of its own, and its whole SHA-256 is carried on from the SHA-256 state recorded with the
parent (walcore/sha256_state.py). Proven on a real Tarantool writing all the time, by restores row by row, `verify
--repo --full`, a copy to a second repository, a damaged piece and a source whose recorded bytes changed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

import tarantool_real as tr
import test_tarantool_live
from conftest import copy_tree, new_repository, require_tarantool, run_main
from test_backup_live import _call_mark
from test_tarantool_live import covers
from walcore import sha256_state
from walcore.backup_common import FINGERPRINT_BYTES
from walcore.repository.manifest import PIECES_FORMAT, BackupManifest, ManifestError, decode_checked, encode_checked
from walcore.tarantool.xlog import read_rows

live = test_tarantool_live.live  # the writing instance on a loopback port (a fixture)


def _ok(proc):
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


def _json(proc) -> dict:
    return json.loads(_ok(proc).stdout)


def _manifest(repo: Path, backup_id: str) -> dict:
    return json.loads(next(repo.rglob(f"{backup_id}/backup.manifest")).read_text())


def _newest_xlog(manifest: dict) -> dict:
    return [f for f in manifest["files"] if f["kind"] == "xlog"][-1]


def _vclock(live) -> dict[int, int]:
    return {int(k): v for k, v in live.eval("return box.info.vclock")[0].items()}


def _backup(live, repo: Path, kind: str) -> dict:
    return _json(run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri, "--type", kind, "--json"))


@require_tarantool
def test_incrementals_of_a_writing_instance_store_only_what_its_xlog_gained(live, tmp_path):
    repo = new_repository(tmp_path / "repo")
    full = _backup(live, repo, "full")
    first = _newest_xlog(_manifest(repo, full["id"]))
    assert first["mutable"] and first["append_state"]["last"][0] == max(0, first["size"] - FINGERPRINT_BYTES)
    _call_mark(live, 900001)
    before = _vclock(live)
    incr = _backup(live, repo, "incremental")
    manifest = _manifest(repo, incr["id"])
    grown = next(f for f in manifest["files"] if f["name"] == first["name"])
    assert manifest["format"] == PIECES_FORMAT
    assert grown["size"] > first["size"] and grown["reference"] is None
    base, own = grown["pieces"]
    assert (base["stored"], base["sha256"], base["size"]) == (first["stored"], first["sha256"], first["size"])
    assert own["stored"] == grown["stored"] and own["size"] == grown["size"] - first["size"]
    assert (repo / own["stored"]).stat().st_size == own["stored_size"]
    assert incr["stored_bytes"] == sum(f["stored_size"] for f in manifest["files"] if f["reference"] is None)

    _call_mark(live, 900002)
    incr2 = _backup(live, repo, "incremental")
    again = next(f for f in _manifest(repo, incr2["id"])["files"] if f["name"] == first["name"])
    assert [p["stored"] for p in again["pieces"][:2]] == [base["stored"], own["stored"]] and len(again["pieces"]) == 3

    for backup_id, markers in ((incr["id"], [900001]), (incr2["id"], [900001, 900002])):
        restored = tmp_path / f"restored-{backup_id}"
        _ok(run_main("restore", backup_id, restored, "--repo", repo))
        dump = tr.dump_data_dir(restored)
        assert all([m, "marker"] in dump["spaces"]["mem"] for m in markers), backup_id
        assert dump["vclock"] == {int(k): v for k, v in _manifest(repo, backup_id)["position"]["vclock"].items()}
    assert covers(dump["vclock"], before)
    xlog = next((tmp_path / f"restored-{incr['id']}").rglob(Path(first["name"]).name))
    assert hashlib.sha256(xlog.read_bytes()).hexdigest() == grown["sha256"]

    report = _json(run_main("verify", "--repo", repo, "--full", "--json"))
    assert report["intact"] and {b["status"] for b in report["backups"]} == {"ok"}

    # a second repository holds the chain, pieces included, and restores it
    second = new_repository(tmp_path / "second")
    copied = _json(run_main("copy", "--from", repo, "--to", second, "--all", "--json"))
    assert set(copied["copied"]) == {full["id"], incr["id"], incr2["id"]}
    _ok(run_main("restore", incr2["id"], tmp_path / "from-copy", "--repo", second))
    assert tr.dump_data_dir(tmp_path / "from-copy")["spaces"] == dump["spaces"]


@require_tarantool
def test_a_damaged_piece_is_named_by_restore_and_verify(live, tmp_path):
    repo = new_repository(tmp_path / "repo")
    full = _backup(live, repo, "full")
    _call_mark(live, 900003)
    incr = _backup(live, repo, "incremental")
    base = _newest_xlog(_manifest(repo, full["id"]))
    obj = repo / base["stored"]
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))

    proc = run_main("restore", incr["id"], tmp_path / "restored", "--repo", repo)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert base["stored"] in proc.stderr
    report = json.loads(run_main("verify", "--repo", repo, "--full", "--json").stdout)
    assert not report["intact"]
    named = {(b["id"], f["code"]) for b in report["backups"] for f in b["findings"]}
    assert (full["id"], "object_damaged") in named  # the piece's own backup names it; the grown file's scan too
    assert any(b["id"] == incr["id"] and b["status"] == "damaged" for b in report["backups"])
    # verifying the incremental alone checks the piece its parent holds too
    alone = json.loads(run_main("verify", "--repo", repo, incr["id"], "--json").stdout)
    assert [f["message"] for b in alone["backups"] for f in b["findings"] if f["code"] == "object_damaged"
            and base["stored"] in f["message"]], alone["backups"]


@require_tarantool
def test_recorded_bytes_changed_at_their_end_are_stored_again_and_judged(live, tmp_path):
    """The fingerprint of the recorded end no longer holds: the xlog is read whole again, and a byte flipped there
    is found by its scan (the incremental refused, nothing committed)."""
    repo = new_repository(tmp_path / "repo")
    full = _backup(live, repo, "full")
    first = _newest_xlog(_manifest(repo, full["id"]))
    source = live.work_dir / first["name"]
    with open(source, "r+b") as f:
        f.seek(first["size"] - 10)
        byte = f.read(1)
        f.seek(first["size"] - 10)
        f.write(bytes([byte[0] ^ 0x40]))
    proc = run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri, "--type", "incremental")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert [b["id"] for b in json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]] \
        == [full["id"]]


@require_tarantool
def test_bytes_changed_before_the_recorded_end_are_not_read_again(live, tmp_path):
    """What the parent stored and verified is what the grown file is restored with: the source is not read there
    again (a byte flipped since, before the fingerprinted end, is not in the restore)."""
    repo = new_repository(tmp_path / "repo")
    deadline = time.monotonic() + 60
    while max(p.stat().st_size for p in live.files("wal/*.xlog")) < FINGERPRINT_BYTES + 8192:
        assert time.monotonic() < deadline, "the instance's xlog did not grow past its fingerprinted end"
        time.sleep(0.1)
    full = _backup(live, repo, "full")
    first = _newest_xlog(_manifest(repo, full["id"]))
    source = live.work_dir / first["name"]
    offset = first["size"] - FINGERPRINT_BYTES - 1000
    with open(source, "r+b") as f:
        f.seek(offset)
        original = f.read(1)
        f.seek(offset)
        f.write(bytes([original[0] ^ 0x40]))
    incr = _backup(live, repo, "incremental")
    restored = tmp_path / "restored"
    _ok(run_main("restore", incr["id"], restored, "--repo", repo))
    with open(next(restored.rglob(Path(first["name"]).name)), "rb") as f:
        f.seek(offset)
        assert f.read(1) == original


def _half_written(crashed_instance, tmp_path: Path) -> tuple[Path, Path, bytes, list[int]]:
    """A copy of the crashed instance whose newest xlog holds its first half of blocks (as a backup finds it while
    the instance writes on); that xlog, its whole bytes and where its blocks begin."""
    work = copy_tree(crashed_instance, tmp_path / "data")
    xlog = max((work / "wal").glob("*.xlog"))
    grown = xlog.read_bytes()
    blocks = sorted({pos for pos, _row in read_rows(xlog)})
    xlog.write_bytes(grown[:blocks[len(blocks) // 2]])
    return work, xlog, grown, blocks


@require_tarantool
def test_a_torn_tail_a_crash_left_in_the_parent_s_newest_xlog_is_damage_as_a_full_finds_it(crashed_instance, tmp_path):
    """The parent's newest xlog grew, then a crash tore its last block and Tarantool went on in a newer xlog: that
    file is sealed, and its torn tail is damage to the incremental as to a full backup (cut, it would be recorded
    shorter than the file, and every later incremental refused as of another history)."""
    work, xlog, grown, blocks = _half_written(crashed_instance, tmp_path)
    repo = new_repository(tmp_path / "repo")
    _ok(run_main("backup", work, "--repo", repo, "--type", "full"))
    xlog.write_bytes(grown + grown[blocks[-1]:blocks[-1] + 40])  # grown since, its last block torn by a crash
    tr.write_more(work, rows=20, snapshot=False, seed=7)  # started again: a newer xlog follows
    full = run_main("backup", work, "--repo", new_repository(tmp_path / "other"), "--type", "full")
    incremental = run_main("backup", work, "--repo", repo, "--type", "incremental")
    for proc in (full, incremental):
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert f"{xlog.name} is damaged: truncated_block" in proc.stderr, proc.stderr


@require_tarantool
@pytest.mark.parametrize("tamper", ["sha256_state", "last"])
def test_an_append_state_not_of_the_recorded_bytes_is_not_carried_on(crashed_instance, tmp_path, tamper):
    """A parent's append_state that does not end in its file's SHA-256 (or a fingerprint that does not hold
    together) — a manifest rewritten with its checksum — is not what the whole file's SHA-256 is carried on from:
    the grown xlog is stored whole, and the incremental restores (carried on, it would be recorded with a SHA-256
    its pieces never make)."""
    work, xlog, grown, _blocks = _half_written(crashed_instance, tmp_path)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", work, "--repo", repo, "--type", "full", "--json"))
    path = next(repo.rglob(f"{full['id']}/backup.manifest"))
    manifest = decode_checked(path.read_bytes(), str(path))
    state = _newest_xlog(manifest)["append_state"]
    if tamper == "sha256_state":
        state["sha256_state"]["h"] = "0" * 8 + state["sha256_state"]["h"][8:]
    else:
        state["last"] = [state["last"][0]]
    for name in (path, path.with_name(path.name + ".copy")):
        name.write_bytes(encode_checked(manifest))
    xlog.write_bytes(grown)
    incr = _json(run_main("backup", work, "--repo", repo, "--type", "incremental", "--json"))
    assert "pieces" not in _newest_xlog(_manifest(repo, incr["id"]))
    _ok(run_main("restore", incr["id"], tmp_path / "restored", "--repo", repo))
    assert next((tmp_path / "restored").rglob(xlog.name)).read_bytes() == grown


@require_tarantool
def test_a_piece_that_is_no_object_of_the_parent_chain_is_named_by_verify(crashed_instance, tmp_path):
    """A manifest rewritten with its checksum whose earlier piece is another object with the same bytes: restore
    reads it, but it is no object of the parent chain (a copy does not carry it, an expiry does not keep it for
    this backup): verify --repo names it."""
    work, xlog, grown, _blocks = _half_written(crashed_instance, tmp_path)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", work, "--repo", repo, "--type", "full", "--json"))
    xlog.write_bytes(grown)
    incr = _json(run_main("backup", work, "--repo", repo, "--type", "incremental", "--json"))
    assert _json(run_main("verify", "--repo", repo, "--json"))["intact"]
    path = next(repo.rglob(f"{incr['id']}/backup.manifest"))
    manifest = decode_checked(path.read_bytes(), str(path))
    piece = _newest_xlog(manifest)["pieces"][0]
    elsewhere = piece["stored"].replace(f"/{full['id']}/", f"/{full['id'][:-1]}S/")
    (repo / elsewhere).parent.mkdir(parents=True)
    (repo / elsewhere).write_bytes((repo / piece["stored"]).read_bytes())
    piece["stored"] = elsewhere
    for name in (path, path.with_name(path.name + ".copy")):
        name.write_bytes(encode_checked(manifest))
    report = json.loads(run_main("verify", "--repo", repo, incr["id"], "--json").stdout)
    assert not report["intact"]
    assert [(f["code"], f["message"]) for b in report["backups"] for f in b["findings"]] == [
        ("piece_outside_chain", f"its piece {elsewhere} is no object of its parent chain")]


def test_a_resumed_sha256_is_hashlib_s_whatever_the_cut():
    assert sha256_state.available(), "libcrypto's SHA256_* are where CI runs: deltas depend on them"
    data = os.urandom(300_000)
    for cut in (0, 1, 55, 63, 64, 65, 127, 128, 4096, 299_999):
        head = sha256_state.ResumableSha256()
        head.update(data[:cut])
        state = json.loads(json.dumps(head.state()))  # as a manifest keeps it
        assert head.hexdigest() == hashlib.sha256(data[:cut]).hexdigest()
        rest = sha256_state.ResumableSha256.resume(state)
        rest.update(memoryview(data)[cut:])
        assert rest.hexdigest() == hashlib.sha256(data).hexdigest(), cut
    good = head.state()
    for bad in ({**good, "tail": good["tail"] + "00"}, {**good, "h": good["h"][:-2]}, {"h": good["h"]}):
        with pytest.raises(sha256_state.StateError):
            sha256_state.ResumableSha256.resume(bad)


def _pieced_manifest() -> dict:
    piece = {"stored": "a.zst", "stored_size": 5, "stored_sha256": "0" * 64, "size": 10, "sha256": "1" * 64}
    entry = {"name": "00000000000000000001.xlog", "kind": "xlog", "size": 30, "sha256": "2" * 64,
             "stored": "b.zst", "stored_size": 7, "stored_sha256": "3" * 64, "reference": None, "mutable": True,
             "range": {}, "verification": {},
             "pieces": [piece, {**piece, "stored": "b.zst", "stored_size": 7, "stored_sha256": "3" * 64, "size": 20}]}
    return {"id": "x", "type": "incremental", "parent": "y", "family": "tarantool", "source": {"instance": "i"},
            "walvault": "0", "started": "", "finished": "", "position": {}, "compression": {}, "files": [entry],
            "checks": {}, "format": PIECES_FORMAT}


def test_a_manifest_s_pieces_must_make_its_file():
    manifest = BackupManifest.from_json(_pieced_manifest())
    assert [p.stored for p in manifest.files[0].objects()] == ["a.zst", "b.zst"]
    assert manifest.to_json()["format"] == PIECES_FORMAT
    short = _pieced_manifest()
    short["files"][0]["size"] = 31
    with pytest.raises(ManifestError, match="do not add up"):
        BackupManifest.from_json(short)
    for field, value in (("stored", "c.zst"), ("stored_sha256", "4" * 64)):  # the last piece is the entry's own
        other = _pieced_manifest()
        other["files"][0][field] = value
        with pytest.raises(ManifestError, match="do not add up"):
            BackupManifest.from_json(other)
    newer = {**_pieced_manifest(), "format": PIECES_FORMAT + 1}
    with pytest.raises(ManifestError, match="newer"):
        BackupManifest.from_json(newer)


@require_tarantool
def test_without_a_resumable_sha256_the_grown_xlog_is_stored_whole(live, tmp_path, monkeypatch):
    """Where libcrypto's SHA256_* cannot be loaded (a Python whose hashlib does not use the system's OpenSSL, say),
    nothing records a SHA-256 state and the grown xlog is stored whole, as before pieces: slower, never wrong."""
    monkeypatch.setattr(sha256_state, "_library", lambda: None)  # the library missing, in this process only
    assert not sha256_state.available()
    repo = new_repository(tmp_path / "repo")
    full = _backup(live, repo, "full")
    first = _newest_xlog(_manifest(repo, full["id"]))
    assert "append_state" not in first
    _call_mark(live, 900004)
    incr = _backup(live, repo, "incremental")
    manifest = _manifest(repo, incr["id"])
    grown = next(f for f in manifest["files"] if f["name"] == first["name"])
    assert "pieces" not in grown and grown["size"] > first["size"] and manifest["format"] < PIECES_FORMAT
    _ok(run_main("restore", incr["id"], tmp_path / "restored", "--repo", repo))
    assert [900004, "marker"] in tr.dump_data_dir(tmp_path / "restored")["spaces"]["mem"]

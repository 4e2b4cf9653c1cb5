"""walvault snapshot and expire on real Tarantool histories, with a controllable clock (--as-of).

One history is built once (archive, backups, a snapshot, more writes between them, a second between phases so
that manifests' times differ) and each test works on its own copy of the repository. What must never happen is
asserted by hashing the repository tree; what must still work is proven by restoring and starting Tarantool.
"""

from __future__ import annotations

import calendar
import json
import shutil
import time
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import (LIMESTONE_FIXTURES, clock_at, new_repository, require_tarantool, run_cli_at, run_main,
                      tree_but_leases,
                      tree_snapshot)
import test_tarantool_live

pytestmark = require_tarantool
live = test_tarantool_live.live  # a writing instance on a loopback port (a fixture)
DAY = 86400


def _json(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _backup(src, repo, *extra) -> str:
    return _json(run_main("backup", src, "--repo", repo, "--json", *extra))["id"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    """A real data dir (two checkpoints, small xlogs) written once: each history starts from a copy of it."""
    return tr.generate_instance(tmp_path_factory.mktemp("generated") / "src", wal_max_size=16384, scale=1,
                                snapshots=2)


@pytest.fixture(scope="module")
def history(generated, tmp_path_factory):
    """F1 (full), more writes with a checkpoint, I1 on F1, S1 (snapshot), [mid], more writes, F2, more writes, I2
    on F2; every sealed file archived along the way. `mid` is a time between S1 and F2."""
    root = tmp_path_factory.mktemp("retention")
    src, repo = root / "src", new_repository(root / "repo")
    shutil.copytree(generated, src)
    ids = {}
    assert run_main("archive", src, "--repo", repo).returncode == 0
    ids["F1"] = _backup(src, repo)
    time.sleep(1.1)
    tr.write_more(src, rows=800, snapshot=True, seed=1)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    ids["I1"] = _backup(src, repo, "--type", "incremental")
    time.sleep(1.1)
    snap = _json(run_main("snapshot", src, "--repo", repo, "--json"))
    ids["S1"] = snap["id"]
    time.sleep(1.1)
    mid = time.time()
    time.sleep(1.1)
    tr.write_more(src, rows=800, snapshot=True, seed=2)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    ids["F2"] = _backup(src, repo)
    time.sleep(1.1)
    tr.write_more(src, rows=400, snapshot=False, seed=3)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    ids["I2"] = _backup(src, repo, "--type", "incremental")
    end = tr.dump_data_dir(src)
    return {"root": root, "src": src, "repo": repo, "ids": ids, "mid": mid, "snapshot": snap, "end": end,
            "done": time.time()}


@pytest.fixture
def repo(history, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(history["repo"], copy)
    return copy


def _expire(repo, *args):
    """walvault expire; an apply judging as of a time still to come runs with its clock moved there (faketime):
    an apply refuses an --as-of later than its clock says."""
    when = _as_of_seconds(args) if "--apply" in args else None
    if when is not None and when > time.clock_gettime(time.CLOCK_REALTIME):
        proc = run_cli_at(when, "expire", "--repo", repo, "--json", *args)
    else:
        proc = run_main("expire", "--repo", repo, "--json", *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _as_of_seconds(args) -> float | None:
    try:
        return calendar.timegm(time.strptime(args[args.index("--as-of") + 1], "%Y-%m-%dT%H:%M:%SZ"))
    except (ValueError, IndexError):
        return None


def _plan(repo, as_of: float, *args) -> dict:
    return _json(_expire(repo, "--days", "30", "--as-of", _iso(as_of), *args))


def _source(result: dict) -> dict:
    (source,) = result["sources"]
    return source


def _backup_ids(repo) -> set[str]:
    return {b["id"] for b in json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]}


def test_snapshot_holds_the_checkpoint_only_and_covers_up_to_its_vclock(history, tmp_path):
    snap = history["snapshot"]
    assert snap["type"] == "snapshot" and snap["id"].endswith("S") and snap["parent"] is None
    repo = history["repo"]
    listed = json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]
    entry = next(b for b in listed if b["id"] == snap["id"])
    assert entry["type"] == "snapshot" and entry["status"] == "ok"
    assert snap["covers"]["vclock"] == snap["position"]["vclock"] and snap["covers"]["time"] > 0
    restored = tmp_path / "r"
    assert run_main("restore", snap["id"], restored, "--repo", repo).returncode == 0
    kinds = {p.suffix for p in restored.rglob("*") if p.is_file()}
    assert ".snap" in kinds and ".xlog" not in kinds and ".vylog" in kinds
    dump = tr.dump_data_dir(restored)
    assert dump["vclock"] == {int(k): v for k, v in snap["position"]["vclock"].items() if v}
    assert len(dump["spaces"]["vin"]) > 0 and len(dump["spaces"]["mem"]) > 0
    # verify --repo checks it like any backup
    report = json.loads(run_main("verify", snap["id"], "--repo", repo, "--json").stdout)
    assert report["intact"]


def test_no_policy_deletes_nothing_and_exits_2(repo, history):
    before = tree_but_leases(repo)
    proc = _expire(repo, "--as-of", _iso(history["done"] + 400 * DAY), "--apply")
    assert proc.returncode == 2 and "no retention policy" in proc.stderr
    assert tree_but_leases(repo) == before


@pytest.mark.parametrize("days", ["0", "-3", "0.5", "abc", "nan", "inf", "1e9", ""])
def test_bad_windows_are_refused(repo, days):
    before = tree_snapshot(repo)
    proc = _expire(repo, "--days", days, "--apply")
    assert proc.returncode == 2 and "--days" in proc.stderr
    proc = run_main("policy", "--repo", repo, "--days", days)
    assert proc.returncode == 2
    assert tree_snapshot(repo) == before


@pytest.mark.parametrize("as_of", ["next tuesday", "@1e30", "@nan"])
def test_a_bad_as_of_is_refused(repo, as_of):
    before = tree_snapshot(repo)
    proc = _expire(repo, "--days", "30", "--as-of", as_of, "--apply")
    assert proc.returncode == 2 and "--as-of" in proc.stderr
    assert tree_snapshot(repo) == before


def test_the_stored_policy_is_used(repo, history):
    assert _json(run_main("policy", "--repo", repo, "--days", "30", "--json"))["policy"]["days"] == 30
    result = _json(_expire(repo, "--as-of", _iso(history["done"] + 31 * DAY)))
    assert result["policy"] == {"days": 30} and result["deleted"] == 0
    assert _source(result)["delete"], "the stored policy found nothing to expire"
    assert _json(_expire(repo, "--days", "400", "--as-of", _iso(history["done"] + 31 * DAY)))["policy"]["days"] == 400


def test_the_plan_alone_writes_nothing(repo, history):
    before = tree_snapshot(repo)
    result = _plan(repo, history["done"] + 31 * DAY)
    assert _source(result)["delete"] and result["deleted"] == 0 and not result["applied"]
    assert tree_snapshot(repo) == before


def test_inside_the_window_everything_is_kept(repo, history):
    before = tree_but_leases(repo)
    result = _plan(repo, history["done"] + 10 * DAY, "--apply")
    source = _source(result)
    assert source["anchor"] is None, "no snapshot is at or before the window's start"
    assert source["delete"] == [] and result["deleted"] == 0
    kept_backups = {Path(k["path"]).name for k in source["keep"] if k["kind"].startswith("backup")}
    assert kept_backups == set(history["ids"].values())
    assert tree_but_leases(repo) == before


def test_an_uncovered_source_keeps_everything_and_is_reported(tmp_path, history):
    repo = new_repository(tmp_path / "repo")
    assert run_main("archive", history["src"], "--repo", repo).returncode == 0  # the archive alone: no snapshot
    before = tree_but_leases(repo)
    result = _plan(repo, history["done"] + 400 * DAY, "--apply")
    source = _source(result)
    assert source["anchor"] is None and source["delete"] == [] and result["deleted"] == 0
    assert all("no verified snapshot" in k["reason"] or "log files only" in k["reason"] for k in source["keep"])
    proc = run_main("expire", "--repo", repo, "--days", "30", "--as-of", _iso(history["done"] + 400 * DAY))
    assert "UNCOVERED" in proc.stdout
    assert tree_but_leases(repo) == before


def _xlog_records(repo: Path) -> dict[str, dict]:
    out = {}
    for record in repo.rglob("archive/**/*.xlog.zst.json"):
        obj = json.loads(record.read_text())
        out[obj["name"]] = obj
    return out


def test_covered_old_files_go_and_the_rest_stays_restorable(repo, history, tmp_path):
    ids = history["ids"]
    records = _xlog_records(repo)
    size_before = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
    result = _plan(repo, history["mid"] + 30 * DAY, "--apply")
    source = _source(result)
    anchor = source["anchor"]
    assert anchor["name"] == ids["S1"], "the newest snapshot at or before the window's start anchors it"
    anchor_vclock = {int(k): v for k, v in anchor["position"]["vclock"].items()}
    deleted = {d["path"] for d in source["delete"]}
    assert result["deleted"] == len(deleted) > 0
    for name, record in records.items():
        end = {int(k): v for k, v in record["range"]["vclock"][1].items()}
        covered = all(v <= anchor_vclock.get(k, 0) for k, v in end.items() if v)
        gone = not (repo / record["stored"]).exists()
        assert gone == covered, (name, end, anchor_vclock)
        assert gone == (not (repo / (record["stored"] + ".json")).exists())
    for d in source["delete"]:
        if d["kind"] == "xlog":
            assert d["covered_by"]["name"] == ids["S1"] and "covered by" in d["reason"]
    # the backups: I1 is the newest before the window (F1 its parent), S1 the anchor, F2 and I2 inside it
    assert _backup_ids(repo) == set(ids.values())
    assert sum(p.stat().st_size for p in repo.rglob("*") if p.is_file()) < size_before
    # every point of the window is still restorable: its start, and the end of the log
    for point, expected in ((f"@{history['mid']:.3f}", None), (None, history["end"])):
        target = tmp_path / f"r{bool(point)}"
        args = ["restore", "latest", target, "--repo", repo] + (["--to", point] if point else [])
        assert run_main(*args).returncode == 0
        dump = tr.dump_data_dir(target)
        if expected:
            assert dump == expected
    # the audit log: one record per deletion, saying why and which snapshot covered it
    audit = sorted((repo / result["audit"]).glob("*.json"))
    assert len(audit) == result["deleted"]
    first = json.loads(audit[0].read_text())
    assert first["covered_by"]["name"] == ids["S1"] and first["reason"] and first["path"] in deleted
    # a second run finds nothing more to do, and writes no audit
    again = _plan(repo, history["mid"] + 30 * DAY, "--apply")
    assert again["deleted"] == 0 and again["audit"] is None


def test_a_backups_parent_chain_is_protected(repo, history):
    ids = history["ids"]
    result = _plan(repo, history["done"] + 31 * DAY, "--apply")
    source = _source(result)
    keep = {Path(k["path"]).name: k["reason"] for k in source["keep"] if k["kind"].startswith("backup")}
    assert keep[ids["I2"]].startswith("the newest backup before the window")
    assert keep[ids["F2"]] == f"in the parent chain of {ids['I2']}"
    assert source["anchor"]["name"] == ids["I2"]
    assert _backup_ids(repo) == {ids["F2"], ids["I2"]}
    assert not any((repo / "tarantool").glob(f"*/backups/{ids['F1']}"))
    restored = Path(str(repo) + "-restored")
    assert run_main("restore", "latest", restored, "--repo", repo).returncode == 0
    assert tr.dump_data_dir(restored) == history["end"]


def test_the_newest_restorable_backup_is_never_deleted(repo, history):
    ids = history["ids"]
    # I2 loses an object: it cannot be restored, so the newest restorable is F2, which stays whatever the window
    (inst,) = [p.name for p in (repo / "tarantool").iterdir()]
    victim = next((repo / "tarantool" / inst / "backups" / ids["I2"]).rglob("*.zst"))
    victim.unlink()
    result = _plan(repo, history["done"] + 400 * DAY, "--apply")
    keep = {Path(k["path"]).name: k["reason"] for k in _source(result)["keep"] if k["kind"].startswith("backup")}
    assert ids["F2"] in keep
    assert ids["F2"] in _backup_ids(repo)
    restored = Path(str(repo) + "-restored")
    assert run_main("restore", ids["F2"], restored, "--repo", repo).returncode == 0


def test_an_expiry_racing_a_backup_lease_deletes_nothing(repo, history):
    from walcore.repository import Repository

    r = Repository(str(repo))
    (family, instance), = r.sources()
    before = tree_snapshot(repo / family)
    with r.lease(family, instance, "backup"):  # held by this live process: never stale, whatever the clock says
        proc = _expire(repo, "--days", "30", "--as-of", _iso(history["done"] + 31 * DAY), "--apply")
    assert proc.returncode == 1
    source = _source(json.loads(proc.stdout))
    assert "held by backup" in source["stopped"] and source["deleted"] == 0
    assert tree_snapshot(repo / family) == before


def test_a_busy_source_is_reported_and_the_others_expire(repo, history, tmp_path):
    """Two sources in one repository, one of them busy: the other is expired, and the report says both."""
    from walcore.repository import Repository

    ls_src = tmp_path / "ls"
    shutil.copytree(LIMESTONE_FIXTURES / "20-random-small", ls_src)
    for p in [ls_src, *ls_src.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    assert run_main("archive", ls_src, "--repo", repo).returncode == 0
    r = Repository(str(repo))
    (ls_instance,) = [i for f, i in r.sources() if f == "limestone"]
    with r.lease("limestone", ls_instance, "backup"):  # held by this live process: never stale to any clock
        proc = _expire(repo, "--days", "30", "--as-of", _iso(history["done"] + 31 * DAY), "--apply")
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    by_family = {s["family"]: s for s in result["sources"]}
    assert "held by backup" in by_family["limestone"]["stopped"] and by_family["limestone"]["deleted"] == 0
    assert by_family["tarantool"]["deleted"] > 0 and not by_family["tarantool"]["stopped"]
    assert result["deleted"] == by_family["tarantool"]["deleted"] and result["audit"]


def test_a_repository_failing_mid_expiry_is_reported(repo, history):
    from walcore.command.expire import expire
    from walcore.repository import Repository, RepositoryError
    from walcore.repository.storage import Storage

    real = Storage.write_bytes

    def failing(self, name, data):
        if name.endswith(".expired"):
            raise RepositoryError(f"cannot write {name}: Permission denied")
        real(self, name, data)

    Storage.write_bytes = failing
    try:
        with clock_at(history["done"] + 31 * DAY):
            result = expire(Repository(str(repo)), 30, as_of=history["done"] + 31 * DAY, apply=True)
    finally:
        Storage.write_bytes = real
    (source,) = result.sources
    assert "the repository failed" in source.stopped and "may not have happened" in source.stopped
    assert result.audit is not None  # what was deleted before is in the audit log


def test_a_restore_in_progress_blocks_the_source(repo, history):
    from walcore.repository import Repository

    r = Repository(str(repo))
    (family, instance), = r.sources()
    before = tree_snapshot(repo / family)
    with clock_at(history["done"] + 31 * DAY):  # the mark is made on the clock of the expiry, 31 days ahead
        pin = r.restore_pin(family, instance)
        try:
            result = _plan(repo, history["done"] + 31 * DAY, "--apply")
        finally:
            pin.release()
    source = _source(result)
    assert source["blocked"] and "restore" in source["blocked"] and result["deleted"] == 0
    assert tree_snapshot(repo / family) == before
    assert _plan(repo, history["done"] + 31 * DAY, "--apply")["deleted"] > 0, "the mark was released"


def test_an_unreadable_manifest_stops_the_expiry(repo, history):
    ids = history["ids"]
    (inst,) = [p.name for p in (repo / "tarantool").iterdir()]
    for name in ("backup.manifest", "backup.manifest.copy"):
        path = repo / "tarantool" / inst / "backups" / ids["F1"] / name
        path.write_bytes(path.read_bytes().replace(b'"full"', b'"fuII"'))
    before = tree_but_leases(repo)
    proc = _expire(repo, "--days", "30", "--as-of", _iso(history["done"] + 31 * DAY), "--apply")
    assert proc.returncode == 1 and ids["F1"] in proc.stderr and "not garbage" in proc.stderr
    assert tree_but_leases(repo) == before


@pytest.mark.parametrize("crash_at", [4, 40])
def test_a_crash_in_the_middle_is_finished_by_the_next_run(repo, history, tmp_path, crash_at):
    """Kill the expiry after a few removals (in-process: the storage's remove raises) — inside a backup's deletion,
    or inside the archive's — then run it again."""
    from walcore.command.expire import expire
    from walcore.repository import Repository
    from walcore.repository.storage import Storage

    r = Repository(str(repo))
    calls = {"n": 0}
    real_remove = Storage.remove

    def dying_remove(self, name):
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise KeyboardInterrupt
        real_remove(self, name)

    Storage.remove = dying_remove
    try:
        with pytest.raises(KeyboardInterrupt), clock_at(history["done"] + 31 * DAY):
            expire(r, 30, as_of=history["done"] + 31 * DAY, apply=True)
    finally:
        Storage.remove = real_remove
    # what the crash left: a backup without its manifest is no backup; every kept one still restores
    result = _plan(repo, history["done"] + 31 * DAY, "--apply")
    assert result["deleted"] > 0 and not _source(result)["stopped"]
    ids = history["ids"]
    assert _backup_ids(repo) == {ids["F2"], ids["I2"]}
    # a directory the crash left without its manifest is fenced (the fence alone stays a week): no backup
    assert not [p for p in (repo / "tarantool").glob("*/backups/*") if p.name not in (ids["F2"], ids["I2"])
                and [q.name for q in p.rglob("*") if q.is_file()] != ["backup.manifest"]]
    report = json.loads(run_main("verify", "--repo", repo, "--json").stdout)
    assert report["intact"], report
    orphans = [p for p in repo.rglob("archive/**/*.zst") if not Path(str(p) + ".json").exists()]
    assert not orphans, "the next run finishes what the crash left"
    clean = tmp_path / "clean"
    shutil.copytree(history["repo"], clean)
    _plan(clean, history["done"] + 31 * DAY, "--apply")
    assert sorted(p.relative_to(clean).as_posix() for p in clean.rglob("*.zst")) == \
        sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*.zst")), "the same as an uninterrupted expiry"
    for backup_id in (ids["F2"], ids["I2"]):
        assert run_main("restore", backup_id, tmp_path / backup_id, "--repo", repo).returncode == 0
    assert tr.dump_data_dir(tmp_path / ids["I2"]) == history["end"]


def test_every_deletion_rechecks_its_conditions(repo, history):
    """A record that changed between the plan and the deletion stops the source's expiry there."""
    from walcore.command.expire import _apply, plan_source
    from walcore.repository import Repository

    r = Repository(str(repo))
    (family, instance), = r.sources()
    now = time.time()
    plan = plan_source(r, family, instance, (now - history["done"]) / DAY - 1, 0, now)  # the window from done + 1 day
    archived = [i for i in plan.delete if i.record is not None]
    assert archived
    target = archived[0]
    (repo / target.record).write_bytes((repo / target.record).read_bytes() + b" ")
    before = tree_snapshot(repo / family)
    with r.lease(family, instance, "expire") as lease:
        _apply(r, plan, (lease,), "20990101-000000-test0000", [0], {"days": 30})
    assert plan.stopped and target.record in plan.stopped
    assert (repo / target.path).exists() and (repo / target.record).exists()
    after = tree_snapshot(repo / family)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert all(("backups" in k) for k in changed if not k.endswith(".lease")), \
        "only backups (ordered before the archive) could go before the changed record stopped it"


def test_expire_over_s3_matches_a_local_path(history, s3_endpoint, tmp_path):
    import s3fs

    bucket = f"walvault-expire-{time.time_ns()}"
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint)
    fs.mkdir(bucket)
    fs.put(str(history["repo"]) + "/", f"{bucket}/repo/", recursive=True)
    args = ["--repo-option", f"endpoint_url={s3_endpoint}"]
    s3 = _plan(f"s3://{bucket}/repo", history["mid"] + 30 * DAY, "--apply", *args)
    local_repo = tmp_path / "repo"
    shutil.copytree(history["repo"], local_repo)
    local = _plan(local_repo, history["mid"] + 30 * DAY, "--apply")
    assert s3["deleted"] == local["deleted"] > 0
    assert [d["path"] for d in _source(s3)["delete"]] == [d["path"] for d in _source(local)["delete"]]
    assert run_main("restore", "latest", tmp_path / "r", "--repo", f"s3://{bucket}/repo", *args).returncode == 0
    assert tr.dump_data_dir(tmp_path / "r") == history["end"]


def test_end_to_end_archive_snapshot_expire_then_restore_in_tarantool(generated, tmp_path):
    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    shutil.copytree(generated, src)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    snap = _json(run_main("snapshot", src, "--repo", repo, "--json"))
    tr.write_more(src, rows=1500, snapshot=True, seed=7)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    full = _backup(src, repo)
    tr.write_more(src, rows=500, snapshot=False, seed=8)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    newest = _backup(src, repo, "--type", "incremental")
    expected = tr.dump_data_dir(src)
    size = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file())
    result = _plan(repo, time.time() + 31 * DAY, "--apply")
    source = _source(result)
    assert source["anchor"]["name"] == newest and result["deleted"] > 0
    assert snap["id"] in {Path(d["path"]).name for d in source["delete"]}, "the older snapshot expired"
    assert sum(p.stat().st_size for p in repo.rglob("*") if p.is_file()) < size, "the repository shrank"
    assert _backup_ids(repo) == {full, newest}
    assert json.loads(run_main("verify", "--repo", repo, "--json").stdout)["intact"]
    # the source still holds old xlogs: archiving again does not undo the expiry
    shrunk = tree_but_leases(repo)
    again = _json(run_main("archive", src, "--repo", repo, "--json"))
    deleted = {Path(d["path"]).name.removesuffix(".zst") for d in source["delete"] if d["kind"] in ("xlog", "snap")}
    still_there = {p.name for p in src.rglob("*") if p.suffix in (".xlog", ".snap")} & deleted
    assert any(n.endswith(".xlog") for n in still_there)
    assert {Path(p).name for p in again["expired"]} == still_there and again["stored"] == []
    assert tree_but_leases(repo) == shrunk
    restored = tmp_path / "restored"
    assert run_main("restore", "latest", restored, "--repo", repo).returncode == 0
    dump = tr.dump_data_dir(restored)
    assert dump == expected, "every row of every space, and the vclock"


def test_snapshot_of_a_running_instance_takes_a_checkpoint_first(live, tmp_path):
    before = {int(k): v for k, v in live.eval("return box.info.vclock")[0].items()}
    snaps = set((live.work_dir).rglob("*.snap"))
    repo = new_repository(tmp_path / "repo")
    result = _json(run_main("snapshot", live.work_dir, "--repo", repo, "--connect", live.uri, "--json"))
    assert test_tarantool_live.PASSWORD not in json.dumps(result)
    assert set(live.work_dir.rglob("*.snap")) - snaps, "box.snapshot() made a new checkpoint"
    assert not live.backup_pinned(), "box.backup.stop() was not called"
    position = {int(k): v for k, v in result["position"]["vclock"].items()}
    assert all(position.get(k, 0) >= v for k, v in before.items()), "the snapshot covers what was written before"
    restored = tmp_path / "restored"
    assert run_main("restore", result["id"], restored, "--repo", repo).returncode == 0
    assert tr.dump_data_dir(restored)["vclock"] == {k: v for k, v in position.items() if v}


def test_a_damaged_anchor_confirms_nothing(repo, history):
    """Coverage is confirmed on the anchor's stored bytes: one flipped byte in them and nothing is deleted."""
    ids = history["ids"]
    obj = next(next(repo.glob(f"tarantool/*/backups/{ids['S1']}")).rglob("*.snap.zst"))
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x40
    obj.write_bytes(bytes(data))
    before = tree_but_leases(repo)
    proc = _expire(repo, "--days", "30", "--as-of", _iso(history["mid"] + 30 * DAY), "--apply")
    assert proc.returncode == 1
    source = _source(json.loads(proc.stdout))
    assert source["anchor"]["name"] == ids["S1"] and "not intact" in source["stopped"] and source["deleted"] == 0
    assert tree_but_leases(repo) == before


def test_another_history_under_an_expired_name_is_a_conflict_and_stops_expiry(generated, tmp_path):
    """A copy of the data dir that wrote on (a restore started again): its newest xlog takes the name of one
    retention deleted, with other bytes. It is kept as a conflict, and nothing of the archive expires while two
    histories share the instance (a vclock no longer says which one a file belongs to)."""
    src, fork, repo = tmp_path / "src", tmp_path / "fork", new_repository(tmp_path / "repo")
    shutil.copytree(generated, src)
    shutil.copytree(src, fork)
    tr.write_more(src, rows=800, snapshot=True, seed=1)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    _json(run_main("snapshot", src, "--repo", repo, "--json"))
    _backup(src, repo)
    expired = _plan(repo, time.time() + 31 * DAY, "--apply")
    assert expired["deleted"] > 0
    tr.write_more(fork, rows=300, snapshot=False, seed=2)
    proc = run_main("archive", fork, "--repo", repo, "--json")
    result = json.loads(proc.stdout)
    assert proc.returncode == 1 and result["conflicts"], "the other history's bytes under an expired name"
    for conflict in result["conflicts"]:
        assert ".conflict-" in conflict["kept_as"]
    source = _source(_plan(repo, time.time() + 31 * DAY))
    assert not [d for d in source["delete"] if "/archive/" in d["path"]]
    assert any("two histories" in k["reason"] for k in source["keep"])

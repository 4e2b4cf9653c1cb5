"""`walvault copy`: backups with their parent chains and the archive copied into a second repository.

A real Tarantool's data dir is backed up (a full, then an incremental) and archived into a local repository; copied
to a bucket of moto's S3 server and from there to another local directory, each copy killed (SIGKILL) at random
points and run again until it finishes. After every kill the destination lists no backup that differs from its
source's; at the end both copies verify (`verify --repo`) and restore row by row to what the source held (the dump
Tarantool reads back), as the backup tests compare.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time

import pytest

import tarantool_real as tr
from conftest import REPO, copy_limestone_fixture, new_repository, require_limestone, require_tarantool, run_main, \
    walvault_command

pytestmark = require_tarantool


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> dict:
    """A local repository holding a full backup (moment A), an incremental on it (moment B) and the archive of the
    data dir, with the dumps of both moments."""
    root = tmp_path_factory.mktemp("copy-source")
    src = root / "src"
    tr.generate_instance(src, wal_max_size=16384, scale=2, snapshots=2)
    dump_a = tr.dump_data_dir(src)
    repo = new_repository(root / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    tr.write_more(src, rows=3000, snapshot=True, seed=1)
    dump_b = tr.dump_data_dir(src)
    incr = _json(run_main("backup", src, "--repo", repo, "--type", "incremental", "--json"))
    assert run_main("archive", src, "--repo", repo).returncode == 0
    return {"repo": repo, "full": full["id"], "incr": incr["id"], "dump_a": dump_a, "dump_b": dump_b}


def _manifests(url: str, options: dict | None = None) -> dict:
    from walcore.repository import Repository

    repo = Repository(url, options or {})
    return {r.id: r.manifest.to_json() for r in repo.backups() if r.manifest is not None}


KILLS = 6  # killed runs at most in each direction, before one is left to finish


def _copy_killed_until_done(args: list[str], check, seed: int) -> int:
    """Run `walvault copy ARGS` killed by SIGKILL after a random delay, again and again, `check()` after each kill,
    until a run finishes; the delays grow, and past KILLS runs the copy is left to finish (on a loaded machine a
    whole run may outlast every delay). Returns how many runs were killed."""
    rng = random.Random(seed)
    killed = 0
    for attempt in range(KILLS + 1):
        proc = subprocess.Popen([*walvault_command(), "copy", *args], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=rng.uniform(0.3, 1.0 + attempt * 0.3) if attempt < KILLS else 600)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            killed += 1
            check()
            continue
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        return killed
    raise AssertionError("the copy never finished")


def _restored(args: list[str], backup: str, target) -> dict:
    result = _json(run_main("restore", backup, target, *args, "--json"))
    assert result["backup"] == backup
    return tr.dump_data_dir(target)


def test_copy_to_s3_and_back_killed_at_random_points_verifies_and_restores(source, s3_endpoint, tmp_path):
    import s3fs

    bucket = f"walvault-copy-{time.monotonic_ns()}"
    s3fs.S3FileSystem(endpoint_url=s3_endpoint).mkdir(bucket)
    s3_url, s3_options = f"s3://{bucket}/repo", {"endpoint_url": s3_endpoint}
    new_repository(s3_url, s3_options)
    s3_cli = ["--repo", s3_url, "--repo-option", f"endpoint_url={s3_endpoint}"]
    local = new_repository(tmp_path / "second")
    expected = _manifests(str(source["repo"]))

    def only_whole_backups(url: str, options: dict | None = None):
        def check():  # what the destination lists as a backup is the source's, whole
            held = _manifests(url, options)
            assert all(held[i] == expected[i] for i in held), "a backup differs from its source's"
        return check

    killed = _copy_killed_until_done(["--all", "--archive", "--from", str(source["repo"]), "--to", s3_url,
                                      "--to-option", f"endpoint_url={s3_endpoint}"],
                                     only_whole_backups(s3_url, s3_options), seed=1)
    killed += _copy_killed_until_done(["--all", "--archive", "--from", s3_url, "--from-option",
                                       f"endpoint_url={s3_endpoint}", "--to", str(local)],
                                      only_whole_backups(str(local)), seed=2)
    assert killed >= 2, "no copy was interrupted"
    assert _manifests(s3_url, s3_options) == expected == _manifests(str(local))

    # run again: nothing left to copy, nothing read twice
    again = _json(run_main("copy", "--all", "--archive", "--from", source["repo"], "--to", s3_url, "--to-option",
                           f"endpoint_url={s3_endpoint}", "--json"))
    assert (again["copied"], again["objects"], again["archive_copied"]) == ([], 0, 0)
    assert sorted(again["already"]) == sorted(expected) and again["archive_already"] > 0

    for args in (s3_cli, ["--repo", local]):
        report = _json(run_main("verify", *args, "--json"))
        assert report["intact"] is True and len(report["backups"]) == 2
        assert report["archive"] and {a["status"] for a in report["archive"]} == {"ok"}
        assert not any(a["findings"] for a in report["archive"])
        assert run_main("verify", *args).returncode == 0
    for name, args in (("s3", s3_cli), ("local", ["--repo", local])):
        restored_b = _restored(args, source["incr"], tmp_path / f"{name}-b")
        assert (restored_b["vclock"], restored_b["spaces"]) == (source["dump_b"]["vclock"],
                                                                source["dump_b"]["spaces"])
    restored_a = _restored(["--repo", local], source["full"], tmp_path / "local-a")
    assert (restored_a["vclock"], restored_a["spaces"]) == (source["dump_a"]["vclock"], source["dump_a"]["spaces"])

    # where copies exist: each repository says where its backups were copied
    listed = _json(run_main("backups", "--repo", source["repo"], "--json"))["backups"]
    assert all([c["to"] for c in b["copies"]] == [s3_url] for b in listed)
    listed = _json(run_main("backups", *s3_cli, "--json"))["backups"]
    assert all([c["to"] for c in b["copies"]] == [str(local.resolve())] for b in listed)
    assert "copied to " + s3_url in run_main("backups", "--repo", source["repo"]).stdout


def test_a_backup_is_copied_with_its_parent_chain_and_again_copies_nothing(source, tmp_path):
    second = new_repository(tmp_path / "second")
    result = _json(run_main("copy", source["incr"], "--from", source["repo"], "--to", second, "--json"))
    assert result["copied"] == [source["full"], source["incr"]], "parents first"
    assert result["archive_copied"] == 0, "the archive only with --archive"
    again = _json(run_main("copy", source["incr"], "--from", source["repo"], "--to", second, "--json"))
    assert (again["copied"], again["already"], again["objects"]) == ([], [source["full"], source["incr"]], 0)


def test_other_bytes_at_the_destination_are_never_overwritten(source, tmp_path):
    from walcore.repository import Repository

    second = new_repository(tmp_path / "second")
    full = Repository(str(source["repo"])).find(source["full"]).manifest
    taken = full.files[0].stored
    (second / taken).parent.mkdir(parents=True)
    (second / taken).write_bytes(b"other bytes")
    proc = run_main("copy", source["incr"], "--from", source["repo"], "--to", second, "--json")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["copied"] == [] and result["ok"] is False
    assert [(f["backup"], f["code"]) for f in result["findings"]] == [(source["full"], "object_not_copied"),
                                                                      (source["incr"], "parent_not_copied")]
    assert "not overwritten" in result["findings"][0]["message"]
    assert (second / taken).read_bytes() == b"other bytes"
    assert _manifests(str(second)) == {}, "nothing committed"


def _with_a_damaged_object(source, tmp_path):
    """A copy of the source repository with one object of the incremental's own damaged: (its root, that entry)."""
    from walcore.repository import Repository

    damaged = tmp_path / "damaged"
    shutil.copytree(source["repo"], damaged)
    incr = Repository(str(damaged)).find(source["incr"]).manifest
    own = next(e for e in incr.files if e.reference is None)
    data = bytearray((damaged / own.stored).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / own.stored).write_bytes(bytes(data))
    return damaged, own


def test_a_damaged_source_object_is_not_copied(source, tmp_path):
    damaged, own = _with_a_damaged_object(source, tmp_path)
    second = new_repository(tmp_path / "second")
    proc = run_main("copy", "--all", "--from", damaged, "--to", second, "--json")
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["copied"] == [source["full"]]
    assert [f["code"] for f in result["findings"]] == ["object_not_copied"]
    assert "do not match their SHA-256" in result["findings"][0]["message"]
    assert not (second / own.stored).exists(), "the damaged bytes were removed"
    assert set(_manifests(str(second))) == {source["full"]}
    assert run_main("verify", "--repo", second).returncode == 0


def test_a_source_object_that_is_gone_is_a_finding_not_a_failed_write(source, tmp_path):
    from walcore.repository import Repository

    gone = tmp_path / "gone"
    shutil.copytree(source["repo"], gone)
    full = Repository(str(gone)).find(source["full"]).manifest
    (gone / full.files[0].stored).unlink()
    second = new_repository(tmp_path / "second")
    proc = run_main("copy", source["full"], "--from", gone, "--to", second, "--json")
    assert proc.returncode == 1, proc.stderr
    (finding,) = json.loads(proc.stdout)["findings"]
    assert finding["code"] == "object_not_copied" and f"missing in {gone}" in finding["message"]
    assert _manifests(str(second)) == {}


def test_the_destination_lease_is_held_while_copying(source, tmp_path):
    from walcore.repository import Repository

    second = new_repository(tmp_path / "second")
    full = Repository(str(source["repo"])).find(source["full"]).manifest
    with Repository(str(second)).lease(full.family, full.instance, "backup"):
        proc = run_main("copy", "--all", "--from", source["repo"], "--to", second)
    assert proc.returncode == 1 and "is held by backup" in proc.stderr
    assert _manifests(str(second)) == {}


@pytest.mark.parametrize("args, message", [
    ([], "copy needs BACKUP ids (or latest) or --all"),
    (["latest", "--all"], "not both"),
    (["nonsense"], "is not a backup id"),
    (["--all", "--wait", "-1"], "--wait"),
])
def test_bad_input_exits_2_and_writes_nothing(source, tmp_path, args, message):
    second = new_repository(tmp_path / "second")
    before = sorted(p.relative_to(second) for p in second.rglob("*"))
    proc = run_main("copy", *args, "--from", source["repo"], "--to", second)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.relative_to(second) for p in second.rglob("*")) == before


def test_a_destination_walvault_init_did_not_make_or_the_source_itself_is_refused(source, tmp_path):
    missing = tmp_path / "not-a-repository"
    proc = run_main("copy", "--all", "--from", source["repo"], "--to", missing)
    assert proc.returncode == 2 and "walvault init" in proc.stderr and not missing.exists()
    proc = run_main("copy", "--all", "--from", source["repo"], "--to", f"{source['repo']}/")
    assert proc.returncode == 2 and "same repository" in proc.stderr
    proc = run_main("copy", "20200101-000000F", "--from", source["repo"], "--to", new_repository(tmp_path / "b"))
    assert proc.returncode == 2 and "no backup 20200101-000000F" in proc.stderr


@require_limestone
def test_a_limestone_archive_is_copied_whole_and_restores_to_its_end_alike(tmp_path):
    """--archive copies every archived file with its record, then how far the archive is whole
    (archive-complete.json): `restore --to end` from the copy gives what it gives from the source."""
    ls = copy_limestone_fixture("20-random-small", tmp_path)
    repo, second = new_repository(tmp_path / "repo"), new_repository(tmp_path / "second")
    assert run_main("rotate", ls).returncode == 0
    backup = _json(run_main("backup", ls, "--repo", repo, "--json"))
    assert run_main("archive", ls, "--repo", repo).returncode == 0
    result = _json(run_main("copy", "--all", "--archive", "--from", repo, "--to", second, "--json"))
    assert result["copied"] == [backup["id"]] and result["archive_copied"] > 0
    complete = next(repo.glob("limestone/*/archive-complete.json"))
    assert (second / complete.relative_to(repo)).read_bytes() == complete.read_bytes()
    assert run_main("verify", "--repo", second).returncode == 0
    for where, name in ((repo, "from-first"), (second, "from-second")):
        assert run_main("restore", backup["id"], tmp_path / name, "--repo", where, "--to", "end").returncode == 0
    first, copied = tmp_path / "from-first", tmp_path / "from-second"
    assert {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()} == \
        {p.relative_to(copied): p.read_bytes() for p in copied.rglob("*") if p.is_file()}


def test_copies_between_plain_and_encrypted_repositories_restore_alike(source, tmp_path, monkeypatch):
    """A plain repository copied into an encrypted one (its key given as --to-key-file), and that one into another
    encrypted under another key (--key-file opens the source, --to-key-file seals the destination): each restores
    what the source does, and the encrypted destinations hold none of the source's bytes in clear."""
    for env in ("WALVAULT_KEY", "WALVAULT_TO_KEY"):
        monkeypatch.setenv(env, "")  # the --key-file options set them in this process: undone after the test
    keys = {}
    for name in ("first", "second"):
        keys[name] = tmp_path / f"{name}.key"
        keys[name].write_text(f"a passphrase for the {name} copy\n")
        assert run_main("init", "--repo", tmp_path / name, "--encrypt", "--key-file", keys[name]).returncode == 0
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    copied = _json(run_main("copy", source["incr"], "--from", source["repo"], "--to", first, "--to-key-file",
                            keys["first"], "--json"))
    assert copied["copied"] == [source["full"], source["incr"]]
    again = _json(run_main("copy", source["incr"], "--from", first, "--key-file", keys["first"], "--to", second,
                           "--to-key-file", keys["second"], "--json"))
    assert again["copied"] == [source["full"], source["incr"]]
    stored = [p for p in (source["repo"]).rglob("*.zst") if p.stat().st_size > 64]
    for repo, key in ((first, keys["first"]), (second, keys["second"])):
        held = b"".join(p.read_bytes() for p in (tmp_path / repo).rglob("*") if p.is_file())
        assert not any(p.read_bytes()[:64] in held for p in stored), f"{repo} holds bytes of the source in clear"
        monkeypatch.setenv("WALVAULT_KEY", key.read_text().strip())
        assert _restored(["--repo", repo], source["incr"], tmp_path / f"restored-{key.stem}") == source["dump_b"]
    monkeypatch.setenv("WALVAULT_KEY", keys["first"].read_text().strip())
    assert run_main("verify", "--repo", second).returncode == 2, "the second copy's key is another"


def test_a_damaged_source_object_is_never_left_locked_at_a_locked_destination(source, s3_endpoint, tmp_path):
    """Into a repository with Object Lock, damaged bytes once written could not be removed for the lock's days: the
    copy checks the source object's SHA-256 before it writes anything, and the finding is the source's damage."""
    import boto3

    damaged, own = _with_a_damaged_object(source, tmp_path)
    bucket = f"walvault-copy-lock-{time.time_ns()}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    to = ["--to", f"s3://{bucket}/repo", "--to-option", f"endpoint_url={s3_endpoint}"]
    assert run_main("init", "--repo", f"s3://{bucket}/repo", "--repo-option", f"endpoint_url={s3_endpoint}",
                    "--lock-days", "1").returncode == 0
    proc = run_main("copy", "--all", "--from", damaged, *to, "--json")
    assert "Traceback" not in proc.stderr and proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["copied"] == [source["full"]]
    assert [f["code"] for f in result["findings"]] == ["object_not_copied"]
    assert "do not match their SHA-256" in result["findings"][0]["message"]
    versions = client.list_object_versions(Bucket=bucket)
    keys = {v["Key"] for v in versions.get("Versions", []) + versions.get("DeleteMarkers", [])}
    assert f"repo/{own.stored}" not in keys, "no damaged version (nor a delete marker) at the destination"


def test_a_copy_killed_between_its_commit_and_its_record_is_recorded_by_the_next_run(source, tmp_path):
    """The destination committed the backup, the source's copies.json was never written (the copy killed in
    between): the next run finds the backup there already and records it."""
    second = new_repository(tmp_path / "second")
    assert run_main("copy", source["full"], "--from", source["repo"], "--to", second).returncode == 0
    records = list(source["repo"].glob(f"*/*/backups/{source['full']}/copies.json"))
    assert records
    for record in records:
        record.unlink()
    again = _json(run_main("copy", source["full"], "--from", source["repo"], "--to", second, "--json"))
    assert again["already"] == [source["full"]]
    listed = {b["id"]: b for b in _json(run_main("backups", "--repo", source["repo"], "--json"))["backups"]}
    assert str((tmp_path / "second").resolve()) in [c["to"] for c in listed[source["full"]]["copies"]]

"""S3 Object Lock (walvault init --lock-days): immutable objects written retained, mutable ones never, and expire
planning around the locks, on moto's S3 server with a lock-enabled bucket (moto enforces the locks).

The history is a copy of a real Tarantool data dir of the shared fixtures (its rows are days old): archived and
backed up twice, so that an expiry with a one-day window would delete the older backup and the archived files the
newer one covers, were they not locked.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import TARANTOOL_FIXTURES, copy_tree, run_cli_at, run_main
from walcore.repository import Repository, is_immutable
from walcore.repository.storage import ObjectLocked

DAY = 86400


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint)


_buckets = iter(range(1_000_000))


def _bucket(endpoint: str, *, lock: bool) -> str:
    name = f"walvault-lock-{os.getpid()}-{next(_buckets)}"  # a valid DNS name: moto refuses others with a lock
    _client(endpoint).create_bucket(Bucket=name, ObjectLockEnabledForBucket=lock)
    return name


def _cli(bucket: str, endpoint: str) -> list[str]:
    return ["--repo", f"s3://{bucket}/repo", "--repo-option", f"endpoint_url={endpoint}"]


def _json(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _objects(endpoint: str, bucket: str) -> dict[str, dict]:
    """Every current object of the bucket and its head (its lock), by key."""
    client = _client(endpoint)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    return {k: client.head_object(Bucket=bucket, Key=k) for k in keys}


def _hidden(endpoint: str, bucket: str) -> list[str]:
    """The immutable objects a delete marker hides (a lease released leaves one: it is no locked object)."""
    markers = _client(endpoint).list_object_versions(Bucket=bucket).get("DeleteMarkers", [])
    return [m["Key"] for m in markers if is_immutable(m["Key"].removeprefix("repo/"))]


@pytest.fixture
def locked_history(s3_endpoint, tmp_path):
    """A repository locked one day on a lock-enabled bucket: the fixture data dir archived, backed up (F1),
    backed up again (F2)."""
    bucket = _bucket(s3_endpoint, lock=True)
    repo = _cli(bucket, s3_endpoint)
    assert _json(run_main("init", *repo, "--lock-days", "1", "--json"))["lock"] == {"mode": "governance", "days": 1}
    src = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "src")
    assert run_main("archive", src, *repo).returncode == 0
    ids = [_json(run_main("backup", src, *repo, "--json"))["id"]]
    time.sleep(1.1)  # backup ids are by the second
    ids.append(_json(run_main("backup", src, *repo, "--json"))["id"])
    return {"bucket": bucket, "repo": repo, "ids": ids, "src": src}


# -- init


def test_lock_days_on_storage_without_object_lock_is_refused_and_makes_nothing(s3_endpoint, tmp_path):
    local = tmp_path / "repo"
    proc = run_main("init", "--repo", local, "--lock-days", "3")
    assert proc.returncode == 2 and "Object Lock" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert not local.exists()
    plain = _bucket(s3_endpoint, lock=False)
    proc = run_main("init", *_cli(plain, s3_endpoint), "--lock-days", "3")
    assert proc.returncode == 2 and "Object Lock" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert "Contents" not in _client(s3_endpoint).list_objects_v2(Bucket=plain)


@pytest.mark.parametrize("args", [["--lock-days", "0"], ["--lock-days", "36501"], ["--lock-days", "x"],
                                  ["--lock-mode", "compliance"], ["--lock-days", "2", "--lock-mode", "legal"]])
def test_bad_lock_options_are_refused(tmp_path, args):
    proc = run_main("init", "--repo", tmp_path / "repo", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert not (tmp_path / "repo").exists()


def test_init_keeps_the_lock_in_the_repository_settings(s3_endpoint):
    bucket = _bucket(s3_endpoint, lock=True)
    repo = _cli(bucket, s3_endpoint)
    made = run_main("init", *repo, "--lock-days", "7", "--lock-mode", "compliance")
    assert made.returncode == 0 and "locked 7 days (compliance)" in made.stdout
    info = json.loads(_client(s3_endpoint).get_object(Bucket=bucket, Key="repo/walvault.repo")["Body"].read())
    assert info["lock"] == {"mode": "compliance", "days": 7}
    assert _json(run_main("init", *repo, "--json"))["lock"] == {"mode": "compliance", "days": 7}  # as it was
    other = run_main("init", *repo, "--lock-days", "3")
    assert other.returncode == 2 and "changes no repository's settings" in other.stderr
    assert len(other.stderr.splitlines()) == 1


# -- writes


def test_immutable_objects_are_written_locked_and_mutable_ones_never(locked_history, s3_endpoint):
    written = time.time()
    objects = _objects(s3_endpoint, locked_history["bucket"])
    kinds = {"backup object": False, "manifest": False, "archived file": False, "archive record": False}
    for key, head in objects.items():
        name = key.removeprefix("repo/")
        if is_immutable(name):
            assert head.get("ObjectLockMode") == "GOVERNANCE", name
            assert abs(head["ObjectLockRetainUntilDate"].timestamp() - (written + DAY)) < 600, name
            kinds["manifest" if "backup.manifest" in name else "backup object" if "/backups/" in name
                  else "archive record" if name.endswith(".json") else "archived file"] = True
        else:
            assert "ObjectLockMode" not in head and "ObjectLockRetainUntilDate" not in head, name
    assert all(kinds.values()), kinds
    mutable = [k for k in objects if not is_immutable(k.removeprefix("repo/"))]
    assert "repo/walvault.repo" in mutable and any("/ledger/" in k for k in mutable)


def test_a_multipart_object_is_locked_too(s3_endpoint):
    bucket = _bucket(s3_endpoint, lock=True)
    url, options = f"s3://{bucket}/repo", {"endpoint_url": s3_endpoint, "default_block_size": 5 << 20}
    repo, _ = Repository.init(url, options, lock_days=2)
    name = "tarantool/i1/backups/20260101-000000F/wal/big.xlog.zst"
    data = os.urandom((5 << 20) * 2 + 1234)
    repo.storage.write(name, [data[:6 << 20], data[6 << 20:]])
    head = _client(s3_endpoint).head_object(Bucket=bucket, Key=f"repo/{name}")
    assert head["ContentLength"] == len(data) and head["ObjectLockMode"] == "GOVERNANCE"
    assert abs(head["ObjectLockRetainUntilDate"].timestamp() - (time.time() + 2 * DAY)) < 600


def test_a_locked_object_is_never_hidden_behind_a_delete_marker(locked_history, s3_endpoint):
    bucket = locked_history["bucket"]
    repo = Repository(f"s3://{bucket}/repo", {"endpoint_url": s3_endpoint})
    name = next(k.removeprefix("repo/") for k in _objects(s3_endpoint, bucket) if k.endswith("backup.manifest"))
    with pytest.raises(ObjectLocked, match="locked until"):
        repo.storage.remove(name)
    prefix = name.rsplit("/", 1)[0]
    assert repo.storage.remove_tree(prefix) == sorted(repo.storage.list(prefix))  # every one of them kept
    assert repo.storage.exists(name) and _hidden(s3_endpoint, bucket) == []


# -- expire


def test_expire_keeps_what_is_locked_whole_and_says_until_when(locked_history, s3_endpoint):
    bucket, repo, (old, new) = locked_history["bucket"], locked_history["repo"], locked_history["ids"]
    before = {k: h["ETag"] for k, h in _objects(s3_endpoint, bucket).items() if is_immutable(k.removeprefix("repo/"))}
    plan = _json(run_main("expire", *repo, "--days", "1", "--json"))
    (source,) = plan["sources"]
    assert source["delete"] == []
    locked = {k["path"].rsplit("/", 1)[-1]: k["reason"] for k in source["keep"] if k["reason"].startswith("locked")}
    assert old in locked and new not in locked  # the newer one is kept anyway: the anchor
    assert any(name.endswith(".xlog.zst") for name in locked)  # archived files the anchor covers
    until = _iso(time.time() + DAY)[:13]  # to the hour: the lock ends a day after the writes
    assert all(reason.startswith(f"locked until {until}") for reason in locked.values()), locked
    text = run_main("expire", *repo, "--days", "1")
    assert text.returncode == 0 and "kept: tarantool/" in text.stdout and f"{old}: locked until {until}" in text.stdout
    # --apply keeps every locked object whole: nothing deleted, none hidden behind a delete marker, exit 0
    applied = _json(run_main("expire", *repo, "--days", "1", "--apply", "--json"))
    assert applied["deleted"] == 0 and not applied["sources"][0]["stopped"]
    after = {k: h["ETag"] for k, h in _objects(s3_endpoint, bucket).items() if is_immutable(k.removeprefix("repo/"))}
    assert after == before and _hidden(s3_endpoint, bucket) == []
    assert {b["id"] for b in _json(run_main("backups", *repo, "--json"))["backups"]} == {old, new}
    # once the locks end, the same backup and files are what the plan deletes
    later = _json(run_main("expire", *repo, "--days", "1", "--as-of", _iso(time.time() + 2 * DAY), "--json"))
    deleted = {d["path"].rsplit("/", 1)[-1] for d in later["sources"][0]["delete"]}
    assert deleted == set(locked), (deleted, set(locked))


def test_a_host_clock_ahead_of_the_store_never_hides_a_locked_object(locked_history, s3_endpoint):
    """An expiry on a host whose clock runs a day and an hour ahead of the store's judges the locks ended: the store
    holds them still, and a plain delete would hide each object behind a delete marker. The version read is what is
    deleted: the store refuses it while it is locked, and nothing is hidden."""
    bucket, repo, (old, new) = locked_history["bucket"], locked_history["repo"], locked_history["ids"]
    before = {k: h["ETag"] for k, h in _objects(s3_endpoint, bucket).items() if is_immutable(k.removeprefix("repo/"))}
    proc = run_cli_at(time.time() + DAY + 3600, "expire", *repo, "--days", "1", "--apply", "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    (source,) = json.loads(proc.stdout)["sources"]
    assert source["stopped"] and "locked" in source["stopped"], source
    assert _hidden(s3_endpoint, bucket) == []
    after = {k: h["ETag"] for k, h in _objects(s3_endpoint, bucket).items() if is_immutable(k.removeprefix("repo/"))}
    assert after == before
    assert {b["id"] for b in _json(run_main("backups", *repo, "--json"))["backups"]} == {old, new}


def test_a_repository_without_a_lock_plans_as_before(s3_endpoint, tmp_path):
    bucket = _bucket(s3_endpoint, lock=True)  # the bucket could lock, the repository does not ask it to
    repo = _cli(bucket, s3_endpoint)
    assert run_main("init", *repo).returncode == 0
    src = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "src")
    assert run_main("archive", src, *repo).returncode == 0
    old = _json(run_main("backup", src, *repo, "--json"))["id"]
    time.sleep(1.1)
    assert run_main("backup", src, *repo).returncode == 0
    assert all("ObjectLockMode" not in h for h in _objects(s3_endpoint, bucket).values())
    applied = _json(run_main("expire", *repo, "--days", "1", "--apply", "--json"))
    assert applied["deleted"] > 0 and old in {d["path"].rsplit("/", 1)[-1] for d in applied["sources"][0]["delete"]}


def test_a_torn_newest_xlog_leaves_no_hidden_locked_version(s3_endpoint, tmp_path):
    """A newest xlog that ends inside a block is cut after its last whole block. Stored before its scan said so,
    then stored again under the same name, it would leave its first, uncut version behind the new one: locked, no
    manifest naming it, and back as the current object once expiry deletes the version it reads."""
    from tarantool_bytes import tear_newest_xlog

    bucket = _bucket(s3_endpoint, lock=True)
    repo = _cli(bucket, s3_endpoint)
    assert run_main("init", *repo, "--lock-days", "1").returncode == 0
    src = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "src")
    name, _whole = tear_newest_xlog(src)
    result = _json(run_main("backup", src, *repo, "--json"))
    assert any(n.startswith(f"{name} ends inside a block") for n in result["notes"]), result["notes"]
    versions = _client(s3_endpoint).list_object_versions(Bucket=bucket).get("Versions", [])
    stored = [v for v in versions if v["Key"].endswith(f"/{result['id']}/{name}.zst")]
    assert len(stored) == 1, [(v["Key"], v["VersionId"], v["IsLatest"]) for v in stored]

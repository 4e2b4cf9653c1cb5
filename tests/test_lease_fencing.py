"""Leases that fence (issue 22, §1): a holder proves its lease before each commit point, a live process on this host
is never broken by age, renewals never overwrite a breaker's lease, leftovers are fenced before they are removed,
and a lease that does not read as one is named, never a traceback or a wait.

Real processes and real storage: `walvault backup`/`archive` subprocesses of a data dir written by real Tarantool,
paused with SIGSTOP, over a local repository and moto's S3 server."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tarantool_real as tr
from conftest import REPO, copy_tree, encrypted_target, require_tarantool, run_main, walvault_command

from walcore.repository.lease import acquire
from walcore.repository.storage import Storage

pytestmark = require_tarantool


@pytest.fixture
def src(real_instance, tmp_path) -> Path:
    return copy_tree(real_instance, tmp_path / "src")


@pytest.fixture
def repo_target(repo_target, encryption, monkeypatch):
    """Every lease test on a plain repository and on an encrypted one: the encryption layer keeps leases
    conditional (read, open, change, seal, conditional replace)."""
    return encrypted_target(repo_target, monkeypatch) if encryption == "encrypted" else repo_target


def _storage(target) -> Storage:
    storage = target.storage()
    if not storage.caps.consistent_listing:
        storage.fs.invalidate_cache()
    return storage


def _lease_name(src: Path, kind: str = "") -> str:
    return f"locks/tarantool-{tr.read_manifest(src)['instance_uuid']}{kind}.lease"


def _start(*args) -> subprocess.Popen:
    """walvault in a process group of its own: SIGSTOP/SIGCONT reach its workers too."""
    return subprocess.Popen([*walvault_command(), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, cwd=REPO, start_new_session=True)


def _wait_for(predicate, proc: subprocess.Popen, step: float, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert proc.poll() is None, f"walvault ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)


def _step(target) -> float:
    return 0.002 if target.kind == "local" else 0.02  # each poll of S3 is a request


def _stored_not_committed(storage: Storage, src: Path) -> str | None:
    """The id of a backup that has stored an object and has no manifest yet."""
    prefix = f"tarantool/{tr.read_manifest(src)['instance_uuid']}/backups"
    names = storage.list(prefix)
    for backup_id in {n[len(prefix) + 1:].split("/")[0] for n in names}:
        own = [n for n in names if n.startswith(f"{prefix}/{backup_id}/")]
        if own and not any(n.endswith(".manifest") or n.endswith(".manifest.copy") for n in own):
            return backup_id
    return None


def _pause(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGSTOP)


def _resume(proc: subprocess.Popen) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGCONT)
    return proc.communicate(timeout=300)


def _rewrite_lease(storage: Storage, name: str, **fields) -> None:
    info = json.loads(storage.read_bytes(name))
    storage.write_bytes(name, json.dumps({**info, **fields}).encode())


def _last_line(err: str) -> str:
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


def test_a_backup_paused_past_its_lease_on_another_host_is_fenced(src, repo_target, tmp_path):
    """The reproduction: backup A stores objects, is paused (SIGSTOP) before its manifest; a second host sees its
    lease expired and takes it (backup B). B fences A's directory and removes its objects; A, woken, must not commit:
    exit 1 naming the lease, and no backup is listed ok whose objects are missing."""
    repo_target.repository(create=True)
    storage = _storage(repo_target)
    name = _lease_name(src)
    first = _start("backup", src, *repo_target.cli, "--jobs", "1")
    try:
        a_id = _wait_for(lambda: _stored_not_committed(_storage(repo_target), src), first, _step(repo_target))
        _pause(first)
        assert _stored_not_committed(_storage(repo_target), src) == a_id, "A committed before it was paused"
        # What another host sees once A's lease is past its time: a holder it cannot check, expired.
        _rewrite_lease(storage, name, host="other-host.example", expires=time.time() - 1)
        second = run_main("backup", src, *repo_target.cli, "--json")  # in this process, beside the paused one
        assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
        b = json.loads(second.stdout)
        assert b["removed_leftovers"] == [a_id]
        out, err = _resume(first)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 1, (out, err)
    assert _last_line(err).startswith(f"walvault: not backed up: lease {name} was lost"), err

    listed = run_main("backups", *repo_target.cli, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(x["id"], x["status"]) for x in json.loads(listed.stdout)["backups"]] == [(b["id"], "ok")]
    prefix = f"tarantool/{tr.read_manifest(src)['instance_uuid']}/backups/{a_id}"
    assert _storage(repo_target).list(prefix) == [f"{prefix}/backup.manifest"], "only the fence is left of A"
    verify = run_main("verify", *repo_target.cli)
    assert verify.returncode == 0 and "verdict: INTACT" in verify.stdout, verify.stdout + verify.stderr
    restored = run_main("restore", b["id"], tmp_path / "restored", *repo_target.cli)
    assert restored.returncode == 0, restored.stderr
    assert not _storage(repo_target).exists(name), "every lease was released"


def test_a_paused_backup_on_this_host_is_never_broken_by_age(src, repo_target):
    """A live process on this host keeps its lease however long it is paused: a second backup is refused (exit 1)
    and the first, woken, completes."""
    repo_target.repository(create=True)
    storage = _storage(repo_target)
    name = _lease_name(src)
    first = _start("backup", src, *repo_target.cli, "--jobs", "1", "--json")
    try:
        _wait_for(lambda: _stored_not_committed(_storage(repo_target), src), first, _step(repo_target))
        _pause(first)
        _rewrite_lease(storage, name, expires=time.time() - 30)  # paused well past its time
        second = run_main("backup", src, *repo_target.cli)  # in this process: the holder is another one on this host
        assert second.returncode == 1, second.stdout + second.stderr
        assert _last_line(second.stderr).startswith(
            f"walvault: not backed up: {name} is held by backup (pid {first.pid} on {socket.gethostname()}, "
            "expired "), second.stderr
        out, err = _resume(first)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 0, err
    a = json.loads(out)
    listed = run_main("backups", *repo_target.cli, "--json")
    assert [(x["id"], x["status"]) for x in json.loads(listed.stdout)["backups"]] == [(a["id"], "ok")]
    verify = run_main("verify", *repo_target.cli)
    assert verify.returncode == 0 and "verdict: INTACT" in verify.stdout, verify.stdout + verify.stderr


JUNK_EXPIRES = {"text": '"tomorrow"', "nan": "NaN", "infinity": "Infinity", "huge": "1e308", "minus huge": "-1e308"}


def _junk_leases(now: float) -> dict[str, bytes]:
    base = {"holder": "a" * 32, "command": "backup", "host": "other-host.example", "pid": 4242, "taken": now}
    text = json.dumps(base)[:-1]
    out = {why: f'{text}, "expires": {value}}}'.encode() for why, value in JUNK_EXPIRES.items()}
    out["missing"] = json.dumps(base).encode()
    out["a list"] = json.dumps([base, now + 60]).encode()
    out["no holder"] = json.dumps({**base, "holder": None, "expires": now + 60}).encode()
    return out


def test_a_junk_lease_is_named_never_a_traceback_or_a_wait(src, repo_target):
    repo_target.repository(create=True)
    storage = _storage(repo_target)
    name = _lease_name(src)
    for why, body in _junk_leases(time.time()).items():
        storage.write_bytes(name, body)
        t0 = time.monotonic()
        proc = run_main("backup", src, *repo_target.cli, "--wait", "30")  # a wait would end, and fail the time
        assert proc.returncode == 2, f"{why}: rc {proc.returncode}: {proc.stdout} {proc.stderr}"
        assert time.monotonic() - t0 < 20, f"{why}: it waited"
        line = _last_line(proc.stderr)
        assert proc.stderr.strip() == line, f"{why}: more than one line: {proc.stderr}"
        assert line.startswith(f"walvault: not backed up: the lease {name} in repository ") and \
            f"remove {name} once you know no walvault process of this source runs" in line, f"{why}: {line}"
        assert storage.read_bytes(name) == body, f"{why}: the junk lease was changed"
    assert not [n for n in storage.list("tarantool") if "/backups/" in n], "nothing was backed up"


def _hook_renewal_read(storage: Storage, breaker) -> threading.Event:
    """Run `breaker` in another thread right after the renewal's read of the lease (before its write), and let the
    renewal go on after at most half a second: a breaker that can interleave has done so by then."""
    hooked = threading.Event()
    real = storage._read_tagged

    def read(*args, **kwargs):
        found = real(*args, **kwargs)
        if threading.current_thread().name == "walvault-lease" and not hooked.is_set():
            hooked.set()
            thread = threading.Thread(target=breaker)
            thread.start()
            thread.join(0.5)
        return found

    storage._read_tagged = read
    return hooked


def test_a_renewal_never_overwrites_a_breakers_lease(repo_target):
    """A breaker replaces the lease between a renewal's read and its write: the renewal must not write over it; the
    renew thread stops, confirm raises LeaseLost, release leaves the breaker's lease."""
    from walcore.repository.lease import LeaseLost

    storage = _storage(repo_target)
    name = "locks/tarantool-renewal.lease"
    breaker_body = json.dumps({"holder": "b" * 32, "generation": 2, "command": "backup", "host": "other-host.example",
                               "pid": 4242, "taken": time.time(), "expires": time.time() + 600}).encode()
    breaker_storage = _storage(repo_target)
    holder = acquire(storage, name, "backup", ttl=1.0)
    done = threading.Event()

    def breaker():
        breaker_storage.update(name, lambda current: breaker_body if current is not None else False)
        done.set()

    hooked = _hook_renewal_read(storage, breaker)
    try:
        assert hooked.wait(10), "the lease was not renewed"
        assert done.wait(10), "the breaker never got its turn"
        deadline = time.monotonic() + 10
        while holder._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not holder._thread.is_alive(), "the renew thread goes on renewing a lease that is not its own"
        assert breaker_storage.read_bytes(name) == breaker_body, "a renewal wrote over the breaker's lease"
        with pytest.raises(LeaseLost, match=f"lease {name} was lost"):
            holder.confirm()
    finally:
        holder.release()
    assert breaker_storage.read_bytes(name) == breaker_body, "release removed the breaker's lease"


def _records(storage: Storage, src: Path) -> list[str]:
    prefix = f"tarantool/{tr.read_manifest(src)['instance_uuid']}/archive"
    return [n for n in storage.list(prefix) if n.endswith(".zst.json")]


def test_an_archive_whose_lease_was_lost_writes_no_record(src, repo_target):
    """archive paused under its archive lease; another host takes the lease; woken, it writes no further record
    (exit 1 naming the lease) and every record it wrote names an object that is there. Once the lease is free, the
    next archive stores the rest."""
    repo_target.repository(create=True)
    name = _lease_name(src, ".archive")
    proc = _start("archive", src, *repo_target.cli, "--jobs", "1")
    taker = None
    try:
        _wait_for(lambda: _storage(repo_target).exists(name), proc, _step(repo_target))
        _pause(proc)
        storage = _storage(repo_target)
        paused = len(_records(storage, src))
        _rewrite_lease(storage, name, host="other-host.example", expires=time.time() - 1)
        taker = acquire(storage, name, "archive")
        assert taker.broke and taker.generation >= 2
        out, err = _resume(proc)
        assert proc.returncode == 1, out + err
        assert _last_line(err).startswith(f"walvault: not archived: lease {name} was lost"), err
        records = _records(_storage(repo_target), src)
        assert len(records) <= paused + 1, "records were written after the lease was lost"
        for record in records:
            assert _storage(repo_target).exists(record[:-len(".json")])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if taker is not None:
            taker.release()
    again = run_main("archive", src, *repo_target.cli)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(_records(_storage(repo_target), src)) > len(records)


def test_leftovers_are_fenced_before_they_go_and_the_fence_stays_a_week(repo_target):
    """A backup directory holding objects and a manifest's copy but no main manifest (its writer stopped between the
    two) is leftovers, not a backup. Clearing them fences the directory first: a late writer's commit then fails,
    `backups` no longer lists it, and the fence goes with the directory once it is a week old."""
    from walcore.repository import FENCE_KEEP
    from walcore.repository.manifest import commit_checked, encode_checked

    repo = repo_target.repository(create=True)
    storage = repo.storage
    prefix = repo.backup_dir("tarantool", "inst", "20260101-000000F")
    storage.write_bytes(f"{prefix}/wal/1.xlog.zst", b"stored bytes")
    late = {"id": "20260101-000000F", "late": "writer"}
    storage.write_bytes(f"{prefix}/backup.manifest.copy", encode_checked(late))
    record = repo.load_backup("tarantool", "inst", "20260101-000000F")
    assert record.manifest is None and not record.complete, "a copy without its main manifest is no backup"
    with repo.lease("tarantool", "inst", "backup") as lease:
        assert repo.clear_leftovers(record, lease)
        assert storage.list(prefix) == [f"{prefix}/backup.manifest"], "only the fence is left"
        assert not commit_checked(storage, f"{prefix}/backup.manifest", late), "a late writer committed"
        assert not repo.load_backup("tarantool", "inst", "20260101-000000F").cleared, "its new copy is leftovers"
        storage.remove_tree(prefix, keep=f"{prefix}/backup.manifest")  # what the late writer removes, failing
        fenced = repo.load_backup("tarantool", "inst", "20260101-000000F")
        assert fenced.fenced and fenced.cleared and fenced.problem.startswith(f"fenced by {lease.name} at ")
        assert repo.backups() == [], "a fence is no backup"
        assert not repo.clear_leftovers(fenced, lease), "nothing left to clear"
        old = json.loads(storage.read_bytes(f"{prefix}/backup.manifest"))
        then = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - FENCE_KEEP - 3600))
        storage.write_bytes(f"{prefix}/backup.manifest", encode_checked({**old, "time": then}))
        aged = repo.load_backup("tarantool", "inst", "20260101-000000F")
        assert not aged.cleared
        assert repo.clear_leftovers(aged, lease)
    assert storage.list(prefix) == [], "a week-old fence goes with its directory"

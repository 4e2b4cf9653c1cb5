"""How backup, restore and `verify --repo` fail: each failure is refused with a clear reason, and nothing is lost.

The failure cases of pgBackRest's, WAL-G's and tt's test suites (shared/docs/peers.md), against real parts:
data dirs written by a real Tarantool, the `walvault` command line for every outcome under test (exit code,
message, no traceback), and repositories on a local path and on a real S3 API on 127.0.0.1 (every test taking
`repo_target` runs over both). Each test checks the outcome AND that nothing was lost: the source is unchanged
(tree_snapshot before/after), a refused backup leaves the repository as it was, earlier backups still verify and
restore. Setting up (earlier backups) and looking inside the repository is done in process, and so is the command
line (run_main) unless a kill, a pause, a resource limit or another live process is what is tested: each
`walvault` process over S3 spends ~1.5 s importing its S3 client.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import re
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import tarantool_real as tr
from walcore.runner import LocalRunner
from walcore.repository.storage import RepositoryError
from walcore.repository.verdicts import DRILL_NAME, VERIFY_NAME
from conftest import REPO, copy_tree, require_tarantool, run_cli, run_main, tree_snapshot, walvault_command

pytestmark = require_tarantool


# -- helpers


def _ok(proc: subprocess.CompletedProcess, json_out: bool = True):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, f"rc {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout) if json_out else proc.stdout


def _refused(proc: subprocess.CompletedProcess, rc: int = 1) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == rc, f"rc {proc.returncode} (expected {rc}): {proc.stdout} {proc.stderr}"
    return proc.stderr


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str:
    return _sha(Path(path).read_bytes())


def _staging(target: Path) -> Path:
    return target.parent / f".{target.name}.walvault-restore"


def _instance(src: Path) -> str:
    return tr.read_manifest(src)["instance_uuid"]


class Repo:
    """A test's repository: walvault's CLI arguments for it, walvault's API on it (in process), and its objects
    read and rewritten directly (local files or S3 objects), below walvault's own checks."""

    def __init__(self, target):
        from walcore.repository import Repository

        self.url, self.options, self.cli = target.url, target.options, target.cli
        Repository(self.url, self.options, create=True)  # as `walvault init` makes it: no other command does

    def storage(self):
        from walcore.repository.storage import open_storage

        storage = open_storage(self.url, self.options)
        if not storage.caps.consistent_listing:
            storage.fs.invalidate_cache()  # s3fs caches listings per process; other processes write here
        return storage

    def api(self):
        from walcore.repository import Repository

        self.storage()
        return Repository(self.url, self.options)

    def objects(self) -> dict[str, str]:
        """Every object (local: every file, hidden temporary files too) -> the SHA-256 of its bytes."""
        storage = self.storage()
        out = {}
        if storage.caps.local_paths:
            for dirpath, _dirs, names in os.walk(storage.root):
                for name in names:
                    p = Path(dirpath) / name
                    out[p.relative_to(storage.root).as_posix()] = _file_sha(p)
            return out
        try:
            found = storage.fs.find(storage.root)
        except FileNotFoundError:
            return {}
        return {p[len(storage.root) + 1:]: _sha(storage.fs.cat_file(p)) for p in found}

    def names(self) -> list[str]:
        """Every object's name (a listing only: safe while another process writes and removes objects)."""
        storage = self.storage()
        if storage.caps.local_paths:
            return [(Path(d) / n).relative_to(storage.root).as_posix() for d, _, ns in os.walk(storage.root)
                    for n in ns]
        try:
            return [p[len(storage.root) + 1:] for p in storage.fs.find(storage.root)]
        except FileNotFoundError:
            return []

    def read(self, name: str) -> bytes:
        return self.storage().read_bytes(name, limit=1 << 30)

    def write(self, name: str, data: bytes) -> None:
        self.storage().write_bytes(name, data)

    def exists(self, name: str) -> bool:
        return self.storage().exists(name)

    def backup(self, src: Path, incremental: bool = False) -> dict:
        from walcore.command.backup import backup

        return backup(src, self.api(), incremental=incremental, runner=LocalRunner(2)).to_json()

    def backups(self) -> list[dict]:
        from walcore.command.repo_verify import list_backups

        return list_backups(self.api())

    def verify(self, backup_id: str | None = None) -> dict:
        from walcore.command.repo_verify import verify_repository

        return verify_repository(self.api(), backup_id).to_json()

    def restore(self, backup_id: str, dest: Path) -> dict:
        from walcore.command.restore import restore

        return restore(self.api(), backup_id, dest).to_json()

    def is_fence(self, name: str) -> bool:
        """The fence a backup leaves in place of an interrupted one's manifest (kept a week once its leftovers are
        removed, so that their writer cannot commit them late)."""
        return name.endswith("/backup.manifest") and json.loads(self.read(name)).get("fenced") is True

    def manifest_name(self, backup: dict) -> str:
        source = backup["source"]["instance"] if isinstance(backup["source"], dict) else backup["source"]
        return f"{backup['family']}/{source}/backups/{backup['id']}/backup.manifest"

    def manifest(self, backup: dict) -> dict:
        from walcore.repository.manifest import decode_checked

        return decode_checked(self.read(self.manifest_name(backup)), "manifest")

    def orphans(self) -> list[str]:
        """Objects that belong to nothing: not the repository info, a ledger entry, a verification report, nor a
        complete backup's manifest, stored object or verdict (an interrupted backup's leftovers, temporary files,
        leases)."""
        keep = {"walvault.repo", "walvault.repo.copy"}
        for b in self.backups():
            assert b["status"] in ("ok", "manifest_copy_used"), b
            name = self.manifest_name(b)
            keep |= {name, name + ".copy"} | {f["stored"] for f in self.manifest(b)["files"]}
            keep |= {f"{name.rsplit('/', 1)[0]}/{verdict}" for verdict in (DRILL_NAME, VERIFY_NAME)}
        return sorted(n for n in self.names() if n not in keep and not self.is_fence(n)
                      and not re.fullmatch(r"tarantool/[^/]+/ledger/[0-9a-f]{64}\.json", n)
                      and not re.fullmatch(r"reports/verify/\d{8}-\d{6}-[0-9a-f]{8}/(files\.parquet|summary\.json)", n))


def _restores(repo: Repo, backup_id: str, source: Path, dest: Path, *, start: bool = False,
              cli: bool = False) -> dict:
    """Restore a backup into dest (through the API, or with `cli` through the command line) and check that every
    restored file has the source's bytes (the sources here were shut down cleanly: even the newest xlog is stored
    whole); with `start`, also that Tarantool starts on the restore with the source's rows and vclock."""
    if cli:
        result = _ok(run_main("restore", backup_id, dest, *repo.cli, "--json"))
    else:
        result = repo.restore(backup_id, dest)
    assert result["backup"] == backup_id
    restored = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    assert len(restored) == result["files"], sorted(restored)
    for name, path in restored.items():
        assert _file_sha(path) == _file_sha(source / name), f"{name}: restored bytes differ from the source"
    assert not _staging(dest).exists()
    if start:
        got, want = tr.dump_data_dir(dest), tr.dump_data_dir(source)
        assert got["vclock"] == want["vclock"] and got["spaces"] == want["spaces"]
    return result


def _flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0x40
    path.write_bytes(bytes(data))


def _in_first_block(path: Path, offset: int = 40) -> int:
    """A position inside the first block of a Tarantool file: past its meta and the 19-byte block header."""
    return path.read_bytes().index(b"\n\n") + 2 + 19 + offset


@pytest.fixture
def src(real_instance, tmp_path) -> Path:
    """A writable copy of the session's real data dir (shut down cleanly; 4 snapshots, ~25 xlogs, vinyl)."""
    return copy_tree(real_instance, tmp_path / "src")


@pytest.fixture(scope="module")
def big_instance(tmp_path_factory) -> Path:
    """A real data dir whose backup takes a moment: ~80 xlogs (~3 MB) after its only snapshot. Read only."""
    return tr.generate_instance(tmp_path_factory.mktemp("big-instance"), wal_max_size=32768, scale=60,
                                snapshots=0)


@pytest.fixture
def big_src(big_instance, tmp_path) -> Path:
    return copy_tree(big_instance, tmp_path / "big")


# -- 1, 2: a damaged stored object: one byte flipped, zero length, cut short


def _damage(kind: str, data: bytes) -> bytes:
    if kind == "flip":
        out = bytearray(data)
        out[len(out) // 2] ^= 0x01
        return bytes(out)
    return b"" if kind == "empty" else data[: len(data) // 2]


def test_damaged_stored_objects_are_named_and_not_restored(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    before = tree_snapshot(src)
    earlier = repo.backup(src)
    damaged = {}
    for kind, file_kind in (("flip", "snap"), ("empty", "xlog"), ("truncate", "vylog")):
        backup = repo.backup(src)
        entry = next(f for f in repo.manifest(backup)["files"] if f["kind"] == file_kind)
        repo.write(entry["stored"], _damage(kind, repo.read(entry["stored"])))
        damaged[kind] = (backup["id"], entry)

    text = run_main("verify", *repo.cli)
    assert text.returncode == 1 and "Traceback" not in text.stderr
    assert "verdict: DAMAGED" in text.stdout
    report = repo.verify()
    by_id = {b["id"]: b for b in report["backups"]}
    assert by_id[earlier["id"]]["status"] == "ok"
    for kind, (backup_id, entry) in damaged.items():
        assert f"backup {backup_id} (tarantool {_instance(src)}): damaged" in text.stdout
        assert f"object_damaged: {entry['name']} {entry['stored']}: " in text.stdout
        (finding,) = by_id[backup_id]["findings"]
        assert finding["code"] == "object_damaged" and finding["file"] == entry["name"], kind

    for kind, (backup_id, entry) in damaged.items():
        target = tmp_path / f"restored-{kind}"
        err = _refused(run_main("restore", backup_id, target, *repo.cli))
        assert err.startswith(f"walvault: not restored: backup {backup_id} cannot be restored: {entry['stored']}: ")
        assert not target.exists() and not _staging(target).exists(), kind

    # nothing lost: the earlier backup verifies and restores; the source is as it was
    assert repo.verify(earlier["id"])["intact"] is True
    _restores(repo, earlier["id"], src, tmp_path / "restored-earlier")
    assert tree_snapshot(src) == before


# -- 3, 4: a source that would not restore is not backed up


def test_missing_middle_xlog_is_refused(src, repo_target):
    repo = Repo(repo_target)
    earlier = repo.backup(src)
    xlogs = [f["name"] for f in repo.manifest(earlier)["files"] if f["kind"] == "xlog"]
    assert len(xlogs) >= 3
    gone = len(xlogs) // 2
    (src / xlogs[gone]).unlink()
    objects, before = repo.objects(), tree_snapshot(src)

    err = _refused(run_main("backup", src, *repo.cli))
    assert err.startswith("walvault: not backed up: the set would not restore: ")
    assert "an xlog is missing between them" in err
    assert Path(xlogs[gone - 1]).name in err and Path(xlogs[gone + 1]).name in err, "the gap is named"
    assert repo.objects() == objects, "a refused backup changed the repository"
    assert [b["id"] for b in repo.backups()] == [earlier["id"]]
    assert tree_snapshot(src) == before


def test_damaged_source_files_are_refused(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    earlier = repo.backup(src)
    files = repo.manifest(earlier)["files"]
    xlogs = [f["name"] for f in files if f["kind"] == "xlog"]
    snap = next(f["name"] for f in files if f["kind"] == "snap")
    objects = repo.objects()
    for name in (xlogs[len(xlogs) // 2], snap):  # a sealed xlog in the middle of the set; the snapshot
        path = src / name
        pos = _in_first_block(path)
        _flip(path, pos)
        before = tree_snapshot(src)
        err = _refused(run_main("backup", src, *repo.cli))
        assert err.startswith("walvault: not backed up: the set would not restore: ")
        assert f"{path.name} is damaged: crc_mismatch at " in err or f"{path.name}: damaged: crc_mismatch at " in err
        assert repo.objects() == objects, "a refused backup changed the repository"
        assert tree_snapshot(src) == before
        _flip(path, pos)
    assert [b["id"] for b in repo.backups()] == [earlier["id"]]
    _restores(repo, earlier["id"], src, tmp_path / "restored")


# -- 5: a backup killed at random points


def _popen(*args) -> subprocess.Popen:
    return subprocess.Popen([*walvault_command(), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, cwd=REPO)


def _wait_for(predicate, timeout: float = 60.0, step: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(step)


def _lease_name(src: Path) -> str:
    return f"locks/tarantool-{_instance(src)}.lease"


def _holds_lease(repo: Repo, src: Path, proc: subprocess.Popen) -> bool:
    """True once proc holds the source's lease (or has ended)."""
    if proc.poll() is not None:
        return True
    try:
        return json.loads(repo.read(_lease_name(src))).get("pid") == proc.pid
    except (FileNotFoundError, ValueError, RepositoryError):  # not there yet, half written, or just removed
        return False


def test_killed_backup_leaves_no_backup_and_is_cleaned_up(big_src, repo_target, tmp_path):
    repo = Repo(repo_target)
    before = tree_snapshot(big_src)
    args = ("--jobs", "1", "--level", "6", "--json")
    first = repo.backup(big_src)  # fills the ledger: the timed and the killed backups skip the scan alike
    proc = _popen("backup", big_src, *repo.cli, *args)
    _wait_for(lambda: _holds_lease(repo, big_src, proc))
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    work = time.monotonic() - t0  # from taking the lease to the end
    earlier = _ok(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    kept = {first["id"], earlier["id"]}
    rng = random.Random(20261123)
    instance = _instance(big_src)

    def kill(proc) -> tuple[str, str]:
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert "Traceback" not in err
        return out, err

    def check_after_kill(proc, out) -> None:
        listed = repo.backups()
        new = [b for b in listed if b["id"] not in kept]
        if proc.returncode == 0:  # it ended before the kill: a whole backup
            kept.add(json.loads(out)["id"])
        else:
            assert proc.returncode == -signal.SIGKILL
            for b in new:
                # killed before its manifest: incomplete; killed between the manifest's copy and its main file:
                # whole, read from the copy; killed after it: whole (the kill came while it released its lease)
                assert b["status"] in ("incomplete", "manifest_copy_used", "ok"), b
                if b["status"] != "incomplete":
                    kept.add(b["id"])
        assert {b["id"] for b in listed if b["status"] != "incomplete"} == kept, "an earlier backup was lost"

    poll = 0.002 if repo_target.kind == "local" else 0.02  # each poll of S3 is a request to the server
    # killed at a random moment after it took the lease: three times on a local path, once on S3 (each run there is
    # a second's import and a backup several times as long); the kill after a stored object below is on both
    for _ in range(3 if repo_target.kind == "local" else 1):
        proc = _popen("backup", big_src, *repo.cli, *args)
        _wait_for(lambda: _holds_lease(repo, big_src, proc), step=poll)
        time.sleep(rng.uniform(0.0, 1.0) * work)
        out, _ = kill(proc)
        check_after_kill(proc, out)
    # and once more, killed once it has stored an object: its leftovers are there for certain
    prefix = f"tarantool/{instance}/backups/"
    proc = _popen("backup", big_src, *repo.cli, *args)
    # (a fence, the main manifest's name kept in an earlier killed backup's directory, is not this one's object)
    _wait_for(lambda: proc.poll() is not None or any(n.startswith(prefix) and n[len(prefix):].split("/")[0]
                                                     not in kept and not n.endswith("/backup.manifest")
                                                     for n in repo.names()), step=poll)
    out, _ = kill(proc)
    assert proc.returncode == -signal.SIGKILL, "the backup ended before it could be killed"
    check_after_kill(proc, out)
    incomplete = [b["id"] for b in repo.backups() if b["status"] == "incomplete"]
    assert incomplete, "the last kill left the objects it had stored"

    # `verify --repo` says the backups are intact and names the leftovers
    text = run_main("verify", *repo.cli)
    assert text.returncode == 0 and "Traceback" not in text.stderr and "verdict: INTACT" in text.stdout
    for backup_id in sorted(kept):
        assert f"backup {backup_id} (tarantool {instance}): ok\n" in text.stdout
    for backup_id in incomplete:
        assert ("leftovers of an interrupted backup (removed by the next backup of its source, or by expire): "
                f"tarantool/{instance}/{backup_id}") in text.stdout
    # the next backup succeeds and says it removed them; nothing is left over afterwards
    text = _ok(run_main("backup", big_src, *repo.cli, "--jobs", "1"), json_out=False)
    for backup_id in incomplete:
        assert f"removed the leftovers of interrupted backup {backup_id}\n" in text
    assert [b for b in repo.backups() if b["status"] == "incomplete"] == []
    assert repo.orphans() == []
    assert tree_snapshot(big_src) == before
    _restores(repo, earlier["id"], big_src, tmp_path / "restored-earlier", start=True)


# -- 6, 7: one backup of a source at a time; stale leases are broken


@pytest.mark.parametrize("wait", [False, True])
def test_concurrent_backups_of_one_source(wait, big_src, repo_target):
    """Two backups of one source at once. The first is paused (SIGSTOP) right after it takes the lease, so that
    the second certainly meets it, whatever the machine's speed."""
    repo = Repo(repo_target)
    before = tree_snapshot(big_src)
    first = _popen("backup", big_src, *repo.cli, "--json")
    try:
        _wait_for(lambda: _holds_lease(repo, big_src, first), step=0.002 if repo_target.kind == "local" else 0.02)
        assert first.poll() is None, "the first backup ended before the second started"
        first.send_signal(signal.SIGSTOP)
        second = _popen("backup", big_src, *repo.cli, "--json", *(("--wait", "60") if wait else ()))
        if wait:
            time.sleep(3.0 if repo_target.kind == "s3" else 1.0)  # the second is waiting for the lease now
            assert second.poll() is None, second.communicate()
        else:
            second.wait(timeout=60)
        first.send_signal(signal.SIGCONT)
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=120)
    finally:
        first.kill()
    assert "Traceback" not in err1 + err2
    assert first.returncode == 0, err1
    one = json.loads(out1)
    if wait:
        assert second.returncode == 0, err2
        two = json.loads(out2)
        assert [b["id"] for b in repo.backups()] == [one["id"], two["id"]]
        assert two["started"] >= one["finished"], "the second backup waited for the first"
    else:
        assert second.returncode == 1, err2
        assert err2.startswith(f"walvault: not backed up: {_lease_name(big_src)} is held by backup (pid {first.pid} "
                               f"on {socket.gethostname()}, expires in ")
        assert [b["id"] for b in repo.backups()] == [one["id"]]
    assert not repo.exists(_lease_name(big_src)), "the lease is released"
    assert repo.orphans() == []
    assert repo.verify()["intact"] is True
    assert tree_snapshot(big_src) == before


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_leases_are_broken_live_ones_respected(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    before = tree_snapshot(src)
    now, host = time.time(), socket.gethostname()
    live = {"holder": "a" * 32, "command": "backup", "host": host, "pid": os.getpid(), "taken": now,
            "expires": now + 3600}
    repo.write(_lease_name(src), json.dumps(live).encode())
    err = _refused(run_cli("backup", src, *repo.cli))  # a process: the lease names this one, another live process
    assert f"is held by backup (pid {os.getpid()} on {host}, expires in " in err
    assert json.loads(repo.read(_lease_name(src))) == live, "a live lease was broken"
    assert [n for n in repo.objects() if "/backups/" in n] == []

    stale = {"dead pid": {**live, "holder": "b" * 32, "pid": _dead_pid()},  # this host, not expired, process gone
             "expired": {**live, "holder": "c" * 32, "host": "elsewhere.example", "taken": now - 7200,
                         "expires": now - 3600}}  # another host: judged by its time alone
    ids = []
    for why, lease in stale.items():
        repo.write(_lease_name(src), json.dumps(lease).encode())
        ids.append(_ok(run_main("backup", src, *repo.cli, "--json"))["id"])
        assert not any(n.startswith("locks/") for n in repo.objects()), f"{why}: a lease was left behind"
    assert [b["id"] for b in repo.backups()] == ids
    assert repo.orphans() == []
    assert tree_snapshot(src) == before
    _restores(repo, ids[-1], src, tmp_path / "restored")


# -- 8: a manifest naming a path outside


def _rewrite_manifest(repo: Repo, backup: dict, change) -> None:
    """Change a backup's manifest and give it a valid checksum, main file and copy alike (a forged manifest)."""
    from walcore.repository.manifest import encode_checked

    obj = repo.manifest(backup)
    change(obj)
    data = encode_checked(obj)
    repo.write(repo.manifest_name(backup), data)
    repo.write(repo.manifest_name(backup) + ".copy", data)


def test_manifest_naming_a_path_outside_is_refused(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    before_src = tree_snapshot(src)
    good = repo.backup(src)
    area = tmp_path / "area"
    target = area / "a" / "b" / "target"  # ../../etc/passwd from inside it is area/a/etc/passwd
    target.parent.mkdir(parents=True)
    (area / "x").write_bytes(b"not the backup's")
    passwd = _file_sha(Path("/etc/passwd"))
    forged = {}
    for field, evil in (("name", "../../etc/passwd"), ("stored", "../../x")):
        backup = repo.backup(src)

        def change(obj, field=field, evil=evil):
            obj["files"][0][field] = evil

        _rewrite_manifest(repo, backup, change)
        forged[backup["id"]] = evil
    before_area = tree_snapshot(area)

    for backup_id, evil in forged.items():
        err = _refused(run_main("restore", backup_id, target, *repo.cli))
        assert err.startswith(f"walvault: not restored: backup {backup_id} cannot be restored: ")
        assert f"refused repository name {evil!r}" in err
        assert tree_snapshot(area) == before_area, "the refused restore wrote something"
        assert not _staging(target).exists()
        # `verify --repo BACKUP` reports it damaged (exit 1)
        text = run_main("verify", *repo.cli, backup_id)
        assert text.returncode == 1 and "Traceback" not in text.stderr, text.stderr
        assert f"backup {backup_id} (tarantool {_instance(src)}): damaged" in text.stdout and evil in text.stdout
    assert _file_sha(Path("/etc/passwd")) == passwd
    listed = {b["id"]: b for b in repo.backups()}
    for backup_id, evil in forged.items():
        assert listed[backup_id]["status"] == "unreadable" and evil in listed[backup_id]["problem"]
    assert listed[good["id"]]["status"] == "ok"
    # `latest` is the newest usable backup: the good one, and the restore says which newer ones it passed over
    target = tmp_path / "restored"
    out = _ok(run_main("restore", "latest", target, *repo.cli), json_out=False)
    for backup_id, evil in forged.items():
        assert f"note: backup {backup_id} is newer but cannot be used (" in out and evil in out
    assert f"restored backup {good['id']} into {target}: {good['files']} files" in out
    for p in target.rglob("*"):
        if p.is_file():
            assert _file_sha(p) == _file_sha(src / p.relative_to(target))
    assert tree_snapshot(src) == before_src


# -- 9: a damaged main manifest, a good copy


def test_damaged_main_manifest_with_a_good_copy(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    before = tree_snapshot(src)
    backup = repo.backup(src)
    name = repo.manifest_name(backup)
    obj = json.loads(repo.read(name))
    obj["finished"] = "2000-01-01T00:00:00Z"  # valid JSON, but not what its checksum covers
    repo.write(name, json.dumps(obj).encode())

    (listed,) = _ok(run_main("backups", *repo.cli, "--json"))["backups"]
    assert listed["id"] == backup["id"] and listed["status"] == "manifest_copy_used"
    assert listed["problem"] == f"{name} does not match its checksum: it was changed or damaged; {name}.copy was used"
    assert listed["finished"] == backup["finished"], "the copy's content is what is shown"
    # verify reports it (exit 1: the manifest lost its redundancy), and the backup itself is ok to restore
    text = run_main("verify", *repo.cli)
    assert text.returncode == 1 and "Traceback" not in text.stderr
    assert f"backup {backup['id']} (tarantool {_instance(src)}): ok" in text.stdout
    assert f"  manifest_damaged:  {name} does not match its checksum" in text.stdout
    assert "verdict: DAMAGED" in text.stdout
    # restore works and says which file it used
    target = tmp_path / "restored"
    out = _ok(run_main("restore", backup["id"], target, *repo.cli), json_out=False)
    assert out.startswith(f"note: the manifest's main file was not used: {name} does not match its checksum")
    assert f"restored backup {backup['id']} into {target}: {backup['files']} files" in out
    for p in target.rglob("*"):
        if p.is_file():
            assert _file_sha(p) == _file_sha(src / p.relative_to(target))
    assert tree_snapshot(src) == before


# -- 10: the disk fills up during a backup (local repository only)


def _local_listing(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _file_sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


class _Local:
    def __init__(self, root: Path):
        self.url, self.options, self.cli = str(root), {}, ["--repo", str(root)]


def _write_fails(src: Path, failing: Path, repo_dir: Path, tmp_path: Path, make_preexec=None) -> str:
    """An earlier backup of src fits; a backup of `failing` cannot be written: refused without a traceback, the
    repository exactly as before, the earlier backup still verifies and restores."""
    repo = Repo(_Local(repo_dir))
    earlier = repo.backup(src)
    preexec = make_preexec(repo, earlier) if make_preexec else None
    listing, before = _local_listing(repo_dir), tree_snapshot(failing)
    proc = subprocess.run([*walvault_command(), "backup", str(failing), "--repo", str(repo_dir)], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, cwd=REPO, timeout=120, preexec_fn=preexec)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(r"walvault: not backed up: cannot write \S+ in repository \S+: [^\n]+\n", proc.stderr), \
        proc.stderr
    assert _local_listing(repo_dir) == listing, "the failed backup changed the repository"
    assert tree_snapshot(failing) == before
    assert [b["id"] for b in repo.backups()] == [earlier["id"]]
    assert repo.verify()["intact"] is True
    _restores(repo, earlier["id"], src, tmp_path / "restored", start=True, cli=True)
    return proc.stderr


def test_disk_full_during_backup_tmpfs(src, big_src, tmp_path):
    """The repository on a 2 MB tmpfs: the earlier backup (~0.3 MB) fits, the big one (~3 MB) does not."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here (the RLIMIT_FSIZE test covers a failing write)")
    try:
        err = _write_fails(src, big_src, mnt / "repo", tmp_path)
        assert err.endswith(": No space left on device\n")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_file_too_large_during_backup_rlimit_fsize(src, tmp_path):
    """A write that fails part way without mount: RLIMIT_FSIZE at half the largest object (SIGXFSZ ignored, so
    the write fails with EFBIG)."""
    again = copy_tree(src, tmp_path / "again")

    def make_preexec(repo, earlier):
        limit = max(f["stored_size"] for f in repo.manifest(earlier)["files"]) // 2

        def preexec():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        return preexec

    err = _write_fails(src, again, tmp_path / "repo", tmp_path, make_preexec)
    assert err.endswith(": File too large\n")


# -- 11: an interrupted restore, run again


def test_interrupted_restore_resumes(big_src, tmp_path):
    """On a local repository only: what resumes is the target's staging directory, whatever the repository's
    storage (restores from S3: the other tests here, test_copy's)."""
    repo = Repo(_Local(tmp_path / "repo"))
    before = tree_snapshot(big_src)
    backup = repo.backup(big_src)
    target = tmp_path / "restored"
    staging = _staging(target)
    proc = _popen("restore", backup["id"], target, *repo.cli)
    _wait_for(lambda: proc.poll() is not None or (staging.is_dir() and len(list(staging.rglob("*.xlog"))) >= 20),
              step=0.002)
    proc.kill()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the restore ended before it was killed"
    assert "Traceback" not in err
    assert staging.is_dir() and not target.exists()
    # what a kill leaves, made worse: a file cut short, and a file missing with its part file half written
    kept = sorted(staging.rglob("*.xlog"))
    kept[0].write_bytes(kept[0].read_bytes()[:100])
    kept[1].rename(kept[1].with_name(kept[1].name + ".walvault-part"))
    good = sum(1 for p in staging.rglob("*") if p.is_file() and (big_src / p.relative_to(staging)).is_file()
               and _file_sha(p) == _file_sha(big_src / p.relative_to(staging)))
    assert good >= 18

    out = _ok(run_main("restore", backup["id"], target, *repo.cli), json_out=False)
    assert out == (f"restored backup {backup['id']} into {target}: {backup['files']} files, {backup['bytes']:,} bytes "
                   f"({good} kept from an interrupted run)\n")
    _restores(repo, backup["id"], big_src, tmp_path / "fresh")  # the same check on a fresh restore, then compare
    assert {p.relative_to(target) for p in target.rglob("*")} == \
           {p.relative_to(tmp_path / "fresh") for p in (tmp_path / "fresh").rglob("*")}
    for p in target.rglob("*"):
        if p.is_file():
            assert _file_sha(p) == _file_sha(big_src / p.relative_to(target))
    assert not staging.exists()
    assert tree_snapshot(big_src) == before


def test_staging_left_by_another_restore_is_not_mixed_in(src, repo_target, tmp_path):
    """A staging directory that an interrupted restore of something else left (here: a newer snapshot and a
    part file, no mark of this restore) must not bring its files into this restore."""
    repo = Repo(repo_target)
    backup = repo.backup(src)
    target = tmp_path / "restored"
    staging = _staging(target)
    (staging / "memtx").mkdir(parents=True)
    (staging / "memtx" / "99999999999999999999.snap").write_bytes(b"SNAP\n0.13\n\n")
    (staging / "wal").mkdir()
    (staging / "wal" / "00000000000000000000.xlog.walvault-part").write_bytes(b"partial")
    out = _ok(run_main("restore", backup["id"], target, *repo.cli), json_out=False)
    names = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert names == sorted(f["name"] for f in repo.manifest(backup)["files"]), "files of another restore joined"
    for name in names:
        assert _file_sha(target / name) == _file_sha(src / name)
    assert f"note: {staging} was left by an interrupted restore of something else: discarded\n" in out


# -- 12: restore into a non-empty target


def test_restore_into_non_empty_target_is_refused(src, repo_target, tmp_path):
    repo = Repo(repo_target)
    backup = repo.backup(src)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    before = tree_snapshot(target)
    err = _refused(run_main("restore", backup["id"], target, *repo.cli))
    assert err == f"walvault: not restored: {target} exists and is not an empty directory: nothing was written\n"
    assert tree_snapshot(target) == before and not _staging(target).exists()
    as_file = tmp_path / "file-target"
    as_file.write_text("a file")
    err = _refused(run_main("restore", "latest", as_file, *repo.cli))
    assert "exists and is not an empty directory" in err
    assert as_file.read_text() == "a file" and not _staging(as_file).exists()
    (tmp_path / "empty").mkdir()  # an empty directory is fine
    _restores(repo, backup["id"], src, tmp_path / "empty")


# -- archive: each source's newest vylog is still written to


@pytest.fixture(scope="module")
def other_instance(tmp_path_factory) -> Path:
    """A second, small real data dir (another instance; its newest vylog's name sorts before real_instance's)."""
    return tr.generate_instance(tmp_path_factory.mktemp("other-instance"), wal_max_size=16384, scale=1,
                                snapshots=1)


def test_archive_of_two_sources_keeps_each_newest_vylog_out(src, other_instance, tmp_path):
    """Tarantool appends to the newest vylog of each vinyl dir: archiving two data dirs at once must leave out the
    newest vylog of each, not only the one whose name sorts last (then archived, it turns into a CONFLICT). On a
    local repository only: which files are left out does not depend on the storage (an archive on S3 leaving the
    newest vylog out: test_archive.py's test_tarantool_sealed_files_only_then_a_no_op)."""
    repo = Repo(_Local(tmp_path / "repo"))
    other = copy_tree(other_instance, tmp_path / "other")
    before = tree_snapshot(src), tree_snapshot(other)
    newest = [max((d / "vinyl").glob("*.vylog")) for d in (src, other)]
    result = _ok(run_main("archive", src, other, *repo.cli, "--json"))
    for vylog in newest:
        assert str(vylog) in result["not_sealed"] and str(vylog) not in result["stored"]
        assert not [n for n in repo.names() if n.endswith(f"/archive/vinyl/{vylog.name}.zst")]
    assert result["refused"] == [] and result["conflicts"] == []
    assert any(p.endswith(".vylog") for p in result["stored"]), "older vylogs are sealed and archived"
    assert repo.verify()["intact"] is True
    assert (tree_snapshot(src), tree_snapshot(other)) == before


def test_restore_latest_with_two_sources_is_refused(src, other_instance, tmp_path):
    """`latest` of which source? With backups of two sources, `restore latest` names them and writes nothing."""
    repo = Repo(_Local(tmp_path / "repo"))
    repo.backup(src)
    repo.backup(copy_tree(other_instance, tmp_path / "other"))
    target = tmp_path / "restored"
    proc = run_main("restore", "latest", target, *repo.cli)
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (1, 2) and _instance(src) in proc.stderr and _instance(other_instance) in proc.stderr
    assert not target.exists()


# -- races and leftovers found by review (each failed before its fix)


def test_a_stale_lease_broken_by_two_at_once_is_held_by_one(repo_target, monkeypatch):
    from walcore.repository import lease as lease_module

    storage = Repo(repo_target).storage()
    name = "locks/tarantool-race.lease"
    now = time.time()
    storage.write_bytes(name, json.dumps({"holder": "d" * 32, "command": "backup", "host": socket.gethostname(),
                                          "pid": _dead_pid(), "taken": now, "expires": now + 3600}).encode())
    first: list = []
    real_stale = lease_module.stale

    def stale(info):  # B judges the lease stale; before B breaks it, A breaks it and takes the lease
        judged = real_stale(info)
        if judged and not first:
            first.append(None)
            first[0] = lease_module.acquire(storage, name, "backup")
        return judged

    monkeypatch.setattr(lease_module, "stale", stale)
    try:
        with pytest.raises(lease_module.LeaseBusy):
            second = lease_module.acquire(storage, name, "backup")  # B
            second.release()
    finally:
        if first and first[0] is not None:
            first[0].release()


def test_a_manifest_stored_by_a_commit_that_then_failed_goes_with_its_files(src, repo_target, monkeypatch):
    """An object store may keep a manifest and still fail the call that wrote it (its reply lost, retries used up):
    the failed backup removes its files and that manifest too, so nothing lists a backup whose files are gone."""
    from walcore import backup_common
    from walcore.command import backup as backup_module

    repo = Repo(repo_target)
    real_commit = backup_common.commit_checked

    def commit_then_fail(*args, **kwargs):
        real_commit(*args, **kwargs)
        raise RepositoryError("cannot create the manifest: the reply was lost")

    monkeypatch.setattr(backup_common, "commit_checked", commit_then_fail)
    with pytest.raises(RepositoryError):
        backup_module.backup(src, repo.api())
    assert [n for n in repo.names() if "/backups/" in n] == []
    assert repo.api().backups() == []


def test_temporary_files_of_killed_writes_are_removed(src, tmp_path):
    repo_dir = tmp_path / "repo"
    repo = Repo(_Local(repo_dir))
    backup = repo.backup(src)
    ledger = next(repo_dir.glob("tarantool/*/ledger"))
    planted = [ledger / f".{'0' * 64}.json.deadbeef.walvault-tmp",  # what SIGKILL in write_atomic leaves
               repo_dir / Path(repo.manifest_name(backup)).parent / ".backup.manifest.deadbeef.walvault-tmp",
               repo_dir / ".walvault.repo.deadbeef.walvault-tmp"]
    old = time.time() - 86400
    for p in planted:
        p.write_bytes(b"{")
        os.utime(p, (old, old))
    _ok(run_main("backup", src, *repo.cli, "--json"))
    assert [p for p in planted if p.exists()] == []


def test_point_in_time_restore_does_not_use_a_backup_started_after_the_point(src, tmp_path):
    import calendar

    repo = Repo(_Local(tmp_path / "repo"))
    repo.backup(src)
    time.sleep(1.1)  # the first backup started a whole second before the point: it is a base by any rounding
    tr.write_more(src, rows=300, snapshot=False, seed=1)
    moment = tr.dump_data_dir(src)
    time.sleep(0.05)
    point = time.time()
    time.sleep(0.05)
    tr.write_more(src, rows=300, snapshot=True, seed=2)  # a new snapshot, after the point
    later = repo.backup(src, incremental=True)  # holds every xlog since the first backup
    # as if the later backup had started in the same second as the point (its `started` is whole seconds)
    same_second = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(point)))
    assert calendar.timegm(time.strptime(same_second, "%Y-%m-%dT%H:%M:%SZ")) <= point

    def change(obj):
        obj["started"] = same_second

    _rewrite_manifest(repo, later, change)
    target = tmp_path / "restored"
    result = _ok(run_main("restore", "latest", target, *repo.cli, "--to", f"@{point:.3f}", "--json"))
    assert result["point"]["base"] != later["id"], "the base's snapshot is after the point"
    assert tr.dump_data_dir(target)["vclock"] == moment["vclock"]


def test_a_backup_reads_its_sources_manifests_no_further_than_its_parent(src, tmp_path):
    """An incremental reads the source's backups newest first and stops at its parent: the leftovers it meets
    (newer) are removed, an older backup directory without a manifest (what only a lease-lost writer killed late
    leaves) is not read (an old code that read every manifest removed it), and `verify --repo` names it."""
    repo_dir = tmp_path / "repo"
    repo = Repo(_Local(repo_dir))
    full = _ok(run_main("backup", src, *repo.cli, "--json"))
    parent = _ok(run_main("backup", src, *repo.cli, "--type", "incremental", "--json"))
    backups = repo_dir / Path(repo.manifest_name(full)).parent.parent

    def stamp(backup_id: str, seconds: int) -> str:
        when = datetime.datetime.strptime(backup_id.split("_")[-1][:15], "%Y%m%d-%H%M%S")
        return (when + datetime.timedelta(seconds=seconds)).strftime("%Y%m%d-%H%M%S")

    older = backups / f"{stamp(full['id'], -1)}F"  # a full's, a second before the full: below the parent
    newer = backups / f"{full['id']}_{stamp(parent['id'], 1)}I"  # a killed incremental's, above it
    for leftover in (older, newer):
        leftover.mkdir()
        (leftover / "00000000000000000000.snap.zst").write_bytes(b"left over")
    assert older.name < full["id"] and repo.backups()[0]["id"] == older.name
    text = _ok(run_main("verify", *repo.cli), json_out=False)
    for leftover in (older, newer):
        assert f"/{leftover.name}\n" in text and "leftovers of an interrupted backup" in text

    out = _ok(run_main("backup", src, *repo.cli, "--type", "incremental", "--json"))
    assert out["parent"] == parent["id"]
    assert out["removed_leftovers"] == [newer.name] and not (newer / "00000000000000000000.snap.zst").exists()
    assert (older / "00000000000000000000.snap.zst").read_bytes() == b"left over"
    assert f"/{older.name}\n" in _ok(run_main("verify", *repo.cli), json_out=False)

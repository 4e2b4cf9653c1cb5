"""Encryption at rest (docs/encryption.md), end to end with the command line (the installed command in a process
where a refusal's whole output or a kill is under test, walcore.cli.main in this process elsewhere): an encrypted
repository on a local path and on S3 (moto's server) holds none of a marker that a real Tarantool wrote into its
rows; a backup restores to the source's bytes; a wrong or missing key is refused (exit 2, nothing written, nothing
said of the key); a rotated key restores and the old one no longer opens; a flipped byte in any kind of object is
named by `verify --repo` with the key and without it; `key rotate` killed at random points leaves the repository
readable by one of the two keys, and running it again finishes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import tarantool_real as tr
from conftest import ENCRYPTION_KEY, REPO, require_tarantool, run_cli, run_main, walvault_command

from walcore.repository.storage import open_storage

MARKER = b"WALVAULT-SECRET-MARKER-5f0c2e"
NEW_KEY = "Pm4 second passphrase, for the rotation Qw8"
SAMPLES = REPO / "samples"


def _marked_instance(work: Path) -> Path:
    """A data dir real Tarantool wrote: rows holding MARKER, in a snapshot and in xlogs after it."""
    for d in ("memtx", "wal", "vinyl"):
        (work / d).mkdir(parents=True, exist_ok=True)
    marker = MARKER.decode()
    proc = tr.run_lua_code(f"""
box.cfg{{work_dir = '{work}', memtx_dir = 'memtx', wal_dir = 'wal', vinyl_dir = 'vinyl', checkpoint_count = 1000,
        checkpoint_interval = 0, feedback_enabled = false, log_level = 1, wal_max_size = 16384}}
local s = box.schema.space.create('marked')
s:create_index('pk')
for i = 1, 200 do s:insert{{i, '{marker} row ' .. i}} end
box.snapshot()
for i = 201, 600 do s:insert{{i, '{marker} row ' .. i}} end
os.exit(0)
""", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert any(MARKER in p.read_bytes() for p in (work / "wal").glob("*.xlog"))
    return work


def _stored(target) -> dict[str, bytes]:
    """Every object as stored: its raw bytes, by name."""
    storage = open_storage(target.url, target.options)
    if not storage.caps.consistent_listing:
        storage.fs.invalidate_cache()  # s3fs caches listings per process; other processes wrote here
    return {name: b"".join(storage.iter_bytes(name)) for name in storage.list()}


def _flip(target, name: str, at: int) -> bytes:
    """Flip one bit of a stored object in place; returns its bytes before."""
    storage = open_storage(target.url, target.options)
    data = b"".join(storage.iter_bytes(name))
    damaged = bytearray(data)
    damaged[at % len(data)] ^= 0x10
    storage.write_bytes(name, bytes(damaged))
    return data


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    return proc.stdout


def _refused(proc: subprocess.CompletedProcess, *secrets: str) -> None:
    """Exit 2, one line, nothing of any key."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    for secret in secrets:
        for part in (secret, secret[:6], secret[-6:]):
            assert part not in proc.stdout + proc.stderr


def _same_files(restored: Path, source: Path) -> int:
    files = [p for p in restored.rglob("*") if p.is_file()]
    assert files
    for p in files:
        assert p.read_bytes() == (source / p.relative_to(restored)).read_bytes(), p
    return len(files)


@require_tarantool
def test_an_encrypted_repository_hides_restores_refuses_rotates_and_names_damage(repo_target, tmp_path,
                                                                                 monkeypatch):
    source = _marked_instance(tmp_path / "src")
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    monkeypatch.delenv("WALVAULT_NEW_KEY", raising=False)
    assert "encrypted" in _ok(run_main("init", *repo_target.cli, "--encrypt"))
    _ok(run_main("backup", source, *repo_target.cli))
    _ok(run_main("archive", source, *repo_target.cli))
    _ok(run_main("verify", *repo_target.cli))

    stored = _stored(repo_target)
    kinds = {"backup object": ".xlog.zst", "manifest": "backup.manifest", "ledger entry": "/ledger/",
             "archive record": ".zst.json", "report": "reports/"}
    for kind, part in kinds.items():
        assert any(part in name for name in stored), kind
    assert not [name for name, data in stored.items() if MARKER in data]
    assert not [name for name, data in stored.items() if ENCRYPTION_KEY.encode() in data]

    # a plain repository of the same source would show the marker: the check above can fail
    if repo_target.kind == "local":
        plain = tmp_path / "plain"
        monkeypatch.delenv("WALVAULT_KEY")  # a plain repository takes no key
        _ok(run_main("init", "--repo", plain))
        _ok(run_main("backup", source, "--repo", plain))
        assert any(MARKER in p.read_bytes() for p in plain.rglob("*.zst"))
        monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)

    _ok(run_main("restore", "latest", tmp_path / "restored", *repo_target.cli))
    _same_files(tmp_path / "restored", source)

    # a wrong or missing key: exit 2, nothing written, nothing said of either key by the whole process
    before = _stored(repo_target)
    monkeypatch.setenv("WALVAULT_KEY", "Kx9 a wrong passphrase 3Jd")
    for args in (("backups",), ("backup", source), ("restore", "latest", tmp_path / "wrong"), ("verify",)):
        _refused(run_cli(*args, *repo_target.cli), ENCRYPTION_KEY, "Kx9 a wrong passphrase 3Jd")
    monkeypatch.delenv("WALVAULT_KEY")
    _refused(run_cli("backup", source, *repo_target.cli), ENCRYPTION_KEY)
    assert _stored(repo_target) == before
    assert not (tmp_path / "wrong").exists()

    # verify without the key checks every object's stored bytes; with it, authenticates them too: one object of
    # each kind damaged at once (header, middle or trailer), each named on its own by both runs
    assert "INTACT" in _ok(run_main("verify", *repo_target.cli))
    damaged = {}
    for (kind, part), where in zip(kinds.items(), ("header", "middle", "trailer", "middle", "header")):
        name = next(n for n in sorted(before) if part in n)
        at = {"header": 30, "middle": len(before[name]) // 2, "trailer": -1}[where]
        damaged[kind] = (name, _flip(repo_target, name, at))
    try:
        for key in (None, ENCRYPTION_KEY):
            if key:
                monkeypatch.setenv("WALVAULT_KEY", key)
            proc = run_main("verify", *repo_target.cli)
            assert proc.returncode == 1, (key is not None, proc.stdout, proc.stderr)
            for kind, (name, _) in damaged.items():
                assert f"object_unauthentic: {name}:" in proc.stdout, (kind, key is not None, proc.stdout)
    finally:
        for name, original in damaged.values():
            open_storage(repo_target.url, repo_target.options).write_bytes(name, original)

    # the key rotated: the new one restores, the old one is refused
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    key_file = tmp_path / "new.key"
    key_file.write_text(NEW_KEY + "\n")
    objects = {n: d for n, d in _stored(repo_target).items() if not n.startswith("reports/")}
    assert "rotated" in _ok(run_main("key", "rotate", *repo_target.cli, "--new-key-file", key_file))
    after = _stored(repo_target)
    assert {n: after[n] for n in objects if n != "walvault.key"} == \
        {n: d for n, d in objects.items() if n != "walvault.key"}  # no object re-encrypted
    _refused(run_main("backups", *repo_target.cli), ENCRYPTION_KEY, NEW_KEY)
    monkeypatch.delenv("WALVAULT_KEY")
    _ok(run_main("restore", "latest", tmp_path / "rotated", *repo_target.cli, "--key-file", key_file))
    _same_files(tmp_path / "rotated", source)
    monkeypatch.setenv("WALVAULT_KEY", NEW_KEY)
    _ok(run_main("backup", source, *repo_target.cli, "--type", "incremental"))
    assert "INTACT" in _ok(run_main("verify", *repo_target.cli))


@require_tarantool
def test_a_damaged_copy_of_a_checked_pair_is_named_by_verify_with_the_key(tmp_path, monkeypatch):
    """A manifest's or the policy's redundant copy that does not authenticate is damage to name (exit 1), as on a
    plain repository, not a reason to stop checking (found by the nemesis suite, seeds 1036 and 1018)."""
    source = _marked_instance(tmp_path / "src")
    repo = tmp_path / "repo"
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    _ok(run_main("init", "--repo", repo, "--encrypt"))
    _ok(run_main("backup", source, "--repo", repo))
    _ok(run_main("policy", "--repo", repo, "--days", "3"))
    local = SimpleNamespace(url=str(repo), options={})
    stored = _stored(local)
    copies = [n for n in sorted(stored) if n.endswith("backup.manifest.copy") or n == "walvault.policy.copy"]
    assert len(copies) == 2
    for name in copies:
        original = _flip(local, name, len(stored[name]) // 2)
        try:
            proc = run_main("verify", "--repo", repo)
            assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
            assert name in proc.stdout, (name, proc.stdout)
        finally:
            open_storage(local.url, local.options).write_bytes(name, original)


def test_init_encrypt_without_a_key_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("WALVAULT_KEY", raising=False)
    proc = run_cli("init", "--repo", tmp_path / "repo", "--encrypt")
    _refused(proc)
    assert "WALVAULT_KEY" in proc.stderr
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_a_key_given_where_a_repository_is_made_on_first_use_makes_no_plain_one(tmp_path, monkeypatch):
    """A repository made on first use (the DAGs' `repository.create`) with a key given and no encryption asked for
    is refused before anything is written: not a plain walvault.repo that every later run is refused on."""
    import pytest

    from walcore.repository import Repository, RepositoryError

    monkeypatch.delenv("WALVAULT_KEY", raising=False)
    with pytest.raises(RepositoryError, match="a key was given") as refused:
        Repository(str(tmp_path / "repo"), create=True, key=ENCRYPTION_KEY)
    assert ENCRYPTION_KEY[:6] not in str(refused.value)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


@require_tarantool
def test_a_key_given_for_a_plain_repository_is_refused_and_copy_takes_each_sides_key_apart(tmp_path, monkeypatch):
    """Whoever gives a key believes the repository encrypted: `init` without --encrypt, and a backup into a plain
    repository, given one are refused (exit 2, nothing written). `copy` opens the source with its key and the
    destination with --to-key-file only: an encrypted source copies into a plain destination, and an encrypted
    destination without its own key is refused, naming WALVAULT_TO_KEY (the source's key never stands in)."""
    source = _marked_instance(tmp_path / "src")
    monkeypatch.delenv("WALVAULT_TO_KEY", raising=False)
    monkeypatch.delenv("WALVAULT_KEY", raising=False)
    plain = tmp_path / "plain"
    _ok(run_main("init", "--repo", plain))
    made = tmp_path / "made"
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    proc = run_cli("init", "--repo", made)
    _refused(proc, ENCRYPTION_KEY)
    assert "--encrypt" in proc.stderr
    assert not made.exists()
    before = sorted(p.relative_to(plain) for p in plain.rglob("*"))
    proc = run_cli("backup", source, "--repo", plain)
    _refused(proc, ENCRYPTION_KEY)
    assert "not encrypted" in proc.stderr and "WALVAULT_KEY" in proc.stderr
    assert sorted(p.relative_to(plain) for p in plain.rglob("*")) == before

    sealed, again = tmp_path / "sealed", tmp_path / "again"
    _ok(run_main("init", "--repo", sealed, "--encrypt"))
    _ok(run_main("init", "--repo", again, "--encrypt"))
    _ok(run_main("backup", source, "--repo", sealed))
    _ok(run_main("copy", "latest", "--from", sealed, "--to", plain))  # WALVAULT_KEY opens the source only
    monkeypatch.delenv("WALVAULT_KEY")
    _ok(run_main("restore", "latest", tmp_path / "restored", "--repo", plain))
    _same_files(tmp_path / "restored", source)
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    proc = run_cli("copy", "latest", "--from", sealed, "--to", again)
    _refused(proc, ENCRYPTION_KEY)
    assert "WALVAULT_TO_KEY" in proc.stderr
    assert not [p for p in again.rglob("*.manifest")]
    monkeypatch.setenv("WALVAULT_TO_KEY", ENCRYPTION_KEY)
    _ok(run_main("copy", "latest", "--from", sealed, "--to", again))


def test_a_key_file_and_a_wrong_one_are_named_never_shown(tmp_path, monkeypatch):
    monkeypatch.delenv("WALVAULT_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(ENCRYPTION_KEY + "\n")
    repo = tmp_path / "repo"
    _ok(run_main("init", "--repo", repo, "--encrypt", "--key-file", key_file))
    _refused(run_cli("backups", "--repo", repo), ENCRYPTION_KEY)
    (tmp_path / "empty").write_text("")
    proc = run_cli("backups", "--repo", repo, "--key-file", tmp_path / "empty")
    _refused(proc, ENCRYPTION_KEY)
    assert "empty" in proc.stderr
    _ok(run_main("backups", "--repo", repo, "--key-file", key_file))
    # whatever error text would hold a key, the storage layer's redaction takes it out
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    monkeypatch.setenv("WALVAULT_NEW_KEY", NEW_KEY)
    assert open_storage(str(repo)).redact(f"a {ENCRYPTION_KEY} and a {NEW_KEY}") == "a *** and a ***"


def test_a_damaged_key_file_is_named_with_the_key_and_without(tmp_path, monkeypatch):
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    repo = tmp_path / "repo"
    _ok(run_main("init", "--repo", repo, "--encrypt"))
    data = (repo / "walvault.key").read_bytes()
    at = data.index(b'"salt": "') + 12
    (repo / "walvault.key").write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    proc = run_cli("verify", "--repo", repo)
    _refused(proc, ENCRYPTION_KEY)
    assert "walvault.key" in proc.stderr and "damaged" in proc.stderr
    monkeypatch.delenv("WALVAULT_KEY")
    proc = run_cli("verify", "--repo", repo)
    assert proc.returncode == 1 and "key_file_damaged" in proc.stdout, (proc.stdout, proc.stderr)


def _opens(target, key: str) -> bool:
    from walcore.repository import Repository, RepositoryError

    try:
        Repository(target.url, target.options, key=key).backups()
    except RepositoryError as e:
        assert "does not open" in str(e)
        return False
    return True


def test_a_rotation_killed_at_random_points_leaves_one_key_that_opens_and_finishes_when_run_again(
        repo_target, tmp_path, monkeypatch):
    source = SAMPLES / "tarantool" / "features"
    # six kills on a local path, three on S3 (each of its processes spends a second importing its S3 client before
    # it can be killed anywhere that matters): the rotation's steps are one code path over either storage
    keys = [f"passphrase number {i}" for i in range(7 if repo_target.kind == "local" else 4)]
    monkeypatch.setenv("WALVAULT_KEY", keys[0])
    _ok(run_main("init", *repo_target.cli, "--encrypt"))
    _ok(run_main("backup", source, *repo_target.cli))
    rng = random.Random(26)
    for old, new in zip(keys, keys[1:]):
        env = {**os.environ, "WALVAULT_KEY": old, "WALVAULT_NEW_KEY": new}
        proc = subprocess.Popen([*walvault_command(), "key", "rotate", *repo_target.cli], env=env, cwd=REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.2, 2.5))  # interpreter start-up, two key derivations, the replacement
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        by_old, by_new = _opens(repo_target, old), _opens(repo_target, new)
        assert by_old != by_new, (old, new)  # exactly one of the two opens it, whole
        monkeypatch.setenv("WALVAULT_KEY", old)
        monkeypatch.setenv("WALVAULT_NEW_KEY", new)
        out = _ok(run_main("key", "rotate", *repo_target.cli))
        assert ("rotated already" in out) == by_new
        assert _opens(repo_target, new) and not _opens(repo_target, old)
    monkeypatch.setenv("WALVAULT_KEY", keys[-1])
    _ok(run_main("restore", "latest", tmp_path / "restored", *repo_target.cli))
    _same_files(tmp_path / "restored", source)
    assert "INTACT" in _ok(run_main("verify", *repo_target.cli))


def test_the_stored_crc32c_trailer_is_of_every_byte_before_it(tmp_path, monkeypatch):
    from crc32c import crc32c

    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    repo = tmp_path / "repo"
    _ok(run_main("init", "--repo", repo, "--encrypt"))
    _ok(run_main("backup", SAMPLES / "tarantool" / "features", "--repo", repo))
    for p in repo.rglob("*.zst"):
        data = p.read_bytes()
        assert data[-8:-4] == b"WVT2" and data[-4:] == crc32c(data[:-8]).to_bytes(4, "big")


def test_an_encrypted_repository_sent_to_spark_executors_carries_its_keys_not_the_passphrase(tmp_path, monkeypatch):
    """A Spark job's tasks are pickled with the repository they use (pyspark's cloudpickle): its unwrapped keys go
    to the executors, the passphrase in the driver's WALVAULT_KEY (the plan file's, spark_jobs/job.py) must not.
    The driver still redacts it from error text."""
    from pyspark import cloudpickle

    from walcore.repository import Repository

    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    _ok(run_cli("init", "--repo", tmp_path / "repo", "--encrypt"))
    repo = Repository(str(tmp_path / "repo"))
    sent = cloudpickle.dumps(lambda: repo.backups())
    assert ENCRYPTION_KEY.encode() not in sent
    assert cloudpickle.loads(sent)() == []  # the executor's copy opens the repository's objects all the same
    assert repo.storage.redact(f"a {ENCRYPTION_KEY}") == "a ***"

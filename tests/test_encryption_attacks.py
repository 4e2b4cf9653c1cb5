"""Encryption at rest attacked (docs/encryption.md): a key that is no UTF-8 text is refused as such, never taken
for a damaged key file nor shown in part; a writer of the bucket who rewrites the clear walvault.repo to say
"plain" gets no backup written in clear; the Airflow copy task opens each repository with its own key."""

from __future__ import annotations

import os
import subprocess

from conftest import ENCRYPTION_KEY, REPO, run_cli, walvault_command

from walcore.repository.manifest import INFO_NAME, encode_checked
from walcore.repository.storage import open_storage

SAMPLES = REPO / "samples"


def _run(env_key: str, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "WALVAULT_KEY": env_key}
    return subprocess.run([*walvault_command(), *map(str, args)], capture_output=True, text=True, env=env, cwd=REPO,
                          stdin=subprocess.DEVNULL, timeout=300)


def test_a_key_that_is_no_utf8_text_is_refused_as_such_and_nothing_of_it_is_shown(tmp_path, monkeypatch):
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    repo = tmp_path / "repo"
    assert run_cli("init", "--repo", repo, "--encrypt").returncode == 0
    before = sorted(p.name for p in repo.iterdir())
    not_text = "Kx9\udcffsecret"  # the bytes b"Kx9\xffsecret" in the environment: no UTF-8
    for args in (("backups", "--repo", repo), ("verify", "--repo", repo),
                 ("init", "--repo", tmp_path / "other", "--encrypt")):
        proc = _run(not_text, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and "damaged" not in proc.stderr, proc.stderr
        assert "WALVAULT_KEY" in proc.stderr and "UTF-8" in proc.stderr, proc.stderr
        for hint in ("\\udcff", "\\xff", "position", "Kx9", "secret"):
            assert hint not in proc.stderr + proc.stdout, (hint, proc.stderr)
    assert sorted(p.name for p in repo.iterdir()) == before
    assert not (tmp_path / "other").exists()


def test_walvault_repo_rewritten_to_plain_is_refused_and_nothing_is_written_in_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    repo = tmp_path / "repo"
    assert run_cli("init", "--repo", repo, "--encrypt").returncode == 0
    # a writer of the storage without the key: walvault.repo and its copy are in clear and carry a plain checksum
    storage = open_storage(str(repo))
    plain = encode_checked({"format": 1, "created": "2026-01-01T00:00:00Z", "created_by": "walvault 0.1.0"})
    for name in (INFO_NAME, INFO_NAME + ".copy"):
        storage.write_bytes(name, plain)
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()}
    proc = run_cli("backup", SAMPLES / "tarantool" / "features", "--repo", repo)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "walvault.key" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file()} == before


def test_the_airflow_copy_task_opens_each_encrypted_repository_with_its_own_connections_passphrase(tmp_path,
                                                                                                    monkeypatch):
    """The source's and the destination's connections each give their passphrase: the copy takes each repository's
    own (the destination's must not stand in for the source's)."""
    import json

    from walcore.repository import Repository
    from walvault_provider.operators.walvault import WalvaultCopyOperator

    source, first, second = SAMPLES / "tarantool" / "features", tmp_path / "first", tmp_path / "second"
    keys = {first: "Hd4 the first repository's passphrase Tn2", second: "Wm8 the second one's Ks1"}
    monkeypatch.delenv("WALVAULT_TO_KEY", raising=False)  # the hook sets it: put back as it was after the test
    for repo, key in keys.items():
        monkeypatch.setenv("WALVAULT_KEY", key)
        Repository.init(str(repo), encrypt=True)
    monkeypatch.setenv("WALVAULT_KEY", keys[first])
    assert run_cli("backup", source, "--repo", first).returncode == 0
    (record,) = json.loads(run_cli("backups", "--repo", first, "--json").stdout)["backups"]
    monkeypatch.delenv("WALVAULT_KEY")
    for conn_id, repo in (("walvault_repo", first), ("walvault_repo_copy", second)):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
            {"conn_type": "walvault_repo", "extra": {"url": str(repo), "passphrase": keys[repo]}}))
    config = tmp_path / "walvault.yaml"
    config.write_text(f"sources:\n  - {{name: tt, family: tarantool, path: {source}}}\n"
                      "copy_to: walvault_repo_copy\n")
    task = WalvaultCopyOperator(task_id="copy", config_path=str(config),
                                backup_id={"id": record["id"], "source": {"path": str(source.resolve())}})
    assert task.work({})["copied"] == [record["id"]]
    monkeypatch.setenv("WALVAULT_KEY", keys[second])
    assert run_cli("verify", "--repo", second).returncode == 0
    assert run_cli("restore", record["id"], tmp_path / "restored", "--repo", second).returncode == 0


def test_a_key_file_whose_scrypt_cost_was_raised_is_refused_as_damaged_not_derived(tmp_path, monkeypatch):
    """A writer of the bucket can rewrite walvault.key's scrypt parameters (its checksum is no secret): a cost no
    walvault writes (here hours of CPU) is refused at once as damage, not derived."""
    import json

    from walcore.repository.envelope import _checksum

    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    repo = tmp_path / "repo"
    assert run_cli("init", "--repo", repo, "--encrypt").returncode == 0
    doc = json.loads((repo / "walvault.key").read_text())
    doc["kdf"]["p"] = 1 << 20
    doc["checksum"] = _checksum(doc)
    (repo / "walvault.key").write_text(json.dumps(doc))
    proc = run_cli("backups", "--repo", repo, timeout=30)
    assert proc.returncode == 2 and "walvault.key" in proc.stderr and "damaged" in proc.stderr, proc.stderr
    monkeypatch.delenv("WALVAULT_KEY")
    proc = run_cli("verify", "--repo", repo, timeout=30)
    assert proc.returncode == 1 and "key_file_damaged" in proc.stdout, (proc.stdout, proc.stderr)

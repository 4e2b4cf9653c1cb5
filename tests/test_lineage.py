"""One history at a time: a copy of a source that went on writing shares its instance, never its lineage.

Tarantool: a data dir O, a full backup B1 of it, a copy C (cp -a) started and written to with other rows (and
more of them, so that C is never behind O), both archived (the archive gets a conflict). The copy's incremental is
refused (no full backup of its own source; at O's path, diverged from O's chain); restores of O's backups use O's
history only, and refuse a point they cannot place in it; retention gives each source its own anchor.
limestone: the same with a copied log directory written to on both sides.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import require_tarantool, run_main
from test_retention_limestone import _state, _state_at
from walcore.limestone.writer import LogDir, put, remove
from walcore.repository import Repository


def _ok(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}


def _refused(proc, *words) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    for w in words:
        assert w in proc.stderr, proc.stderr
    return proc.stderr


def _vclock(v: dict[int, int]) -> str:
    return ",".join(f"{k}:{n}" for k, n in sorted(v.items()))


def _swapped(original: Path, copy_dir: Path):
    """The copy put where the original was (a cloned VM: same host, same path), and back."""
    aside = original.with_name(original.name + "-aside")
    original.rename(aside)
    copy_dir.rename(original)
    return lambda: (original.rename(copy_dir), aside.rename(original))


# -- Tarantool


def _backed_up_then_copied(root: Path) -> tuple[Path, Path, Path, str]:
    """A data dir O written by Tarantool, its full backup B1 in a new repository, then a copy C of O (cp -a):
    (O, C, the repository, B1's id)."""
    o, c, repo = root / "O", root / "C", root / "repo"
    Repository(str(repo), create=True)
    tr.generate_instance(o, wal_max_size=16384, scale=1, snapshots=1)
    b1 = _ok(run_main("backup", o, "--repo", repo, "--json"))["id"]
    subprocess.run(["cp", "-a", str(o), str(c)], check=True)
    return o, c, repo, b1


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    root = tmp_path_factory.mktemp("fork")
    o, c, repo, b1 = _backed_up_then_copied(root)
    tr.write_more(o, rows=300, snapshot=False, seed=1)
    o_point = tr.dump_data_dir(o)  # O's state at a point after B1
    tr.write_more(o, rows=300, snapshot=True, seed=3)  # B2's snapshot is past that point
    tr.write_more(c, rows=60, snapshot=True, seed=2, wal_max_size=65536)  # C's snapshot before O's point
    c_mid = tr.dump_data_dir(c)
    tr.write_more(c, rows=1200, snapshot=False, seed=4, wal_max_size=65536)
    c_end = tr.dump_data_dir(c)
    assert all(c_end["vclock"].get(k, 0) >= v for k, v in tr.dump_data_dir(o)["vclock"].items()), "C is ahead"
    _ok(run_main("archive", o, "--repo", repo))
    proc = run_main("archive", c, "--repo", repo, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["conflicts"], proc.stdout
    c_incremental = run_main("backup", c, "--repo", repo, "--type", "incremental")
    bc1 = _ok(run_main("backup", c, "--repo", repo, "--json"))["id"]
    b2 = _ok(run_main("backup", o, "--repo", repo, "--type", "incremental", "--json"))
    restore = _swapped(o, c)
    try:
        clone_incremental = run_main("backup", o, "--repo", repo, "--type", "incremental")
    finally:
        restore()
    return {"root": root, "O": o, "C": c, "repo": repo, "B1": b1, "B2": b2, "BC1": bc1, "o_point": o_point,
            "c_mid": c_mid, "c_end": c_end, "c_incremental": c_incremental, "clone_incremental": clone_incremental}


@require_tarantool
def test_an_incremental_of_a_copy_is_refused(fork):
    _refused(fork["c_incremental"], "no full backup", str(fork["C"]))
    # the original's incremental builds on its own full backup, not on the copy's newer one
    assert fork["B2"]["parent"] == fork["B1"]


@require_tarantool
def test_an_incremental_of_a_clone_at_the_same_path_is_refused_as_diverged(fork):
    _refused(fork["clone_incremental"], "diverged from its parent backup " + fork["B2"]["id"], "holds other bytes")
    ids = [b["id"] for b in _ok(run_main("backups", "--repo", fork["repo"], "--json"))["backups"]]
    assert len(ids) == 3, "nothing of the refused backups is listed"


@require_tarantool
def test_a_restore_of_the_original_to_a_point_uses_its_own_history(fork, tmp_path):
    point = _vclock(fork["o_point"]["vclock"])
    out = _ok(run_main("restore", fork["B2"]["id"], tmp_path / "r", "--repo", fork["repo"], "--to", point, "--json"))
    assert out["point"]["base"] == fork["B1"], "the copy's backup (its snapshot is before the point) is no base"
    dump = tr.dump_data_dir(tmp_path / "r")
    assert dump["vclock"] == fork["o_point"]["vclock"]
    assert dump["spaces"] == fork["o_point"]["spaces"]


@require_tarantool
def test_a_point_only_the_copy_reached_is_refused(fork, tmp_path):
    _refused(run_main("restore", fork["B2"]["id"], tmp_path / "r", "--repo", fork["repo"], "--to",
                     _vclock(fork["c_end"]["vclock"])), "cannot restore")
    assert not (tmp_path / "r").exists()


@require_tarantool
def test_past_the_fork_the_full_backup_follows_its_own_source(fork, tmp_path):
    """B1 was taken of O before the copy: both histories continue its newest xlog. Past the fork, B1's history is
    its own source's (the archive's files of O's directory): a point there restores O's rows, never C's; a point
    only C reached is refused; a point inside B1 still restores."""
    out = _ok(run_main("restore", fork["B1"], tmp_path / "r", "--repo", fork["repo"], "--to",
                      _vclock(fork["o_point"]["vclock"]), "--json"))
    assert out["point"]["base"] == fork["B1"]
    dump = tr.dump_data_dir(tmp_path / "r")
    assert dump["vclock"] == fork["o_point"]["vclock"] and dump["spaces"] == fork["o_point"]["spaces"]
    _refused(run_main("restore", fork["B1"], tmp_path / "c", "--repo", fork["repo"], "--to",
                     _vclock(fork["c_end"]["vclock"])), "cannot restore")
    b1 = next(b for b in _ok(run_main("backups", "--repo", fork["repo"], "--json"))["backups"]
              if b["id"] == fork["B1"])
    end = {int(k): v for k, v in b1["position"]["vclock"].items()}
    _ok(run_main("restore", fork["B1"], tmp_path / "r1", "--repo", fork["repo"], "--to", _vclock(end)))
    assert tr.dump_data_dir(tmp_path / "r1")["vclock"] == {k: v for k, v in end.items() if v}


@require_tarantool
def test_a_copy_archived_without_backups_never_continues_the_original(tmp_path):
    """A copy that was only archived (no backup of its own, no conflict: the original archived nothing) is
    another history all the same: a point only the copy reached is refused on the original's backup."""
    o, c, repo, b1 = _backed_up_then_copied(tmp_path)
    tr.write_more(c, rows=300, snapshot=False, seed=2)
    _ok(run_main("archive", c, "--repo", repo))
    _refused(run_main("restore", b1, tmp_path / "r", "--repo", repo, "--to",
                     _vclock(tr.dump_data_dir(c)["vclock"])), "cannot restore")
    assert not (tmp_path / "r").exists()


@require_tarantool
def test_each_copy_has_its_own_retention(fork):
    plan = _ok(run_main("expire", "--repo", fork["repo"], "--days", "1", "--json", "--as-of",
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3 * 86400))))
    (source,) = plan["sources"]
    anchors = {i["path"]: (i["anchor"] or {}).get("name") for i in source["identities"]}
    assert anchors == {str(fork["O"].resolve()): fork["B2"]["id"], str(fork["C"].resolve()): fork["BC1"]}
    deleted = {d["path"].rsplit("/", 1)[-1] for d in source["delete"]}
    assert fork["BC1"] not in deleted and fork["B2"]["id"] not in deleted
    archive = [k for k in source["keep"] if "/archive/" in k["path"]]
    assert archive and not [d for d in source["delete"] if "/archive/" in d["path"]]


@require_tarantool
def test_the_copys_incremental_builds_on_its_own_full_backup(fork, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(fork["repo"], repo)
    out = _ok(run_main("backup", fork["C"], "--repo", repo, "--type", "incremental", "--json"))
    assert out["parent"] == fork["BC1"]


# -- limestone


KEYS = [b"a", b"b", b"k\x00z", b"key-5", b"zz"]


class Writer:
    def __init__(self, root: Path, seed: int, channels: int = 2):
        self.root, self.rng, self.channels, self.minor = root, random.Random(seed), channels, 0

    def epochs(self, epochs: range) -> None:
        d = LogDir(self.root, channels=self.channels)
        for epoch in epochs:
            for ch in range(self.channels):
                entries = []
                for _ in range(self.rng.randint(1, 5)):
                    self.minor += 1
                    key, wv = self.rng.choice(KEYS), (epoch, self.minor)
                    entries.append(put(7, key, f"v{epoch}-{self.minor}-{self.rng.random()}".encode(), wv)
                                   if self.rng.random() < 0.7 else remove(7, key, wv))
                d.session(ch, epoch, entries)
            d.make_durable(epoch)
        d.close()


@pytest.fixture
def ls_fork(repo_target, tmp_path):
    o, c = tmp_path / "O", tmp_path / "C"
    repo_target.repository(create=True)
    w = Writer(o, seed=1)
    w.epochs(range(1, 6))
    assert run_main("rotate", o).returncode == 0
    _ok(run_main("archive", o, *repo_target.cli))
    snap = _ok(run_main("snapshot", o, *repo_target.cli, "--json"))["id"]
    b1 = _ok(run_main("backup", o, *repo_target.cli, "--json"))["id"]
    subprocess.run(["cp", "-a", str(o), str(c)], check=True)
    wc = copy.deepcopy(w)
    wc.root, wc.rng = c, random.Random(2)
    w.epochs(range(6, 11))
    wc.epochs(range(6, 13))
    return {"O": o, "C": c, "repo": repo_target, "B1": b1, "S": snap}


def test_limestone_incrementals_of_a_copy_are_refused(ls_fork):
    o, c, repo = ls_fork["O"], ls_fork["C"], ls_fork["repo"]
    _refused(run_main("backup", c, *repo.cli, "--type", "incremental"), "no full backup", str(c))
    b2 = _ok(run_main("backup", o, *repo.cli, "--type", "incremental", "--json"))
    assert b2["parent"] == ls_fork["B1"]
    restore = _swapped(o, c)
    try:
        _refused(run_main("backup", o, *repo.cli, "--type", "incremental"),
                 f"diverged from its parent backup {b2['id']}")
    finally:
        restore()


def test_limestone_point_past_the_backup_uses_its_own_source_only(ls_fork, tmp_path):
    o, c, repo = ls_fork["O"], ls_fork["C"], ls_fork["repo"]
    for src in (o, c):
        assert run_main("rotate", src).returncode == 0
        _ok(run_main("archive", src, *repo.cli))
    _ok(run_main("restore", ls_fork["B1"], tmp_path / "r8", *repo.cli, "--to", "8", "--json"))
    assert _state(tmp_path / "r8") == _state_at(o, 8)
    _refused(run_main("restore", ls_fork["B1"], tmp_path / "r12", *repo.cli, "--to", "12"), "reaches epoch 10")


def test_limestone_clone_at_the_same_path_is_not_mixed_in(ls_fork, tmp_path):
    """A clone at the original's path archives its own rotations of the same channels: the log is not one history
    from the first epoch both hold, and a point before it still restores."""
    o, c, repo = ls_fork["O"], ls_fork["C"], ls_fork["repo"]
    for src in (o, c):
        assert run_main("rotate", src).returncode == 0
    _ok(run_main("archive", o, *repo.cli))
    restore = _swapped(o, c)
    try:
        _ok(run_main("archive", o, *repo.cli))
    finally:
        restore()
    _refused(run_main("restore", ls_fork["B1"], tmp_path / "r7", *repo.cli, "--to", "7"), "two histories")
    _ok(run_main("restore", ls_fork["B1"], tmp_path / "r5", *repo.cli, "--to", "5", "--json"))
    assert _state(tmp_path / "r5") == _state_at(o, 5)


def test_limestone_copies_have_their_own_retention(ls_fork):
    o, c, repo = ls_fork["O"], ls_fork["C"], ls_fork["repo"]
    bc1 = _ok(run_main("backup", c, *repo.cli, "--json"))["id"]
    plan = _ok(run_main("expire", *repo.cli, "--days", "1", "--json", "--as-of",
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3 * 86400))))
    (source,) = plan["sources"]
    anchors = {i["path"]: (i["anchor"] or {}).get("name") for i in source["identities"]}
    assert anchors == {str(o.resolve()): ls_fork["S"], str(c.resolve()): None}, "O's snapshot is not the copy's"
    assert any(k["path"].endswith(bc1) for k in source["keep"])
    archive = [k for k in source["keep"] if "/archive/" in k["path"]]
    assert archive and all("two sources share the instance" in k["reason"] for k in archive)
    assert not [d for d in source["delete"] if "/archive/" in d["path"]]


def test_limestone_snapshot_of_a_copy_folds_its_own_history(ls_fork, tmp_path):
    """The copy's snapshot folds its own rotated files and the ones it shares with the original (archived once,
    from the original), never the original's later ones; it becomes the copy's anchor, not the original's."""
    o, c, repo = ls_fork["O"], ls_fork["C"], ls_fork["repo"]
    for src in (o, c):
        assert run_main("rotate", src).returncode == 0
        _ok(run_main("archive", src, *repo.cli))
    snap = _ok(run_main("snapshot", c, *repo.cli, "--json"))
    epoch = snap["position"]["epoch"]
    assert epoch == 12
    _ok(run_main("restore", snap["id"], tmp_path / "r", *repo.cli, "--json"))
    assert _state(tmp_path / "r") == _state_at(c, epoch)
    plan = _ok(run_main("expire", *repo.cli, "--days", "1", "--json", "--as-of",
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3 * 86400))))
    anchors = {i["path"]: (i["anchor"] or {}).get("name") for i in plan["sources"][0]["identities"]}
    assert anchors == {str(o.resolve()): ls_fork["S"], str(c.resolve()): snap["id"]}

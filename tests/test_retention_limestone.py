"""walvault snapshot and expire on limestone: compacted snapshots built from the archive, and retention by them.

The oracle for a state is walcore's state rule over the source's own pwal files (`build_state` at an epoch) or
`walvault state` of the source directory, never the compaction's own walk; limestone's reader rules are checked
on every stored compacted file (check_compacted), and fixture 11 holds limestone's own compacted file.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pytest

from conftest import (copy_limestone_fixture, new_repository, require_limestone, run_cli_at, run_main,
                      tree_but_leases, tree_snapshot)
from test_limestone_compact import CLEAN
from walcore.limestone.catalog import CATALOG_NAME, parse_catalog
from walcore.limestone.compact import COMPACTED_NAME, check_compacted
from walcore.limestone.layout import blob_path
from walcore.limestone.pwal import CLEAR_STORAGE, REMOVE_STORAGE
from walcore.limestone.state import build_state, format_tsv
from walcore.limestone.writer import LogDir, put, remove, storage_op

DAY = 86400
KEYS = [b"a", b"b", b"k\x00z", b"\xff" * 16, b"", b"key-5", b"\x00", b"zz"]
STORAGES = (7, 300, 70000)  # >= 256: little-endian byte order differs from numeric order


def _json(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _state(root: Path) -> str:
    proc = run_main("state", root)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _state_at(root: Path, epoch: int) -> str:
    """The source's state at an epoch: every pwal file it holds, the entries durable by then."""
    return format_tsv(build_state(sorted(root.glob("pwal_*")), epoch, set()))


class Writer:
    """Sessions of puts, removes, clears, storage removals and blob puts over several channels, epoch by epoch."""

    def __init__(self, root: Path, seed: int, channels: int = 3):
        self.root, self.rng, self.channels = root, random.Random(seed), channels
        self.minor, self.blob = 0, 0

    def epochs(self, epochs: range) -> None:
        d = LogDir(self.root, channels=self.channels)
        rng = self.rng
        for epoch in epochs:
            for ch in range(self.channels):
                entries = []
                for _ in range(rng.randint(1, 6)):
                    self.minor += 1
                    wv, sid, key, roll = (epoch, self.minor), rng.choice(STORAGES), rng.choice(KEYS), rng.random()
                    if roll < 0.55:
                        entries.append(put(sid, key, f"v{epoch}-{self.minor}".encode(), wv))
                    elif roll < 0.8:
                        entries.append(remove(sid, key, wv))
                    elif roll < 0.87:
                        entries.append(storage_op(rng.choice((CLEAR_STORAGE, REMOVE_STORAGE)), sid, wv))
                    else:
                        self.blob += 1
                        path = blob_path(self.root, self.blob)
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_bytes(f"blob {self.blob}".encode() * 20)
                        entries.append(put(sid, key, b"with-blob", wv, (self.blob,)))
                d.session(ch, epoch, entries)
            d.make_durable(epoch)
        d.close()


def _cycle(src: Path, repo: Path, *commands, at: float | None = None) -> list[dict]:
    """rotate, archive, then each command (snapshot, backup): now, or `at` (a clock moved there by faketime)."""
    def run(*args):
        return run_main(*args) if at is None else run_cli_at(at, *args)

    assert run("rotate", src).returncode == 0
    assert run("archive", src, "--repo", repo).returncode == 0
    return [_json(run(c, src, "--repo", repo, "--json")) for c in commands]


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """epochs 1-5, S1; 6-10, F1 (full backup); 11-15, S2; [mid]; 16-20 archived; 21-23 still active."""
    root = tmp_path_factory.mktemp("limestone-retention")
    src, repo = root / "src", new_repository(root / "repo")
    # The phases' clocks, 10 s apart (longer than a command takes): their manifests' times differ without
    # waiting. In the past: a repository whose records are ahead of the clock refuses the tests' applies.
    start = time.time() - 60
    w = Writer(src, seed=13)
    w.epochs(range(1, 6))
    (s1,) = _cycle(src, repo, "snapshot", at=start)
    w.epochs(range(6, 11))
    (f1,) = _cycle(src, repo, "backup", at=start + 10)
    w.epochs(range(11, 16))
    (s2,) = _cycle(src, repo, "snapshot", at=start + 20)
    mid = start + 30
    w.epochs(range(16, 21))
    _cycle(src, repo, at=start + 40)
    w.epochs(range(21, 24))
    return {"src": src, "repo": repo, "S1": s1, "F1": f1, "S2": s2, "mid": mid, "done": time.time()}


@pytest.fixture
def repo(history, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(history["repo"], copy)
    return copy


def _restore(repo, backup_id, target, *to) -> dict:
    return _json(run_main("restore", backup_id, target, "--repo", repo, "--json",
                          *(["--to", str(to[0])] if to else [])))


def _stored_compaction(repo: Path, snapshot_id: str, tmp_path: Path) -> Path:
    target = tmp_path / f"snap-{snapshot_id}"
    _restore(repo, snapshot_id, target)
    return target


@require_limestone
def test_a_snapshot_is_a_compacted_file_in_limestones_format(history, tmp_path):
    repo, src = history["repo"], history["src"]
    for key, epoch in (("S1", 5), ("S2", 15)):
        snap = history[key]
        assert snap["type"] == "snapshot" and snap["position"] == {"epoch": epoch}
        assert snap["covers"]["epoch"] == epoch
        restored = _stored_compaction(repo, snap["id"], tmp_path)
        names = sorted(p.name for p in restored.iterdir())
        assert {COMPACTED_NAME, CATALOG_NAME, "limestone-manifest.json", "epoch"} <= set(names)
        assert not [n for n in names if n.startswith("pwal_") and n != COMPACTED_NAME], "the log is folded"
        assert check_compacted(restored / COMPACTED_NAME) == []
        catalog = parse_catalog((restored / CATALOG_NAME).read_bytes())
        assert catalog.compacted_files == {COMPACTED_NAME: 1}
        assert catalog.max_epoch_id == epoch
        assert sorted(catalog.detached_pwals) == snap["covers"]["detached"]
        assert set(snap["covers"]["folded"]) <= set(catalog.detached_pwals)
        blobs_by_then = [int(p.stem, 16) for p in src.rglob("*.blob")]
        if key == "S2":  # every blob was written by epoch 15's end or later; S2 folded all of 1-15
            assert catalog.max_blob_id >= max(b for b in blobs_by_then if b <= catalog.max_blob_id)
        assert (restored / "limestone-manifest.json").read_bytes() == (src / "limestone-manifest.json").read_bytes()
        # the snapshot alone is the source's state at its epoch; limestone's check passes it
        assert _state(restored) == _state_at(src, epoch)
        assert run_main("verify", restored).returncode == 0
    assert set(history["S1"]["covers"]["folded"]) < set(history["S2"]["covers"]["detached"])
    assert history["S2"]["covers"]["previous"] == history["S1"]["id"]


@require_limestone
def test_a_snapshot_and_the_log_after_it_restore_the_source(history, tmp_path):
    repo, src = history["repo"], history["src"]
    for point in (15, 17, 20):
        result = _restore(repo, history["S2"]["id"], tmp_path / f"r{point}", point)
        assert result["point"]["base"] == history["S2"]["id"]
        assert (result["point"]["archived_files"] > 0) == (point > 15), "the log after the snapshot is the archive's"
        assert _state(tmp_path / f"r{point}") == _state_at(src, point)


@require_limestone
@pytest.mark.parametrize("name", CLEAN)
def test_every_clean_fixture_snapshots_to_its_own_state(name, tmp_path):
    src = copy_limestone_fixture(name, tmp_path, "src")
    repo = new_repository(tmp_path / "repo")
    expected = _state(src)
    rotate = run_main("rotate", src)
    if rotate.returncode != 0:  # 13 refers to a blob it does not hold: nothing of it is archived, so no snapshot
        assert "does not exist" in rotate.stderr
        run_main("archive", src, "--repo", repo)
        proc = run_main("snapshot", src, "--repo", repo)
        assert proc.returncode == 1 and "no snapshot" in proc.stderr
        return
    (snap,) = _cycle(src, repo, "snapshot")
    before = tree_snapshot(src)
    restored = tmp_path / "r"
    durable = json.loads(run_main("inspect", src, "--json").stdout)["dirs"][0]["durable_epoch"]
    _restore(repo, snap["id"], restored, durable)
    assert _state(restored) == expected
    assert check_compacted(restored / COMPACTED_NAME) == []
    assert tree_snapshot(src) == before, "the restore wrote to the source"


@require_limestone
def test_fixture_11_limestones_own_compaction_is_the_base(tmp_path):
    """Its detached files deleted by an operator: their keys are only in limestone's compacted file."""
    src = copy_limestone_fixture("11-online-compaction", tmp_path, "src")
    expected = _state(src)
    theirs = parse_catalog((src / CATALOG_NAME).read_bytes())
    for name in theirs.detached_pwals:
        (src / name).unlink()
    assert _state(src) == expected
    repo = new_repository(tmp_path / "repo")
    (snap,) = _cycle(src, repo, "snapshot")
    restored = tmp_path / "r"
    _restore(repo, snap["id"], restored)
    catalog = parse_catalog((restored / CATALOG_NAME).read_bytes())
    assert set(theirs.detached_pwals) <= set(catalog.detached_pwals)
    assert catalog.max_blob_id >= theirs.max_blob_id and catalog.compacted_files == {COMPACTED_NAME: 1}
    assert json.loads((restored / "limestone-manifest.json").read_text())["instance_uuid"] == json.loads(
        (src / "limestone-manifest.json").read_text())["instance_uuid"]
    assert list(restored.rglob("*.blob")), "the blob its compacted file references is carried"
    assert _state(restored) == expected
    assert check_compacted(restored / COMPACTED_NAME) == [] and check_compacted(src / COMPACTED_NAME) == []


@require_limestone
def test_nothing_new_to_fold_is_said(history, tmp_path):
    src, repo = tmp_path / "src", tmp_path / "repo"
    shutil.copytree(history["src"], src)
    shutil.copytree(history["repo"], repo)
    assert run_main("snapshot", src, "--repo", repo).returncode == 0  # folds 16-20
    proc = run_main("snapshot", src, "--repo", repo)
    assert proc.returncode == 1 and "still covers" in proc.stderr


@require_limestone
def test_expiry_deletes_what_the_anchor_folded_and_every_window_point_restores(repo, history, tmp_path):
    src = history["src"]
    as_of = history["mid"] + 30 * DAY  # an apply runs on a clock at its --as-of, never behind it
    result = _json(run_cli_at(as_of, "expire", "--repo", repo, "--days", "30", "--as-of", _iso(as_of), "--apply",
                              "--json"))
    (source,) = result["sources"]
    assert source["anchor"]["name"] == history["S2"]["id"] and source["anchor"]["position"] == {"epoch": 15}
    detached = set(history["S2"]["covers"]["detached"])
    gone = {Path(d["path"]).name.removesuffix(".zst") for d in source["delete"]}
    pwals_gone = {n for n in gone if n.startswith("pwal_")}
    assert pwals_gone == detached, "exactly the files the anchor folded"
    epochs_gone = {n for n in gone if n.startswith("epoch.")}
    assert epochs_gone and all(int(n.split(".")[-1]) <= 15 for n in epochs_gone)
    archive = {p.name.removesuffix(".zst") for p in repo.rglob("archive/*.zst")}
    assert not archive & gone and any(n.startswith("pwal_") for n in archive), "the log after the anchor stays"
    backups = {b["id"] for b in json.loads(run_main("backups", "--repo", repo, "--json").stdout)["backups"]}
    assert backups == {history["S2"]["id"], history["F1"]["id"]}, "S1 expired; F1 is the newest full backup"
    # every point of the window (the window starts at the anchor's epoch here) restores from what is left
    for point in range(15, 21):
        target = tmp_path / f"p{point}"
        _restore(repo, "latest", target, point)
        assert _state(target) == _state_at(src, point), point
    target = tmp_path / "f1"
    _restore(repo, history["F1"]["id"], target)
    assert _state(target) == _state_at(src, 10)


@require_limestone
def test_an_uncovered_limestone_source_keeps_everything(history, tmp_path):
    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    shutil.copytree(history["src"], src)
    assert run_main("archive", src, "--repo", repo).returncode == 0
    before = tree_snapshot(repo)
    result = _json(run_main("expire", "--repo", repo, "--days", "30", "--as-of", _iso(history["done"] + 400 * DAY),
                           "--json"))
    (source,) = result["sources"]
    assert source["anchor"] is None and source["delete"] == []
    assert tree_snapshot(repo) == before


@require_limestone
def test_after_expiry_an_older_base_never_restores_a_wrong_state(repo, history, tmp_path):
    """F1 is kept, but the files after it that the anchor folded are gone: past F1 the anchor is the base, and a
    point only F1 could have reached is refused, never restored wrong."""
    src = history["src"]
    as_of = history["mid"] + 30 * DAY
    _json(run_cli_at(as_of, "expire", "--repo", repo, "--days", "30", "--as-of", _iso(as_of), "--apply", "--json"))
    for point in (15, 17, 20):
        result = _restore(repo, history["F1"]["id"], tmp_path / f"p{point}", point)
        assert result["point"]["base"] == history["S2"]["id"]
        assert _state(tmp_path / f"p{point}") == _state_at(src, point)
    proc = run_main("restore", history["F1"]["id"], tmp_path / "p12", "--repo", repo, "--to", "12")
    assert proc.returncode == 1 and "retention deleted" in proc.stderr
    assert not (tmp_path / "p12").exists()


@require_limestone
def test_a_channel_left_active_bounds_what_the_archive_restores(tmp_path):
    """A rotation that skips a small channel: the archived epoch files say epoch 6 is durable, but channel 1's
    entries of epochs 4-6 are not archived, so a point past 3 is refused rather than restored without them."""
    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    w = Writer(src, seed=5, channels=2)
    w.epochs(range(1, 4))
    (snap,) = _cycle(src, repo, "snapshot")
    d = LogDir(src, channels=2)
    for epoch in range(4, 7):
        d.session(0, epoch, [put(7, b"big", b"x" * 400, (epoch, 1))])
        d.session(1, epoch, [put(7, f"small{epoch}".encode(), b"s", (epoch, 2))])
        d.make_durable(epoch)
    d.close()
    assert run_main("rotate", src, "--min-bytes", "300").returncode == 0
    assert (src / "pwal_0001").stat().st_size > 0, "the small channel stays active"
    assert run_main("archive", src, "--repo", repo).returncode == 0
    proc = run_main("restore", snap["id"], tmp_path / "r5", "--repo", repo, "--to", "5")
    assert proc.returncode == 1 and "every channel archived up to epoch 3" in proc.stderr
    _restore(repo, snap["id"], tmp_path / "r3", 3)
    assert _state(tmp_path / "r3") == _state_at(src, 3)
    # once the channel is rotated and archived, the points are there
    assert run_main("rotate", src).returncode == 0 and run_main("archive", src, "--repo", repo).returncode == 0
    _restore(repo, snap["id"], tmp_path / "r5b", 5)
    assert _state(tmp_path / "r5b") == _state_at(src, 5)


@require_limestone
def test_a_snapshot_is_refused_while_a_manifest_cannot_be_read(history, tmp_path):
    src, repo = tmp_path / "src", tmp_path / "repo"
    shutil.copytree(history["src"], src)
    shutil.copytree(history["repo"], repo)
    for name in ("backup.manifest", "backup.manifest.copy"):
        path = next(repo.glob(f"limestone/*/backups/{history['S2']['id']}")) / name
        path.write_bytes(path.read_bytes().replace(b'"snapshot"', b'"snapsh0t"'))
    before = tree_but_leases(repo)
    proc = run_main("snapshot", src, "--repo", repo)
    assert proc.returncode == 1 and history["S2"]["id"] in proc.stderr and "cannot be read" in proc.stderr
    assert tree_but_leases(repo) == before


@require_limestone
def test_an_archive_conflict_is_kept_until_resolved(tmp_path):
    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    w = Writer(src, seed=9, channels=1)
    w.epochs(range(1, 4))
    (snap,) = _cycle(src, repo, "snapshot")
    rotated = next(src.glob("pwal_0000.*"))
    data = bytearray(rotated.read_bytes())
    data[-1] ^= 0x01  # other bytes under the same name (a value's last byte)
    rotated.write_bytes(bytes(data))
    assert run_main("archive", src, "--repo", repo).returncode == 1  # the conflict
    result = _json(run_main("expire", "--repo", repo, "--days", "1", "--as-of", _iso(time.time() + 3 * DAY),
                           "--json"))
    (source,) = result["sources"]
    assert source["anchor"]["name"] == snap["id"]
    assert not [d for d in source["delete"] if rotated.name in d["path"]]
    kept = [k for k in source["keep"] if rotated.name in k["path"]]
    assert len(kept) == 2 and all("conflict" in k["reason"] for k in kept)
    assert not [d for d in source["delete"] if "/archive/" in d["path"]], "two histories: nothing of the archive"


@require_limestone
def test_a_refused_damaged_file_holds_back_what_the_archive_restores(tmp_path):
    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    w = Writer(src, seed=21, channels=1)
    w.epochs(range(1, 4))
    (snap,) = _cycle(src, repo, "snapshot")
    w.epochs(range(4, 7))
    assert run_main("rotate", src).returncode == 0
    damaged = max(src.glob("pwal_0000.*"))
    data = bytearray(damaged.read_bytes())
    data[0] = 0xEE  # an unknown entry type: limestone cannot read the file
    damaged.write_bytes(bytes(data))
    assert run_main("archive", src, "--repo", repo).returncode == 1  # refused, the epoch file archived
    proc = run_main("restore", snap["id"], tmp_path / "r", "--repo", repo, "--to", "5")
    assert proc.returncode == 1 and "before the point 5" in proc.stderr
    assert not (tmp_path / "r").exists()


@require_limestone
def test_files_limestones_own_compaction_folded_and_an_operator_deleted(tmp_path):
    """Their keys are only in the source's compacted file: a restore from an older backup past them is refused,
    and so is a snapshot built over an archive that never held them."""
    from walcore.limestone.compact import compact

    src, repo = tmp_path / "src", new_repository(tmp_path / "repo")
    w = Writer(src, seed=23, channels=1)
    w.epochs(range(1, 4))
    assert run_main("rotate", src).returncode == 0 and run_main("archive", src, "--repo", repo).returncode == 0
    (snap,) = [_json(run_main("snapshot", src, "--repo", repo, "--json"))]
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    w.epochs(range(4, 7))
    assert run_main("rotate", src).returncode == 0
    folded = [p for p in src.glob("pwal_0000.*") if p.name not in snap["covers"]["detached"]]
    assert not (src / CATALOG_NAME).exists()
    staging = tmp_path / "staging"  # limestone's online compaction, standing in: its compacted file and catalog
    compact(folded, 6, staging)
    for name in (COMPACTED_NAME, CATALOG_NAME):
        shutil.copyfile(staging / name, src / name)
    for p in folded:
        p.unlink()  # the operator deletes what the compaction detached, before it was archived
    w.epochs(range(7, 10))
    assert run_main("rotate", src).returncode == 0 and run_main("archive", src, "--repo", repo).returncode == 0
    proc = run_main("restore", full["id"], tmp_path / "r", "--repo", repo, "--to", "8")
    assert proc.returncode == 1 and "never archived" in proc.stderr, proc.stderr
    proc = run_main("snapshot", src, "--repo", repo)
    assert proc.returncode == 1 and "own compaction folded" in proc.stderr

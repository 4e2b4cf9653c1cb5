"""Backups of limestone log directories, proven by restoring them: `walvault state` of the restore must equal
that of the source (byte for byte), and the restore must verify intact.

Sources: the real directories of shared/fixtures/limestone (what to expect of each comes from the README's
table of `tglogutil inspect` results), and workloads written here session by session with walcore's
`LogDir`, each with its own model of the state at every epoch (kept by this file from the operations it
wrote, without walcore). Repositories: a local path and a bucket of a real S3 API on 127.0.0.1
(`repo_target`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import struct
from pathlib import Path

import pytest

from conftest import (LIMESTONE_FIXTURES, RepoTarget, copy_limestone_fixture, limestone_readme_table, new_repository,
                      require_limestone, run_main, tree_snapshot)
from limestone_bytes import walk
from walcore.limestone import writer
from walcore.limestone.pwal import ADD_STORAGE, CLEAR_STORAGE, REMOVE_STORAGE
from walcore.limestone.writer import LogDir

MANIFEST = "limestone-manifest.json"
TABLE = limestone_readme_table() if (LIMESTONE_FIXTURES / "README.md").is_file() else {}
MUTABLE_KINDS = {"pwal", "epoch", "catalog", "compacted", "manifest"}
SEALED_KINDS = {"pwal_rotated", "epoch_rotated", "blob"}


# --------------------------------------------------------------------------- helpers


def _json(proc):
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def state(path: Path) -> str:
    proc = run_main("state", path, "--format", "tsv")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def verify(path: Path) -> tuple[int, dict]:
    proc = run_main("verify", path, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["dirs"][0]


def backup(src: Path, target, *args) -> dict:
    return _json(run_main("backup", src, *target.cli, "--json", *args))


def restore(backup_id: str, dest: Path, target, *args) -> dict:
    return _json(run_main("restore", backup_id, dest, *target.cli, "--json", *args))


def tsv(rows: dict) -> str:
    """{(storage, key): value} as `walvault state --format tsv` prints it: sorted by storage, then key bytes."""
    return "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for (s, k), v in sorted(rows.items()))


def files_of(root: Path) -> dict[str, str]:
    """Every file under root (relative name -> sha256)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def limestone_files(root: Path) -> dict[str, str]:
    """The files a backup of a limestone directory holds: everything but data/, compaction_temp/, ctrl/."""
    return {n: h for n, h in files_of(root).items() if n.split("/")[0] not in ("data", "compaction_temp", "ctrl")}


def assert_nothing_recorded(target) -> None:
    """No backup listed, and no object left under limestone/ (no stored file, no ledger entry)."""
    from walcore.command.repo_verify import list_backups

    repo = target.repository(create=False)
    assert list_backups(repo) == []
    assert repo.storage.list("limestone") == []


def assert_refused(proc, code: int, *words: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert proc.stderr.startswith("walvault: not "), proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


def missing_blobs(root: Path) -> set[int]:
    """Blob ids durable puts (type 10) refer to whose file is in neither blob/dir_NN/ nor (flat) at the top."""
    refs = set()
    for p in root.iterdir():
        if p.name.startswith("pwal_"):
            data = p.read_bytes()
            for off, t, f in walk(data):
                if t == 10:
                    klen, vlen = struct.unpack_from("<II", data, off + 1)
                    at = off + 33 + klen + vlen
                    (n,) = struct.unpack_from("<I", data, at)
                    refs.update(struct.unpack_from(f"<{n}Q", data, at + 4))
    return {b for b in refs if not (root / "blob" / f"dir_{b % 100:02d}" / f"{b:016x}.blob").exists()
            and not (root / f"{b:016x}.blob").exists()}


def header_epochs(path: Path) -> list[int]:
    return [f["epoch"] for _, t, f in walk(path.read_bytes()) if t in (2, 6)]


# --------------------------------------------------------------------------- a workload and its model


class Workload:
    """A limestone directory written with LogDir, session by session, and the model of what it holds.

    Write versions are (epoch, n) with n growing over the whole workload, so the state at epoch E is the
    operations of epochs <= E applied in the order they were written."""

    STORAGES = (10, 11, 256, 1 << 40)

    def __init__(self, path: Path, *, uuid: str, channels: int = 3, seed: int = 1):
        self.path, self.uuid, self.channels = Path(path), uuid, channels
        self.rng = random.Random(seed)
        self.ops: list[tuple[int, int, str, int, bytes, bytes]] = []  # (epoch, n, kind, storage, key, value)
        self.n = 0
        self.next_blob = 1
        self.keys = {s: [b"", b"\x00", b"\xff" * 9, b"k\x00z", b"a", b"b"] + [self.rng.randbytes(5) for _ in range(6)]
                     for s in self.STORAGES}
        self.log: LogDir | None = None
        self.open()

    def open(self) -> None:
        self.log = LogDir(self.path, channels=self.channels)
        (self.path / MANIFEST).write_bytes(writer.manifest_bytes(7, self.uuid))

    def close(self) -> None:
        self.log.close()
        self.log = None

    def rotate(self) -> None:
        """What limestone's online backup does first: detach the active pwal files and the epoch file."""
        self.close()
        proc = run_main("rotate", self.path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        self.open()

    def _wv(self, epoch: int) -> tuple[int, int]:
        self.n += 1
        return epoch, self.n

    def op(self, epoch: int, kind: str | None = None, storage: int | None = None) -> bytes:
        rng = self.rng
        if kind is None:
            kind = rng.choices(["put", "remove", "blob", "clear"], [70, 20, 8, 2])[0]
        storage = storage if storage is not None else rng.choice(self.STORAGES)
        key = rng.choice(self.keys[storage])
        wv = self._wv(epoch)
        if kind in ("put", "blob"):
            value = rng.randbytes(rng.choice((0, 1, 7, 40, 300, 5000)))
            blobs = ()
            if kind == "blob":
                blob_id = self.next_blob
                self.next_blob += 1
                blob = self.path / "blob" / f"dir_{blob_id % 100:02d}" / f"{blob_id:016x}.blob"
                blob.parent.mkdir(parents=True, exist_ok=True)
                blob.write_bytes(rng.randbytes(rng.randint(1, 3000)))
                blobs = (blob_id,)
            self.ops.append((epoch, wv[1], "put", storage, key, value))
            return writer.put(storage, key, value, wv, blobs)
        if kind == "remove":
            self.ops.append((epoch, wv[1], "remove", storage, key, b""))
            return writer.remove(storage, key, wv)
        code = {"clear": CLEAR_STORAGE, "remove_storage": REMOVE_STORAGE, "add_storage": ADD_STORAGE}[kind]
        self.ops.append((epoch, wv[1], kind, storage, b"", b""))
        return writer.storage_op(code, storage, wv)

    def epoch(self, epoch: int, *, extra: list[tuple[str, int]] = (), durable: bool = True) -> None:
        """Sessions of `epoch` on some channels (random operations, plus `extra` (kind, storage) ones), then the
        durable-epoch record (unless not durable)."""
        chosen = sorted(self.rng.sample(range(self.channels), self.rng.randint(1, self.channels)))
        sessions = {ch: [self.op(epoch) for _ in range(self.rng.randint(1, 6))] for ch in chosen}
        for kind, storage in extra:
            sessions[chosen[0]].append(self.op(epoch, kind, storage))
        for ch, entries in sessions.items():
            self.log.session(ch, epoch, entries)
        if durable:
            self.log.make_durable(epoch)

    def rows_at(self, epoch: int) -> dict:
        rows: dict[tuple[int, bytes], bytes] = {}
        for e, _n, kind, storage, key, value in sorted(self.ops):
            if e > epoch:
                break
            if kind == "put":
                rows[(storage, key)] = value
            elif kind == "remove":
                rows.pop((storage, key), None)
            elif kind in ("clear", "remove_storage"):
                for k in [k for k in rows if k[0] == storage]:
                    del rows[k]
        return rows

    def state_at(self, epoch: int) -> str:
        return tsv(self.rows_at(epoch))


def phase_a(w: Workload) -> None:
    """Epochs 1-5: storage 11 cleared in 3, storage 256 removed in 4 and re-added in 5, blobs; rotated after 3."""
    w.epoch(1, extra=[("add_storage", s) for s in Workload.STORAGES] + [("blob", 10)])
    w.epoch(2, extra=[("put", 11), ("put", 11), ("blob", 256)])
    w.epoch(3, extra=[("clear", 11), ("put", 11)])
    w.rotate()
    w.epoch(4, extra=[("remove_storage", 256), ("blob", 10)])
    w.epoch(5, extra=[("add_storage", 256), ("put", 256)])
    w.close()


def phase_b(w: Workload) -> None:
    """Epochs 6-8 after a restart: appended to the active files, a rotation, one more epoch with a blob."""
    w.open()
    w.epoch(6, extra=[("remove", 10)])
    w.epoch(7, extra=[("blob", 11)])
    w.rotate()
    w.epoch(8, extra=[("clear", 10)])
    w.close()


# --------------------------------------------------------------------------- 1. the real fixtures


def _fixture_cases():
    return sorted(TABLE)


@require_limestone
def test_readme_table_is_understood():
    assert {"01-clean", "02-unfinished", "10-backup-copy", "11-online-compaction", "20-random-small"} <= set(TABLE)
    assert {row["status"] for row in TABLE.values()} <= {"OK", "auto-repairable", "unrepairable"}


@require_limestone
@pytest.mark.parametrize("name", _fixture_cases())
def test_fixture_backup_and_restore(name, repo_target, tmp_path):
    """tglogutil OK (and every blob a durable put refers to present): backed up whole, restored to the same
    state; anything else refused with exit 1 and nothing recorded."""
    repo_target.repository(create=True)
    row = TABLE[name]
    src = copy_limestone_fixture(name, tmp_path)
    before = tree_snapshot(src)
    lost = missing_blobs(src)
    proc = run_main("backup", src, *repo_target.cli, "--json")
    assert tree_snapshot(src) == before, "the backup wrote to the source"
    if row["status"] != "OK":
        if row["status"] == "auto-repairable":
            assert_refused(proc, 1, "not backed up", "repairable", "walvault repair")
        else:
            assert_refused(proc, 1, "not backed up", "unrepairable")
        # the reason: the file and what is wrong in it, where
        assert any(f"{n}: {code} at " in proc.stderr for n in os.listdir(src) if n.startswith("pwal_")
                   for code in ("nondurable_snippet", "broken_tail", "corrupted_durable_snippet")), proc.stderr
        assert_nothing_recorded(repo_target)
        return
    if lost:
        # tglogutil does not look at blobs; limestone would start, but the row's blob is gone for good: a backup of
        # it would not give back what limestone wrote.
        assert name == "13-v1-manifest-migrated-by-inspect"
        assert_refused(proc, 1, "not backed up", "blob")
        assert_nothing_recorded(repo_target)
        return
    result = _json(proc)
    assert result["type"] == "full" and result["family"] == "limestone"
    assert result["position"] == {"epoch": row["durable_epoch"]}
    expected_state = state(src)
    if name == "20-random-small":
        assert expected_state.encode() == (LIMESTONE_FIXTURES / "20-random-small.state.tsv").read_bytes()

    dest = tmp_path / "restored"
    out = restore(result["id"], dest, repo_target)
    assert out["backup"] == result["id"]
    rc, d = verify(dest)
    assert (rc, d["status"], d["durable_epoch"], d["count_durable_wal_entries"]) == (
        0, "ok", row["durable_epoch"], row["count"])
    assert d["findings"] == []
    assert state(dest) == expected_state
    # every file limestone reads, byte for byte; blobs kept flat by an online-backup copy land in blob/dir_NN/
    source_files = limestone_files(src)
    expected_files = {}
    for n, h in source_files.items():
        if "/" not in n and n.endswith(".blob"):
            blob_id = int(n.split(".")[0], 16)
            n = f"blob/dir_{blob_id % 100:02d}/{n}"
        expected_files[n] = h
    assert files_of(dest) == expected_files
    assert not any("/" not in n and n.endswith(".blob") for n in files_of(dest))
    assert tree_snapshot(src) == before


# --------------------------------------------------------------------------- 2. generated workloads, incrementals


def test_full_then_incremental(repo_target, tmp_path):
    repo_target.repository(create=True)
    src = tmp_path / "src"
    w = Workload(src, uuid="11111111-2222-4333-8444-555555555555", seed=7)
    phase_a(w)
    state_a = state(src)
    assert state_a == w.state_at(5) and state_a.count("\n") > 5
    files_a = limestone_files(src)
    assert any(".blob" in n for n in files_a) and any(n.startswith("epoch.") for n in files_a)
    before = tree_snapshot(src)
    full = backup(src, repo_target)
    assert tree_snapshot(src) == before
    assert full["type"] == "full" and full["position"] == {"epoch": 5}

    phase_b(w)
    state_b = state(src)
    assert state_b == w.state_at(8) and state_b != state_a
    files_b = limestone_files(src)
    before = tree_snapshot(src)
    incr = backup(src, repo_target, "--type", "incremental")
    assert tree_snapshot(src) == before
    assert incr["type"] == "incremental" and incr["parent"] == full["id"] and incr["position"] == {"epoch": 8}

    # only what is new or changed since the full is stored; the rest points at the full's objects
    repo = repo_target.repository(create=False)
    full_m = repo.find(full["id"]).manifest
    incr_m = repo.find(incr["id"]).manifest
    assert {e.name: e.sha256 for e in incr_m.files} == files_b
    by_name = {e.name: e for e in full_m.files}
    changed = {n for n, h in files_b.items() if files_a.get(n) != h}
    assert changed and changed != set(files_b)
    own = {e.name for e in incr_m.files if e.reference is None}
    assert own == changed, (own ^ changed)
    for e in incr_m.files:
        if e.reference is not None:
            assert e.reference == full["id"]
            assert e.stored == by_name[e.name].stored and e.stored_sha256 == by_name[e.name].stored_sha256
            assert e.stored.startswith(f"limestone/{full_m.instance}/backups/{full['id']}/")
    listed = {b["id"]: b for b in _json(run_main("backups", *repo_target.cli, "--json"))["backups"]}
    assert listed[incr["id"]]["stored_bytes"] == incr["stored_bytes"] == sum(
        e.stored_size for e in incr_m.files if e.reference is None)
    assert 0 < incr["stored_bytes"] < sum(e.stored_size for e in incr_m.files)
    # the sealed files of the full (rotated pwal and epoch files, blobs) are all still there, none stored again
    sealed_a = {e.name for e in full_m.files if e.kind in SEALED_KINDS}
    assert sealed_a and sealed_a <= set(files_b) and not sealed_a & own

    restored_b = tmp_path / "restored-b"
    restore(incr["id"], restored_b, repo_target)
    assert state(restored_b) == state_b
    assert verify(restored_b)[0] == 0
    assert files_of(restored_b) == files_b
    restored_a = tmp_path / "restored-a"
    assert restore(full["id"], restored_a, repo_target)["backup"] == full["id"]
    assert state(restored_a) == state_a
    assert verify(restored_a)[0] == 0
    assert files_of(restored_a) == files_a
    assert _json(run_main("verify", *repo_target.cli, "--json"))["intact"] is True


def test_incremental_of_unchanged_source_stores_only_what_is_rewritten(tmp_path):
    """Nothing changed: the incremental stores nothing (mutable files are compared by content)."""
    src = tmp_path / "src"
    w = Workload(src, uuid="21111111-2222-4333-8444-555555555555", seed=3)
    phase_a(w)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    incr = _json(run_main("backup", src, "--repo", repo, "--type", "incremental", "--json"))
    assert incr["stored_bytes"] == 0 and incr["files"] == full["files"]


# --------------------------------------------------------------------------- 3. point in time


def test_point_in_time(repo_target, tmp_path):
    repo_target.repository(create=True)
    src = tmp_path / "src"
    w = Workload(src, uuid="31111111-2222-4333-8444-555555555555", seed=11)
    phase_a(w)
    w.open()
    for e in (7, 9, 10):  # gaps: 6 and 8 have no session
        w.epoch(e, extra=[("remove", 10), ("put", 11)])
    w.close()
    assert state(src) == w.state_at(10)
    full = backup(src, repo_target)
    assert full["position"] == {"epoch": 10}
    # 2: inside the first rotated files; 3: the first rotation's epoch; 8: a gap between the sessions of 7 and 9
    points = {"0": 0, "epoch:2": 2, "3": 3, "8": 8, "10": 10}
    assert len({w.state_at(p) for p in points.values()}) == len(points), "the points must give different states"
    assert w.state_at(8) == w.state_at(7) != w.state_at(9)
    for text, point in points.items():
        dest = tmp_path / f"at-{point}"
        out = restore(full["id"], dest, repo_target, "--to", text)
        assert out["point"]["durable_epoch"] == point
        assert state(dest) == w.state_at(point), point
    # limestone cancels the snippets past the point when it starts (repair_by_mark, as repair does): same state
    dest = tmp_path / "at-3"
    rc, d = verify(dest)
    assert (rc, d["status"], d["durable_epoch"], d["max_appeared_epoch"]) == (1, "repairable", 3, 10)
    assert {f["code"] for f in d["findings"]} <= {"nondurable_snippet"}
    assert run_main("repair", dest, "--apply").returncode == 0
    rc, d = verify(dest)
    assert (rc, d["status"]) == (0, "ok")
    assert state(dest) == w.state_at(3)

    proc = run_main("restore", full["id"], tmp_path / "past", *repo_target.cli, "--to", "11")
    assert_refused(proc, 1, "not restored", "reaches epoch 10", "11")
    proc = run_main("restore", full["id"], tmp_path / "time", *repo_target.cli, "--to", "2026-11-22T10:00:00Z")
    assert_refused(proc, 1, "not restored", "epoch number", "no time")
    assert not (tmp_path / "past").exists() and not (tmp_path / "time").exists()
    assert not [p for p in tmp_path.iterdir() if "walvault-restore" in p.name]


@require_limestone
def test_point_in_time_refusals(tmp_path):
    """A time (limestone records none per epoch), a point past the backup, and digits str.isdigit takes but int()
    does not ('²', an Arabic-Indic three): each refused with its reason (no traceback), nothing written."""
    src = copy_limestone_fixture("01-clean", tmp_path)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    cases = {"4": "reaches epoch 3", "99999999999999999999999": "reaches epoch 3", "@1795335762": "no time"}
    for point, why in cases.items():
        proc = run_main("restore", full["id"], tmp_path / "out", "--repo", repo, "--to", point)
        assert_refused(proc, 1, "not restored", why)
    for point in ("2026-11-22", "-1", "epoch:", "\u00b2", "\u0663", "3\u00b2"):  # no point at all: a bad command line
        proc = run_main("restore", full["id"], tmp_path / "out", "--repo", repo, "--to", point)
        assert (proc.returncode, proc.stderr.count("\n")) == (2, 1), proc.stderr
        assert proc.stderr.startswith(f"walvault: --to {point!r} is not a point") and "epoch:N" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01-clean", "repo"]


def _expected_rows_at(root: Path, epoch: int, covered: set[str]) -> dict:
    """The state at `epoch` read straight from the bytes: the compacted file's puts as the base, then every
    durable entry of the other pwal files (headers 2 of epoch <= `epoch`) in write-version order."""
    rows: dict = {}
    ops = []
    for p in sorted(root.iterdir()):
        if not p.name.startswith("pwal_") or p.name in covered:
            continue
        if p.name.endswith(".compacted"):
            for _, t, f in walk(p.read_bytes()):
                if t in (1, 10):
                    rows[(f["storage"], f["key"])] = f["value"]
            continue
        valid = False
        for _, t, f in walk(p.read_bytes()):
            if t == 2:
                valid = f["epoch"] <= epoch
            elif t in (3, 6):
                valid = False
            elif valid and t in (1, 10, 5, 7, 9):
                ops.append((f["wv"], t, f))
    for _, t, f in sorted(ops, key=lambda o: o[0]):
        if t in (1, 10):
            rows[(f["storage"], f["key"])] = f["value"]
        elif t == 5:
            rows.pop((f["storage"], f["key"]), None)
        else:
            for k in [k for k in rows if k[0] == f["storage"]]:
                del rows[k]
    return rows


ONLINE = "11-online-compaction"
COVERED = {"pwal_0000.01795335762261.0", "pwal_0001.01795335762262.0", "pwal_0002.01795335762262.0"}


@require_limestone
def test_point_in_time_of_a_compacted_set(tmp_path):
    """The compacted file folds every epoch up to the catalog's MAX_EPOCH_ID (4): points below it are refused."""
    src = copy_limestone_fixture(ONLINE, tmp_path)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    assert full["position"] == {"epoch": 9}
    for point in (4, 8, 9):
        dest = tmp_path / f"at-{point}"
        assert run_main("restore", full["id"], dest, "--repo", repo, "--to", point).returncode == 0
        assert state(dest) == tsv(_expected_rows_at(src, point, COVERED))
    assert state(tmp_path / "at-8") != state(tmp_path / "at-9")
    proc = run_main("restore", full["id"], tmp_path / "at-3", "--repo", repo, "--to", "3")
    assert_refused(proc, 1, "not restored", "compacted", "4")
    assert not (tmp_path / "at-3").exists()


@require_limestone
def test_point_in_time_uses_the_catalog_limestone_uses(tmp_path):
    """No compaction_catalog but its .back (limestone crashed while rewriting it): limestone reads the .back,
    so its MAX_EPOCH_ID bounds the point as well."""
    src = copy_limestone_fixture(ONLINE, tmp_path)
    os.replace(src / "compaction_catalog", src / "compaction_catalog.back")
    assert verify(src)[0] == 0
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    proc = run_main("restore", full["id"], tmp_path / "at-2", "--repo", repo, "--to", "2")
    assert_refused(proc, 1, "not restored", "compacted")
    assert run_main("restore", full["id"], tmp_path / "at-4", "--repo", repo, "--to", "4").returncode == 0
    assert state(tmp_path / "at-4") == tsv(_expected_rows_at(src, 4, COVERED))


@require_limestone
def test_point_in_time_below_what_the_compacted_file_folds(tmp_path):
    """A session of epoch 5 went on writing into a file rotated at epoch 4 (limestone renames a channel's file
    while a session of the next epoch may still have it open), and the compaction folded it: MAX_EPOCH_ID (4)
    is then below what the compacted file holds. The files it covers say how far it reaches."""
    src = copy_limestone_fixture(ONLINE, tmp_path)
    late = src / "pwal_0002.01795335762262.0"
    with open(late, "ab") as f:
        f.write(writer.snippet_header(5) + writer.put(200, b"late", b"L", (5, 1)) + writer.snippet_end(5))
    compacted = src / "pwal_0000.compacted"
    data = compacted.read_bytes()
    found = list(walk(data))
    assert [t for _, t, _ in found[:1]] == [2] and {t for _, t, _ in found[1:]} <= {1, 10}
    ends = [off for off, _, _ in found[1:]] + [len(data)]
    entries = [(struct.pack("<Q", f["storage"]) + f["key"], data[off:end])
               for (off, _, f), end in zip(found[1:], ends[1:])]
    entries.append((struct.pack("<Q", 200) + b"late", writer.put(200, b"late", b"L", (0, 0))))
    compacted.write_bytes(writer.snippet_header(0) + b"".join(e for _, e in sorted(entries)))
    assert verify(src)[0] == 0
    assert "6c617465" in state(src)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    proc = run_main("restore", full["id"], tmp_path / "at-4", "--repo", repo, "--to", "4")
    assert_refused(proc, 1, "not restored", "compacted", "5")
    proc = run_main("restore", full["id"], tmp_path / "at-5", "--repo", repo, "--to", "5")
    assert proc.returncode == 0, proc.stderr
    assert "6c617465" in state(tmp_path / "at-5")


# --------------------------------------------------------------------------- 4. refusals


def test_live_directory_is_refused(repo_target, tmp_path):
    repo_target.repository(create=True)
    src = tmp_path / "src"
    w = Workload(src, uuid="41111111-2222-4333-8444-555555555555", seed=5)
    phase_a(w)
    before = tree_snapshot(src)
    fd = os.open(src / MANIFEST, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        proc = run_main("backup", src, *repo_target.cli)
    finally:
        os.close(fd)
    assert_refused(proc, 2, "not backed up", "running limestone")
    assert tree_snapshot(src) == before
    assert_nothing_recorded(repo_target)
    assert backup(src, repo_target)["type"] == "full"  # once the lock is gone


def test_nondurable_tail_is_refused(repo_target, tmp_path):
    repo_target.repository(create=True)
    src = tmp_path / "src"
    w = Workload(src, uuid="51111111-2222-4333-8444-555555555555", seed=9)
    w.epoch(1, extra=[("put", 10)])
    w.epoch(2)
    w.epoch(3, durable=False)  # written, never made durable: a crash before the epoch file caught up
    w.close()
    assert verify(src)[1]["status"] == "repairable"
    before = tree_snapshot(src)
    proc = run_main("backup", src, *repo_target.cli)
    assert_refused(proc, 1, "not backed up", "repairable", "walvault repair", "nondurable_snippet at ")
    assert tree_snapshot(src) == before
    assert_nothing_recorded(repo_target)


@require_limestone
def test_unrepairable_is_refused(tmp_path):
    """A put's type byte zeroed inside a durable snippet: unrepairable, refused with where, and no repair hint."""
    src = copy_limestone_fixture("01-clean", tmp_path)
    data = bytearray((src / "pwal_0001").read_bytes())
    offset = [off for off, t, _ in walk(bytes(data)) if t == 1][1]
    data[offset] = 0
    (src / "pwal_0001").write_bytes(bytes(data))
    repo = new_repository(tmp_path / "repo")
    proc = run_main("backup", src, "--repo", repo)
    assert_refused(proc, 1, "not backed up", "unrepairable", f"pwal_0001: corrupted_durable_snippet at {offset}")
    assert "walvault repair" not in proc.stderr
    assert_nothing_recorded(RepoTarget("local", str(repo), {}))


def test_backup_holds_limestone_lock_while_it_copies(tmp_path, monkeypatch):
    """A limestone that starts (and stops) while the files are being copied would leave a set whose epoch file
    and pwal copies come from different moments, and the check runs on the source after the copies: the backup
    holds limestone's own lock meanwhile, so that no limestone can start."""
    from walcore.command.backup import backup as run_backup
    from walcore.repository import Repository

    src = tmp_path / "src"
    w = Workload(src, uuid="61111111-2222-4333-8444-555555555555", seed=2)
    phase_a(w)
    repo = Repository(str(tmp_path / "repo"), create=True)
    seen = []
    real_put = Repository.put_object

    def put_object(self, name, path, **kw):
        fd = os.open(src / MANIFEST, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("a limestone could start")
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            seen.append("locked")
        finally:
            os.close(fd)
        return real_put(self, name, path, **kw)

    monkeypatch.setattr(Repository, "put_object", put_object)
    result = run_backup(src, repo)
    assert result.manifest.type == "full"
    assert seen and set(seen) == {"locked"}
    fd = os.open(src / MANIFEST, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released afterwards
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the set after a restore to a point


def test_incremental_after_restore_to_a_point_and_restart(tmp_path):
    """The usual point-in-time recovery: restore --to E, start limestone on it (it cancels the snippets past E
    in place, 2 -> 6, in the detached files too: same name, same size), go on, back up (same instance). That is
    another history: an incremental on the old chain is refused (elsewhere: no full backup of that source; in
    the original's place: a sealed file the parent holds has other bytes under its name and size), and a full
    backup of it restores it."""
    src = tmp_path / "src"
    w = Workload(src, uuid="71111111-2222-4333-8444-555555555555", seed=13)
    phase_a(w)
    phase_b(w)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    pitr = tmp_path / "pitr"
    assert run_main("restore", full["id"], pitr, "--repo", repo, "--to", "2").returncode == 0
    rotated = {p.name: p.stat().st_size for p in pitr.iterdir() if p.name.startswith("pwal_") and "." in p.name}
    # limestone's start (repair_by_mark on nondurable snippets), simulated by walvault repair (tglogutil's repair)
    assert run_main("repair", pitr, "--apply").returncode == 0
    marked = [n for n, size in rotated.items() if (pitr / n).stat().st_size == size
              and 6 in [t for _, t, _ in walk((pitr / n).read_bytes())]]
    assert marked, "the point must cancel snippets of a file the full holds"
    # the restored instance goes on at an epoch past every one that appeared (what limestone records at start)
    w2 = Workload(pitr, uuid=w.uuid, seed=99)
    w2.epoch(11, extra=[("put", 10)])
    w2.close()
    expected = state(pitr)
    assert expected != state(src)
    elsewhere = run_main("backup", pitr, "--repo", repo, "--type", "incremental")
    assert elsewhere.returncode == 1 and "no full backup" in elsewhere.stderr, elsewhere.stderr
    src.rename(tmp_path / "src-before")
    pitr.rename(src)
    in_place = run_main("backup", src, "--repo", repo, "--type", "incremental")
    assert in_place.returncode == 1 and f"diverged from its parent backup {full['id']}" in in_place.stderr
    assert any(n in in_place.stderr for n in marked), in_place.stderr
    new_full = _json(run_main("backup", src, "--repo", repo, "--json"))
    dest = tmp_path / "restored"
    assert run_main("restore", new_full["id"], dest, "--repo", repo).returncode == 0
    assert files_of(dest) == limestone_files(src)
    assert state(dest) == expected


# --------------------------------------------------------------------------- 5. the backup's manifest


@require_limestone
@pytest.mark.parametrize("name", ["10-backup-source", ONLINE, "generated"])
def test_manifest_lists_epochs_verification_and_mutability(name, tmp_path):
    if name == "generated":
        src = tmp_path / "src"
        phase_a(Workload(src, uuid="81111111-2222-4333-8444-555555555555", seed=4))
    else:
        src = copy_limestone_fixture(name, tmp_path)
    repo = new_repository(tmp_path / "repo")
    full = _json(run_main("backup", src, "--repo", repo, "--json"))
    from walcore.repository import Repository

    m = Repository(str(repo)).find(full["id"]).manifest
    assert m.family == "limestone" and m.source["live"] is False
    assert m.checks["directory"]["status"] == "ok"
    entries = {e.name: e for e in m.files}
    assert set(entries) == set(limestone_files(src))
    kinds = {e.kind for e in m.files}
    assert {"pwal_rotated", "manifest", "epoch_rotated" if name != ONLINE else "compacted"} <= kinds
    for e in m.files:
        assert e.mutable == (e.kind in MUTABLE_KINDS), (e.name, e.kind, e.mutable)
        assert e.kind in MUTABLE_KINDS | SEALED_KINDS
        v = e.verification
        assert v["status"] in ("ok", "open") and v["findings"] == [] and v["checked_by"] == "scan", (e.name, v)
        if e.kind in ("pwal", "pwal_rotated", "compacted"):
            epochs = header_epochs(src / e.name)
            if epochs:
                assert e.range == {"epochs": [min(epochs), max(epochs)]}, e.name
                assert v["epoch_range"] == [min(epochs), max(epochs)]
            else:
                assert e.range == {}
            assert v["status"] == ("open" if e.kind == "pwal" else "ok")
            assert set(v["durable_entries"]) <= {"put", "remove", "put_blob", "clear_storage", "add_storage",
                                                 "remove_storage"}
    assert any(e.kind == "pwal" for e in m.files)

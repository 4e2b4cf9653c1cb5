"""walvault state, repair and rotate on copies of the real limestone directories.

Expected states are written by hand from the workload the fixtures' README describes (or, for the
random workload, are limestone's own state oracle); expected repaired bytes come from the fixture
`tglogutil repair` wrote (03-unfinished-after-repair); offsets from a small local parser of the
entry layout in ../shared/docs/limestone-files.md.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import pytest

from conftest import LIMESTONE_FIXTURES as FIXTURES
from conftest import limestone_readme_table, require_limestone, run_cli, run_main, tree_snapshot
from conftest import copy_limestone_fixture as copy_fixture
from limestone_bytes import walk
from walcore.command.rotate import RotateRefused, rotate

README = FIXTURES / "README.md"
MANIFEST = "limestone-manifest.json"
MS14 = r"\d{14}"

pytestmark = [require_limestone, pytest.mark.usefixtures("scan_core")]  # each test on both scan cores


# --------------------------------------------------------------------------- helpers


TABLE = limestone_readme_table() if README.is_file() else {}
AUTO_REPAIRABLE = sorted(n for n, row in TABLE.items() if row["status"] == "auto-repairable")


def tsv(rows) -> str:
    """rows of (storage, key bytes, value bytes), sorted as the README says: storage_id, then key bytes."""
    return "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for s, k, v in sorted(rows))


def state(path: Path) -> str:
    proc = run_main("state", path, "--format", "tsv")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def verdict(path: Path) -> tuple[int, dict]:
    proc = run_main("verify", path, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)["dirs"][0]


def pwal_names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("pwal_"))


# The README workload ("Workload of the clean runs").
EPOCHS_1_2 = [(100, b"k1", b"v1-updated"), (200, b"a", b"alpha"), (200, b"b", b"beta"), (200, b"c", b"gamma"),
              (300, b"x", b"in-storage-300")]
# Epoch 3: blobkey put, storage 300 cleared and removed, a updated.
FINAL = [(100, b"k1", b"v1-updated"), (200, b"a", b"alpha-3"), (200, b"b", b"beta"),
         (200, b"blobkey", b"row-with-blob"), (200, b"c", b"gamma")]


def unrepairable_copy(tmp_path: Path) -> tuple[Path, int]:
    """01-clean with the type byte of a put inside a durable snippet of pwal_0001 overwritten by 0x00."""
    work = copy_fixture("01-clean", tmp_path)
    path = work / "pwal_0001"
    data = bytearray(path.read_bytes())
    offset = [off for off, t, f in walk(bytes(data)) if t == 1][1]  # the put of epoch 2 (durable: D = 3)
    data[offset] = 0
    path.write_bytes(bytes(data))
    return work, offset


# --------------------------------------------------------------------------- state


def test_state_random_small_equals_oracle():
    out = run_main("state", FIXTURES / "20-random-small", "--format", "tsv")
    assert out.returncode == 0, out.stderr
    oracle = (FIXTURES / "20-random-small.state.tsv").read_bytes()
    assert out.stdout.encode() == oracle
    assert out.stdout.count("\n") == 1580


def test_state_unfinished_is_epochs_1_2(tmp_path):
    work = copy_fixture("02-unfinished", tmp_path)
    before = tree_snapshot(tmp_path)
    assert state(work) == tsv(EPOCHS_1_2)
    assert tree_snapshot(tmp_path) == before


def test_state_clean(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    assert state(work) == tsv(FINAL)


def test_state_online_compaction(tmp_path):
    work = copy_fixture("11-online-compaction", tmp_path)
    # The compacted base holds the clean workload's final state; epoch 9 came after it.
    later = [(f["storage"], f["key"], f["value"]) for _, t, f in walk((work / "pwal_0001").read_bytes())
             if t in (1, 10)]
    assert later == [(200, b"after-compaction", b"ac")]
    assert state(work) == tsv(FINAL + later)


def test_state_unchanged_by_repair(tmp_path):
    work = copy_fixture("02-unfinished", tmp_path)
    before = state(work)
    assert run_main("repair", work, "--apply").returncode == 0
    assert state(work) == before == tsv(EPOCHS_1_2)


def test_state_refused_when_unrepairable(tmp_path):
    work, _ = unrepairable_copy(tmp_path)
    proc = run_main("state", work, "--format", "tsv")
    assert proc.returncode == 1
    assert proc.stdout == ""


def test_state_exit_code_does_not_depend_on_path(tmp_path):
    work, _ = unrepairable_copy(tmp_path / "cannot_check")
    proc = run_main("state", work, "--format", "tsv")
    assert proc.returncode == 1, proc.stderr


def test_state_refused_without_compacted_file(tmp_path):
    # The catalog says pwal_0000.compacted holds the keys of the rotated files it lists, so those files
    # are left out of the state: without it, every key written before the compaction would vanish.
    work = copy_fixture("11-online-compaction", tmp_path)
    assert "COMPACTED_FILE pwal_0000.compacted 1" in (work / "compaction_catalog").read_text()
    (work / "pwal_0000.compacted").unlink()
    proc = run_main("state", work, "--format", "tsv")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "pwal_0000.compacted" in proc.stderr


def test_state_cannot_check(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    (work / MANIFEST).unlink()
    proc = run_main("state", work, "--format", "tsv")
    assert proc.returncode == 2
    assert proc.stdout == ""


@pytest.mark.parametrize("command", [("rotate",), ("repair",), ("repair", "--apply")])
def test_rotate_and_repair_cannot_check(tmp_path, command):
    """A directory that cannot be checked (pwal files, no manifest): exit 2 like state and verify, not 1."""
    work = copy_fixture("01-clean", tmp_path)
    (work / MANIFEST).unlink()
    before = tree_snapshot(tmp_path)
    proc = run_main(*command, work)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(("walvault: not rotated: ", "walvault: not repaired: ")), proc.stderr
    assert MANIFEST in proc.stderr
    assert tree_snapshot(tmp_path) == before


# --------------------------------------------------------------------------- repair


def test_repair_plan_only_changes_nothing(tmp_path):
    work = copy_fixture("02-unfinished", tmp_path)
    before = tree_snapshot(tmp_path)
    proc = run_main("repair", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    proc = run_main("repair", work, "--json")
    assert proc.returncode == 1
    plan = json.loads(proc.stdout)
    assert plan["applied"] is False and plan["status"] == "repairable"
    actions = {f["file"]: f["actions"] for f in plan["files"]}
    assert any("238" in a for a in actions["pwal_0000"])
    assert any("115" in a for a in actions["pwal_0001"])
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["01-clean", "03-unfinished-after-repair", "11-online-compaction"])
def test_repair_on_ok_dir(name, tmp_path):
    work = copy_fixture(name, tmp_path)
    before = tree_snapshot(tmp_path)
    assert run_main("repair", work).returncode == 0
    assert run_main("repair", work, "--apply").returncode == 0
    assert tree_snapshot(tmp_path) == before


def test_readme_lists_auto_repairable():
    assert AUTO_REPAIRABLE == ["02-unfinished", "07-zerotail"]


@pytest.mark.parametrize("name", AUTO_REPAIRABLE)
def test_repair_apply(name, tmp_path):
    work = copy_fixture(name, tmp_path)
    original = {n: (work / n).read_bytes() for n in pwal_names(work)}
    assert all(re.fullmatch(r"pwal_\d{4}", n) for n in original)
    proc = run_main("repair", work, "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = pwal_names(work)
    # every (non-empty) active file detached under a rotated name; nothing else appeared
    assert len(after) == len(original)
    by_channel = {}
    for n in after:
        m = re.fullmatch(rf"(pwal_\d{{4}})\.({MS14})\.(\d+)", n)
        assert m, n
        by_channel[m[1]] = (work / n).read_bytes()
    assert set(by_channel) == set(original)
    assert not (tmp_path / f"{name}.walvault-cut").exists()
    if name == "02-unfinished":
        # byte for byte what `tglogutil repair` wrote
        ref = FIXTURES / "03-unfinished-after-repair"
        expected = {n.split(".")[0]: (ref / n).read_bytes() for n in pwal_names(ref)}
    else:
        # the first zero byte of the tail (offset 175) becomes a canceled header (6); nothing else changes
        expected = dict(original)
        data = bytearray(expected["pwal_0001"])
        assert data[175:] == bytes(len(data) - 175)
        data[175] = 6
        expected["pwal_0001"] = bytes(data)
    assert by_channel == expected
    rc, d = verdict(work)
    assert (rc, d["status"]) == (0, "ok")
    assert d["count_durable_wal_entries"] == TABLE[name]["count"]
    assert run_main("repair", work, "--apply").returncode == 0  # nothing left to do


@pytest.mark.parametrize("name,file,cut_at", [("02-unfinished", "pwal_0001", 115), ("07-zerotail", "pwal_0001", 175)])
def test_repair_apply_cut(name, file, cut_at, tmp_path):
    work = copy_fixture(name, tmp_path)
    original = (work / file).read_bytes()
    # where the cut goes: the header of the broken nondurable snippet (02), the first zero byte (07)
    entries = list(walk(original))
    assert entries[-1][1] in ("short", "unknown")
    headers = [off for off, t, _ in entries if t == 2]
    assert cut_at == (headers[-1] if entries[-1][1] == "short" else entries[-1][0])
    proc = run_main("repair", work, "--apply", "--cut")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (detached,) = [n for n in pwal_names(work) if n.startswith(file + ".")]
    saved_dir = tmp_path / f"{name}.walvault-cut"
    saved = sorted(saved_dir.iterdir())
    assert [p.name for p in saved] == [f"{detached}.{cut_at}"]
    assert saved[0].read_bytes() == original[cut_at:]
    assert (work / detached).read_bytes() == original[:cut_at]
    rc, d = verdict(work)
    assert (rc, d["status"]) == (0, "ok")


def test_repair_cut_of_dot_saves_next_to_the_directory(tmp_path):
    # `repair .` from inside the directory: `.` has no name, and the cut bytes must still land in
    # <dir>.walvault-cut beside it, never in the log directory itself.
    work = copy_fixture("02-unfinished", tmp_path)
    original = (work / "pwal_0001").read_bytes()
    proc = run_main("repair", ".", "--apply", "--cut", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["02-unfinished", "02-unfinished.walvault-cut"]
    (saved,) = (tmp_path / "02-unfinished.walvault-cut").iterdir()
    assert original.endswith(saved.read_bytes()) and saved.stat().st_size > 0
    assert not [p for p in work.iterdir() if "walvault" in p.name]


def test_repair_refuses_a_catalog_that_is_not_a_file(tmp_path):
    # Restoring the catalog from its .back first saves the damaged one: a FIFO would block that copy.
    work = copy_fixture("11-online-compaction", tmp_path)
    (work / "compaction_catalog").unlink()
    os.mkfifo(work / "compaction_catalog")
    before = sorted(p.name for p in work.iterdir())
    proc = run_cli("repair", work, "--apply", timeout=60)  # a process: a copy the FIFO blocked would end
    assert proc.returncode == 1 and "not a regular file" in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == before  # nothing renamed


def test_repair_fails_before_any_change_when_it_cannot_save(tmp_path):
    # The damaged catalog is saved aside before its backup replaces it; when that cannot be done (a file
    # stands where the directory for saved bytes goes), nothing is changed at all.
    work = copy_fixture("11-online-compaction", tmp_path)
    (work / "compaction_catalog").write_bytes(b"garbage\n")
    (tmp_path / "11-online-compaction.walvault-cut").write_bytes(b"in the way")
    before = tree_snapshot(tmp_path)
    proc = run_main("repair", work, "--apply")
    assert proc.returncode == 2 and proc.stderr.startswith("walvault: not repaired: "), proc.stderr
    assert tree_snapshot(tmp_path) == before


def test_repair_says_when_it_uncovers_what_it_cannot_mend(tmp_path):
    # Zeros where a header must come hide a damaged durable snippet behind them: marking the zeros as a
    # canceled header (what tglogutil repair does) lets the scan reach it. Repair says so and exits 1.
    work = copy_fixture("01-clean", tmp_path)
    data = bytearray((work / "pwal_0000").read_bytes())
    entries = list(walk(bytes(data)))
    header = next(entries[i + 1][0] for i, (_, t, _) in enumerate(entries[:-1]) if t == 3)  # after an end marker
    later = next(off for off, t, _ in entries if t in (1, 5, 7, 8) and off > header + 9)  # in a durable snippet
    data[later] = 0  # no entry type
    data[header:header] = bytes(9)
    (work / "pwal_0000").write_bytes(bytes(data))
    assert verdict(work)[1]["status"] == "repairable"
    proc = run_main("repair", work, "--apply", "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["applied"] and out["left"].startswith("unrepairable")
    assert verdict(work)[1]["status"] == "unrepairable"


def test_repair_refuses_unrepairable(tmp_path):
    work, offset = unrepairable_copy(tmp_path)
    rc, d = verdict(work)
    assert (rc, d["status"]) == (1, "unrepairable")
    before = tree_snapshot(tmp_path)
    for args in ((), ("--apply",), ("--apply", "--cut")):
        proc = run_main("repair", work, *args)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        assert str(offset) in proc.stderr
    assert tree_snapshot(tmp_path) == before


def test_repair_cut_without_apply_is_usage_error(tmp_path):
    work = copy_fixture("02-unfinished", tmp_path)
    before = tree_snapshot(tmp_path)
    proc = run_main("repair", work, "--cut")
    assert proc.returncode == 2
    assert tree_snapshot(tmp_path) == before


# --------------------------------------------------------------------------- rotate


def test_rotate_clean(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    active = {n: (work / n).read_bytes() for n in pwal_names(work)}
    epoch = (work / "epoch").read_bytes()
    state_before = state(work)
    assert state_before == tsv(FINAL)
    proc = run_main("rotate", work, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    renamed = {r["from"]: r["to"] for r in json.loads(proc.stdout)["renamed"]}
    assert set(renamed) == set(active) | {"epoch"}
    for old, data in active.items():
        m = re.fullmatch(rf"{old}\.({MS14})\.0", renamed[old])
        assert m, renamed[old]
        assert int(m[1]) > 10 ** 12  # milliseconds, not seconds
        assert (work / renamed[old]).read_bytes() == data
        assert not (work / old).exists()
    # E = the directory's max appeared epoch (README: 3)
    assert re.fullmatch(rf"epoch\.{MS14}\.3", renamed["epoch"])
    assert (work / renamed["epoch"]).read_bytes() == epoch
    assert (work / "epoch").read_bytes() == b""
    rc, d = verdict(work)
    assert (rc, d["status"], d["durable_epoch"], d["count_durable_wal_entries"]) == (0, "ok", 3, 9)
    assert state(work) == state_before

    # nothing active any more: a second rotate rotates nothing
    before = tree_snapshot(tmp_path)
    proc = run_main("rotate", work, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["renamed"] == []
    assert tree_snapshot(tmp_path) == before


def test_rotate_min_bytes(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    sizes = {n: (work / n).stat().st_size for n in pwal_names(work)}
    limit = 200
    big = {n for n, s in sizes.items() if s >= limit}
    assert big and big != set(sizes)
    small = {n: (work / n).read_bytes() for n in sizes if n not in big}
    proc = run_main("rotate", work, "--min-bytes", limit)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = pwal_names(work)
    for n in big:
        assert n not in names
        assert len([x for x in names if re.fullmatch(rf"{n}\.{MS14}\.0", x)]) == 1
    for n, data in small.items():
        assert (work / n).read_bytes() == data
    rc, d = verdict(work)
    assert (rc, d["status"], d["durable_epoch"], d["count_durable_wal_entries"]) == (0, "ok", 3, 9)
    assert state(work) == tsv(FINAL)


def _add_active_session(work: Path, epoch: int) -> bytes:
    """A new active pwal_0000 with one finished session of `epoch`, made durable in `epoch`."""
    data = (struct.pack("<BQ", 2, epoch) + struct.pack("<BIIQ", 1, 1, 2, 200) + b"z" + struct.pack("<QQ", epoch, 9)
            + b"zz" + struct.pack("<BQB", 3, epoch, 1))
    (work / "pwal_0000").write_bytes(data)
    with open(work / "epoch", "ab") as f:
        f.write(struct.pack("<BQ", 4, epoch))
    return data


NOW = 1795335762000


def test_rotate_refuses_a_stray_epoch_file(tmp_path):
    # verify ignores epoch_old while epoch has a record (limestone does too); once rotation leaves epoch
    # empty, limestone would read it for the durable epoch.
    work = copy_fixture("01-clean", tmp_path)
    (work / "epoch_old").write_bytes(b"\x04" + (99).to_bytes(8, "little"))
    assert verdict(work)[0] == 0
    before = tree_snapshot(tmp_path)
    proc = run_main("rotate", work)
    assert proc.returncode == 1 and "epoch_old" in proc.stderr, proc.stderr
    assert tree_snapshot(tmp_path) == before


def test_rotate_never_overwrites(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    first = rotate(work, now_ms=NOW)
    assert len(first.renamed) == 4
    made = {new: (work / new).read_bytes() for _, new in first.renamed}
    assert f"pwal_0000.{NOW:014d}.0" in made and f"epoch.{NOW:014d}.3" in made
    new_data = _add_active_session(work, 4)
    second = rotate(work, now_ms=NOW)  # same clock: the names of the first run are taken
    assert second.renamed == [("pwal_0000", f"pwal_0000.{NOW:014d}.1"), ("epoch", f"epoch.{NOW:014d}.4")]
    for name, data in made.items():
        assert (work / name).read_bytes() == data
    assert (work / f"pwal_0000.{NOW:014d}.1").read_bytes() == new_data
    assert len(pwal_names(work)) == 4
    assert len([p for p in work.iterdir() if p.name.startswith("epoch.")]) == 2
    rc, d = verdict(work)
    assert (rc, d["status"], d["durable_epoch"], d["count_durable_wal_entries"]) == (0, "ok", 4, 10)


def test_rotate_epoch_name_taken_overwrites_nothing(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    first = rotate(work, now_ms=NOW)
    made = {new: (work / new).read_bytes() for _, new in first.renamed}
    _add_active_session(work, 3)  # same max appeared epoch: epoch.<NOW>.3 is taken
    epoch_now = (work / "epoch").read_bytes()
    with pytest.raises(RotateRefused):
        rotate(work, now_ms=NOW)
    for name, data in made.items():
        assert (work / name).read_bytes() == data
    assert (work / "epoch").read_bytes() == epoch_now
    rc, d = verdict(work)
    assert (rc, d["status"]) == (0, "ok")


def test_rotate_refused_on_taken_epoch_name_renames_nothing(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    rotate(work, now_ms=NOW)
    _add_active_session(work, 3)
    with pytest.raises(RotateRefused):
        rotate(work, now_ms=NOW)
    assert (work / "pwal_0000").exists()
    assert not (work / f"pwal_0000.{NOW:014d}.1").exists()


@pytest.mark.parametrize("name", ["02-unfinished", "07-zerotail", "unrepairable", "13-v1-manifest-migrated-by-inspect",
                                  "missing-compacted-file"])
def test_rotate_refuses_dir_not_ok(name, tmp_path):
    """Also a directory whose log is ok but that lost data beside it: a blob (13 has none of 01's), or the
    compacted file its catalog names."""
    if name == "unrepairable":
        work, _ = unrepairable_copy(tmp_path)
    elif name == "missing-compacted-file":
        work = copy_fixture("11-online-compaction", tmp_path)
        (work / "pwal_0000.compacted").unlink()
    else:
        work = copy_fixture(name, tmp_path)
    before = tree_snapshot(tmp_path)
    proc = run_main("rotate", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert tree_snapshot(tmp_path) == before


def test_rotate_not_a_limestone_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run_main("rotate", tmp_path / "empty").returncode == 2
    assert run_main("rotate", tmp_path / "missing").returncode == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]

"""walvault inspect/verify on the real limestone (Tsurugi) directories of ../shared/fixtures/limestone.

The expected verdicts come from the fixtures' README (the table of `tglogutil inspect` results, parsed
here, and the prose for 20-random-small); offsets come from a small local parser of the entry layout
in ../shared/docs/limestone-files.md, not from walcore. Every test works on a copy of a fixture.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LIMESTONE_FIXTURES as FIXTURES
from conftest import limestone_readme_table, require_limestone, run_main, tree_snapshot
from conftest import copy_limestone_fixture as copy_fixture
from limestone_bytes import walk

README = FIXTURES / "README.md"
MANIFEST = "limestone-manifest.json"

pytestmark = [require_limestone, pytest.mark.usefixtures("scan_core")]  # each test on both scan cores

STATUS = {"OK": "ok", "auto-repairable": "repairable", "unrepairable": "unrepairable"}
DIR_KEYS = {"path", "family", "format_version", "persistent_format_version", "live", "status", "durable_epoch",
            "max_appeared_epoch", "durable_entries", "count_durable_wal_entries", "snippets", "findings"}
DURABLE_ENTRY_KEYS = {"put", "remove", "put_blob", "clear_storage", "add_storage", "remove_storage"}
KINDS = {"pwal", "pwal_rotated", "compacted", "epoch", "epoch_rotated", "manifest", "catalog", "blob"}
PWAL_KINDS = {"pwal", "pwal_rotated", "compacted"}
EPOCH_KINDS = {"epoch", "epoch_rotated"}


# --------------------------------------------------------------------------- the README's expectations

TABLE = limestone_readme_table() if README.is_file() else {}


def test_readme_table_parsed():
    # The table lists 8 directories; the prose adds 20-random-small. Guard against a silently empty parse.
    assert len(TABLE) == 9
    assert TABLE["01-clean"] == {"status": "OK", "exit": 0, "durable_epoch": 3, "max_appeared_epoch": 3, "count": 9}
    assert TABLE["20-random-small"]["count"] == 6117
    assert all((FIXTURES / name).is_dir() for name in TABLE)


# --------------------------------------------------------------------------- a local parser (limestone-files.md)


def epoch_records(path: Path) -> list[int]:
    data = path.read_bytes()
    assert len(data) % 9 == 0
    out = []
    for off in range(0, len(data), 9):
        t, e = struct.unpack_from("<BQ", data, off)
        assert t == 4
        out.append(e)
    return out


# --------------------------------------------------------------------------- helpers


def verify_json(path: Path, *extra, command: str = "verify"):
    proc = run_main(command, path, "--json", *extra)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None


def file_of(report: dict, name: str) -> dict:
    found = [f for f in report["files"] if Path(f["path"]).name == name]
    assert len(found) == 1, [f["path"] for f in report["files"]]
    return found[0]


def codes(finding_list) -> list[tuple[str, int | None]]:
    return sorted((f["code"], f["offset"]) for f in finding_list)


# --------------------------------------------------------------------------- verdicts from the README


@pytest.mark.parametrize("name", sorted(TABLE))
def test_verdict_matches_readme(name, tmp_path):
    expected = TABLE[name]
    work = copy_fixture(name, tmp_path)
    rc, report = verify_json(work)
    assert len(report["dirs"]) == 1
    d = report["dirs"][0]
    assert d["status"] == STATUS[expected["status"]]
    assert d["durable_epoch"] == expected["durable_epoch"]
    assert d["max_appeared_epoch"] == expected["max_appeared_epoch"]
    assert d["count_durable_wal_entries"] == expected["count"]
    assert d["count_durable_wal_entries"] == d["durable_entries"]["put"] + d["durable_entries"]["remove"]
    if name == "13-v1-manifest-migrated-by-inspect":
        # Only pwal + epoch + manifest of 01 were copied into 13, not blob/: pwal_0002's durable put
        # with blob 1 (type 10) refers to a blob file that is not there. tglogutil never looks at
        # blobs (so it says OK and the status stays ok), but walvault reports the missing blob as a
        # finding, which makes the report not intact: exit 1.
        assert not (work / "blob").exists()
        assert [f["code"] for f in d["findings"]] == ["missing_blob"]
        assert d["findings"][0]["file"].endswith("pwal_0002")
        assert rc == 1
    elif expected["status"] == "OK":
        assert d["findings"] == []
        assert rc == 0
    else:
        assert expected["status"] == "auto-repairable"
        assert rc == 1


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_text_output_exit_codes(command):
    # Read only: run on the fixtures themselves in one call; any repairable dir makes it exit 1.
    ok = [FIXTURES / n for n in TABLE if TABLE[n]["status"] == "OK" and not n.startswith("13-")]
    proc = run_main(command, *ok)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_main(command, *ok, FIXTURES / "07-zerotail")
    assert proc.returncode == 1, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- the JSON contract


@pytest.mark.parametrize("name", sorted(TABLE))
def test_json_contract(name, tmp_path, scan_core):
    work = copy_fixture(name, tmp_path)
    _, report = verify_json(work, "--jobs", "2", command="inspect")
    assert set(report) == {"files", "chains", "dirs", "scan_core"}
    assert report["scan_core"].startswith(scan_core)
    assert report["chains"] == []
    (d,) = report["dirs"]
    assert set(d) == DIR_KEYS
    assert d["family"] == "limestone"
    assert Path(d["path"]).resolve() == work.resolve()
    assert set(d["durable_entries"]) == DURABLE_ENTRY_KEYS
    manifest = json.loads((work / MANIFEST).read_bytes())
    assert d["format_version"] == manifest["format_version"]
    assert d["persistent_format_version"] == manifest["persistent_format_version"]
    assert d["live"] is False

    listed = {Path(f["path"]).name: f for f in report["files"]}
    top_pwal = {p.name for p in work.iterdir() if p.name.startswith("pwal_")}
    assert top_pwal and top_pwal <= set(listed)
    totals = dict.fromkeys(DURABLE_ENTRY_KEYS, 0)
    for f in report["files"]:
        assert f["family"] == "limestone"
        assert f["kind"] in KINDS
        assert f["status"] in ("ok", "open", "damaged")
        path = Path(f["path"])
        assert path.is_file() and f["size"] == path.stat().st_size
        if f["kind"] in PWAL_KINDS:
            assert path.name.startswith("pwal_")
            headers = [fields["epoch"] for _, t, fields in walk(path.read_bytes()) if t in (2, 6)]
            assert f["epoch_range"] == [min(headers), max(headers)]
            for k, n in f["durable_entries"].items():
                totals[k] += n
        elif f["kind"] in EPOCH_KINDS:
            records = epoch_records(path)
            assert f["epoch_range"] == ([min(records), max(records)] if records else None)
        else:
            assert f["epoch_range"] is None
        if f["kind"] == "pwal":
            assert re.fullmatch(r"pwal_\d{4}", path.name)
        elif f["kind"] == "pwal_rotated":
            assert re.fullmatch(r"pwal_\d{4}\.\d{14}\.\d+", path.name)
        elif f["kind"] == "epoch_rotated":
            assert re.fullmatch(r"epoch\.\d{14}\.\d+", path.name)
        elif f["kind"] == "blob":
            assert re.fullmatch(r"[0-9a-f]{16}\.blob", path.name)
    assert totals == d["durable_entries"]


def test_epoch_ranges_of_online_compaction():
    _, report = verify_json(FIXTURES / "11-online-compaction")
    compacted = file_of(report, "pwal_0000.compacted")
    assert compacted["kind"] == "compacted" and compacted["epoch_range"] == [0, 0]
    active = file_of(report, "pwal_0001")
    assert active["kind"] == "pwal" and active["epoch_range"] == [9, 9]
    rotated = file_of(report, "pwal_0002.01795335762262.0")
    assert rotated["kind"] == "pwal_rotated" and rotated["epoch_range"] == [2, 3]
    assert file_of(report, "epoch")["epoch_range"] == [1, 9]
    assert file_of(report, "compaction_catalog.back")["kind"] == "catalog"


def test_backup_copy_kinds():
    _, report = verify_json(FIXTURES / "10-backup-copy")
    kinds = {Path(f["path"]).name: f["kind"] for f in report["files"]}
    assert kinds["0000000000000001.blob"] == "blob"  # flat at the top of the copy
    assert kinds["epoch.01795335762217.4"] == "epoch_rotated"
    assert "epoch" not in kinds
    assert sorted(n for n, k in kinds.items() if k == "pwal_rotated") == [
        "pwal_0000.01795335762219.0", "pwal_0001.01795335762219.0", "pwal_0002.01795335762219.0"]
    # No blob finding: the flat blob file counts.
    assert report["dirs"][0]["findings"] == []


# --------------------------------------------------------------------------- findings at exact offsets


def test_active_or_detached_by_bytes_of_the_name():
    # limestone's test is the name's length in bytes (> 9: detached), not in characters
    from walcore.limestone.layout import kind_of

    assert [kind_of(n) for n in ("pwal_0001", "pwal_é001", "pwal_0001.01795335762262.0")] == [
        "pwal", "pwal_rotated", "pwal_rotated"]
    assert len("pwal_é001") == 9 and len("pwal_é001".encode()) == 10


def test_unfinished_findings(tmp_path):
    work = copy_fixture("02-unfinished", tmp_path)
    durable = max(epoch_records(work / "epoch"))
    assert durable == TABLE["02-unfinished"]["durable_epoch"]
    expected: dict[str, list] = {}
    for name in ("pwal_0000", "pwal_0001", "pwal_0002"):
        out = []
        for off, t, fields in walk((work / name).read_bytes()):
            if t == 2 and fields["epoch"] > durable:
                out.append(("nondurable_snippet", off))
            elif t in ("short", "unknown"):
                out.append(("broken_tail", off))
        expected[name] = sorted(out)
    # What the README describes: an epoch-3 session on channels 0 and 1, channel 1 cut mid-entry.
    assert [c for c, _ in expected["pwal_0000"]] == ["nondurable_snippet"]
    assert sorted(c for c, _ in expected["pwal_0001"]) == ["broken_tail", "nondurable_snippet"]
    assert expected["pwal_0002"] == []
    rc, report = verify_json(work)
    assert rc == 1
    for name, exp in expected.items():
        f = file_of(report, name)
        assert codes(f["findings"]) == exp, name
        assert f["status"] == ("damaged" if exp else "open")
    assert report["dirs"][0]["snippets"]["nondurable"] == 2


def test_zerotail_finding(tmp_path):
    work = copy_fixture("07-zerotail", tmp_path)
    data = (work / "pwal_0001").read_bytes()
    clean_size = (FIXTURES / "01-clean" / "pwal_0001").stat().st_size
    *_, last = walk(data)
    assert last == (clean_size, "unknown", 0)
    assert data[clean_size:] == bytes(len(data) - clean_size) and clean_size == 175
    rc, report = verify_json(work)
    assert rc == 1
    assert codes(file_of(report, "pwal_0001")["findings"]) == [("broken_tail", 175)]
    for name in ("pwal_0000", "pwal_0002"):
        assert file_of(report, name)["findings"] == []


# --------------------------------------------------------------------------- inspect and verify never write


@pytest.mark.parametrize("name", sorted(TABLE))
def test_inspect_and_verify_write_nothing(name, tmp_path):
    work = copy_fixture(name, tmp_path)
    before = tree_snapshot(tmp_path)
    for args in (("inspect", "--jobs", "1"), ("inspect", "--json", "--jobs", "2"),
                 ("verify", "--jobs", "2"), ("verify", "--json", "--jobs", "1")):
        proc = run_main(args[0], work, *args[1:])
        assert proc.returncode in (0, 1), proc.stderr
    assert tree_snapshot(tmp_path) == before


def test_v1_manifest_is_not_migrated(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    (work / "compaction_catalog").unlink()
    v1 = b'{"format_version":"1.0","persistent_format_version":1}'
    (work / MANIFEST).write_bytes(v1)
    before = tree_snapshot(tmp_path)
    for command in ("inspect", "verify"):
        for jobs in ("1", "2"):
            rc, report = verify_json(work, "--jobs", jobs, command=command)
            assert rc == 0
            d = report["dirs"][0]
            assert (d["status"], d["format_version"], d["persistent_format_version"]) == ("ok", "1.0", 1)
    assert (work / MANIFEST).read_bytes() == v1
    assert not (work / "compaction_catalog").exists()
    assert not (work / "compaction_catalog.back").exists()
    assert not (work / (MANIFEST + ".back")).exists()
    assert tree_snapshot(tmp_path) == before


# --------------------------------------------------------------------------- cannot check


def test_missing_manifest(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    (work / MANIFEST).unlink()
    rc, report = verify_json(work)
    assert rc == 2
    d = report["dirs"][0]
    assert d["status"] == "cannot_check"
    assert [f["code"] for f in d["findings"]] == ["bad_manifest"]
    assert run_main("inspect", work).returncode == 2


@pytest.mark.parametrize("manifest", [
    b'{"format_version":"1.1","instance_uuid":"da4ca674-4dee-4657-8a6d-07391ed187e8","persistent_format_version":99}',
    b'{"format_version":"9.9","instance_uuid":"da4ca674-4dee-4657-8a6d-07391ed187e8","persistent_format_version":7}',
    b'{"format_version":"1.1","instance_uuid":"da4ca674-4dee-4657-8a6d-07391ed187e8","persistent_format_ver',
    b'',
    b'{"format_version":"1.1","persistent_format_version":7}',
    b'{"format_version":"1.1","instance_uuid":5,"persistent_format_version":7}',
    b'[' * 100_000 + b']' * 100_000,
    b'{"format_version":"1.1","instance_uuid":"x","persistent_format_version":' + b'7' * 5000 + b'}',
], ids=["version-99", "format-9.9", "invalid-json", "empty", "no-uuid", "uuid-not-a-string", "deep-nesting",
        "huge-int"])
def test_bad_manifest(manifest, tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    (work / MANIFEST).write_bytes(manifest)
    rc, report = verify_json(work)
    assert rc == 2
    d = report["dirs"][0]
    assert d["status"] == "cannot_check"
    assert [f["code"] for f in d["findings"]] == ["bad_manifest"]
    assert file_of(report, MANIFEST)["status"] == "damaged"
    assert (work / MANIFEST).read_bytes() == manifest


def test_partial_epoch_record(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    size = (work / "epoch").stat().st_size
    with open(work / "epoch", "ab") as f:
        f.write(b"\x04\x04\x00")
    rc, report = verify_json(work)
    assert rc == 2
    d = report["dirs"][0]
    assert d["status"] == "cannot_check"
    assert [f["code"] for f in d["findings"]] == ["unreadable_epoch"]
    assert codes(file_of(report, "epoch")["findings"]) == [("partial_epoch_record", size)]


def test_bad_epoch_record_type(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    data = bytearray((work / "epoch").read_bytes())
    data[9] = 2  # the second record is no longer a durable-epoch record
    (work / "epoch").write_bytes(bytes(data))
    rc, report = verify_json(work)
    assert rc == 2
    assert report["dirs"][0]["status"] == "cannot_check"
    assert codes(file_of(report, "epoch")["findings"]) == [("bad_epoch_record", 9)]


def test_empty_epoch_falls_back_to_rotated(tmp_path):
    work = copy_fixture("10-backup-source", tmp_path)
    (work / "epoch").write_bytes(b"")
    rotated = [p for p in work.iterdir() if p.name.startswith("epoch.")]
    assert [p.name for p in rotated] == ["epoch.01795335762217.4"]
    fallback = max(epoch_records(rotated[0]))
    assert fallback == 3
    active_epochs = [f["epoch"] for _, t, f in walk((work / "pwal_0000").read_bytes()) if t == 2]
    assert active_epochs == [6]
    rc, report = verify_json(work)
    assert rc == 1
    d = report["dirs"][0]
    assert d["status"] == "repairable"
    assert d["durable_epoch"] == fallback
    assert d["max_appeared_epoch"] == TABLE["10-backup-source"]["max_appeared_epoch"] == 6
    # the after-backup session of epoch 6 is no longer durable: one put fewer
    assert d["count_durable_wal_entries"] == TABLE["10-backup-source"]["count"] - 1
    assert codes(file_of(report, "pwal_0000")["findings"]) == [("nondurable_snippet", 0)]


def test_missing_epoch_falls_back_to_rotated(tmp_path):
    # 10-backup-copy has no `epoch` at all; the README says tglogutil reads durable epoch 3 from the
    # rotated one. The same with the source once its `epoch` is deleted.
    work = copy_fixture("10-backup-source", tmp_path)
    (work / "epoch").unlink()
    rc, report = verify_json(work)
    assert rc == 1
    assert report["dirs"][0]["durable_epoch"] == 3


def test_empty_epoch_falls_back_to_any_epoch_file(tmp_path):
    # limestone's last_durable_epoch_in_dir reads every name that starts with "epoch" once `epoch` is empty
    work = copy_fixture("01-clean", tmp_path)
    records = epoch_records(work / "epoch")
    (work / "epoch").rename(work / "epoch.bak")
    (work / "epoch").write_bytes(b"")
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert max(records) == TABLE["01-clean"]["durable_epoch"] > 0
    assert (rc, d["status"], d["durable_epoch"]) == (0, "ok", max(records))
    assert d["count_durable_wal_entries"] == TABLE["01-clean"]["count"]
    assert file_of(report, "epoch.bak")["kind"] == "epoch_rotated"


def test_stray_epoch_names_unread_while_epoch_has_records(tmp_path):
    # Other names that start with "epoch" are read by limestone only when `epoch` has no record.
    work = copy_fixture("10-backup-source", tmp_path)
    (work / "epoch_old").mkdir()
    (work / "epoch.txt.bak").write_bytes(b"junk\n")
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (TABLE["10-backup-source"]["exit"], "ok")
    assert not {"epoch_old", "epoch.txt.bak"} & {Path(f["path"]).name for f in report["files"]}
    (work / "epoch").write_bytes(b"")
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert (rc, d["status"]) == (2, "cannot_check")
    assert {Path(f["file"]).name for f in d["findings"] if f["code"] == "unreadable_epoch"} == {
        "epoch_old", "epoch.txt.bak"}


def test_limestone_dir_reached_twice_is_checked_once(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    (tmp_path / "link").symlink_to(work, target_is_directory=True)
    rc, report = verify_json(tmp_path)
    assert rc == 0 and len(report["dirs"]) == 1
    proc = run_main("verify", work, tmp_path / "link", "--json")
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["dirs"]) == 1


def test_damaged_rotated_epoch_unread_while_epoch_has_records(tmp_path):
    # limestone never reads the rotated epoch files while `epoch` has a record: the directory keeps its
    # verdict, and the damaged file is a finding of its own (exit 1).
    work = copy_fixture("10-backup-source", tmp_path)
    rotated = work / "epoch.01795335762217.4"
    size = rotated.stat().st_size
    with open(rotated, "ab") as f:
        f.write(b"\x04")
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert (rc, d["status"], d["durable_epoch"]) == (1, "ok", TABLE["10-backup-source"]["durable_epoch"])
    assert d["findings"] == []
    assert codes(file_of(report, rotated.name)["findings"]) == [("partial_epoch_record", size)]
    (work / "epoch").write_bytes(b"")  # now limestone must read it, and cannot
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (2, "cannot_check")
    assert [f["code"] for f in report["dirs"][0]["findings"]] == ["unreadable_epoch"]


@pytest.mark.parametrize("name,kind", [("epoch", "fifo"), ("epoch", "dir"), (MANIFEST, "fifo"), (MANIFEST, "dir"),
                                       ("pwal_0003", "fifo"), ("pwal_0003", "dir"), ("pwal_0003", "dangling"),
                                       ("compaction_catalog", "fifo")])
def test_entry_that_is_not_a_file(name, kind, tmp_path):
    """What limestone must read but cannot (a FIFO would block every reader) is a finding, never a hang or a
    traceback; a catalog limestone cannot read falls back to its backup."""
    work = copy_fixture("11-online-compaction", tmp_path)
    path = work / name
    if path.exists():
        path.unlink()
    {"fifo": os.mkfifo, "dir": Path.mkdir, "dangling": lambda p: p.symlink_to(tmp_path / "nothing")}[kind](path)
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert [f["code"] for f in file_of(report, name)["findings"]] == ["not_a_file"]
    assert file_of(report, name)["status"] == "damaged"
    if name == "compaction_catalog":
        assert (rc, d["status"], [f["code"] for f in d["findings"]]) == (1, "repairable", ["bad_catalog"])
    else:
        expected = {"epoch": "unreadable_epoch", MANIFEST: "bad_manifest"}.get(name, "not_a_file")
        assert (rc, d["status"], [f["code"] for f in d["findings"]]) == (2, "cannot_check", [expected])


def test_dangling_blob_is_a_finding(tmp_path):
    work = copy_fixture("11-online-compaction", tmp_path)
    blob = next((work / "blob").glob("dir_*/*.blob"))
    extra = blob.parent / "00000000000000ff.blob"
    extra.symlink_to(tmp_path / "nothing")
    rc, report = verify_json(work)
    assert rc == 1
    assert report["dirs"][0]["status"] == STATUS[TABLE["11-online-compaction"]["status"]]
    assert codes(file_of(report, extra.name)["findings"]) == [("not_a_file", None)]


CATALOG = (b"COMPACTION_CATALOG_HEADER\nCOMPACTED_FILE pwal_0000.compacted 1\n"
           b"DETACHED_PWAL pwal_0000.01795335762261.0\nDETACHED_PWAL pwal_0001.01795335762262.0\n"
           b"DETACHED_PWAL pwal_0002.01795335762262.0\nMAX_EPOCH_ID 4\nMAX_BLOB_ID 1\nCOMPACTION_CATALOG_FOOTER\n")


@pytest.mark.parametrize("text", [
    CATALOG.replace(b"HEADER\n", b"HEADER\n\n  \n"),
    CATALOG.replace(b"COMPACTED_FILE ", b"COMPACTED_FILE \t "),
    CATALOG + b"\n\nwhat follows the footer is never read",
    CATALOG[:-1],
    CATALOG.replace(b"MAX_EPOCH_ID", b"GENERATION 0\nMAX_EPOCH_ID"),
], ids=["blank-lines", "more-whitespace", "after-footer", "no-final-newline", "generation"])
def test_catalog_read_as_limestone_reads_it(text, tmp_path):
    """Variants limestone's load_catalog_file accepts (compaction_catalog.cpp)."""
    work = copy_fixture("11-online-compaction", tmp_path)
    assert (work / "compaction_catalog").read_bytes() == CATALOG
    (work / "compaction_catalog").write_bytes(text)
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (0, "ok")
    assert file_of(report, "compaction_catalog")["findings"] == []


@pytest.mark.parametrize("text,bad_line", [
    (CATALOG.replace(b"MAX_EPOCH_ID 4\n", b""), b"COMPACTION_CATALOG_FOOTER"),  # found missing at the footer
    (CATALOG.replace(b"MAX_BLOB_ID", b"MAX_BLOB"), b"MAX_BLOB"),
    (CATALOG.replace(b"1\nDETACHED", b"x\nDETACHED"), b"COMPACTED_FILE"),
    (CATALOG[:-2], b"COMPACTION_CATALOG_FOOTE"),  # a line of an unknown key
    (CATALOG[:-len(b"COMPACTION_CATALOG_FOOTER\n")], None),  # no footer at all: cut short at the end
    (CATALOG.replace(b"MAX_EPOCH_ID 4", b"MAX_EPOCH_ID 18446744073709551616"), b"MAX_EPOCH_ID"),  # 2**64
    (CATALOG.replace(b"compacted 1", b"compacted 2147483648"), b"COMPACTED_FILE"),  # an int's 2**31
], ids=["no-max-epoch-id", "unknown-key", "bad-version", "cut-footer", "no-footer", "epoch-overflow",
        "version-overflow"])
def test_catalog_limestone_cannot_load(text, bad_line, tmp_path):
    # Its backup is good, so limestone falls back to it: repairable.
    offset = text.index(bad_line) if bad_line else len(text)
    work = copy_fixture("11-online-compaction", tmp_path)
    (work / "compaction_catalog").write_bytes(text)
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (1, "repairable")
    assert codes(file_of(report, "compaction_catalog")["findings"]) == [("bad_catalog", offset)]


def test_missing_compacted_file(tmp_path):
    work = copy_fixture("11-online-compaction", tmp_path)
    (work / "pwal_0000.compacted").unlink()
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert rc == 1
    assert [(f["code"], Path(f["file"]).name) for f in d["findings"]] == [("missing_compacted_file",
                                                                          "pwal_0000.compacted")]


def test_unknown_entry_inside_a_durable_snippet(tmp_path):
    work = copy_fixture("01-clean", tmp_path)
    data = bytearray((work / "pwal_0000").read_bytes())
    entries = list(walk(bytes(data)))
    assert entries[0][1] == 2 and entries[0][2]["epoch"] <= TABLE["01-clean"]["durable_epoch"]
    at = next(off for off, t, _ in entries if t == 1)  # a put of the first, durable, snippet
    data[at] = 0x2B  # no entry type
    (work / "pwal_0000").write_bytes(bytes(data))
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (1, "unrepairable")
    assert codes(file_of(report, "pwal_0000")["findings"]) == [("corrupted_durable_snippet", at)]


def test_data_entry_right_after_an_end_marker(tmp_path):
    # From format 6 every session ends with 03 <epoch> 01; after it only a header or the end may come.
    work = copy_fixture("01-clean", tmp_path)
    data = bytearray((work / "pwal_0000").read_bytes())
    entries = list(walk(bytes(data)))
    at = next(entries[i + 1][0] for i, (_, t, _) in enumerate(entries[:-1]) if t == 3)
    assert data[at] == 2
    data[at] = 1  # the next snippet's header turned into a put
    (work / "pwal_0000").write_bytes(bytes(data))
    rc, report = verify_json(work)
    assert (rc, report["dirs"][0]["status"]) == (1, "unrepairable")
    assert min(codes(file_of(report, "pwal_0000")["findings"]), key=lambda c: c[1]) == ("unexpected_entry", at)


# --------------------------------------------------------------------------- a running limestone


LOCKER = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def hold_lock():
    """start(dir): a subprocess holds flock(LOCK_EX) on dir's manifest, as a running limestone does."""
    procs: list[subprocess.Popen] = []

    def start(root: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(root / MANIFEST)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        try:
            proc.stdin.close()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_live_verify(tmp_path, hold_lock):
    work = copy_fixture("01-clean", tmp_path)
    hold_lock(work)
    before = tree_snapshot(tmp_path)
    rc, report = verify_json(work)
    d = report["dirs"][0]
    assert d["live"] is True
    assert (d["status"], d["durable_epoch"], d["count_durable_wal_entries"]) == ("ok", 3, 9)
    assert rc == 0
    assert tree_snapshot(tmp_path) == before


def test_live_rotate_and_repair_refused(tmp_path, hold_lock):
    clean = copy_fixture("01-clean", tmp_path)
    crashed = copy_fixture("02-unfinished", tmp_path)
    hold_lock(clean)
    hold_lock(crashed)
    before = tree_snapshot(tmp_path)
    proc = run_main("rotate", clean)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    proc = run_main("repair", crashed, "--apply")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    proc = run_main("repair", crashed, "--apply", "--cut")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert tree_snapshot(tmp_path) == before

"""The walvault command line: walcore.cli.main in process, and the installed entry point in a subprocess where the
process is what is tested (its exit code, its output bytes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import walcore.scan_paths as verify_mod
from conftest import (REPO, SHARED, TARANTOOL_FIXTURES, copy_tree, require_shared, run_cli, run_main,
                      tree_snapshot, walvault_command)
from tarantool_bytes import framing
from walcore.runner import LocalRunner
from walcore.tarantool.block import FIXHEADER_SIZE
from walcore.tarantool.writer import TarantoolWriter, generate_wal

FILE_KEYS = {"path", "family", "kind", "status", "size", "rows", "blocks", "zstd_blocks", "eof", "instance", "vclock",
             "prev_vclock", "lsn_ranges", "findings"}
CHAIN_KEYS = {"path", "status", "findings", "xlogs", "snapshots"}
SUFFIXES = (".xlog", ".snap", ".vylog", ".run", ".index")


def block_offsets(path: Path) -> list[int]:
    return [b.pos for b in framing(path.read_bytes()).blocks]


def flip(path: Path, offset: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout


@pytest.fixture
def damaged_features(tmp_path):
    """A copy of features/ with one byte flipped inside the 3rd block's rows of 197.xlog."""
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    xlog = work / "wal" / "00000000000000000197.xlog"
    block = block_offsets(xlog)[2]
    flip(xlog, block + FIXHEADER_SIZE + 3)
    return work, xlog, block


# --------------------------------------------------------------------------- exit codes


@require_shared
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_exit_0_on_the_fixtures(command):
    proc = run_main(command, TARANTOOL_FIXTURES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    no_traceback(proc)
    assert proc.stdout.rstrip().endswith("verdict: INTACT")


@require_shared
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_exit_1_on_a_damaged_copy(command, damaged_features):
    work, xlog, block = damaged_features
    proc = run_main(command, work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    no_traceback(proc)
    assert "verdict: FINDINGS" in proc.stdout
    # the finding names its code and the damaged block's byte offset
    line = next(line for line in proc.stdout.splitlines() if "crc_mismatch" in line)
    assert f"crc_mismatch at byte {block}" in line
    assert xlog.name in proc.stdout


@require_shared
def test_exit_1_for_a_damaged_file_given_alone(damaged_features):
    _, xlog, _ = damaged_features
    proc = run_cli("verify", xlog)  # the real entry point's exit code
    assert proc.returncode == 1
    no_traceback(proc)


@require_shared
@pytest.mark.parametrize("args", [
    ["verify", "{missing}"],
    ["inspect", "{missing}"],
    ["verify", "{fixtures}", "{missing}"],
    ["verify", "--json", "{missing}"],
], ids=["verify", "inspect", "with-a-good-path", "json"])
def test_exit_2_on_a_missing_path(args, tmp_path):
    missing = tmp_path / "no" / "such.xlog"
    proc = run_main(*[a.format(missing=missing, fixtures=TARANTOOL_FIXTURES / "features") for a in args])
    assert proc.returncode == 2
    no_traceback(proc)
    assert str(missing) in proc.stderr
    assert proc.stdout == ""  # no partial report that could be mistaken for a verdict


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_exit_2_when_there_is_nothing_to_check(command, tmp_path):
    """An empty directory, or one of other files, must not pass for an intact WAL."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a WAL\n")
    for path in (tmp_path / "empty", tmp_path / "other"):
        proc = run_main(command, str(path))
        assert proc.returncode == 2
        no_traceback(proc)
        assert "no WAL files" in proc.stderr and str(path) in proc.stderr
        assert proc.stdout == ""


@require_shared
@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_exit_2_when_one_path_has_nothing_to_check(command, tmp_path):
    """Every path given must hold something checked: an empty directory beside a good one, or one
    holding only *.inprogress files (which are never checked as finished files), is exit 2."""
    good = copy_tree(TARANTOOL_FIXTURES / "concurrent", tmp_path / "good")
    assert run_main(command, good).returncode == 0
    (tmp_path / "empty").mkdir()
    (tmp_path / "writing").mkdir()
    snap = next(good.glob("*.snap"))
    (tmp_path / "writing" / (snap.name + ".inprogress")).write_bytes(snap.read_bytes())
    for path in (tmp_path / "empty", tmp_path / "writing"):
        proc = run_main(command, good, path)
        assert proc.returncode == 2, proc.stdout
        no_traceback(proc)
        assert "no WAL files" in proc.stderr and str(path) in proc.stderr and str(good) not in proc.stderr


@require_shared
def test_a_file_given_by_name_must_be_a_wal_file(tmp_path):
    # Neither its name nor its meta says what it is: not a WAL file (exit 2), not a damaged one. A renamed
    # xlog still says what it is in its meta.
    notes = tmp_path / "notes.txt"
    notes.write_text("not a WAL\n")
    proc = run_main("verify", notes)
    assert proc.returncode == 2 and "no WAL files" in proc.stderr, proc.stdout
    renamed = tmp_path / "backup.bin"
    renamed.write_bytes((TARANTOOL_FIXTURES / "concurrent" / "00000000000000000000.xlog").read_bytes())
    proc = run_main("verify", "--json", renamed)
    assert proc.returncode == 0, proc.stderr
    assert [f["kind"] for f in json.loads(proc.stdout)["files"]] == ["xlog"]


def test_a_limestone_blob_file_given_by_name_stands_for_its_log_directory():
    # The archive DAG verifies the files it archived, blob files among them, beside Tarantool files: a blob under
    # blob/dir_NN/ is its log directory's, not a Tarantool file without a meta block.
    sample = REPO / "samples" / "limestone" / "01-clean"
    blob = next(sample.glob("blob/dir_*/*.blob"))
    xlog = TARANTOOL_FIXTURES / "concurrent" / "00000000000000000000.xlog"
    proc = run_main("verify", "--json", blob, xlog)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert [f["kind"] for f in report["files"] if f["family"] == "tarantool"] == ["xlog"]
    assert [Path(d["path"]).resolve() for d in report["dirs"]] == [sample.resolve()]


@require_shared
def test_paths_reached_through_symlinks_are_checked(tmp_path):
    # A directory whose WAL files are all symlinks, or that is a link to a directory, holds them all the same.
    real = copy_tree(TARANTOOL_FIXTURES / "concurrent", tmp_path / "real")
    links = tmp_path / "links"
    links.mkdir()
    for p in real.iterdir():
        (links / p.name).symlink_to(p)
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    for path in (links, tmp_path / "alias"):
        proc = run_main("verify", path)
        assert proc.returncode == 0, proc.stderr


@require_shared
def test_symlink_loop_in_a_limestone_dir(tmp_path):
    work = copy_tree(SHARED / "fixtures" / "limestone" / "01-clean", tmp_path / "log")
    (work / "epoch").unlink()
    (work / "epoch").symlink_to("epoch")  # a loop: stat says ELOOP
    proc = run_main("verify", "--json", work)
    no_traceback(proc)
    assert proc.returncode == 2
    assert [f["code"] for f in json.loads(proc.stdout)["dirs"][0]["findings"]] == ["unreadable_epoch"]


@require_shared
def test_file_name_not_utf8_prints(tmp_path):
    # Under a strict UTF-8 stdout (en_US.UTF-8 and the like), a name that is not UTF-8 is escaped.
    name = os.fsdecode(b"\xff00.xlog")
    (tmp_path / name).write_bytes((TARANTOOL_FIXTURES / "concurrent" / "00000000000000000000.xlog").read_bytes())
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    proc = subprocess.run([*walvault_command(), "inspect", str(tmp_path)], capture_output=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert b"\\udcff00.xlog" in proc.stdout


@pytest.mark.parametrize("args", [
    [],
    ["verify"],
    ["inspect"],
    ["verify", "--frobnicate", "x"],
    ["frobnicate", "x"],
    ["verify", "--jobs", "0", "x"],
    ["verify", "--jobs", "-3", "x"],
    ["verify", "--jobs", "two", "x"],
    ["inspect", "--jobs", "0", "x"],
], ids=lambda a: " ".join(a) or "nothing")
def test_exit_2_on_bad_usage(args):
    proc = run_main(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    no_traceback(proc)
    assert "walvault" in proc.stderr
    assert proc.stdout == ""


def test_help_exits_0():
    proc = run_cli("verify", "--help")  # the real entry point's exit and stdout
    assert proc.returncode == 0
    assert "--jobs" in proc.stdout and "--json" in proc.stdout


def test_help_names_every_command_and_a_command_line_parses_alone():
    """The parser of a command line holds its command's subparser alone (start-up time): the top-level help still
    names every command, and a command's own help and parsing are those of the parser with all of them."""
    from walcore.cli import COMMANDS, _parser

    proc = run_cli("--help")
    assert proc.returncode == 0
    assert all(c.name in proc.stdout for c in COMMANDS)
    argv = ["backup", "/data", "--repo", "/repo", "--type", "incremental", "--json"]
    alone, whole = _parser(argv), _parser([])
    assert vars(alone.parse_args(argv)) == vars(whole.parse_args(argv))
    sub_alone, sub_whole = (next(a for a in p._actions if a.dest == "command").choices for p in (alone, whole))
    assert list(sub_alone) == ["backup"] and len(sub_whole) == len(COMMANDS)
    assert sub_alone["backup"].format_help() == sub_whole["backup"].format_help()


# --------------------------------------------------------------------------- JSON


@require_shared
def test_json_has_the_contract_keys():
    proc = run_main("inspect", "--json", TARANTOOL_FIXTURES)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert set(data) == {"files", "chains", "dirs", "scan_core"} and data["dirs"] == []
    assert data["scan_core"] == "compiled (walcore._scan)"
    expected = {json.loads(line)["file"]: json.loads(line)
                for line in (TARANTOOL_FIXTURES / "expected-xlog-pairs-summary.jsonl").read_text().splitlines()}
    seen = {}
    for f in data["files"]:
        assert set(f) == FILE_KEYS, f["path"]
        assert f["family"] == "tarantool"
        seen[str(Path(f["path"]).resolve().relative_to(TARANTOOL_FIXTURES.resolve()))] = f
    assert sorted(seen) == sorted(expected)
    for name, f in seen.items():
        e = expected[name]
        assert f["kind"] == Path(name).suffix[1:]
        assert f["status"] == "ok" and f["findings"] == [] and f["eof"] is True
        assert f["size"] == (TARANTOOL_FIXTURES / name).stat().st_size
        assert f["rows"] == e["rows"]
        if e["rows"]:
            assert min(lo for lo, _ in f["lsn_ranges"].values()) == e["min_lsn"]
            assert max(hi for _, hi in f["lsn_ranges"].values()) == e["max_lsn"]
        else:
            assert f["lsn_ranges"] == {}
        assert all(isinstance(k, str) and k.isdigit() for k in f["lsn_ranges"])
        if f["kind"] in ("run", "index"):
            assert f["vclock"] is None
        else:
            assert all(k.isdigit() and isinstance(v, int) for k, v in f["vclock"].items())
    last = seen["features/wal/00000000000000000437.xlog"]
    assert last["vclock"] == {"0": 8, "1": 429} and last["prev_vclock"] == {"0": 3, "1": 358}
    assert last["instance"] == "aaaaaaaa-bbbb-4ccc-8ddd-000000000001"
    assert len(data["chains"]) == 3
    for chain in data["chains"]:
        assert set(chain) == CHAIN_KEYS
        assert chain["status"] == "ok" and chain["findings"] == []
        assert all(Path(p).suffix == ".xlog" for p in chain["xlogs"])


@require_shared
def test_json_findings_carry_code_offset_message(damaged_features):
    work, xlog, block = damaged_features
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1
    no_traceback(proc)
    data = json.loads(proc.stdout)
    assert set(data) == {"files", "chains", "dirs"} and data["dirs"] == []
    damaged = [f for f in data["files"] if f["status"] == "damaged"]
    assert [Path(f["path"]).name for f in damaged] == [xlog.name]
    findings = damaged[0]["findings"]
    assert findings and all(set(x) == {"code", "offset", "message"} for x in findings)
    assert all(isinstance(x["message"], str) and x["message"] for x in findings)
    assert findings[0]["code"] == "crc_mismatch" and findings[0]["offset"] == block
    assert all(f["findings"] == [] for f in data["files"] if f is not damaged[0])
    (chain,) = data["chains"]
    assert chain["status"] == "damaged"
    assert chain["findings"] and all({"code", "offset", "message", "file"} <= set(x) for x in chain["findings"])
    assert any(x["code"] == "damaged_file" and Path(x["file"]).name == xlog.name for x in chain["findings"])


# --------------------------------------------------------------------------- human output


@require_shared
def test_inspect_lists_every_file_and_verify_prints_a_verdict():
    root = TARANTOOL_FIXTURES / "features"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in SUFFIXES)
    proc = run_main("inspect", root)
    assert proc.returncode == 0
    listed = [line.split()[2] for line in proc.stdout.splitlines() if line.startswith("OK ")]
    assert sorted(listed) == files
    assert proc.stdout.rstrip().splitlines()[-1] == "verdict: INTACT"
    proc = run_main("verify", root)
    assert proc.returncode == 0
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1] == "verdict: INTACT"
    assert f"{len(files)} files" in proc.stdout


# --------------------------------------------------------------------------- *.inprogress


@require_shared
def test_inprogress_files_are_reported_not_damage(tmp_path):
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    snap = work / "memtx" / "00000000000000000361.snap"
    good = work / "memtx" / "00000000000000000500.snap.inprogress"
    good.write_bytes(snap.read_bytes())
    garbage = work / "vinyl" / "00000000000000000500.vylog.inprogress"
    garbage.write_bytes(b"\xd5\xba\x0b\xab this is not a vylog" * 50)
    half = work / "vinyl" / "513" / "0" / "00000000000000000099.run.inprogress"
    half.write_bytes(snap.read_bytes()[:700])
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 0, proc.stdout
    no_traceback(proc)
    data = json.loads(proc.stdout)
    statuses = {Path(f["path"]).name: f for f in data["files"]}
    for p in (good, garbage, half):
        assert statuses[p.name]["status"] == "in_progress"
        assert statuses[p.name]["findings"] == []
    assert {f["status"] for n, f in statuses.items() if not n.endswith(".inprogress")} == {"ok"}
    assert all(c["status"] == "ok" for c in data["chains"])
    text = run_main("inspect", work)
    assert text.returncode == 0
    assert "3 in progress" in text.stdout and "verdict: INTACT" in text.stdout


# --------------------------------------------------------------------------- read only


@require_shared
def test_inspect_and_verify_never_modify_the_source(tmp_path):
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "data")
    # every kind of file walcore meets: damaged, open (no EOF marker), in progress, foreign
    flip(work / "wal" / "00000000000000000123.xlog", block_offsets(work / "wal" / "00000000000000000123.xlog")[1] + 25)
    generate_wal(work / "other", target_bytes=3 << 20, file_bytes=1 << 20)  # last xlog left open
    (work / "memtx" / "00000000000000000999.snap.inprogress").write_bytes(b"half a snapshot")
    (work / "README.txt").write_text("not a Tarantool file")
    before = tree_snapshot(work)
    codes = set()
    for jobs in ("1", "2"):
        for command in ("inspect", "verify"):
            for extra in ([], ["--json"]):
                proc = run_main(command, "--jobs", jobs, *extra, work)
                no_traceback(proc)
                codes.add(proc.returncode)
                assert tree_snapshot(work) == before, (command, jobs, extra)
    assert codes == {1}


# --------------------------------------------------------------------------- --jobs 2 splits big files


@pytest.fixture(scope="module")
def big_wal(tmp_path_factory):
    """A 6 MB generated WAL in one open xlog (plus its snapshot)."""
    root = tmp_path_factory.mktemp("bigwal")
    files = generate_wal(root / "clean", target_bytes=6 << 20)
    xlog = next(p for p in files if p.suffix == ".xlog")
    assert xlog.stat().st_size > 5 << 20
    return root / "clean", xlog


def _damage(kind: str, data: bytearray) -> bytearray:
    n = len(data)
    if kind == "flips":  # payload bytes near the cut points of an 8-way split
        for i in (1, 3, 5, 7):
            data[n * i // 8] ^= 0xFF
    elif kind == "zeroed-cut":  # a run of zeros across a cut point
        data[n // 2 - 40:n // 2 + 40] = bytes(80)
    elif kind == "hole":  # bytes missing from the middle: framing lost until the next block
        del data[n // 3:n // 3 + 3000]
    elif kind == "torn-tail":
        del data[n - 1000:]
    return data


@pytest.mark.parametrize("damage", ["clean", "flips", "zeroed-cut", "hole", "torn-tail"])
def test_jobs_2_split_scan_equals_jobs_1(monkeypatch, big_wal, tmp_path, damage):
    clean, xlog = big_wal
    if damage == "clean":
        target = clean
    else:
        target = copy_tree(clean, tmp_path / damage)
        p = target / xlog.name
        p.write_bytes(bytes(_damage(damage, bytearray(p.read_bytes()))))
    proc = run_main("verify", "--json", "--jobs", "1", target)
    assert proc.returncode == (0 if damage == "clean" else 1), proc.stderr
    sequential = json.loads(proc.stdout)

    monkeypatch.setattr(verify_mod, "SPLIT_SIZE", 1 << 20)
    joined = []
    real_join = verify_mod._join

    def spy(path, parts):
        joined.append((Path(path).name, len(parts)))
        return real_join(path, parts)

    monkeypatch.setattr(verify_mod, "_join", spy)
    parallel = verify_mod.verify_paths([target], runner=LocalRunner(2)).to_json()
    assert dict(joined)[xlog.name] >= 4, "the big xlog was not split"
    assert parallel == sequential
    statuses = {Path(f["path"]).name: f["status"] for f in sequential["files"]}
    assert statuses[xlog.name] == ("open" if damage == "clean" else "damaged")


@pytest.mark.slow
def test_jobs_2_on_a_wal_bigger_than_split_size_via_cli(tmp_path):
    files = generate_wal(tmp_path / "wal", target_bytes=verify_mod.SPLIT_SIZE + (8 << 20))
    assert max(p.stat().st_size for p in files) > verify_mod.SPLIT_SIZE
    one = run_main("verify", "--json", "--jobs", "1", tmp_path / "wal")
    two = run_main("verify", "--json", "--jobs", "2", tmp_path / "wal")
    assert one.returncode == two.returncode == 0
    assert json.loads(one.stdout) == json.loads(two.stdout)


# --------------------------------------------------------------------------- crafted bad data never crashes


def test_nil_lsn_in_a_snapshot_is_a_finding_not_a_crash(tmp_path):
    path = tmp_path / "00000000000000000000.snap"
    with TarantoolWriter(path, "SNAP", instance="aaaaaaaa-bbbb-4ccc-8ddd-0000000000f2", vclock={}) as w:
        w.write_block([({0: 2, 3: None}, {0x10: 512, 0x21: [1]}), ({0: 2, 3: 1}, {0x10: 512, 0x21: [2]})],
                      compressed=False)
    proc = run_main("verify", path)
    no_traceback(proc)
    assert proc.returncode == 1


@require_shared
def test_fifos_and_devices_are_never_opened(tmp_path):
    """A FIFO named like a WAL file would block a reader forever. In a Tarantool directory it is ignored,
    and given by name it cannot be checked (exit 2). In a limestone directory it cannot be checked
    either, since limestone opens every pwal_* file."""
    wal = tmp_path / "wal"
    copy_tree(TARANTOOL_FIXTURES / "features" / "wal", wal)
    os.mkfifo(wal / "00000000000000009999.xlog")
    proc = run_main("verify", "--json", wal)
    assert proc.returncode == 0, proc.stderr
    paths = {Path(f["path"]).name for f in json.loads(proc.stdout)["files"]}
    assert "00000000000000009999.xlog" not in paths and "00000000000000000437.xlog" in paths
    limestone = tmp_path / "log"
    copy_tree(SHARED / "fixtures" / "limestone" / "01-clean", limestone)
    os.mkfifo(limestone / "pwal_0009")
    proc = run_main("verify", "--json", limestone)
    assert proc.returncode == 2, proc.stderr
    d = json.loads(proc.stdout)["dirs"][0]
    assert (d["status"], [(f["code"], Path(f["file"]).name) for f in d["findings"]]) == (
        "cannot_check", [("not_a_file", "pwal_0009")])
    proc = run_main("verify", wal / "00000000000000009999.xlog")
    assert proc.returncode == 2 and "not a regular file" in proc.stderr
    no_traceback(proc)

"""walcore against a real Tarantool 2.6: files it writes, its own reader (xlog.pairs), its recovery.

Every expectation here comes from Tarantool (xlog_pairs_rows, start_recovery, the workload manifest)
or from the rows the test itself wrote, never from walcore.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import TARANTOOL_FIXTURES, append_vylog_records, copy_tree, require_shared, require_tarantool, run_main
from tarantool_bytes import framing
from walcore.runner import LocalRunner
from walcore.tarantool.meta import MAX_META_SIZE, parse_meta, vclock_sum
from walcore.tarantool.row import GROUP_ID, REPLICA_ID, ROW_TYPES, SPACE_ID, TIMESTAMP, TSN, TYPE, RowWalker
from walcore.tarantool.writer import TarantoolWriter, dml_header, file_name
from walcore.tarantool.xlog import read_rows, scan_file
from walcore.scan_paths import verify_paths

# Every test once on each scan core (compiled and pure-Python reference).
pytestmark = [require_tarantool, pytest.mark.usefixtures("scan_core")]

SUFFIXES = (".xlog", ".snap", ".vylog", ".run", ".index")
FIELDS = ("lsn", "type", "replica_id", "group_id", "tsn", "commit", "space_id", "tuple_len")
INSERT, REPLACE, UPDATE, DELETE = 2, 3, 4, 5
KEY, TUPLE = 0x20, 0x21


def tarantool_files(root: Path) -> list[Path]:
    return sorted(p for p in Path(root).rglob("*") if p.is_file() and p.suffix in SUFFIXES)


def walcore_rows(path: Path) -> list[dict]:
    """read_rows in xlog.pairs()'s conventions (see tests/tarantool_real.py: xlog_pairs_rows)."""
    out = []
    for _, row in read_rows(path):
        body = row.body or {}
        has_tsn = TSN in row.header
        if not has_tsn:
            assert row.tsn == row.lsn and row.commit is True
        tuple_len = len(body[TUPLE]) if TUPLE in body else len(body[KEY]) if KEY in body else None
        out.append({
            "lsn": row.lsn,
            "type": row.type_name,
            "replica_id": row.replica_id or None,
            "group_id": row.group_id or None,
            "tsn": row.tsn if has_tsn else None,
            "commit": True if has_tsn and row.commit else None,
            "space_id": row.space_id,
            "tuple_len": tuple_len,
        })
    return out


def row_mismatches(paths: list[Path]) -> list[str]:
    """Files where walcore's rows differ from Tarantool's xlog.pairs(), field by field."""
    problems = []
    for path in paths:
        expected = tr.xlog_pairs_rows(path)
        got = walcore_rows(path)
        if len(got) != len(expected):
            problems.append(f"{path}: walcore reads {len(got)} rows, xlog.pairs {len(expected)}")
            continue
        for i, (g, e) in enumerate(zip(got, expected)):
            if g != e:
                problems.append(f"{path}: row {i}: walcore {g} != xlog.pairs {e}")
                break
    return problems


def by_path(report) -> dict[Path, object]:
    return {Path(f.path).resolve(): f for f in report.files}


def xlogs_of(instance: Path) -> list[Path]:
    return sorted((instance / "wal").glob("*.xlog"))


def block_offsets(path: Path) -> list[int]:
    return [b.pos for b in framing(path.read_bytes()).blocks]


# --------------------------------------------------------------------------- a clean real instance


def test_real_instance_has_the_workload_we_rely_on(real_instance):
    files = tarantool_files(real_instance)
    kinds = Counter(p.suffix for p in files)
    assert kinds[".snap"] >= 4 and kinds[".xlog"] >= 10 and kinds[".run"] >= 2 and kinds[".index"] >= 2
    assert kinds[".vylog"] >= 4
    report = verify_paths([real_instance], runner=LocalRunner(1))
    xlogs = [f for f in report.files if f.kind == "xlog"]
    assert sum(f.zstd_blocks for f in xlogs) > 0
    # several transactions per block (concurrent fibers): more rows than blocks by far in some file
    assert any(f.rows >= 3 * f.blocks > 0 for f in xlogs)


def test_real_instance_rows_equal_xlog_pairs(real_instance):
    paths = tarantool_files(real_instance)
    assert row_mismatches(paths) == []
    # multi-statement transactions (tsn key), local rows and vinyl files were all compared
    rows = [r for p in paths if p.suffix == ".xlog" for r in walcore_rows(p)]
    assert any(r["tsn"] is not None and r["commit"] is None for r in rows)
    assert any(r["replica_id"] is None and r["group_id"] == 1 for r in rows)
    types = {r["type"] for p in paths for r in walcore_rows(p)}
    assert {"INSERT", "REPLACE", "UPDATE", "DELETE", "UPSERT", "RUNINFO", "PAGEINFO", "ROWINDEX"} <= types


def test_real_instance_verifies_intact(real_instance):
    manifest = tr.read_manifest(real_instance)
    report = verify_paths([real_instance], runner=LocalRunner(2))
    assert report.intact
    assert all(f.status == "ok" and f.findings == [] for f in report.files)
    assert len(report.files) == len(tarantool_files(real_instance))
    assert [Path(p).name for p in report.ignored] == [tr.MANIFEST_NAME]
    (chain,) = report.chains
    assert chain.status == "ok" and chain.findings == []
    assert [Path(p).resolve() for p in chain.xlogs] == xlogs_of(real_instance)
    assert len(chain.snapshots) == len(list((real_instance / "memtx").glob("*.snap")))
    assert all(s["replay_from"] is not None and s["status"] == "ok" for s in chain.snapshots)
    files = by_path(report)
    # the clean shutdown left a new empty xlog, named after the final vclock: walcore takes it as newest
    newest = files[xlogs_of(real_instance)[-1]]
    assert newest.vclock == manifest["vclock"] and newest.rows == 0 and newest.eof
    assert vclock_sum(newest.vclock) == manifest["vclock_sum"]
    # and the one before it ends exactly at that vclock
    before = files[xlogs_of(real_instance)[-2]]
    assert before.end_vclock() == manifest["vclock"]


def test_real_instance_row_counts_match_xlog_pairs_summary(real_instance):
    report = verify_paths([real_instance], runner=LocalRunner(1))
    for f in report.files:
        if f.kind == "xlog":
            summary = tr.xlog_pairs_summary(Path(f.path))
            assert f.rows == summary["rows"], f.path
            if f.rows:
                assert min(r[2] for r in f.lsns.values()) == summary["min_lsn"]
                assert max(r[3] for r in f.lsns.values()) == summary["max_lsn"]


def test_real_instance_scans_the_same_without_the_fast_path(real_instance, monkeypatch):
    """Blocks of real concurrent, multi-statement, local+global WAL traffic: fast path == exact walk."""
    paths = tarantool_files(real_instance)
    fast = {p: scan_file(p) for p in paths}
    monkeypatch.setattr(RowWalker, "walk", lambda self, payload: None)
    for p in paths:
        exact = scan_file(p)
        assert (fast[p].span, fast[p].findings) == (exact.span, exact.findings), p


# --------------------------------------------------------------------------- SIGKILL


def test_crashed_instance_newest_xlog_is_open(crashed_instance):
    manifest = tr.read_manifest(crashed_instance)
    report = verify_paths([crashed_instance], runner=LocalRunner(1))
    assert report.intact
    files = by_path(report)
    xlogs = xlogs_of(crashed_instance)
    newest = files[xlogs[-1]]
    assert not xlogs[-1].read_bytes().endswith(b"\xd5\x10\xad\xed")
    assert newest.status == "open" and newest.eof is False and newest.findings == []
    # SIGKILL came after the last write returned: nothing committed is missing
    assert newest.end_vclock() == manifest["vclock"]
    # the vylog Tarantool was appending to is left open too; every other file is closed
    newest_vylog = sorted((crashed_instance / "vinyl").glob("*.vylog"))[-1]
    assert files[newest_vylog].status == "open" and files[newest_vylog].findings == []
    assert all(f.status == "ok" for p, f in files.items() if p not in (xlogs[-1], newest_vylog))
    (chain,) = report.chains
    assert chain.status == "ok"

    proc = run_main("verify", crashed_instance)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_main("verify", "--json", crashed_instance)
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    statuses = {Path(f["path"]).name: f["status"] for f in data["files"] if f["kind"] == "xlog"}
    assert statuses.pop(xlogs[-1].name) == "open"
    assert set(statuses.values()) == {"ok"}


def test_verify_while_tarantool_writes(tmp_path):
    """A running instance appends to its newest xlog while walvault reads it: the file is judged as it
    was when opened (open and intact), never as cut short by the block being appended."""
    work = tmp_path / "live"
    work.mkdir()
    writer = subprocess.Popen([tr.TARANTOOL, str(tr.LUA_DIR / "live_writer.lua"), str(work)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        grown_during = 0
        for jobs in ("1", "2", "1", "2"):
            proc = run_main("verify", "--json", "--jobs", jobs, work)
            files = json.loads(proc.stdout)["files"]
            newest = max((f for f in files if f["kind"] == "xlog"), key=lambda f: f["path"])
            assert (proc.returncode, newest["status"], newest["findings"]) == (0, "open", []), proc.stdout
            grown_during += Path(newest["path"]).stat().st_size > newest["size"]
        assert grown_during  # the file did grow under the reader: the race was there to lose
    finally:
        writer.stdin.close()
        writer.wait(timeout=120)
    assert writer.returncode == 0
    assert run_main("verify", work).returncode == 0  # closed by a clean exit: every file whole


@pytest.fixture(scope="module")
def restarted_instance(crashed_instance, tmp_path_factory):
    """The crashed instance, copied and started again by Tarantool (which then shut down cleanly)."""
    work = copy_tree(crashed_instance, tmp_path_factory.mktemp("restarted") / "data")
    crashed = xlogs_of(work)[-1]
    result = tr.start_recovery(work)
    assert result.ok, result.log
    assert result.vclock == tr.read_manifest(work)["vclock"]
    assert result.counts == tr.read_manifest(work)["counts"]
    return work, crashed


def test_crash_then_restart_keeps_the_unclosed_xlog_and_chain_is_ok(restarted_instance):
    work, crashed = restarted_instance
    xlogs = xlogs_of(work)
    assert crashed in xlogs and xlogs[-1] != crashed, "Tarantool started a new xlog after the crashed one"
    assert not crashed.read_bytes().endswith(b"\xd5\x10\xad\xed"), "Tarantool left the crashed xlog unclosed"
    report = verify_paths([work], runner=LocalRunner(1))
    assert report.intact
    f = by_path(report)[crashed]
    assert f.status == "ok" and f.eof is False and f.findings == []
    (chain,) = report.chains
    assert chain.status == "ok" and chain.findings == []
    nxt = by_path(report)[xlogs[xlogs.index(crashed) + 1]]
    assert nxt.prev_vclock == f.vclock and nxt.vclock == f.end_vclock()


def test_crash_then_restart_rows_equal_xlog_pairs(restarted_instance):
    work, _ = restarted_instance
    assert row_mismatches(tarantool_files(work)) == []


def test_unclosed_xlog_cut_short_before_the_next_one_is_damage(restarted_instance, tmp_path):
    """Control: the unclosed xlog is fine only because the next one continues where it ends."""
    work = copy_tree(restarted_instance[0], tmp_path / "cut")
    crashed = work / "wal" / restarted_instance[1].name
    last_block = block_offsets(crashed)[-1]
    os.truncate(crashed, last_block)  # drop the whole last block: the framing stays valid
    assert scan_file(crashed).findings == []
    report = verify_paths([work], runner=LocalRunner(1))
    assert not report.intact
    f = by_path(report)[crashed.resolve()]
    assert f.status == "damaged" and "missing_eof" in [x.code for x in f.findings]
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert "rows_lost" in [x.code for x in chain.findings]
    proc = run_main("verify", work)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- files walcore writes, read by Tarantool

UUID = "aaaaaaaa-bbbb-4ccc-8ddd-0000000000f1"


def _expected(rows: list[tuple[dict, dict | None]]) -> list[dict]:
    """What xlog.pairs() must report for rows we wrote (its conventions, derived from our input)."""
    out = []
    for header, body in rows:
        body = body or {}
        multi = TSN in header
        lsn = header.get(3, 0)
        out.append({
            "lsn": lsn,
            "type": ROW_TYPES[header[TYPE]],
            "replica_id": header.get(REPLICA_ID),
            "group_id": header.get(GROUP_ID),
            "tsn": (lsn - header[TSN]) % (1 << 64) if multi else None,
            "commit": True if multi and header.get(9, 0) & 1 else None,
            "space_id": body.get(SPACE_ID),
            "tuple_len": len(body[TUPLE]) if TUPLE in body else len(body[KEY]) if KEY in body else None,
        })
    return out


def _local(rtype, lsn, *, tsn=None, commit=True):
    header = dml_header(rtype, lsn, 0, tsn=tsn, commit=commit)
    header[GROUP_ID] = 1
    return header


def test_written_xlog_is_read_by_tarantool(tmp_path):
    blocks = [
        # plain block: single-statement transactions
        ([(dml_header(REPLACE, lsn, 1), {SPACE_ID: 512, TUPLE: [lsn, f"row {lsn}"]}) for lsn in (1, 2, 3)], False),
        # zstd block: one multi-statement transaction with an UPDATE (tuple = update ops) and a DELETE
        ([(dml_header(INSERT, 4, 1, tsn=4, commit=False), {SPACE_ID: 512, TUPLE: [4, "four", 4]}),
          (dml_header(UPDATE, 5, 1, tsn=4, commit=False), {SPACE_ID: 512, KEY: [4], TUPLE: [["=", 2, "x"], ["+", 3, 1]]}),
          (dml_header(DELETE, 6, 1, tsn=4, commit=True), {SPACE_ID: 512, KEY: [1]})], True),
        # a transaction mixing a global and a local row: the local row's tsn wraps (tsn 7 > its lsn 1)
        ([(dml_header(REPLACE, 7, 1, tsn=7, commit=False), {SPACE_ID: 512, TUPLE: [7, "global"]}),
          (_local(REPLACE, 1, tsn=7, commit=True), {SPACE_ID: 514, TUPLE: [1, "local"]}),
          (_local(INSERT, 2), {SPACE_ID: 514, TUPLE: [2, "local single"]})], False),
        # big enough for Tarantool's own rule (>= 2048 bytes): compressed without being told
        ([(dml_header(REPLACE, lsn, 1), {SPACE_ID: 513, TUPLE: [lsn, "y" * 300]}) for lsn in range(8, 28)], None),
    ]
    path = tmp_path / file_name({}, "xlog")
    with TarantoolWriter(path, "XLOG", instance=UUID, vclock={}) as w:
        for rows, compressed in blocks:
            w.write_block(rows, compressed=compressed)
    written = [r for rows, _ in blocks for r in rows]
    expected = _expected(written)
    assert tr.xlog_pairs_rows(path) == expected
    assert walcore_rows(path) == expected
    assert expected[4]["tsn"] == 4 and expected[7]["tsn"] == 7 and expected[7]["lsn"] == 1
    scan = scan_file(path)
    assert scan.findings == [] and scan.span.eof
    assert (scan.span.blocks, scan.span.zstd_blocks) == (4, 2)
    assert tr.xlog_pairs_summary(path)["rows"] == len(written)


def test_written_snapshot_is_read_by_tarantool(tmp_path):
    rows = [({TYPE: INSERT, TIMESTAMP: 1.7e9} | ({3: i} if i else {}), {SPACE_ID: 512, TUPLE: [i, "s" * (i % 50)]})
            for i in range(300)]
    path = tmp_path / file_name({1: 300}, "snap")
    with TarantoolWriter(path, "SNAP", instance=UUID, vclock={1: 300}) as w:
        w.write_block(rows[:100], compressed=True)
        w.write_block(rows[100:], compressed=True)
    expected = _expected(rows)
    assert expected[0]["lsn"] == 0
    assert tr.xlog_pairs_rows(path) == expected
    assert walcore_rows(path) == expected


def test_written_open_xlog_is_read_by_tarantool(tmp_path):
    """An xlog without EOF marker (as a crash leaves it): Tarantool reads all of it; walcore calls it open."""
    path = tmp_path / file_name({1: 10}, "xlog")
    rows = [(dml_header(REPLACE, lsn, 1), {SPACE_ID: 512, TUPLE: [lsn]}) for lsn in range(11, 21)]
    w = TarantoolWriter(path, "XLOG", instance=UUID, vclock={1: 10}, prev_vclock={1: 0})
    w.write_block(rows[:5])
    w.write_block(rows[5:])
    w.close(eof=False)
    assert tr.xlog_pairs_rows(path) == _expected(rows)
    report = verify_paths([path], runner=LocalRunner(1))
    assert [f.status for f in report.files] == ["open"] and report.intact


def test_nil_replica_id_is_damage_like_for_tarantool(tmp_path):
    path = tmp_path / file_name({}, "xlog")
    with TarantoolWriter(path, "XLOG", instance=UUID, vclock={}) as w:
        w.write_block([({TYPE: REPLACE, REPLICA_ID: None, 3: 1}, {SPACE_ID: 512, TUPLE: [1]}),
                       (dml_header(REPLACE, 2, 1), {SPACE_ID: 512, TUPLE: [2]})], compressed=False)
    assert tr.xlog_pairs_rows(path) == []  # Tarantool's reader stops at the invalid header
    assert scan_file(path).findings != []


# --------------------------------------------------------------------------- recovery from what walcore wrote

FEATURES_UUID = "aaaaaaaa-bbbb-4ccc-8ddd-000000000001"


def _continue_features(tmp_path: Path) -> tuple[Path, Path, int, set[int]]:
    """A copy of features/ whose last (empty) xlog is replaced by one holding new rows for `mem`."""
    work = copy_tree(TARANTOOL_FIXTURES / "features", tmp_path / "features")
    last = work / "wal" / "00000000000000000437.xlog"
    meta = parse_meta(last.read_bytes()[:MAX_META_SIZE])
    assert (meta.vclock, meta.prev_vclock, meta.instance) == ({0: 8, 1: 429}, {0: 3, 1: 358}, FEATURES_UUID)
    ids = [1_000_000 + i for i in range(30)] + [1_000_000, 1_000_001]  # two REPLACEs of ids already written
    lsn = 430
    rows = []
    for key in ids:
        rows.append((dml_header(REPLACE, lsn, 1), {SPACE_ID: 512, TUPLE: [key, f"walcore {key}"]}))
        lsn += 1
    tx_ids = [2_000_000 + i for i in range(8)]
    tx = [(dml_header(REPLACE, lsn + i, 1, tsn=lsn, commit=i == len(tx_ids) - 1),
           {SPACE_ID: 512, TUPLE: [key, "tx" + "z" * 300]}) for i, key in enumerate(tx_ids)]
    with TarantoolWriter(last, "XLOG", instance=meta.instance, vclock=meta.vclock,
                         prev_vclock=meta.prev_vclock) as w:
        w.write_block(rows[:10], compressed=False)
        w.write_block(rows[10:], compressed=True)
        w.write_block(tx)  # >= 2048 bytes: zstd
    return work, last, len(rows) + len(tx), set(ids) | set(tx_ids)


@require_shared
def test_tarantool_recovers_from_an_xlog_written_by_walcore(tmp_path):
    work, last, n, new_ids = _continue_features(tmp_path)
    before = run_main("verify", "--json", work)
    assert before.returncode == 0, before.stdout + before.stderr
    f = next(f for f in json.loads(before.stdout)["files"] if f["path"].endswith(last.name))
    assert (f["status"], f["rows"], f["zstd_blocks"], f["lsn_ranges"]) == ("ok", n, 2, {"1": [430, 429 + n]})

    result = tr.start_recovery(work)
    assert result.ok, result.log
    assert result.vclock == {0: 8, 1: 429 + n}
    assert result.counts == {"mem": 183 + len(new_ids), "vin": 153, "loc": 3}

    # Tarantool went on from our file: its new xlog links to ours
    newest = xlogs_of(work)[-1]
    assert newest != last
    meta = parse_meta(newest.read_bytes()[:MAX_META_SIZE])
    assert meta.prev_vclock == {0: 8, 1: 429} and meta.vclock == {0: 8, 1: 429 + n}
    after = run_main("verify", work)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "verdict: INTACT" in after.stdout


@require_shared
def test_tarantool_refuses_the_same_xlog_with_one_byte_changed(tmp_path):
    """Control for the test above: Tarantool does check what we wrote, and so does walcore."""
    work, last, _, _ = _continue_features(tmp_path)
    offsets = block_offsets(last)
    data = bytearray(last.read_bytes())
    data[offsets[0] + 19 + 5] ^= 0x01  # inside the first block's rows
    last.write_bytes(bytes(data))
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1
    f = next(f for f in json.loads(proc.stdout)["files"] if f["path"].endswith(last.name))
    assert f["status"] == "damaged"
    assert {"code": "crc_mismatch", "offset": offsets[0]} == {k: f["findings"][0][k] for k in ("code", "offset")}
    result = tr.start_recovery(work)
    assert not result.started
    assert "checksum" in (result.error or "") + result.log


# --------------------------------------------------------------------------- vinyl runs the vylog needs


def _runs(instance: Path, index: int) -> list[Path]:
    return sorted((instance / "vinyl" / "513" / str(index)).glob("*.run"))


def _file_report(report: dict, path: Path) -> dict:
    return next(f for f in report["files"] if f["path"].endswith(path.name))


@pytest.mark.parametrize("suffix", [".run", ".index"])
def test_missing_run_in_use_is_found_and_tarantool_refuses_to_start(real_instance, tmp_path, suffix):
    work = copy_tree(real_instance, tmp_path / "data")
    newest_run = _runs(work, 0)[-1].with_suffix(suffix)  # the output of the last dump or compaction: in use
    newest_run.unlink()
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    vylog = sorted((work / "vinyl").glob("*.vylog"))[-1]
    f = _file_report(report, vylog)
    assert f["status"] == "damaged"
    assert [(x["code"], x["message"].split(" is missing")[0].rsplit(" ", 1)[-1]) for x in f["findings"]] == \
        [("missing_run_file", f"513/0/{newest_run.name}")]
    assert [x["code"] for x in report["chains"][0]["findings"]] == ["damaged_file"]
    result = tr.start_recovery(work)
    assert not result.started, result.log
    assert newest_run.name in (result.error or ""), result.error


def test_run_a_crash_cut_short_is_in_progress_and_tarantool_starts(real_instance, tmp_path):
    # kill -9 during a dump: the vylog holds only PREPARE_RUN for the run, whose .run has no EOF marker yet.
    # Tarantool deletes it unread at the next start; it is an unfinished write, not damage.
    work = copy_tree(real_instance, tmp_path / "data")
    vylog = sorted((work / "vinyl").glob("*.vylog"))[-1]
    lsm_id = next((row.body[0x21][1].get(0, 0)) for _, row in read_rows(vylog)
                  if row.body[0x21][0] == 0 and row.body[0x21][1].get(6) == 513 and row.body[0x21][1].get(5, 0) == 0)
    append_vylog_records(vylog, [{0x21: (4, {0: lsm_id, 2: 100000})}])  # PREPARE_RUN of run 100000
    written = _runs(work, 0)[-1].read_bytes()
    cut = work / "vinyl" / "513" / "0" / f"{100000:020d}.run"
    cut.write_bytes(written[:len(written) * 2 // 3])
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = _file_report(json.loads(proc.stdout), cut)
    assert f["status"] == "in_progress" and f["findings"], f
    before = tr.start_recovery(copy_tree(real_instance, tmp_path / "untouched"))
    result = tr.start_recovery(work)
    assert result.ok and result.counts == before.counts, result.error


def test_vylog_ahead_of_the_newest_snapshot_is_found_and_tarantool_refuses_to_start(real_instance, tmp_path):
    work = copy_tree(real_instance, tmp_path / "data")
    sorted((work / "memtx").glob("*.snap"))[-1].unlink()  # someone deleted the snapshot, not the vylog
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    f = _file_report(report, sorted((work / "vinyl").glob("*.vylog"))[-1])
    assert [x["code"] for x in f["findings"]] == ["vylog_ahead_of_snapshot"] and f["status"] == "damaged"
    result = tr.start_recovery(work)
    assert not result.started and "Can't find snapshot" in (result.error or "") + result.log, result.error


def test_vylog_tarantool_wrote_dropping_a_tree_twice_is_refused(tmp_path):
    # A data dir Tarantool 2.6 wrote itself (tests/data/tarantool/README.md) and then refused to start on.
    work = copy_tree(Path(__file__).parent / "data" / "tarantool" / "drop-lsm-twice", tmp_path / "data")
    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = _file_report(json.loads(proc.stdout), sorted((work / "vinyl").glob("*.vylog"))[-1])
    assert [(x["code"], "LSM tree 77 twice" in x["message"]) for x in f["findings"]] == [("bad_vylog_record", True)]
    result = tr.start_recovery(work)
    assert not result.started and "LSM tree 77 deleted twice" in (result.error or "") + result.log, result.error


def test_missing_run_that_compaction_replaced_is_no_finding_and_tarantool_starts(real_instance, tmp_path):
    work = copy_tree(real_instance, tmp_path / "data")
    oldest = _runs(work, 0)[0]  # merged into a newer run by compaction, kept only until garbage collection
    oldest.unlink()
    oldest.with_suffix(".index").unlink()
    proc = run_main("verify", work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = tr.start_recovery(work)
    assert result.ok, result.error


# --------------------------------------------------------------------------- the newest xlog, snapshots, work_dir


def _run_nested(work: Path, lua: str) -> subprocess.CompletedProcess:
    """Run Tarantool with memtx_dir = vinyl_dir = work_dir and wal_dir = work_dir/wal (a common box.cfg)."""
    (work / "wal").mkdir(parents=True, exist_ok=True)
    cfg = (f"box.cfg{{work_dir='{work}', wal_dir='wal', wal_max_size=600, checkpoint_count=1000, "
           "checkpoint_interval=0, log_level=4}\n")
    return tr.run_lua_code(cfg + lua, cwd=work)


WRITE_20_AND_SNAPSHOT = ("box.schema.space.create('t'):create_index('pk')\n"
                         "for i = 1, 20 do box.space.t:replace{i, string.rep('x', 60)} end\nbox.snapshot()\n")
KILL_9 = "os.execute('kill -9 ' .. box.info.pid)\n"


def _newest_snapshot_link(report) -> tuple[object, dict]:
    (chain,) = report.chains
    return chain, max(chain.snapshots, key=lambda s: vclock_sum({int(k): v for k, v in s["vclock"].items()}))


def test_newest_xlog_is_never_covered_and_is_where_replay_starts(tmp_path):
    # After box.snapshot() and a clean shutdown the newest xlog is empty, sealed, at the snapshot's vclock:
    # all it holds is in the snapshot, yet Tarantool's next start writes into that very file, so no
    # snapshot may cover it (retention would delete the WAL a restarted instance writes).
    work = tmp_path / "work"
    assert _run_nested(work, WRITE_20_AND_SNAPSHOT + "os.exit(0)\n").returncode == 0
    restarted = copy_tree(work, tmp_path / "restarted")
    report = verify_paths([work], runner=LocalRunner(1))
    chain, snap = _newest_snapshot_link(report)
    assert chain.findings == []
    newest = Path(chain.xlogs[-1])
    assert by_path(report)[newest.resolve()].rows == 0
    assert newest.name == Path(snap["path"]).with_suffix(".xlog").name  # at the snapshot's vclock
    assert snap["covers"] == chain.xlogs[:-1] and snap["replay_from"] == str(newest)

    assert _run_nested(restarted, "for i = 21, 25 do box.space.t:replace{i} end\nos.exit(0)\n").returncode == 0
    snap_lsn = vclock_sum({int(k): v for k, v in snap["vclock"].items()})
    assert [r["lsn"] for r in tr.xlog_pairs_rows(restarted / "wal" / newest.name)] == \
        list(range(snap_lsn + 1, snap_lsn + 6))

    # Started again, no write, killed: the newest xlog is open and empty; replay still starts there.
    assert _run_nested(work, KILL_9).returncode == -9
    report = verify_paths([work], runner=LocalRunner(1))
    chain, snap = _newest_snapshot_link(report)
    assert by_path(report)[newest.resolve()].status == "open"
    assert chain.findings == [] and snap["replay_from"] == str(newest) and str(newest) not in snap["covers"]


def test_wal_dir_below_work_dir_is_one_chain_with_its_snapshots(tmp_path):
    # work_dir holds the snapshots, wal_dir = work_dir/wal the xlogs: one data dir. Without the xlog that
    # replay starts from, Tarantool refuses to start, and walvault must say why (snapshot_gap).
    work = tmp_path / "work"
    proc = _run_nested(work, WRITE_20_AND_SNAPSHOT + "for i = 21, 40 do box.space.t:replace{i, string.rep('y', 60)} end\n"
                       + KILL_9)
    assert proc.returncode == -9
    report = verify_paths([work], runner=LocalRunner(1))
    chain, snap = _newest_snapshot_link(report)
    assert chain.findings == [] and Path(chain.path) == work / "wal"
    assert {Path(s["path"]).parent for s in chain.snapshots} == {work} and len(chain.snapshots) == 2
    (work / "wal" / Path(snap["replay_from"]).name).unlink()

    proc = run_main("verify", "--json", work)
    assert proc.returncode == 1, proc.stdout
    (chain,) = json.loads(proc.stdout)["chains"]
    assert "snapshot_gap" in [f["code"] for f in chain["findings"]]
    refused = _run_nested(work, "os.exit(0)\n")
    assert "Missing .xlog file" in refused.stderr + refused.stdout

"""Tests of the real-Tarantool test harness (tests/tarantool_real.py).

They run Debian's tarantool 2.6.0 and check that the generated data dirs have
what walvault's other tests rely on, and that the xlog.pairs() wrappers agree
with the recorded expectations in shared/fixtures/tarantool/.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

try:  # works whether or not tests/ is a package
    from tests import tarantool_real as tr
except ImportError:  # pragma: no cover
    import tarantool_real as tr

pytestmark = pytest.mark.skipif(
    tr.TARANTOOL is None,
    reason="real Tarantool not installed: `tarantool` is not on PATH "
           "(Debian: apt-get install -y tarantool)",
)

ROW_MAGIC = b"\xd5\xba\x0b\xab"
ZROW_MAGIC = b"\xd5\xba\x0b\xba"
EOF_MARKER = b"\xd5\x10\xad\xed"
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "tarantool"
SMALL_WAL = 16384


# --------------------------------------------------------------------------- helpers


def wal_blocks(path: Path) -> tuple[list[bytes], bool]:
    """Walk the block framing of an xlog (stdlib only).

    Returns (magic of every block, file ends with the EOF marker). Asserts
    that the framing is consistent, i.e. every block header is followed by
    exactly `len` bytes and the EOF marker, when present, is the last 4 bytes.
    """
    data = path.read_bytes()
    pos = data.index(b"\n\n") + 2
    magics: list[bytes] = []
    while pos < len(data):
        magic = data[pos:pos + 4]
        if magic == EOF_MARKER:
            assert pos + 4 == len(data), f"{path}: data after EOF marker"
            return magics, True
        assert magic in (ROW_MAGIC, ZROW_MAGIC), f"{path}: bad magic {magic.hex()} at {pos}"
        tag = data[pos + 4]
        if tag < 0x80:
            length = tag
        elif tag == 0xCC:
            length = data[pos + 5]
        elif tag == 0xCD:
            length = int.from_bytes(data[pos + 5:pos + 7], "big")
        elif tag == 0xCE:
            length = int.from_bytes(data[pos + 5:pos + 9], "big")
        else:
            raise AssertionError(f"{path}: bad length tag {tag:#x} at {pos}")
        magics.append(magic)
        pos += 19 + length
    assert pos == len(data), f"{path}: last block overruns the file"
    return magics, False


def transactions(rows: list[dict]) -> list[list[dict]]:
    """Group xlog rows into transactions, the way tarantool-files.md says:
    tsn = HEADER.tsn if present else lsn; commit = HEADER.commit if tsn is
    present else true. Asserts each group shares one tsn and ends at a commit.
    """
    txs, cur = [], []
    for r in rows:
        cur.append(r)
        commit = bool(r["commit"]) if r["tsn"] is not None else True
        if commit:
            tsns = {x["tsn"] if x["tsn"] is not None else x["lsn"] for x in cur}
            assert len(tsns) == 1, f"rows of one transaction with different tsn: {cur}"
            txs.append(cur)
            cur = []
    assert not cur, f"transaction not committed at the end of the file: {cur}"
    return txs


def xlogs(workdir: Path) -> list[Path]:
    return sorted((workdir / "wal").glob("*.xlog"))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory) -> Path:
    return tr.generate_instance(tmp_path_factory.mktemp("clean"), wal_max_size=SMALL_WAL,
                                instance_uuid="aaaaaaaa-bbbb-4ccc-8ddd-00000000c1ea")


@pytest.fixture(scope="module")
def clean_rows(clean_dir) -> dict[str, list[dict]]:
    return {p.name: tr.xlog_pairs_rows(p) for p in xlogs(clean_dir)}


@pytest.fixture(scope="module")
def crash_dir(tmp_path_factory) -> Path:
    return tr.generate_instance(tmp_path_factory.mktemp("crash"), wal_max_size=SMALL_WAL,
                                crash=True)


# --------------------------------------------------------------------------- generate


def test_clean_instance_has_every_kind_of_file(clean_dir):
    manifest = tr.read_manifest(clean_dir)
    assert manifest["instance_uuid"] == "aaaaaaaa-bbbb-4ccc-8ddd-00000000c1ea"
    assert manifest["snapshots"] == 3 and manifest["crash"] is False

    snaps = sorted((clean_dir / "memtx").glob("*.snap"))
    # bootstrap snapshot + one per box.snapshot(); none deleted (checkpoint_count)
    assert len(snaps) == 1 + 3
    assert len(xlogs(clean_dir)) >= 6
    vinyl = clean_dir / "vinyl"
    assert len(list(vinyl.glob("*.vylog"))) == 1 + 3
    runs = list(vinyl.glob("513/*/*.run"))
    assert runs and len(list(vinyl.glob("513/*/*.index"))) == len(runs)
    assert {p.parent.name for p in runs} == {"0", "1"}  # pk and sk
    assert not list(clean_dir.rglob("*.inprogress"))

    # file name = vclock sum before the first row; the last one is the sum at exit
    assert xlogs(clean_dir)[-1].name == f"{manifest['vclock_sum']:020d}.xlog"
    assert manifest["vclock_sum"] == sum(manifest["vclock"].values())
    assert set(manifest["vclock"]) == {0, 1}
    assert manifest["stats"]["concurrent_fibers"] >= 10
    assert manifest["stats"]["compactions"] >= 1


def test_clean_exit_closes_every_xlog_and_leaves_an_empty_newest(clean_dir, clean_rows):
    files = xlogs(clean_dir)
    for p in files:
        _, has_eof = wal_blocks(p)
        assert has_eof, f"{p.name} has no EOF marker after a clean exit"
    # Tarantool 2.6 on clean exit: a new xlog with only meta + EOF marker
    newest = files[-1]
    assert wal_blocks(newest) == ([], True)
    assert newest.stat().st_size < 200
    assert clean_rows[newest.name] == []
    assert tr.xlog_pairs_summary(newest) == {"rows": 0, "min_lsn": None, "max_lsn": None,
                                             "types": {}}


def test_rows_have_single_and_multi_statement_transactions(clean_rows):
    all_txs = []
    for name, rows in clean_rows.items():
        # a transaction never spans files: each file's rows group completely
        all_txs += transactions(rows)
    rows = [r for rs in clean_rows.values() for r in rs]

    single = [tx for tx in all_txs if len(tx) == 1 and tx[0]["tsn"] is None]
    multi = [tx for tx in all_txs if len(tx) > 1]
    assert len(single) > 100 and len(multi) > 100
    assert any(r["tsn"] is not None and r["tsn"] != r["lsn"] for r in rows)
    for tx in multi:
        assert all(r["tsn"] is not None for r in tx[:-1])
        assert all(r["commit"] is None for r in tx[:-1])
        # the last row: commit=True, or (2.6 quirk) no tsn/commit at all when
        # its lsn equals the tsn (seen after a local row that opens the tx)
        last = tx[-1]
        assert last["commit"] is True or (last["tsn"] is None and last["lsn"] == tx[0]["tsn"])
    assert sum(1 for tx in multi if tx[-1]["commit"] is True) > 100

    # every request type on both engines
    seen = Counter((r["space_id"], r["type"]) for r in rows)
    for space in (512, 513):
        for typ in ("INSERT", "REPLACE", "UPDATE", "DELETE", "UPSERT"):
            assert seen[(space, typ)] > 0, (space, typ)

    # local rows: group_id 1, no replica_id, LSNs from vclock component 0
    local = [r for r in rows if r["space_id"] == 514]
    assert local and all(r["group_id"] == 1 and r["replica_id"] is None for r in local)
    assert all(r["replica_id"] == 1 for r in rows if r["space_id"] in (512, 513))
    mixed = [tx for tx in multi
             if {r["group_id"] for r in tx} == {None, 1}]
    assert len(mixed) >= 2
    # vinyl compaction wrote deferred DELETEs: local rows of space 257
    assert any(r["space_id"] == 257 and r["group_id"] == 1 for r in rows)
    # big tuples and update operations are visible
    assert all(r["tuple_len"] is not None for r in rows)


def test_some_wal_blocks_are_zstd_and_hold_several_transactions(clean_dir, clean_rows):
    plain = compressed = 0
    for p in xlogs(clean_dir):
        magics, _ = wal_blocks(p)
        plain += magics.count(ROW_MAGIC)
        compressed += magics.count(ZROW_MAGIC)
    assert compressed > 0, "no zstd-compressed WAL block"
    assert any(ZROW_MAGIC in p.read_bytes() for p in xlogs(clean_dir))
    assert plain > 0
    # group commit: far fewer blocks (write batches) than transactions
    n_txs = sum(len(transactions(rows)) for rows in clean_rows.values())
    assert plain + compressed < n_txs * 0.6, (plain + compressed, n_txs)


def test_vinyl_files_are_read_by_xlog_pairs(clean_dir):
    vinyl = clean_dir / "vinyl"
    for vylog in vinyl.glob("*.vylog"):
        s = tr.xlog_pairs_summary(vylog)
        assert s["rows"] > 0 and s["max_lsn"] == 0  # vylog rows carry no lsn
    for index in vinyl.glob("513/*/*.index"):
        s = tr.xlog_pairs_summary(index)
        assert s["types"]["RUNINFO"] == 1 and s["types"]["PAGEINFO"] >= 1
    compressed_runs = 0
    for run in vinyl.glob("513/*/*.run"):
        s = tr.xlog_pairs_summary(run)
        assert s["types"]["ROWINDEX"] >= 1 and s["min_lsn"] == 0 and s["max_lsn"] > 0
        compressed_runs += ZROW_MAGIC in run.read_bytes()
    # dump runs are never compressed, compaction runs are
    assert 0 < compressed_runs < len(list(vinyl.glob("513/*/*.run")))


def test_snapshot_rows_follow_the_fixture_convention(clean_dir):
    snap = sorted((clean_dir / "memtx").glob("*.snap"))[-1]
    rows = tr.xlog_pairs_rows(snap)
    assert [r["lsn"] for r in rows] == list(range(len(rows)))  # first one: no lsn -> 0
    assert all(r["replica_id"] is None and r["tsn"] is None for r in rows)
    assert rows[0]["space_id"] == 272  # _schema first
    summary = tr.xlog_pairs_summary(snap)
    assert summary["rows"] == len(rows)
    assert (summary["min_lsn"], summary["max_lsn"]) == (0, len(rows) - 1)


# --------------------------------------------------------------------------- crash


def test_crash_leaves_newest_xlog_without_eof_marker(crash_dir, clean_dir, tmp_path):
    manifest = tr.read_manifest(crash_dir)
    assert manifest["crash"] is True
    files = xlogs(crash_dir)
    assert len(files) >= 3
    newest = files[-1]
    assert newest.read_bytes()[-4:] != EOF_MARKER
    magics, has_eof = wal_blocks(newest)  # a whole last block: killed between writes
    assert not has_eof and magics
    for p in files[:-1]:
        assert p.read_bytes()[-4:] == EOF_MARKER, p.name
    rows = tr.xlog_pairs_rows(newest)
    assert rows and max(r["lsn"] for r in rows) == manifest["vclock"][1]
    # the workload is deterministic: same row counts as the clean run
    assert manifest["counts"] == tr.read_manifest(clean_dir)["counts"]

    # Tarantool recovers every committed row ...
    copy = tmp_path / "crash"
    shutil.copytree(crash_dir, copy)
    result = tr.start_recovery(copy)
    assert result.ok, result.log
    assert result.counts == manifest["counts"]
    assert result.vclock == manifest["vclock"]
    assert "wasn't correctly closed" in result.log
    # ... and (2.6) never repairs the crashed xlog: it stays without EOF
    # marker and is no longer the newest file.
    after = xlogs(copy)
    assert after[-2].name == newest.name
    assert after[-2].read_bytes() == newest.read_bytes()
    assert wal_blocks(after[-1]) == ([], True)


# --------------------------------------------------------------------------- recovery


def test_start_recovery_returns_what_the_workload_wrote(clean_dir, tmp_path):
    manifest = tr.read_manifest(clean_dir)
    copy = tmp_path / "clean"
    shutil.copytree(clean_dir, copy)
    result = tr.start_recovery(copy)
    assert result.ok, result.log
    assert result.status == "running"
    assert set(result.counts) == {"mem", "vin", "loc"}
    assert result.counts == manifest["counts"]
    assert all(n > 0 for n in result.counts.values())
    assert result.vclock == manifest["vclock"]
    assert result.instance_uuid == manifest["instance_uuid"]
    assert result.error is None


def test_start_recovery_reports_a_failed_start(clean_dir, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(clean_dir, copy)
    victim = [p for p in xlogs(copy) if p.stat().st_size > 1000][-1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    result = tr.start_recovery(copy)
    assert not result.started and not result.ok
    assert result.returncode != 0
    assert result.vclock is None and result.counts is None
    assert "checksum mismatch" in result.error
    assert "checksum mismatch" in result.log


# --------------------------------------------------------------------------- timing


def test_time_xlog_pairs_counts_every_row(clean_dir, clean_rows):
    files = xlogs(clean_dir)
    timing = tr.time_xlog_pairs(files)
    rows = [r for rs in clean_rows.values() for r in rs]
    assert timing["rows"] == len(rows)
    assert timing["bytes"] == sum(p.stat().st_size for p in files)
    assert timing["lsn_sum"] == sum(r["lsn"] for r in rows)
    assert timing["seconds"] > 0  # measured (no bound: timings belong to bench/)


# --------------------------------------------------------------------------- errors


def test_generate_refuses_a_used_directory(clean_dir):
    with pytest.raises(ValueError, match="not empty"):
        tr.generate_instance(clean_dir)


def test_lua_failure_raises_with_tarantool_stderr(tmp_path):
    bogus = tmp_path / "bogus.xlog"
    bogus.write_bytes(b"not an xlog at all\n")
    with pytest.raises(tr.TarantoolError) as info:
        tr.xlog_pairs_rows(bogus)
    assert "tarantool stderr" in str(info.value)
    assert info.value.returncode not in (None, 0)


# --------------------------------------------------------------------------- fixtures


@pytest.mark.skipif(not (FIXTURES / "expected-xlog-pairs-rows.tsv").exists(),
                    reason=f"shared fixtures not found at {FIXTURES}")
def test_matches_recorded_xlog_pairs_output():
    expected: dict[str, list[list[str]]] = {}
    with (FIXTURES / "expected-xlog-pairs-rows.tsv").open() as fh:
        header = fh.readline().rstrip("\n").split("\t")
        assert header == ["file", *tr.ROW_KEYS[:-1]]
        for line in fh:
            name, *rest = line.rstrip("\n").split("\t")
            expected.setdefault(name, []).append(rest)

    def text(v):
        return "nil" if v is None else str(v).lower() if isinstance(v, bool) else str(v)

    summaries = [json.loads(line)
                 for line in (FIXTURES / "expected-xlog-pairs-summary.jsonl").open()]
    assert len(summaries) > 50
    for exp in summaries:
        path = FIXTURES / exp["file"]
        rows = tr.xlog_pairs_rows(path)
        got = [[text(r[k]) for k in tr.ROW_KEYS[:-1]] for r in rows]
        assert got == expected.get(exp["file"], []), exp["file"]
        summary = tr.xlog_pairs_summary(path)
        assert summary["rows"] == exp["rows"], exp["file"]
        assert summary["min_lsn"] == exp.get("min_lsn"), exp["file"]
        assert summary["max_lsn"] == exp.get("max_lsn"), exp["file"]
        assert summary["types"] == (exp["types"] or {}), exp["file"]

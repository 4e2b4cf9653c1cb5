"""walcore against the real Tarantool 2.6 sample files in shared/fixtures/tarantool.

The expectations come from Tarantool itself (expected-xlog-pairs-*.{jsonl,tsv}, written by its own
`xlog.pairs()` reader) and from the raw meta text of the files, never from walcore.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import msgpack
import pytest

from conftest import TARANTOOL_FIXTURES, require_shared
from walcore.runner import LocalRunner
from walcore.tarantool.block import EOF_MAGIC, FIXHEADER_SIZE, ROW_MAGIC, ZROW_MAGIC, decompress, parse_fixheader, \
    tarantool_crc32c
from walcore.tarantool.meta import MAX_META_SIZE, encode_meta, format_vclock, parse_meta, parse_vclock, vclock_sum
from walcore.tarantool.row import RowWalker, summarize_rows
from walcore.tarantool.writer import dml_header, encode_row, generate_wal
from walcore.tarantool.xlog import read_rows, scan_file
from walcore.scan_paths import verify_paths

# Every test once on each scan core (compiled and pure-Python reference).
pytestmark = pytest.mark.usefixtures("scan_core")

SUFFIXES = (".xlog", ".snap", ".vylog", ".run", ".index")
UUIDS = {"features": "aaaaaaaa-bbbb-4ccc-8ddd-000000000001",
         "many-xlogs": "aaaaaaaa-bbbb-4ccc-8ddd-000000000001",
         "concurrent": "aaaaaaaa-bbbb-4ccc-8ddd-000000000004"}


def _load_summary() -> list[dict]:
    path = TARANTOOL_FIXTURES / "expected-xlog-pairs-summary.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _load_rows() -> dict[str, list[dict]]:
    path = TARANTOOL_FIXTURES / "expected-xlog-pairs-rows.tsv"
    out: dict[str, list[dict]] = defaultdict(list)
    if not path.is_file():
        return out
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh, delimiter="\t"):
            out[rec.pop("file")].append(rec)
    return out


SUMMARY = _load_summary()
ROWS = _load_rows()
ALL_FILES = sorted(str(p.relative_to(TARANTOOL_FIXTURES)) for p in TARANTOOL_FIXTURES.rglob("*")
                   if p.suffix in SUFFIXES) if TARANTOOL_FIXTURES.is_dir() else []


def _params(items):
    if items:
        return items
    return [pytest.param(None, marks=pytest.mark.skip(reason=f"no shared fixtures at {TARANTOOL_FIXTURES}"))]


def _nil(text: str):
    return None if text == "nil" else text


def pairs_view(row) -> dict:
    """A walcore Row the way xlog.pairs() prints it (the TSV's conventions), as strings or None."""
    has_tsn = 8 in row.header
    if not has_tsn:
        # No tsn key: a single-statement transaction, which is its own tsn and commits.
        assert row.tsn == row.lsn and row.commit is True
    return {
        "lsn": str(row.lsn),
        "type": row.type_name,
        "replica_id": str(row.replica_id) if row.replica_id else None,
        "group_id": str(row.group_id) if row.group_id else None,
        "tsn": str(row.tsn) if has_tsn else None,
        "commit": "true" if has_tsn and row.commit else None,
        "space_id": None if row.space_id is None else str(row.space_id),
    }


def iter_payloads(path: Path):
    """(offset, decompressed rows) of every block, read with the raw framing (a valid file)."""
    data = path.read_bytes()
    meta = parse_meta(data[:MAX_META_SIZE])
    pos = meta.size
    while pos < len(data):
        if data[pos:pos + 4] == EOF_MAGIC:
            assert pos + 4 == len(data)
            return
        compressed, length, crc = parse_fixheader(data[pos:pos + FIXHEADER_SIZE])
        payload = data[pos + FIXHEADER_SIZE:pos + FIXHEADER_SIZE + length]
        assert len(payload) == length and tarantool_crc32c(payload) == crc, f"{path}: block at {pos}"
        yield pos, (decompress(payload) if compressed else payload)
        pos += FIXHEADER_SIZE + length


def raw_meta_lines(path: Path) -> dict[str, str]:
    """The meta block's `Key: value` lines, parsed here by hand (plus 'filetype', 'version')."""
    text = path.read_bytes()[:MAX_META_SIZE].split(b"\n\n", 1)[0].decode("ascii")
    lines = text.split("\n")
    out = {"filetype": lines[0], "version": lines[1]}
    for line in lines[2:]:
        key, _, value = line.partition(": ")
        out[key] = value
    return out


def vclock_from_text(text: str) -> dict[int, int]:
    inner = text.strip()[1:-1]
    return {int(k): int(v) for k, v in (item.split(":") for item in inner.split(",") if item.strip())}


def xlog_end_vclocks(wal_dir: str) -> list[tuple[str, dict, dict]]:
    """(path, VClock, end vclock) of each xlog of a fixture wal dir, from the meta text and Tarantool's rows."""
    out = []
    for p in sorted((TARANTOOL_FIXTURES / wal_dir).glob("*.xlog")):
        start = vclock_from_text(raw_meta_lines(p)["VClock"])
        end = dict(start)
        for rec in ROWS.get(str(p.relative_to(TARANTOOL_FIXTURES)), []):
            comp = int(rec["replica_id"]) if rec["replica_id"] != "nil" else 0
            end[comp] = max(end.get(comp, 0), int(rec["lsn"]))
        out.append((p, start, end))
    return out


def leq(a: dict, b: dict) -> bool:
    return all(v <= b.get(k, 0) for k, v in a.items())


@pytest.fixture(scope="module")
def fixtures_report():
    report = verify_paths([TARANTOOL_FIXTURES], runner=LocalRunner(1))
    return report, {Path(f.path).resolve(): f for f in report.files}


# --------------------------------------------------------------------------- per file, against xlog.pairs()


@require_shared
def test_expectations_cover_every_fixture_file():
    assert len(SUMMARY) == len(ALL_FILES) > 60
    assert sorted(e["file"] for e in SUMMARY) == ALL_FILES
    # every file with rows has its rows in the TSV, and no other file does
    assert sorted(ROWS) == sorted(e["file"] for e in SUMMARY if e["rows"])


@pytest.mark.parametrize("expected", _params(SUMMARY), ids=lambda e: e and e["file"])
def test_scan_file_matches_xlog_pairs_summary(expected, fixtures_report):
    path = TARANTOOL_FIXTURES / expected["file"]
    scan = scan_file(path)
    assert scan.findings == []
    assert scan.span.rows == expected["rows"]
    if expected["rows"]:
        assert min(r[2] for r in scan.span.lsns.values()) == expected["min_lsn"]
        assert max(r[3] for r in scan.span.lsns.values()) == expected["max_lsn"]
    else:
        assert scan.span.lsns == {} and "min_lsn" not in expected
    assert scan.span.eof, "every fixture file was closed by Tarantool"
    assert scan.span.end_pos == scan.size
    report, by_path = fixtures_report
    verdict = by_path[path.resolve()]
    assert verdict.status == "ok" and verdict.findings == []
    assert verdict.rows == expected["rows"]


@pytest.mark.parametrize("name", _params(sorted(ROWS)))
def test_read_rows_matches_xlog_pairs_rows(name):
    expected = [{k: _nil(v) for k, v in rec.items()} for rec in ROWS[name]]
    got = [pairs_view(row) for _, row in read_rows(TARANTOOL_FIXTURES / name)]
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{name}: row {i}"


@require_shared
def test_fixture_rows_cover_the_interesting_cases():
    """The row-level comparison above is only as good as what the fixtures hold."""
    recs = [r for rows in ROWS.values() for r in rows]
    types = {r["type"] for r in recs}
    assert {"INSERT", "REPLACE", "UPDATE", "DELETE", "UPSERT", "RUNINFO", "PAGEINFO", "ROWINDEX"} <= types
    assert any(r["tsn"] != "nil" and r["commit"] == "nil" for r in recs)  # open multi-statement tx rows
    assert any(r["replica_id"] == "nil" and r["group_id"] == "1" and r["lsn"] != "0" for r in recs)  # local rows
    # a wrapped tsn: a local row (component 0) whose tsn is a larger global lsn
    assert any(r["replica_id"] == "nil" and r["tsn"] != "nil" and int(r["tsn"]) > int(r["lsn"]) for r in recs)


# --------------------------------------------------------------------------- fast path == exact path


def _fast(walked):
    """RowWalker.walk's tuple as (rows, lsns, last_commit), comparable with a RowSummary."""
    rows, comp, first, last, lo, hi, commit = walked
    return rows, {comp: [first, last, lo, hi]}, commit


def _check_fast_against_exact(payloads: list[bytes], kind: str) -> int:
    """RowWalker.walk of each block is None or equal to the exact walk; returns how many it accepted."""
    walker = RowWalker(kind == "xlog")  # one per file, reused across its blocks, as the scanner does
    accepted = 0
    for i, payload in enumerate(payloads):
        walked = walker.walk(payload)
        exact = summarize_rows(payload, xlog=kind == "xlog")
        assert exact.errors == [], f"block {i}: {exact.errors}"
        if walked is not None:
            accepted += 1
            assert _fast(walked) == (exact.rows, exact.lsns, exact.last_commit), f"block {i}"
    return accepted


@pytest.mark.parametrize("name", _params(ALL_FILES))
def test_fast_path_equals_exact_path_on_fixture_blocks(name):
    path = TARANTOOL_FIXTURES / name
    kind = path.suffix[1:]
    payloads = [p for _, p in iter_payloads(path)]
    accepted = _check_fast_against_exact(payloads, kind)
    if kind == "snap":  # snapshot rows: no replica_id, row numbers as lsn: nothing unusual
        assert accepted == len(payloads)


@pytest.fixture(scope="module")
def generated_wal(tmp_path_factory):
    return generate_wal(tmp_path_factory.mktemp("genwal"), target_bytes=4 << 20, file_bytes=1 << 20)


def test_fast_path_equals_exact_path_on_generated_wal(generated_wal):
    total_accepted = total_blocks = 0
    zstd = plain = 0
    for path in generated_wal:
        payloads = []
        data = path.read_bytes()
        for pos, payload in iter_payloads(path):
            payloads.append(payload)
            if data[pos:pos + 4] == ZROW_MAGIC:
                zstd += 1
            else:
                assert data[pos:pos + 4] == ROW_MAGIC
                plain += 1
        total_accepted += _check_fast_against_exact(payloads, path.suffix[1:])
        total_blocks += len(payloads)
    assert zstd > 10 and plain > 10
    assert total_blocks > 500
    # the fast path must not be falling back all the time: every generated block is ordinary
    assert total_accepted >= 0.95 * total_blocks


def test_scan_without_fast_path_is_identical(monkeypatch, generated_wal, scan_core):
    """Whole-file scans: with the fast paths (the pure-Python one, or the compiled core), exactly the Span and
    findings of the exact walk alone."""
    paths = list(generated_wal) + [TARANTOOL_FIXTURES / n for n in ALL_FILES]
    calls = []
    real_walk = RowWalker.walk

    def counting_walk(self, payload):
        result = real_walk(self, payload)
        calls.append(result is not None)
        return result

    monkeypatch.setattr(RowWalker, "walk", counting_walk)
    fast = {p: scan_file(p) for p in paths}
    if scan_core == "pure":
        assert sum(calls) > 0.9 * len(calls)  # the fast path did the work
    else:  # the compiled core took every block of these intact files itself
        assert sum(f.span.blocks for f in fast.values()) > 500 and calls == []
    monkeypatch.setenv("WALVAULT_PURE", "1")
    monkeypatch.setattr(RowWalker, "walk", lambda self, payload: None)
    for p in paths:
        exact = scan_file(p)
        assert (fast[p].span, fast[p].findings) == (exact.span, exact.findings), p


def _payload(rows) -> bytes:
    return b"".join(encode_row(h, b) for h, b in rows)


def _rep(lsn, **kw):
    return dml_header(3, lsn, 1, **kw)


B = {0x10: 512, 0x21: [1, "a"]}
# Blocks Tarantool would not write (valid CRC, odd rows): the fast path must give up or agree.
ODD_PAYLOADS = {
    "plain": [(_rep(5), B), (_rep(6), B)],
    "tx_open_at_end": [(_rep(5, tsn=5, commit=False), B)],
    "tx_closed": [(_rep(5, tsn=5, commit=False), B), (_rep(6, tsn=5), B)],
    "lsn_gap": [(_rep(5), B), (_rep(7), B)],
    "lsn_back": [(_rep(5), B), (_rep(4), B)],
    "lsn_repeat": [(_rep(5), B), (_rep(5), B)],
    "no_lsn": [({0: 3, 2: 1}, B)],
    "lsn_zero": [({0: 3, 2: 1, 3: 0}, B)],
    "float_lsn_first": [({0: 3, 2: 1, 3: 5.0}, B)],
    "str_lsn": [({0: 3, 2: 1, 3: "5"}, B)],
    "str_lsn_mid": [(_rep(5), B), ({0: 3, 2: 1, 3: "6"}, B), (_rep(7), B)],
    "local_rows": [({0: 3, 3: 5, 7: 1}, B), ({0: 3, 3: 6, 7: 1}, B)],
    "global_then_local": [(_rep(5), B), ({0: 3, 3: 2, 7: 1}, B)],
    "local_then_global": [({0: 3, 3: 2, 7: 1}, B), (_rep(5), B)],
    "negative_replica": [({0: 3, 2: -1, 3: 5}, B)],
    "no_type": [({2: 1, 3: 5}, B)],
    "no_type_mid": [(_rep(5), B), ({2: 1, 3: 6}, B), (_rep(7), B)],
    "str_type": [({0: "x", 2: 1, 3: 5}, B)],
    "str_space_id": [(_rep(5), {0x10: "x", 0x21: [1]})],
    "body_not_map": [(_rep(5), [1, 2])],
    "header_not_map": [([3, 1], B)],
    "nop_first": [({0: 12, 2: 1, 3: 5}, None), (_rep(6), B)],
    "nop_mid": [(_rep(5), B), ({0: 12, 2: 1, 3: 6}, None), (_rep(7), B)],
    "no_body_at_end": [(_rep(5), B), (_rep(6), None)],
    "bad_flags_last": [({0: 3, 2: 1, 3: 5, 8: 0, 9: "x"}, B)],
    "unknown_type": [({0: 77, 2: 1, 3: 5}, B)],
}
# Blocks the exact walk rejects that an earlier fast path took (it checked lsn/type/replica_id types on
# the first row only, a middle row's component not at all, tsn/flags on the last row only): it must not.
FAST_PATH_DISAGREES = {
    "float_lsn_mid": [(_rep(5), B), ({0: 3, 2: 1, 3: 6.0}, B), (_rep(7), B)],
    "float_lsn_last": [(_rep(5), B), ({0: 3, 2: 1, 3: 6.0}, B)],
    "str_type_mid": [(_rep(5), B), ({0: "x", 2: 1, 3: 6}, B), (_rep(7), B)],
    "bad_tsn_mid": [({0: 3, 2: 1, 3: 5, 8: "x"}, B), (_rep(6), B)],
    "other_replica_mid": [(_rep(5), B), ({0: 3, 2: 2, 3: 6}, B), (_rep(7), B)],
    "local_row_mid": [(_rep(5), B), ({0: 3, 3: 6, 7: 1}, B), (_rep(7), B)],
    "str_replica_mid": [(_rep(5), B), ({0: 3, 2: "a", 3: 6}, B), (_rep(7), B)],
    # four keys, but tsn in place of the timestamp: not the plain shape the fast walk looks no further at
    "bad_tsn_mid_four_keys": [(_rep(5), B), ({0: 3, 2: 1, 3: 6, 8: "x"}, B), (_rep(7), B)],
    "bad_group_mid": [(_rep(5), B), ({0: 3, 2: 1, 3: 6, 4: 1.7e9, 7: "x"}, B), (_rep(7), B)],
    "bad_flags_mid": [(_rep(5, tsn=5, commit=False), B), ({0: 3, 2: 1, 3: 6, 4: 1.7e9, 8: 1, 9: -1}, B),
                      (_rep(7), B)],
}
FAST_PATH_XLOG_ONLY = {"other_replica_mid", "local_row_mid", "str_replica_mid"}
# The one documented gap (row.py): the fast walk reads a msgpack bool in a header as the int it equals,
# in any row, where the exact walk (like Tarantool's xrow decoder) rejects the row. With a valid CRC
# only a writer's bug can put one there.
FAST_PATH_READS_BOOLS = {
    "bool_lsn_first": [({0: 3, 2: 1, 3: True}, B), (_rep(2), B)],
    "bool_replica_mid": [(_rep(5), B), ({0: 3, 2: True, 3: 6}, B), (_rep(7), B)],
    "bool_replica_last": [(_rep(5), B), ({0: 3, 2: True, 3: 6}, B)],
    "bool_flags_last": [(_rep(5, tsn=5, commit=False), B), ({0: 3, 2: 1, 3: 6, 8: 1, 9: True}, B)],
}


def _fast_vs_exact(rows, xlog: bool):
    payload = _payload(rows)
    walked = RowWalker(xlog).walk(payload)
    exact = summarize_rows(payload, xlog=xlog)
    if walked is not None:
        assert exact.errors == [], f"the fast path accepted rows the exact walk rejects: {exact.errors}"
        assert _fast(walked) == (exact.rows, exact.lsns, exact.last_commit)
    return walked, exact


@pytest.mark.parametrize("xlog", [True, False], ids=["xlog", "snap"])
@pytest.mark.parametrize("case", sorted(ODD_PAYLOADS))
def test_fast_path_is_none_or_exact_on_odd_rows(case, xlog):
    walked, exact = _fast_vs_exact(ODD_PAYLOADS[case], xlog)
    if case == "plain":
        assert walked is not None  # the ordinary case takes the fast path
    if exact.errors:
        assert walked is None


@pytest.mark.parametrize("case, xlog", [
    pytest.param(case, xlog, id=f"{case}-{'xlog' if xlog else 'snap'}")
    for case in sorted(FAST_PATH_DISAGREES) for xlog in (True, False)])
def test_fast_path_rejects_what_exact_walk_rejects(case, xlog):
    walked, exact = _fast_vs_exact(FAST_PATH_DISAGREES[case], xlog)
    if xlog or case not in FAST_PATH_XLOG_ONLY:
        assert exact.errors and walked is None


@pytest.mark.parametrize("case", sorted(FAST_PATH_READS_BOOLS))
def test_fast_path_reads_header_bools_as_ints(case):
    payload = _payload(FAST_PATH_READS_BOOLS[case])
    walked = RowWalker(True).walk(payload)
    exact = summarize_rows(payload, xlog=True)
    assert [e[2] for e in exact.errors] == ["bad_row"] and "True" in exact.errors[0][3]
    assert walked is not None
    rows, comp, first, last, *_ = walked
    assert rows == len(FAST_PATH_READS_BOOLS[case]) and comp == 1 and last - first + 1 == rows


# --------------------------------------------------------------------------- meta


@pytest.mark.parametrize("name", _params(ALL_FILES))
def test_meta_matches_raw_text(name):
    path = TARANTOOL_FIXTURES / name
    raw = raw_meta_lines(path)
    data = path.read_bytes()
    meta = parse_meta(data[:MAX_META_SIZE])
    assert meta.filetype == raw["filetype"] == {".xlog": "XLOG", ".snap": "SNAP", ".vylog": "VYLOG",
                                                ".run": "RUN", ".index": "INDEX"}[path.suffix]
    assert meta.kind == path.suffix[1:]
    assert meta.version == raw["version"] == "0.13"
    assert meta.instance == raw["Instance"] == UUIDS[name.split("/")[0]]
    assert meta.extra.get("Version") == raw["Version"]
    # the meta ends where the first block (or the EOF marker) begins
    assert data[meta.size - 2:meta.size] == b"\n\n"
    assert data[meta.size:meta.size + 4] in (ROW_MAGIC, ZROW_MAGIC, EOF_MAGIC)
    if path.suffix in (".run", ".index"):
        assert meta.vclock is None and "VClock" not in raw
    else:
        assert format_vclock(meta.vclock) == raw["VClock"]  # Tarantool's own formatting, both ways
        assert parse_vclock(raw["VClock"]) == meta.vclock == vclock_from_text(raw["VClock"])
        assert vclock_sum(meta.vclock) == int(path.name.split(".")[0])
    if "PrevVClock" in raw:
        assert path.suffix == ".xlog"
        assert format_vclock(meta.prev_vclock) == raw["PrevVClock"]
    else:
        assert meta.prev_vclock is None
    # encode_meta writes exactly what Tarantool wrote
    if path.suffix in (".xlog", ".snap", ".vylog"):
        assert encode_meta(meta.filetype, instance=meta.instance, vclock=meta.vclock,
                           prev_vclock=meta.prev_vclock, server_version=raw["Version"]) == data[:meta.size]


@require_shared
def test_meta_of_the_last_features_xlog():
    meta = parse_meta((TARANTOOL_FIXTURES / "features/wal/00000000000000000437.xlog").read_bytes()[:MAX_META_SIZE])
    assert meta.vclock == {0: 8, 1: 429}
    assert meta.prev_vclock == {0: 3, 1: 358}
    assert meta.instance == "aaaaaaaa-bbbb-4ccc-8ddd-000000000001"
    assert vclock_sum(meta.vclock) == 437


@pytest.mark.parametrize("vclock", [{}, {1: 5}, {0: 8, 1: 429}, {1: 2**63 - 1, 3: 7, 31: 1}])
def test_format_vclock_round_trips(vclock):
    text = format_vclock(vclock)
    assert parse_vclock(text) == vclock
    assert format_vclock(parse_vclock(text)) == text
    meta = parse_meta(encode_meta("XLOG", instance="u", vclock=vclock, prev_vclock=vclock) + b"rest")
    assert meta.vclock == vclock and meta.prev_vclock == vclock and meta.size == len(encode_meta(
        "XLOG", instance="u", vclock=vclock, prev_vclock=vclock))


def test_format_vclock_drops_zero_components():
    assert format_vclock({0: 0, 1: 3}) == "{1: 3}"
    assert format_vclock({2: 1, 1: 3}) == "{1: 3, 2: 1}"


@require_shared
@pytest.mark.parametrize("wal_dir", ["features/wal", "many-xlogs/wal", "concurrent"])
def test_each_xlog_vclock_is_the_previous_end(wal_dir):
    """VClock of every xlog = the previous xlog's VClock advanced by its rows (from xlog.pairs())."""
    chain = xlog_end_vclocks(wal_dir)
    assert chain[0][1] == {}
    for (prev, _, prev_end), (path, start, _) in zip(chain, chain[1:]):
        assert {k: v for k, v in prev_end.items() if v} == start, path
        raw = raw_meta_lines(path)
        assert vclock_from_text(raw["PrevVClock"]) == vclock_from_text(raw_meta_lines(prev)["VClock"])


# --------------------------------------------------------------------------- chains


@require_shared
def test_features_chain(fixtures_report):
    report = verify_paths([TARANTOOL_FIXTURES / "features"], runner=LocalRunner(1))
    assert report.intact
    assert len(report.files) == len([p for p in (TARANTOOL_FIXTURES / "features").rglob("*") if p.suffix in SUFFIXES])
    assert all(f.status == "ok" for f in report.files)
    assert len(report.chains) == 1
    chain = report.chains[0]
    xlogs = xlog_end_vclocks("features/wal")
    assert chain.status == "ok" and chain.findings == []
    assert Path(chain.path).resolve() == (TARANTOOL_FIXTURES / "features/wal").resolve()
    assert [Path(p).resolve() for p in chain.xlogs] == [p.resolve() for p, _, _ in xlogs]
    assert len(chain.xlogs) == 5
    snaps = sorted((TARANTOOL_FIXTURES / "features/memtx").glob("*.snap"))
    assert [Path(s["path"]).resolve() for s in chain.snapshots] == [s.resolve() for s in snaps]
    for snap in chain.snapshots:
        vclock = vclock_from_text(raw_meta_lines(Path(snap["path"]))["VClock"])
        assert snap["status"] == "ok"
        assert snap["vclock"] == {str(k): v for k, v in vclock.items()}
        covers = [p.resolve() for p, _, end in xlogs if leq(end, vclock)]
        assert [Path(p).resolve() for p in snap["covers"]] == covers
        replay = [p.resolve() for p, start, end in xlogs if leq(start, vclock) and not leq(end, vclock)]
        assert len(replay) == 1
        assert Path(snap["replay_from"]).resolve() == replay[0]
    last = next(s for s in chain.snapshots if s["path"].endswith("00000000000000000361.snap"))
    assert last["replay_from"].endswith("wal/00000000000000000361.xlog")
    assert [Path(p).name for p in last["covers"]] == ["00000000000000000000.xlog", "00000000000000000123.xlog",
                                                     "00000000000000000197.xlog"]


@require_shared
def test_many_xlogs_chain_links_every_prev_vclock():
    report = verify_paths([TARANTOOL_FIXTURES / "many-xlogs"], runner=LocalRunner(1))
    assert report.intact
    (chain,) = report.chains
    assert chain.status == "ok"
    assert len(chain.xlogs) == 15
    files = {Path(f.path).resolve(): f for f in report.files}
    xlogs = [files[Path(p).resolve()] for p in chain.xlogs]
    assert xlogs[0].prev_vclock is None
    for prev, cur in zip(xlogs, xlogs[1:]):
        assert cur.prev_vclock == prev.vclock
        assert cur.prev_vclock == vclock_from_text(raw_meta_lines(Path(cur.path))["PrevVClock"])
        assert cur.status == prev.status == "ok"


@require_shared
def test_whole_fixture_tree_gives_three_chains(fixtures_report):
    report, by_path = fixtures_report
    assert report.intact
    assert len(report.files) == len(ALL_FILES)
    assert sorted(Path(c.path).resolve() for c in report.chains) == sorted(
        (TARANTOOL_FIXTURES / d).resolve() for d in ("concurrent", "features/wal", "many-xlogs/wal"))
    assert all(c.status == "ok" for c in report.chains)
    # the concurrent fixture packs several transactions into one block
    rows = sum(f.rows for p, f in by_path.items() if "concurrent" in p.parts and p.suffix == ".xlog")
    blocks = sum(f.blocks for p, f in by_path.items() if "concurrent" in p.parts and p.suffix == ".xlog")
    assert rows >= 10 * blocks


@require_shared
def test_msgpack_of_fixture_rows_is_what_read_rows_returns():
    """read_rows's header/body are the file's msgpack maps, decoded without loss."""
    path = TARANTOOL_FIXTURES / "features/wal/00000000000000000123.xlog"
    by_block = defaultdict(list)
    for pos, row in read_rows(path):
        by_block[pos].append(row)
    blocks = dict(iter_payloads(path))
    assert sorted(by_block) == sorted(blocks)
    for pos, rows in by_block.items():
        unpacker = msgpack.Unpacker(raw=True, strict_map_key=False, use_list=False)
        unpacker.feed(blocks[pos])
        objs = list(unpacker)
        assert objs == [x for r in rows for x in (r.header, r.body) if x is not None]

"""cut_chain against a real Tarantool 2.6: a snapshot plus the cut log replays to exactly the point.

A Lua workload records, at chosen moments between transactions (no fiber writing, a pause on either side),
box.info.vclock, clock.time() and the row counts of each space; Tarantool started on the restored files must
show those. The byte-level checks (copies identical, kept rows unchanged) use walcore's readers.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import require_tarantool
from walcore.tarantool.block import EOF_MAGIC, FIXHEADER_SIZE, ZSTD_THRESHOLD, decompress, parse_fixheader
from walcore.tarantool.meta import MAX_META_SIZE, format_vclock, parse_meta
from walcore.tarantool.pitr import CutResult, Point, PointError, cut_chain, parse_point
from walcore.tarantool.row import iter_rows
from walcore.tarantool.writer import TarantoolWriter, generate_wal
from walcore.tarantool.xlog import read_rows

# Spaces mem (memtx), vin (vinyl), loc (memtx, is_local). Each batch: single statements, multi-statement
# transactions (two memtx rows and a local row; two vinyl rows), deletes, 3 KB tuples (zstd blocks) and five
# fibers writing at once (several transactions per block). Moments are recorded between batches. The group
# between g0 and g1 is three transactions in one block: A (mem 5000001), B (mem 5000002, 5000003, loc
# 5000004, mem 5000005), C (mem 5000006). Ends with SIGKILL: the newest xlog stays open.
WORKLOAD = r"""
local json = require('json')
local fiber = require('fiber')
local clock = require('clock')
local ffi = require('ffi')
local cfg = json.decode([==[CONFIG]==])
box.cfg{memtx_dir = 'memtx', wal_dir = 'wal', vinyl_dir = 'vinyl', wal_max_size = 8192,
        checkpoint_count = 1000, checkpoint_interval = 0, feedback_enabled = false, log_level = 4}
local mem = box.schema.space.create('mem')
mem:create_index('pk', {parts = {1, 'unsigned'}})
local vin = box.schema.space.create('vin', {engine = 'vinyl'})
vin:create_index('pk', {parts = {1, 'unsigned'}})
local loc = box.schema.space.create('loc', {is_local = true})
loc:create_index('pk', {parts = {1, 'unsigned'}})

local moments = {}
local function moment(name)
    fiber.sleep(cfg.gap)
    local vclock = {}
    for k, v in pairs(box.info.vclock) do vclock[tostring(k)] = v end
    moments[name] = {vclock = vclock, time = string.format('%.6f', clock.time()),
                     counts = {mem = mem:count(), vin = vin:count(), loc = loc:count()}}
    fiber.sleep(cfg.gap)
end

local key = 0
local big = string.rep('z', 3000)
local function batch(n)
    for i = 1, n do
        key = key + 1
        mem:replace{key, 'single', i}
        if i % 3 == 0 then
            box.begin()
            mem:replace{key + 100000, 'tx', i}
            mem:replace{key + 110000, 'tx', i}
            loc:replace{key, 'a local row in a global transaction'}
            box.commit()
        end
        if i % 4 == 0 then
            box.begin()
            vin:replace{key, 'vinyl tx', i}
            vin:replace{key + 100000, 'vinyl tx', i}
            box.commit()
        end
        if i % 5 == 0 then loc:replace{key + 200000, 'local'} end
        if i % 7 == 0 then mem:delete(key - 3) end
        if i % 10 == 0 then mem:replace{key + 300000, big} end
    end
    local fibers = {}
    for f = 1, 5 do
        local fb = fiber.new(function()
            for j = 1, 3 do mem:replace{1000000 + key * 100 + f * 10 + j, 'fiber'} end
        end)
        fb:set_joinable(true)
        table.insert(fibers, fb)
    end
    for _, fb in ipairs(fibers) do fb:join() end
end

local function joinable(fn)
    local fb = fiber.new(fn)
    fb:set_joinable(true)
    return fb
end

batch(20)
moment('early')
batch(20)
box.snapshot()
moment('snapshot')
batch(60)
moment('m1')
batch(60)
moment('g0')
local group = {
    joinable(function() mem:replace{5000001, 'A'} end),
    joinable(function()
        box.begin()
        mem:replace{5000002, 'B'}
        mem:replace{5000003, 'B'}
        loc:replace{5000004, 'B'}
        mem:replace{5000005, 'B'}
        box.commit()
    end),
    joinable(function() mem:replace{5000006, 'C'} end),
}
for _, fb in ipairs(group) do fb:join() end
moment('g1')
batch(60)
moment('m2')
batch(60)
moment('end')
local f = io.open('moments.json', 'w')
f:write(json.encode(moments))
f:close()
ffi.cdef('int kill(int pid, int sig); int getpid(void);')
ffi.C.kill(ffi.C.getpid(), 9)
"""
# Pause before and after each moment: rows before it are older, rows after it newer, by about this much.
GAP = 0.2


@dataclass
class Moment:
    vclock: dict[int, int]
    time: float
    counts: dict[str, int]


@dataclass
class Source:
    dir: Path
    moments: dict[str, Moment]
    snap: Path
    snap_vclock: dict[int, int]

    def xlogs(self) -> list[Path]:
        return sorted((self.dir / "wal").glob("*.xlog"))

    def chain(self) -> list[Path]:
        """The xlogs replay needs after the snapshot: from the last one starting at or before it."""
        xlogs = self.xlogs()
        first = max(i for i, p in enumerate(xlogs) if _leq(xlog_vclock(p), self.snap_vclock))
        return xlogs[first:]


def _leq(a: dict[int, int], b: dict[int, int]) -> bool:
    return all(v <= b.get(k, 0) for k, v in a.items())


def xlog_vclock(path: Path) -> dict[int, int]:
    with open(path, "rb") as f:
        return parse_meta(f.read(MAX_META_SIZE)).vclock


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Source:
    if tr.TARANTOOL is None:
        pytest.skip("real Tarantool not installed")
    work = tmp_path_factory.mktemp("pitr-source")
    for name in ("memtx", "wal", "vinyl"):
        (work / name).mkdir()
    proc = tr.run_lua_code(WORKLOAD.replace("CONFIG", json.dumps({"gap": GAP})), cwd=work)
    assert proc.returncode == -9 and (work / "moments.json").exists(), proc.stderr
    moments = {name: Moment({int(k): v for k, v in m["vclock"].items()}, float(m["time"]), m["counts"])
               for name, m in json.loads((work / "moments.json").read_text()).items()}
    snap = sorted((work / "memtx").glob("*.snap"))[-1]
    with open(snap, "rb") as f:
        snap_vclock = parse_meta(f.read(MAX_META_SIZE)).vclock
    assert snap_vclock == moments["snapshot"].vclock
    return Source(work, moments, snap, snap_vclock)


def restore(source: Source, work: Path, point: Point, xlogs: list[Path] | None = None) -> tuple[CutResult, Path]:
    """A data dir as a point-in-time restore lays it out: the snapshot, the vinyl files, the cut log."""
    (work / "memtx").mkdir(parents=True)
    shutil.copy2(source.snap, work / "memtx" / source.snap.name)
    shutil.copytree(source.dir / "vinyl", work / "vinyl")
    (work / "wal").mkdir()
    result = cut_chain(source.chain() if xlogs is None else xlogs, work / "wal", point,
                       start_vclock=source.snap_vclock)
    return result, work


def rows_of(path: Path) -> list[tuple[dict, object]]:
    return [(row.header, row.body) for _, row in read_rows(path)]


def blocks_of(path: Path) -> list[tuple[bytes, bytes]]:
    """(stored bytes with the header, decompressed rows) of each block."""
    data = path.read_bytes()
    pos = parse_meta(data[:MAX_META_SIZE]).size
    out = []
    while pos < len(data) and data[pos:pos + 4] != EOF_MAGIC:
        compressed, length, _ = parse_fixheader(data[pos:pos + FIXHEADER_SIZE])
        stored = data[pos:pos + FIXHEADER_SIZE + length]
        payload = stored[FIXHEADER_SIZE:]
        out.append((stored, decompress(payload) if compressed else payload))
        pos += FIXHEADER_SIZE + length
    return out


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if "walvault-tmp" in p.name]


# --------------------------------------------------------------------------- points between transactions


@require_tarantool
@pytest.mark.parametrize("kind", ["vclock", "time"])
@pytest.mark.parametrize("name", ["m1", "g1", "m2"])
def test_restore_to_a_point_between_transactions(source, tmp_path, kind, name):
    moment = source.moments[name]
    point = Point(vclock=moment.vclock) if kind == "vclock" else Point(time=moment.time)
    result, work = restore(source, tmp_path / "data", point)

    assert result.vclock == moment.vclock
    assert result.last_time is not None and result.last_time < moment.time
    chain = source.chain()
    assert result.cut_file is not None and result.files[-1] == result.cut_file
    assert result.files == [p.name for p in chain[:len(result.files)]]
    for name_ in result.files[:-1]:
        assert (work / "wal" / name_).read_bytes() == (source.dir / "wal" / name_).read_bytes()
    # The cut xlog: the same meta, a prefix of the source's rows, blocks kept whole but the last, the EOF marker.
    cut, whole = work / "wal" / result.cut_file, source.dir / "wal" / result.cut_file
    assert parse_meta(cut.read_bytes()[:MAX_META_SIZE]) == parse_meta(whole.read_bytes()[:MAX_META_SIZE])
    assert cut.read_bytes().endswith(EOF_MAGIC)
    kept, source_rows = rows_of(cut), rows_of(whole)
    assert 0 < len(kept) < len(source_rows) and kept == source_rows[:len(kept)]
    cut_blocks, source_blocks = blocks_of(cut), blocks_of(whole)
    assert cut_blocks[:-1] == source_blocks[:len(cut_blocks) - 1]
    assert source_blocks[len(cut_blocks) - 1][1].startswith(cut_blocks[-1][1])
    assert result.rows == sum(len(rows_of(work / "wal" / n)) for n in result.files)

    recovered = tr.start_recovery(work)
    assert recovered.ok, recovered.error
    assert recovered.vclock == moment.vclock
    assert recovered.counts == moment.counts


@require_tarantool
def test_a_vclock_point_at_the_end_of_the_chain_copies_every_xlog(source, tmp_path):
    end = source.moments["end"]
    result, work = restore(source, tmp_path / "data", Point(vclock=end.vclock))
    assert result.cut_file is None and result.vclock == end.vclock
    assert result.files == [p.name for p in source.chain()]
    assert not source.chain()[-1].read_bytes().endswith(EOF_MAGIC)  # open: copied as it is all the same
    for p in source.chain():
        assert (work / "wal" / p.name).read_bytes() == p.read_bytes()
    recovered = tr.start_recovery(work)
    assert recovered.ok, recovered.error
    assert (recovered.vclock, recovered.counts) == (end.vclock, end.counts)


@require_tarantool
def test_a_point_where_an_xlog_starts_leaves_that_xlog_out(source, tmp_path):
    chain = source.chain()
    assert len(chain) >= 4
    boundary = xlog_vclock(chain[2])
    result, work = restore(source, tmp_path / "data", Point(vclock=boundary))
    assert (result.files, result.cut_file, result.vclock) == ([p.name for p in chain[:2]], None, boundary)
    recovered = tr.start_recovery(work)
    assert recovered.ok, recovered.error
    assert recovered.vclock == boundary


# --------------------------------------------------------------------------- a point inside a transaction


@require_tarantool
@pytest.mark.parametrize("inside", ["first row of B", "every global row of B, not its local row"])
def test_a_transaction_the_point_cuts_through_is_left_out_whole(source, tmp_path, inside):
    g0 = source.moments["g0"]
    a = g0.vclock[1] + 1  # A's lsn; B's global rows follow, then C
    group = [(p.name, pos) for p in source.chain() for pos, row in read_rows(p)
             if row.replica_id == 1 and a <= row.lsn <= a + 4]
    assert len(group) == 5 and len(set(group)) == 1, "A, B and C are not in one block: the cut is not inside one"
    point = {0: g0.vclock[0], 1: a + 1 if inside == "first row of B" else a + 3}
    result, work = restore(source, tmp_path / "data", Point(vclock=point))

    expected = {0: g0.vclock[0], 1: a}
    assert result.vclock == expected
    dumped = tr.dump_data_dir(work)
    assert dumped["vclock"] == expected
    keys = {space: {row[0] for row in rows} for space, rows in dumped["spaces"].items()}
    assert {space: len(k) for space, k in keys.items()} == g0.counts | {"mem": g0.counts["mem"] + 1}
    assert 5000001 in keys["mem"]
    assert not {5000002, 5000003, 5000005, 5000006} & keys["mem"] and 5000004 not in keys["loc"]


# --------------------------------------------------------------------------- refusals


@require_tarantool
def test_points_the_chain_cannot_reach_are_refused_and_nothing_is_written(source, tmp_path):
    end, early = source.moments["end"], source.moments["early"]
    cases = [
        ("past the open newest xlog", Point(time=end.time + 3600), source.chain(), "still open"),
        ("vclock past the end", Point(vclock=end.vclock | {1: end.vclock[1] + 1}), source.chain(),
         f"the log ends at vclock {format_vclock(end.vclock)}"),
        ("vclock of a component never written", Point(vclock=end.vclock | {2: 1}), source.chain(),
         "before the point"),
        ("vclock before the snapshot", Point(vclock=early.vclock), source.chain(), "no base before the point"),
        # Rows from before the snapshot show that it holds transactions after the point.
        ("time before the snapshot", Point(time=early.time), source.xlogs(), "no base before the point"),
        ("a gap", Point(vclock=end.vclock), source.chain()[:2] + source.chain()[3:], "a gap"),
    ]
    for what, point, xlogs, reason in cases:
        out = tmp_path / what
        out.mkdir()
        with pytest.raises(PointError) as e:
            cut_chain(xlogs, out, point, start_vclock=source.snap_vclock)
        assert reason in str(e.value), (what, str(e.value))
        assert list(out.iterdir()) == [], what


@require_tarantool
def test_an_error_while_writing_leaves_no_temporary_file(source, tmp_path, monkeypatch):
    g0 = source.moments["g0"]
    point = Point(vclock=g0.vclock | {1: g0.vclock[1] + 1})  # inside a block: the cut block is rewritten

    def fail(*args, **kwargs):
        raise OSError("disk full")

    for what, target in [("copy", (os, "fsync")), ("rewrite", (TarantoolWriter, "write_rows"))]:
        out = tmp_path / what
        out.mkdir()
        with monkeypatch.context() as m:
            m.setattr(*target, fail)
            with pytest.raises(OSError, match="disk full"):
                cut_chain(source.chain(), out, point, start_vclock=source.snap_vclock)
        left = sorted(p.name for p in out.iterdir())
        assert no_temp_files(out), left
        # Only the copies finished before the failure remain, under their names.
        assert left == [p.name for p in source.chain()[:len(left)]] and (what == "copy") == (left == [])


# --------------------------------------------------------------------------- the cut block, on synthetic data


def test_the_cut_block_keeps_row_bytes_and_is_compressed_by_the_writers_rule(tmp_path):
    """generate_wal's blocks hold up to 40 transactions, plain and zstd: cut inside the biggest one."""
    files = generate_wal(tmp_path / "src", target_bytes=600 << 10, file_bytes=200 << 10, seed=3)
    snap, xlogs = files[0], files[1:]
    start = parse_meta(snap.read_bytes()[:MAX_META_SIZE]).vclock
    target = xlogs[1]
    blocks = blocks_of(target)
    biggest = max(range(len(blocks)), key=lambda i: len(blocks[i][1]))
    tx_ends = [row.lsn for _, row in read_rows(target) if row.commit]
    in_block = [row.lsn for row in _rows_of_payload(blocks[biggest][1]) if row.commit]
    assert len(in_block) >= 3
    lsn = in_block[len(in_block) * 2 // 3]
    assert lsn in tx_ends
    out = tmp_path / "out"
    out.mkdir()
    result = cut_chain(xlogs, out, Point(vclock={1: lsn}), start_vclock=start)

    assert (result.files, result.cut_file, result.vclock) == ([xlogs[0].name, target.name], target.name, {1: lsn})
    cut_blocks = blocks_of(out / target.name)
    assert len(cut_blocks) == biggest + 1 and cut_blocks[:-1] == blocks[:biggest]
    stored, rows = cut_blocks[-1]
    assert blocks[biggest][1].startswith(rows) and len(rows) < len(blocks[biggest][1])
    assert [r.lsn for r in _rows_of_payload(rows)][-1] == lsn
    assert parse_fixheader(stored[:FIXHEADER_SIZE])[0] == (len(rows) + FIXHEADER_SIZE >= ZSTD_THRESHOLD)
    assert result.rows == sum(1 for p in (xlogs[0], out / target.name) for _ in read_rows(p))


@pytest.mark.parametrize("open_last", [True, False])
def test_a_time_point_after_the_last_transaction_is_refused_even_when_the_newest_xlog_is_sealed(tmp_path, open_last):
    """Tarantool writes on in a next xlog after it seals one: that one may hold transactions before the point."""
    files = generate_wal(tmp_path / "src", target_bytes=200 << 10, file_bytes=64 << 10, open_last=open_last)
    snap, xlogs = files[0], files[1:]
    start = parse_meta(snap.read_bytes()[:MAX_META_SIZE]).vclock
    assert xlogs[-1].read_bytes().endswith(EOF_MAGIC) != open_last
    out = tmp_path / "out"
    out.mkdir()
    state = "still open" if open_last else "sealed"
    with pytest.raises(PointError, match=re.escape(f"what follows its newest xlog {xlogs[-1].name} ({state})")):
        cut_chain(xlogs, out, Point(time=1.7e9 + 60), start_vclock=start)
    assert list(out.iterdir()) == []
    # A vclock point is reached at the very end: no later xlog can hold a row at or before it.
    end = {1: max(row.lsn for _, row in read_rows(xlogs[-1]))}
    result = cut_chain(xlogs, out, Point(vclock=end), start_vclock=start)
    assert (result.files, result.cut_file, result.vclock) == ([p.name for p in xlogs], None, end)
    assert all((out / p.name).read_bytes() == p.read_bytes() for p in xlogs)


def test_an_empty_chain_reaches_only_the_snapshot(tmp_path):
    start = {1: 10, 0: 2}
    result = cut_chain([], tmp_path, Point(vclock=start), start_vclock=start)
    assert (result.files, result.cut_file, result.rows, result.vclock, result.last_time) == ([], None, 0, start, None)
    with pytest.raises(PointError, match=re.escape("the log ends at vclock {0: 2, 1: 10}, before the point")):
        cut_chain([], tmp_path, Point(vclock={1: 11, 0: 2}), start_vclock=start)
    with pytest.raises(PointError, match="what follows the snapshot may not be archived yet"):
        cut_chain([], tmp_path, Point(time=1.7e9), start_vclock=start)
    with pytest.raises(PointError, match="no base before the point .the point has no component 0"):
        cut_chain([], tmp_path, Point(vclock={1: 500}), start_vclock=start)
    assert list(tmp_path.iterdir()) == []


def _rows_of_payload(payload: bytes):
    return list(iter_rows(payload, require_lsn=True))


# --------------------------------------------------------------------------- parse_point


@pytest.mark.parametrize("text, expected", [
    ("{1: 120, 0: 5}", Point(vclock={1: 120, 0: 5})),
    ("1:120,0:5", Point(vclock={1: 120, 0: 5})),
    (" 1: 120 ", Point(vclock={1: 120})),
    ("{}", Point(vclock={})),
    ("2026-11-23T21:00:00Z", Point(time=calendar.timegm((2026, 11, 23, 21, 0, 0)))),
    ("2026-11-23 21:00:00+01:00", Point(time=calendar.timegm((2026, 11, 23, 20, 0, 0)))),
    ("2026-11-23T21:00:00", Point(time=calendar.timegm((2026, 11, 23, 21, 0, 0)))),
    ("2026-11-23T21:00:00.250Z", Point(time=calendar.timegm((2026, 11, 23, 21, 0, 0)) + 0.25)),
    ("@1795467600.5", Point(time=1795467600.5)),
])
def test_parse_point(text, expected):
    assert parse_point(text) == expected


@pytest.mark.parametrize("text, reason", [
    ("", "is not a point"),
    ("yesterday", "is not a point"),
    ("120", "is not a point"),
    ("1:120,", "is not a point"),
    ("1:2:3", "is not a point"),
    ("{1: x}", "is not id: lsn"),
    ("{1: 5, 1: 6}", "appears twice"),
    ("@", "unix seconds"),
    ("@soon", "unix seconds"),
    ("@nan", "finite"),
    ("@-5", ">= 0"),
    ("2026-13-40T25:00:00Z", "not an ISO-8601 time"),
])
def test_parse_point_refuses(text, reason):
    with pytest.raises(ValueError, match=reason):
        parse_point(text)


def test_point_is_a_vclock_or_a_time_and_describes_itself():
    with pytest.raises(ValueError):
        Point()
    with pytest.raises(ValueError):
        Point(vclock={1: 1}, time=1.0)
    assert Point(vclock={1: 120, 0: 5}).describe() == "vclock {0: 5, 1: 120}"
    assert Point(time=calendar.timegm((2026, 11, 23, 21, 0, 0))).describe() == "time 2026-11-23T21:00:00Z"
    assert parse_point("@1795467600.25").describe() == "time 2026-11-23T21:00:00.250000Z"
    assert parse_point(Point(vclock={1: 7}).describe().removeprefix("vclock ")) == Point(vclock={1: 7})


def test_a_snapshot_is_taken_no_earlier_than_its_log_says():
    """Tarantool 2.6 stamps the rows of a running instance's later checkpoints with its first checkpoint's time:
    the log bounds when the snapshot's last row was committed, and a recorded row time earlier than that is not
    taken (restore --to @T and retention would take the snapshot for older than it is)."""
    from walcore.tarantool.times import snapshot_taken

    snap = {"0": 5, "1": 100}
    before = {"vclock": [{"1": 50}, {"0": 5, "1": 100}], "time": [10.0, 20.0]}  # ends at the snapshot
    after = {"vclock": [{"0": 5, "1": 100}, {"0": 5, "1": 130}], "time": [25.0, 30.0]}  # starts at it
    elsewhere = {"vclock": [{"1": 130}, {"1": 160}], "time": [31.0, 40.0]}
    empty = {"vclock": [{"0": 5, "1": 100}, {"0": 5, "1": 100}], "time": None}
    stale = 1.0
    stored = {"started": 50.0, "finished": 60.0}  # the backup that stored the snapshot
    assert snapshot_taken(snap, stale, [before, after, elsewhere, empty], **stored) == 20.0
    assert snapshot_taken(snap, stale, [after, elsewhere], **stored) == 25.0
    # The log does not say: the snapshot existed when its backup finished (the recorded row time may be stale);
    # with no row time, it was taken before the backup started.
    assert snapshot_taken(snap, stale, [elsewhere, empty], **stored) == 61.0
    assert snapshot_taken(snap, None, [elsewhere], **stored) == 51.0

"""Damage tests: real Tarantool files, altered in a copy, must give the exact finding at the exact offset.

Every damaged file starts as a copy of a real file from shared/fixtures/tarantool (written by Tarantool
2.6.0) or of a file made by walcore's own writer. Expected offsets are computed here, independently of
walcore's reader, by walking the block headers with the small parser in tarantool_bytes.py.

Randomized cases are seeded and reproducible: set WALVAULT_DAMAGE_SEED to replay another seed; the seed
and the exact mutation are printed in every failure message.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import msgpack
import pytest

from tarantool_bytes import (EOF_MAGIC, HEADER, ROW_MAGIC, ZROW_MAGIC, Blk, Framing, RawRow, block_rows, count_rows,
                             framing, replace_payload, split_rows)
import walcore.scan_paths as wverify
from walcore.runner import LocalRunner
from walcore.tarantool.meta import parse_meta
from walcore.tarantool.writer import TarantoolWriter, generate_wal
from walcore.tarantool.xlog import read_rows, scan_file
from walcore.scan_paths import verify_paths

# Every test once on each scan core (compiled and pure-Python reference).
pytestmark = pytest.mark.usefixtures("scan_core")

SHARED = Path(__file__).resolve().parents[2] / "shared"
FIXTURES = SHARED / "fixtures" / "tarantool"
SEED = int(os.environ.get("WALVAULT_DAMAGE_SEED", "20240611"))

# Fixture files used below (paths relative to FIXTURES).
XLOG_PLAIN = "features/wal/00000000000000000000.xlog"  # 124 plain blocks, one row each
XLOG_MIXED = "features/wal/00000000000000000123.xlog"  # plain blocks of multi-statement txs + 2 zstd blocks
XLOG_CONC = "concurrent/00000000000000000000.xlog"  # 20 single-statement txs per block
XLOG_MID = "many-xlogs/wal/00000000000000000513.xlog"  # a middle xlog of a 15-file chain
SNAP = "features/memtx/00000000000000000197.snap"  # one zstd block + EOF
VYLOG = "features/vinyl/00000000000000000197.vylog"
RUN_PLAIN = "features/vinyl/513/0/00000000000000000014.run"
RUN_ZSTD = "features/vinyl/513/0/00000000000000000018.run"


# ---------------------------------------------------------------------------------------------
# Fixture files and verdicts
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def fixtures() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"shared Tarantool fixtures not found at {FIXTURES} "
                    "(tests expect the shared/ dir next to the repo: <repo>/../shared/fixtures/tarantool)")
    return FIXTURES


def copy_file(fixtures: Path, rel: str, dst_dir: Path, name: str | None = None) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / (name or Path(rel).name)
    shutil.copyfile(fixtures / rel, dst)  # copyfile: not the read-only mode of the shared files
    return dst


def copy_tree(fixtures: Path, rel: str, dst: Path) -> Path:
    src = fixtures / rel
    for p in sorted(src.rglob("*")):
        if p.is_file():
            target = dst / p.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target)
    return dst


def verdict(path: Path):
    """walcore's verdict on one file alone (verify_paths on just that file, sequentially)."""
    report = verify_paths([path], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path) == path]
    return f


def found(f) -> list[tuple[str, int | None]]:
    return [(x.code, x.offset) for x in f.findings]


def chain_found(chain) -> list[tuple[str, str | None]]:
    return [(x.code, Path(x.file).name if x.file else None) for x in chain.findings]


def assert_findings(f, primary: list[tuple[str, int]], consequences=()) -> None:
    """The primary findings come first, in order; after them exactly the listed consequences, in any order."""
    got = found(f)
    assert got[:len(primary)] == primary, got
    rest = got[len(primary):]
    assert sorted(rest, key=str) == sorted(consequences, key=str), f"findings {rest} (expected {list(consequences)})"
    assert f.status == "damaged"


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def baseline(fixtures: Path, rel: str):
    data = (fixtures / rel).read_bytes()
    return data, framing(data)


# ---------------------------------------------------------------------------------------------
# CRC mismatches
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel, index", [
    (XLOG_PLAIN, 10), (XLOG_PLAIN, 0), (XLOG_PLAIN, -1), (XLOG_CONC, 5), (XLOG_MIXED, 3),
    (VYLOG, 2), (RUN_PLAIN, 1),
])
def test_flipped_byte_in_plain_payload_is_crc_mismatch(fixtures, tmp_path, rel, index):
    data, fr = baseline(fixtures, rel)
    plain = [b for b in fr.blocks if b.kind == "rows"]
    blk = plain[index]
    assert blk.length > 4
    damaged = bytearray(data)
    damaged[blk.pos + HEADER + blk.length // 2] ^= 0x40
    f = verdict(write(tmp_path / Path(rel).name, bytes(damaged)))

    i = fr.blocks.index(blk)
    nxt = fr.blocks[i + 1] if i + 1 < len(fr.blocks) else None
    # In an xlog the rows of the lost block leave an LSN gap before the next block (or, for the first
    # block, between the VClock and the first row read).
    consequences = []
    if rel.endswith(".xlog") and nxt is not None:
        consequences.append(("lsn_gap", nxt.pos))
    assert_findings(f, [("crc_mismatch", blk.pos)], consequences)
    # Everything after the damaged block is still read.
    assert f.blocks == len(fr.blocks) - 1
    assert f.zstd_blocks == sum(b.kind == "zstd" for b in fr.blocks)
    assert f.rows == count_rows(data, fr.blocks) - count_rows(data, [blk])
    assert f.eof is True
    if nxt is not None and rel.endswith(".xlog"):
        last = [r.header[3] for b in fr.blocks for r in split_rows(block_rows(data, b)) if r.header.get(2) == 1][-1]
        assert f.lsns[1][1] == last  # the last row of the file was read


@pytest.mark.parametrize("rel, index", [(XLOG_MIXED, 0), (XLOG_MIXED, 1), (SNAP, 0), (RUN_ZSTD, 1)])
def test_flipped_byte_in_zstd_payload_is_crc_mismatch(fixtures, tmp_path, rel, index):
    data, fr = baseline(fixtures, rel)
    blk = [b for b in fr.blocks if b.kind == "zstd"][index]
    damaged = bytearray(data)
    damaged[blk.pos + HEADER + 7] ^= 0x01
    f = verdict(write(tmp_path / Path(rel).name, bytes(damaged)))
    i = fr.blocks.index(blk)
    consequences = [("lsn_gap", fr.blocks[i + 1].pos)] if rel.endswith(".xlog") and i + 1 < len(fr.blocks) else []
    assert_findings(f, [("crc_mismatch", blk.pos)], consequences)
    assert f.blocks == len(fr.blocks) - 1
    assert f.zstd_blocks == sum(b.kind == "zstd" for b in fr.blocks) - 1
    assert f.rows == count_rows(data, fr.blocks) - count_rows(data, [blk])
    assert f.eof is True


def test_flipped_crc_field_is_crc_mismatch(fixtures, tmp_path):
    data, fr = baseline(fixtures, XLOG_CONC)
    blk = fr.blocks[7]
    damaged = bytearray(data)
    damaged[blk.crc_field[1] - 1] ^= 0x80
    f = verdict(write(tmp_path / "x.xlog", bytes(damaged)))
    assert_findings(f, [("crc_mismatch", blk.pos)], [("lsn_gap", fr.blocks[8].pos)])
    assert f.blocks == len(fr.blocks) - 1


# ---------------------------------------------------------------------------------------------
# Valid CRC, bad contents: zstd frames and rows
# ---------------------------------------------------------------------------------------------

def _garbage(data, blk):
    return random.Random(blk.pos).randbytes(blk.length)


def _cut_frame(data, blk):
    return data[blk.payload[0]:blk.payload[1] - 9]


def _frame_plus_tail(data, blk):
    return data[blk.payload[0]:blk.payload[1]] + b"\x00\x01\x02"


@pytest.mark.parametrize("make", [_garbage, _cut_frame, _frame_plus_tail], ids=["garbage", "cut", "tail"])
@pytest.mark.parametrize("rel", [XLOG_MIXED, SNAP, RUN_ZSTD])
def test_bad_zstd_frame_with_valid_crc_is_zstd_error(fixtures, tmp_path, rel, make):
    data, fr = baseline(fixtures, rel)
    blk = [b for b in fr.blocks if b.kind == "zstd"][0]
    payload = make(data, blk)
    new = replace_payload(data, blk, payload, raw=True)
    f = verdict(write(tmp_path / Path(rel).name, new))
    i = fr.blocks.index(blk)
    shift = len(payload) - blk.length
    consequences = []
    if rel.endswith(".xlog") and i + 1 < len(fr.blocks):
        consequences.append(("lsn_gap", fr.blocks[i + 1].pos + shift))
    assert_findings(f, [("zstd_error", blk.pos)], consequences)
    assert f.blocks == len(fr.blocks) - 1
    assert f.rows == count_rows(data, fr.blocks) - count_rows(data, [blk])
    assert f.eof is True


def test_plain_magic_turned_zstd_is_zstd_error(fixtures, tmp_path):
    """ab -> ba in the magic: the CRC still matches, but the rows are no zstd frame."""
    data, fr = baseline(fixtures, XLOG_CONC)
    blk = fr.blocks[4]
    new = data[:blk.pos] + ZROW_MAGIC + data[blk.pos + 4:]
    f = verdict(write(tmp_path / "x.xlog", new))
    assert_findings(f, [("zstd_error", blk.pos)], [("lsn_gap", fr.blocks[5].pos)])


@pytest.mark.parametrize("keep", [0, 1, 7])
def test_invalid_msgpack_rows_with_valid_crc_is_bad_row(fixtures, tmp_path, keep):
    data, fr = baseline(fixtures, XLOG_CONC)
    blk = fr.blocks[3]
    rows = split_rows(block_rows(data, blk))
    assert len(rows) > keep + 1
    good = b"".join(r.raw for r in rows[:keep])
    new_rows = good + b"\xc1" * (blk.length - len(good))  # 0xc1: never valid msgpack
    f = verdict(write(tmp_path / "x.xlog", replace_payload(data, blk, new_rows)))
    # The offset points at the first bad row inside the block.
    assert_findings(f, [("bad_row", blk.pos + HEADER + len(good))], [("lsn_gap", fr.blocks[4].pos)])
    assert f.blocks == len(fr.blocks)
    assert f.rows == count_rows(data, fr.blocks) - len(rows) + keep


def test_invalid_msgpack_rows_in_zstd_block_is_bad_row_at_block(fixtures, tmp_path):
    data, fr = baseline(fixtures, XLOG_MIXED)
    blk = [b for b in fr.blocks if b.kind == "zstd"][1]
    rows = split_rows(block_rows(data, blk))
    new_rows = b"".join(r.raw for r in rows[:5]) + b"\x91\xc1"  # an array holding an invalid byte
    f = verdict(write(tmp_path / "x.xlog", replace_payload(data, blk, new_rows)))
    # Inside a zstd block the offset is the block's; the message names the byte in its rows.
    # The block held one transaction, now cut after its 5th row.
    assert_findings(f, [("bad_row", blk.pos)], [("unterminated_transaction", blk.pos)])
    assert f"at byte {sum(len(r.raw) for r in rows[:5])} of its rows" in f.findings[0].message
    assert f.rows == count_rows(data, fr.blocks) - len(rows) + 5


def _drop_key(key):
    def mutate(row: RawRow) -> tuple[bytes, int]:
        header = dict(row.header)
        del header[key]
        packed = msgpack.packb(header)
        rest = row.raw[row.body_offset - row.offset:]
        return packed + rest, 0
    return mutate


@pytest.mark.parametrize("rel, block, row, mutate", [
    (XLOG_CONC, 3, 4, _drop_key(0)),  # no type
    (XLOG_CONC, 3, 0, _drop_key(0)),
    (XLOG_CONC, 6, 19, _drop_key(3)),  # an xlog row without lsn
    (SNAP, 0, 30, _drop_key(0)),
], ids=["type", "type-first-row", "lsn", "snap-type"])
def test_row_without_key_is_missing_row_key(fixtures, tmp_path, rel, block, row, mutate):
    data, fr = baseline(fixtures, rel)
    blk = fr.blocks[block]
    rows = split_rows(block_rows(data, blk))
    new_row, fault = mutate(rows[row])
    new_rows = b"".join(r.raw for r in rows[:row]) + new_row + b"".join(r.raw for r in rows[row + 1:])
    f = verdict(write(tmp_path / Path(rel).name, replace_payload(data, blk, new_rows)))
    if blk.kind == "zstd":
        offset = blk.pos
    else:
        offset = blk.pos + HEADER + rows[row].offset + fault
    shift = (len(new_rows) - blk.length) if blk.kind == "rows" else None
    consequences = []
    if rel.endswith(".xlog") and block + 1 < len(fr.blocks):
        consequences.append(("lsn_gap", fr.blocks[block + 1].pos + shift))
    assert_findings(f, [("missing_row_key", offset)], consequences)
    assert f.rows == count_rows(data, fr.blocks) - len(rows) + row


def test_header_that_is_an_array_is_bad_row(fixtures, tmp_path):
    """A row header packed as an array whose items read like a map's keys (type, 4, replica_id, lsn)
    is no map: Tarantool refuses it, and so must the fast walk, not only the exact one."""
    data, fr = baseline(fixtures, XLOG_CONC)
    blk = fr.blocks[3]
    rows = split_rows(block_rows(data, blk))
    row = rows[4]
    h = row.header
    assert set(h) == {0, 2, 3, 4}, h  # a single-statement row, the fast walk's common case
    header = msgpack.packb([h[0], 4, h[2], h[3]])
    new_row = header + row.raw[row.body_offset - row.offset:]
    new_rows = b"".join(r.raw for r in rows[:4]) + new_row + b"".join(r.raw for r in rows[5:])
    f = verdict(write(tmp_path / "x.xlog", replace_payload(data, blk, new_rows)))
    shift = len(new_rows) - blk.length
    assert_findings(f, [("bad_row", blk.pos + HEADER + row.offset)], [("lsn_gap", fr.blocks[4].pos + shift)])
    assert "not a map" in f.findings[0].message


# ---------------------------------------------------------------------------------------------
# Broken framing: resynchronisation
# ---------------------------------------------------------------------------------------------

def _set(field, value):
    def damage(data: bytearray, blk: Blk) -> None:
        data[field(blk)] = value
    return damage


@pytest.mark.parametrize("rel, index, damage, code", [
    (XLOG_PLAIN, 20, _set(lambda b: b.pos, 0xD4), "bad_magic"),
    (XLOG_PLAIN, 0, _set(lambda b: b.pos + 3, 0x00), "bad_magic"),
    (XLOG_PLAIN, 20, _set(lambda b: b.len_field[0], 0xC1), "bad_fixheader"),
    (XLOG_MIXED, 12, _set(lambda b: b.len_field[0], 0xC1), "bad_fixheader"),  # zstd block, cd-wide len
    (XLOG_CONC, 9, _set(lambda b: b.crc_field[0], 0xC1), "bad_fixheader"),
    (XLOG_CONC, 9, _set(lambda b: b.crc_field[1], 0x00), "bad_fixheader"),  # padding is no string
    (XLOG_PLAIN, -1, _set(lambda b: b.pos, 0x00), "bad_magic"),  # last block: resync to the EOF marker
    (SNAP, 0, _set(lambda b: b.len_field[0], 0xC1), "bad_fixheader"),
    (VYLOG, 3, _set(lambda b: b.pos + 1, 0x10), "bad_magic"),
    (RUN_ZSTD, 1, _set(lambda b: b.pos + 2, 0xFF), "bad_magic"),
])
def test_damaged_block_header_resyncs_to_next_block(fixtures, tmp_path, rel, index, damage, code):
    data, fr = baseline(fixtures, rel)
    blk = fr.blocks[index]
    i = fr.blocks.index(blk)
    new = bytearray(data)
    damage(new, blk)
    f = verdict(write(tmp_path / Path(rel).name, bytes(new)))
    nxt = fr.blocks[i + 1] if i + 1 < len(fr.blocks) else fr.eof
    consequences = [("lsn_gap", nxt.pos)] if rel.endswith(".xlog") and nxt.kind != "eof" else []
    assert_findings(f, [(code, blk.pos), ("skipped_bytes", blk.pos)], consequences)
    assert f"next valid block at {nxt.pos}" in f.findings[1].message
    assert f.findings[1].message.startswith(f"{nxt.pos - blk.pos} bytes skipped")
    assert f.blocks == len(fr.blocks) - 1
    assert f.rows == count_rows(data, fr.blocks) - count_rows(data, [blk])
    assert f.eof is True


def test_damaged_header_of_last_block_of_open_xlog_is_unreadable_tail(fixtures, tmp_path):
    data, fr = baseline(fixtures, XLOG_CONC)
    blk = fr.blocks[-1]
    new = bytearray(data[:fr.eof.pos])  # the newest xlog: no EOF marker
    new[blk.pos] ^= 0xFF
    f = verdict(write(tmp_path / "x.xlog", bytes(new)))
    assert found(f) == [("bad_magic", blk.pos), ("unreadable_tail", blk.pos)]
    assert f.status == "damaged"
    assert f.blocks == len(fr.blocks) - 1
    assert f.eof is False


def test_length_past_end_of_file_is_truncated_block_then_resync(fixtures, tmp_path):
    """A damaged len that points past the end looks like a cut block, but valid blocks follow."""
    data, fr = baseline(fixtures, XLOG_PLAIN)
    blk = fr.blocks[30]
    header = ROW_MAGIC + b"\xce" + (1 << 20).to_bytes(4, "big") + b"\x00" + data[blk.crc_field[0]:blk.crc_field[1]]
    pad = HEADER - len(header) - 1
    header += bytes([0xA0 + pad]) + bytes(pad)
    new = data[:blk.pos] + header + data[blk.pos + HEADER:]
    assert len(new) == len(data)
    f = verdict(write(tmp_path / "x.xlog", new))
    nxt = fr.blocks[31]
    assert_findings(f, [("truncated_block", blk.pos), ("skipped_bytes", blk.pos)], [("lsn_gap", nxt.pos)])
    assert f.blocks == len(fr.blocks) - 1
    assert f.eof is True


def test_wrong_length_inside_file_is_crc_mismatch_then_resync(fixtures, tmp_path):
    data, fr = baseline(fixtures, XLOG_PLAIN)
    blk = fr.blocks[40]
    assert blk.len_field[1] - blk.len_field[0] == 1 and blk.length < 0x70
    new = bytearray(data)
    new[blk.len_field[0]] += 3  # a fixint len, 3 bytes too long: the block runs into the next header
    f = verdict(write(tmp_path / "x.xlog", bytes(new)))
    nxt = fr.blocks[41]
    # The block after the damaged one starts inside the bytes the wrong length claims, and is found again.
    assert_findings(f, [("crc_mismatch", blk.pos), ("skipped_bytes", blk.pos)], [("lsn_gap", nxt.pos)])
    assert f.blocks == len(fr.blocks) - 1


# ---------------------------------------------------------------------------------------------
# Truncation
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel, index, into", [
    (XLOG_PLAIN, 50, HEADER + 5), (XLOG_MIXED, -1, HEADER + 1000), (SNAP, 0, HEADER + 100),
    (VYLOG, -1, HEADER + 1), (RUN_PLAIN, 1, HEADER + 4000), (XLOG_PLAIN, 50, HEADER + -1),
    (XLOG_PLAIN, 50, 1), (XLOG_MIXED, 5, 4), (SNAP, 0, 10), (RUN_ZSTD, 2, 18),
], ids=["xlog-payload", "xlog-zstd-payload", "snap-payload", "vylog-payload", "run-payload", "xlog-last-byte",
        "xlog-header-1", "xlog-header-4", "snap-header-10", "run-header-18"])
def test_cut_inside_a_block_is_truncated_block(fixtures, tmp_path, rel, index, into):
    data, fr = baseline(fixtures, rel)
    blk = fr.blocks[index]
    cut = blk.pos + into if into != HEADER - 1 else blk.end - 1
    assert blk.pos < cut < blk.end
    f = verdict(write(tmp_path / Path(rel).name, data[:cut]))
    assert found(f) == [("truncated_block", blk.pos)]
    assert f.status == "damaged"
    before = fr.blocks[:fr.blocks.index(blk)]
    assert f.blocks == len(before)
    assert f.rows == count_rows(data, before)
    assert f.eof is False


def test_cut_inside_the_eof_marker_is_truncated_block(fixtures, tmp_path):
    data, fr = baseline(fixtures, XLOG_PLAIN)
    f = verdict(write(tmp_path / "x.xlog", data[:fr.eof.pos + 2]))
    assert found(f) == [("truncated_block", fr.eof.pos)]
    assert f.status == "damaged"


@pytest.mark.parametrize("rel", [SNAP, RUN_PLAIN, RUN_ZSTD, "features/vinyl/513/0/00000000000000000014.index"])
@pytest.mark.parametrize("where", ["eof", "first", "meta"])
def test_sealed_file_cut_at_block_boundary_is_missing_eof(fixtures, tmp_path, rel, where):
    data, fr = baseline(fixtures, rel)
    cut = {"eof": fr.eof.pos, "first": fr.blocks[0].end, "meta": fr.meta_size}[where]
    f = verdict(write(tmp_path / Path(rel).name, data[:cut]))
    assert found(f) == [("missing_eof", cut)]
    assert f.status == "damaged"
    assert f.eof is False


@pytest.mark.parametrize("keep", [0, 1, 20, 42, 43])  # of 43 blocks
def test_newest_xlog_cut_at_block_boundary_is_open(fixtures, tmp_path, keep):
    """Legitimately indistinguishable from the xlog Tarantool is writing: open, no finding, fewer rows."""
    root = copy_tree(fixtures, "features", tmp_path / "features")
    (root / "wal" / "00000000000000000437.xlog").unlink()  # no clean shutdown: 361 is the newest
    name = "00000000000000000361.xlog"
    data, fr = baseline(fixtures, f"features/wal/{name}")
    blocks = fr.blocks[:keep]
    cut = blocks[-1].end if blocks else fr.meta_size
    write(root / "wal" / name, data[:cut])
    report = verify_paths([root], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path).name == name]
    assert f.status == "open" and found(f) == []
    assert f.rows == count_rows(data, blocks) and f.blocks == len(blocks)
    assert len(fr.blocks) == 43
    if keep < len(fr.blocks):
        assert f.rows < count_rows(data, fr.blocks)
    assert report.intact
    assert [c.status for c in report.chains] == ["ok"]


def test_vylog_cut_at_block_boundary_is_open(fixtures, tmp_path):
    data, fr = baseline(fixtures, VYLOG)
    f = verdict(write(tmp_path / Path(VYLOG).name, data[:fr.blocks[3].end]))
    assert f.status == "open" and found(f) == [] and f.blocks == 4


# ---------------------------------------------------------------------------------------------
# Data after the EOF marker
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rel, extra", [
    (XLOG_PLAIN, b"\x00"), (XLOG_MIXED, b"garbage after the end"), (SNAP, EOF_MAGIC), (VYLOG, b"\n" * 100),
    (RUN_ZSTD, None),  # a whole valid block after the marker
])
def test_data_after_eof(fixtures, tmp_path, rel, extra):
    data, fr = baseline(fixtures, rel)
    if extra is None:
        extra = data[fr.blocks[0].pos:fr.blocks[0].end]
    f = verdict(write(tmp_path / Path(rel).name, data + extra))
    assert found(f) == [("data_after_eof", fr.eof.end)]
    assert f"{len(extra)} bytes" in f.findings[0].message
    assert f.status == "damaged" and f.eof is True
    assert f.blocks == len(fr.blocks) and f.rows == count_rows(data, fr.blocks)


# ---------------------------------------------------------------------------------------------
# Meta block
# ---------------------------------------------------------------------------------------------

def _edit(old: bytes, new: bytes, fault):
    """Replace `old` by `new` (same length); fault(data, at) is where the meta parser must point."""
    assert len(old) == len(new)

    def edit(data: bytes) -> tuple[bytes, int]:
        at = data.index(old)
        return data[:at] + new + data[at + len(old):], fault(data, at)
    return edit


def _cut(n):
    return lambda data: (data[:n(data)], n(data))


def _line(data: bytes, at: int) -> int:
    """The start of the meta line that holds byte `at`."""
    return data.rindex(b"\n", 0, at) + 1


@pytest.mark.parametrize("rel, edit, code", [
    (XLOG_MID, _cut(lambda d: 0), "bad_meta"),  # empty file: offset 0
    (XLOG_MID, _cut(lambda d: 50), "bad_meta"),  # ends inside the meta block: offset = where it ends
    (XLOG_MID, _cut(lambda d: d.index(b"\n\n") + 1), "bad_meta"),  # the empty line is missing
    (XLOG_MID, _edit(b"XLOG\n", b"XLOF\n", lambda d, at: 0), "bad_meta"),
    (XLOG_MID, _edit(b"\n0.13\n", b"\n0.99\n", lambda d, at: 5), "unsupported_version"),
    (SNAP, _edit(b"\n0.13\n", b"\n0.99\n", lambda d, at: 5), "unsupported_version"),
    (VYLOG, _edit(b"\n0.13\n", b"\n1.13\n", lambda d, at: 6), "unsupported_version"),
    (XLOG_MID, _edit(b"VClock: {0: 3, 1: 510}", b"VClock: {0: 3; 1: 510}", _line), "bad_meta"),
    (XLOG_MID, _edit(b"VClock: {0: 3, 1: 510}", b"VClock: [0: 3, 1: 510]", _line), "bad_meta"),
    (XLOG_MID, _edit(b"VClock: {0: 3, 1: 510}", b"VClock: {0: 3, 1: 5-0}", _line), "bad_meta"),
    (XLOG_MID, _edit(b"PrevVClock: {0: 3, 1: 431}", b"PrevVClock: {0: 3, 1: 4x1}", _line), "bad_meta"),
    (XLOG_MID, _edit(b"\nVClock:", b"\nVClocc:", lambda d, at: 0), "bad_meta"),  # no VClock at all
    (XLOG_MID, _edit(b"Instance:", b"Instance ", _line), "bad_meta"),  # not 'Key: value'
    (XLOG_MID, _edit(b"Version: 2", b"Version: \xe9", lambda d, at: at + 9), "bad_meta"),  # not ASCII
], ids=["empty", "cut-meta", "no-empty-line", "filetype", "version", "snap-version", "vylog-version",
        "vclock-syntax", "vclock-brackets", "vclock-digit", "prev-vclock-digit", "no-vclock", "no-colon",
        "not-ascii"])
def test_broken_meta_block(fixtures, tmp_path, rel, edit, code):
    data = (fixtures / rel).read_bytes()
    new, offset = edit(data)
    f = verdict(write(tmp_path / Path(rel).name, new))
    assert found(f) == [(code, offset)]
    assert f.status == "damaged"
    assert f.rows is None and f.blocks is None and f.vclock is None


def test_broken_meta_in_chain_marks_chain_damaged(fixtures, tmp_path):
    root = copy_tree(fixtures, "many-xlogs", tmp_path / "dd")
    p = root / "wal" / "00000000000000000513.xlog"
    p.write_bytes(p.read_bytes().replace(b"\n0.13\n", b"\n0.99\n", 1))
    report = verify_paths([root], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path) == p]
    assert found(f) == [("unsupported_version", 5)]
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert ("damaged_file", p.name) in chain_found(chain)
    assert not report.intact


# ---------------------------------------------------------------------------------------------
# Chains: missing, truncated and foreign files
# ---------------------------------------------------------------------------------------------

MANY = "many-xlogs"


def _many(fixtures, tmp_path) -> Path:
    return copy_tree(fixtures, MANY, tmp_path / "many")


def _xlog(n: int) -> str:
    return f"{n:020d}.xlog"


@pytest.mark.parametrize("missing, before, after, snap_gap", [
    ([513], 434, 592, False), ([513, 592], 434, 671, False), ([987], 908, 1081, False),
    ([197], 123, 276, True),  # 197.snap has lost the xlog it replays from, too
])
def test_missing_middle_xlog_is_xlog_gap(fixtures, tmp_path, missing, before, after, snap_gap):
    root = _many(fixtures, tmp_path)
    for n in missing:
        (root / "wal" / _xlog(n)).unlink()
    report = verify_paths([root], runner=LocalRunner(1))
    assert all(f.status in ("ok", "open") and not f.findings for f in report.files)
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert chain_found(chain) == [("xlog_gap", _xlog(after))] + [("snapshot_gap", _xlog(after))] * snap_gap
    msg = chain.findings[0].message
    assert _xlog(after) in msg and _xlog(before) in msg
    assert not report.intact


def test_undamaged_chain_is_ok(fixtures, tmp_path):
    report = verify_paths([_many(fixtures, tmp_path)], runner=LocalRunner(1))
    assert report.intact
    assert [c.status for c in report.chains] == ["ok"]


@pytest.mark.parametrize("drop", [1, 2, 40])
def test_truncated_middle_xlog_without_eof_is_missing_eof_and_rows_lost(fixtures, tmp_path, drop):
    root = _many(fixtures, tmp_path)
    name = _xlog(513)
    data, fr = baseline(fixtures, f"{MANY}/wal/{name}")
    cut = fr.blocks[-drop].pos
    write(root / "wal" / name, data[:cut])
    report = verify_paths([root], runner=LocalRunner(1))
    by_name = {Path(f.path).name: f for f in report.files}
    f = by_name[name]
    assert found(f) == [("missing_eof", cut)]
    assert f.status == "damaged"
    assert f.rows == count_rows(data, fr.blocks[:-drop])
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert chain_found(chain) == [("rows_lost", name), ("damaged_file", name)]
    assert _xlog(592) in chain.findings[0].message
    others = [g for n, g in by_name.items() if n != name]
    assert all(not g.findings for g in others)


@pytest.mark.parametrize("drop", [1, 3])
def test_truncated_middle_xlog_with_eof_is_rows_lost(fixtures, tmp_path, drop):
    """Cut at a block boundary and sealed again: the file looks whole, only the chain can tell."""
    root = _many(fixtures, tmp_path)
    name = _xlog(513)
    data, fr = baseline(fixtures, f"{MANY}/wal/{name}")
    write(root / "wal" / name, data[:fr.blocks[-drop].pos] + EOF_MAGIC)
    report = verify_paths([root], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path).name == name]
    assert f.status == "ok" and found(f) == []
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert chain_found(chain) == [("rows_lost", name)]


def test_middle_xlog_without_eof_that_the_next_continues_is_ok(fixtures, tmp_path):
    """A crash leaves an xlog without EOF marker and the next start a new xlog: harmless (tarantool-files.md)."""
    root = _many(fixtures, tmp_path)
    name = _xlog(513)
    data, fr = baseline(fixtures, f"{MANY}/wal/{name}")
    write(root / "wal" / name, data[:fr.eof.pos])
    report = verify_paths([root], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path).name == name]
    assert found(f) == [] and f.status == "ok" and f.eof is False
    assert report.intact


def test_snapshot_without_continuing_xlog_is_snapshot_gap(fixtures, tmp_path):
    root = _many(fixtures, tmp_path)
    for n in (0, 123, 197, 276):
        (root / "wal" / _xlog(n)).unlink()
    for n in (0, 123):
        (root / "memtx" / f"{n:020d}.snap").unlink()
    report = verify_paths([root], runner=LocalRunner(1))
    assert all(not f.findings for f in report.files)
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert chain_found(chain) == [("snapshot_gap", _xlog(355))]
    assert "00000000000000000197.snap" in chain.findings[0].message
    snaps = {Path(s["path"]).name: s for s in chain.snapshots}
    assert snaps["00000000000000000197.snap"]["replay_from"] is None
    assert Path(snaps["00000000000000001081.snap"]["replay_from"]).name == _xlog(1081)


def test_edited_instance_line_is_instance_mismatch(fixtures, tmp_path):
    root = copy_tree(fixtures, "features", tmp_path / "features")
    p = root / "wal" / "00000000000000000197.xlog"
    data = p.read_bytes()
    line = data.index(b"Instance: ")
    uuid_end = data.index(b"\n", line)
    assert data[uuid_end - 1:uuid_end] == b"1"
    p.write_bytes(data[:uuid_end - 1] + b"7" + data[uuid_end:])  # same length
    report = verify_paths([root], runner=LocalRunner(1))
    (f,) = [f for f in report.files if Path(f.path) == p]
    assert f.status == "ok" and f.instance.endswith("000000000007")
    (chain,) = report.chains
    assert chain.status == "damaged"
    assert chain_found(chain) == [("instance_mismatch", p.name)]  # the one file unlike the others
    assert "000000000001" in chain.findings[0].message and "000000000007" in chain.findings[0].message


def test_xlog_of_another_instance_is_instance_mismatch(fixtures, tmp_path):
    root = copy_tree(fixtures, "features", tmp_path / "features")
    copy_file(fixtures, "concurrent/00000000000000001103.xlog", root / "wal")
    report = verify_paths([root], runner=LocalRunner(1))
    (chain,) = report.chains
    assert chain.status == "damaged"
    codes = chain_found(chain)
    assert ("instance_mismatch", "00000000000000001103.xlog") in codes
    assert set(c for c, _ in codes) <= {"instance_mismatch", "xlog_gap"}
    msg = [x for x in chain.findings if x.code == "instance_mismatch"][0].message
    assert "aaaaaaaa-bbbb-4ccc-8ddd-000000000001" in msg and "aaaaaaaa-bbbb-4ccc-8ddd-000000000004" in msg


# ---------------------------------------------------------------------------------------------
# LSNs and transactions inside a file (files rewritten with walcore's TarantoolWriter)
# ---------------------------------------------------------------------------------------------

def _blocks_of(path: Path) -> list[tuple[int, list]]:
    """(block offset, [(header, body)]) per block."""
    data = path.read_bytes()
    return [(b.pos, [(dict(r.header), r.body) for r in split_rows(block_rows(data, b))]) for b in framing(data).blocks]


def _rewrite(fixtures: Path, rel: str, dst: Path, blocks: list[list], *, eof: bool = True,
             vclock_delta: int = 0) -> Framing:
    """Write `blocks` (lists of (header, body)) with rel's meta; each block compressed as rel's was."""
    src = fixtures / rel
    data, fr = baseline(fixtures, rel)
    meta = parse_meta(data[:4096])
    vclock = dict(meta.vclock)
    if vclock_delta:
        vclock[1] += vclock_delta
    w = TarantoolWriter(dst, meta.filetype, instance=meta.instance, vclock=vclock, prev_vclock=meta.prev_vclock)
    for i, rows in enumerate(blocks):
        w.write_block(rows, compressed=fr.blocks[min(i, len(fr.blocks) - 1)].kind == "zstd")
    w.close(eof=eof)
    assert src.read_bytes() == data  # never touched
    return framing(dst.read_bytes())


def _shift(blocks, start_block: int, delta: int, start_row: int = 0):
    out = []
    for i, (_, rows) in enumerate(blocks):
        new = []
        for j, (h, b) in enumerate(rows):
            h = dict(h)
            if h.get(2) == 1 and (i > start_block or (i == start_block and j >= start_row)):
                h[3] += delta
            new.append((h, b))
        out.append(new)
    return out


def test_rewritten_xlog_is_intact(fixtures, tmp_path):
    blocks = _blocks_of(fixtures / XLOG_MIXED)
    dst = tmp_path / Path(XLOG_MIXED).name
    _rewrite(fixtures, XLOG_MIXED, dst, [rows for _, rows in blocks])
    f = verdict(dst)
    assert f.status == "ok" and found(f) == []
    assert f.rows == sum(len(r) for _, r in blocks)


@pytest.mark.parametrize("delta, code", [(1, "lsn_gap"), (5, "lsn_gap"), (-1, "lsn_order"), (-3, "lsn_order")])
@pytest.mark.parametrize("block", [4, 12])  # a plain block, a zstd block
def test_block_lsn_skip_or_back(fixtures, tmp_path, delta, code, block):
    blocks = _blocks_of(fixtures / XLOG_MIXED)
    dst = tmp_path / Path(XLOG_MIXED).name
    fr = _rewrite(fixtures, XLOG_MIXED, dst, _shift(blocks, block, delta))
    f = verdict(dst)
    assert found(f) == [(code, fr.blocks[block].pos)]
    assert f.status == "damaged"
    assert f.rows == sum(len(r) for _, r in blocks)  # every row is still read


def test_lsn_skip_inside_a_block(fixtures, tmp_path):
    blocks = _blocks_of(fixtures / XLOG_CONC)
    dst = tmp_path / "x.xlog"
    fr = _rewrite(fixtures, XLOG_CONC, dst, _shift(blocks, 6, 1, start_row=10))
    data = dst.read_bytes()
    blk = fr.blocks[6]
    rows = split_rows(block_rows(data, blk))
    f = verdict(dst)
    # The row that skips is reported once; the walk goes on, so every row is counted and the next
    # block follows on from the shifted LSNs.
    assert found(f) == [("lsn_gap", blk.pos + HEADER + rows[10].offset)]
    assert f.rows == sum(len(r) for _, r in blocks)


def test_first_lsn_not_after_vclock(fixtures, tmp_path):
    blocks = _blocks_of(fixtures / XLOG_MIXED)
    for delta, code in ((-2, "lsn_gap"), (2, "lsn_order")):
        dst = tmp_path / f"{delta}" / "x.xlog"
        dst.parent.mkdir()
        fr = _rewrite(fixtures, XLOG_MIXED, dst, [r for _, r in blocks], vclock_delta=delta)
        f = verdict(dst)
        assert (code, fr.blocks[0].pos) in found(f)
        assert set(c for c, _ in found(f)) <= {code, "name_mismatch"}


@pytest.mark.parametrize("eof", [True, False])
def test_last_block_ends_inside_a_transaction(fixtures, tmp_path, eof):
    blocks = [r for _, r in _blocks_of(fixtures / XLOG_MIXED)]
    assert 9 in blocks[-1][-1][0] and len(blocks[-1]) > 2  # the last block is one multi-statement tx
    blocks[-1] = blocks[-1][:-1]  # drop its commit row
    dst = tmp_path / Path(XLOG_MIXED).name
    fr = _rewrite(fixtures, XLOG_MIXED, dst, blocks, eof=eof)
    f = verdict(dst)
    assert found(f) == [("unterminated_transaction", fr.blocks[-1].pos)]
    assert f.status == "damaged"


def test_transaction_spanning_two_blocks(fixtures, tmp_path):
    blocks = [r for _, r in _blocks_of(fixtures / XLOG_MIXED)]
    commit_row = blocks[1].pop()  # the commit of block 1's tx moves to the start of block 2
    blocks[2].insert(0, commit_row)
    dst = tmp_path / Path(XLOG_MIXED).name
    fr = _rewrite(fixtures, XLOG_MIXED, dst, blocks)
    f = verdict(dst)
    assert found(f) == [("unterminated_transaction", fr.blocks[1].pos)]
    assert f.rows == sum(len(b) for b in blocks)


# ---------------------------------------------------------------------------------------------
# Randomized damage
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def generated_xlog(tmp_path_factory) -> Path:
    files = generate_wal(tmp_path_factory.mktemp("gen"), target_bytes=3 << 20, seed=7)
    (xlog,) = [p for p in files if p.suffix == ".xlog"]
    return xlog


RANDOM_TARGETS = {
    "xlog-mixed": (XLOG_MIXED, 70),
    "xlog-conc": (XLOG_CONC, 50),
    "snap": (SNAP, 50),
    "vylog": (VYLOG, 40),
    "run": (RUN_ZSTD, 40),
    "generated": (None, 60),
}


def _mutate(rng: random.Random, data: bytes, fr: Framing) -> tuple[str, bytes, dict]:
    size = len(data)
    r = rng.random()
    if r < 0.12:  # flips inside the meta block
        at = sorted(rng.sample(range(fr.meta_size), rng.randint(1, 2)))
        new = bytearray(data)
        for p in at:
            new[p] ^= rng.randint(1, 255)
        return "meta-flip", bytes(new), {"at": at}
    if r < 0.5:
        at = sorted(rng.sample(range(fr.meta_size, size), rng.randint(1, 3)))
        new = bytearray(data)
        for p in at:
            new[p] ^= rng.randint(1, 255)
        return "flip", bytes(new), {"at": at}
    if r < 0.72:
        if rng.random() < 0.3:  # at a block boundary
            cut = rng.choice(sorted(fr.boundaries | ({fr.eof.pos} if fr.eof else set())))
        else:
            cut = rng.randrange(0, size)
        return "truncate", data[:cut], {"at": cut}
    if r < 0.86:
        at = rng.randint(fr.meta_size, size)
        extra = rng.randbytes(rng.randint(1, 40))
        return "insert", data[:at] + extra + data[at:], {"at": at, "n": len(extra)}
    at = rng.randrange(fr.meta_size, size)
    n = rng.randint(1, min(40, size - at))
    return "delete", data[:at] + data[at + n:], {"at": at, "n": n}


def _expect(kind: str, data: bytes, fr: Framing, what: str, new: bytes, info: dict, f, orig_rows: int) -> None:
    """The assertions of one randomized case.

    - flips in the meta block: damaged, or the parsed meta differs (or only strippable whitespace changed);
    - flips at or after the meta: damaged when any flipped byte is one Tarantool checks (magic, len,
      crc32c, payload, EOF marker); unchanged, with no finding, when every flipped byte is inside the
      padding string (Tarantool ignores what it holds; crc32p and the padding's type byte are left
      unasserted: Tarantool checks only that they stay valid msgpack of the right extent);
    - a cut at a block boundary: open with no finding (xlog, vylog) and fewer rows, unless only the EOF
      marker went; missing_eof in a sealed kind (snap, run); any other cut: damaged;
    - inserted or deleted bytes: damaged (deleting exactly whole blocks: damaged in an xlog).
    """
    sealed = kind in ("snap", "run", "index")
    if what == "meta-flip":
        if f.status == "damaged":
            return
        before, after = parse_meta(data[:4096]), parse_meta(new[:4096])
        if before != after:
            return
        # The same meta: only whitespace that the parser strips may have changed.
        for p in info["at"]:
            assert chr(data[p]).isspace() and chr(new[p]).isspace(), f"meta byte {p} changed but nothing noticed"
        return
    if what == "flip":
        if any(fr.significant(p) for p in info["at"]):
            assert f.status == "damaged"
        elif all(fr.padding_content(p) for p in info["at"]):
            # no false alarm: the file reads as before, row for row
            assert (f.status in ("ok", "open"), f.findings, f.rows) == (True, [], orig_rows)
        return
    if what == "truncate" or (what == "delete" and info["at"] + info["n"] == len(data)):
        cut = info["at"]
        if cut in fr.boundaries or (fr.eof and cut == fr.eof.pos):
            if sealed:
                assert f.status == "damaged" and [x.code for x in f.findings] == ["missing_eof"]
            else:
                assert f.status == "open" and not f.findings
                if fr.eof and cut == fr.eof.pos:
                    assert f.rows == orig_rows
                else:
                    assert f.rows < orig_rows
        else:
            assert f.status == "damaged"
        return
    if what == "delete" and info["at"] in fr.boundaries and info["at"] + info["n"] in fr.boundaries:
        # Whole blocks removed: only an xlog can tell (its LSNs skip).
        if kind == "xlog":
            assert f.status == "damaged"
        return
    assert f.status == "damaged"


@pytest.mark.parametrize("rel", [XLOG_MIXED, SNAP, RUN_ZSTD])
def test_what_tarantool_ignores_in_a_block_header_is_no_finding(fixtures, tmp_path, rel):
    """xlog_fixheader_decode reads crc32p as any unsigned int and the padding as any string of the right
    length: other values there are no damage (no false alarm, the same rows)."""
    data, fr = baseline(fixtures, rel)
    orig = verdict(write(tmp_path / "orig" / Path(rel).name, data))
    new = bytearray(data)
    for b in fr.blocks:
        assert new[b.crc_field[0] - 1] == 0  # crc32p, one byte: Tarantool writes 0
        new[b.crc_field[0] - 1] = 0x7F
        for pos in range(b.crc_field[1] + 1, b.pos + HEADER):
            assert fr.padding_content(pos)
            new[pos] ^= 0xFF
    changed = verdict(write(tmp_path / "new" / Path(rel).name, bytes(new)))
    assert new != data and len(fr.blocks) > 0
    assert (changed.status, found(changed), changed.rows) == (orig.status, [], orig.rows)


def test_findings_are_capped(fixtures, tmp_path):
    # A shredded file must not flood a report: 100 findings, then one that says the rest are not listed.
    data, fr = baseline(fixtures, XLOG_PLAIN)
    damaged = fr.blocks[::2]  # each between two sound blocks: a crc_mismatch and the lsn_gap it leaves
    assert len(damaged) > 51
    new = bytearray(data)
    for b in damaged:
        new[b.payload[0]] ^= 0x01
    f = verdict(write(tmp_path / Path(XLOG_PLAIN).name, bytes(new)))
    got = found(f)
    assert len(got) == 101 and got[-1][0] == "too_many_findings"
    crc = [(c, o) for c, o in got[:100] if c == "crc_mismatch"]
    assert len(crc) >= 50 and crc == [("crc_mismatch", b.pos) for b in damaged[:len(crc)]]
    assert {c for c, _ in got[:100]} == {"crc_mismatch", "lsn_gap"}


def test_file_named_as_another_kind(fixtures, tmp_path):
    data = (fixtures / XLOG_CONC).read_bytes()
    f = verdict(write(tmp_path / Path(XLOG_CONC).with_suffix(".snap").name, data))
    assert (f.status, found(f)) == ("damaged", [("kind_mismatch", 0)])


@pytest.mark.parametrize("target", list(RANDOM_TARGETS))
def test_random_damage(fixtures, tmp_path, generated_xlog, target):
    rel, iterations = RANDOM_TARGETS[target]
    src = generated_xlog if rel is None else fixtures / rel
    data = src.read_bytes()
    fr = framing(data)
    kind = src.suffix[1:]
    seed = SEED * 1000 + list(RANDOM_TARGETS).index(target)
    rng = random.Random(seed)
    orig = verdict(write(tmp_path / "orig" / src.name, data))
    assert orig.status in ("ok", "open") and not orig.findings
    print(f"random damage of {src}: seed {seed} (WALVAULT_DAMAGE_SEED={SEED})")
    path = tmp_path / "d" / src.name
    for i in range(iterations):
        what, new, info = _mutate(rng, data, fr)
        case = f"seed {seed} iteration {i}: {what} {info} of {src.name}"
        write(path, new)
        try:
            scan = scan_file(path)
            f = verdict(path)
            if rel is not None:
                try:
                    for _ in read_rows(path):
                        pass
                except ValueError:
                    pass
        except Exception as e:  # pragma: no cover - reported with the case
            raise AssertionError(f"{case}: {type(e).__name__}: {e}") from e
        assert scan.size == len(new), case
        try:
            _expect(kind, data, fr, what, new, info, f, orig.rows)
        except Exception as e:
            raise AssertionError(f"{case}: status {f.status}, rows {f.rows} (of {orig.rows}), "
                                 f"findings {found(f)}: {e}") from None


# ---------------------------------------------------------------------------------------------
# Parallel == sequential on damaged big files
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_wal(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big")
    generate_wal(d, target_bytes=8 << 20, seed=11)
    return d


def _range_cuts(size: int) -> list[int]:
    """Where verify_paths(runner=LocalRunner(2)) cuts a file of `size` into ranges: damage is aimed around them."""
    cuts = [start for start, _ in wverify._units(size, 2) if start is not None]
    assert cuts, f"a file of {size} bytes is not cut into ranges: the damage would miss what it tests"
    return cuts


def _damage_big(rng: random.Random, data: bytes, fr: Framing) -> tuple[bytes, list]:
    new = bytearray(data)
    log = []
    cuts = _range_cuts(len(data))
    for _ in range(rng.randint(1, 4)):
        cut = rng.choice(cuts)
        how = rng.random()
        if how < 0.3:  # near a range boundary
            at = max(fr.meta_size, min(len(new) - 1, cut + rng.randint(-400, 400)))
        elif how < 0.6:  # in one of the blocks around a boundary
            near = [b for b in fr.blocks if abs(b.pos - cut) < 20000]
            blk = rng.choice(near)
            at = rng.choice([blk.pos, blk.pos + 1, blk.len_field[0], blk.crc_field[0], blk.pos + HEADER,
                             blk.end - 1, blk.pos + HEADER + blk.length // 2])
        else:
            at = rng.randrange(fr.meta_size, len(new))
        kind = rng.choice(["flip", "flip", "flip", "zero", "insert", "delete"])
        if kind == "flip":
            new[at] ^= rng.randint(1, 255)
        elif kind == "zero":
            new[at:at + 19] = bytes(len(new[at:at + 19]))
        elif kind == "insert":
            new[at:at] = rng.randbytes(rng.randint(1, 30))
        else:
            del new[at:at + rng.randint(1, 30)]
        log.append((kind, at))
    if rng.random() < 0.25:
        cut = rng.randrange(len(new) // 2, len(new))
        del new[cut:]
        log.append(("truncate", cut))
    return bytes(new), log


PARALLEL_CASES = range(20)


def _big_copy(big_wal: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "wal"
    root.mkdir()
    for p in big_wal.iterdir():
        shutil.copyfile(p, root / p.name)
    (xlog,) = root.glob("*.xlog")
    return root, xlog


def _xlog_findings(report_json: dict) -> list[tuple[str, int]]:
    (f,) = [x for x in report_json["files"] if x["kind"] == "xlog"]
    return [(x["code"], x["offset"]) for x in f["findings"]]


@pytest.mark.parametrize("case", PARALLEL_CASES)
def test_parallel_equals_sequential_on_damaged_big_file(big_wal, tmp_path, monkeypatch, case):
    monkeypatch.setattr(wverify, "SPLIT_SIZE", 1 << 20)
    root, xlog = _big_copy(big_wal, tmp_path)
    data = xlog.read_bytes()
    fr = framing(data)
    seed = SEED * 100 + case
    new, log = _damage_big(random.Random(seed), data, fr)
    xlog.write_bytes(new)
    assert len(_range_cuts(len(new))) > 4
    sequential = verify_paths([root], runner=LocalRunner(1)).to_json()
    parallel = verify_paths([root], runner=LocalRunner(2)).to_json()
    assert parallel == sequential, (f"seed {seed} damage {log}: sequential {_xlog_findings(sequential)}, "
                                    f"parallel {_xlog_findings(parallel)}")


def test_parallel_damaged_last_block_of_a_range_is_reported_once(big_wal, tmp_path, monkeypatch):
    """A CRC mismatch in the last block that starts in a range must be reported once, as sequentially."""
    monkeypatch.setattr(wverify, "SPLIT_SIZE", 1 << 20)
    root, xlog = _big_copy(big_wal, tmp_path)
    data = bytearray(xlog.read_bytes())
    fr = framing(bytes(data))
    cut = _range_cuts(len(data))[2]
    blk = [b for b in fr.blocks if b.pos < cut][-1]  # starts in range 2, ends in range 3
    assert blk.end > cut
    data[blk.pos + HEADER + 1] ^= 0x10
    xlog.write_bytes(bytes(data))
    sequential = _xlog_findings(verify_paths([root], runner=LocalRunner(1)).to_json())
    nxt = fr.blocks[fr.blocks.index(blk) + 1]
    assert sequential == [("crc_mismatch", blk.pos), ("lsn_gap", nxt.pos)]
    assert _xlog_findings(verify_paths([root], runner=LocalRunner(2)).to_json()) == sequential


def test_parallel_keeps_finding_order_after_damaged_first_block_of_a_range(big_wal, tmp_path, monkeypatch):
    """Damage in the first block of a range and later in the same range: findings in file order."""
    monkeypatch.setattr(wverify, "SPLIT_SIZE", 1 << 20)
    root, xlog = _big_copy(big_wal, tmp_path)
    data = bytearray(xlog.read_bytes())
    fr = framing(bytes(data))
    cuts = _range_cuts(len(data))
    first = [b for b in fr.blocks if b.pos >= cuts[4]][0]
    later = [b for b in fr.blocks if b.pos >= (cuts[4] + cuts[5]) // 2][0]
    for b in (first, later):
        data[b.pos + HEADER + 2] ^= 0x01
    xlog.write_bytes(bytes(data))
    after = lambda b: fr.blocks[fr.blocks.index(b) + 1].pos  # noqa: E731
    sequential = _xlog_findings(verify_paths([root], runner=LocalRunner(1)).to_json())
    assert sequential == [("crc_mismatch", first.pos), ("lsn_gap", after(first)),
                          ("crc_mismatch", later.pos), ("lsn_gap", after(later))]
    assert _xlog_findings(verify_paths([root], runner=LocalRunner(2)).to_json()) == sequential


def test_open_newest_xlog_is_never_covered(fixtures, tmp_path):
    """An xlog without EOF marker may still grow (a live instance appends to it): a snapshot covering
    every row it holds now does not cover it, so no retention may take it."""
    root = copy_tree(fixtures, "features", tmp_path / "features")
    for later in ("00000000000000000361.xlog", "00000000000000000437.xlog"):
        (root / "wal" / later).unlink()
    newest = root / "wal" / "00000000000000000197.xlog"
    data = newest.read_bytes()
    assert data.endswith(EOF_MAGIC)
    write(newest, data[:-4])
    report = verify_paths([root], runner=LocalRunner(1))
    assert {Path(f.path).name: f.status for f in report.files}[newest.name] == "open"
    (chain,) = report.chains
    assert chain.findings == []
    last = next(s for s in chain.snapshots if s["path"].endswith("00000000000000000361.snap"))
    assert [Path(p).name for p in last["covers"]] == ["00000000000000000000.xlog", "00000000000000000123.xlog"]

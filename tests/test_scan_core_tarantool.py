"""The compiled scan core (walcore._scan) against the pure-Python reference, on many damaged real Tarantool
files: the same span (rows, LSN ranges, positions, blocks) and the same findings (code, offset, message),
for whole files and for byte ranges of them."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from conftest import TARANTOOL_FIXTURES, require_shared, run_cli, run_main
from tarantool_bytes import HEADER, block_rows, framing, replace_payload
from walcore import scancore
from walcore.tarantool.block import tarantool_crc32c
from walcore.tarantool.writer import generate_wal
from walcore.tarantool.xlog import scan_file

pytestmark = require_shared
SUFFIXES = (".xlog", ".snap", ".vylog", ".run", ".index")
VARIANTS = 3000


def scanned(path: Path, compiled: bool, **ranges) -> tuple:
    """What a scan says, all of it: the span's every field and the findings."""
    if compiled:
        os.environ.pop("WALVAULT_PURE", None)
    else:
        os.environ["WALVAULT_PURE"] = "1"
    try:
        scan = scan_file(path, **ranges)
    finally:
        os.environ.pop("WALVAULT_PURE", None)
    return scan.kind, scan.span, [(f.code, f.offset, f.message) for f in scan.findings]


def assert_same(path: Path, **ranges) -> tuple:
    compiled, pure = scanned(path, True, **ranges), scanned(path, False, **ranges)
    assert compiled == pure, (path, ranges)
    return pure


@pytest.fixture(scope="module")
def originals(tmp_path_factory) -> list[bytes]:
    assert scancore.compiled() is not None, "walcore._scan is not built"
    files = sorted(p for p in TARANTOOL_FIXTURES.rglob("*") if p.suffix in SUFFIXES)
    generated = generate_wal(tmp_path_factory.mktemp("mixed"), target_bytes=1 << 20, file_bytes=256 << 10)
    return [p.read_bytes() for p in files + generated[:3]]


def _row_damage(rng: random.Random, rows: bytes) -> bytes:
    """Rows changed in ways a CRC computed after the change lets through to the row walk."""
    how = rng.randrange(6)
    if how == 0 and rows:  # a byte anywhere
        i = rng.randrange(len(rows))
        return rows[:i] + bytes([rng.randrange(256)]) + rows[i + 1:]
    if how == 1 and rows:  # cut short
        return rows[:rng.randrange(len(rows))]
    if how == 2:  # bytes inserted
        i = rng.randrange(len(rows) + 1)
        return rows[:i] + rng.randbytes(rng.randint(1, 8)) + rows[i:]
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False)
    unpacker.feed(rows)
    try:
        parts = list(unpacker)
    except Exception:
        return rows
    headers = [i for i, p in enumerate(parts) if isinstance(p, dict) and 0 in p]
    if not headers:
        return rows
    h = dict(parts[rng.choice(headers)])
    key = rng.choice([0, 2, 3, 7, 8, 9])
    h[key] = rng.choice([True, False, -1, 0, 1, 12, 2**63, 2**64 - 1, 1.0, b"x", None, h.get(3, 1) + rng.choice((-1, 1, 2))])
    if how == 3:
        parts[headers[0]] = h
    elif how == 4:  # a key dropped
        h.pop(rng.choice(list(h)))
        parts[rng.choice(headers)] = h
    else:  # a row duplicated (an LSN out of order)
        i = rng.choice(headers)
        parts[i + 1:i + 1] = parts[i:i + 2]
    return b"".join(msgpack.packb(p, use_bin_type=False) for p in parts)


def damaged(rng: random.Random, data: bytes) -> bytes:
    fr = framing(data)
    blocks = fr.blocks
    how = rng.randrange(8)
    if how == 0:  # bytes flipped anywhere past the meta
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(fr.meta_size, len(out))
            out[i] ^= 1 << rng.randrange(8)
        return bytes(out)
    if how == 1:
        return data[:rng.randrange(fr.meta_size, len(data) + 1)]
    if how == 2:  # a range zeroed
        i = rng.randrange(fr.meta_size, len(data))
        return data[:i] + bytes(rng.randint(1, 600)) + data[i + rng.randint(1, 600):]
    if how == 3:  # bytes inserted
        i = rng.randrange(fr.meta_size, len(data))
        return data[:i] + rng.randbytes(rng.randint(1, 40)) + data[i:]
    if not blocks:
        return data + rng.randbytes(30)
    blk = rng.choice(blocks)
    if how == 4:  # a block repeated, or two swapped
        other = rng.choice(blocks)
        a, b = sorted((blk, other), key=lambda x: x.pos)
        if rng.random() < 0.5 or a == b:
            return data[:a.end] + data[a.pos:a.end] + data[a.end:]
        return data[:a.pos] + data[b.pos:b.end] + data[a.end:b.pos] + data[a.pos:a.end] + data[b.end:]
    if how == 5:  # the header rewritten with wider msgpack ints: still sound
        payload = data[blk.pos + HEADER:blk.end]
        crc = tarantool_crc32c(payload)
        magic = data[blk.pos:blk.pos + 4]
        fields = rng.choice([b"\xcd" + len(payload).to_bytes(2, "big") + b"\xcc\x00\xce" + crc.to_bytes(4, "big"),
                             b"\xce" + len(payload).to_bytes(4, "big") + b"\x00\xce" + crc.to_bytes(4, "big"),
                             b"\xcf" + len(payload).to_bytes(8, "big") + b"\x00" + b"\xce" + crc.to_bytes(4, "big")])
        if len(payload) >= 1 << 16:
            return data
        pad = HEADER - 4 - len(fields)
        header = magic + fields + (bytes([0xA0 + pad - 1]) + bytes(pad - 1) if pad else b"")
        return data[:blk.pos] + header + payload + data[blk.end:]
    rows = block_rows(data, blk)
    return replace_payload(data, blk, _row_damage(rng, rows), compressed=blk.kind == "zstd" if how == 6 else None)


def test_cores_agree_on_damaged_real_files(originals, tmp_path):
    rng = random.Random(15)
    path = tmp_path / "variant"  # its kind comes from its meta block
    kinds = set()
    findings = 0
    for n in range(VARIANTS):
        original = rng.choice(originals)
        data = damaged(rng, original)
        path.write_bytes(data)
        kind, span, found = assert_same(path)
        kinds.add(kind)
        findings += bool(found)
        start = rng.randrange(len(data))
        stop = rng.choice([None, rng.randrange(start, len(data) + 1)])
        assert_same(path, start=start, stop=stop, search=rng.random() < 0.8)
    # The damage is real: most variants have findings, some none (a damaged byte no one reads), and every kind of
    # file was among them.
    assert VARIANTS * 0.5 < findings < VARIANTS
    assert {"xlog", "snap", "vylog", "run", "index"} <= kinds


def test_cores_agree_on_every_real_file_and_its_ranges(originals, tmp_path):
    path = tmp_path / "f.xlog"
    rows = 0
    for data in originals:
        path.write_bytes(data)
        kind, span, found = assert_same(path)
        assert not found
        rows += span.rows
        ends = sorted({b.end for b in framing(data).blocks})
        for cut in ends[::max(1, len(ends) // 5)]:  # ranges that meet at a block boundary merge as one scan
            assert_same(path, stop=cut)
            assert_same(path, start=cut)
    assert rows > 10_000


@pytest.mark.parametrize("soft", [False, True], ids=["sse4.2", "tables"])
def test_compiled_crc32c_is_tarantools(soft):
    """Against the crc32c package, on lengths around every loop's edges (the three-lane loop works on 12 KiB)."""
    code = """
import os, random, crc32c
from walcore import _scan
rng = random.Random(1)
for n in [0, 1, 7, 8, 9, 63, 4095, 4096, 12287, 12288, 12289, 24576, 40000, 1 << 20] + [rng.randrange(70000) for _ in range(200)]:
    data = rng.randbytes(n)
    for skip in (0, 3):
        part = memoryview(data)[skip:]
        assert _scan.tarantool_crc32c(part) == crc32c.crc32c(part, 0xFFFFFFFF) ^ 0xFFFFFFFF, (n, skip)
        start = rng.getrandbits(32)
        assert _scan.tarantool_crc32c(part, start) == crc32c.crc32c(part, start ^ 0xFFFFFFFF) ^ 0xFFFFFFFF, (n, skip)
print("ok")
"""
    env = dict(os.environ, WALVAULT_SOFT_CRC="1" if soft else "0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_version_and_inspect_name_the_core(monkeypatch):
    xlog = sorted(TARANTOOL_FIXTURES.rglob("*.xlog"))[0]
    version = run_main("--version")
    assert version.returncode == 0 and "scan core: compiled (walcore._scan)" in version.stdout
    inspect = run_main("inspect", xlog)
    assert inspect.returncode == 0 and "scan core: compiled (walcore._scan)" in inspect.stdout
    monkeypatch.setenv("WALVAULT_PURE", "1")  # processes: what is tested is the variable reaching the command
    assert "scan core: pure Python (WALVAULT_PURE=1)" in run_cli("--version").stdout
    assert '"scan_core": "pure Python (WALVAULT_PURE=1)"' in run_cli("inspect", "--json", xlog).stdout

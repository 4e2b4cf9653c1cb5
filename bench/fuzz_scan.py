#!/usr/bin/env python3
"""Fuzz the compiled scan core (walcore._scan) against the pure-Python reference walks, under AddressSanitizer
and UndefinedBehaviorSanitizer, for a bounded time. A bench script: not run in CI.

    .venv/bin/python bench/fuzz_scan.py [--seconds 300] [--seed N] [--corpus DIR]
    .venv/bin/python bench/fuzz_scan.py --replay FILE...        # the normal build, no sanitizer
    .venv/bin/python bench/fuzz_scan.py --write-hostile tests/data/fuzz

atheris is a bench-only dependency (not in requirements): when it is missing this script installs it with pip
into the interpreter running it (`pip install atheris`: a manylinux wheel for cp311 with libFuzzer inside).

How a run goes:
1. walcore/ and setup.py are copied to a temp dir and the extension is built there with gcc
   -fsanitize=address,undefined (the project's own build is left alone; setup.py's -O2 comes last and wins
   over -O1).
2. The script re-executes itself with libasan preloaded (Python itself is not instrumented, so the ASan runtime
   must come first; libstdc++ after it, for ASan to find the __cxa_throw atheris uses), PYTHONMALLOC=malloc (so
   Python's objects get redzones), PYTHONPATH at the copy, and checks that walcore._scan is loaded from there.
   libubsan comes in as the extension's dependency. A small shim is preloaded before libasan: gcc's libasan
   defines no-op __sanitizer_cov_* and __sanitizer_weak_hook_memcmp, which would win over atheris's libFuzzer
   and leave the fuzzer blind to Python coverage; the shim forwards them to libFuzzer (hence
   verify_asan_link_order=0).
3. The child fuzzes `check_input` until the time is up. Coverage comes from the instrumented walcore Python
   modules (the reference walks, which follow the same rules as the C; gcc cannot instrument the C for
   libFuzzer). A crash or a difference is saved to bench/out/fuzz/crashes and the fuzzer restarts on the rest
   of the budget. Keep a finding in tests/data/fuzz in the whole form (`--replay FILE --whole` writes
   FILE.whole: it needs no fixture): tests/test_scan_fuzz_regressions.py replays every file there through
   `check_input`.

An input: byte 0 picks the mode, byte 1 the Tarantool file kind, byte 2 which extra byte ranges to scan and
bytes 3-6 where they start and stop (fractions of the file's size); the rest is the mode's:
  whole    the rest is a whole file, meta block included (regression inputs are kept in this form)
  raw      a meta block, then the rest as is
  rows     the rest cut into payloads, each wrapped in a block with a correct header and CRC (some zstd)
  struct   rows built from the bytes: headers with every key encoding, LSN runs, odd values, msgpack bodies
  mutate   a real fixture file, its bytes or its rows mutated, CRCs recomputed or not
  crc      _scan.tarantool_crc32c against the crc32c package, any start value, length and alignment
  limestone  a pwal file, scan_pwal on both cores: the whole PwalScan (findings, missing blobs, marks, tail and
           cut, codes, counts, epochs, snippets) must be identical. Byte 1 % 4 says where the file comes from:
           0 whole: the limestone whole form (PwalCase: durable epoch, buffer size, blob files, the file; the
             regression form, no fixture needed), 1 mutate: a real pwal fixture with its entries and bytes
             mutated, 2-3 struct: entries built from the bytes (PwalGen). Bytes 2-6 (mutate, struct): the
             durable epoch (around the directory's, or odd ones: 0, 2^64 - 1, -1, 2^64), the compiled walk's
             buffer size (walcore.limestone.scan._COMPILED_CHUNK is set for the check: its own 256 KiB, 1..64
             bytes, or 25..4096, so that entries span buffers), and the blob files (as in the fixture's
             directory, none, or flat). The file is checked in a directory of its own with only those blob
             files. Non-whole limestone inputs are taken as `mutate` while walcore.limestone.scan does not call
             _scan.limestone_scan (limestone_fuzzed()).
Every Tarantool file is scanned whole and in the chosen ranges with both cores: kind, span and findings must be
identical, and neither may raise. Its blocks are also given to BlockScanner.take in a buffer of their exact
size, for ASan to see any read past it. At the end the parent prints how many checks each mode ran (the child
saves its counts every 2 s, so each round's last seconds are not in them).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT.parent / "shared" / "fixtures"
OUT = ROOT / "bench" / "out" / "fuzz"
MAX_LEN = 1 << 14  # larger inputs only slow it down: the mutate mode reaches the big fixtures
SANITIZE = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
# Python's own CFLAGS carry -fwrapv, which would keep UBSan from checking signed overflow.
CFLAGS = SANITIZE + " -fno-wrapv"
MODES = ("whole", "raw", "rows", "struct", "mutate", "crc", "limestone")
KINDS = ("XLOG", "SNAP", "VYLOG", "RUN", "INDEX")
U64 = (1 << 64) - 1

# The walcore modules, imported on first use: the fuzzing child imports them under atheris's instrumentation.
W = None


def _load():
    global W
    if W is None:
        import types

        import crc32c

        sys.path.insert(0, str(ROOT / "tests"))  # tarantool_bytes: the tests' independent reader of the framing
        import tarantool_bytes

        from walcore import scancore
        from walcore.limestone import epoch, layout, pwal
        from walcore.limestone import scan as limestone_scan
        from walcore.tarantool import block, meta, row, xlog
        W = types.SimpleNamespace(crc32c=crc32c, tarantool_bytes=tarantool_bytes, scancore=scancore,
                                  limestone=limestone_scan, block=block,
                                  meta=meta, row=row, xlog=xlog, pwal=pwal, epoch=epoch, layout=layout,
                                  limestone_chunk=limestone_scan._COMPILED_CHUNK, limestone_on=None, fixtures={})
    return W


class Reader:
    """The fuzz input, consumed from the front; zeros once it runs out (so every input means something)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out

    def byte(self) -> int:
        b = self.take(1)
        return b[0] if b else 0

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n).ljust(n, b"\0"), "big")

    def rest(self) -> bytes:
        return self.take(len(self.data))

    def pick(self, seq):
        return seq[self.byte() % len(seq)]


# ------------------------------------------------------------------ msgpack pieces, valid or not

def mp_uint(v: int, width: int = 0) -> bytes:
    v &= U64
    if not width:
        if v < 0x80:
            return bytes([v])
        width = next(w for w in (1, 2, 4, 8) if v < 1 << 8 * w)
    return bytes([{1: 0xCC, 2: 0xCD, 4: 0xCE, 8: 0xCF}[width]]) + (v % (1 << 8 * width)).to_bytes(width, "big")


def mp_sint(v: int, width: int) -> bytes:
    return bytes([{1: 0xD0, 2: 0xD1, 4: 0xD2, 8: 0xD3}[width]]) + (v % (1 << 8 * width)).to_bytes(width, "big")


def mp_int(r: Reader, v: int) -> bytes:
    """v, mostly as Tarantool writes it; sometimes wider, signed, or as a bool, float, nil or string."""
    c = r.byte()
    if c < 192:
        return mp_uint(v) if v >= 0 else bytes([v & 0xFF]) if v >= -32 else mp_sint(v, 8)
    width = (1, 2, 4, 8)[c % 4]
    if c < 208:
        return mp_uint(v, width)
    if c < 224:
        return mp_sint(v, width)
    if c < 232:
        return b"\xc3" if v else b"\xc2"
    if c < 240:
        return b"\xcb" + struct.pack(">d", float(v))
    if c < 248:
        return b"\xc0"
    return b"\xa1" + bytes([v & 0x7F])


def mp_len(r: Reader, n: int, fix: int, w16: int, fixmax: int = 15) -> bytes:
    """A container/str/bin header for n items: fix form, 16 or 32 bits; sometimes a count that lies."""
    c = r.byte()
    if c >= 240:
        n = (n + (c & 3) - 1) if c < 252 else U64 >> 32
    if c % 4 == 0 and 0 <= n <= fixmax and fix is not None:
        return bytes([fix | n])
    if c % 4 == 3 or n > 0xFFFF:
        return bytes([w16 + 1]) + (n & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes([w16]) + max(n, 0).to_bytes(2, "big")


def mp_obj(r: Reader, depth: int = 0, budget: list | None = None) -> bytes:
    """One msgpack object (or something close to one): every type, ext -1 (timestamps), deep nesting, 0xc1."""
    budget = budget if budget is not None else [300]
    budget[0] -= 1
    c = r.byte() % 26
    if budget[0] <= 0 or (depth > 5 and c >= 11):
        c = c % 11
    if c == 0:
        return b"\xc0"
    if c == 1:
        return r.pick((b"\xc2", b"\xc3"))
    if c == 2:
        return bytes([r.byte() & 0x7F])
    if c == 3:
        return bytes([0xE0 | r.byte() & 0x1F])
    if c == 4:
        return bytes([0xCC + r.byte() % 4]) + r.take((1, 2, 4, 8)[r.byte() % 4])
    if c == 5:
        return bytes([0xD0 + r.byte() % 4]) + r.take((1, 2, 4, 8)[r.byte() % 4])
    if c == 6:
        return b"\xca" + r.take(4).ljust(4, b"\0")
    if c == 7:
        return b"\xcb" + r.take(8).ljust(8, b"\0")
    if c in (8, 9):  # str: fix, 16 or 32 bits (mp_len), or 8 bits
        data = r.take(r.byte() % 40)
        return (mp_len(r, len(data), 0xA0, 0xDA, 31) if c == 8 else b"\xd9" + bytes([len(data)])) + data
    if c == 10:  # bin 8, 16, 32
        data, width = r.take(r.byte() % 40), r.pick((1, 2, 4))
        return bytes([0xC3 + width - (width == 4)]) + len(data).to_bytes(width, "big") + data
    if c in (11, 12):  # array, map
        n = r.byte() % 6
        if c == 11:
            return mp_len(r, n, 0x90, 0xDC) + b"".join(mp_obj(r, depth + 1, budget) for _ in range(n))
        return mp_len(r, n, 0x80, 0xDE) + b"".join(
            mp_obj(r, 9, budget) + mp_obj(r, depth + 1, budget) for _ in range(n))  # scalar keys
    if c == 13:  # a container as a map key: a tuple is hashable, a dict is not
        return b"\x81" + r.pick((b"\x91\x01", b"\x80", b"\x91\x80", b"\x92\x01\x02")) + b"\xc0"
    if c in (14, 15):  # fixext 1..16 / ext 8,16,32 of any type (0xff: msgpack's Timestamp)
        etype = bytes([r.pick((0xFF, 0x01, 0x80, 0x7F, 0xFE))])
        if c == 14:
            k = r.byte() % 5
            return bytes([0xD4 + k]) + etype + r.take(1 << k).ljust(1 << k, b"\0")
        data = r.take(r.byte() % 20)
        return r.pick((b"\xc7" + bytes([len(data)]), b"\xc8" + len(data).to_bytes(2, "big"),
                       b"\xc9" + len(data).to_bytes(4, "big"))) + etype + data
    if c == 16:  # a valid timestamp 96
        return b"\xc7\x0c\xff" + r.take(4).ljust(4, b"\0") + r.take(8).ljust(8, b"\0")
    if c == 17:  # deep nesting: msgpack stops at 1024, the C walk at 64
        n = r.uint(2) % 2100
        return r.pick((b"\x91", b"\x81\x00", b"\xdc\x00\x01")) * n + b"\xc0"
    if c == 18:
        return b"\xc1"
    if c == 19:  # a length claiming more than there is
        return r.pick((b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\x7f\xff\xff\xff",
                       b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01"))
    if c == 20:
        return r.take(r.byte() % 16)
    # the rest: a body as Tarantool writes it, {space_id: ..., tuple: [...]}
    n = r.byte() % 4
    return b"\x82\x10" + mp_uint(512 + r.byte() % 3) + b"\x21" + bytes([0x90 | n]) + b"".join(
        mp_obj(r, depth + 2, budget) for _ in range(n))


# ------------------------------------------------------------------ Tarantool files

TYPES = (2, 3, 2, 3, 4, 5, 9, 12, 12, 40, 100, 101, 0, -1, 255, 1 << 32)
DELTAS = (1, 1, 1, 1, 1, 1, 1, 0, 2, -1, 1000, 1 << 63, -(1 << 40))
COMPS = (0, 1, 2, 31, 32, 33, 100, 1 << 32)
TYPE, REPLICA_ID, LSN, TIMESTAMP, GROUP_ID, TSN, FLAGS = 0x00, 0x02, 0x03, 0x04, 0x07, 0x08, 0x09


def gen_row(r: Reader, st: dict) -> bytes:
    """One row: a header map (keys in any order and encoding, some missing or doubled) and a body."""
    f, g = r.byte(), r.byte()
    st["lsn"] = (st["lsn"] + r.pick(DELTAS)) & U64
    if f & 0x30 == 0x30:
        st["comp"] = r.pick(COMPS)
    rtype = r.pick(TYPES)
    entries = [(TYPE, mp_int(r, rtype))]
    if not f & 1:
        entries.append((REPLICA_ID, mp_int(r, st["comp"])))
    if not f & 2:
        entries.append((LSN, mp_int(r, st["lsn"])))
    if not f & 4:
        entries.append((TIMESTAMP, b"\xcb" + struct.pack(">d", 1.7e9)))
    if f & 8:
        entries.append((TSN, mp_int(r, r.byte() % 4)))
    if f & 64:
        entries.append((FLAGS, mp_int(r, r.byte() % 4)))
    if f & 128:
        entries.append((GROUP_ID, mp_int(r, r.byte() % 3)))
    if g & 1:
        entries.append((r.pick((1, 5, 6, 10, 0x7F, 200, -1, 1 << 40)), mp_obj(r)))
    if g & 2:
        k = r.byte() % len(entries)
        entries = entries[k:] + entries[:k]
    if g & 4:
        key, _ = r.pick(entries)
        entries.insert(r.byte() % (len(entries) + 1), (key, mp_int(r, r.pick(TYPES))))
    head = mp_len(r, len(entries), 0x80, 0xDE) + b"".join(mp_int(r, k) + v for k, v in entries)
    if g & 8 and rtype == 12 or g & 16 and g & 32:
        return head  # no body: NOP, or a header alone at the end of a block
    return head + mp_obj(r)


def fixheader(r: Reader, compressed: bool, payload: bytes) -> bytes:
    """The block header: mostly as Tarantool writes it; else of other int widths and padding, or a bad CRC."""
    B = _load().block
    c = r.byte()
    if c < 160:
        return B.encode_fixheader(compressed, payload)
    crc = B.tarantool_crc32c(payload) ^ (c < 176 and c & 8 != 0)  # one in ten of these: a wrong CRC
    out = (B.ZROW_MAGIC if compressed else B.ROW_MAGIC) + mp_uint(len(payload), (0, 1, 2, 4, 8)[c % 5]) \
        + mp_uint((0, 0, 1, U64)[c >> 2 & 3], (0, 8)[c >> 4 & 1]) + mp_uint(crc, (0, 4, 8)[c % 3])
    pad = 19 - len(out)
    if pad >= 2 and c & 64:
        out += b"\xd9" + bytes([pad - 2]) + bytes(pad - 2)
    elif pad >= 1:
        out += bytes([0xA0 + pad - 1]) + bytes(pad - 1)
    return out[:19]


def wrap(r: Reader, rows: bytes, compressed: bool) -> bytes:
    """A block of these rows; a zstd frame is sometimes cut short (its CRC still right)."""
    payload = rows
    if compressed:
        payload = _load().block.compress(rows)
        if r.byte() >= 240:
            payload = payload[:max(1, len(payload) - 1 - r.byte() % 8)]
    return fixheader(r, compressed, payload) + payload


def tail(r: Reader) -> bytes:
    """What follows the last block: nothing, the EOF marker (with bytes after it), junk, part of a magic."""
    c, eof = r.byte() % 8, _load().block.EOF_MAGIC
    if c == 4:
        return eof + r.take(3)
    if c == 5:
        return r.take(r.byte() % 24)
    return (b"", b"", eof, eof, None, None, b"\xd5\xba\x0b", eof[:2])[c]


def meta_for(kind: int) -> bytes:
    filetype = KINDS[kind % len(KINDS)]
    return _load().meta.encode_meta(filetype, instance="aaaaaaaa-bbbb-4ccc-8ddd-000000000001",
                                    vclock={1: 100}, prev_vclock={1: 10} if filetype == "XLOG" else None)


def tarantool_fixtures() -> list[Path]:
    return sorted(p for p in (FIXTURES / "tarantool").rglob("*")
                  if p.suffix in (".xlog", ".snap", ".vylog", ".run", ".index"))


def limestone_fixtures() -> list[Path]:
    return sorted((FIXTURES / "limestone").rglob("pwal_*"))


def parse_fixture(path: Path):
    """(bytes, meta size, [(compressed, rows)], tail): a real file taken apart (by the tests' own reader of the
    framing, tests/tarantool_bytes.py), to be mutated."""
    W = _load()
    cached = W.fixtures.get(path)
    if cached is None:
        data = path.read_bytes()
        fr = W.tarantool_bytes.framing(data)
        blocks = [(b.kind == "zstd", W.tarantool_bytes.block_rows(data, b)) for b in fr.blocks]
        end = fr.blocks[-1].end if fr.blocks else fr.meta_size
        cached = W.fixtures[path] = (data, fr.meta_size, blocks, data[end:])
    return cached


INTERESTING = (0x00, 0x01, 0x0C, 0x7F, 0x80, 0x8F, 0x90, 0xC0, 0xC1, 0xC2, 0xC3, 0xCC, 0xCE, 0xCF, 0xD3, 0xD4,
               0xD8, 0xD9, 0xDC, 0xDD, 0xDE, 0xDF, 0xFF)


def mutate(r: Reader, b: bytearray) -> None:
    op, pos = r.byte() % 8, r.uint(3) % (len(b) + 1)
    if op in (0, 1) and pos < len(b):
        b[pos] ^= 1 << r.byte() % 8
    elif op in (2, 3) and pos < len(b):
        b[pos] = r.byte() if op == 2 else r.pick(INTERESTING)
    elif op == 4:
        b[pos:pos] = r.take(r.byte() % 8 + 1)
    elif op == 5:
        del b[pos:pos + r.byte() % 16 + 1]
    elif op == 6 and r.byte() < 64:
        del b[pos:]
    elif op == 7:  # a copy of another part (a duplicated block or row, if it falls right)
        src, n = r.uint(3) % (len(b) + 1), r.byte() * 4
        b[pos:pos] = b[src:src + n]


def fix_crcs(data: bytearray, start: int) -> bytearray:
    """Rewrite the header of every block that still parses, so that its CRC matches what follows it."""
    B = _load().block
    pos = start
    while pos + 19 <= len(data):
        try:
            compressed, length, _ = B.parse_fixheader(bytes(data[pos:pos + 19]))
        except B.BlockError:
            nxt = data.find(B.MAGIC_PREFIX, pos + 1)
            if nxt < 0:
                break
            pos = nxt
            continue
        payload = bytes(data[pos + 19:pos + 19 + length])
        if len(payload) == length:
            data[pos:pos + 19] = B.encode_fixheader(compressed, payload)
        pos += 19 + length
    return data


def gen_mutated(r: Reader) -> bytes:
    fixtures = tarantool_fixtures()
    data, meta_size, blocks, end = parse_fixture(fixtures[r.uint(2) % len(fixtures)])
    how, n = r.byte(), r.byte() % 6
    if how & 1:  # mutate the rows (decompressed), then put blocks with correct headers around them again
        rows = [bytearray(b) for _, b in blocks]
        for _ in range(n if rows else 0):
            mutate(r, rows[r.byte() % len(rows)])
        out = bytearray(data[:meta_size])
        for (compressed, _), b in zip(blocks, rows):
            out += wrap(r, bytes(b), compressed)
        return bytes(out + end)
    out = bytearray(data)
    for _ in range(n):
        mutate(r, out)
    return bytes(fix_crcs(out, meta_size) if how & 2 else out)


def build_file(data: bytes) -> bytes:
    """The Tarantool file an input stands for (modes whole to mutate)."""
    mode = MODES[data[0] % len(MODES)] if data else "whole"
    kind, r = data[1] if len(data) > 1 else 0, Reader(data[7:])
    if mode == "whole":
        return r.rest()
    if mode == "raw":
        return meta_for(kind) + r.rest()
    if mode == "rows":
        out = bytearray(meta_for(kind))
        while r.pos < len(r.data) and len(out) < MAX_LEN * 2:
            flags = r.byte()
            out += wrap(r, r.take(r.uint(2) % 4096 if flags & 2 else flags % 64 + 1), bool(flags & 1))
        return bytes(out) + tail(r)
    if mode == "struct":
        out, st = bytearray(meta_for(kind)), {"lsn": r.uint(1) + 1, "comp": 1}
        for _ in range(r.byte() % 8 + 1):
            flags = r.byte()
            out += wrap(r, b"".join(gen_row(r, st) for _ in range(flags % 8 + 1)), bool(flags & 8))
        return bytes(out) + tail(r)
    return gen_mutated(r)  # mutate (and limestone when it is not fuzzed)


def to_whole(data: bytes) -> bytes:
    """The same check as an input in the whole form, which needs no fixture and no generator to replay."""
    if data and MODES[data[0] % len(MODES)] == "limestone" and (
            limestone_fuzzed() or _limestone_source(data) == "whole"):
        return build_pwal_case(data).encode()
    return bytes([MODES.index("whole")]) + data[1:7].ljust(6, b"\0") + build_file(data)


# ------------------------------------------------------------------ the differential check

def _workdir_of(pid: int) -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # tmpfs: no disk writes
    return Path(base) / f"walvault-fuzz-{pid}"


def _workdir(workdir) -> Path:
    if workdir is None:
        workdir = _workdir_of(os.getpid())
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def _both(fn, *args, **kwargs) -> list:
    """fn run on the reference core, then on the compiled one: ("ok", result) or ("raised", traceback)."""
    saved = os.environ.get("WALVAULT_PURE")
    out = []
    try:
        for pure in ("1", "0"):
            os.environ["WALVAULT_PURE"] = pure
            try:
                out.append(("ok", fn(*args, **kwargs)))
            except Exception:
                out.append(("raised", traceback.format_exc()))
    finally:
        if saved is None:
            os.environ.pop("WALVAULT_PURE", None)
        else:
            os.environ["WALVAULT_PURE"] = saved
    return out


def _summary(path, **kwargs) -> dict:
    scan = _load().xlog.scan_file(path, **kwargs)
    s = scan.span
    return {"kind": scan.kind, "size": scan.size, "first_pos": s.first_pos, "end_pos": s.end_pos,
            "blocks": s.blocks, "zstd_blocks": s.zstd_blocks, "rows": s.rows, "lsns": sorted(s.lsns.items()),
            "last_commit": s.last_commit, "last_block_pos": s.last_block_pos, "eof": s.eof, "stopped": s.stopped,
            "findings": [(f.code, f.offset, f.message) for f in scan.findings]}


def _agree_dicts(what: str, pair: list) -> None:
    (ka, a), (kb, b) = pair
    if ka == "raised" or kb == "raised":
        raise AssertionError(f"{what}: a scan raised\n--- reference: {a}\n--- compiled: {b}")
    # repr, not ==: True == 1, but a span that says `true` in JSON is not the one that says 1
    diff = [f"  {k}: reference {a[k]!r}\n  {' ' * len(k)}  compiled  {b.get(k)!r}"
            for k in a if repr(a[k]) != repr(b.get(k))]
    if diff:
        raise AssertionError(f"{what}: the cores disagree\n" + "\n".join(diff))


def _ranges(data: bytes, size: int) -> list[dict]:
    flags = data[2] if len(data) > 2 else 0
    at = [int.from_bytes(data[i:i + 2].ljust(2, b"\0"), "big") * (size + 2) >> 16 for i in (3, 5)]
    start, stop = min(at), max(at)
    out = []
    if flags & 1:
        out.append({"start": start, "stop": stop})
    if flags & 2:
        out.append({"start": start, "stop": None if flags & 8 else stop, "search": False})
    if flags & 4:
        out.append({"stop": stop})
    return out


def _take_exact(core, blocks: bytes, base: int, data: bytes, lsns: dict, last_commit: bool) -> None:
    """BlockScanner.take over a buffer of exactly the blocks' size (ctypes: one malloc of that size), so that
    ASan sees a read past the end; the scan_file path reads into a larger bytearray, where it would not."""
    import ctypes
    W = _load()
    buf = memoryview((ctypes.c_ubyte * len(blocks)).from_buffer_copy(blocks)) if blocks else b""
    flags = data[2] if len(data) > 2 else 0
    limit = len(blocks) if flags & 16 else len(blocks) * int.from_bytes(data[3:5].ljust(2, b"\0"), "big") >> 16
    for xlog in (True, False):
        for state in (({}, True, False), (lsns, last_commit, True)):
            scanner = core.BlockScanner(xlog, W.block.decompress)
            if scanner.begin(*state):
                scanner.take(buf, base, limit, base + len(blocks) + (flags >> 5))
                scanner.end()


def check_input(data: bytes, workdir=None) -> None:
    """One fuzz input through the differential check; raises AssertionError (with the details) at a
    difference between the cores, or at an exception from either."""
    W = _load()
    mode = MODES[data[0] % len(MODES)] if data else "whole"
    work = _workdir(workdir)
    if mode == "crc":
        return _check_crc(data)
    if mode == "limestone" and (limestone_fuzzed() or _limestone_source(data) == "whole"):
        return _check_limestone(data, work)
    content = build_file(data)
    path = work / "fuzz.tarantool"
    path.write_bytes(content)
    full = _both(_summary, path)
    _agree_dicts("scan_file(path)", full)
    for kwargs in _ranges(data, len(content)):
        _agree_dicts(f"scan_file(path, {', '.join(f'{k}={v}' for k, v in kwargs.items())})",
                     _both(_summary, path, **kwargs))
    core = W.scancore._built
    if core is not None and full[0][1]["kind"] is not None:
        meta = W.meta.parse_meta(content[:W.meta.MAX_META_SIZE])
        lsns = {c: list(v) for c, v in full[0][1]["lsns"]}
        if len(lsns) <= 64:
            _take_exact(core, content[meta.size:], meta.size, data, lsns, full[0][1]["last_commit"])


def _check_crc(data: bytes) -> None:
    W = _load()
    core = W.scancore._built
    if core is None:
        return
    r = Reader(data[1:])
    start, flags = r.uint(4), r.byte()
    payload = r.rest()
    if flags & 1 and payload:  # long enough for the three-lane path (3 x 4096 bytes)
        payload = (payload * (3 * 4096 // len(payload) + 2))[:3 * 4096 + r.uint(2) % 9000]
    view = memoryview(payload)[flags >> 1 & 7:]  # any alignment
    got = core.tarantool_crc32c(view, start)
    want = W.crc32c.crc32c(bytes(view), start ^ 0xFFFFFFFF) ^ 0xFFFFFFFF
    if got != want:
        raise AssertionError(f"tarantool_crc32c({len(view)} bytes, {start:#x}) = {got:#x}, crc32c says {want:#x}")


def limestone_fuzzed() -> bool:
    """Whether walcore.limestone.scan calls the compiled _scan.limestone_scan (seen by a profile hook on a small
    well-formed pwal file built here: no fixture needed) and it works: until then the limestone inputs that are
    not in the whole form are fuzzed as Tarantool ones."""
    W = _load()
    if W.limestone_on is None:
        W.limestone_on = False
        core = W.scancore._built
        if core is None or not hasattr(core, "limestone_scan"):
            return False
        called = []

        def hook(frame, event, arg):
            if event == "c_call" and arg is core.limestone_scan:
                called.append(1)
        saved = os.environ.pop("WALVAULT_PURE", None)
        with tempfile.TemporaryDirectory() as tmp:
            sample = Path(tmp) / "pwal_0000"
            sample.write_bytes(l_header(1) + l_put(b"k", b"v") + l_end(1))
            sys.setprofile(hook)
            try:
                scan = W.limestone.scan_pwal(sample, 1)
                W.limestone_on = bool(called) and scan.durable == {L_PUT: 1}
            except NotImplementedError:
                pass
            finally:
                sys.setprofile(None)
                if saved is not None:
                    os.environ["WALVAULT_PURE"] = saved
    return W.limestone_on


# ------------------------------------------------------------------ limestone pwal files

# Entry types (walcore/limestone/pwal.py): put, snippet header, snippet end, durable-epoch record, remove, canceled
# header, put_blob; 7, 8, 9 are the storage operations.
L_PUT, L_HEADER, L_END, L_DURABLE, L_REMOVE, L_CANCELED, L_PUT_BLOB = 1, 2, 3, 4, 5, 6, 10
L_TYPE_BYTES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0x2A, 0x7F, 0xFF)
L_ODD_TYPES = (0, 4, 11, 0x2A, 0x7F, 0x80, 0xFF)  # not an entry the walks take (4: a durable-epoch record)
# Lengths that lie: near 2^32, so that key_len + value_len (+ 33) wraps in 32 bits; counts whose count * 8 does.
L_LONG = (0xFFFFFFFF, 0xFFFFFFF0, 0xFFFFFFDF, 0x80000000, 0x7FFFFFFF, 0x7FFFFFF0, 0x10000)
L_COUNTS = (0xFFFFFFFF, 0x20000000, 0x20000001, 0x1FFFFFFF, 0x10000000, 0x80000000)
L_DELTAS = (-33, -25, -17, -10, -9, -5, -4, -3, -2, -1, 0, 0, 0, 1, 2, 3, 8)  # an entry's end from a buffer's end
BLOB_POOL = (1, 2, 3, 99, 100, 1 << 32, U64)
TREE, FLAT = 1, 2  # where a blob file is: blob/dir_NN/<id>.blob, or beside the pwal file (a flat backup copy)
LS_SOURCES = ("whole", "mutate", "struct", "struct")  # byte 1 % 4 of a limestone input
MAX_CHUNK = 1 << 20
MAX_PWAL = 1 << 20
L_EPOCHS = (0, 1, U64, U64 - 1, 1 << 63, 1 << 32, -1, 1 << 64)  # odd durable epochs (the last two: not a u64)


def l_header(epoch: int, kind: int = L_HEADER) -> bytes:
    return bytes([kind]) + struct.pack("<Q", epoch % (1 << 64))


def l_end(epoch: int, crc_type: int = 0) -> bytes:
    return bytes([L_END]) + struct.pack("<QB", epoch % (1 << 64), crc_type)


def l_put(key: bytes, value: bytes, storage: int = 100, *, kind: int = L_PUT, key_len: int | None = None,
          value_len: int | None = None, ids=None, count: int | None = None) -> bytes:
    """A put (or put_blob, with its blob ids); the length fields may lie about key and value."""
    key_len = len(key) if key_len is None else key_len
    value_len = len(value) if value_len is None else value_len
    out = bytes([kind]) + struct.pack("<IIQ", key_len, value_len, storage) + key + struct.pack("<QQ", 7, 1) + value
    if kind == L_PUT_BLOB:
        ids = list(ids or ())
        out += struct.pack("<I", len(ids) if count is None else count) + b"".join(struct.pack("<Q", i) for i in ids)
    return out


def l_remove(key: bytes, storage: int = 100, key_len: int | None = None) -> bytes:
    return bytes([L_REMOVE]) + struct.pack("<IQ", len(key) if key_len is None else key_len, storage) + key \
        + struct.pack("<QQ", 7, 2)


def l_storage(kind: int, storage: int) -> bytes:
    return bytes([kind]) + struct.pack("<QQQ", storage, 7, 3)


@dataclasses.dataclass
class PwalCase:
    """One limestone check: a pwal file, the durable epoch it is judged by, the compiled walk's buffer size
    (walcore.limestone.scan._COMPILED_CHUNK; 0: the module's own) and the blob files beside the pwal file.
    Its encoding is the limestone whole form: byte 0 the mode, byte 1 0 (whole), 5 unused bytes, the durable
    epoch (16 bytes, signed, big-endian), the chunk (4), the number of blob files (1) and each (id: 8,
    TREE|FLAT: 1), then the pwal file."""

    pwal: bytes
    durable: int
    chunk: int = 0
    blobs: tuple = ()  # ((blob id, TREE | FLAT), ...)

    def encode(self) -> bytes:
        blobs = self.blobs[:64]
        return bytes([MODES.index("limestone")]) + bytes(6) + self.durable.to_bytes(16, "big", signed=True) \
            + self.chunk.to_bytes(4, "big") + bytes([len(blobs)]) \
            + b"".join(b.to_bytes(8, "big") + bytes([w]) for b, w in blobs) + self.pwal

    @classmethod
    def decode(cls, r: Reader) -> "PwalCase":
        durable = int.from_bytes(r.take(16).ljust(16, b"\0"), "big", signed=True)
        chunk = min(r.uint(4), MAX_CHUNK)
        blobs = tuple((r.uint(8), r.byte() & 3) for _ in range(r.byte() % 65))
        return cls(r.rest(), durable, chunk, blobs)


class PwalGen:
    """pwal entries built from the fuzz bytes: snippet headers with epochs around the durable epoch, puts and
    removes whose lengths end near the compiled walk's buffer ends or lie (near 2^32), put_blob with counts
    (some of which overflow in 32 bits), snippet ends, canceled headers, durable-epoch records, unknown bytes.
    It follows where the compiled walk's buffers begin (each call's buffer starts at the first entry whose
    fixed part is not whole in the previous one) to aim lengths at their ends."""

    def __init__(self, r: Reader, durable: int, chunk: int):
        self.r, self.durable, self.chunk = r, durable, chunk
        self.out, self.base = bytearray(), 0
        self.first = True  # where a snippet header must come (at the start, after an end marker)

    def buffer_end(self, fixed: int) -> int:
        """Where the buffer holding an entry (of this fixed part) that starts at the end of out ends."""
        pos = len(self.out)
        if pos + fixed > self.base + self.chunk:
            self.base = pos
        return self.base + self.chunk

    def add(self, entry: bytes, fixed: int) -> None:
        self.buffer_end(fixed)
        self.out += entry
        if entry[0] in (L_HEADER, L_CANCELED, L_END):
            self.first = entry[0] == L_END

    def header_first(self, data: bool) -> None:
        """Mostly a file as limestone writes it: a header before data where one must come, an end marker
        before a header that follows data."""
        if self.r.byte() < 224 and self.first == data:
            self.add(l_end(self.epoch()) if not data else l_header(self.epoch()), 10 if not data else 9)

    def epoch(self) -> int:
        r, d = self.r, self.durable
        c = r.byte()
        if c < 208:
            return (d + c % 7 - 3) % (1 << 64)  # around the durable epoch (below 0 and past 2^64 - 1 it wraps)
        return r.pick((0, 1, U64, U64 - 1, 1 << 63, d + (1 << 32), d))

    def fill(self, n: int) -> bytes:
        return self.r.take(min(n, 8)).ljust(n, b"\0")

    def sizes(self, fixed: int, extra: int) -> tuple[int, int, bool]:
        """key_len, value_len for an entry of `extra` bytes besides key and value; True if they lie."""
        r = self.r
        c, k = r.byte(), r.byte() % 24
        if c < 136:
            return k, r.uint(2) % (48 if c < 104 else 3000), False
        if c < 248:  # the entry (or the put_blob's count after the value) ends near the end of a buffer
            v = self.buffer_end(fixed) + r.pick(L_DELTAS) - len(self.out) - extra - k
            while v < 0:
                v += self.chunk
            return k, v, False
        return r.pick(L_LONG + (0, 16)), r.pick(L_LONG + (0x21, 0x10, 0)), True

    def put(self, kind: int = L_PUT) -> None:
        r = self.r
        k, v, lying = self.sizes(17, 33)
        storage = r.pick((100, 200, 0, U64))
        if lying:  # what follows is what the entry's length summed in 32 bits says (as far as 4 KiB)
            body = self.fill(min(max(((33 + k + v) & 0xFFFFFFFF) - 33, 0), 4096))
            entry = bytes([kind]) + struct.pack("<IIQ", k & 0xFFFFFFFF, v & 0xFFFFFFFF, storage) + body \
                + struct.pack("<QQ", 7, 1)
        else:
            entry = l_put(self.fill(k), self.fill(v), storage, kind=L_PUT)
            entry = bytes([kind]) + entry[1:]
        if kind == L_PUT_BLOB:
            c = r.byte()
            if c < 240:
                ids = [r.pick(BLOB_POOL) for _ in range(c % 4)]
                count = len(ids) + (224 <= c < 232) * r.pick((1, -1, 2))  # an id more or less than there are
            else:
                count = r.pick(L_COUNTS)
                ids = [r.pick(BLOB_POOL)] * min(((count * 8) & 0xFFFFFFFF) // 8, 64)  # as many as a wrap says
            entry += struct.pack("<I", max(count, 0)) + b"".join(struct.pack("<Q", i) for i in ids)
        self.add(entry, 17)

    def remove(self) -> None:
        k, v, lying = self.sizes(5, 29)
        if lying:
            self.add(l_remove(self.fill(min(max(((29 + k) & 0xFFFFFFFF) - 29, 0), 4096)), key_len=k), 5)
        else:
            self.add(l_remove(self.fill(k + v)), 5)

    def step(self, op: int) -> bool:
        """One entry (or a few) for op (0..39); False when the file must end here."""
        r = self.r
        if op >= 32:
            op = (5, 6, 12, 15, 22, 23, 24, 0)[op - 32]
        if op < 27:
            self.header_first(4 < op < 22)
        if op < 4 or op == 31:
            self.add(l_header(self.epoch()), 9)
        elif op == 4:
            self.add(l_header(self.epoch(), L_CANCELED), 9)
        elif op < 12:
            self.put()
        elif op < 15:
            self.remove()
        elif op < 17:
            self.put(L_PUT_BLOB)
        elif op < 20:
            self.add(l_end(self.epoch(), r.pick((0, 0, 1, 0xFF))), 10)
        elif op < 22:
            self.add(l_storage(r.pick((7, 8, 9)), r.pick((100, 300, 0))), 25)
        elif op < 27:  # a well-formed session
            epoch = self.epoch()
            self.add(l_header(epoch), 9)
            for _ in range(r.byte() % 5):
                self.put(r.pick((L_PUT, L_PUT, L_PUT, L_PUT_BLOB))) if r.byte() & 1 else self.remove()
            self.add(l_end(epoch), 10)
        elif op == 27:
            self.out += l_header(self.epoch(), L_DURABLE)
        elif op == 28:
            self.out += bytes([r.pick(L_ODD_TYPES)]) + r.take(r.byte() % 24)
        elif op == 29:
            self.out += r.take(r.byte() % 32)
        else:  # an entry cut short by the end of the file (a snippet header, mostly)
            c = r.byte()
            if c < 128:
                entry = l_header(self.epoch(), r.pick((L_HEADER, L_HEADER, L_CANCELED, L_DURABLE)))
            else:
                mark = len(self.out)
                self.step(r.pick((5, 12, 15, 17, 20)))
                entry = bytes(self.out[mark:])
                del self.out[mark:]
            self.out += entry[:max(1, len(entry) - 1 - r.byte() % len(entry))]
            return False
        return True


def gen_pwal(r: Reader, durable: int, chunk: int) -> bytes:
    g = PwalGen(r, durable, chunk)
    for _ in range(256):
        if r.pos >= len(r.data) or len(g.out) > MAX_PWAL or not g.step(r.byte() % 40):
            break
    return bytes(g.out)


def pwal_fixture(path: Path):
    """A real pwal file cut into its entries (the rest after the last whole one), the durable epoch of its
    directory (the highest of its epoch files) and its blob files."""
    W = _load()
    key = ("limestone", path)
    cached = W.fixtures.get(key)
    if cached is None:
        data = path.read_bytes()
        cuts = [e.offset for e in W.pwal.iter_entries(path)] + [len(data)]
        entries = [data[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
        epochs = [W.epoch.scan_epoch(p.read_bytes()).durable_epoch for p in path.parent.glob("epoch*")]
        durable = max((e for e in epochs if e is not None), default=3)
        blobs = {}
        for p in path.parent.glob("*.blob"):
            blobs[int(p.name[:16], 16)] = FLAT
        for p in path.parent.glob("blob/dir_*/*.blob"):
            blobs[int(p.name[:16], 16)] = blobs.get(int(p.name[:16], 16), 0) | TREE
        cached = W.fixtures[key] = (entries, durable, tuple(sorted(blobs.items())))
    return cached


def mutate_entries(r: Reader, es: list, g: PwalGen) -> None:
    """One change to a pwal file's entries: a type byte, a length field or an epoch; an entry dropped, doubled,
    cut short or new; the file cut after an entry."""
    i = r.uint(2) % len(es)
    e, op = bytearray(es[i]), r.byte() % 8
    if op == 0 and e:
        e[0] = r.pick(L_TYPE_BYTES)
    elif op == 1 and len(e) >= 9:
        kind = e[0]
        if kind in (L_PUT, L_PUT_BLOB, L_REMOVE):
            at = 1 if kind == L_REMOVE else r.pick((1, 5))
            if kind == L_PUT_BLOB and r.byte() & 1:  # the count of blob ids
                at = 33 + sum(struct.unpack_from("<II", e, 1))
            if at + 4 <= len(e):
                old = struct.unpack_from("<I", e, at)[0]
                new = r.pick(L_LONG + L_COUNTS + (0, old + 1, old - 1, old + 8, old * 2))
                e[at:at + 4] = struct.pack("<I", new & 0xFFFFFFFF)
        else:
            e[1:9] = struct.pack("<Q", g.epoch() % (1 << 64))
    elif op == 2:
        del es[i]
        return
    elif op == 3:
        es.insert(r.uint(2) % (len(es) + 1), bytes(e))
        return
    elif op == 4:
        e = e[:r.byte() % max(len(e), 1)]
    elif op == 5:
        del es[i + 1:]
    elif op == 6 and e and e[0] in (L_HEADER, L_CANCELED):
        e[0] ^= L_HEADER ^ L_CANCELED
    else:
        g.out = bytearray()
        g.step(r.byte() % 40)
        es.insert(i, bytes(g.out))
        return
    es[i] = bytes(e)


def _limestone_source(data: bytes) -> str:
    return LS_SOURCES[data[1] % 4] if len(data) > 1 else "whole"


def build_pwal_case(data: bytes) -> PwalCase:
    """The limestone check an input stands for. Bytes 2-6 of a mutate or struct input: the durable epoch, the
    compiled walk's buffer size (2 bytes), the blob files, spare."""
    W = _load()
    source, r = _limestone_source(data), Reader(data[7:])
    if source == "whole":
        return PwalCase.decode(r)
    s = data[2:7].ljust(5, b"\0")
    v = int.from_bytes(s[1:3], "big")
    chunk = (0, 1 + v % 64, 25 + v % 4072, 25 + v % 4072)[v >> 14]  # 0: the module's own (256 KiB)
    if source == "struct":
        c = s[0]
        durable = c % 50 if c < 200 else L_EPOCHS[c % 8]
        pwal = gen_pwal(r, durable, chunk or W.limestone_chunk)
        blobs = tuple((b, FLAT if s[3] & 0x80 else TREE) for i, b in enumerate(BLOB_POOL) if s[3] >> i & 1)
        return PwalCase(pwal, durable, chunk, blobs)
    files = limestone_fixtures()
    path = files[r.uint(2) % len(files)]
    entries, real, blobs = pwal_fixture(path)
    c = s[0]
    durable = max(real + c % 7 - 3, 0) if c < 160 else c % 48 if c < 232 else L_EPOCHS[c % 8]
    es = list(entries)
    g = PwalGen(r, durable, chunk or W.limestone_chunk)
    for _ in range(r.byte() % 6):
        if es:
            mutate_entries(r, es, g)
    b = bytearray(b"".join(es))
    for _ in range(r.byte() % 4):
        mutate(r, b)
    if chunk and len(b) // chunk > 1024:  # at most a thousand calls of the compiled walk on the large fixtures
        chunk = len(b) // 1024 + 1
    # blob files: as in the fixture's directory (in a copy of it), none, or all of them flat
    blobs = (blobs, blobs, (), tuple((b, FLAT) for b, _ in blobs))[s[3] % 4]
    return PwalCase(bytes(b), durable, chunk, blobs)


def _pwal_dir(case: PwalCase, work: Path) -> Path:
    """The case's pwal file in a directory of its own, with its blob files (and nothing else)."""
    blob_path = _load().layout.blob_path
    d = work / "limestone"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    path = d / "pwal_0000"
    path.write_bytes(case.pwal)
    for blob, where in case.blobs:
        at = blob_path(d, blob)
        if where & TREE:
            at.parent.mkdir(parents=True, exist_ok=True)
            at.write_bytes(b"BLOB")
        if where & FLAT:
            (d / at.name).write_bytes(b"BLOB")
    return path


def _pwal_summary(path: Path, durable: int) -> dict:
    scan = _load().limestone.scan_pwal(path, durable)
    out = dataclasses.asdict(scan)
    out["findings"] = [(f.code, f.offset, f.message) for f in scan.findings]
    out["durable"] = list(scan.durable.items())  # in order: the same dict, also when printed
    out["epoch_range"] = scan.epoch_range
    return out


def _check_limestone(data: bytes, work: Path) -> None:
    """scan_pwal on both cores: the whole PwalScan must be the same (the compiled walk's buffer set as asked)."""
    W = _load()
    case = build_pwal_case(data)
    path = _pwal_dir(case, work)
    saved = W.limestone._COMPILED_CHUNK
    W.limestone._COMPILED_CHUNK = case.chunk or W.limestone_chunk
    try:
        pair = _both(_pwal_summary, path, case.durable)
    finally:
        W.limestone._COMPILED_CHUNK = saved
    _agree_dicts(f"scan_pwal(path, {case.durable}) of {len(case.pwal)} bytes (compiled chunk "
                 f"{case.chunk or W.limestone_chunk}, blob files {case.blobs})", pair)
    if W.scancore._built is not None and hasattr(W.scancore._built, "limestone_scan"):
        _limestone_exact(W.scancore._built, path, case)


def _limestone_exact(core, path: Path, case: PwalCase) -> None:
    """_scan_compiled's walk with each buffer in a malloc of exactly its size (ctypes), so that ASan sees a read
    past it (scan_pwal's bytearray is as long as the chunk, also where the file ends first)."""
    import ctypes
    chunk, data = case.chunk or _load().limestone_chunk, case.pwal
    with open(path, "rb", buffering=0) as f:
        at, state = 0, None
        while at < len(data):
            piece = data[at:at + chunk]
            buf = memoryview((ctypes.c_ubyte * len(piece)).from_buffer_copy(piece))
            try:
                walked = core.limestone_scan(f.fileno(), buf, at, len(data), case.durable, state)
            except Exception:
                raise AssertionError(f"limestone_scan(buffer of {len(piece)} bytes at {at}) raised\n"
                                     f"{traceback.format_exc()}")
            if walked is None:
                break
            if not at < walked[0] <= len(data):
                raise AssertionError(f"limestone_scan(buffer of {len(piece)} bytes at {at}): next at {walked[0]}")
            at, state = walked[0], walked[1]


# ------------------------------------------------------------------ hand-made hostile inputs

def hostile_inputs() -> dict[str, bytes]:
    """Inputs (whole form) that aim at the C walk's bounds checks; kept in tests/data/fuzz."""
    W = _load()
    B, xlog, snap = W.block, meta_for(0), meta_for(1)

    def block(rows: bytes, compressed=False) -> bytes:
        payload = B.compress(rows) if compressed else rows
        return B.encode_fixheader(compressed, payload) + payload

    def row(lsn, body: bytes = b"\x82\x10\xcd\x02\x00\x21\x91\x01", head: bytes = b"") -> bytes:
        """A REPLACE of replica 1 (lsn: an int, or its msgpack bytes), extra header entries, a body."""
        lsn = lsn if isinstance(lsn, bytes) else mp_uint(lsn)
        return bytes([0x84 + (len(head) > 0)]) + b"\x00\x03\x02\x01\x03" + lsn + \
            b"\x04\xcb" + struct.pack(">d", 1.7e9) + head + body

    good = block(row(1) + row(2))
    zipped = B.compress(row(3) + row(4))
    cut = zipped[:-3]
    whole = bytes([MODES.index("whole")])
    return {
        # len as 0xcf + 8 bytes, then crc32p 0xcf whose 8 bytes run past the 19-byte header
        "fixheader-cf-past-end": whole + bytes(6) + xlog + B.ROW_MAGIC + b"\xcf" + (5).to_bytes(8, "big")
        + b"\xcf\x00\x00\x00\x00\x00" + good + B.EOF_MAGIC,
        # a block whose length claims 2^31 (the largest allowed) and 2^31 + 1, with ranges scanned too
        "block-len-2g": whole + b"\x00\x17\x00\x7f\xff\xff" + xlog + good + B.ROW_MAGIC + b"\xce\x80\x00\x00\x00"
        + b"\x00\xce\x00\x00\x00\x00\xa3\x00\x00\x00" + good,
        "block-len-2g-plus-1": whole + bytes(6) + snap + B.ROW_MAGIC + b"\xcf" + (2**31 + 1).to_bytes(8, "big")
        + b"\x00\xce\x00\x00\x00\x00" + good,
        # a row header map32 claiming 2^32 - 1 entries
        "header-map-2e32": whole + bytes(6) + xlog + good + block(b"\xdf\xff\xff\xff\xff\x00\x02\x03\x03"),
        # nested arrays 2000 deep in a row body (msgpack's limit is 1024, the C walk's 64)
        "nested-2000": whole + bytes(6) + xlog + good + block(row(3, b"\x91" * 2000 + b"\xc0")) + B.EOF_MAGIC,
        "nested-60-maps": whole + bytes(6) + xlog + good + block(row(3, b"\x81\x01" * 60 + b"\xc0")),
        # ext type -1 (msgpack's Timestamp) in a body: a valid one, and one of a length no timestamp has
        "ext-minus-1": whole + bytes(6) + xlog + good + block(row(3, b"\xd6\xff\x00\x00\x00\x01") + row(
            4, b"\xc7\x05\xff\x00\x00\x00\x00\x01")) + B.EOF_MAGIC,
        "ext-minus-1-header": whole + bytes(6) + snap + block(row(1, head=b"\x05\xd7\xff" + bytes(8))),
        # a zstd frame cut short, its CRC right
        "zstd-truncated": whole + b"\x00\x07\x10\x00\xff\xff" + xlog + good + B.encode_fixheader(True, cut) + cut
        + block(row(5)) + B.EOF_MAGIC,
        # an lsn of 2^64 - 1 followed by 1 (last + 1 wraps in uint64)
        "lsn-wrap": whole + bytes(6) + xlog + block(row(U64)) + block(row(1)) + B.EOF_MAGIC,
        # a bool where an lsn must be, then a block that continues it
        "lsn-bool": whole + bytes(6) + xlog + block(row(b"\xc3")) + block(row(2)) + block(row(3)) + B.EOF_MAGIC,
        # found by the fuzzer, minimized: an ext of type -2 (msgpack refuses any negative type but -1) in the body
        # of a local row (no replica_id: the fast Python walk gives up), and in a row header
        "negative-ext-body": whole + bytes(6) + xlog + block(b"\x83\x00\x02\x03\x01\x04\xcb" + struct.pack(">d", 1.7e9)
                                                          + b"\xd4\xfe\x00") + B.EOF_MAGIC,
        "negative-ext-header": whole + bytes(6) + xlog + good + block(row(3, head=b"\x05\xd4\x80\x00")) + B.EOF_MAGIC,
        # found by the fuzzer, minimized: a negative lsn in the second row of a snap block
        "negative-lsn-snap": whole + bytes(6) + snap + block(b"\x82\x00\x02\x03\x01\x80" + b"\x82\x00\x02\x03\xff\x80")
        + B.EOF_MAGIC,
        # found by the fuzzer, minimized: a block whose rows end inside a row header (map of 4, three entries),
        # a block the C walk takes, then one it leaves to the reference (a doubled lsn key), whose fast walk
        # finishes the half row with it
        "partial-row": whole + bytes(6) + xlog + block(row(1) + b"\x84\x00\x02\x02\x01\x03\x02\x04")
        + block(row(2)) + block(row(3, head=b"\x03\x03")) + B.EOF_MAGIC,
        # a float key that equals the type key (0.0 == 0 in a Python dict)
        "float-key": whole + bytes(6) + snap + block(b"\x82\x00\x02\xcb" + bytes(8) + b"\x0c") + good,
        **hostile_limestone(),
    }


def hostile_limestone() -> dict[str, bytes]:
    """Hand-made pwal files (limestone whole form) that aim at the compiled walk's length arithmetic and its
    buffer ends; durable epoch 3 unless said."""
    put_wv = struct.pack("<QQ", 7, 1)
    # a put in a durable snippet whose key_len + value_len is 2^32 + 0x20: summed in 32 bits, the 0x20 bytes and
    # write version that follow would make a whole entry, and a good put and an end marker come after it
    wrap_put = bytes([L_PUT]) + struct.pack("<IIQ", 0xFFFFFFF0, 0x30, 100) + bytes(0x20) + put_wv
    # then one whose 33 + key_len wraps to 0 in 32 bits (a walk that did so would not move)
    zero_put = bytes([L_PUT]) + struct.pack("<IIQ", 0xFFFFFFDF, 0, 100) + put_wv
    # entries aimed at the ends of 64-byte buffers: a put ending at 64, a put_blob at 64 whose id count sits at
    # 126..130 (across the end at 128: read with pread), a put whose value runs past its buffer (skipped unread),
    # a remove ending exactly at its buffer's end, an end marker ending the file
    at_end = (l_header(2) + l_put(b"k" * 6, b"v" * 16) + l_put(b"bkey5", b"w" * 24, kind=L_PUT_BLOB, ids=[1])
              + l_put(b"big", b"x" * 300) + l_remove(b"r" * 35) + l_end(2) + l_header(5) + l_put(b"n", b"")
              + l_end(5))
    assert len(l_header(2) + l_put(b"k" * 6, b"v" * 16)) == 64 and len(l_remove(b"r" * 35)) == 64
    return {
        "limestone-put-len-wrap32": PwalCase(l_header(3) + wrap_put + l_put(b"k2", b"v2") + l_end(3), 3).encode(),
        "limestone-put-len-wrap32-zero": PwalCase(l_header(3) + zero_put + l_end(3), 3, 40).encode(),
        # a put_blob whose id count is 2^29 + 1: count * 8 is 2^32 + 8, in 32 bits one id (which is there)
        "limestone-put-blob-count-wrap": PwalCase(
            l_header(3) + l_put(b"bk", b"row", kind=L_PUT_BLOB, ids=[1], count=0x20000001) + l_put(b"k", b"v")
            + l_end(3), 3, 0, ((1, TREE),)).encode(),
        "limestone-entry-at-chunk-end": PwalCase(at_end, 3, 64, ((1, FLAT),)).encode(),
        # a snippet header cut short at the end of the file: after an end marker (a broken tail), and right
        # after a put of a durable snippet (the snippet is corrupted), the latter through 40-byte buffers
        "limestone-truncated-header-at-end": PwalCase(
            l_header(1) + l_put(b"k", b"v") + l_end(1) + l_header(2)[:5], 3).encode(),
        "limestone-truncated-header-in-snippet": PwalCase(
            l_header(1) + l_put(b"k", b"v") + l_header(2)[:6], 3, 40).encode(),
    }


# ------------------------------------------------------------------ the fuzzing run

SHIM = r"""
/* Forward libFuzzer's coverage entry points past gcc's libasan (which defines them as no-ops) to atheris's
   libFuzzer; no-ops until fuzz_shim_attach names the module that holds it (loading it early, as Python would:
   the import then finds it loaded). Tail calls: libFuzzer reads its caller's address. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
static void nop2(uintptr_t a, uintptr_t b) { (void)a; (void)b; }
static void nop5(void *a, const void *b, const void *c, size_t d, int e) {}
static void (*f_8bit)(uintptr_t, uintptr_t) = nop2, (*f_pcs)(uintptr_t, uintptr_t) = nop2;
static void (*f_cmp8)(uintptr_t, uintptr_t) = nop2, (*f_ccmp8)(uintptr_t, uintptr_t) = nop2;
static void (*f_memcmp)(void *, const void *, const void *, size_t, int) = nop5;
int fuzz_shim_attach(const char *path)
{
    void *h = dlopen(path, RTLD_NOW);
    if (!h) return 0;
    void *a = dlsym(h, "__sanitizer_cov_8bit_counters_init"), *b = dlsym(h, "__sanitizer_cov_pcs_init"),
         *c = dlsym(h, "__sanitizer_cov_trace_cmp8"), *d = dlsym(h, "__sanitizer_cov_trace_const_cmp8"),
         *e = dlsym(h, "__sanitizer_weak_hook_memcmp");
    if (!a || !b || !c || !d || !e) return 0;
    f_8bit = a, f_pcs = b, f_cmp8 = c, f_ccmp8 = d, f_memcmp = e;
    return 1;
}
void __sanitizer_cov_8bit_counters_init(uintptr_t a, uintptr_t b) { f_8bit(a, b); }
void __sanitizer_cov_pcs_init(uintptr_t a, uintptr_t b) { f_pcs(a, b); }
void __sanitizer_cov_trace_cmp8(uintptr_t a, uintptr_t b) { f_cmp8(a, b); }
void __sanitizer_cov_trace_const_cmp8(uintptr_t a, uintptr_t b) { f_ccmp8(a, b); }
void __sanitizer_weak_hook_memcmp(void *pc, const void *a, const void *b, size_t n, int r) { f_memcmp(pc, a, b, n, r); }
"""


def ensure_atheris():
    try:
        import atheris
    except ImportError:
        print(f"atheris (a bench-only dependency: the coverage-guided fuzzer, libFuzzer inside) is not installed; "
              f"installing it with pip into {sys.prefix}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "atheris"], check=True)
        import atheris
    return atheris


def build_sanitized(tmp: Path) -> dict:
    """The extension built with ASan + UBSan in a copy of walcore/, and the shim; the child's environment."""
    shutil.copytree(ROOT / "walcore", tmp / "walcore", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "setup.py", tmp / "setup.py")
    env = dict(os.environ, CC="gcc", CFLAGS=CFLAGS, LDFLAGS="-fsanitize=address,undefined")
    log = tmp / "build.log"
    with open(log, "w") as out:
        subprocess.run(["nice", "-n", "10", sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp,
                       env=env, stdout=out, stderr=subprocess.STDOUT, check=True)
    if not list((tmp / "walcore").glob("_scan*.so")):  # setup.py's extension is optional: a failure is silent
        sys.exit(f"the sanitizer build failed:\n{log.read_text()[-4000:]}")
    (tmp / "shim.c").write_text(SHIM)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp / "shim.so"), str(tmp / "shim.c"), "-ldl"],
                   check=True)
    asan, stdcxx = (subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True).stdout.strip()
                    for lib in ("libasan.so", "libstdc++.so"))
    # libstdc++ too: ASan finds the real __cxa_throw only in what is loaded when it starts, and atheris throws
    # (a Python comparison that raises, under its instrumentation) from C++
    return dict(os.environ, WALVAULT_FUZZ_BUILD=str(tmp), PYTHONPATH=str(tmp), PYTHONMALLOC="malloc",
                LD_PRELOAD=f"{tmp / 'shim.so'}:{asan}:{stdcxx}",
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:verify_asan_link_order=0",
                UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")


def seed_corpus(corpus: Path) -> None:
    """Real fixtures (whole, raw and mutate inputs), a few of each other mode, and the regression inputs."""
    corpus.mkdir(parents=True, exist_ok=True)
    seeds = []
    for i, path in enumerate(tarantool_fixtures()):
        data = path.read_bytes()
        seeds.append(bytes([MODES.index("mutate"), 0, 0]) + bytes(4) + i.to_bytes(2, "big") + b"\x00\x00")
        if len(data) < MAX_LEN - 7:
            seeds.append(bytes([MODES.index("whole"), 0, 0]) + bytes(4) + data)
    for kind in range(len(KINDS)):
        seeds.append(bytes([MODES.index("struct"), kind, 0]) + bytes(4) + bytes(range(0, 256, 3)))
        seeds.append(bytes([MODES.index("rows"), kind, 0]) + bytes(4) + b"\x10\x84\x00\x02\x02\x01\x03\x05\x04\x00")
    seeds += [bytes([MODES.index("crc")]) + bytes(range(64)), bytes([MODES.index("limestone")]) + bytes(20)]
    seeds += limestone_seeds()
    seeds += [p.read_bytes() for p in sorted((ROOT / "tests" / "data" / "fuzz").glob("*")) if p.is_file()]
    for s in seeds:  # added to a corpus kept from earlier runs too
        if not (corpus / hashlib.sha1(s).hexdigest()).exists():
            (corpus / hashlib.sha1(s).hexdigest()).write_bytes(s)


def limestone_seeds() -> list[bytes]:
    """Each pwal fixture as it is (its directory's durable epoch, the compiled walk's own buffer or one of 257
    bytes); struct inputs whose pwal file is well-formed (found among pseudo-random ones)."""
    import random

    W, ls = _load(), MODES.index("limestone")
    seeds = []
    for i in range(len(limestone_fixtures())):
        seeds.append(bytes([ls, 1, 3, 0, 0, 0, 0]) + i.to_bytes(2, "big") + bytes(2))
        seeds.append(bytes([ls, 1, 3, 0x80, 0xE8, 0, 0]) + i.to_bytes(2, "big") + bytes(2))
    rnd, found = random.Random(1), 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2000):
            data = bytes([ls, 2, rnd.randrange(50), 0x80 | rnd.randrange(64), rnd.randrange(256), 1, 0]) + bytes(
                rnd.randrange(256) for _ in range(rnd.randrange(40, 200)))
            path = Path(tmp) / "pwal_0000"
            path.write_bytes(build_pwal_case(data).pwal)
            entries = list(W.pwal.iter_entries(path))
            if len(entries) > 4 and all(type(e) is W.pwal.Entry for e in entries):
                seeds.append(data)
                found += 1
                if found == 12:
                    break
    return seeds


MODE_RUNS: dict[str, list] = {}  # the child's checks per mode: [count, seconds]
_RUNS_SAVED = [0.0]


def input_mode(data: bytes) -> str:
    """The mode an input is checked in (limestone ones by where their pwal file comes from)."""
    mode = MODES[data[0] % len(MODES)] if data else "whole"
    if mode == "limestone":
        source = _limestone_source(data)
        return f"limestone-{source}" if source == "whole" or limestone_fuzzed() else "limestone(as mutate)"
    return mode


def counted_check(data: bytes) -> None:
    """check_input, counted per mode; the counts go to modes.json in the work dir every 2 s and at a failure,
    for the parent to add up (libFuzzer ends the process without running Python's exit handlers)."""
    mode, t0 = input_mode(data), time.monotonic()
    ok = False
    try:
        check_input(data)
        ok = True
    finally:
        run = MODE_RUNS.setdefault(mode, [0, 0.0])
        run[0] += 1
        run[1] += time.monotonic() - t0
        if not ok or t0 - _RUNS_SAVED[0] >= 2:
            _RUNS_SAVED[0] = t0
            tmp = _workdir(None) / "modes.json.tmp"
            tmp.write_text(json.dumps(MODE_RUNS))
            tmp.replace(tmp.with_name("modes.json"))


def read_mode_runs(pid: int) -> dict:
    try:
        return json.loads((_workdir_of(pid) / "modes.json").read_text())
    except (OSError, ValueError):
        return {}


def child(args) -> None:
    """In the sanitizer environment: check that it is what it should be, then fuzz."""
    atheris = ensure_atheris()
    build = Path(os.environ["WALVAULT_FUZZ_BUILD"])
    with atheris.instrument_imports(include=["walcore"]):
        W = _load()
    so = Path(W.scancore._built.__file__) if W.scancore._built else None
    maps = Path("/proc/self/maps").read_text()
    if so is None or build not in so.parents or "libasan" not in maps or "libubsan" not in maps:
        sys.exit(f"walcore._scan is not the sanitizer build from {build}: {so}")
    import ctypes
    core = next(Path(atheris.__file__).parent.glob("core_with_libfuzzer*.so"))  # libFuzzer: the shim's target
    if not ctypes.CDLL(str(build / "shim.so")).fuzz_shim_attach(str(core).encode()):
        sys.exit("the coverage shim could not find libFuzzer's entry points in atheris")
    print(f"fuzzing {so} (ASan + UBSan); limestone inputs: "
          f"{'scan_pwal on both cores' if limestone_fuzzed() else 'not fuzzed (limestone_scan not in use yet)'}"
          f" (limestone_fuzzed() = {limestone_fuzzed()})"
          f"\n(atheris's warning that coverage symbols come from shim.so is expected: the shim hands them on to it)",
          flush=True)
    args.crashes.mkdir(parents=True, exist_ok=True)
    atheris.Setup([sys.argv[0], str(args.corpus), f"-max_total_time={args.seconds}", f"-seed={args.seed}",
                   f"-artifact_prefix={args.crashes}/", f"-max_len={MAX_LEN}", "-timeout=60",
                   "-rss_limit_mb=4096", "-print_final_stats=1"], counted_check)
    atheris.Fuzz()


def parent(args) -> int:
    ensure_atheris()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="walvault-fuzz-build-"))
    try:
        env = build_sanitized(tmp)
        seed_corpus(args.corpus)
        args.crashes.mkdir(parents=True, exist_ok=True)
        before = set(args.crashes.iterdir())
        log = OUT / "fuzz.log"
        runs, fuzz_seconds, rounds, modes = 0, 0.0, 0, {}
        print(f"sanitizer build in {time.monotonic() - started:.0f} s; log: {log}", flush=True)
        with open(log, "a") as logf:
            while (left := int(args.seconds - (time.monotonic() - started))) >= 10 and rounds < 5:
                rounds += 1
                t0, seen = time.monotonic(), set(args.crashes.iterdir())
                proc = subprocess.Popen(["nice", "-n", "10", sys.executable, __file__, "--child", "--seconds",
                                         str(left), "--seed", str(args.seed + rounds - 1), "--corpus",
                                         str(args.corpus), "--crashes", str(args.crashes)],
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        errors="replace")
                n = 0
                for line in proc.stdout:
                    logf.write(line)
                    if m := re.match(r"stat::number_of_executed_units: (\d+)", line):
                        n = int(m.group(1))
                    # the fuzzer's progress lines go to the log; the rest (findings, stats) to the screen too
                    if not re.match(r'#\d+\s+(NEW|REDUCE|pulse)|INFO: Instrumenting|"|###### ', line):
                        print(line, end="", flush=True)
                proc.wait()
                for mode, (count, seconds) in read_mode_runs(proc.pid).items():
                    modes[mode] = [a + b for a, b in zip(modes.get(mode, [0, 0.0]), (count, seconds))]
                shutil.rmtree(_workdir_of(proc.pid), ignore_errors=True)
                runs += n
                fuzz_seconds += time.monotonic() - t0
                if proc.returncode == 0:
                    break
                if not set(args.crashes.iterdir()) - seen:
                    sys.exit(f"the fuzzer failed (exit {proc.returncode}) without a crash input: see {log}")
                print(f"--- the fuzzer stopped (exit {proc.returncode}): restarting on the time left", flush=True)
        found = sorted(set(args.crashes.iterdir()) - before)
        print(f"\nexecutions: {runs}  fuzzing time: {fuzz_seconds:.0f} s  ({runs / max(fuzz_seconds, 1):.0f} exec/s)"
              f"  wall time: {time.monotonic() - started:.0f} s  crashes found: {len(found)}")
        print("modes run (checks, and checks per second of the check itself): " + ", ".join(
            f"{mode} {count} ({count / max(seconds, 1e-9):.0f}/s)" for mode, (count, seconds) in sorted(modes.items()))
            if modes else "modes run: not recorded")
        for p in found:
            print(f"  {p}   (replay: {sys.executable} {__file__} --replay {p})")
        return 1 if found else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replay(paths, whole: bool) -> int:
    bad = 0
    for p in paths:
        data = Path(p).read_bytes()
        if whole:
            Path(p).with_name(Path(p).name + ".whole").write_bytes(to_whole(data))
        try:
            check_input(data)
            print(f"ok    {p}")
        except AssertionError as e:
            bad += 1
            print(f"FAIL  {p}\n{e}")
    shutil.rmtree(_workdir(None), ignore_errors=True)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=300, help="total time budget, the build included")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", type=Path, default=OUT / "corpus")
    ap.add_argument("--crashes", type=Path, default=OUT / "crashes")
    ap.add_argument("--replay", nargs="+", metavar="FILE", help="check these inputs with the normal build")
    ap.add_argument("--whole", action="store_true", help="with --replay: also write each input as FILE.whole")
    ap.add_argument("--write-hostile", type=Path, metavar="DIR", help="write the hand-made hostile inputs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.corpus, args.crashes = args.corpus.resolve(), args.crashes.resolve()
    if args.replay:
        return replay(args.replay, args.whole)
    if args.write_hostile:
        args.write_hostile.mkdir(parents=True, exist_ok=True)
        for name, data in hostile_inputs().items():
            (args.write_hostile / name).write_bytes(data)
        return 0
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())

"""The compiled pwal walk (walcore._scan.limestone_scan) against the pure-Python reference, on any bytes.

Both cores must give the same PwalScan, every field, findings included: on the real fixture files, hundreds of
damaged variants of them (seeded byte flips, truncations, zeroed ranges, inserted bytes), directories from
test_limestone_random's generator, and hostile inputs written here. The compiled walk is also held to
_scan_fast itself: it gives way to the exact walk (None) exactly where the pure fast walk does. Buffers of a
few bytes (_COMPILED_CHUNK patched) make entries straddle chunk ends and values run past whole chunks.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import struct
from pathlib import Path

import pytest

from conftest import LIMESTONE_FIXTURES, require_limestone
from limestone_model import durable_epoch_of
from test_limestone_random import generate, write_workload
from walcore import scancore
from walcore.limestone import scan
from walcore.limestone.pwal import ADD_STORAGE, CANCELED_HEADER, PUT, PUT_BLOB, REMOVE, SNIPPET_HEADER
from walcore.limestone.writer import put, remove, snippet_end, snippet_header, storage_op

CHUNKS = (25, 26, 64, 333, 4096, 256 << 10, 1 << 20)  # 25: the longest fixed part of an entry (a storage op)
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


@pytest.fixture(autouse=True)
def compiled_core():
    assert scancore.compiled() is not None or os.environ.get("WALVAULT_PURE") == "1", "walcore._scan is not built"
    if os.environ.get("WALVAULT_PURE") == "1":
        pytest.skip("WALVAULT_PURE=1: these tests compare the compiled core with the pure one")


def both_cores(monkeypatch, path: Path, durable_epoch: int, ctx: str = "") -> bool:
    """Asserts that scan_pwal and _scan_fast give the same on both cores; whether the fast walk took the file."""
    seen = {}
    for core in ("compiled", "pure"):
        if core == "pure":
            monkeypatch.setenv("WALVAULT_PURE", "1")
        fast = scan._scan_fast(path, durable_epoch)
        seen[core] = (dataclasses.asdict(scan.scan_pwal(path, durable_epoch)),
                      None if fast is None else dataclasses.asdict(fast))
    monkeypatch.delenv("WALVAULT_PURE")
    (compiled, compiled_fast), (pure, pure_fast) = seen["compiled"], seen["pure"]
    where = f"{ctx}: {path.name} at durable epoch {durable_epoch}"
    for name in pure:
        assert compiled[name] == pure[name], f"{where}: {name}: compiled {compiled[name]!r}, pure {pure[name]!r}"
    assert (compiled_fast is None) == (pure_fast is None), f"{where}: the fast walks disagree on giving way"
    assert compiled_fast == pure_fast, where
    return pure_fast is not None


def fixture_files() -> list[tuple[str, str]]:
    return sorted((d.name, p.name) for d in LIMESTONE_FIXTURES.iterdir() if d.is_dir()
                  for p in d.iterdir() if p.name.startswith("pwal_"))


# --------------------------------------------------------------------------- real and damaged files


@require_limestone
def test_fixture_files(monkeypatch):
    for d, name in fixture_files():
        root = LIMESTONE_FIXTURES / d
        for chunk in CHUNKS:
            monkeypatch.setattr(scan, "_COMPILED_CHUNK", chunk)
            for durable_epoch in (durable_epoch_of(root), 0, 2, U64):
                both_cores(monkeypatch, root / name, durable_epoch, f"{d}, chunk {chunk}")


def damage(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One damaged variant of data, and what was done."""
    n = len(data)
    at = rng.randrange(n + 1)
    kind = rng.choice(("flip", "truncate", "zero", "insert"))
    if kind == "flip":
        out = bytearray(data)
        flips = [rng.randrange(n) for _ in range(rng.choice((1, 1, 2, 3)))]
        for o in flips:  # a type value half the time, else any other byte
            out[o] = rng.randrange(12) if rng.random() < 0.5 else out[o] ^ rng.randint(1, 255)
        return f"flip at {flips}", bytes(out)
    if kind == "truncate":
        return f"truncate at {at}", data[:at]
    if kind == "zero":
        k = rng.choice((1, 8, 9, 17, rng.randint(1, 4096)))
        return f"zero {k} at {at}", data[:at] + bytes(len(data[at:at + k])) + data[at + k:]
    extra = rng.choice((bytes([rng.randrange(256)]), bytes(rng.randint(1, 16)), rng.randbytes(rng.randint(1, 16))))
    return f"insert {extra.hex()} at {at}", data[:at] + extra + data[at:]


@require_limestone
def test_damaged_fixture_files(monkeypatch, tmp_path):
    files = fixture_files()
    copies = {}
    took = gave_way = 0
    for i in range(1000):
        rng = random.Random(f"damage-{i}")
        d, name = rng.choice(files)
        if d not in copies:  # the directory too: its blob files are looked up
            copies[d] = shutil.copytree(LIMESTONE_FIXTURES / d, tmp_path / d)
        what, data = damage(rng, (LIMESTONE_FIXTURES / d / name).read_bytes())
        path = copies[d] / name
        path.chmod(0o644)
        path.write_bytes(data)
        chunk = rng.choice(CHUNKS)
        monkeypatch.setattr(scan, "_COMPILED_CHUNK", chunk)
        durable_epoch = rng.choice((durable_epoch_of(copies[d]), 0, rng.randrange(8), U64))
        if both_cores(monkeypatch, path, durable_epoch, f"variant {i}: {d}: {what}, chunk {chunk}"):
            took += 1
        else:
            gave_way += 1
        path.write_bytes((LIMESTONE_FIXTURES / d / name).read_bytes())
    assert took > 100 and gave_way > 100, (took, gave_way)  # both paths of the compiled walk are exercised


def test_generated_directories(monkeypatch, tmp_path):
    """test_limestone_random's workloads: every format version, blobs, canceled snippets, crashed tails, and
    values of 40..300 KB in the big ones (seeds 10, 15 and 19)."""
    for seed in range(60):
        root = tmp_path / f"log-{seed}"
        w, tags = generate(seed)
        write_workload(w, root)
        durable_epoch = durable_epoch_of(root)
        for path in sorted(root.glob("pwal_*")):
            for chunk in (25, 4096, scan._COMPILED_CHUNK):
                monkeypatch.setattr(scan, "_COMPILED_CHUNK", chunk)
                both_cores(monkeypatch, path, durable_epoch, f"seed {seed} {tags}, chunk {chunk}")


# --------------------------------------------------------------------------- hostile inputs


def session(epoch: int, *entries: bytes) -> bytes:
    return snippet_header(epoch) + b"".join(entries) + snippet_end(epoch)


def raw_put(key_len: int, value_len: int, kind: int = PUT) -> bytes:
    """A put's fixed part claiming these lengths, and nothing of the key and value."""
    return struct.pack("<BIIQ", kind, key_len, value_len, 1)


def write(tmp_path: Path, data: bytes, name: str = "pwal_0000") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_empty_file(monkeypatch, tmp_path):
    assert both_cores(monkeypatch, write(tmp_path, b""), 5)


@pytest.mark.parametrize("prefix", [b"", snippet_header(1), session(1, put(1, b"k", b"v", (1, 1)))],
                         ids=["alone", "after a header", "after a session"])
def test_one_byte_of_each_value(monkeypatch, tmp_path, prefix):
    for value in range(256):
        both_cores(monkeypatch, write(tmp_path, prefix + bytes([value])), 1, f"byte {value}")


@pytest.mark.parametrize("key_len,value_len", [(U32, U32), (U32, 0), (0, U32), (U32 - 32, 1), (1 << 31, 1 << 31)])
def test_lengths_near_2_to_the_32(monkeypatch, tmp_path, key_len, value_len):
    for kind in (PUT, PUT_BLOB):
        for tail in (b"", bytes(64), snippet_end(1)):
            data = snippet_header(1) + raw_put(key_len, value_len, kind) + tail
            assert not both_cores(monkeypatch, write(tmp_path, data), 1)
    data = snippet_header(1) + struct.pack("<BIQ", REMOVE, key_len, 1) + bytes(40)
    assert not both_cores(monkeypatch, write(tmp_path, data), 1)


def test_put_blob_with_a_huge_count(monkeypatch, tmp_path):
    for count in (U32, 1 << 31, 1 << 29, 1000):
        entry = put(1, b"k", b"v", (1, 1), (7,))
        entry = entry[:-12] + struct.pack("<I", count) + entry[-8:]  # the count says more ids than are there
        assert not both_cores(monkeypatch, write(tmp_path, session(1, entry)), 1, f"count {count}")


def test_every_chunk_size_on_a_small_file(monkeypatch, tmp_path):
    """Every chunk size from the smallest the walk takes to the whole file: every entry ends exactly at a chunk
    boundary once, every fixed part straddles one, and a put_blob's count lies past the buffer."""
    entries = [put(1, b"key", b"value" * 20, (1, 1)), remove(2, b"gone", (1, 2)), storage_op(ADD_STORAGE, 3, (1, 3)),
               put(1, b"b", b"x" * 300, (1, 4), (1, 2, 3)), put(1, b"", b"", (1, 5))]
    data = (session(1, *entries) + snippet_header(2, canceled=True) + b"".join(entries) + snippet_end(2)
            + session(9, *entries) + session(3, entries[3]) + snippet_header(U64 - 1, canceled=True) + snippet_end(0))
    path = write(tmp_path, data)
    (tmp_path / "blob" / "dir_01").mkdir(parents=True)
    (tmp_path / "blob" / "dir_01" / "0000000000000001.blob").write_bytes(b"blob")  # ids 2 and 3 are missing
    for chunk in range(25, len(data) + 2):
        monkeypatch.setattr(scan, "_COMPILED_CHUNK", chunk)
        assert both_cores(monkeypatch, path, 3, f"chunk {chunk}")
    result = scan.scan_pwal(path, 3)
    assert result.durable == {PUT: 2, REMOVE: 1, ADD_STORAGE: 1, PUT_BLOB: 2} and set(result.missing_blobs) == {2, 3}
    assert result.snippets == {"durable": 2, "nondurable": 1, "canceled": 2} and result.marks
    assert result.max_epoch == U64 - 1


def test_no_byte_past_the_buffer_or_the_size_is_read(tmp_path):
    """The walk of every prefix of a file's bytes gives the same whatever lies past the prefix in memory, and
    a walk told that the file is shorter than the buffer stops at that size (a file grown since its fstat)."""
    core = scancore.compiled()
    entries = [put(1, b"key", b"v" * 40, (1, 1), (U64, U64 - 1)), remove(2, b"gone", (1, 2)),
               storage_op(ADD_STORAGE, U64, (U64, U64))]
    data = session(U64 - 1, *entries) + snippet_header(U64, canceled=True) + b"".join(entries) + snippet_end(U64)
    path = write(tmp_path, data)
    with open(path, "rb") as f:
        for n in range(len(data) + 1):
            walks = [core.limestone_scan(f.fileno(), memoryview(data[:n] + bytes([fill]) * 32)[:n], 0, len(data),
                                         U64 - 1, None) for fill in (0x00, 0xFF)]
            assert walks[0] == walks[1], n
            assert core.limestone_scan(f.fileno(), data, 0, n, U64 - 1, None) == core.limestone_scan(
                f.fileno(), data[:n], 0, n, U64 - 1, None), n


def test_the_walk_called_directly(tmp_path):
    """limestone_scan's own contract: what it returns for a walk over two buffers, and how it refuses bad calls."""
    core = scancore.compiled()
    durable = session(1, put(1, b"k", b"v" * 100, (1, 1)))
    data = durable + snippet_header(5) + remove(1, b"k", (5, 1))
    path = write(tmp_path, data)
    with open(path, "rb") as f:
        fd = f.fileno()
        first = core.limestone_scan(fd, data[:30], 0, len(data), 2, None)
        at, state, entries, counts, snippets, epochs, nondurable, blob_puts = first
        assert at > 30 and entries == 2 and counts[PUT] == 1 and snippets == (1, 0) and epochs == (1, 1)
        assert nondurable == blob_puts == []
        rest = core.limestone_scan(fd, memoryview(bytearray(data))[at:], at, len(data), 2, state)
        assert rest[0] == len(data) and rest[2] == 3 and rest[5] == (5, 5) and rest[6] == [(len(durable), 5)]
        assert core.limestone_scan(fd, data[:5], 0, len(data), 2, None) is None  # no progress: a short read
        assert core.limestone_scan(fd, data, 0, len(data), -1, None) is None  # not a u64: the exact walk decides
        for bad in ([fd, data, -1, len(data), 2, None], [fd, data, 5, 4, 2, None], [fd, data, 0, 9, 2, 8],
                    [fd, data, 0, 9, 2, "x"], [fd, "text", 0, 9, 2, None], [fd, data, 0, 9, 2.0, None]):
            with pytest.raises((ValueError, TypeError)):
                core.limestone_scan(*bad)
    blob = put(1, b"k", b"v" * 100, (1, 1), (1,))  # its count lies past a 30-byte buffer: read from fd
    with pytest.raises(OSError):
        core.limestone_scan(-1, blob[:30], 9, 9 + len(blob), 1, 0)


def test_headers_without_data(monkeypatch, tmp_path):
    """Header kinds and epochs at the edges: epoch 0 and 2^64-1, durable epoch equal to them."""
    data = b"".join(snippet_header(e, canceled=kind == CANCELED_HEADER) + snippet_end(e)
                    for e in (0, U64, 1 << 63, 5) for kind in (SNIPPET_HEADER, CANCELED_HEADER))
    for durable_epoch in (0, 5, U64 - 1, U64):
        assert both_cores(monkeypatch, write(tmp_path, data), durable_epoch)

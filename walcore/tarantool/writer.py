"""Write Tarantool files that Tarantool itself reads: meta, plain and zstd blocks, EOF marker.

Used to make test and benchmark data of any size. Writes go to a temporary name and are
renamed into place after fsync, as every write of walvault's.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import msgpack

from ..fsutil import fsync_dir
from .block import EOF_MAGIC, ZSTD_THRESHOLD, FIXHEADER_SIZE, compress, encode_fixheader
from .meta import Vclock, encode_meta, vclock_sum
from .row import FLAGS, LSN, REPLICA_ID, SPACE_ID, TIMESTAMP, TSN, TYPE

_U64 = 1 << 64
INSERT, REPLACE = 2, 3


def encode_row(header: dict, body: dict | None, packer: msgpack.Packer | None = None) -> bytes:
    pack = (packer or msgpack.Packer()).pack
    return pack(header) + (pack(body) if body is not None else b"")


def dml_header(rtype: int, lsn: int, replica_id: int, *, tsn: int | None = None, commit: bool = True,
               timestamp: float = 1.7e9) -> dict:
    """A WAL row header as Tarantool writes it; tsn/commit only for multi-statement transactions."""
    header = {TYPE: rtype}
    if replica_id:
        header[REPLICA_ID] = replica_id
    header[LSN] = lsn
    header[TIMESTAMP] = timestamp
    if tsn is not None:
        header[TSN] = (lsn - tsn) % _U64
        if commit:
            header[FLAGS] = 1
    return header


class TarantoolWriter:
    """One file: `write_block` per write batch, `close()` seals it (with an EOF marker unless `eof=False`)."""

    def __init__(self, path, filetype: str, *, instance: str, vclock: Vclock | None,
                 prev_vclock: Vclock | None = None):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".walvault-tmp")
        self.f = open(self.tmp, "wb")
        self.f.write(encode_meta(filetype, instance=instance, vclock=vclock, prev_vclock=prev_vclock))
        self.packer = msgpack.Packer()

    def write_block(self, rows: list[tuple[dict, dict | None]], *, compressed: bool | None = None) -> None:
        """Write one block; compressed as Tarantool decides (>= 2048 bytes) unless told."""
        pack = self.packer.pack
        self.write_rows(b"".join(pack(h) + (pack(b) if b is not None else b"") for h, b in rows),
                        compressed=compressed)

    def write_rows(self, payload: bytes, *, compressed: bool | None = None) -> None:
        """Write one block of rows already encoded: another file's row bytes go in unchanged (a decode and
        re-encode could change them, e.g. msgpack str and bin)."""
        if compressed is None:
            compressed = len(payload) + FIXHEADER_SIZE >= ZSTD_THRESHOLD
        if compressed:
            payload = compress(payload)
        self.f.write(encode_fixheader(compressed, payload))
        self.f.write(payload)

    def write_raw(self, blocks: bytes) -> None:
        """Append whole blocks copied from another file: headers and (compressed) payloads as they are."""
        self.f.write(blocks)

    def abort(self) -> None:
        """Drop the unfinished file: only its temporary name ever existed."""
        self.f.close()
        self.tmp.unlink(missing_ok=True)

    def close(self, *, eof: bool = True) -> Path:
        if eof:
            self.f.write(EOF_MAGIC)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


def file_name(vclock: Vclock, suffix: str) -> str:
    return f"{vclock_sum(vclock):020d}.{suffix}"


def generate_wal(wal_dir, *, target_bytes: int, instance: str = "00000000-0000-4000-8000-0000000000aa",
                 seed: int = 1, file_bytes: int = 64 << 20, space_id: int = 512, open_last: bool = True,
                 snap_dir=None, shape: str = "mixed") -> list[Path]:
    """A synthetic but real-format workload: a snapshot and a chain of xlogs of about `target_bytes`.

    Rows are REPLACEs of tuples [id, str, int, str] into `space_id` with 8–400 byte strings. Blocks, by `shape`:
    "mixed", batches of 1–40 transactions (some multi-statement), so plain and zstd blocks mix; "one_row", one
    single-statement transaction each (a busy instance's typical log); "multi_row", one or two transactions of
    10–40 statements each, nearly all zstd-compressed. Returns the files written, oldest first.
    """
    txs_per_block, statements_per_tx = {
        "mixed": (lambda: rng.choice((1, 1, 2, 5, 20, 40)), lambda: rng.choice((1, 1, 1, 3))),
        "one_row": (lambda: 1, lambda: 1),
        "multi_row": (lambda: rng.choice((1, 2)), lambda: rng.randint(10, 40)),
    }[shape]
    rng = random.Random(seed)
    wal_dir = Path(wal_dir)
    snap_dir = Path(snap_dir) if snap_dir else wal_dir
    wal_dir.mkdir(parents=True, exist_ok=True)
    snap_dir.mkdir(parents=True, exist_ok=True)
    words = [rng.randbytes(200).hex() for _ in range(64)]
    written: list[Path] = []

    def tuple_for(key: int) -> list:
        text = words[key % 64][: rng.randint(8, 400)]
        return [key, text, rng.getrandbits(40), words[(key * 7) % 64][:24]]

    # A snapshot of the space as it starts: big blocks of INSERTs, always compressed.
    snap_rows = max(1000, target_bytes // 40 // 160)
    vclock: Vclock = {1: 0}
    with TarantoolWriter(snap_dir / file_name({1: snap_rows}, "snap"), "SNAP", instance=instance,
                         vclock={1: snap_rows}) as snap:
        batch, size = [], 0
        for i in range(snap_rows):
            header = {TYPE: INSERT, TIMESTAMP: 1.7e9} | ({LSN: i} if i else {})
            body = {SPACE_ID: space_id, 0x21: tuple_for(i)}
            batch.append((header, body))
            size += 220
            if size >= 128 << 10:
                snap.write_block(batch, compressed=True)
                batch, size = [], 0
        if batch:
            snap.write_block(batch, compressed=True)
    written.append(snap.path)
    vclock = {1: snap_rows}
    total = snap.path.stat().st_size
    prev: Vclock | None = None
    while total < target_bytes:
        start = dict(vclock)
        writer = TarantoolWriter(wal_dir / file_name(start, "xlog"), "XLOG", instance=instance, vclock=start,
                                 prev_vclock=prev)
        file_size = 0
        while file_size < file_bytes and total + file_size < target_bytes:
            rows = []
            for _ in range(txs_per_block()):
                statements = statements_per_tx()
                lsn0 = vclock[1] + 1
                for s in range(statements):
                    vclock[1] += 1
                    multi = statements > 1
                    header = dml_header(REPLACE, vclock[1], 1, tsn=lsn0 if multi else None,
                                        commit=s == statements - 1)
                    rows.append((header, {SPACE_ID: space_id, 0x21: tuple_for(rng.randrange(1 << 20))}))
            before = writer.f.tell()
            writer.write_block(rows)
            file_size += writer.f.tell() - before
        last = total + file_size >= target_bytes
        writer.close(eof=not (last and open_last))
        written.append(writer.path)
        total += writer.path.stat().st_size
        prev = start
    return written

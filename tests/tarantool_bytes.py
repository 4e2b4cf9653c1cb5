"""A small, independent reader of Tarantool's file framing (tarantool-files.md): the meta block's end,
the 19-byte block headers, the rows of a block. Tests compute their expected offsets with it, without
walcore's reader; `replace_payload` builds damaged copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgpack
import zstandard

from walcore.tarantool.block import encode_fixheader

ROW_MAGIC = b"\xd5\xba\x0b\xab"
ZROW_MAGIC = b"\xd5\xba\x0b\xba"
EOF_MAGIC = b"\xd5\x10\xad\xed"
HEADER = 19



def _uint(buf, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    width = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}[b]
    return int.from_bytes(buf[pos + 1:pos + 1 + width], "big"), pos + 1 + width


@dataclass(frozen=True)
class Blk:
    pos: int
    kind: str  # "rows" | "zstd" | "eof"
    length: int = 0  # payload bytes after the 19-byte header
    len_field: tuple[int, int] = (0, 0)  # [start, end) of the msgpack len in the file
    crc_field: tuple[int, int] = (0, 0)  # [start, end) of the msgpack crc32c

    @property
    def end(self) -> int:
        return self.pos + (4 if self.kind == "eof" else HEADER + self.length)

    @property
    def payload(self) -> tuple[int, int]:
        return self.pos + HEADER, self.end


@dataclass
class Framing:
    meta_size: int
    blocks: list[Blk]  # data blocks in file order
    eof: Blk | None

    @property
    def boundaries(self) -> set[int]:
        """Offsets where a cut leaves only whole blocks."""
        return {self.meta_size} | {b.end for b in self.blocks}

    def significant(self, pos: int) -> bool:
        """Whether a byte carries information Tarantool checks (all but crc32p and the header padding)."""
        if self.eof and self.eof.pos <= pos < self.eof.end:
            return True
        for b in self.blocks:
            if b.pos <= pos < b.end:
                return (pos < b.pos + 4 or b.len_field[0] <= pos < b.len_field[1]
                        or b.crc_field[0] <= pos < b.crc_field[1] or pos >= b.pos + HEADER)
        return False

    def padding_content(self, pos: int) -> bool:
        """Whether a byte is inside the string that pads a block header to 19 bytes, past its type byte:
        what it holds, Tarantool never looks at (xlog_fixheader_decode only checks the string's length)."""
        return any(b.crc_field[1] < pos < b.pos + HEADER for b in self.blocks)


def meta_size(data: bytes) -> int:
    return data.index(b"\n\n") + 2


def framing(data: bytes) -> Framing:
    """Walk an undamaged file's blocks."""
    pos = meta_size(data)
    start = pos
    blocks = []
    while pos < len(data):
        magic = data[pos:pos + 4]
        if magic == EOF_MAGIC:
            assert pos + 4 == len(data)
            return Framing(start, blocks, Blk(pos, "eof"))
        assert magic in (ROW_MAGIC, ZROW_MAGIC), f"no block magic at {pos}"
        length, p = _uint(data, pos + 4)
        len_field = (pos + 4, p)
        _crc32p, p = _uint(data, p)
        c0 = p
        _crc, p = _uint(data, p)
        blocks.append(Blk(pos, "zstd" if magic == ZROW_MAGIC else "rows", length, len_field, (c0, p)))
        pos += HEADER + length
    assert pos == len(data)
    return Framing(start, blocks, None)


def block_rows(data: bytes, blk: Blk) -> bytes:
    payload = data[blk.payload[0]:blk.payload[1]]
    if blk.kind == "zstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(payload)
    return payload


@dataclass
class RawRow:
    offset: int  # in the block's rows
    header: dict
    body_offset: int
    body: dict | None
    raw: bytes


def split_rows(rows: bytes) -> list[RawRow]:
    """A block's rows: header map, then a body map unless the row is a NOP or the block ends."""
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False)
    unpacker.feed(rows)
    out = []
    pos = 0
    while pos < len(rows):
        header = unpacker.unpack()
        body_pos = unpacker.tell()
        body = None
        if header.get(0) != 12 and body_pos < len(rows):
            body = unpacker.unpack()
        end = unpacker.tell()
        out.append(RawRow(pos, header, body_pos, body, rows[pos:end]))
        pos = end
    return out


def count_rows(data: bytes, blocks) -> int:
    return sum(len(split_rows(block_rows(data, b))) for b in blocks)


def replace_payload(data: bytes, blk: Blk, rows_or_payload: bytes, *, compressed: bool | None = None,
                    raw: bool = False) -> bytes:
    """A copy of data with blk's payload replaced (CRC recomputed); `raw` keeps the bytes as the payload."""
    compressed = blk.kind == "zstd" if compressed is None else compressed
    payload = rows_or_payload
    if compressed and not raw:
        payload = zstandard.ZstdCompressor(level=3, write_content_size=False,
                                           write_checksum=False).compress(rows_or_payload)
    return data[:blk.pos] + encode_fixheader(compressed, payload) + payload + data[blk.end:]


def tear_newest_xlog(src: Path) -> tuple[str, bytes]:
    """Make the newest xlog end inside a block, as a copy taken while Tarantool writes one does: the first half of
    a block (the newest xlog's last, or an older one's when it holds none) appended after its last whole one.
    Returns its name and the bytes it holds up to there."""
    xlogs = sorted(src.rglob("*.xlog"))
    whole = xlogs[-1].read_bytes().removesuffix(EOF_MAGIC)  # a crash leaves no EOF marker
    data, last = next((d, f.blocks[-1]) for d in (p.read_bytes() for p in reversed(xlogs))
                      if (f := framing(d.removesuffix(EOF_MAGIC))).blocks)
    xlogs[-1].write_bytes(whole + data[last.pos:last.pos + HEADER + last.length // 2])
    return xlogs[-1].relative_to(src).as_posix(), whole

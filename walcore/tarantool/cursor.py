"""Stepping through a file's blocks, one cursor for every reader (xlog.c's xlog_cursor): file -> block -> rows.

The cursor reads any binary file object (an open file, or io.BytesIO over bytes in memory) and stops at each
block: `next()` reads what starts at its position and says what it is, `read_block()` reads that block's
payload, checks it and returns its rows' bytes (decompressed), which row.py steps through. It decides
nothing about damage: each reader words and handles what it finds in its own way.
"""

from __future__ import annotations

from .block import EOF_MAGIC, FIXHEADER_SIZE, BlockError, decompress, parse_fixheader, tarantool_crc32c

# What next() found at the cursor's position.
BLOCK = "block"  # a block's fixed header: compressed, length and crc are its, end is just past its payload
EOF_MARKER = "eof marker"  # the EOF marker: end is just past it
SHORT = "short"  # fewer bytes than a fixed header, maybe none: end is just past those there are


class CrcMismatch(BlockError):
    """A block's payload is cut short or fails its CRC."""


class BlockCursor:
    """The blocks of a file object from `pos` on. `pos` is where the block last found starts, `end` where
    the next one does; the file object is read and sought only through the cursor once it is made."""

    __slots__ = ("f", "pos", "end", "compressed", "length", "crc", "_at", "_read")

    def __init__(self, f, pos: int):
        self.f = f
        self.pos = self.end = pos
        self.compressed = False
        self.length = self.crc = 0
        self._at = None  # where the file object is, when the cursor knows: else next() seeks
        self._read = f.read

    def seek(self, pos: int) -> None:
        """Go on from `pos` (after damage, or blocks another reader took)."""
        self.pos = self.end = pos

    def next(self) -> str:
        """Read what starts at `end`: BLOCK, EOF_MARKER or SHORT. BlockError for a malformed fixed header."""
        pos = self.pos = self.end
        if self._at != pos:
            self.f.seek(pos)
        head = self._read(FIXHEADER_SIZE)
        at = self._at = pos + len(head)
        if head[:4] == EOF_MAGIC:
            self.end = pos + 4
            return EOF_MARKER
        if at - pos < FIXHEADER_SIZE:
            self.end = at
            return SHORT
        self.compressed, length, self.crc = parse_fixheader(head)
        self.length = length
        self.end = at + length
        return BLOCK

    def read_block(self):
        """The rows' bytes of the block next() found, decompressed when it is zstd. CrcMismatch when its
        payload is cut short or fails its CRC, BlockError "zstd_error" when its zstd frame is damaged."""
        length = self.length
        payload = self._read(length)
        self._at += len(payload)
        if len(payload) != length or tarantool_crc32c(payload) != self.crc:
            raise CrcMismatch("crc_mismatch", f"block of {length} bytes: stored crc32c {self.crc:#010x}, "
                                             f"computed {tarantool_crc32c(payload):#010x}")
        return decompress(payload) if self.compressed else payload

"""Blocks: the 19-byte fixed header, the Tarantool CRC-32C, zstd payloads (xlog.c: xlog_fixheader_*)."""

from __future__ import annotations

import struct
import threading

import zstandard

from ..scancore import compiled

FIXHEADER_SIZE = 19
ROW_MAGIC = b"\xd5\xba\x0b\xab"
ZROW_MAGIC = b"\xd5\xba\x0b\xba"
EOF_MAGIC = b"\xd5\x10\xad\xed"
# Every block magic starts with these bytes; used to find the next block after damage.
MAGIC_PREFIX = b"\xd5\xba\x0b"
# Tarantool compresses a batch when rows + fixed header reach this many bytes (xlog.c).
ZSTD_THRESHOLD = 2048
# Larger than any block Tarantool writes (a transaction is bounded by memory); a bigger `len` is damage.
MAX_BLOCK_SIZE = 1 << 31


class BlockError(ValueError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def tarantool_crc32c(data) -> int:
    """CRC-32C with init 0 and no final XOR, as Tarantool computes it (not the standard crc32c): the compiled scan
    core's, else the crc32c package's (the pure-Python reference's)."""
    core = compiled()
    if core is not None:
        return core.tarantool_crc32c(data)
    return _crc32c(data, 0xFFFFFFFF) ^ 0xFFFFFFFF


def _import_crc32c(data, value: int) -> int:
    # The crc32c package is imported on first use: its import (importlib.metadata) took 30 ms of a command's
    # start-up, and the compiled scan core has a CRC of its own.
    global _crc32c
    from crc32c import crc32c as _crc32c

    return _crc32c(data, value)


_crc32c = _import_crc32c


def _mp_uint(buf, pos: int) -> tuple[int, int]:
    """A msgpack unsigned int of any width at buf[pos]; returns (value, next position)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    if b == 0xCC:
        return buf[pos + 1], pos + 2
    if b == 0xCD:
        return struct.unpack_from(">H", buf, pos + 1)[0], pos + 3
    if b == 0xCE:
        return struct.unpack_from(">I", buf, pos + 1)[0], pos + 5
    if b == 0xCF:
        return struct.unpack_from(">Q", buf, pos + 1)[0], pos + 9
    raise BlockError("bad_fixheader", f"byte 0x{b:02x} at header byte {pos} is not a msgpack unsigned int")


def parse_fixheader(header) -> tuple[bool, int, int]:
    """Decode a 19-byte block header whose magic is ROW_MAGIC or ZROW_MAGIC.

    Returns (compressed, len, crc32c). Raises BlockError on any malformed part.
    """
    magic = header[:4]
    if magic == ROW_MAGIC:
        compressed = False
    elif magic == ZROW_MAGIC:
        compressed = True
    else:
        raise BlockError("bad_magic", f"bytes {bytes(magic).hex()} are not a block magic")
    # The layouts Tarantool writes (len of any width, crc32p 0, a 4-byte crc32c) without the general walk.
    b = header[4]
    if b < 0x80:
        length, pos = b, 5
    elif b == 0xCD:
        length, pos = (header[5] << 8) | header[6], 7
    elif b == 0xCE:
        length, pos = int.from_bytes(header[5:9], "big"), 9
    else:
        pos = 0
    if pos and header[pos] == 0 and header[pos + 1] == 0xCE and header[pos + 6] == 0xA0 + 12 - pos \
            and 0 < length <= MAX_BLOCK_SIZE:
        return compressed, length, int.from_bytes(header[pos + 2:pos + 6], "big")
    return compressed, *_parse_fixheader_fields(header)


def _parse_fixheader_fields(header) -> tuple[int, int]:
    try:
        length, pos = _mp_uint(header, 4)
        _crc32p, pos = _mp_uint(header, pos)
        crc, pos = _mp_uint(header, pos)
    except (IndexError, struct.error):  # a byte, or a wide int's bytes, past the header's end
        raise BlockError("bad_fixheader", "msgpack integers run past the 19-byte block header") from None
    if pos < FIXHEADER_SIZE:
        b = header[pos]
        if 0xA0 <= b <= 0xBF:
            pad_end = pos + 1 + (b & 0x1F)
        elif b == 0xD9 and pos + 1 < FIXHEADER_SIZE:
            pad_end = pos + 2 + header[pos + 1]
        else:
            raise BlockError("bad_fixheader", f"block header padding at byte {pos} is not a msgpack string")
        if pad_end != FIXHEADER_SIZE:
            raise BlockError("bad_fixheader", f"block header padding ends at byte {pad_end}, not {FIXHEADER_SIZE}")
    elif pos > FIXHEADER_SIZE:
        raise BlockError("bad_fixheader", "msgpack integers run past the 19-byte block header")
    if crc > 0xFFFFFFFF:
        raise BlockError("bad_fixheader", f"crc32c {crc} does not fit 32 bits")
    if length == 0 or length > MAX_BLOCK_SIZE:
        raise BlockError("bad_fixheader", f"block length {length} is impossible")
    return length, crc


def encode_fixheader(compressed: bool, payload) -> bytes:
    """The header Tarantool writes: shortest-width msgpack ints, then a fixstr of zeros up to 19 bytes."""
    out = bytearray(ZROW_MAGIC if compressed else ROW_MAGIC)
    for value in (len(payload), 0, tarantool_crc32c(payload)):
        if value < 0x80:
            out.append(value)
        elif value < 0x100:
            out += b"\xcc" + value.to_bytes(1, "big")
        elif value < 0x10000:
            out += b"\xcd" + value.to_bytes(2, "big")
        else:
            out += b"\xce" + value.to_bytes(4, "big")
    padding = FIXHEADER_SIZE - len(out) - 1
    out.append(0xA0 + padding)
    out += bytes(padding)
    return bytes(out)


# One (de)compressor per thread: zstandard's objects must not be used by two threads at once (it crashes the
# process). Archive and backup run verification and row-time reads on threads.
_local = threading.local()


def _zstd(kind: str):
    obj = getattr(_local, kind, None)
    if obj is None:
        obj = zstandard.ZstdDecompressor() if kind == "d" else zstandard.ZstdCompressor(
            level=3, write_content_size=False, write_checksum=False)
        setattr(_local, kind, obj)
    return obj


def decompress(payload) -> bytes:
    """Decompress a zstd block. Tarantool's frames carry no content size, so a streaming object is needed."""
    dobj = _zstd("d").decompressobj()
    try:
        data = dobj.decompress(payload)
    except zstandard.ZstdError as e:
        raise BlockError("zstd_error", f"zstd frame is corrupt: {e}") from None
    if not dobj.eof:
        raise BlockError("zstd_error", "zstd frame ends before its last block")
    if dobj.unused_data:
        raise BlockError("zstd_error", f"{len(dobj.unused_data)} bytes follow the zstd frame")
    return data


def compress(payload) -> bytes:
    """zstd level 3 without content size or checksum, as Tarantool writes it."""
    return _zstd("c").compress(payload)

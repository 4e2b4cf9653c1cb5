"""BlockCursor over bytes in memory: what it finds at each position, and what it reads of a block."""

from __future__ import annotations

import io

import pytest

from walcore.tarantool.block import EOF_MAGIC, FIXHEADER_SIZE, BlockError, compress, encode_fixheader
from walcore.tarantool.cursor import BLOCK, EOF_MARKER, SHORT, BlockCursor, CrcMismatch

PLAIN = b"plain rows" * 3
PACKED = b"packed rows" * 300


def _block(rows: bytes, compressed: bool) -> bytes:
    payload = compress(rows) if compressed else rows
    return encode_fixheader(compressed, payload) + payload


def test_steps_through_blocks_with_and_without_reading_them():
    data = b"meta" + _block(PLAIN, False) + _block(PACKED, True) + _block(PLAIN, False) + EOF_MAGIC
    cursor = BlockCursor(io.BytesIO(data), 4)
    assert cursor.next() is BLOCK
    assert (cursor.pos, cursor.compressed, cursor.length, cursor.end) == (4, False, len(PLAIN),
                                                                          4 + FIXHEADER_SIZE + len(PLAIN))
    assert cursor.read_block() == PLAIN
    assert cursor.next() is BLOCK and cursor.compressed
    assert cursor.read_block() == PACKED
    assert cursor.next() is BLOCK  # its payload left unread: the next call still finds the EOF marker
    last = cursor.pos
    assert cursor.next() is EOF_MARKER
    assert (cursor.pos, cursor.end) == (last + FIXHEADER_SIZE + len(PLAIN), len(data))
    cursor.seek(last)
    assert cursor.next() is BLOCK and cursor.read_block() == PLAIN


def test_short_header_and_damaged_payloads():
    block = _block(PLAIN, False)
    cursor = BlockCursor(io.BytesIO(block[:10]), 0)
    assert cursor.next() is SHORT and cursor.end == 10
    cursor = BlockCursor(io.BytesIO(b""), 0)
    assert cursor.next() is SHORT and cursor.end == 0

    for damaged in (block[:-1] + b"\x00", block[:-1]):  # a changed byte, a cut-off payload
        cursor = BlockCursor(io.BytesIO(damaged), 0)
        assert cursor.next() is BLOCK
        with pytest.raises(BlockError) as e:
            cursor.read_block()
        assert isinstance(e.value, CrcMismatch) and e.value.code == "crc_mismatch"
        assert str(e.value).startswith(f"block of {len(PLAIN)} bytes: stored crc32c ")

    payload = b"\x28\xb5\x2f\xfd" + bytes(20)  # a zstd magic, then nothing that decodes
    cursor = BlockCursor(io.BytesIO(encode_fixheader(True, payload) + payload), 0)
    assert cursor.next() is BLOCK
    with pytest.raises(BlockError) as e:
        cursor.read_block()
    assert e.value.code == "zstd_error"

    cursor = BlockCursor(io.BytesIO(b"\xd5\xba\x0b\xab" + bytes(15)), 0)
    with pytest.raises(BlockError) as e:
        cursor.next()
    assert e.value.code == "bad_fixheader"

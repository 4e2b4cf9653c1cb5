"""The envelope of an encrypted repository's objects (walcore/repository/envelope.py), without I/O: every plaintext
comes back whole whatever the pieces it is read in, and every change to the stored bytes fails — a flipped bit
anywhere, a cut, chunks reordered or dropped, a header moved under another name, another keyring — both when opened
with the key and when only the stored bytes' CRC32C is checked."""

from __future__ import annotations

import os

import pytest

from walcore.repository.encrypted import plain_size
from walcore.repository.envelope import (CHUNK, HEADER_BYTES, TAG_BYTES, TRAILER_BYTES, Keyring, Unauthentic,
                                         WrongKey, check_stored, seal, unseal)

NAME = "tarantool/inst/backups/20260101-000000F/wal/00000000000000000000.xlog.zst"
KEK_ID, KEK = b"k" * 8, bytes(range(32))
SMALL = 64  # a small chunk size: many chunks from few bytes


def _sealed(data: bytes, chunk: int = SMALL, name: str = NAME) -> bytes:
    return b"".join(seal([data], name, KEK_ID, KEK, chunk=chunk))


def _opened(stored: bytes, name: str = NAME, keyring=None, step: int | None = None) -> bytes:
    pieces = [stored] if step is None else [stored[i:i + step] for i in range(0, len(stored), step)]
    return b"".join(unseal(pieces, name, keyring or {KEK_ID: KEK}))


def _fails(stored: bytes, name: str = NAME) -> None:
    with pytest.raises(Unauthentic) as opened:
        _opened(stored, name)
    assert name in str(opened.value)


@pytest.mark.parametrize("size", [0, 1, SMALL - 1, SMALL, SMALL + 1, 3 * SMALL, 5 * SMALL + 7])
def test_any_size_comes_back_whole_in_any_pieces(size):
    data = os.urandom(size)
    pieces = [data[i:i + 5] for i in range(0, size, 5)]
    stored = b"".join(seal(pieces, NAME, KEK_ID, KEK, chunk=SMALL))
    assert len(stored) == HEADER_BYTES + max(1, -(-size // SMALL)) * TAG_BYTES + size + TRAILER_BYTES
    assert plain_size(len(stored), SMALL) == size
    for step in (None, 1, 7, SMALL + TAG_BYTES, 1000):
        assert _opened(stored, step=step) == data
    check_stored([stored[i:i + 3] for i in range(0, len(stored), 3)], NAME)


@pytest.mark.parametrize("size", [0, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK])
def test_the_default_chunk_size_and_the_plaintext_size_agree(size):
    data = os.urandom(size)
    stored = b"".join(seal([data[i:i + 100_000] for i in range(0, size, 100_000)], NAME, KEK_ID, KEK))
    assert plain_size(len(stored)) == size
    assert b"".join(unseal([stored[i:i + 300_000] for i in range(0, len(stored), 300_000)], NAME,
                           {KEK_ID: KEK})) == data


def test_a_flipped_bit_anywhere_fails_with_the_key_and_without():
    stored = _sealed(os.urandom(3 * SMALL + 5))
    for at in range(len(stored)):
        for bit in (0x01, 0x80):
            damaged = bytearray(stored)
            damaged[at] ^= bit
            _fails(bytes(damaged))
            with pytest.raises(Unauthentic):
                check_stored([bytes(damaged)], NAME)


def test_a_cut_anywhere_fails():
    stored = _sealed(os.urandom(3 * SMALL + 5))
    for length in range(len(stored)):
        _fails(stored[:length])
        with pytest.raises(Unauthentic):
            check_stored([stored[:length]], NAME)


def _chunks(stored: bytes) -> tuple[bytes, list[bytes], bytes]:
    body = stored[HEADER_BYTES:-TRAILER_BYTES]
    full = SMALL + TAG_BYTES
    return stored[:HEADER_BYTES], [body[i:i + full] for i in range(0, len(body), full)], stored[-TRAILER_BYTES:]


def test_chunks_reordered_or_dropped_fail_even_with_a_matching_trailer():
    from crc32c import crc32c

    from walcore.repository.envelope import TRAILER_MAGIC

    header, chunks, _trailer = _chunks(_sealed(os.urandom(4 * SMALL + 9)))
    for changed in ([chunks[1], chunks[0], *chunks[2:]],  # two swapped
                    chunks[:-1],  # the last chunk dropped: the one before is no last chunk
                    [*chunks[:2], chunks[-1]],  # chunks from the middle dropped
                    [*chunks, chunks[-1]]):  # one repeated
        body = header + b"".join(changed)
        forged = body + TRAILER_MAGIC + crc32c(body).to_bytes(4, "big")  # the trailer needs no key: forged at will
        check_stored([forged], NAME)
        _fails(forged)


def test_an_object_moved_under_another_name_fails():
    stored = _sealed(b"the manifest of one backup")
    _fails(stored, NAME.replace("20260101", "20260102"))


def test_another_keyring_or_a_missing_key_fails_and_names_the_object():
    stored = _sealed(b"data")
    for keyring in ({b"x" * 8: KEK}, {KEK_ID: os.urandom(32)}):
        with pytest.raises(Unauthentic, match=NAME):
            _opened(stored, keyring=keyring)


def test_the_key_file_opens_with_its_passphrase_only_and_says_nothing_of_it():
    ring = Keyring.new()
    data = ring.key_file("first passphrase", {"n": 1 << 10, "r": 8, "p": 1})
    assert b"first passphrase" not in data and ring.keys[0][1] not in data
    assert Keyring.open(data, "first passphrase").keys == ring.keys
    with pytest.raises(WrongKey) as wrong:
        Keyring.open(data, "first passphrasf")
    assert "passphras" not in str(wrong.value)
    with pytest.raises(ValueError, match="not a walvault key file"):
        Keyring.open(data[:-20], "first passphrase")
    sealed_at = data.index(b'"sealed": "') + 20  # a damaged keyring is told from a wrong key: its checksum
    damaged = data[:sealed_at] + (b"A" if data[sealed_at:sealed_at + 1] != b"A" else b"B") + data[sealed_at + 1:]
    with pytest.raises(ValueError, match="checksum") as told:
        Keyring.open(damaged, "first passphrase")
    assert not isinstance(told.value, WrongKey)


def test_a_rotated_keyring_keeps_every_key_and_adds_the_newest():
    ring = Keyring.new()
    stored = b"".join(seal([b"old"], NAME, *ring.newest))
    rotated = Keyring.open(ring.added().key_file("new", {"n": 1 << 10, "r": 8, "p": 1}), "new")
    assert rotated.keys[:1] == ring.keys and len(rotated.keys) == 2
    assert b"".join(unseal([stored], NAME, rotated.by_id)) == b"old"
    newer = b"".join(seal([b"new"], NAME, *rotated.newest))
    assert b"".join(unseal([newer], NAME, rotated.by_id)) == b"new"
    with pytest.raises(Unauthentic):
        b"".join(unseal([newer], NAME, ring.by_id))


def test_an_object_of_envelope_format_1_is_named_as_such():
    stored = bytearray(_sealed(b"written before the CRC32C trailer"))
    stored[:8] = b"WVENC\x00\x01\x00"
    with pytest.raises(Unauthentic, match="envelope format 1"):
        _opened(bytes(stored))

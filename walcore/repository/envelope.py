"""Encryption at rest, without I/O: plaintext chunks into an object's envelope bytes and back, and the repository's
key file (a passphrase stretched by scrypt opens a keyring of key-encryption keys).

An object's envelope (every number big-endian):

    header   MAGIC (8) | chunk size (4) | KEK id (8) | wrap nonce (12) | the object's data key, AES-256-GCM (48)
    chunks   AES-256-GCM under the data key, each of `chunk size` plaintext bytes but the last (0..chunk size);
             nonce = chunk counter (11) | 1 for the last chunk, else 0 (the STREAM construction: a chunk moved,
             dropped or cut short, or a dropped tail, fails); AAD = the header
    trailer  TRAILER_MAGIC (4) | CRC32C of every byte before it: checked without the key (`check_stored`), which
             finds damage (bit rot, a cut copy) without authenticating anything; the key's GCM tags authenticate

The data key is wrapped under the KEK with AAD = the header's first fields and the object's repository-relative
name, so an object moved under another name fails to open. A key-encryption key never leaves the keyring, which is
stored AES-256-GCM under the repository key that scrypt derives from the passphrase.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import struct
from collections.abc import Iterable, Iterator


MAGIC = b"WVENC\x00\x02\x00"  # envelope format 2: the CRC32C trailer (format 1's SHA-256 cost 4% of a backup)
_MAGIC_1 = b"WVENC\x00\x01\x00"  # named when met, never read
TRAILER_MAGIC = b"WVT2"
CHUNK = 1 << 20
KEY_BYTES, NONCE_BYTES, TAG_BYTES, ID_BYTES = 32, 12, 16, 8
_FIXED = struct.Struct(">8sI8s")
HEADER_BYTES = _FIXED.size + NONCE_BYTES + KEY_BYTES + TAG_BYTES
TRAILER_BYTES = len(TRAILER_MAGIC) + 4
# scrypt at 2**15 x 8: 32 MiB and about 0.1 s per derivation (once per command); the key file holds what it used.
SCRYPT = {"n": 1 << 15, "r": 8, "p": 1}
# What a key file read may ask for (its parameters are in clear, its checksum no secret: a writer of the storage could
# raise them): up to 32 times SCRYPT's work, 1 GiB at most, beyond which deriving is a denial of service.
SCRYPT_MAX = {"n": 1 << 20, "r": 32, "p": 16}
KEYFILE_FORMAT = 1
_KEYRING_AAD = b"walvault keyring 1"


class Unauthentic(ValueError):
    """Bytes that do not open: damaged, cut short, reordered, moved under another name, or a wrong key."""


class WrongKey(ValueError):
    """The passphrase does not open the key file (nothing about the key is said)."""


class InvalidTag(Exception):
    """A GCM tag that does not authenticate its ciphertext (cryptography's, raised as ours)."""


# cryptography and crc32c are imported on first use: a command on a plain repository needs neither, and their
# imports (crc32c's reads importlib.metadata) took 50 ms of every command's start.
def crc32c(data, value: int = 0) -> int:
    from crc32c import crc32c as compute

    return compute(data, value)


# AES-256-GCM through the streaming cipher API into one buffer: the same bytes as `AESGCM` gives (ciphertext, then
# the 16-byte tag), at 3.5 times its speed on 1 MiB chunks here (AESGCM.encrypt: 0.6 GB/s of CPU; this: 2.1).


def _encrypt(key: bytes, nonce: bytes, data: bytes, aad: bytes) -> bytearray:
    """Ciphertext and tag, in the buffer they were written into (not copied again: it only goes to storage)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    cipher = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    cipher.authenticate_additional_data(aad)
    out = bytearray(len(data) + TAG_BYTES)  # update_into wants room for a block more than the data: the tag's
    size = cipher.update_into(data, out)
    cipher.finalize()
    out[size:] = cipher.tag
    return out


def _decrypt(key: bytes, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext of `sealed` (ciphertext and tag); InvalidTag when it does not authenticate."""
    import cryptography.exceptions
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if len(sealed) < TAG_BYTES:
        raise InvalidTag
    view = memoryview(sealed)
    cipher = Cipher(algorithms.AES(key), modes.GCM(nonce, bytes(view[-TAG_BYTES:]))).decryptor()
    cipher.authenticate_additional_data(aad)
    out = bytearray(len(sealed))
    size = cipher.update_into(view[:-TAG_BYTES], out)
    try:
        cipher.finalize()  # checks the tag: nothing is returned before
    except cryptography.exceptions.InvalidTag:
        raise InvalidTag from None
    return bytes(memoryview(out)[:size])


def _nonce(counter: int, last: bool) -> bytes:
    return counter.to_bytes(NONCE_BYTES - 1, "big") + (b"\x01" if last else b"\x00")


def _wrap_aad(fixed: bytes, name: str) -> bytes:
    return fixed + name.encode()


def seal(chunks: Iterable[bytes], name: str, kek_id: bytes, kek: bytes, chunk: int = CHUNK) -> Iterator[bytes]:
    """The envelope of the plaintext `chunks` for the object `name`, in pieces of bounded size."""
    dek = os.urandom(KEY_BYTES)
    fixed = _FIXED.pack(MAGIC, chunk, kek_id)
    wrap_nonce = os.urandom(NONCE_BYTES)
    header = fixed + wrap_nonce + bytes(_encrypt(kek, wrap_nonce, dek, _wrap_aad(fixed, name)))
    check = crc32c(header)
    yield header
    counter, held = 0, None
    for block in _blocks(chunks, chunk):
        if held is not None:  # a chunk goes out once another follows: the last one carries the last-chunk flag
            out = _encrypt(dek, _nonce(counter, False), held, header)
            counter += 1
            check = crc32c(out, check)
            yield out
        held = block
    out = _encrypt(dek, _nonce(counter, True), held or b"", header)
    yield bytes(out + _trailer(crc32c(out, check)))


def _trailer(check: int) -> bytes:
    return TRAILER_MAGIC + check.to_bytes(4, "big")


def _blocks(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The bytes of `pieces` regrouped in blocks of `size`, the last one shorter (none for no bytes)."""
    held, count = [], 0
    for piece in pieces:
        view = memoryview(piece)
        while view:
            take = view[:size - count]
            held.append(take)
            count += len(take)
            view = view[len(take):]
            if count == size:
                yield b"".join(held)
                held, count = [], 0
    if count:
        yield b"".join(held)


def _parse_header(header: bytes, name: str) -> tuple[int, bytes, bytes, bytes]:
    if len(header) < HEADER_BYTES:
        raise Unauthentic(f"{name}: cut short (no whole encryption header)")
    magic, chunk, kek_id = _FIXED.unpack_from(header)
    if magic == _MAGIC_1:
        raise Unauthentic(f"{name}: envelope format 1 (a SHA-256 trailer), written by an unreleased walvault before "
                          "2026-11-28, is not read: back up into a new repository")
    if magic != MAGIC or not 0 < chunk <= 64 << 20:
        raise Unauthentic(f"{name}: not an object of an encrypted walvault repository (no encryption header)")
    return chunk, kek_id, header[_FIXED.size:_FIXED.size + NONCE_BYTES], header[_FIXED.size + NONCE_BYTES:]


def kek_of(header: bytes, name: str) -> bytes:
    """The id of the key-encryption key that wraps the object's data key."""
    return _parse_header(header, name)[1]


def unseal(pieces: Iterable[bytes], name: str, keyring: dict[bytes, bytes]) -> Iterator[bytes]:
    """The plaintext of the envelope `pieces` of the object `name`, each chunk authenticated before it is given;
    Unauthentic when anything does not hold (after what was good: a reader trusts nothing before the end)."""
    it = iter(pieces)
    head = bytearray()
    for piece in it:
        head += piece
        if len(head) >= HEADER_BYTES:
            break
    header, first = bytes(head[:HEADER_BYTES]), bytes(head[HEADER_BYTES:])
    chunk, kek_id, wrap_nonce, wrapped = _parse_header(header, name)
    kek = keyring.get(kek_id)
    if kek is None:
        raise Unauthentic(f"{name}: its data key is wrapped by a key the repository's keyring does not hold")
    try:
        dek = _decrypt(kek, wrap_nonce, wrapped, _wrap_aad(header[:_FIXED.size], name))
    except InvalidTag:
        raise Unauthentic(f"{name}: its encryption header does not authenticate (damaged, or moved from another "
                          "name)") from None
    check = crc32c(header)
    counter = 0

    def open_chunk(data: bytes, last: bool) -> bytes:
        try:
            return _decrypt(dek, _nonce(counter, last), data, header)
        except InvalidTag:
            raise Unauthentic(f"{name}: chunk {counter} does not authenticate (damaged, reordered, or cut short)") \
                from None

    # The rest in blocks of one sealed chunk: a block is a chunk but the last once more than a trailer follows it;
    # only the final block can be shorter, and it joins the one before (the last chunk and the trailer).
    held = b""
    for block in _blocks(itertools.chain([first], it), chunk + TAG_BYTES):
        if held and len(block) > TRAILER_BYTES:
            check = crc32c(held, check)
            yield open_chunk(held, False)
            counter += 1
            held = block
        else:
            held += block
    if len(held) < TAG_BYTES + TRAILER_BYTES:
        raise Unauthentic(f"{name}: cut short (no last chunk and trailer)")
    data, trailer = held[:-TRAILER_BYTES], held[-TRAILER_BYTES:]
    plain = open_chunk(data, True)
    if trailer != _trailer(crc32c(data, check)):
        raise Unauthentic(f"{name}: its trailer does not match its stored bytes")
    yield plain


def check_stored(pieces: Iterable[bytes], name: str) -> None:
    """Without the key: the stored bytes match their trailer's CRC32C (Unauthentic when not)."""
    check, tail = 0, b""
    for block in _blocks(pieces, CHUNK):
        both = tail + block if tail else block
        check = crc32c(memoryview(both)[:-TRAILER_BYTES], check)
        tail = both[-TRAILER_BYTES:]
    if len(tail) < TRAILER_BYTES or not tail.startswith(TRAILER_MAGIC):
        raise Unauthentic(f"{name}: no trailer (cut short, or not an encrypted object)")
    if tail != _trailer(check):
        raise Unauthentic(f"{name}: its stored bytes do not match their CRC32C (trailer)")


def seal_bytes(data: bytes, name: str, kek_id: bytes, kek: bytes) -> bytes:
    return b"".join(seal([data], name, kek_id, kek))


def unseal_bytes(data: bytes, name: str, keyring: dict[bytes, bytes]) -> bytes:
    return b"".join(unseal([data], name, keyring))


# -- the key file: scrypt's salt and parameters, the keyring under the repository key


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text) -> bytes:
    return base64.b64decode(text, validate=True)


def derive(passphrase: str, salt: bytes, params: dict) -> bytes:
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    return Scrypt(salt=salt, length=KEY_BYTES, n=params["n"], r=params["r"], p=params["p"]).derive(passphrase.encode())


class Keyring:
    """The key-encryption keys, oldest first: new objects use the newest."""

    def __init__(self, keys: list[tuple[bytes, bytes]]):
        self.keys = keys

    @classmethod
    def new(cls) -> Keyring:
        return cls([(os.urandom(ID_BYTES), os.urandom(KEY_BYTES))])

    def added(self) -> Keyring:
        return Keyring([*self.keys, *Keyring.new().keys])

    @property
    def by_id(self) -> dict[bytes, bytes]:
        return dict(self.keys)

    @property
    def newest(self) -> tuple[bytes, bytes]:
        return self.keys[-1]

    def key_file(self, passphrase: str, params: dict | None = None) -> bytes:
        """The key file's bytes: this keyring under the key `passphrase` gives with a new salt, and a checksum of
        the rest (damage is told from a wrong key, also without the key: `check_key_file`)."""
        params = dict(params or SCRYPT)
        salt, nonce = os.urandom(16), os.urandom(NONCE_BYTES)
        plain = json.dumps({"keys": [[_b64(i), _b64(k)] for i, k in self.keys]}).encode()
        sealed = bytes(_encrypt(derive(passphrase, salt, params), nonce, plain, _KEYRING_AAD))
        doc = {"format": KEYFILE_FORMAT, "cipher": "AES-256-GCM", "kdf": {"name": "scrypt", **params,
                                                                          "salt": _b64(salt)},
               "keyring": {"nonce": _b64(nonce), "sealed": _b64(sealed)}}
        return json.dumps({**doc, "checksum": _checksum(doc)}, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def open(cls, key_file: bytes, passphrase: str) -> Keyring:
        """The keyring of a key file; WrongKey when the passphrase does not open it, ValueError when the file is
        damaged or no key file."""
        params, salt, nonce, sealed = check_key_file(key_file)
        try:
            plain = _decrypt(derive(passphrase, salt, params), nonce, sealed, _KEYRING_AAD)
        except InvalidTag:
            raise WrongKey("the key does not open this repository's key file") from None
        keys = [(_unb64(i), _unb64(k)) for i, k in json.loads(plain)["keys"]]
        return cls(keys)


def _checksum(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_key_file(key_file: bytes) -> tuple[dict, bytes, bytes, bytes]:
    """A key file's scrypt parameters, salt, nonce and sealed keyring; ValueError when it is damaged (its checksum)
    or no key file this walvault reads."""
    try:
        doc = json.loads(key_file)
        kdf, ring = doc["kdf"], doc["keyring"]
        if doc["format"] != KEYFILE_FORMAT or kdf["name"] != "scrypt":
            raise ValueError(f"key file format {doc['format']} / {kdf['name']} is not one this walvault reads")
        params = {k: int(kdf[k]) for k in ("n", "r", "p")}
        salt, nonce, sealed = _unb64(kdf["salt"]), _unb64(ring["nonce"]), _unb64(ring["sealed"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a walvault key file ({type(e).__name__})") from None
    if doc.get("checksum") != _checksum(doc):
        raise ValueError("it does not match its checksum: it was changed or damaged")
    if any(not 1 <= params[k] <= SCRYPT_MAX[k] for k in params) or params["n"] & (params["n"] - 1) \
            or params["n"] * params["r"] * params["p"] > SCRYPT["n"] * SCRYPT["r"] * SCRYPT["p"] * 32:
        raise ValueError(f"its scrypt parameters {params} are beyond what walvault derives (at most {SCRYPT_MAX}, "
                         "32 times the default work): it was changed")
    return params, salt, nonce, sealed

"""An encrypted repository's storage: a driver layer under `Repository` that seals every object written and opens
every object read (envelope.py), so that nothing above it (objects, manifests, records, ledger, reports, leases)
knows. Names stay in clear (docs/encryption.md says what they reveal); only `walvault.repo` (which says the
repository is encrypted) and `walvault.key` (scrypt's salt and parameters, the keyring under the repository key)
are not sealed.

The key is a passphrase: `WALVAULT_KEY`, or what a front end read for it (`--key-file`, an Airflow connection);
never the command line.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterable, Iterator

from .envelope import (CHUNK, HEADER_BYTES, TAG_BYTES, TRAILER_BYTES, Keyring, Unauthentic, WrongKey, check_key_file,
                       check_stored, seal, unseal)
from .manifest import INFO_NAME, ManifestError
from .storage import ObjectDamaged, RepositoryError, Storage

KEY_ENV = "WALVAULT_KEY"
NEW_KEY_ENV = "WALVAULT_NEW_KEY"
TO_KEY_ENV = "WALVAULT_TO_KEY"  # `copy`: the destination's key (never the source's: each side's key is given)
KEY_OPTIONS = {KEY_ENV: "--key-file", NEW_KEY_ENV: "--new-key-file", TO_KEY_ENV: "--to-key-file"}
KEY_NAME = "walvault.key"
CLEAR_NAMES = (INFO_NAME, INFO_NAME + ".copy", KEY_NAME)  # the objects of an encrypted repository stored unsealed
CIPHER = "AES-256-GCM"


class KeyMissing(RepositoryError):
    """The repository is encrypted and no key was given."""


class Tampered(ManifestError, ObjectDamaged):
    """An object that does not authenticate: a manifest or record read from it is damaged, a stored file too."""


def passphrase(given: str | None = None, env: str = KEY_ENV) -> str | None:
    """The key: `given` (a front end read it), else $`env`; None when neither is there. RepositoryError (exit 2)
    when it is no UTF-8 text (bytes the environment could not decode): said as such, nothing of it shown."""
    key = given if given is not None else os.environ.get(env) or None
    if key is not None:
        try:
            key.encode()
        except UnicodeEncodeError:
            raise RepositoryError(f"the key given ({env} or its file) is not UTF-8 text") from None
    return key


def key_source(env: str) -> str:
    """Where a key is given: "WALVAULT_KEY or --key-file"."""
    return f"{env} or {KEY_OPTIONS[env]}"


def open_keyring(storage: Storage, key: str | None, env: str = KEY_ENV) -> Keyring:
    """The keyring of the repository at `storage`: RepositoryError (exit 2) when the key (given in `env` or its
    option) is missing or wrong."""
    if key is None:
        raise KeyMissing(f"the repository {storage.display} is encrypted: give its key ({key_source(env)})")
    try:
        data = storage.read_bytes(KEY_NAME)
    except FileNotFoundError:
        raise RepositoryError(f"the repository {storage.display} is encrypted and its key file {KEY_NAME} is "
                              "missing: its objects cannot be read") from None
    try:
        return Keyring.open(data, key)
    except WrongKey:
        raise RepositoryError(f"the key given does not open the repository {storage.display}") from None
    except ValueError as e:
        raise RepositoryError(f"{KEY_NAME} of the repository {storage.display} is damaged: {e}") from None


def create_key_file(storage: Storage, key: str) -> None:
    """A new repository's key file, with one key-encryption key (written before walvault.repo, its commit point)."""
    storage.write_bytes(KEY_NAME, Keyring.new().key_file(key))


def rotate(storage: Storage, old: str | None, new: str | None) -> str:
    """`walvault key rotate`: a new key-encryption key for future objects and the whole keyring under the key
    `new`, in one conditional replacement of the key file (a killed rotation leaves it under one of the two keys).
    Returns what was done: "rotated", or "done already" when `new` opens it (a rotation that ended unseen)."""
    if new is None:
        raise KeyMissing(f"the new key is missing: give it in {key_source(NEW_KEY_ENV)}")
    if old is None:
        raise KeyMissing(f"the repository {storage.display} is encrypted: give its key ({key_source(KEY_ENV)})")
    if new == old:
        raise RepositoryError("the new key is the key given: a rotation needs another")
    outcome = []

    def change(current: bytes | None):
        outcome.clear()
        if current is None:
            raise RepositoryError(f"the key file {KEY_NAME} of the repository {storage.display} is missing")
        try:
            ring = Keyring.open(current, old)
        except WrongKey:
            try:
                Keyring.open(current, new)
            except WrongKey:
                raise RepositoryError(f"the key given does not open the repository {storage.display}") from None
            outcome.append("done already")
            return False
        except ValueError as e:
            raise RepositoryError(f"{KEY_NAME} of the repository {storage.display} is damaged: {e}") from None
        outcome.append("rotated")
        return ring.added().key_file(new)

    for _attempt in range(5):  # another rotation changed it between the read and the write: read it again
        if storage.update(KEY_NAME, change) or outcome == ["done already"]:
            return outcome[0]
    raise RepositoryError(f"{KEY_NAME} kept changing while it was rotated: is another rotation running?")


def key_file_problem(storage: Storage) -> str | None:
    """What is wrong with the repository's key file, checked without the key (None: nothing)."""
    try:
        check_key_file(storage.read_bytes(KEY_NAME))
    except FileNotFoundError:
        return f"{KEY_NAME} is missing: no object of the repository can be opened"
    except ValueError as e:
        return f"{KEY_NAME}: {e}"
    return None


def plain_size(stored: int, chunk: int = CHUNK) -> int:
    """The plaintext size of an envelope of `stored` bytes (written with `chunk`-byte chunks)."""
    body = stored - HEADER_BYTES - TRAILER_BYTES
    chunks = max(1, -(-body // (chunk + TAG_BYTES)))
    return max(0, body - chunks * TAG_BYTES)


def object_problem(storage: Storage, name: str, keyring: Keyring | None) -> str | None:
    """What is wrong with one stored object of an encrypted repository (None: nothing): without the keyring its
    bytes against their trailer's CRC32C, with it every chunk authenticated too."""
    try:
        pieces = storage.iter_bytes(name)
        if keyring is None:
            check_stored(pieces, storage.repo_name(name))
        else:
            for _ in unseal(pieces, storage.repo_name(name), keyring.by_id):
                pass
    except FileNotFoundError:
        return None  # removed since it was listed
    except Unauthentic as e:
        return str(e)
    return None


class EncryptedStorage(Storage):
    """`inner` with every object sealed on write and opened on read; names, listings and removals as they are.
    `size` is an object's plaintext size (what records say), `sizes` the bytes stored."""

    def __init__(self, inner: Storage, keyring: Keyring):
        self.inner, self.keyring = inner, keyring
        self.url, self.display, self.prefix, self.options = inner.url, inner.display, inner.prefix, inner.options
        self._secrets, self.caps, self.fs, self.root = inner._secrets, inner.caps, inner.fs, inner.root

    def sub(self, prefix: str) -> Storage:
        deeper = copy.copy(self)
        deeper.inner = self.inner.sub(prefix)
        deeper.prefix = deeper.inner.prefix
        return deeper

    def _resolve(self, repo_name: str) -> str:
        return self.inner._resolve(repo_name)

    # -- sealing and opening

    def _clear(self, name: str) -> bool:
        return self.repo_name(name) in CLEAR_NAMES

    def _sealed(self, name: str, chunks: Iterable[bytes]) -> Iterable[bytes]:
        if self._clear(name):
            return chunks
        kek_id, kek = self.keyring.newest
        return seal(chunks, self.repo_name(name), kek_id, kek)

    def _opened(self, name: str, pieces: Iterable[bytes]) -> Iterator[bytes]:
        if self._clear(name):
            yield from pieces
            return
        try:
            yield from unseal(pieces, self.repo_name(name), self.keyring.by_id)
        except Unauthentic as e:
            raise Tampered(f"{e}: in repository {self.display}") from None

    def _open_bytes(self, name: str, data: bytes) -> bytes:
        return b"".join(self._opened(name, [data]))

    def _seal_bytes(self, name: str, data: bytes) -> bytes:
        return b"".join(self._sealed(name, [data]))

    # -- reads

    def read_bytes(self, name: str, limit: int = 64 << 20) -> bytes:
        overhead = HEADER_BYTES + TRAILER_BYTES + TAG_BYTES * (limit // CHUNK + 1)
        data = self._open_bytes(name, self.inner.read_bytes(name, limit + overhead))
        if len(data) > limit:
            raise RepositoryError(f"{self.repo_name(name)} in repository {self.display} is larger than {limit} bytes")
        return data

    def iter_bytes(self, name: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        return self._opened(name, self.inner.iter_bytes(name, chunk))

    def size(self, name: str) -> int:
        stored = self.inner.size(name)
        return stored if self._clear(name) else plain_size(stored)

    # -- writes

    def write(self, name: str, chunks: Iterable[bytes]) -> int:
        written = 0

        def counted() -> Iterator[bytes]:
            nonlocal written
            for chunk in chunks:
                written += len(chunk)
                yield chunk

        self.inner.write(name, self._sealed(name, counted()))
        return written

    def create(self, name: str, data: bytes) -> bool:
        return self.inner.create(name, self._seal_bytes(name, data))

    def _updating(self, full: str) -> contextlib.AbstractContextManager:
        return self.inner._updating(full)

    def _read_tagged(self, name: str, full: str) -> tuple[bytes | None, str | None]:
        current, version = self.inner._read_tagged(name, full)
        return (None if current is None else self._open_bytes(name, current)), version

    def _replace(self, name: str, full: str, new: bytes | None, version: str | None) -> bool:
        return self.inner._replace(name, full, None if new is None else self._seal_bytes(name, new), version)

    def remove(self, name: str) -> None:
        self.inner.remove(name)

    def remove_stale_temporaries(self, prefix: str | None, older_than: float) -> list[str]:
        return self.inner.remove_stale_temporaries(prefix, older_than)

    def remove_tree(self, prefix: str | None = None, keep: str | None = None) -> list[str]:
        return self.inner.remove_tree(prefix, keep)

    # -- Object Lock: the inner driver's, which writes and removes (names are the same above and below)

    @property
    def lock(self):
        return self.inner.lock

    def lock_enabled(self) -> bool:
        return self.inner.lock_enabled()

    def locked_until(self, name: str) -> float | None:
        return self.inner.locked_until(name)

"""The repository layer (walcore.repository) over a local directory and over S3 (moto's server on 127.0.0.1).

Every test takes `repo_target`, so it runs on both, unless its name says `local_only` / `s3_only` (a symlink
exists only on a posix path; a client that fails to connect only on S3) or it tests a pure function; those taking
`plain_or_encrypted` run on an encrypted repository too (docs/encryption.md).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zstandard

from conftest import RepoTarget, encrypted_target, tree_snapshot
from walcore.repository import ObjectDamaged, Repository, RepositoryError, SourceChanged
from walcore.repository.lease import LeaseBusy, LeaseUnreadable, acquire
from walcore.repository.manifest import (ManifestError, decode_checked, encode_checked, load_checked,
                                         save_checked)
from walcore.repository.storage import Storage, UnsafeName, open_storage, parse_options, redact_url

SECRET = "walvault-very-secret-123"
S3_PART = 5 << 20  # the smallest part S3 accepts: a multi-part upload within a few MiB


def storage_of(target: RepoTarget, **extra) -> Storage:
    options = {**target.options, **extra}
    return Repository(target.url, options).storage if target.encrypted else open_storage(target.url, options)


@pytest.fixture
def plain_or_encrypted(repo_target, encryption, monkeypatch) -> RepoTarget:
    """`repo_target`, then an encrypted repository there: for what the encryption layer must keep as it is (reads,
    writes, exclusive creates, conditional updates, leases, objects, backups)."""
    return encrypted_target(repo_target, monkeypatch) if encryption == "encrypted" else repo_target


def everything(storage: Storage) -> list:
    """Every file and directory the test could have touched: the repository's parent directory locally, the
    whole bucket on S3 (so that a write outside the root shows too)."""
    if storage.caps.local_paths:
        return sorted(tree_snapshot(Path(storage.root).parent).items())
    return sorted(storage.fs.find(storage.root.split("/")[0], withdirs=True))


# -- 1. names


BAD_NAMES = ["..", "../escape", "a/../../escape", "/abs/escape", "a//b", "", "a/", "./a", "a/./b", "a\x00b", "a\\b"]
OPERATIONS = {
    "exists": lambda s, n: s.exists(n),
    "read_bytes": lambda s, n: s.read_bytes(n),
    "iter_bytes": lambda s, n: list(s.iter_bytes(n)),
    "size": lambda s, n: s.size(n),
    "list": lambda s, n: s.list(n),
    "list_dirs": lambda s, n: s.list_dirs(n),
    "write": lambda s, n: s.write(n, [b"x"]),
    "write_bytes": lambda s, n: s.write_bytes(n, b"x"),
    "create": lambda s, n: s.create(n, b"x"),
    "remove": lambda s, n: s.remove(n),
    "remove_tree": lambda s, n: s.remove_tree(n),
}


@pytest.mark.parametrize("operation", OPERATIONS)
def test_unsafe_names_are_refused(repo_target, operation):
    storage = storage_of(repo_target)
    storage.write_bytes("kept", b"kept")
    before = everything(storage)
    for name in BAD_NAMES:
        with pytest.raises(UnsafeName):
            OPERATIONS[operation](storage, name)
    assert everything(storage) == before
    assert storage.read_bytes("kept") == b"kept"


def test_unsafe_instance_and_backup_ids_are_refused(repo_target):
    repo = repo_target.repository()
    for instance in ("..", "a/b", "", ".hidden", "a\x00"):
        with pytest.raises(UnsafeName):
            repo.source_dir("tarantool", instance)
    for backup_id in ("..", "20260101-000000F/..", "latest", "20260101-000000X"):
        with pytest.raises(UnsafeName):
            repo.backup_dir("tarantool", "inst", backup_id)
    with pytest.raises(UnsafeName):
        repo.source_dir("postgres", "inst")


def test_symlink_leading_out_is_refused_local_only(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside bytes")
    root = tmp_path / "repo"
    root.mkdir()
    (root / "linkdir").symlink_to(outside)
    (root / "linkfile").symlink_to(outside / "secret")
    (root / "dangling").symlink_to(outside / "absent")
    storage = open_storage(str(root))
    before = tree_snapshot(outside)
    for name in ("linkdir/secret", "linkfile"):
        for operation in ("exists", "read_bytes", "iter_bytes", "size", "remove"):
            with pytest.raises(UnsafeName, match="symlink"):
                OPERATIONS[operation](storage, name)
    for name in ("linkdir/new", "linkdir/sub/new", "linkfile", "dangling"):
        for operation in ("write", "write_bytes", "create"):
            with pytest.raises(UnsafeName, match="symlink"):
                OPERATIONS[operation](storage, name)
    for operation in ("list", "list_dirs", "remove_tree"):
        with pytest.raises(UnsafeName, match="symlink"):
            OPERATIONS[operation](storage, "linkdir")
    assert tree_snapshot(outside) == before
    assert (outside / "secret").read_bytes() == b"outside bytes"


def test_symlink_staying_inside_is_followed_local_only(tmp_path):
    """The check is on where a name leads, not on symlinks as such."""
    root = tmp_path / "repo"
    storage = open_storage(str(root))
    storage.write_bytes("real/object", b"inside")
    (root / "alias").symlink_to(root / "real")
    assert storage.read_bytes("alias/object") == b"inside"


def test_symlinks_below_the_root_are_listed_as_fsspec_lists_them_local_only(tmp_path):
    """A local repository's listings say what fsspec's local file system said (LocalFiles stands in for it): a
    symlink below the root is an entry, never walked, so that a symlinked directory's objects are not listed twice
    (nor, through a loop, without end) and removing a tree removes the link, not what it leads to."""
    import fsspec

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside bytes")
    root = tmp_path / "repo"
    storage = open_storage(str(root))
    storage.write_bytes("real/object", b"inside")
    storage.write_bytes("backups/own", b"own")
    (root / "backups" / ".own.0123abcd.walvault-tmp").write_bytes(b"killed write")
    (root / "backups" / "alias").symlink_to(root / "real")
    (root / "backups" / "file-alias").symlink_to(root / "real" / "object")
    (root / "backups" / "dangling").symlink_to(root / "absent")
    (root / "loop").symlink_to(root)
    (root / "out").symlink_to(outside)
    as_fsspec = open_storage(str(root))
    as_fsspec.fs = fsspec.filesystem("file")
    for prefix in (None, "backups"):
        assert storage.list(prefix) == as_fsspec.list(prefix)
    assert storage.sizes() == as_fsspec.sizes()
    assert storage.list_dirs("backups") == as_fsspec.list_dirs("backups") == []
    assert storage.list().count("backups/own") == 1 and "real/object" in storage.list()
    assert not [n for n in storage.list() if n.startswith(("loop/", "out/", "backups/alias/"))]
    storage.remove_tree("backups")
    assert storage.read_bytes("real/object") == b"inside"
    assert (outside / "secret").read_bytes() == b"outside bytes"


# -- 2. atomic writes


def test_write_failing_half_way_leaves_nothing(repo_target):
    storage = storage_of(repo_target)
    storage.write_bytes("objects/kept", b"kept bytes")

    def chunks(error: Exception):
        yield b"first half" * 1000
        raise error

    for name in ("objects/new", "objects/kept"):
        with pytest.raises(ValueError, match="half way"):  # the source's own error, as it is
            storage.write(name, chunks(ValueError("the source failed half way")))
        with pytest.raises(RepositoryError, match=f"cannot write {name}.*Input/output error"):  # as the write's
            storage.write(name, chunks(OSError(errno.EIO, "Input/output error")))
    assert not storage.exists("objects/new")
    assert storage.list("objects") == ["objects/kept"]
    assert storage.read_bytes("objects/kept") == b"kept bytes"
    if storage.caps.atomic_rename:  # and no temporary file either
        assert os.listdir(Path(storage.root) / "objects") == ["kept"]


def test_write_reads_back_identical(plain_or_encrypted):
    storage = storage_of(plain_or_encrypted)
    for name, chunks in (("small", [b"a", b"", b"bc"]), ("empty", []), ("deep/er/name", [bytes(range(256))])):
        data = b"".join(chunks)
        assert storage.write(name, chunks) == len(data)
        assert storage.read_bytes(name) == data
        assert b"".join(storage.iter_bytes(name, chunk=7)) == data
        assert storage.size(name) == len(data)
    assert storage.list("deep") == ["deep/er/name"]
    assert storage.list_dirs("deep") == ["er"]


def test_multi_mib_write_in_parts(plain_or_encrypted):
    """On S3 with 5 MiB parts: a three-part upload, read back whole; one failing after two parts leaves neither an
    object nor an unfinished upload."""
    storage = storage_of(plain_or_encrypted, default_block_size=S3_PART) if plain_or_encrypted.kind == "s3" \
        else storage_of(plain_or_encrypted)
    data = os.urandom(3 * S3_PART - 12345)
    mib = 1 << 20
    assert storage.write("big/object", (data[i:i + mib] for i in range(0, len(data), mib))) == len(data)
    assert storage.size("big/object") == len(data)
    assert b"".join(storage.iter_bytes("big/object")) == data

    def failing():
        yield data[:S3_PART + 1]
        yield data[S3_PART + 1:2 * S3_PART + 2]
        raise ValueError("the source failed after two parts")

    with pytest.raises(ValueError, match="two parts"):
        storage.write("big/failed", failing())
    assert storage.list("big") == ["big/object"]
    if plain_or_encrypted.kind == "s3":
        bucket, key = storage.full("big/object").split("/", 1)
        etag = storage.fs.call_s3("head_object", Bucket=bucket, Key=key)["ETag"]
        assert etag.strip('"').endswith("-3"), f"not a three-part upload: ETag {etag}"
        assert not storage.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads")


# -- 3. exclusive create


def test_create_is_exclusive(plain_or_encrypted):
    storage = storage_of(plain_or_encrypted)
    assert storage.create("locks/one", b"first")
    assert not storage.create("locks/one", b"second")
    assert storage.read_bytes("locks/one") == b"first"


def test_create_has_one_winner_among_racers(plain_or_encrypted):
    """Exclusivity comes from the store (O_EXCL; S3's conditional PUT), not from a look before the write."""
    storage = storage_of(plain_or_encrypted)
    racers = 8
    start = threading.Barrier(racers)
    won = [None] * racers

    def race(i: int) -> None:
        start.wait()
        won[i] = storage.create("locks/raced", f"racer {i}".encode())

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) == 1, won
    assert storage.read_bytes("locks/raced") == f"racer {won.index(True)}".encode()


def test_objects_of_another_writer_are_seen_at_once(repo_target):
    """A long-lived reader (a scheduler, a test) sees what other processes wrote since it last listed: s3fs's
    listing cache must not hide them."""
    reader = storage_of(repo_target)
    other = storage_of(repo_target, skip_instance_cache=True)  # another process's client
    other.write_bytes("dir/one/object", b"1")
    assert reader.list_dirs("dir") == ["one"] and reader.list("dir/one") == ["dir/one/object"]
    other.write_bytes("dir/two/object", b"2")
    other.write_bytes("dir/one/later", b"3")
    assert reader.list_dirs("dir") == ["one", "two"]
    assert reader.list("dir/one") == ["dir/one/later", "dir/one/object"]
    assert reader.exists("dir/one/later") and reader.read_bytes("dir/one/later") == b"3"
    other.remove("dir/one/object")
    assert not reader.exists("dir/one/object")


def test_object_replaced_while_read_is_read_whole(repo_target, monkeypatch):
    """A lease renewed (rewritten) while another process reads it: the reader gets one whole version, old or new,
    never an error (on S3 the object changes between the look-up and the GET)."""
    writer = storage_of(repo_target)
    reader = storage_of(repo_target, skip_instance_cache=True)  # another process's client
    old, new = b"old lease " * 10, b"renewed lease " * 30
    writer.write_bytes("locks/lease", old)
    open_first = reader.fs.open
    replaced = []

    def open_then_replaced(path, mode="rb", **kwargs):
        f = open_first(path, mode, **kwargs)
        if not replaced:
            writer.write_bytes("locks/lease", new)
            replaced.append(path)
        return f

    monkeypatch.setattr(reader.fs, "open", open_then_replaced)
    assert reader.read_bytes("locks/lease") in (old, new)
    assert replaced


# -- 4. the repository's info


def test_new_repository_writes_its_info_twice(repo_target):
    repo = repo_target.repository(create=True)
    main, copy = repo.storage.read_bytes("walvault.repo"), repo.storage.read_bytes("walvault.repo.copy")
    assert main == copy
    assert decode_checked(main, "walvault.repo") == repo.info
    assert repo.info["format"] == 1
    assert repo_target.repository(create=False).info == repo.info
    assert repo_target.repository(create=True).info == repo.info  # found, not written anew


def test_empty_location_is_not_a_repository(repo_target):
    with pytest.raises(RepositoryError, match="is not a walvault repository") as e:
        repo_target.repository(create=False)
    assert redact_url(repo_target.url) in str(e.value)


def test_newer_repository_format_is_refused(repo_target):
    storage = storage_of(repo_target)
    newer = encode_checked({"format": 2, "created": "2030-01-01T00:00:00Z", "created_by": "walvault 9.0"})
    storage.write_bytes("walvault.repo", newer)
    for create in (False, True):
        with pytest.raises(RepositoryError, match=r"format 2.*use a newer walvault"):
            repo_target.repository(create=create)
    assert storage.read_bytes("walvault.repo") == newer
    assert not storage.exists("walvault.repo.copy")


def test_damaged_info_with_good_copy_is_used(repo_target):
    info = repo_target.repository(create=True).info
    storage = storage_of(repo_target)
    main = storage.read_bytes("walvault.repo")
    storage.write_bytes("walvault.repo", main.replace(b'"format": 1', b'"format": 3'))  # checksum no longer holds
    assert repo_target.repository(create=False).info == info
    storage.write_bytes("walvault.repo.copy", b"{")
    with pytest.raises(ManifestError, match="walvault.repo does not match its checksum.*walvault.repo.copy is not "
                                            "JSON"):
        repo_target.repository(create=False)


# -- 5. checked files


def test_encode_decode_checked_round_trip():
    obj = {"format": 1, "name": "ünïcode ✓", "list": [1, 2.5, None, True], "nested": {"a": "b"}}
    assert decode_checked(encode_checked(obj), "x") == obj
    assert decode_checked(encode_checked({**obj, "checksum": "stale"}), "x") == obj


def test_every_flipped_bit_is_found():
    data = encode_checked({"format": 1, "id": "20260101-000000F", "files": [{"size": 12, "ok": True}]})
    for i in range(len(data)):
        for bit in (0x01, 0x10):
            damaged = data[:i] + bytes([data[i] ^ bit]) + data[i + 1:]
            with pytest.raises(ManifestError):
                decode_checked(damaged, "manifest")


def test_load_checked_falls_back_to_the_copy(repo_target):
    storage = storage_of(repo_target)
    obj = {"format": 1, "value": "good"}
    save_checked(storage, "m/file", obj)
    loaded = load_checked(storage, "m/file")
    assert (loaded.obj, loaded.used, loaded.problem) == (obj, "m/file", None)

    main = storage.read_bytes("m/file")
    storage.write_bytes("m/file", main.replace(b"good", b"gooe"))
    loaded = load_checked(storage, "m/file")
    assert (loaded.obj, loaded.used) == (obj, "m/file.copy")
    assert "m/file does not match its checksum" in loaded.problem

    storage.remove("m/file")
    loaded = load_checked(storage, "m/file")
    assert (loaded.obj, loaded.used, loaded.problem) == (obj, "m/file.copy", "m/file is missing")


def test_load_checked_both_bad_or_missing(repo_target):
    storage = storage_of(repo_target)
    storage.write_bytes("m/file", b"not json")
    storage.write_bytes("m/file.copy", encode_checked({"v": 1}).replace(b'"v": 1', b'"v": 2'))
    with pytest.raises(ManifestError, match="m/file is not JSON.*m/file.copy does not match its checksum"):
        load_checked(storage, "m/file")
    storage.remove("m/file.copy")  # main bad, copy missing: damaged, not absent
    with pytest.raises(ManifestError, match="m/file.copy is missing"):
        load_checked(storage, "m/file")
    storage.remove("m/file")
    with pytest.raises(FileNotFoundError):
        load_checked(storage, "m/file")


# -- 6. stored objects


def source_file(path: Path, size: int) -> Path:
    """Half compressible, half random: several zstd blocks and several read chunks."""
    half = size // 2
    rows = b"".join(b"walvault row %d\n" % i for i in range(half // 14 + 1))[:half]
    path.write_bytes(rows + os.urandom(size - half))
    return path


def read_all(repo: Repository, name: str, stored, got: list | None = None) -> bytes:
    """The object's bytes; `got` receives each chunk as it comes (what a streaming caller would have seen)."""
    got = [] if got is None else got
    for chunk in repo.read_object(name, size=stored.size, sha256=stored.sha256, stored_sha256=stored.stored_sha256):
        got.append(chunk)
    return b"".join(got)


def test_put_and_read_object(plain_or_encrypted, tmp_path):
    repo = plain_or_encrypted.repository()
    source = source_file(tmp_path / "00000000000000000000.xlog", 3 * (1 << 20) + 17)
    data = source.read_bytes()
    stored = repo.put_object("objects/a.zst", source)
    raw = repo.storage.read_bytes("objects/a.zst")
    assert (stored.size, stored.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert (stored.stored_size, stored.stored_sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
    assert stored.stored_size < stored.size  # compressed
    assert zstandard.ZstdDecompressor().decompressobj().decompress(raw) == data
    assert read_all(repo, "objects/a.zst", stored) == data

    prefix = repo.put_object("objects/prefix.zst", source, limit=1000)
    assert (prefix.size, prefix.sha256) == (1000, hashlib.sha256(data[:1000]).hexdigest())
    assert read_all(repo, "objects/prefix.zst", prefix) == data[:1000]


def test_big_objects_compressed_by_zstd_threads_round_trip_from_threads_at_once(plain_or_encrypted, tmp_path):
    """A file of PARALLEL_COMPRESSION_BYTES or more given more than one core is compressed by zstd's own threads
    (its hashes on threads of their own): stored from three threads at once (as a backup's pool does), each reads
    back as its bytes; a `limit` below the threshold takes the single-threaded path on the same file, and so does
    one core; the frame is one zstd stream any decompressor reads, not the one a single thread writes."""
    import threading

    from walcore.repository import PARALLEL_COMPRESSION_BYTES, READ_CHUNK

    def single_threaded(data: bytes) -> bytes:
        """The frame put_object writes without zstd's threads (the same 1 MiB reads)."""
        compressor = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join(compressor.compress(data[i:i + READ_CHUNK]) for i in range(0, len(data), READ_CHUNK)) \
            + compressor.flush()

    repo = plain_or_encrypted.repository()
    sources = [source_file(tmp_path / f"{i:020d}.xlog", PARALLEL_COMPRESSION_BYTES + 12345 * i) for i in range(3)]
    stored, errors = {}, []

    def put(i: int) -> None:
        try:
            stored[i] = repo.put_object(f"objects/{i}.zst", sources[i], cores=2)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    workers = [threading.Thread(target=put, args=(i,)) for i in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
    for i, source in enumerate(sources):
        data = source.read_bytes()
        assert (stored[i].size, stored[i].sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert read_all(repo, f"objects/{i}.zst", stored[i]) == data
    raw = repo.storage.read_bytes("objects/0.zst")
    assert zstandard.ZstdDecompressor().decompressobj().decompress(raw) == sources[0].read_bytes()
    assert raw != single_threaded(sources[0].read_bytes())
    one_core = repo.put_object("objects/one-core.zst", sources[0], cores=1)
    assert repo.storage.read_bytes("objects/one-core.zst") == single_threaded(sources[0].read_bytes())
    assert read_all(repo, "objects/one-core.zst", one_core) == sources[0].read_bytes()
    small = repo.put_object("objects/limit.zst", sources[2], limit=PARALLEL_COMPRESSION_BYTES - 1, cores=2)
    assert read_all(repo, "objects/limit.zst", small) == sources[2].read_bytes()[:PARALLEL_COMPRESSION_BYTES - 1]
    assert repo.storage.read_bytes("objects/limit.zst") == single_threaded(sources[2].read_bytes()[
        :PARALLEL_COMPRESSION_BYTES - 1])


def test_damaged_objects_are_reported(repo_target, tmp_path):
    repo = repo_target.repository()
    source = source_file(tmp_path / "source", 2 * (1 << 20))
    stored = repo.put_object("objects/a.zst", source)
    good = repo.storage.read_bytes("objects/a.zst")
    second_frame = zstandard.ZstdCompressor().compress(b"more rows")
    middle = len(good) // 2

    def flipped(at: int) -> bytes:
        return good[:at] + bytes([good[at] ^ 0x01]) + good[at + 1:]

    damages = {
        "a flipped byte in the data": flipped(middle),
        "a flipped byte in the header": flipped(0),
        "zero length": b"",
        "cut short": good[:-10],
        "cut to half": good[:middle],
        "bytes appended": good + b"\0\0\0\0",
        "a second frame appended": good + second_frame,
    }
    for damage, data in damages.items():
        repo.storage.write_bytes("objects/a.zst", data)
        got = []
        with pytest.raises(ObjectDamaged, match="objects/a.zst"):  # the read never ends as if it were good
            read_all(repo, "objects/a.zst", stored, got)
        if damage == "a flipped byte in the data":  # zstd took it: only the end of the read tells
            assert got
    repo.storage.remove("objects/a.zst")
    with pytest.raises(ObjectDamaged, match="objects/a.zst: missing"):
        read_all(repo, "objects/a.zst", stored)


def test_object_with_wrong_record_is_reported(repo_target, tmp_path):
    """Good stored bytes, but a record that says otherwise (another size or content hash)."""
    repo = repo_target.repository()
    stored = repo.put_object("objects/a.zst", source_file(tmp_path / "source", 100_000))
    for wrong in ({"size": stored.size - 1}, {"size": stored.size + 1}, {"sha256": "0" * 64},
                  {"stored_sha256": "0" * 64}):
        record = {"size": stored.size, "sha256": stored.sha256, "stored_sha256": stored.stored_sha256, **wrong}
        with pytest.raises(ObjectDamaged, match="objects/a.zst"):
            b"".join(repo.read_object("objects/a.zst", **record))


def test_pieces_of_a_big_file_are_each_checked(repo_target, tmp_path):
    """A file in two pieces, the first big enough for its hashes to run on threads: the first piece's SHA-256 is
    read off the whole file's (one hash of its bytes, not two), and a wrong record of either piece, or of the
    whole, still fails the read naming the object (or the file) it is about, after the last chunk."""
    from walcore.repository import PARALLEL_COMPRESSION_BYTES
    from walcore.repository.manifest import Piece

    repo = repo_target.repository()
    source = source_file(tmp_path / "source", PARALLEL_COMPRESSION_BYTES + 300_000)
    first = repo.put_object("objects/first.zst", source, limit=PARALLEL_COMPRESSION_BYTES + 100_000)
    second = repo.put_object("objects/second.zst", source, offset=first.size)
    data = source.read_bytes()

    def piece(name, stored, **wrong):
        return Piece(name, stored.stored_size, stored.stored_sha256, **{"size": stored.size,
                                                                         "sha256": stored.sha256, **wrong})

    def read(pieces, **whole):
        record = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **whole}
        return b"".join(repo.read_pieces("the file", pieces, check_stored=False, **record))

    good = [piece("objects/first.zst", first), piece("objects/second.zst", second)]
    assert read(good) == data
    for pieces, whole, named in (
            ([piece("objects/first.zst", first, sha256="0" * 64), good[1]], {}, "objects/first.zst"),
            ([good[0], piece("objects/second.zst", second, sha256="0" * 64)], {}, "objects/second.zst"),
            (good, {"sha256": "0" * 64}, "the file")):
        with pytest.raises(ObjectDamaged, match=named):
            read(pieces, **whole)


def test_a_big_file_is_written_checked(repo_target, tmp_path):
    """A restored file big enough for its hashes to run on threads and its writeback to start while it is written:
    what is written is its bytes; when its object does not hold what the manifest records, the restore fails
    naming the object and leaves neither the file nor its part."""
    from walcore.backup_common import Progress
    from walcore.repository import PARALLEL_COMPRESSION_BYTES
    from walcore.repository.manifest import FileEntry
    from walcore.repository.materialize import WRITEBACK_BYTES, materialize

    repo = repo_target.repository()
    source = source_file(tmp_path / "source", max(PARALLEL_COMPRESSION_BYTES, 2 * WRITEBACK_BYTES) + 12345)
    stored = repo.put_object("objects/big.zst", source)
    record = {"name": "00000000000000000001.xlog", "kind": "xlog", "size": stored.size, "sha256": stored.sha256,
              "stored": "objects/big.zst", "stored_size": stored.stored_size, "stored_sha256": stored.stored_sha256,
              "reference": None, "mutable": False, "range": {}, "verification": {}}
    root = tmp_path / "restored"
    root.mkdir()

    def restore(entry: FileEntry) -> None:
        materialize(repo, [("wal/x.xlog", entry)], root, Progress(1, entry.size, False, "restored"))

    restore(FileEntry.from_json(record))
    assert (root / "wal" / "x.xlog").read_bytes() == source.read_bytes()
    (root / "wal" / "x.xlog").unlink()
    with pytest.raises(ObjectDamaged, match="objects/big.zst"):
        restore(FileEntry.from_json({**record, "sha256": "0" * 64}))
    assert list((root / "wal").iterdir()) == []


@pytest.mark.parametrize("change", ["grown", "truncated"])
def test_source_changing_while_copied(repo_target, tmp_path, change):
    """The source file really changes after the first stored chunk; its copy is refused and removed."""
    repo = repo_target.repository()
    source = tmp_path / "source"
    source.write_bytes(os.urandom(4 << 20))
    write = repo.storage.write

    def write_while_the_source_changes(name, chunks):
        def changed():
            for i, chunk in enumerate(chunks):
                if i == 1:
                    if change == "grown":
                        with open(source, "ab") as f:
                            f.write(b"appended row")
                    else:
                        os.truncate(source, 1 << 20)
                yield chunk
        return write(name, changed())

    repo.storage.write = write_while_the_source_changes
    with pytest.raises(SourceChanged, match="changed while it was copied"):
        repo.put_object("objects/a.zst", source)
    del repo.storage.write
    assert not repo.storage.exists("objects/a.zst")
    assert repo.storage.list("objects") == []


# -- 7. leases


LEASE = "locks/tarantool-inst.lease"


def hand_lease(repo: Repository, **fields) -> None:
    now = time.time()
    repo.storage.write_bytes(LEASE, json.dumps({"holder": "someone", "command": "old-backup", "host": "elsewhere",
                                                "pid": 4242, "taken": now - 100, "expires": now + 3600,
                                                **fields}).encode())


def test_lease_is_exclusive_until_released(plain_or_encrypted):
    repo = plain_or_encrypted.repository()
    lease = repo.lease("tarantool", "inst", "backup")
    try:
        assert lease.broke is None
        with pytest.raises(LeaseBusy, match=rf"backup \(pid {os.getpid()} on {socket.gethostname()}"):
            repo.lease("tarantool", "inst", "expire")
        other = repo.lease("tarantool", "other-inst", "backup")  # another source: its own lease
        other.release()
    finally:
        lease.release()
    assert not repo.storage.exists(LEASE)
    with repo.lease("tarantool", "inst", "expire") as again:
        assert json.loads(repo.storage.read_bytes(LEASE))["holder"] == again.holder
    assert not repo.storage.exists(LEASE)


def test_expired_lease_is_broken(plain_or_encrypted):
    repo = plain_or_encrypted.repository()
    hand_lease(repo, expires=time.time() - 100)
    with repo.lease("tarantool", "inst", "backup") as lease:
        assert "old-backup" in lease.broke and "pid 4242 on elsewhere" in lease.broke
        assert json.loads(repo.storage.read_bytes(LEASE))["holder"] == lease.holder
        assert repo.storage.list("locks") == [LEASE]  # the broken one is gone


def test_lease_of_a_dead_process_on_this_host_is_broken(repo_target):
    repo = repo_target.repository()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid names no process
    hand_lease(repo, host=socket.gethostname(), pid=child.pid)
    with repo.lease("tarantool", "inst", "backup") as lease:
        assert f"pid {child.pid}" in lease.broke


def test_unexpired_lease_of_a_live_process_holds(repo_target):
    repo = repo_target.repository()
    hand_lease(repo, host=socket.gethostname(), pid=os.getpid())
    with pytest.raises(LeaseBusy, match="old-backup"):
        repo.lease("tarantool", "inst", "backup")
    hand_lease(repo)  # on another host: its pid cannot be checked, its expiry rules
    with pytest.raises(LeaseBusy, match="old-backup"):
        repo.lease("tarantool", "inst", "backup")


def test_an_expired_lease_of_this_host_without_a_start_time_is_judged_by_its_age(repo_target):
    """A live process holding a lease that records its start time is never broken by age; a lease without one (no
    /proc where it was taken, an older walvault's) names a pid that may be a later process's: its expiry rules."""
    from walcore.repository.lease import process_start

    repo = repo_target.repository()
    here = {"host": socket.gethostname(), "pid": os.getpid(), "expires": time.time() - 100}
    hand_lease(repo, **here, pid_start=process_start(os.getpid()))
    with pytest.raises(LeaseBusy, match="old-backup"):
        repo.lease("tarantool", "inst", "backup")
    hand_lease(repo, **here)
    with repo.lease("tarantool", "inst", "backup") as lease:
        assert f"pid {os.getpid()} on {socket.gethostname()}" in lease.broke


def test_young_empty_lease_holds_junk_one_is_named(plain_or_encrypted):
    """An empty lease (a create seen before its write, by an older walvault) is judged by its age: a young one
    holds. Anything else that is not a lease stops with its name, whatever its age."""
    repo = plain_or_encrypted.repository()
    repo.storage.write_bytes(LEASE, b"")
    with pytest.raises(LeaseBusy):
        repo.lease("tarantool", "inst", "backup")
    for body in (b'{"holder": "torn', b"[]", b"null"):
        repo.storage.write_bytes(LEASE, body)
        with pytest.raises(LeaseUnreadable, match=f"remove {LEASE} once you know no walvault process"):
            repo.lease("tarantool", "inst", "backup")


def test_lease_wait_for_a_holder_that_releases(plain_or_encrypted):
    repo = plain_or_encrypted.repository()
    holder = repo.lease("tarantool", "inst", "backup")
    release = threading.Timer(0.5, holder.release)
    release.start()
    try:
        with repo.lease("tarantool", "inst", "expire", wait=30) as waiter:
            assert waiter.broke is None
            assert json.loads(repo.storage.read_bytes(LEASE))["holder"] == waiter.holder
    finally:
        release.join()


def test_lease_is_renewed_while_held(plain_or_encrypted):
    repo = plain_or_encrypted.repository()
    with repo.lease("tarantool", "inst", "backup", ttl=1.0) as lease:
        time.sleep(2.5)  # well past its first expiry
        with pytest.raises(LeaseBusy):
            acquire(repo.storage, LEASE, "expire", ttl=1.0)
        assert json.loads(repo.storage.read_bytes(LEASE))["holder"] == lease.holder


# -- 8. credentials and options


def test_unreachable_store_error_holds_no_secret_s3_only():
    options = {"key": "AKIAWALVAULTTEST", "secret": SECRET, "endpoint_url": "http://127.0.0.1:1",
               "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2}}
    storage = open_storage("s3://walvault-unreachable/repo", options)
    for operation in ("exists", "read_bytes", "write_bytes", "create", "list"):
        with pytest.raises(RepositoryError) as e:
            OPERATIONS[operation](storage, "walvault.repo")
        assert SECRET not in str(e.value) and SECRET not in repr(e.value)
        assert "walvault.repo" in str(e.value) or operation == "list"
    with pytest.raises(RepositoryError) as e:
        Repository("s3://walvault-unreachable/repo", options)
    assert SECRET not in str(e.value)


def test_secrets_are_removed_from_errors(repo_target, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "walvault-session-token-456")
    storage = storage_of(repo_target, secret=SECRET)
    error = storage.error("cannot read x", OSError(f"denied for {SECRET} with walvault-session-token-456"))
    assert isinstance(error, RepositoryError)
    assert SECRET not in str(error) and "walvault-session-token-456" not in str(error)
    assert "cannot read x" in str(error)


def test_options_from_the_environment_must_be_an_object(repo_target, monkeypatch):
    for bad in ("not json", "[1, 2]", '"text"'):
        monkeypatch.setenv("WALVAULT_REPO_OPTIONS", bad)
        with pytest.raises(RepositoryError, match="WALVAULT_REPO_OPTIONS is not a JSON object"):
            storage_of(repo_target)


def test_a_local_url_names_the_directory_fsspec_named(tmp_path, monkeypatch):
    """A local repository's root is where fsspec's split put it: `file://` and `local://` are schemes, one letter
    before `://` is none (fsspec takes it for a Windows drive), so `x://repo` is the directory `x:/repo` here."""
    monkeypatch.chdir(tmp_path)
    for url, root in (("file://repo", "repo"), ("local:///abs/repo", "/abs/repo"), ("x://repo", "x:/repo"),
                      ("repo/", "repo")):
        assert open_storage(url).root == str(tmp_path / root)


def test_redact_url():
    assert redact_url("sftp://backup:pw-123@host/path") == "sftp://backup:***@host/path"
    assert redact_url("sftp://backup:p@ss@host/path") == "sftp://backup:***@host/path"
    assert redact_url("sftp://backup:pw@host?mail=a@b") == "sftp://backup:***@host?mail=a@b"
    assert redact_url("https://host/x?token=abc&part=1&access_key=k") \
        == "https://host/x?token=***&part=1&access_key=***"
    assert redact_url("s3://bucket/prefix") == "s3://bucket/prefix"
    assert redact_url("/var/backups/repo") == "/var/backups/repo"


def test_parse_options():
    assert parse_options(["a.b=1", "a.c=x", "json={\"k\": [1, true]}", "flag=true", "endpoint_url=http://h:9000"]) \
        == {"a": {"b": 1, "c": "x"}, "json": {"k": [1, True]}, "flag": True, "endpoint_url": "http://h:9000"}
    assert parse_options(["empty="]) == {"empty": ""}
    for bad in (["no-equals"], ["=value"], ["a=1", "a.b=2"]):
        with pytest.raises(RepositoryError):
            parse_options(bad)


# -- 9. backups and chains


FULL = "20260101-120000F"
INCR = f"{FULL}_20260102-120000I"


def hand_manifest(repo: Repository, backup_id: str, *, parent: str | None = None, stored_as: str | None = None,
                  finished: str = "2026-01-01T12:05:00Z", instance: str = "inst") -> dict:
    obj = {"id": backup_id, "type": "incremental" if parent else "full", "parent": parent, "family": "tarantool",
           "source": {"instance": instance}, "walvault": "test", "started": finished, "finished": finished,
           "position": {"vclock": {"1": 10}}, "compression": {"type": "zstd", "level": 3}, "files": [],
           "checks": {}, "format": 1}
    save_checked(repo.storage, f"{repo.backup_dir('tarantool', instance, stored_as or backup_id)}/backup.manifest", obj)
    return obj


def test_backups_find_and_chain(plain_or_encrypted):
    repo = plain_or_encrypted.repository()
    hand_manifest(repo, FULL)
    hand_manifest(repo, INCR, parent=FULL, finished="2026-01-02T12:05:00Z")
    records = repo.backups()
    assert [(r.id, r.problem, r.complete) for r in records] == [(FULL, None, True), (INCR, None, True)]
    latest = repo.find("latest")
    assert latest.id == INCR
    assert [m.id for m in repo.chain(latest.manifest)] == [FULL, INCR]
    assert [m.id for m in repo.chain(repo.find(FULL).manifest)] == [FULL]
    with pytest.raises(RepositoryError, match="no backup 20990101-000000F"):
        repo.find("20990101-000000F")


def test_chain_with_missing_parent(repo_target):
    repo = repo_target.repository()
    hand_manifest(repo, INCR, parent=FULL)
    with pytest.raises(RepositoryError, match=f"needs its parent {FULL}"):
        repo.chain(repo.find(INCR).manifest)


def test_chain_that_loops(repo_target):
    repo = repo_target.repository()
    hand_manifest(repo, INCR, parent=INCR)
    with pytest.raises(RepositoryError, match="loops"):
        repo.chain(repo.find(INCR).manifest)


def test_manifest_stored_under_another_id(repo_target):
    repo = repo_target.repository()
    hand_manifest(repo, FULL, stored_as="20260105-000000F")
    record, = repo.backups()
    assert record.id == "20260105-000000F" and record.manifest is None
    assert "not the one it is stored as" in record.problem
    with pytest.raises(RepositoryError, match="cannot be used"):
        repo.find("20260105-000000F")
    with pytest.raises(RepositoryError, match="holds no backup"):
        repo.find("latest")


def test_backup_without_manifest_is_incomplete(repo_target):
    repo = repo_target.repository()
    hand_manifest(repo, FULL)
    leftovers = "20260103-000000F"
    repo.storage.write_bytes(f"{repo.backup_dir('tarantool', 'inst', leftovers)}/00000000000000000000.xlog.zst", b"x")
    by_id = {r.id: r for r in repo.backups()}
    assert by_id[leftovers].complete is False and by_id[leftovers].manifest is None
    assert by_id[FULL].complete is True
    assert repo.find("latest").id == FULL


def test_damaged_manifest_is_not_taken_for_leftovers(repo_target):
    """Main damaged: the copy is used and said so; copy gone too: a problem, but never `complete=False` (which
    would let leftover removal delete it)."""
    repo = repo_target.repository()
    hand_manifest(repo, FULL)
    name = f"{repo.backup_dir('tarantool', 'inst', FULL)}/backup.manifest"
    repo.storage.write_bytes(name, repo.storage.read_bytes(name).replace(b"12:05", b"12:06"))
    record, = repo.backups()
    assert record.manifest is not None and record.manifest.finished == "2026-01-01T12:05:00Z"
    assert "backup.manifest.copy was used" in record.problem
    repo.storage.remove(name + ".copy")
    record, = repo.backups()
    assert record.manifest is None and record.complete is True
    assert "does not match its checksum" in record.problem


def test_latest_of_a_repository_holding_several_sources_must_be_named(repo_target):
    """`latest` would restore whichever source backed up last, which may not be the one meant."""
    repo = repo_target.repository()
    hand_manifest(repo, FULL, instance="first")
    hand_manifest(repo, "20260103-120000F", instance="second", finished="2026-01-03T12:05:00Z")
    with pytest.raises(RepositoryError, match="backups of 2 sources; name the backup: 20260101-120000F"):
        repo.find("latest")
    assert repo.find(FULL).instance == "first"


def test_a_bad_option_is_not_echoed():
    with pytest.raises(RepositoryError) as error:
        parse_options(["secret-without-equals"])
    assert "secret-without-equals" not in str(error.value)



def test_lease_of_a_killed_process_not_yet_reaped_is_broken(repo_target):
    """A killed holder stays a zombie until its parent reaps it (a Spark job's driver, whose JVM parent died with
    it, waits for init): its lease is broken all the same."""
    repo = repo_target.repository()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.01)
    try:
        hand_lease(repo, host=socket.gethostname(), pid=child.pid)  # unexpired
        with repo.lease("tarantool", "inst", "backup") as lease:
            assert f"pid {child.pid}" in lease.broke
    finally:
        child.wait()


def test_a_threaded_hash_reports_its_failure_and_never_blocks_its_feeder():
    """fsutil.Sha256 on a thread: its digest so far, then more; a hasher that fails (a stand-in object: a real
    hashlib one does not fail on bytes) is raised by hexdigest(), and the feeder, giving more chunks than the
    queue holds, does not block on the dead thread."""
    from walcore.fsutil import Sha256

    with Sha256(threaded=True) as h:
        h.update(b"abc")
        first = h.hexdigest()
        h.update(b"def")
        assert (first, h.hexdigest()) == (hashlib.sha256(b"abc").hexdigest(), hashlib.sha256(b"abcdef").hexdigest())

    class FailingHasher:  # a stand-in: fails on its third chunk
        calls = 0

        def update(self, data):
            FailingHasher.calls += 1
            if FailingHasher.calls == 3:
                raise MemoryError("the third chunk")

    done = threading.Event()

    def feed():
        with Sha256(threaded=True, hasher=FailingHasher()) as h:
            for _ in range(64):  # eight times what the queue holds
                h.update(b"x" * 1024)
            with pytest.raises(MemoryError, match="the third chunk"):
                h.hexdigest()
        done.set()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    feeder.join(30)
    assert done.is_set(), "the feeder blocked on the hashing thread"

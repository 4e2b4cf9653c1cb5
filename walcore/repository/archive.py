"""A source's archive in the repository: each archived file's record (the commit point of its archiving), the
tombstones retention leaves, and how far a limestone source's log is archived whole. The archive command writes
them; restore, snapshot, expire and the repository's verification read them."""

from __future__ import annotations

import os
from pathlib import Path

from ..fsutil import file_sha256
from . import Repository, utc_now
from .manifest import FileEntry, ManifestError, decode_checked, encode_checked
from .storage import UnsafeName

RECORD_SUFFIX = ".json"
STREAM_DIR = "stream"  # a source's segments from `walvault stream`, beside its archive
DIFFERS_SUFFIX = ".differs.json"  # beside a segment: the archived xlog holds other bytes for one of its rows
EXPIRED_SUFFIX = ".expired"  # a tombstone: retention deleted these bytes; archiving them again would undo it


def load_archived(repo: Repository, family: str, instance: str) -> list[FileEntry | None]:
    """Every archive record of a source (None for one that cannot be read)."""
    prefix = f"{repo.source_dir(family, instance)}/archive"
    out = []
    for name in repo.storage.list(prefix):
        if name.endswith(".zst" + RECORD_SUFFIX):
            out.append(load_record(repo, name))
    return out


class SegmentGone(Exception):
    """A segment listed a moment ago is gone: an archive superseded it meanwhile (its rows are in an archived xlog
    now). A reader that planned with it plans again, from the archive as it is now."""


def segment_records(repo: Repository, family: str, instance: str) -> list[str]:
    """The record names of the source's stored stream segments, in log order, from one listing (no record read).
    The order is the names': a segment is named by its start vclock's sum, and within one history of the instance
    each one starts past the one before (component 0 included: a stream starts at the largest component 0 the
    repository holds)."""
    prefix = f"{repo.source_dir(family, instance)}/{STREAM_DIR}"
    return [n for n in repo.storage.list(prefix) if n.endswith(".zst" + RECORD_SUFFIX)]


def stored_segments(repo: Repository, family: str, instance: str) -> list[FileEntry]:
    """Every stored stream object of the source whose record reads, by name: each record read (what a limestone
    stream holds is read whole; a Tarantool stream's readers take the newest segments only, newest_segments)."""
    return [e for e in (load_record(repo, n) for n in segment_records(repo, family, instance)) if e is not None]


def newest_segments(repo: Repository, family: str, instance: str, back_to) -> list[FileEntry]:
    """The source's newest stored stream segments whose record reads, in log order: their records are read from
    the newest back, and the reading stops at the first one `back_to` (a test of an entry) accepts, that one
    included. A reader that needs the newest segments thus reads no record of the older ones — at 1-second
    segments the records are thousands an hour, and the names alone order them (segment_records). SegmentGone
    when a listed record is gone before it is read."""
    return [entry for entry, _record in _newest_records(repo, family, instance, back_to)]


def _newest_records(repo: Repository, family: str, instance: str, back_to) -> list[tuple[FileEntry, dict]]:
    found = []
    for name in reversed(segment_records(repo, family, instance)):
        try:
            data = repo.storage.read_bytes(name)
        except FileNotFoundError:
            raise SegmentGone(f"{name} was removed after it was listed (superseded by an archived xlog)") from None
        try:
            record = decode_checked(data, name)
            entry = FileEntry.from_json(record)
        except (ManifestError, UnsafeName):
            continue
        found.append((entry, record))
        if back_to(entry):
            break
    return found[::-1]


def newest_segment(repo: Repository, family: str, instance: str) -> FileEntry | None:
    """The source's newest stored segment (one record read), listed again when an archive superseded it meanwhile:
    within one history its end reaches every other segment's, component by component."""
    newest = newest_segment_record(repo, family, instance)
    return newest and newest[0]


def newest_segment_record(repo: Repository, family: str, instance: str) -> tuple[FileEntry, dict] | None:
    """newest_segment with its whole record (what the streamer that stored it kept beside the entry)."""
    while True:
        try:
            return next(iter(_newest_records(repo, family, instance, back_to=lambda _entry: True)), None)
        except SegmentGone:
            continue


def segment_differences(repo: Repository, family: str, instance: str) -> list[dict]:
    """What each segment an archived xlog disagrees with says (written by the archive that found it, beside the
    segment, which is kept): {"segment", "xlog", "row", "message"}."""
    prefix = f"{repo.source_dir(family, instance)}/{STREAM_DIR}"
    found = []
    for name in repo.storage.list(prefix):
        if name.endswith(DIFFERS_SUFFIX):
            try:
                found.append(decode_checked(repo.storage.read_bytes(name), name))
            except (FileNotFoundError, ManifestError):
                found.append({"segment": name[:-len(DIFFERS_SUFFIX)], "xlog": None, "row": None,
                              "message": f"{name}: an archive found the segment differs from an archived xlog; "
                                         "what it found cannot be read"})
    return found


def load_record(repo: Repository, name: str) -> FileEntry | None:
    """An archive record (None when it cannot be read)."""
    loaded = _load_raw(repo, name)
    return loaded and loaded[0]


def _load_raw(repo: Repository, name: str) -> tuple[FileEntry, dict] | None:
    try:
        record = decode_checked(repo.storage.read_bytes(name), name)
        return FileEntry.from_json(record), record
    except (FileNotFoundError, ManifestError, UnsafeName):
        return None


def commit_record(repo: Repository, record_name: str, entry: FileEntry, origin: dict) -> str | None:
    """Create the record of a stored object (its entry and `origin`: where it came from), exclusively; then make
    sure the object it names is still the one stored (an expiry that took it for an orphan meanwhile removed it:
    the record goes too). None when committed, else why not. The caller proved its lease just before."""
    data = encode_checked({**entry.to_json(), "archived": utc_now(), **origin})
    if not repo.storage.create(record_name, data):
        found = load_record(repo, record_name)
        if found is None:  # a damaged record (taken for none): replaced, under the lease just proven
            repo.storage.write_bytes(record_name, data)
        elif (found.stored, found.sha256, found.stored_sha256) != (entry.stored, entry.sha256, entry.stored_sha256):
            return f"{record_name} was written by another process meanwhile: store the file again"
    try:
        size = repo.storage.size(entry.stored)
    except FileNotFoundError:
        size = None
    if size != entry.stored_size:
        repo.storage.remove(record_name)
        return f"{entry.stored} was removed or replaced while its record was written (an expiry took it for an " \
               "orphan): store the file again"
    return None


def source_archive(repo: Repository, family: str, instance: str, source: dict,
                   root: Path | None = None) -> list[FileEntry | None]:
    """The archive records of one source directory (`source`: a manifest's host and path), None for one that
    cannot be read. A copy of the directory shares the instance, and its files are another history's — but for
    those it holds too (`root`: the directory, when at hand: the same name, size and SHA-256), archived once from
    wherever they were first. A record that does not say where it came from (an older walvault's, with a relative
    path) counts only while no record names another directory."""
    return split_archive(repo, family, instance, source, root)[0]


def split_archive(repo: Repository, family: str, instance: str, source: dict,
                  root: Path | None = None) -> tuple[list[FileEntry | None], list[FileEntry | None]]:
    """(the records of one source directory, as source_archive says, every record of the instance), from one
    reading of the archive."""
    prefix = f"{repo.source_dir(family, instance)}/archive"
    own, unknown, other, everyone = [], [], False, []
    for name in repo.storage.list(prefix):
        if not name.endswith(".zst" + RECORD_SUFFIX):
            continue
        loaded = _load_raw(repo, name)
        everyone.append(loaded and loaded[0])
        origin = loaded and _record_origin(*loaded)
        if loaded is None:
            own.append(None)
        elif origin is None:
            unknown.append(loaded[0])
        elif origin[1] == source.get("path") and origin[0] in (None, source.get("host")) or _holds(root, loaded[0]):
            own.append(loaded[0])
        else:
            other = True
    return (own if other else own + unknown), everyone


def archive_origins(repo: Repository, family: str, instance: str) -> set[tuple[str | None, str]]:
    """The (host, source directory) each readable archive record of the instance says it came from (a record of
    an older walvault that does not say is left out)."""
    prefix = f"{repo.source_dir(family, instance)}/archive"
    loaded = (_load_raw(repo, n) for n in repo.storage.list(prefix) if n.endswith(".zst" + RECORD_SUFFIX))
    return {origin for record in loaded if record is not None and (origin := _record_origin(*record)) is not None}


def _holds(root: Path | None, entry: FileEntry) -> bool:
    if root is None or not (root / entry.name).is_file() or (root / entry.name).stat().st_size != entry.size:
        return False
    return file_sha256(root / entry.name) == entry.sha256


def _record_origin(entry: FileEntry, record: dict) -> tuple | None:
    if isinstance(record.get("source_dir"), str):
        return record.get("host"), record["source_dir"]
    source = record.get("source")
    if not isinstance(source, str) or not os.path.isabs(source) or not source.endswith("/" + entry.name):
        return None
    return record.get("host"), source[:-len(entry.name) - 1]


def complete_name(repo: Repository, family: str, instance: str) -> str:
    return f"{repo.source_dir(family, instance)}/archive-complete.json"


def archive_complete(repo: Repository, family: str, instance: str, source: dict | None = None) -> int | None:
    """The epoch up to which every durable entry of the source is in an archived file (None: not recorded); with
    `source` (a manifest's host and path), up to which that directory's are: two directories of one instance (a
    copy) are archived apart."""
    try:
        record = decode_checked(repo.storage.read_bytes(complete_name(repo, family, instance)), "archive-complete")
    except (FileNotFoundError, ManifestError):
        return None
    epoch = record.get("epoch") if isinstance(record.get("epoch"), int) else None
    per = record.get("sources")
    if source is None or not isinstance(per, dict):  # recorded by an older walvault: for the instance
        return epoch
    found = per.get(source_key(source.get("host"), source.get("path")))
    return found if isinstance(found, int) else 0


def source_key(host, path) -> str:
    return f"{host}:{path}"

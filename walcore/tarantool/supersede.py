"""The stream's segments superseded by the source's own archived xlogs.

A segment holds, byte for byte, the rows the instance's xlog holds (measured on Tarantool 2.6: 11,308 of 11,308
rows equal by replica id and LSN), less the rows of is_local spaces (replica id 0, never sent). A transaction whose
last statement is local ends with a NOP row carrying the commit flag, and that NOP is in the xlog too (Tarantool
writes it there, with its replica id and LSN): it is compared as any row. So once the sealed xlogs covering a
segment are archived, every row of the segment must be in them with the same bytes, and the segment is no longer
needed: the xlog holds more (the local rows).

A segment is deleted only when each of its rows is found, equal, in archived xlogs that verified; one whose rows
reach past the newest archived xlog (straddling its end) stays until the next one is archived. Nor is any segment
after one holding rows no archived xlog holds (an xlog the instance removed before it was archived): a restore from a
base before those rows reaches them through the segments only, and the log past them through the segments after, not
through the xlog. A row that differs, or that an xlog covering it does not hold, is a finding: the segment is
kept, and `<segment>.differs.json` beside it says which row and which xlog (verify --repo and status report it; it
is not compared again). Deleting runs under the source's archive lease (an expiry deletes under it too), never
while a restore of the source is in progress (its pin), record first (the commit point: a restore that listed the
segment and then misses it plans again).

The rows are compared in one pass: the stream sends the rows in the order of the instance's WAL, so the segments'
rows, oldest first, and the archived xlogs' replicated rows, in chain order, are merged; memory holds one row of
each, disk one segment and one xlog at a time.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..backup_common import Progress
from ..fsutil import owned_tempdir
from ..repository import ObjectDamaged, Repository, utc_now
from ..repository.archive import (DIFFERS_SUFFIX, RECORD_SUFFIX, STREAM_DIR, archive_origins, load_archived,
                                  load_record)
from ..repository.manifest import FileEntry, encode_checked
from ..repository.materialize import materialize
from .meta import vclock_from_json, vclock_leq
from .row import LSN, REPLICA_ID
from .segments import file_rows

Key = tuple[int, int]  # (replica id, LSN): a row's identity in the log


@dataclass
class Superseding:
    deleted: list[str] = field(default_factory=list)  # the segments' objects, deleted with their records
    differs: list[dict] = field(default_factory=list)  # {"segment", "xlog", "row", "message"}


def supersede(repo: Repository, family: str, instance: str, lease) -> Superseding:
    """Delete the instance's segments whose rows its archived, verified xlogs hold; say those that differ."""
    done = Superseding()
    names = repo.storage.list(f"{repo.source_dir(family, instance)}/{STREAM_DIR}")
    differing = {n[:-len(DIFFERS_SUFFIX)] for n in names if n.endswith(DIFFERS_SUFFIX)}
    records = [n for n in names if n.endswith(".zst" + RECORD_SUFFIX) and n[:-len(RECORD_SUFFIX)] not in differing]
    if not records:
        return done
    archived = [e for e in load_archived(repo, family, instance) if e is not None]
    if any(".conflict-" in e.stored for e in archived) or len(archive_origins(repo, family, instance)) > 1:
        # two histories of the instance, or two directories (a copy): a restore may follow another one's xlogs
        return done
    xlogs = sorted((span for e in archived if e.kind == "xlog" and e.verification.get("status") == "ok"
                    and e.verification.get("vclock") is not None for span in [_xlog_span(e)]),
                   key=lambda span: sum(span[0].values()))
    if not xlogs:
        return done
    reach: dict[int, int] = {}
    for _begins, ends, _e in xlogs:
        for r, lsn in ends.items():
            reach[r] = max(reach.get(r, 0), lsn)
    candidates = []  # oldest first; the first that begins at the archive's reach ends the reading
    for name in records:
        entry = load_record(repo, name)
        if entry is None or not isinstance(entry.range.get("vclock"), list):
            continue
        first = _replicated(vclock_from_json(entry.range["vclock"][0]))
        if vclock_leq(reach, first):
            break
        candidates.append(entry)
    if not candidates:
        return done
    start = _replicated(vclock_from_json(candidates[0].range["vclock"][0]))
    scratch = owned_tempdir("walvault-supersede-")
    try:
        overlapping = [span for span in xlogs if not vclock_leq(span[1], start)]
        cursor = _XlogRows(repo, [e for _b, _e, e in overlapping], scratch)
        proven = []
        for entry in candidates:
            try:
                verdict = _compare(repo, entry, overlapping, cursor, scratch)
            except _XlogUnreadable:
                break  # no row past here is compared (verify --repo names the damage)
            except (ObjectDamaged, ValueError):
                continue  # a damaged segment is kept: verify --repo names it
            if verdict is None:
                proven.append(entry)
            elif verdict == "straddles":
                break  # rows no archived xlog holds: a restore from before them goes on through the segments after
            else:
                done.differs.append(verdict)
                lease.confirm()
                repo.storage.create(entry.stored + DIFFERS_SUFFIX, encode_checked({**verdict, "found": utc_now()}))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for entry in proven:  # oldest first
        lease.confirm()
        if repo.restores_in_progress(family, instance):
            break  # the next archive deletes them
        repo.storage.remove(entry.stored + RECORD_SUFFIX)
        repo.storage.remove(entry.stored)
        done.deleted.append(entry.stored)
    return done


def _compare(repo: Repository, entry: FileEntry, xlogs: list, cursor: _XlogRows, scratch: Path) -> dict | str | None:
    """None: every row of the segment is in the archived xlogs, equal; "straddles": some are past them (none
    differs); else the first difference."""
    path = scratch / "segment.xlog"
    materialize(repo, [(path.name, entry)], scratch, Progress(1, entry.size, False, "read"))
    straddles = False
    try:
        for header, row in file_rows(path):
            key = (header.get(REPLICA_ID, 0), header[LSN])
            if not any(begins.get(key[0], 0) < key[1] <= ends.get(key[0], 0) for begins, ends, _e in xlogs):
                straddles = True
                continue
            found = cursor.seek(key)
            where = cursor.current.stored if cursor.current is not None else None
            if found is None:
                return _differs(entry, where, key, "the archived xlogs that cover it do not hold this row")
            if found != row:
                return _differs(entry, where, key, f"the archived xlog holds other bytes for this row ({len(found)} "
                                                   f"bytes, the segment {len(row)})")
    finally:
        path.unlink(missing_ok=True)
    return "straddles" if straddles else None


def _differs(entry: FileEntry, xlog: str | None, key: Key, message: str) -> dict:
    return {"segment": entry.stored, "xlog": xlog, "row": f"{key[0]}:{key[1]}", "message": message}


class _XlogUnreadable(Exception):
    """An archived xlog could not be read whole: nothing is compared with it."""


class _XlogRows:
    """The replicated rows of archived xlogs (chain order), read one xlog at a time from the repository."""

    def __init__(self, repo: Repository, xlogs: list[FileEntry], scratch: Path):
        self.repo, self.pending, self.scratch = repo, list(xlogs), scratch
        self.current: FileEntry | None = None
        self._rows: Iterator[tuple[Key, bytes]] = iter(())
        self._head: tuple[Key, bytes] | None = None

    def _peek(self) -> tuple[Key, bytes] | None:
        while self._head is None:
            try:
                self._head = next(self._rows)
            except StopIteration:
                if not self.pending:
                    return None
                self._open(self.pending.pop(0))
            except ValueError as e:
                raise _XlogUnreadable(str(e)) from None
        return self._head

    def _open(self, entry: FileEntry) -> None:
        path = self.scratch / "xlog.xlog"
        path.unlink(missing_ok=True)
        try:
            materialize(self.repo, [(path.name, entry)], self.scratch, Progress(1, entry.size, False, "read"))
        except ObjectDamaged as e:
            raise _XlogUnreadable(str(e)) from None
        self.current = entry
        self._rows = ((key, row) for header, row in file_rows(path)
                      if (key := (header.get(REPLICA_ID, 0), header[LSN]))[0])  # replica id 0: a local row

    def seek(self, key: Key) -> bytes | None:
        """The bytes of the row `key`, the rows before it passed over; None when the rows of its replica id go
        past it without it (what comes after stays for the next seek)."""
        while (head := self._peek()) is not None:
            if head[0] == key:
                self._head = None
                return head[1]
            if head[0][0] == key[0] and head[0][1] > key[1]:
                return None
            self._head = None
        return None


def _xlog_span(e: FileEntry) -> tuple[dict[int, int], dict[int, int], FileEntry]:
    """(the vclock it begins at, the vclock after its last row), replicated components only, and the entry."""
    begins = _replicated(vclock_from_json(e.verification["vclock"]))
    ends = dict(begins)
    for component, lsns in (e.verification.get("lsns") or {}).items():
        if int(component):
            ends[int(component)] = lsns[1]
    return begins, ends, e


def _replicated(vclock: dict[int, int]) -> dict[int, int]:
    """Without component 0: a segment holds no local row, its component 0 is where its stream started."""
    return {k: v for k, v in vclock.items() if k and v}

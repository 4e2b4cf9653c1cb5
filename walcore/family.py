"""The database families walvault knows (as WAL-G's internal/databases/*): what each one does its own way behind
one interface (plan a backup, archive items, position order and coverage, snapshots, point restore, prove a
restore), so that the commands say `family_named(name).…` and never `if family == …`. Implemented by
walcore.tarantool.family and walcore.limestone.family."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .backup_common import ArchiveItem, BackupResult
from .findings import Refused
from .repository import Repository
from .repository.manifest import BackupManifest, FileEntry


class Family(Protocol):
    name: str
    uses_ledger: bool  # whether a verdict on a sealed file's bytes holds wherever they are (the ledger keeps it)
    rewritten_kinds: tuple[str, ...]  # files the database rewrites in place: each content archived by its hash
    stream_note: str | None  # what `walvault stream` does not hold of the source's log, as status says it

    def plan(self, source: Path, connect: str | None, *, snapshot: bool):
        """The plan of a backup of a source directory of the family: what to store and how to verify it, and how
        its log goes on from a parent backup's (lineage_kinds, renamed_since, not_behind: backup_common.store_set
        reads them)."""

    def snapshot(self, source: Path, repo: Repository, *, connect: str | None, level: int, runner, progress: bool,
                 wait: float) -> BackupResult:
        """A verified snapshot of the source that covers its log up to a recorded position (the snapshot command)."""

    def follow(self, source: Path, repo: Repository, *, seconds: float, status_file: Path | None, stop, say):
        """Store the durable log of a source directory on this host every `seconds` until `stop` (a
        threading.Event) is set (`walvault stream SOURCE`); returns the final state (its `to_json`, `problems`)."""

    def archive_items(self, report, result) -> list[ArchiveItem]:
        """The family's sealed files of a verified report (scan_paths.Report) to archive; the others go to the
        result's (command.archive.ArchiveResult) not_sealed or refused."""

    def archive_sources(self, report) -> set[tuple[str, str]]:
        """(family, instance) of each source of a report whose archive lease an archive takes beyond its items'."""

    def record_archived(self, repo: Repository, report, archived: set[str], leases: dict, result) -> None:
        """What the family records once the items of a report are archived (`archived`: their paths), under the
        archive leases by (family, instance); and what archiving them makes unneeded (the result's superseded,
        and what disagrees: its differs)."""

    def archived_verification(self, item: ArchiveItem) -> dict:
        """The verdict an archived file's record keeps."""

    def archived_range(self, item: ArchiveItem) -> dict:
        """An archived file's range in the log, as its record keeps it."""

    def position_key(self, m: BackupManifest) -> tuple:
        """Orders backups: by log position first, the finish time only between two at the same position."""

    def snapshot_of(self, m: BackupManifest) -> tuple[object, float] | None:
        """(position, time) of the verified snapshot a backup holds, or None."""

    def snapshot_rank(self, position) -> int:
        """Orders snapshots' positions: which reaches furthest in the log."""

    def describe_position(self, position) -> dict:
        """A snapshot's position as reports say it."""

    def backup_time(self, m: BackupManifest) -> float:
        """When the point a backup restores to was written, by the log's own time where the log says it."""

    def coverage(self, anchor: BackupManifest) -> Callable[[FileEntry], tuple[bool, int]]:
        """Judges archived files: whether the anchor's snapshot covers a file's whole range, and its rank in the
        log."""

    def log_end(self, repo: Repository, entry: FileEntry) -> float | None:
        """When an archived file's log ends, by the log's own time (None: it does not say)."""

    def archive_reach(self, repo: Repository, instance: str, source: dict,
                      entries: list[FileEntry]) -> tuple[int, dict, float | None] | None:
        """How far the archive of one source directory (`source`: a manifest's host and path; `entries`: its
        archive records) reaches in the log: (rank, the position as reports say it, when that point was written
        by the log's own time, None where the log does not say); None: it holds no log."""

    def source_reach(self, source: Path) -> tuple[int, dict, float | None] | None:
        """How far a source directory on this host reaches in the log, as archive_reach says it (None: it holds
        no log); read from its newest files only."""

    def stream_reach_entries(self, repo: Repository, instance: str) -> list[FileEntry]:
        """The records of `walvault stream`'s stored objects that say how far the stream reaches (archive_reach
        takes them), as few as say it: a stream stores thousands an hour."""

    def stream_behind(self, source_position: dict, stream_position: dict) -> bool:
        """Whether a source directory's log (source_reach's position) holds rows its stream (archive_reach's of the
        stream's segments) has not stored; rows a stream never carries do not count."""

    def source_instance(self, source: Path) -> str | None:
        """The instance a source directory on this host holds now, as its backups are kept under (None: its files
        do not say)."""

    def restored_name(self, entry: FileEntry) -> str:
        """Where a file of a backup goes in a restore: its place in the family's layout."""

    def finish_restore(self, manifest: BackupManifest, staging: Path) -> None:
        """What a whole backup restored into `staging` needs beside its files."""

    def point_restore(self, repo: Repository, manifest: BackupManifest, to: str, staging: Path,
                      progress: bool) -> tuple[int, dict, list, list[str]]:
        """A restore to the point `to` written into `staging`: (files reused, the point reached, the (name, entry)
        written, notes)."""

    def prove_restore(self, m: BackupManifest, target: Path, work: Path) -> str:
        """Prove a restore of the backup in `target` (`work`: a scratch directory); what was proven, or Refused."""


def family_named(name: str) -> Family:
    """The family of that name (one of repository.FAMILIES; KeyError for another), its module alone imported."""
    if name == "tarantool":
        from .tarantool.family import Tarantool

        return Tarantool()
    if name == "limestone":
        from .limestone.family import Limestone

        return Limestone()
    raise KeyError(name)


def family_of(source: Path) -> Family:
    """The family of a source directory; FileNotFoundError, or Refused when it is neither family's."""
    from .limestone.layout import is_limestone_dir
    from .tarantool.layout import discover

    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: {'not a directory' if source.exists() else 'no such directory'}")
    if is_limestone_dir(source):
        return family_named("limestone")
    if not discover([source]).data_dirs:
        raise Refused(f"{source} is neither a Tarantool data dir nor a limestone log directory", "cannot_check")
    return family_named("tarantool")


def plan_for(source: Path, connect: str | None = None, *, snapshot: bool = False, check_only: bool = False):
    """The family's plan for a source directory: what to store and how to verify it (with `check_only`, only that
    SOURCE is a directory of one of them)."""
    family = family_of(source)
    return None if check_only else family.plan(Path(source), connect, snapshot=snapshot)

"""Point-in-time restores: which stored files reach a point, and how they are cut there."""

from __future__ import annotations

import shutil
from pathlib import Path

from .backup_common import Progress
from .findings import Refused
from .fsutil import write_atomic
from .repository import Repository, stamp_seconds
from .repository.manifest import BackupManifest, FileEntry
from .repository.materialize import materialize, wal_dir_of
from .tarantool.meta import vclock_from_json, vclock_leq


SUPERSEDED_RETRIES = 5  # plans made again when an archive superseded a segment the plan used meanwhile


def tarantool_point(repo: Repository, newest: BackupManifest, to: str, staging: Path, progress: bool):
    """`to`: a point (tarantool/pitr.py's parse_point), or "end": the newest point this history reaches in the
    repository. Past the archived xlogs the log goes on through the stream's segments that continue it. An archive
    may supersede segments while the restore reads them (it deletes them once an archived xlog holds their rows,
    and waits for no restore that started after it looked): the restore then plans again from the archive as it is,
    where the xlog now holds those rows, rather than restore less."""
    return _planned_again(_tarantool_point, repo, newest, to, staging, progress)


def _planned_again(point_restore, *args):
    """A point restore, planned again while a stream's objects it listed were superseded meanwhile."""
    from .repository.archive import SegmentGone

    for _attempt in range(SUPERSEDED_RETRIES):
        try:
            return point_restore(*args)
        except SegmentGone as e:
            gone = e
    raise Refused(f"the stream's segments were superseded {SUPERSEDED_RETRIES} times while they were read (last: "
                  f"{gone}): run the restore again", "cannot_check")


def _tarantool_point(repo: Repository, newest: BackupManifest, to: str, staging: Path, progress: bool):
    from .tarantool.pitr import Point, PointError, cut_chain, parse_point
    from .tarantool.segments import build_tail
    from .tarantool.times import snapshot_taken
    from .tarantool.writer import file_name

    to_end = to.strip() == "end"
    try:
        point = None if to_end else parse_point(to)
    except ValueError as e:
        raise Refused(f"--to {to!r}: {e} (or end: the newest point the repository holds)", "refused") from None
    lineage = _Lineage(repo, newest)

    def snap_vclock(m: BackupManifest) -> dict[int, int]:
        return vclock_from_json(m.checks.get("snapshot", {}).get("vclock"))

    def before(m: BackupManifest) -> bool:
        if point is None:
            return True
        if point.vclock is not None:
            return vclock_leq(snap_vclock(m), point.vclock)
        taken = snapshot_taken(snap_vclock(m), m.checks.get("snapshot", {}).get("time"),
                               [e.range for versions in lineage.versions.values() for e in versions],
                               started=stamp_seconds(m.started), finished=stamp_seconds(m.finished))
        return taken <= point.time

    bases = [m for m in lineage.bases if before(m)]
    if not bases:
        raise Refused(f"no backup of {newest.instance} in the history of {newest.id} has a snapshot at or before "
                      f"{point.describe()}: no base to restore from", "refused")
    # the snapshot furthest along the log (one history: its snapshots' vclocks are ordered, and so are their sums),
    # never the latest clock: a backup host's clock ahead would make an older base win and the restore end short.
    # A time point has filtered them by their snapshot's own row time, the instance's clock, as the log's rows.
    base = max(bases, key=lambda m: (sum(snap_vclock(m).values()), m.finished, m.id))
    start = snap_vclock(base)
    chain, fork = lineage.log_from(start)
    log_end = _ends(chain[-1]) if chain else _nonzero(start)
    segments, segments_say = ([], None) if fork else _continuing_segments(repo, newest, log_end)
    if segments and chain and not vclock_leq(_nonzero(start), _ends(chain[-1])):
        # the base's snapshot is past the archived log, inside the segments: Tarantool replays no xlog that starts
        # before its snapshot (it takes the log for ended at the snapshot), so the tail starts at the snapshot
        chain = []
    if segments and chain and _begins(chain[-1]) == _ends(chain[-1]):
        # an xlog holding no row yet (a clean stop leaves one, and a backup then holds it) starts where the tail
        # built of the segments does, under the tail's name: the tail takes its place, and its PrevVClock
        chain = chain[:-1]
    base_files = [e for e in base.files if e.kind in ("snap", "vylog", "run", "index")]
    wal_dir = wal_dir_of(base)
    entries = [(e.name, e) for e in base_files]  # a Tarantool file is restored under its own name
    log_dir = staging / ".walvault-log"
    log_entries = [(Path(e.name).name, e) for e in chain]
    segment_entries = [(e.name, e) for e in segments]  # under stream/: apart from the chain's xlogs
    tracker = Progress(len(entries) + len(chain) + len(segments),
                       sum(e.size for _, e in entries + log_entries + segment_entries), progress, "restored")
    reused = materialize(repo, entries, staging, tracker)
    log_dir.mkdir(exist_ok=True)
    reused += materialize(repo, log_entries, log_dir, tracker)
    reused += _materialize_segments(repo, segment_entries, log_dir, tracker)
    xlogs = [log_dir / name for name, _ in log_entries]
    reach = log_end
    if segments:
        full_end = vclock_from_json(chain[-1].range["vclock"][1]) if chain else start
        tail = log_dir / file_name(full_end, "xlog")  # named as Tarantool names the xlog starting there
        try:
            reach = _nonzero(build_tail([log_dir / name for name, _ in segment_entries], full_end, tail,
                                        instance=newest.instance,
                                        prev=vclock_from_json(chain[-1].verification["vclock"]) if chain else None))
        except ValueError as e:
            raise Refused(f"the stream's segments do not continue the log at {_text(log_end)}: {e}", "refused") \
                from None
        if tail.exists():
            xlogs.append(tail)
    if to_end:
        point = Point(vclock=reach)
    out = staging / wal_dir
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.xlog"):  # an interrupted run's cut log (the wal dir may be the data dir itself)
        stale.unlink()
    try:
        result = cut_chain(xlogs, out, point, start_vclock=start)
    except PointError as e:
        said = "; ".join(filter(None, (fork, segments_say)))
        raise Refused(f"cannot restore to {point.describe()}: {e}" + (f"; {said}" if said else ""),
                      "refused") from None
    shutil.rmtree(log_dir)
    info = {"point": point.describe(), "base": base.id, "xlogs": result.files, "cut": result.cut_file,
            "segments": len(segments),
            "unreached": segments_say if to_end else None,  # why the end is short of the newest stored segment
            "vclock": {str(k): v for k, v in sorted(result.vclock.items())}, "last_time": result.last_time}
    return reused, info, entries


def _materialize_segments(repo: Repository, entries: list[tuple[str, FileEntry]], root: Path, tracker) -> int:
    """materialize() for a stream's objects: one missing with its record gone was superseded meanwhile
    (SegmentGone)."""
    from .repository import ObjectDamaged
    from .repository.archive import RECORD_SUFFIX, SegmentGone

    try:
        return materialize(repo, entries, root, tracker)
    except ObjectDamaged as e:
        if gone := [entry.stored for _, entry in entries if not repo.storage.exists(entry.stored + RECORD_SUFFIX)]:
            raise SegmentGone(f"{gone[0]} was removed while the restore read it (superseded by an archived file)") \
                from None
        raise


class _Lineage:
    """The one history that leads to a backup, as the repository holds it.

    Authoritative are the xlogs the backup's parent chain recorded (of a name recorded several times, the newest
    backup's entry). Another backup of the instance is a base or a source of xlogs only when it is of the same
    source identity, agrees with those xlogs byte for byte, and nothing says the instance has two histories (an
    archive conflict, backups of two sources, two xlogs continuing one). The log past what the chain recorded is
    followed link by link through the archive: the next xlog names the current one as its PrevVClock and starts
    where the chosen version of it ends; a version of an authoritative name must begin with the recorded bytes.
    Where two candidates continue one step, the history is not placed past it."""

    def __init__(self, repo: Repository, newest: BackupManifest):
        from .repository.archive import split_archive

        self.repo, self.newest = repo, newest
        self.chain = repo.chain(newest)
        self.authoritative: dict[str, FileEntry] = {}
        for m in self.chain:
            for e in _xlogs(m.files):
                self.authoritative[Path(e.name).name] = e
        everyone = [r.manifest for r in repo.source_backups(newest.family, newest.instance) if r.manifest is not None]
        # An archived file counts only when archived from this backup's own source: another history's file would
        # otherwise fill a gap in this one's archive as its only continuation.
        own, archived = ([e for e in es if e is not None]
                         for es in split_archive(repo, newest.family, newest.instance, newest.source))
        self.evidence = _fork_evidence(everyone, archived) or (
            "the archive holds files of another directory of the instance" if len(own) < len(archived) else None)
        archived = own
        self._prefixes: dict[tuple[str, str], bool] = {}
        ids = {m.id for m in self.chain}
        agreeing = [m for m in everyone if m.id not in ids and m.finished <= newest.finished
                    and m.identity == newest.identity and not self.evidence and self._agrees(m)]
        self.bases = self.chain + agreeing
        self.versions: dict[str, list[FileEntry]] = {}
        for e in [*self.authoritative.values(), *(e for m in agreeing for e in _xlogs(m.files)), *_xlogs(archived)]:
            name = Path(e.name).name
            found = self.versions.setdefault(name, [])
            if any(v.sha256 == e.sha256 and v.size == e.size for v in found) or not self._usable(name, e):
                continue
            found.append(e)
        self._following: dict[tuple, list[FileEntry]] = {}  # by the PrevVClock they name
        for versions in self.versions.values():
            for v in versions:
                if (prev := _prev(v)) is not None:
                    self._following.setdefault(_key(prev), []).append(v)
        self._order = sorted(self.authoritative.values(), key=lambda e: Path(e.name).name)
        self._position = {id(e): i for i, e in enumerate(self._order)}

    def _agrees(self, m: BackupManifest) -> bool:
        for e in _xlogs(m.files):
            a = self.authoritative.get(Path(e.name).name)
            if a is None or (a.sha256, a.size) == (e.sha256, e.size):
                continue
            shorter, longer = sorted((a, e), key=lambda x: x.size)
            if not (shorter.mutable and self._extends(shorter, longer)):
                return False
        return True

    def _usable(self, name: str, e: FileEntry) -> bool:
        a = self.authoritative.get(name)
        return a is None or e is a or (a.mutable and e.size > a.size and self._extends(a, e))

    def _extends(self, shorter: FileEntry, longer: FileEntry) -> bool:
        """Whether the longer version of an xlog begins with the shorter one's bytes (the shorter one's EOF marker
        aside: Tarantool writes over it when it reopens the empty xlog a clean shutdown left)."""
        key = (shorter.stored, longer.stored)
        if key not in self._prefixes:
            held = shorter.objects()  # a longer one kept in pieces that begin with the shorter one's: said so
            self._prefixes[key] = longer.objects()[:len(held)] == held or _object_begins_with(self.repo, longer,
                                                                                              shorter)
        return self._prefixes[key]

    def log_from(self, start: dict[int, int]) -> tuple[list[FileEntry], str | None]:
        """The xlogs replay needs from a snapshot at `start`, as far as one history is known; and, when two
        continue from where it stops, what says so."""
        if not self.authoritative and self.evidence:
            return [], (f"the log after the snapshot of {self.newest.id} cannot be placed in one history of "
                        f"{self.newest.instance}: {self.evidence}")
        own = [e for e in self.authoritative.values() if vclock_leq(_begins(e), start)]
        pool = own if own and self.evidence else [v for vs in self.versions.values() for v in vs
                                                   if vclock_leq(_begins(v), start)]
        if not pool:
            return [], None
        first = max(pool, key=lambda e: (sum(_begins(e).values()), Path(e.name).name))
        steps = self._minimal(self.versions[Path(first.name).name])
        if len(steps) > 1:
            return [], self._two(None, steps)
        path = [steps[0]]
        while True:
            current = path[-1]
            following = self._authoritative_next(current)
            if following is not None:
                path.append(following)
                continue
            name = Path(current.name).name
            longer = [v for v in self.versions.get(name, []) if v.size > current.size and self._extends(current, v)]
            steps = self._minimal(longer)
            end = _ends(current)
            successors: dict[str, list[FileEntry]] = {}
            for v in self._following.get(_key(_begins(current)), []):
                if Path(v.name).name != name and _begins(v) == end:
                    successors.setdefault(Path(v.name).name, []).append(v)
            for versions in successors.values():
                steps += self._minimal(versions)
            if not steps:
                break
            if len(steps) > 1:
                return _latest_versions(path), self._two(current, steps)
            path.append(steps[0])
        return _latest_versions(path), None

    def _authoritative_next(self, current: FileEntry) -> FileEntry | None:
        """The xlog the chain recorded after `current` when it continues it: followed whatever else does."""
        if self.authoritative.get(Path(current.name).name) is not current:
            return None
        at = self._position[id(current)]
        if at + 1 < len(self._order):
            nxt = self._order[at + 1]
            if _prev(nxt) == _begins(current) and _begins(nxt) == _ends(current):
                return nxt
        return None

    def _minimal(self, versions: list[FileEntry]) -> list[FileEntry]:
        """The versions no other one of them begins: each is where a history goes on."""
        ordered = sorted(versions, key=lambda v: v.size)
        return [v for i, v in enumerate(ordered) if not any(self._extends(w, v) for w in ordered[:i]
                                                            if w.size < v.size)]

    def _two(self, current: FileEntry | None, steps: list[FileEntry]) -> str:
        after = f"after {Path(current.name).name} (at vclock {_text(_ends(current))})" if current else "at its start"
        both = " and ".join(f"{Path(v.name).name} ({v.stored}, starting at vclock {_text(_begins(v))})"
                            for v in steps[:2])
        return (f"two histories of instance {self.newest.instance} continue {after}: {both}; a point past it cannot "
                f"be placed in the history of {self.newest.id}")


def _continuing_segments(repo: Repository, newest: BackupManifest,
                         log_end: dict[int, int]) -> tuple[list[FileEntry], str | None]:
    """The stream's segments that continue a log ending at `log_end`, one after the other; and, where they stop
    short of the newest one, why."""
    from .repository.archive import newest_segments

    def replicated(vclock: dict[int, int]) -> dict[int, int]:
        """Without component 0: a segment holds no local row, its component 0 is where its stream started."""
        return {k: v for k, v in _nonzero(vclock).items() if k}

    def span(e: FileEntry) -> tuple[dict[int, int], dict[int, int]]:
        first, last = e.range["vclock"]
        return replicated(vclock_from_json(first)), replicated(vclock_from_json(last))

    at = replicated(log_end)
    # Read from the newest back to the first that begins at or before the log's end: the records of the older ones
    # (superseded by the archived xlogs, or about to be) are not read.
    segments = newest_segments(repo, newest.family, newest.instance, back_to=lambda e: vclock_leq(span(e)[0], at))
    spans = [(e, *span(e)) for e in segments]
    by_start: dict[tuple, list[FileEntry]] = {}  # each link is a lookup: a month of 1-second segments is 2.6 M
    for e, first, _last in spans:
        by_start.setdefault(_key(first), []).append(e)
    ends = {id(e): last for e, _first, last in spans}
    # the first segment holds the log's end inside it (it began at or before it); the next ones begin where the
    # previous ended
    steps = [e for e, first, last in spans if vclock_leq(first, at) and not vclock_leq(last, at)]
    path: list[FileEntry] = []
    while steps:
        if len(steps) > 1:
            return path, (f"two streamed histories continue at {_text(at)}: {steps[0].stored} and "
                          f"{steps[1].stored}; the log is not placed past it")
        path.append(steps[0])
        at = ends[id(steps[0])]
        steps = [e for e in by_start.get(_key(at), []) if not vclock_leq(ends[id(e)], at)]
    later = [(first, last) for _e, first, last in spans if not vclock_leq(last, at)]
    if later:
        return path, f"the stream's segments from {_text(later[0][0])} on do not continue the log at {_text(at)}"
    return path, None


def _xlogs(entries) -> list[FileEntry]:
    return [e for e in entries if e.kind == "xlog" and e.verification.get("vclock") is not None]


def _nonzero(vclock: dict[int, int]) -> dict[int, int]:
    return {k: v for k, v in vclock.items() if v}


def _begins(e: FileEntry) -> dict[int, int]:
    return _nonzero(vclock_from_json(e.verification["vclock"]))


def _key(vclock: dict[int, int]) -> tuple:
    return tuple(sorted(vclock.items()))


def _prev(e: FileEntry) -> dict[int, int] | None:
    prev = e.verification.get("prev_vclock")
    return None if prev is None else _nonzero(vclock_from_json(prev))


def _ends(e: FileEntry) -> dict[int, int]:
    """The vclock after the xlog's last row: where the next xlog of its history starts."""
    end = vclock_from_json(e.verification["vclock"])
    for component, lsns in (e.verification.get("lsns") or {}).items():
        end[int(component)] = lsns[1]
    return _nonzero(end)


def _text(vclock: dict[int, int]) -> str:
    from .tarantool.meta import format_vclock

    return format_vclock(vclock)


def _latest_versions(path: list[FileEntry]) -> list[FileEntry]:
    """One file per name: of the versions a history grew through, the last."""
    out: list[FileEntry] = []
    for e in path:
        if out and Path(out[-1].name).name == Path(e.name).name:
            out[-1] = e
        else:
            out.append(e)
    return out


def _fork_evidence(backups: list[BackupManifest], archived: list[FileEntry]) -> str | None:
    """What says the instance has two histories in the repository, or None."""
    conflicts = sorted(e.stored for e in archived if ".conflict-" in e.stored)
    if conflicts:
        return f"the archive holds two versions of one name ({conflicts[0]})"
    identities = sorted({(m.source.get("host") or "", m.source.get("path") or "") for m in backups})
    if len(identities) > 1:
        return "backups of two sources share the instance (" + ", ".join(f"{h}:{p}" for h, p in identities[:2]) + ")"
    starts: dict[tuple, set] = {}
    for e in _xlogs([e for m in backups for e in m.files] + archived):
        prev = _prev(e)
        if prev is not None:
            starts.setdefault(_key(prev), set()).add(_key(_begins(e)))
    if two := next((s for s in starts.values() if len(s) > 1), None):
        return "two xlogs continue one (" + " and ".join(_text(dict(v)) for v in sorted(two)[:2]) + ")"
    return None


def _object_begins_with(repo: Repository, longer: FileEntry, shorter: FileEntry) -> bool:
    """Whether the stored bytes of `longer` begin with the bytes `shorter` recorded (without its EOF marker when it
    has one), read streamed from the repository."""
    import hashlib

    from .tarantool.block import EOF_MAGIC

    tail = EOF_MAGIC if shorter.verification.get("eof") else b""
    left = shorter.size - len(tail)
    if longer.size < left:
        return False
    digest = hashlib.sha256()
    for chunk in repo.read_entry(longer):
        take = chunk[:left]
        digest.update(take)
        left -= len(take)
        if not left:
            break
    digest.update(tail)
    return digest.hexdigest() == shorter.sha256


def limestone_point(repo: Repository, manifest: BackupManifest, to: str, staging: Path, progress: bool):
    """The backup's files with `epoch` holding one durable record, the point. limestone cancels the snippets
    past it (2 -> 6, in place) when it starts. Refused past the backup's durable epoch, and below what the
    compacted file folds: limestone writes no epoch in it, so the state of an earlier epoch is not there. The
    streamer may supersede pieces the restore listed (their rotated file archived meanwhile): it plans again."""
    return _planned_again(_limestone_point, repo, manifest, to, staging, progress)


def _limestone_point(repo: Repository, manifest: BackupManifest, to: str, staging: Path, progress: bool):
    import re

    from .limestone.check import prepare
    from .limestone.epoch import EPOCH_NAME
    from .limestone.follow import channel_of
    from .limestone.layout import kind_of, restored_name
    from .limestone.stream import blob_place, piece_runs, place_run, streamed_log
    from .limestone.writer import durable_epoch

    text = to.removeprefix("epoch:")
    to_end = to.strip() == "end"
    if not to_end and not re.fullmatch(r"[0-9]+", text):  # ASCII digits: str.isdigit() takes '²', which int() refuses
        raise Refused(f"--to {to!r}: a limestone point is an epoch number (limestone records no time per epoch) or "
                      "end", "refused")
    log: list[FileEntry] = []
    streamed, pieces, blobs = streamed_log(repo, manifest.family, manifest.instance) if to_end else (None, [], [])
    if to_end:
        manifest, log, epoch = _limestone_log(repo, manifest, None, streamed)
    else:
        epoch = int(text)
        if epoch > manifest.position.get("epoch", 0):
            manifest, log, _ = _limestone_log(repo, manifest, epoch)
    entries = [(restored_name(e.name, e.kind), e) for e in manifest.files] + [(e.name, e) for e in log]
    held = {name for name, _ in entries}
    streamed_blobs = [(blob_place(e), e) for e in blobs if blob_place(e) not in held]  # past the archive's
    runs = piece_runs(pieces, manifest.position.get("epoch", 0)) if streamed is not None else []
    # The stream's objects first, apart: one superseded meanwhile is found missing before anything is placed.
    scratch = staging / ".walvault-stream"
    shutil.rmtree(scratch, ignore_errors=True)  # an interrupted run's
    pieces_named = [(f"{i}.{n}", e) for i, run in enumerate(runs) for n, e in enumerate(run)]
    _materialize_segments(repo, pieces_named, scratch, Progress(len(pieces_named), 0, False, ""))
    entries += streamed_blobs
    tracker = Progress(len(entries), sum(e.size for _, e in entries), progress, "restored")
    reused = materialize(repo, entries, staging, tracker)
    notes = []
    restored_epochs: dict[str, int] = {}  # by channel: the highest snippet epoch of the files restored
    for name, e in entries:
        if kind_of(Path(name).name) in ("pwal", "pwal_rotated") and e.range.get("epochs"):
            channel = channel_of(Path(name).name)
            restored_epochs[channel] = max(restored_epochs.get(channel, 0), e.range["epochs"][1])
    for i, run in enumerate(runs):  # the stream's pieces past the base, each run joined to the file it continues
        joined = scratch / "run"
        with open(joined, "wb") as out:
            for n in range(len(run)):
                with open(scratch / f"{i}.{n}", "rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 20)
                (scratch / f"{i}.{n}").unlink()
        notes.append(f"{run[0].range['generation']} from byte {run[0].range['bytes'][0]}: "
                     + place_run(staging, run, joined, restored_epochs))
    shutil.rmtree(scratch, ignore_errors=True)
    # The catalog limestone reads: compaction_catalog, or its .back when that one is missing or unreadable.
    catalog = prepare(staging).catalog
    if catalog is not None:
        # MAX_EPOCH_ID is the epoch at the compaction's rotation; a session of a later epoch may still have been
        # writing into a file rotated then, and the compaction folds it once durable: the files the compacted
        # file covers say how far it reaches.
        ranges = {Path(e.name).name: e.range.get("epochs") for e in manifest.files}
        covered = [ranges[n][1] for n in catalog.detached_pwals if ranges.get(n)]
        folded = max([catalog.max_epoch_id, *covered])
        if manifest.type == "snapshot":  # walvault's own: it knows the newest epoch it folded, and nothing else
            folded = manifest.position.get("epoch", 0)  # at or below MAX_EPOCH_ID was left out
        if epoch < folded:
            raise Refused(f"the compacted file folds every epoch up to {folded} (compaction catalog MAX_EPOCH_ID "
                          f"{catalog.max_epoch_id}, and the files it covers): the state at epoch {epoch} is not in "
                          "this backup", "refused")
        if manifest.type != "snapshot" and (gone := [n for n in catalog.detached_pwals if n not in ranges]):
            notes.append(f"{len(gone)} files the compacted file covers are not in the backup: it may hold sessions "
                         f"of epochs past MAX_EPOCH_ID {catalog.max_epoch_id} that were in flight at its rotation")
    write_atomic(staging / EPOCH_NAME, [durable_epoch(epoch)])
    info = {"point": f"epoch {epoch}", "base": manifest.id, "durable_epoch": epoch,
            "archived_files": len(log), "streamed_runs": len(runs)}
    if notes:
        info["notes"] = notes
    return reused, info, entries


def _limestone_log(repo: Repository, newest: BackupManifest, epoch: int | None,
                   streamed: int | None = None) -> tuple[BackupManifest, list[FileEntry], int]:
    """A point past the backup (None: the newest the repository holds): a base (this backup, or a snapshot of the
    instance) at or before it from which the archive still holds the whole log, the archived files that carry the
    log from there (rotated pwal files neither in the base nor folded into its compacted file, and the blobs), and
    the point. Refused past what the archive holds whole: every channel's entries up to the point archived (what
    `archive` records), and durable; or, `streamed`, the durable epoch `walvault stream` stored last (its pieces
    hold every channel's entries up to it that the archive lacks)."""
    from .repository.archive import EXPIRED_SUFFIX, archive_complete, source_archive

    backups = [r.manifest for r in repo.source_backups(newest.family, newest.instance)
               if r.manifest is not None and (r.id == newest.id or r.manifest.type == "snapshot"
                                              and r.manifest.identity == newest.identity)]
    archived = [e for e in source_archive(repo, newest.family, newest.instance, newest.source) if e is not None]
    # Files retention deleted: a base that lacks one (neither holds nor folded it) cannot reach past it.
    prefix = f"{repo.source_dir(newest.family, newest.instance)}/archive"
    expired = {Path(n).name.removesuffix(".zst" + EXPIRED_SUFFIX) for n in repo.storage.list(prefix)
               if n.endswith(".zst" + EXPIRED_SUFFIX)}

    def holds(m: BackupManifest) -> set[str]:
        return {Path(e.name).name for e in m.files} | set(m.checks.get("snapshot", {}).get("detached", []))

    # Files limestone's own compaction folded (named by an archived catalog) that the archive never held: their
    # keys are in the source's compacted file only, so a base that neither holds nor folded them cannot reach past.
    names = {Path(e.name).name for e in archived}
    folded_away = {n for n in _archived_detached(repo, archived) if n not in names}
    missing = {n for n in expired if n.startswith("pwal_")} | folded_away
    bases = [m for m in backups if (epoch is None or m.position.get("epoch", 0) <= epoch) and not missing - holds(m)]
    if not bases:
        at = f" at or before epoch {epoch}" if epoch is not None else ""
        raise Refused(f"no backup or snapshot of {newest.instance}{at} has the whole log "
                      "after it in the repository (retention deleted files it would need, or limestone's own "
                      "compaction folded files that were never archived: restore from the newest snapshot)",
                      "refused")
    base = max(bases, key=lambda m: (m.position.get("epoch", 0), m.finished, m.id))
    durable = max([base.position.get("epoch", 0)] + [e.range["epochs"][1] for e in archived
                                                     if e.kind == "epoch_rotated" and e.range.get("epochs")])
    complete = archive_complete(repo, newest.family, newest.instance, newest.source)
    if complete is not None:
        durable = min(durable, max(complete, base.position.get("epoch", 0)))
    if streamed is not None:
        durable = max(durable, streamed)
    if epoch is None:
        epoch = durable
    if (overlap := _channel_overlap(archived)) is not None and epoch >= overlap[0]:
        raise Refused(f"two histories of instance {newest.instance} rotated channel {overlap[1]} in "
                      f"{newest.source.get('path')}: {overlap[2]} and {overlap[3]} both hold epochs from {overlap[0]} "
                      f"on; a point from there cannot be placed in one history", "refused")
    if epoch > durable:
        raise Refused(f"the log of {newest.instance} in the repository reaches epoch {durable} (backup {base.id}, "
                      f"the archived epoch files, and every channel archived up to epoch {complete}), before the "
                      f"point {epoch}", "refused")
    have = holds(base)
    log = [e for e in archived if e.kind in ("pwal_rotated", "blob") and Path(e.name).name not in have]
    return base, sorted({e.name: e for e in log}.values(), key=lambda e: e.name), epoch


def _channel_overlap(archived: list[FileEntry]) -> tuple[int, str, str, str] | None:
    """The first epoch two rotated pwal files of one channel both hold (a channel's snippets only go forward, so
    within one history a file ends where the next one begins at the latest), with the channel and the two files."""
    found = None
    channels: dict[str, list[FileEntry]] = {}
    for e in archived:
        if e.kind == "pwal_rotated" and e.range.get("epochs"):
            channels.setdefault(Path(e.name).name.split(".")[0], []).append(e)
    for channel, files in channels.items():
        files.sort(key=lambda e: tuple(e.range["epochs"]))
        for a, b in zip(files, files[1:]):
            if b.range["epochs"][0] < a.range["epochs"][1] and (found is None or b.range["epochs"][0] < found[0]):
                found = (b.range["epochs"][0], channel, Path(a.name).name, Path(b.name).name)
    return found


def _archived_detached(repo: Repository, archived: list[FileEntry]) -> set[str]:
    """Every DETACHED_PWAL name of the archived versions of the source's compaction catalog."""
    from .limestone.catalog import CatalogError, parse_catalog

    out: set[str] = set()
    for e in archived:
        if e.kind == "catalog" and e.size < (1 << 24):
            data = b"".join(repo.read_object(e.stored, size=e.size, sha256=e.sha256, stored_sha256=e.stored_sha256))
            try:
                out |= set(parse_catalog(data).detached_pwals)
            except CatalogError:
                continue  # a damaged .back limestone would not read either
    return out

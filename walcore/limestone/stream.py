"""`walvault stream SOURCE` for a limestone directory on this host: every few seconds the durable part of each pwal
file limestone writes, and the durable epoch, stored in the repository as partial objects; a restore to the end
reaches the last epoch stored.

- A pwal file is followed as a *generation* (`pwal_NNNN.<ms14>`: its channel and when the streamer first opened
  it), by an open read-only descriptor: a rotation renames the file, the descriptor follows it. What grew of its
  durable prefix (follow.py) since the last piece is stored as the next *piece*,
  `limestone/<instance>/stream/<generation>.<offset:016d>.partial.zst`, whose record (`….zst.json`) holds its
  byte range in the file, its epochs, the SHA-256 of the whole prefix up to its end and when D was read. A piece
  starts at a snippet header (a prefix ends before a header, or after a finished snippet).
- After the pieces, the durable epoch D they were cut at: `stream/epoch.<D:020d>.partial.zst` (one `04 <D>`
  record), the commit point of the tick. The one before it is then deleted (what is deleted waits while a restore
  of the source is in progress).
- A generation whose file limestone rotated is superseded once the archive holds its rotated file, verified, and
  that file begins with every byte the generation stored: its pieces are deleted, newest first (a restore takes
  the pieces left as a file of their own only where no restored file holds them).
- Folding bounds the pieces of a file followed for long (limestone may never rotate it): once a generation's
  newest FOLD_PIECES pieces are of one level (or hold FOLD_BYTES), they are stored as one piece of the next level,
  its bytes read from the file and checked against each piece's SHA-256, its record as a piece stored at once
  would be plus `level` and `folded` (each piece's range and SHA-256); once it is recorded the pieces it holds
  are deleted (record first). A start deletes the pieces a stored fold lists (a crash cut its deletes short).
  Readers take, from each offset, the piece reaching furthest.
- A blob file a stored entry names (v3+) is stored before the piece, as `stream/blob/dir_NN/<id>.blob.partial.zst`,
  unless the archive holds it.
- The source is never written: every file is opened read-only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Refused
from ..fsutil import host_name, owned_tempdir, write_atomic
from ..repository import Repository, utc_now
from ..repository.archive import (RECORD_SUFFIX, STREAM_DIR, SegmentGone, commit_record, load_record,
                                  segment_records, stored_segments)
from ..repository.manifest import FileEntry
from .follow import channel_of, durable_prefix, read_durable_epoch
from .layout import blob_path, kind_of, rotated_name
from .pwal import PUT_BLOB, Entry, iter_entries, read_blob_ids
from .writer import durable_epoch

PIECE_KIND, EPOCH_KIND, BLOB_KIND = "pwal_partial", "epoch_partial", "blob"
PARTIAL_SUFFIX = ".partial"
EPOCH_PREFIX = "epoch."  # the stored durable epoch's name: epoch.<D:020d>.partial
READ_CHUNK = 1 << 20
# A generation's newest pieces of one level are folded into one of the next once they are FOLD_PIECES, or hold
# FOLD_BYTES together: it keeps fewer than FOLD_PIECES of each level besides its pieces of FOLD_BYTES or more, which
# are folded no further (a fold, done inside a tick, rewrites less than twice FOLD_BYTES).
FOLD_PIECES = 60
FOLD_BYTES = 64 << 20


@dataclass
class FollowState:
    """What the status file says, rewritten (atomically) after each tick."""

    source: str
    instance: str
    durable_epoch: int | None = None  # the newest stored
    stored: dict | None = None  # the newest epoch stored: {"name", "epoch", "time", "stored"}
    pieces: int = 0  # stored by this run
    superseded: int = 0  # pieces this run deleted: the archive holds their rotated file
    folded: int = 0  # pieces this run folded into one of the next level
    problems: list[str] = field(default_factory=list)
    started: str = field(default_factory=utc_now)

    def to_json(self) -> dict:
        return {**self.__dict__, "updated": utc_now()}

    def lines(self) -> list[str]:
        """What the command says when it stops."""
        return [f"stream of {self.source} stopped: {self.pieces} partials stored, durable epoch {self.durable_epoch}"
                f"; {len(self.problems)} problems"] + [f"  problem: {p}" for p in self.problems]


@dataclass
class _Generation:
    channel: str
    name: str
    fd: int
    inode: tuple[int, int]
    file: str  # its name in the directory when last seen
    end: int = 0  # stored up to
    epoch: int | None = None  # of the snippet `end` is inside
    canceled: bool = False  # that snippet's header is a canceled one
    digest: object = field(default_factory=hashlib.sha256)  # of the bytes up to `end`
    pieces: list[FileEntry] = field(default_factory=list)  # a run from the file's start, oldest first
    checked: str | None = None  # the archived record's SHA-256 found not to hold it (not hashed again)
    broken: bool = False


def follow(repo: Repository, family: str, source: Path, instance: str, *, seconds: float = 1.0,
           status_file: Path | None = None, stop: threading.Event | None = None, say=print) -> FollowState:
    """Store the durable log of `source` every `seconds` until `stop` is set (and once more then)."""
    stop = stop or threading.Event()
    root = Path(source)
    state = FollowState(str(root.resolve()), instance)
    scratch = owned_tempdir("walvault-stream-")
    try:
        with repo.stream_lease(family, instance) as lease:
            follower = _Follower(repo, family, root, lease, state, say, scratch)
            try:
                follower.resume()
                say(f"following {root} (instance {instance}) every {seconds:g} s")
                due = time.monotonic()
                while True:
                    follower.tick()
                    _status(status_file, state)
                    due += seconds
                    if stop.wait(max(0.0, due - time.monotonic())):
                        break
                follower.tick()
                _status(status_file, state)
            finally:
                follower.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return state


class _Follower:
    def __init__(self, repo: Repository, family: str, root: Path, lease, state: FollowState, say, scratch: Path):
        self.repo, self.family, self.root, self.lease, self.state = repo, family, root, lease, state
        self.say, self.scratch = say, scratch
        self.base = repo.source_dir(family, state.instance)
        self.generations: list[_Generation] = []
        self.epoch_record: str | None = None  # the newest epoch partial's record
        self.superseded: list[str] = []  # records whose partials go once no restore of the source is in progress
        self.blobs: set[str] = set()  # blob files known to be in the repository
        # pwal files the archive holds, not followed: (device, inode) -> the name seen. A file deleted frees its
        # inode number, and the file created next may get it (ext4 does at once): it is another file under another
        # name (a rotated name is unique), and it is followed.
        self.done: dict[tuple[int, int], str] = {}

    def close(self) -> None:
        for g in self.generations:
            os.close(g.fd)

    def resume(self) -> None:
        """Go on with the generations stored before whose file is still here (its bytes begin with theirs); a pwal
        file of none, not archived, is followed from its start."""
        stored: dict[str, list[FileEntry]] = {}
        for e in stored_segments(self.repo, self.family, self.state.instance):
            if e.kind == PIECE_KIND:
                stored.setdefault(e.range["generation"], []).append(e)
            elif e.kind == EPOCH_KIND and (self.state.durable_epoch or -1) < e.range["epochs"][1]:
                self.state.durable_epoch, self.epoch_record = e.range["epochs"][1], e.stored + RECORD_SUFFIX
        runs = {}
        for name, pieces in stored.items():
            self.superseded += _folded_away(pieces)
            run = _runs(pieces)[0]
            if run[0].range["bytes"][0] == 0:
                runs[name] = run
        for name in sorted(os.listdir(self.root)):
            if kind_of(name) not in ("pwal", "pwal_rotated"):
                continue
            fd = os.open(self.root / name, os.O_RDONLY)
            st = os.fstat(fd)
            g = self._continued(fd, st.st_size, name, runs)
            if g is None:
                self._follow(fd, name, st)
            else:
                g.inode = (st.st_dev, st.st_ino)
                self.generations.append(g)

    def _follow(self, fd: int, name: str, st: os.stat_result) -> None:
        """A pwal file the stream holds nothing of, followed from its start, unless it is a rotated one the archive
        holds."""
        inode = (st.st_dev, st.st_ino)
        if kind_of(name) == "pwal_rotated" and self._archived(name, st.st_size) is not None:
            os.close(fd)
            self.done[inode] = name
            return
        g = self._new(fd, name)
        g.inode = inode
        self.generations.append(g)

    def _continued(self, fd: int, size: int, name: str, runs: dict[str, list[FileEntry]]) -> _Generation | None:
        candidates = sorted(((n, ps) for n, ps in runs.items() if channel_of(n) == channel_of(name)
                             and ps[-1].range["bytes"][1] <= size), key=lambda item: item[1][-1].range["bytes"][1])
        digest, at = hashlib.sha256(), 0
        for generation, pieces in candidates:
            end = pieces[-1].range["bytes"][1]
            _hash_range(fd, digest, at, end)
            at = end
            if digest.hexdigest() == pieces[-1].range["prefix_sha256"]:
                del runs[generation]
                return _Generation(channel_of(name), generation, fd, (0, 0), name, end,
                                   pieces[-1].range["snippet_epoch"], pieces[-1].range.get("snippet_canceled", False),
                                   digest.copy(), pieces)
        return None

    def _new(self, fd: int, name: str) -> _Generation:
        ms = int(time.time() * 1000)
        taken = {g.name for g in self.generations}
        while f"{channel_of(name)}.{ms:014d}" in taken:
            ms += 1
        return _Generation(channel_of(name), f"{channel_of(name)}.{ms:014d}", fd, (0, 0), name)

    def tick(self) -> None:
        durable = self._durable_epoch()
        seen = time.time()
        names = self._names()
        self.done = {inode: name for name, inode in names.items() if self.done.get(inode) == name}
        for name, inode in names.items():  # a file limestone opened (and perhaps rotated) since the last tick
            if inode not in self.done and not any(g.inode == inode for g in self.generations):
                fd = os.open(self.root / name, os.O_RDONLY)
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != inode:
                    os.close(fd)  # replaced between the two looks: the next tick takes it
                    continue
                self._follow(fd, name, st)
        by_inode = {inode: name for name, inode in names.items()}
        for g in self.generations:
            g.file = by_inode.get(g.inode, g.file)
            if durable is not None and not g.broken:
                self._advance(g, durable, seen)
        if durable is not None and (self.state.durable_epoch is None or durable > self.state.durable_epoch):
            self._store_epoch(durable, seen)
        for g in self.generations:
            if not g.broken:
                self._fold(g)
        for g in list(self.generations):
            if g.file != g.channel or g.inode not in by_inode:
                self._supersede(g)
        for g in list(self.generations):
            st = os.fstat(g.fd)
            if st.st_nlink == 0 and st.st_size == g.end:  # deleted, and stored whole: its pieces stay
                self._let_go(g, f"{g.name}: {g.file} was deleted from the directory; its pieces stay in the stream")
        if self.superseded and not self.repo.restores_in_progress(self.family, self.state.instance):
            for record in self.superseded:  # a restore reading them meanwhile would find them gone
                self._remove(record)
            self.superseded = []

    def _durable_epoch(self) -> int | None:
        """The directory's durable epoch, refused when it is behind the one the stream stored: the directory was put
        back to an earlier point, and what limestone writes from there is another history (read again first: while
        limestone rotates `epoch`, an older rotated file may be all there is a moment)."""
        durable, stored = read_durable_epoch(self.root), self.state.durable_epoch
        if durable is None or stored is None or durable >= stored:
            return durable
        time.sleep(0.1)
        durable = read_durable_epoch(self.root)
        if durable is not None and durable < stored:
            raise Refused(f"{self.root}: its durable epoch {durable} is behind the {stored} the stream stored: the "
                          f"directory was put back to an earlier point (another history of instance "
                          f"{self.state.instance}); it is not streamed on", "refused")
        return durable

    def _names(self) -> dict[str, tuple[int, int]]:
        found = {}
        for name in os.listdir(self.root):
            if kind_of(name) in ("pwal", "pwal_rotated"):
                try:
                    st = os.stat(self.root / name)
                except FileNotFoundError:
                    continue
                found[name] = (st.st_dev, st.st_ino)
        return found

    def _advance(self, g: _Generation, durable: int, seen: float) -> None:
        size = os.fstat(g.fd).st_size
        if size < g.end:
            self._problem(g, f"{g.file} is shorter ({size} bytes) than what the stream stored of it ({g.end}): it "
                          "was rewritten; it is no longer followed")
            return
        if size == g.end:
            return
        prefix = durable_prefix(iter_entries(f"/proc/self/fd/{g.fd}", start=g.end), g.end, g.epoch, durable,
                                canceled=g.canceled, detached=kind_of(g.file) == "pwal_rotated")
        if prefix.problem:
            self._problem(g, f"{g.file}: {prefix.problem}; it is followed no further")
        if prefix.end == g.end:
            return
        piece = self.scratch / "piece"
        digest = g.digest.copy()
        with open(piece, "wb") as out:
            for chunk in _chunks(g.fd, g.end, prefix.end):
                digest.update(chunk)
                out.write(chunk)
        for blob_id in _blob_ids(piece):  # the blobs its entries name, stored before it
            self._store_blob(blob_id, seen)
        name = f"{STREAM_DIR}/{g.name}.{g.end:016d}{PARTIAL_SUFFIX}"
        entry = self._store(piece, name, PIECE_KIND, {
            "generation": g.name, "bytes": [g.end, prefix.end], "epochs": list(prefix.epochs),
            "prefix_sha256": digest.hexdigest(), "snippet_epoch": prefix.epoch, "snippet_canceled": prefix.canceled,
            "time": seen})
        g.pieces.append(entry)
        g.end, g.epoch, g.canceled, g.digest = prefix.end, prefix.epoch, prefix.canceled, digest
        self.state.pieces += 1

    def _fold(self, g: _Generation) -> None:
        """The generation's newest pieces of one level under FOLD_BYTES, once FOLD_PIECES of them or FOLD_BYTES
        together, stored as one piece of the next level: its bytes read from the file, each piece's checked against
        its SHA-256. The pieces it holds are deleted once it is recorded."""
        while g.pieces:
            level = _level(g.pieces[-1])
            tail = list(itertools.takewhile(lambda p: _level(p) == level and p.size < FOLD_BYTES,
                                            reversed(g.pieces)))[::-1]
            if len(tail) < 2 or len(tail) < FOLD_PIECES and sum(p.size for p in tail) < FOLD_BYTES:
                return
            fold = self.scratch / "fold"
            with open(fold, "wb") as out:
                for p in tail:
                    digest = hashlib.sha256()
                    for chunk in _chunks(g.fd, *p.range["bytes"]):
                        digest.update(chunk)
                        out.write(chunk)
                    if digest.hexdigest() != p.sha256:
                        self._problem(g, f"{g.file}: its bytes {p.range['bytes'][0]} to {p.range['bytes'][1]} are not "
                                      f"the ones stored as {p.name}: it was rewritten; it is followed no further")
                        return
            start, end = tail[0].range["bytes"][0], tail[-1].range["bytes"][1]
            entry = self._store(fold, f"{STREAM_DIR}/{g.name}.{start:016d}.{end:016d}{PARTIAL_SUFFIX}", PIECE_KIND, {
                **tail[-1].range, "bytes": [start, end],
                "epochs": [min(p.range["epochs"][0] for p in tail), max(p.range["epochs"][1] for p in tail)],
                "level": level + 1, "folded": [[*p.range["bytes"], p.sha256] for p in tail]})
            g.pieces[-len(tail):] = [entry]
            self.superseded += [p.stored + RECORD_SUFFIX for p in tail]
            self.state.folded += len(tail)

    def _store_blob(self, blob_id: int, seen: float) -> None:
        """A blob file a durable entry names, unless the archive or the stream holds it (written before the entry,
        never changed)."""
        path = blob_path(self.root, blob_id)
        name = path.relative_to(self.root).as_posix()
        if name in self.blobs:
            return
        streamed = f"{STREAM_DIR}/{name}{PARTIAL_SUFFIX}"
        if not any(self.repo.storage.exists(f"{self.base}/{held}.zst{RECORD_SUFFIX}") for held in
                   (f"archive/{name}", streamed)):
            if not path.is_file():
                self.state.problems.append(f"{name}: a durable entry names this blob, which the directory does not "
                                           "hold")
                self.say(f"PROBLEM: {self.state.problems[-1]}")
                return
            self._store(path, streamed, BLOB_KIND, {"time": seen})
        self.blobs.add(name)

    def _store_epoch(self, durable: int, seen: float) -> None:
        """The tick's commit point: every piece up to `durable` is stored before it."""
        path = self.scratch / "epoch"
        write_atomic(path, [durable_epoch(durable)])
        name = f"{STREAM_DIR}/{EPOCH_PREFIX}{durable:020d}{PARTIAL_SUFFIX}"
        entry = self._store(path, name, EPOCH_KIND, {"epochs": [durable, durable], "time": seen})
        before, self.epoch_record = self.epoch_record, entry.stored + RECORD_SUFFIX
        self.state.durable_epoch = durable
        self.state.stored = {"name": name, "epoch": durable, "time": seen, "stored": utc_now()}
        if before is not None and before != self.epoch_record:
            self.superseded.append(before)

    def _store(self, path: Path, name: str, kind: str, span: dict) -> FileEntry:
        object_name = f"{self.base}/{name}.zst"
        stored = self.repo.put_object(object_name, path)
        entry = FileEntry(name=name, kind=kind, size=stored.size, sha256=stored.sha256, stored=object_name,
                          stored_size=stored.stored_size, stored_sha256=stored.stored_sha256, reference=None,
                          mutable=False, range=span,
                          verification={"status": "ok", "findings": [], "checked_by": "scan"})
        self.lease.confirm()
        if problem := commit_record(self.repo, object_name + RECORD_SUFFIX, entry,
                                    {"host": host_name(), "source_dir": self.state.source}):
            raise Refused(problem, "damaged")
        return entry

    def _supersede(self, g: _Generation) -> None:
        """A rotated (or deleted) generation's pieces go once the archive holds its file, verified, beginning with
        them; then it is followed no more."""
        record = self._archived(g.file, g.end) if g.file != g.channel else None
        if record is None or record.sha256 == g.checked or record.verification.get("status") != "ok":
            return
        whole, prefix = hashlib.sha256(), hashlib.sha256()
        size = os.fstat(g.fd).st_size
        for chunk in _chunks(g.fd, 0, size):
            whole.update(chunk)
        _hash_range(g.fd, prefix, 0, g.end)
        if (whole.hexdigest(), size) != (record.sha256, record.size) or prefix.hexdigest() != g.digest.hexdigest():
            g.checked = record.sha256
            return
        # newest first: what is left is still a run from the start
        self.superseded += [p.stored + RECORD_SUFFIX for p in reversed(g.pieces)]
        self.state.superseded += len(g.pieces)
        self._let_go(g, f"{g.name}: superseded by the archived {g.file}")
        self.done[g.inode] = g.file

    def _let_go(self, g: _Generation, said: str) -> None:
        """Follow a generation no more, its file closed (a deleted file's space is freed once no one holds it)."""
        os.close(g.fd)
        self.generations.remove(g)
        self.say(said)

    def _archived(self, name: str, size: int) -> FileEntry | None:
        """The archive's record of a rotated file holding at least `size` bytes (None: none)."""
        record = load_record(self.repo, f"{self.base}/archive/{name}.zst{RECORD_SUFFIX}")
        return record if record is not None and record.size >= size else None

    def _remove(self, record_name: str) -> None:
        self.lease.confirm()
        self.repo.storage.remove(record_name)  # the record first: an object without one is no partial
        self.repo.storage.remove(record_name[:-len(RECORD_SUFFIX)])

    def _problem(self, g: _Generation, said: str) -> None:
        g.broken = True
        self.state.problems.append(said)
        self.say(f"PROBLEM: {said}")


def _blob_ids(piece: Path) -> list[int]:
    fd = os.open(piece, os.O_RDONLY)
    try:
        return [blob_id for e in iter_entries(piece) if isinstance(e, Entry) and e.type == PUT_BLOB
                for blob_id in read_blob_ids(fd, e.blob_ids_at, e.blob_count)]
    finally:
        os.close(fd)


def _level(piece: FileEntry) -> int:
    """0: a piece stored at once; a fold's is one more than that of the pieces it holds."""
    return piece.range.get("level", 0)


def _runs(pieces: list[FileEntry]) -> list[list[FileEntry]]:
    """The pieces of one generation as runs of contiguous pieces, oldest first: from each offset the piece reaching
    furthest, a piece within one taken left out (a fold holds it; its deletion is pending)."""
    runs: list[list[FileEntry]] = []
    for p in sorted(pieces, key=lambda p: (p.range["bytes"][0], -p.range["bytes"][1])):
        start, end = p.range["bytes"]
        if runs and end <= runs[-1][-1].range["bytes"][1]:
            continue
        if not runs or start != runs[-1][-1].range["bytes"][1]:
            runs.append([])
        runs[-1].append(p)
    return runs


def _folded_away(pieces: list[FileEntry]) -> list[str]:
    """The records of the pieces of one generation that a stored fold lists (recorded only once its bytes were
    checked against theirs): a crash cut the fold's deletes short."""
    held = {(start, end, sha256) for fold in pieces for start, end, sha256 in fold.range.get("folded", [])}
    return [p.stored + RECORD_SUFFIX for p in pieces if (*p.range["bytes"], p.sha256) in held]


def _chunks(fd: int, start: int, end: int):
    while start < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - start), start)
        if not chunk:
            raise OSError(f"the file ended at {start}, before {end}")
        start += len(chunk)
        yield chunk


def _hash_range(fd: int, digest, start: int, end: int) -> None:
    for chunk in _chunks(fd, start, end):
        digest.update(chunk)


def _status(path: Path | None, state: FollowState) -> None:
    if path is not None:
        write_atomic(path, [(json.dumps(state.to_json(), indent=1) + "\n").encode()])


# -- restoring to the end


def streamed_log(repo: Repository, family: str, instance: str) -> tuple[int | None, list[FileEntry], list[FileEntry]]:
    """The newest durable epoch the stream of an instance stored (None: none), its pieces and its blobs. SegmentGone
    when a record listed is gone before it is read (folded or superseded meanwhile): the reader plans again."""
    entries = []
    for name in segment_records(repo, family, instance):
        entry = load_record(repo, name)
        if entry is None and not repo.storage.exists(name):
            raise SegmentGone(f"{name} was removed after it was listed (folded, or superseded by an archived file)")
        if entry is not None:
            entries.append(entry)
    epochs = [e.range["epochs"][1] for e in entries if e.kind == EPOCH_KIND]
    return (max(epochs, default=None), [e for e in entries if e.kind == PIECE_KIND],
            [e for e in entries if e.kind == BLOB_KIND])


def blob_place(entry: FileEntry) -> str:
    """Where a blob the stream stored goes in a restore: blob/dir_NN/<id>.blob, as in the source."""
    return entry.name.removeprefix(f"{STREAM_DIR}/").removesuffix(PARTIAL_SUFFIX)


def piece_runs(pieces: list[FileEntry], after: int) -> list[list[FileEntry]]:
    """The pieces holding an epoch past `after` (a base at that epoch holds the others) as runs of contiguous pieces
    of one generation (_runs: a fold, not the pieces it holds), oldest first. A run that does not start at its
    file's start (retention took the pieces before it) starts at a snippet header all the same."""
    generations: dict[str, list[FileEntry]] = {}
    for p in pieces:
        if p.range["epochs"][1] > after:
            generations.setdefault(p.range["generation"], []).append(p)
    return [run for generation in sorted(generations) for run in _runs(generations[generation])]


def place_run(root: Path, run: list[FileEntry], data: Path, restored_epochs: dict[str, int]) -> str:
    """Put a run's bytes (`data`) among the pwal files restored in `root`: dropped when a file of its channel holds
    them at their offset (an archived rotated file, a backup's copy of the active file), appended to one whose bytes
    they continue, else a file of their own under a rotated name (limestone reads every pwal file). Says which.
    `restored_epochs`: by channel, the highest snippet epoch of the files restored. A channel's snippets only go
    forward, so a run of a file of its own that holds an earlier one is of another history of the instance (the
    directory put back to an earlier point, the stream's pieces of before): refused."""
    generation, start = run[0].range["generation"], run[0].range["bytes"][0]
    channel, end = channel_of(generation), run[-1].range["bytes"][1]
    agreeing = sorted(((path.stat().st_size, path.name) for path in root.iterdir()
                       if kind_of(path.name) in ("pwal", "pwal_rotated") and channel_of(path.name) == channel
                       and start <= path.stat().st_size
                       and _same(path, start, data, min(end, path.stat().st_size) - start)), reverse=True)
    if agreeing:  # the longest: one holding the whole run, else the one it continues furthest
        have, name = agreeing[0]
        if end > have:
            with open(root / name, "ab") as out, open(data, "rb") as f:
                f.seek(have - start)
                shutil.copyfileobj(f, out, READ_CHUNK)
                out.flush()
                os.fsync(out.fileno())
        data.unlink()
        return f"held by {name}" if end <= have else f"appended to {name}"
    if run[0].range["epochs"][0] < restored_epochs.get(channel, 0):
        raise Refused(f"the stream's {generation} from byte {start} holds epochs from {run[0].range['epochs'][0]} on, "
                      f"and the restored files of {channel} hold epochs to {restored_epochs[channel]}, with other "
                      "bytes: two histories of the instance (the directory put back to an earlier point); restore "
                      "to an epoch instead", "refused")
    name = rotated_name(root, channel, int(generation.split(".")[1]))
    os.replace(data, root / name)
    return f"restored as {name}"


def _same(path: Path, offset: int, data: Path, size: int) -> bool:
    """Whether `path` holds the first `size` bytes of `data` at `offset`."""
    with open(path, "rb") as a, open(data, "rb") as b:
        a.seek(offset)
        while size > 0:
            n = min(READ_CHUNK, size)
            if a.read(n) != b.read(n):
                return False
            size -= n
    return True

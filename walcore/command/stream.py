"""The stream command: a running Tarantool's rows, received as an anonymous replica, sealed into segments every few
seconds and stored in the repository: a source that dies loses seconds of commits, not a checkpoint interval.

- It subscribes from the newest position the repository holds of the instance (its stream, its archive, its
  backups) and receives rows as they commit; it changes nothing on the instance (anonymous: no entry in _cluster;
  its ACKs carry an empty vclock, so they never vote in a synchronous quorum).
- A synchronous transaction, and every one after it, is held (tarantool/receiver.py) until the CONFIRM or
  ROLLBACK that decides it, then written with that row: no segment ends inside an undecided tail. Which spaces
  are is_sync is taken at the position the stream resumes from (each segment's record keeps them as of its end;
  else a restore of the repository there says them), not from _space as it is now.
- Whole transactions go to the open segment in the spool (tarantool/segments.py), made durable block by block.
  Every `segment_seconds` (or `segment_bytes`) the segment is sealed, verified as any xlog, stored, and its record
  created under the stream lease, proven right before: the record is the commit point.
- The instance may no longer have the rows the stream needs (an anonymous replica holds back no garbage
  collection before 3.3): it answers XlogGapError naming where its log goes on, or, when its oldest xlog names no
  PrevVClock, sends it without a word, so a row whose LSN is not the last one of its replica id plus one is a gap
  too. Either way the segment before it is sealed, the gap is said (status file, exit 1 at the end) and the
  stream goes on from what the instance has.
- A dropped connection is reconnected with back-off, from the vclock of the whole transactions received: no gap
  and no duplicate. A stop (SIGTERM) seals and stores the open segment.
- One history: each (re)subscription starts one row before the last row the stream stored (or received in this
  run), so the instance sends that row first; its bytes must be the stored ones, or the instance holds another
  history of itself (its files replaced by a copy that went on writing) and nothing of it is stored (LastRow).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..fsutil import file_sha256, host_name, write_atomic
from ..repository import Repository, utc_now
from ..repository.archive import RECORD_SUFFIX, STREAM_DIR, commit_record, load_record, newest_segment_record
from ..repository.manifest import FileEntry
from ..tarantool.family import Tarantool
from ..tarantool.iproto import LSN, REPLICA_ID, TIMESTAMP, Packet
from ..tarantool.live import LiveError, redact_uri
from ..tarantool.meta import MAX_META_SIZE, Vclock, parse_meta, vclock_from_json
from ..tarantool.receiver import SPACE_SPACE, Gap, Receiver, StreamBroken, Transaction
from ..tarantool.segments import Spool, file_rows
from ..tarantool.subscription import Subscription, XlogGap

FAMILY = Tarantool.name  # the one family with a replication stream to follow
SEGMENT_KIND = "segment"
RECONNECT_FIRST, RECONNECT_MAX = 0.1, 5.0  # seconds of back-off: doubled after each failed attempt
ACK_EVERY = 0.25  # seconds: the relay drops a replica silent for 4 x replication_timeout
FLUSH_EVERY, FLUSH_BYTES = 0.05, 1 << 20  # the spool gets a block this often, or once this much is pending
# After a few packets, the next are let gather this long before they are read: at 1,000 transactions a second each
# comes alone, and a wake-up per packet was most of the streamer's CPU. Far below FLUSH_EVERY: the spool's
# durability (and the RPO) does not move.
GATHER_WAIT, GATHER_PACKETS = 0.01, 64
# Seconds without a packet before the connection is taken for dead (--timeout): the master sends a heartbeat every
# replication_timeout (1 s by default), but a connection dropped on the way (a NAT, a firewall) is never closed.
SILENCE_LIMIT = 30.0
SYNC_SPACES = "sync_spaces"  # in a segment's record: the ids of the is_sync spaces at its end


@dataclass
class StreamState:
    """What the status file says, rewritten (atomically) as it changes."""

    connect: str  # redacted
    instance: str | None = None
    connected: bool = False
    vclock: Vclock = field(default_factory=dict)  # of the whole transactions received
    stored: dict | None = None  # the newest segment stored: {"name", "end", "last_commit", "stored"}
    segments: int = 0  # stored by this run
    gaps: list[str] = field(default_factory=list)
    error: str | None = None  # the last connection error while disconnected, or why the stream stopped
    started: str = field(default_factory=utc_now)

    def to_json(self) -> dict:
        return {**self.__dict__, "vclock": {str(k): v for k, v in sorted(self.vclock.items())},
                "updated": utc_now()}


def held_position(repo: Repository, instance: str, newest: FileEntry | None) -> Vclock:
    """The newest position the repository holds of the instance: the ends of its newest stored segment (`newest`:
    its end reaches the other segments'), archived files and backups, component by component. Not the end with the
    largest sum: a segment's component 0 is where its stream started (local rows are never streamed), so a backup
    after many local rows outweighs a segment that reaches further, and the stream would take the rows between them
    again."""
    from ..repository.archive import load_archived

    ends = [vclock_from_json(e.range["vclock"][1]) for e in ([newest] if newest else []) + [
        e for e in load_archived(repo, FAMILY, instance) if e is not None and e.kind == "xlog"]
        if isinstance(e.range.get("vclock"), list)]
    ends += [vclock_from_json(r.manifest.position.get("vclock")) for r in repo.source_backups(FAMILY, instance)
             if r.manifest is not None and r.manifest.position.get("vclock")]
    held: Vclock = {}
    for end in ends:
        for replica_id, lsn in end.items():
            held[replica_id] = max(held.get(replica_id, 0), lsn)
    return held


@dataclass(frozen=True)
class LastRow:
    """The last row the stream stored or received: a (re)subscription starts one row before it, so that the instance
    sends it first, and its bytes prove the instance's log passes through it. Never of component 0 (local rows are
    never streamed)."""

    replica_id: int
    lsn: int
    row: bytes
    timestamp: float | None  # when the master wrote it: names the history in a refusal
    where: str  # the stored segment holding it, or this run's stream

    def subscribe_from(self, vclock: Vclock) -> Vclock:
        return {**vclock, self.replica_id: self.lsn - 1}

    def check(self, packet: Packet, display: str, held: Vclock) -> bool:
        """The first row the instance sent after subscribing from `held` less this row: True when it is this row,
        byte for byte (dropped: the stream has it); False when the instance skipped past it without a word and rows
        after it are missing too (a gap: the row goes to the receiver, which says it). StreamBroken when the row
        differs (another history), or when the instance lacks it and nothing after it is missing (unproven)."""
        replica_id, lsn = packet.header.get(REPLICA_ID, 0), packet.header.get(LSN)
        if (replica_id, lsn) == (self.replica_id, self.lsn):
            if packet.row == self.row:
                return True
            raise StreamBroken(f"{display} holds another history of the instance: the stream stored row "
                               f"{self.replica_id}:{self.lsn} written at {_when(self.timestamp)} ({self.where}), "
                               f"the instance sends other bytes at that row, written at "
                               f"{_when(packet.header.get(TIMESTAMP))}. Its files were replaced by a copy that went "
                               "on writing apart from what the stream stored, which its segments must not "
                               "continue; nothing of it is stored")
        if isinstance(lsn, int) and lsn > held.get(replica_id, 0) + 1:
            return False
        raise self.unproven(display, f"it sent row {replica_id}:{lsn} first")

    def unproven(self, display: str, why: str) -> StreamBroken:
        return StreamBroken(f"{display} no longer has row {self.replica_id}:{self.lsn}, the last the stream stored "
                            f"({self.where}): that its log passes through it cannot be proven ({why}), and its rows "
                            "would continue the stored log; a backup of the instance gives the stream a new start")


def newest_stored_row(repo: Repository, entry: FileEntry | None, held: Vclock, scratch: Path) -> LastRow | None:
    """The last row of the newest stored segment (`entry`) when it ends where the repository's position `held`
    does: what a subscription from `held` must prove. None when `held` comes from an archived xlog or a backup past
    every segment (their last row is not read: a stream starting there is not proven) or nothing is held."""
    if entry is None or not _ends_at(entry, held):
        return None
    path = scratch / "newest-stored.walvault-check"  # not *.xlog: never taken for a sealed segment of the spool
    try:
        with open(path, "wb") as f:
            for chunk in repo.read_object(entry.stored, size=entry.size, sha256=entry.sha256,
                                          stored_sha256=entry.stored_sha256):
                f.write(chunk)
        last = None
        for last in file_rows(path):
            pass
    finally:
        path.unlink(missing_ok=True)
    if last is None or not last[0].get(REPLICA_ID):
        return None
    header, row = last
    return LastRow(header[REPLICA_ID], header[LSN], row, header.get(TIMESTAMP), entry.name)


def sync_spaces_at(repo: Repository, instance: str, position: Vclock, work: Path, say,
                   newest: tuple[FileEntry, dict] | None) -> frozenset | None:
    """The ids of the instance's is_sync spaces at `position` (None: not known): as the record of the newest segment
    (`newest`: its entry and record) keeps them when it ends there, else read from a restore of the repository to
    `position` (its snapshot's `_space`, then the `_space` rows of its xlogs), done only where no record says them
    (a first stream of an instance)."""
    recorded = recorded_sync_spaces(newest, position)
    return recorded if recorded is not None else _sync_spaces_restored(repo, instance, position, work, say)


def recorded_sync_spaces(newest: tuple[FileEntry, dict] | None, position: Vclock) -> frozenset | None:
    """The is_sync spaces the record of the newest segment (`newest`: its entry and record) keeps, when it ends at
    `position` (else None)."""
    if newest is None or not _ends_at(newest[0], position) or not isinstance(newest[1].get(SYNC_SPACES), list):
        return None
    return frozenset(newest[1][SYNC_SPACES])


def _ends_at(entry: FileEntry, position: Vclock) -> bool:
    """Whether a segment ends where `position` does, component by component, 0 aside (local rows are never
    streamed: a segment's component 0 is where its stream started)."""
    if not isinstance(entry.range.get("vclock"), list):
        return False
    return _nonzero(vclock_from_json(entry.range["vclock"][1])) == _nonzero(position)


def _sync_spaces_restored(repo: Repository, instance: str, position: Vclock, work: Path, say) -> frozenset | None:
    from ..findings import Refused
    from ..repository import ObjectDamaged, RepositoryError
    from ..restore_set import restore_into

    backups = [r for r in repo.source_backups(FAMILY, instance) if r.manifest is not None]
    if not backups:
        say(f"no backup of {instance}: which spaces were is_sync at vclock {_show(position)} is not known, the "
            "instance's as they are now are taken")
        return None
    newest = max(backups, key=lambda r: Tarantool().position_key(r.manifest))
    with tempfile.TemporaryDirectory(dir=work, prefix="sync-spaces-") as tmp:
        restored = Path(tmp) / "restored"
        try:
            restore_into(repo, newest.id, restored, _show(position))
        except (Refused, ObjectDamaged, RepositoryError, ValueError) as e:
            say(f"which spaces were is_sync at vclock {_show(position)} is not known (the repository cannot be "
                f"restored there: {e}); the instance's as they are now are taken")
            return None
        return _followed(frozenset(), sorted(restored.rglob("*.snap")) + sorted(restored.rglob("*.xlog")))


def _followed(spaces: frozenset, paths: list[Path]) -> frozenset:
    """The is_sync spaces after the `_space` rows of `paths` (snapshots, xlogs, segments; in log order)."""
    from ..tarantool.xlog import read_rows

    tracker = Receiver({}, spaces)
    for path in paths:
        for _block, row in read_rows(path):
            if row.space_id == SPACE_SPACE and isinstance(row.body, dict):
                tracker.follow_space_row(row.type, _decoded(row.body))
    return tracker.sync_spaces


def _decoded(value):
    """A row body as the stream decodes it (str, lists) from the reader's (bytes, tuples)."""
    if isinstance(value, bytes):
        return value.decode(errors="surrogateescape")
    if isinstance(value, (list, tuple)):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        return {_decoded(k): _decoded(v) for k, v in value.items()}
    return value


def _nonzero(vclock: Vclock) -> Vclock:
    return {k: v for k, v in vclock.items() if k and v}


def stream(repo: Repository, connect: str, spool_dir: Path, *, segment_seconds: float = 1.0,
           segment_bytes: int = 16 << 20, status_file: Path | None = None, silence_limit: float = SILENCE_LIMIT,
           stop: threading.Event | None = None, say=print) -> StreamState:
    """Stream until `stop` is set; returns the final state (its `gaps`: what never came). LiveError when the first
    connection or subscription fails (nothing was streamed: the caller says it and exits 2)."""
    stop = stop or threading.Event()
    state = StreamState(redact_uri(connect))
    first = Subscription(connect, None)
    try:
        instance = first.hello().instance_uuid
    except LiveError:
        first.close()
        raise
    state.instance = instance
    with Spool(spool_dir, instance) as spool, repo.stream_lease(FAMILY, instance) as lease, \
            _said_when_broken(state, status_file):
        writer = _SegmentStore(repo, instance, spool, lease, state, say)
        writer.store_left_over()
        newest = newest_segment_record(repo, FAMILY, instance)  # one record read
        position = held_position(repo, instance, newest and newest[0])
        spaces = sync_spaces_at(repo, instance, position, spool.dir, say, newest)
        receiver = Receiver(position, spaces or ())
        state.vclock = dict(receiver.vclock)
        writer.last_row = newest_stored_row(repo, newest and newest[0], receiver.vclock, spool.dir)
        if writer.last_row is None and any(receiver.vclock.values()):
            say(f"the stream starts at {_show(receiver.vclock)}, where an archived xlog or a backup ends: that the "
                "instance's log passes through it is not proven by a stored row, only that the instance is not "
                "behind it")
        # None: which spaces were is_sync at the position is not known, and the instance's as they are now stand in
        spaces_known, backoff, sub, subscribed_once = spaces is not None, RECONNECT_FIRST, first, False
        while not stop.is_set():
            try:
                if sub is None:
                    sub = Subscription(connect, None)
                    if sub.hello().instance_uuid != instance:
                        raise StreamBroken(f"{state.connect} is now instance {sub.greeting.instance_uuid}, not "
                                           f"{instance}: its history is another one")
                proof = writer.last_row
                subscribed = sub.subscribe(receiver.vclock if proof is None else proof.subscribe_from(receiver.vclock))
                if not spaces_known:  # else the receiver's own: it followed every _space row up to its vclock
                    receiver.know_spaces(subscribed.spaces)
                    spaces_known = True
                if behind := {r: lsn for r, lsn in receiver.vclock.items()
                              if r and lsn > subscribed.master_vclock.get(r, 0)}:
                    raise StreamBroken(f"{state.connect} is at vclock {_show(subscribed.master_vclock)}, behind what "
                                       f"the stream holds of it ({_show(behind)}): the instance was restored to an "
                                       "earlier point or its files replaced, and what it writes now is another "
                                       "history, which its segments must not continue")
                state.connected, state.error, backoff, subscribed_once = True, None, RECONNECT_FIRST, True
                say(f"streaming {instance} from {state.connect} (master id {subscribed.master_id}) from vclock "
                    f"{_show(receiver.vclock)}")
                _status(status_file, state)
                _receive(sub, receiver, writer, stop, segment_seconds, segment_bytes, status_file, silence_limit,
                         proof)
            except XlogGap as e:  # the stream goes on from what the instance has, the gap said
                receiver.drop_open()
                spaces_known = False  # the _space rows of the gap never came
                writer.seal_and_store()
                if proof is not None and not any(lsn > receiver.vclock.get(replica_id, 0)
                                                 for replica_id, lsn in e.resume.items() if replica_id):
                    # it lacks the very row to prove and nothing after it: rows from it on would chain onto the
                    # stored log unproven (a gap at least keeps them apart)
                    raise proof.unproven(state.connect, str(e))
                writer.last_row = None  # rows after a gap: kept apart from the log before it, nothing to prove
                for replica_id, lsn in sorted(e.resume.items()):
                    if replica_id and lsn > receiver.vclock.get(replica_id, 0):
                        writer.gap(Gap(replica_id, receiver.vclock.get(replica_id, 0), lsn + 1))
                        receiver.vclock[replica_id] = lsn
                _status(status_file, state)
            except LiveError as e:
                if not subscribed_once:  # refused at start (a user without the replication role): said, exit 2
                    raise
                receiver.drop_open()
                writer.seal_and_store()  # the instance may be gone: what it committed is stored now, not when back
                state.connected, state.error = False, str(e)
                say(f"disconnected: {e}; reconnecting in {backoff:g} s")
                _status(status_file, state)
                stop.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX)
            finally:
                if sub is not None:
                    sub.close()
                sub = None
        writer.seal_and_store()
        state.connected = False
        _status(status_file, state)
    return state


def stream_directory(repo: Repository, source: Path, *, segment_seconds: float = 1.0, status_file: Path | None = None,
                     stop: threading.Event | None = None, say=print):
    """`walvault stream SOURCE`: a source directory on this host followed as its family follows one (limestone:
    the durable part of its active files, walcore/limestone/stream.py); returns the final state."""
    from ..family import family_of

    return family_of(source).follow(Path(source), repo, seconds=segment_seconds, status_file=status_file,
                                    stop=stop, say=say)


def _receive(sub: Subscription, receiver: Receiver, writer: _SegmentStore, stop: threading.Event,
             segment_seconds: float, segment_bytes: int, status_file: Path | None, silence_limit: float,
             proof: LastRow | None) -> None:
    """One connection's rows until it drops (LiveError) or `stop`; its first row is `proof`'s, checked and dropped
    (the receiver never sees it: the end of a multi-row transaction alone would be half of one)."""
    acked = 0.0
    heard = time.monotonic()
    while not stop.is_set():
        deadline = writer.opened + segment_seconds if writer.opened is not None else None
        wait = 0.2 if deadline is None else min(0.2, max(0.0, deadline - time.monotonic()))
        if writer.pending:
            wait = min(wait, FLUSH_EVERY)
        packets = sub.packets(wait)
        if packets:
            heard = time.monotonic()
        elif time.monotonic() - heard > silence_limit:
            raise LiveError(f"{sub.display}: nothing came in {silence_limit:g} s, not even a heartbeat: the "
                            "connection is taken for lost")
        batch: list[Transaction] = []
        for packet in packets:
            if proof is not None and LSN in packet.header:
                proven = proof.check(packet, sub.display, receiver.vclock)
                proof = None
                if proven:
                    continue
            for event in receiver.receive(packet):
                if isinstance(event, Transaction):
                    batch.append(event)
                elif isinstance(event, Gap):
                    writer.append(batch)
                    batch = []
                    writer.seal_and_store()
                    writer.gap(event)
        writer.append(batch)
        now = time.monotonic()
        writer.flush_if_due(now)
        if packets and now - acked >= ACK_EVERY:
            sub.ack()
            acked = now
        if writer.opened is not None and (now - writer.opened >= segment_seconds
                                          or writer.spool.size + writer.pending_bytes >= segment_bytes):
            writer.seal_and_store()
            _status(status_file, writer.state)
        elif 0 < len(packets) < GATHER_PACKETS:
            stop.wait(GATHER_WAIT)


class _SegmentStore:
    """The spool's segments sealed, verified, stored and recorded, one at a time."""

    def __init__(self, repo: Repository, instance: str, spool: Spool, lease, state: StreamState, say):
        self.repo, self.instance, self.spool, self.lease, self.state, self.say = repo, instance, spool, lease, state, say
        self.opened: float | None = None  # when the open segment got its first transaction (monotonic)
        self.pending: list[Transaction] = []  # received, not yet in the spool
        self.pending_bytes = 0
        self.flushed = 0.0
        self.spaces: frozenset | None = None  # the is_sync spaces at the end of the open segment (None: not known)
        self.last_row: LastRow | None = None  # what the next subscription proves

    def append(self, batch: list[Transaction]) -> None:
        if not batch:
            return
        last = batch[-1]
        self.last_row = LastRow(last.replica_id, last.last_lsn, last.rows[-1], last.timestamp, "received by this run")
        self.pending += batch
        self.pending_bytes += sum(tx.size for tx in batch)
        if self.opened is None:
            self.opened = time.monotonic()

    def flush_if_due(self, now: float) -> None:
        """A block per FLUSH_EVERY (one fsync each), not per packet: at thousands of transactions a second the
        fsyncs would be the streamer's whole cost. Rows still pending when it dies are sent again."""
        if self.pending and (now - self.flushed >= FLUSH_EVERY or self.pending_bytes >= FLUSH_BYTES):
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        after = dict(self.state.vclock)
        for tx in self.pending:
            after[tx.replica_id] = tx.last_lsn
        self.spool.append(self.pending, after)
        self.spaces = self.pending[-1].spaces_after
        self.state.vclock = after
        self.pending, self.pending_bytes, self.flushed = [], 0, time.monotonic()

    def gap(self, gap: Gap) -> None:
        said = gap.describe()
        self.state.gaps.append(said)
        self.say(f"GAP: {said}")
        self.state.vclock[gap.replica_id] = gap.next - 1

    def store_left_over(self) -> None:
        """What a stopped or killed streamer left in the spool: sealed first, then stored."""
        self.spool.recover()
        for path in self.spool.sealed():
            self._store(path, self._spaces_through(path))

    def _spaces_through(self, path: Path) -> frozenset | None:
        """The is_sync spaces at the end of a segment left in the spool: those the record of the one before it
        kept, then its own `_space` rows (None: no record says where it starts)."""
        with open(path, "rb") as f:
            meta = parse_meta(f.read(MAX_META_SIZE))
        spaces = None if meta is None or meta.vclock is None else recorded_sync_spaces(
            newest_segment_record(self.repo, FAMILY, self.instance), meta.vclock)
        return None if spaces is None else _followed(spaces, [path])

    def seal_and_store(self) -> None:
        self.flush()
        path = self.spool.seal()
        self.opened = None
        if path is not None:
            self._store(path, self.spaces)

    def _store(self, path: Path, spaces: frozenset | None = None) -> None:
        from ..tarantool.check import file_verdict
        from ..tarantool.times import file_range
        from ..tarantool.xlog import scan_file

        verdict = file_verdict(scan_file(path))
        start, end = verdict.vclock, verdict.end_vclock()
        if verdict.status != "ok" or start is None or end is None:
            problems = "; ".join(f.message for f in verdict.findings) or verdict.status
            raise StreamBroken(f"segment {path} does not verify: {problems}")
        name = path.name
        object_name = f"{self.repo.source_dir(FAMILY, self.instance)}/{STREAM_DIR}/{name}.zst"
        if (found := load_record(self.repo, object_name + RECORD_SUFFIX)) is not None:
            # a name is committed once: its bytes are never replaced (another streamer's spool, left over here
            # while that one stored the same rows, would destroy what it stored)
            if found.sha256 != file_sha256(path):
                self.lease.confirm()  # a streamer whose lease another took over says that, the cause, instead
                raise StreamBroken(f"{object_name} is stored already with other bytes: {path}, left in the spool "
                                   "by a streamer stopped earlier, overlaps what another one stored; move it away "
                                   "if its rows are not needed")
            path.unlink()  # stored and committed by a streamer killed before it removed it
            return
        stored = self.repo.put_object(object_name, path)
        entry = FileEntry(name=f"{STREAM_DIR}/{name}", kind=SEGMENT_KIND, size=stored.size, sha256=stored.sha256,
                          stored=object_name, stored_size=stored.stored_size, stored_sha256=stored.stored_sha256,
                          reference=None, mutable=False, range=file_range(verdict, path),
                          verification={"status": "ok", "findings": [], "checked_by": "scan"})
        self.lease.confirm()
        origin = {"host": host_name(), "connect": self.state.connect,
                  "last_commit": self.spool.last_time, **({} if spaces is None else {SYNC_SPACES: sorted(spaces)})}
        if problem := commit_record(self.repo, object_name + RECORD_SUFFIX, entry, origin):
            raise StreamBroken(problem)
        path.unlink()
        self.state.segments += 1
        self.state.stored = {"name": entry.name, "end": {str(k): v for k, v in end.items()},
                             "last_commit": self.spool.last_time, "stored": utc_now()}


@contextmanager
def _said_when_broken(state: StreamState, status_file: Path | None):
    """The status file of a stream that stopped on its own (a refusal, a lost lease, a failed store) says why, not
    its last good moment."""
    try:
        yield
    except Exception as e:
        state.connected, state.error = False, str(e)
        _status(status_file, state)
        raise


def _status(path: Path | None, state: StreamState) -> None:
    if path is not None:
        write_atomic(path, [(json.dumps(state.to_json(), indent=1) + "\n").encode()])


def _when(timestamp) -> str:
    from datetime import datetime, timezone

    if not isinstance(timestamp, (int, float)):
        return "an unknown time"
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="milliseconds")


def _show(vclock: Vclock) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(vclock.items())) + "}"

"""A subscription's packets become whole transactions, without I/O: what `walvault stream` writes into segments.

Rows come as the master wrote them (sync 0), each with its replica id and LSN. A transaction is one row with no
TSN key, or the rows from the one whose TSN offset is 0 up to the one carrying the commit flag. Tarantool may skip
rows without any error (no PrevVClock in the next xlog after a checkpoint removed every older one), so every
replica id's LSN must be the last one plus one: anything else is a gap, said as such, and the stream goes on from
what the instance has.

Synchronous replication: a transaction touching an `is_sync` space is written to the master's WAL, and streamed,
before a quorum has it; a CONFIRM row later commits it, or a ROLLBACK row undoes it together with every transaction
written after it (the asynchronous ones too: they wait behind it). 2.6 marks neither in the rows: a transaction is
synchronous by its spaces: the set of is_sync spaces at the position the stream starts from (the caller's: see
command/stream.py), then followed through the `_space` rows streamed. From a
synchronous transaction on, transactions are held back until a CONFIRM, ROLLBACK, PROMOTE or DEMOTE resolves it,
then given together with that row: a segment never ends inside the undecided tail (a restore that ended there
would hold rows the master may undo), and a disconnect drops the tail, sent again from before it. `given_spaces`
is the set as of the last transaction given: where a later subscription resumes, and what a segment's record keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .iproto import (COMMIT_FLAG, CONFIRM, DELETE, DEMOTE, DML_TYPES, FLAGS, KEY, LSN, PROMOTE, RAFT, REPLICA_ID,
                     ROLLBACK, TIMESTAMP, TSN, TUPLE, TYPE, UPDATE, Packet)

SPACE_SPACE = 280  # _space: {id, owner, name, engine, field_count, options, format}; options.is_sync
DECISIONS = (CONFIRM, ROLLBACK, PROMOTE, DEMOTE)  # rows that decide the fate of undecided synchronous transactions


class StreamBroken(ValueError):
    """The master sent what a subscription never holds: the receiver cannot go on from it."""


@dataclass(slots=True)
class Transaction:
    replica_id: int
    first_lsn: int
    last_lsn: int
    timestamp: float  # the commit row's: when the master's WAL thread wrote it
    rows: list[bytes] = field(default_factory=list)  # each row's bytes as received
    sync: bool = False  # it touches an is_sync space: committed only by a later CONFIRM
    spaces_before: frozenset = frozenset()  # the is_sync spaces when its first row came
    spaces_after: frozenset = frozenset()  # and once it is given (what a segment ending with it keeps)

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.rows)


@dataclass(frozen=True, slots=True)
class Gap:
    replica_id: int
    after: int  # the last LSN received of that replica id
    next: int  # the LSN that came instead of after + 1

    def describe(self) -> str:
        return (f"rows {self.after + 1} to {self.next - 1} of replica {self.replica_id} never came: the instance no "
                f"longer has them ({self.next - self.after - 1} rows)")


@dataclass(frozen=True, slots=True)
class Heartbeat:
    timestamp: float | None


class Receiver:
    """Fed a subscription's packets after its OK, in order; gives Transactions, Gaps and Heartbeats. `sync_spaces`:
    the ids of the master's is_sync spaces at `vclock`, then as the rows received change them (a frozenset, replaced
    on a change: a transaction keeps the one it began with by reference)."""

    def __init__(self, vclock: dict[int, int], sync_spaces=frozenset()):
        self.vclock = dict(vclock)  # the last LSN of each replica id in a whole transaction given
        self.sync_spaces = frozenset(sync_spaces)
        self._open: Transaction | None = None
        self._held: list[Transaction] = []  # whole, not given: from the first undecided synchronous transaction on
        self._undecided: list[Transaction] = []  # the synchronous ones among them no CONFIRM or ROLLBACK decided

    @property
    def in_transaction(self) -> bool:
        return self._open is not None

    def receive(self, packet: Packet) -> list:
        header = packet.header
        if LSN not in header:
            if header.get(TYPE) == 0:
                return [Heartbeat(header.get(TIMESTAMP))]
            if header.get(TYPE) == RAFT:
                return []  # not a row of the log: nothing to store, nothing to check
            raise StreamBroken(f"a row of type {header.get(TYPE)} without an LSN")
        replica_id, lsn = header.get(REPLICA_ID, 0), header[LSN]
        if not isinstance(replica_id, int) or not isinstance(lsn, int):
            raise StreamBroken(f"a row whose replica id or LSN is not an integer: {header!r}")
        events: list = []
        tx = self._open
        if tx is not None:
            if replica_id != tx.replica_id or lsn != tx.last_lsn + 1:
                raise StreamBroken(f"transaction {tx.replica_id}:{tx.first_lsn} was cut by row "
                                   f"{replica_id}:{lsn} before its commit")
        else:
            last = self._last_lsn(replica_id)
            if lsn <= last:
                raise StreamBroken(f"row {replica_id}:{lsn} came again (the stream was at {last})")
            if lsn != last + 1:
                if self._held:  # what it held back is never decided now: part of the gap
                    self.drop_open()
                    last = self.vclock.get(replica_id, 0)
                events.append(Gap(replica_id, last, lsn))
            tx = self._open = Transaction(replica_id, lsn, lsn, 0.0, spaces_before=self.sync_spaces)
        tx.rows.append(packet.row)
        tx.last_lsn = lsn
        if header.get(TYPE) in DML_TYPES:
            space = packet.space_id()
            if space == SPACE_SPACE:
                self.follow_space_row(header[TYPE], packet.body())
            tx.sync |= space in self.sync_spaces
        offset = header.get(TSN)
        if offset is None or header.get(FLAGS, 0) & COMMIT_FLAG:
            if offset is not None and tx.first_lsn + offset != lsn:
                raise StreamBroken(f"row {replica_id}:{lsn} commits a transaction that began at "
                                   f"{lsn - offset}, not {tx.first_lsn}")
            tx.timestamp = float(header.get(TIMESTAMP, 0.0))
            tx.spaces_after = self.sync_spaces
            self._open = None
            events += self._whole(tx, packet)
        return events

    def _last_lsn(self, replica_id: int) -> int:
        for tx in reversed(self._held):
            if tx.replica_id == replica_id:
                return tx.last_lsn
        return self.vclock.get(replica_id, 0)

    @property
    def given_spaces(self) -> frozenset:
        """The is_sync spaces as of the last transaction given (the open and held ones' `_space` rows left out: a
        subscription after a disconnect sends them again)."""
        first = self._held[0] if self._held else self._open
        return self.sync_spaces if first is None else first.spaces_before

    def know_spaces(self, spaces: list) -> None:
        """`_space` tuples (the master's, or a snapshot's): which spaces are is_sync."""
        self.sync_spaces = frozenset()
        for space in spaces:
            self._space_written(space)

    def follow_space_row(self, row_type: int, body: dict) -> None:
        """A `_space` row (of the stream, or of a log read back): a space created or replaced, its options updated,
        or dropped."""
        if row_type == DELETE:
            self.sync_spaces -= {(body.get(KEY) or [None])[0]}
        elif row_type == UPDATE:  # 2.6 has no space:alter: _space:update(id, {{'=', 6, options}}) or a JSON path
            space = (body.get(KEY) or [None])[0]
            for op in body.get(TUPLE) or []:
                if not isinstance(op, list) or len(op) < 3:
                    continue
                # the options as a whole: field 6 counted from 1, or from 0 (field 6 from 0 is the format, never a
                # map), or from the end; another field's map (a JSON path into the format) is no options
                if op[1] in (5, 6, -2, "flags", "[6]") and isinstance(op[-1], dict):
                    self._mark(space, op[-1])
                elif isinstance(op[1], str) and "is_sync" in op[1]:  # '[6].is_sync': only the options hold is_sync
                    self._mark(space, {"is_sync": op[0] != "#" and bool(op[-1])})
        else:
            self._space_written(body.get(TUPLE))

    def _space_written(self, space) -> None:
        if isinstance(space, list) and len(space) > 5 and isinstance(space[5], dict):
            self._mark(space[0], space[5])

    def _mark(self, space, options: dict) -> None:
        if options.get("is_sync"):
            self.sync_spaces |= {space}
        else:
            self.sync_spaces -= {space}

    def _whole(self, tx: Transaction, packet: Packet) -> list[Transaction]:
        """The transactions given now that `tx` is whole: itself, or, behind an undecided synchronous one, none
        until the row that decides it, then every one it held back up to the next undecided one."""
        if not self._held and not tx.sync:
            self.vclock[tx.replica_id] = tx.last_lsn
            return [tx]
        self._held.append(tx)
        if tx.sync:
            self._undecided.append(tx)
        row_type = packet.header.get(TYPE)
        if row_type not in DECISIONS:
            return []
        body = packet.body()
        body = body if isinstance(body, dict) else {}
        self._undecided = [t for t in self._undecided if not _decided(row_type, body, t)]
        if row_type == ROLLBACK:  # the `_space` rows it undoes never were: the set before the first undone one
            undone = next((t for t in self._held if _decided(ROLLBACK, body, t)), tx)
            self.sync_spaces = tx.spaces_after = undone.spaces_before
        # the first held one is the first undecided one until a decision: only then is anything given
        until = len(self._held) if not self._undecided else next(
            i for i, t in enumerate(self._held) if t is self._undecided[0])
        given, self._held = self._held[:until], self._held[until:]
        for done in given:
            self.vclock[done.replica_id] = done.last_lsn
        return given

    def drop_open(self) -> None:
        """A disconnect mid-transaction or with transactions held: their rows are sent again from the vclock of
        the ones given, and so are their `_space` rows."""
        self.sync_spaces = self.given_spaces
        self._open = None
        self._held, self._undecided = [], []


def _decided(row_type: int, body: dict, tx: Transaction) -> bool:
    """Whether a CONFIRM, ROLLBACK, PROMOTE or DEMOTE row decides synchronous transaction `tx`."""
    owner, lsn = body.get(REPLICA_ID), body.get(LSN)
    if row_type == CONFIRM:  # commits its owner's transactions up to its LSN
        return tx.replica_id == owner and isinstance(lsn, int) and tx.last_lsn <= lsn
    if row_type == ROLLBACK:  # undoes its owner's transactions from its LSN on
        return tx.replica_id == owner and isinstance(lsn, int) and tx.last_lsn >= lsn
    return True  # a new owner of the queue: the old one's confirmed up to its LSN, the rest undone

"""A subscription's packets become whole transactions, without I/O: what `walvault stream` writes into segments.

Rows come as the master wrote them (sync 0), each with its replica id and LSN. A transaction is one row with no
TSN key, or the rows from the one whose TSN offset is 0 up to the one carrying the commit flag. Tarantool may skip
rows without any error (no PrevVClock in the next xlog after a checkpoint removed every older one), so every
replica id's LSN must be the last one plus one: anything else is a gap, said as such, and the stream goes on from
what the instance has.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .iproto import COMMIT_FLAG, FLAGS, LSN, RAFT, REPLICA_ID, TIMESTAMP, TSN, TYPE, Packet


class StreamBroken(ValueError):
    """The master sent what a subscription never holds: the receiver cannot go on from it."""


@dataclass(slots=True)
class Transaction:
    replica_id: int
    first_lsn: int
    last_lsn: int
    timestamp: float  # the commit row's: when the master's WAL thread wrote it
    rows: list[bytes] = field(default_factory=list)  # each row's bytes as received

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
    """Fed a subscription's packets after its OK, in order; gives Transactions, Gaps and Heartbeats."""

    def __init__(self, vclock: dict[int, int]):
        self.vclock = dict(vclock)  # the last LSN of each replica id in a whole transaction received
        self._open: Transaction | None = None

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
            last = self.vclock.get(replica_id, 0)
            if lsn <= last:
                raise StreamBroken(f"row {replica_id}:{lsn} came again (the stream was at {last})")
            if lsn != last + 1:
                events.append(Gap(replica_id, last, lsn))
            tx = self._open = Transaction(replica_id, lsn, lsn, 0.0)
        tx.rows.append(packet.row)
        tx.last_lsn = lsn
        offset = header.get(TSN)
        if offset is None or header.get(FLAGS, 0) & COMMIT_FLAG:
            if offset is not None and tx.first_lsn + offset != lsn:
                raise StreamBroken(f"row {replica_id}:{lsn} commits a transaction that began at "
                                   f"{lsn - offset}, not {tx.first_lsn}")
            tx.timestamp = float(header.get(TIMESTAMP, 0.0))
            self.vclock[replica_id] = lsn
            self._open = None
            events.append(tx)
        return events

    def drop_open(self) -> None:
        """A disconnect mid-transaction: its rows are sent again from the vclock of the whole ones."""
        self._open = None

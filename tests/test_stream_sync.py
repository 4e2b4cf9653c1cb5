"""walvault stream and synchronous replication, and the stream's connection cut, stalled or split.

Synchronous replication as Tarantool 2.6 streams it (measured here, and in ../shared/docs): a transaction on an
`is_sync` space is written and streamed before a quorum has it, with no mark in its rows; a later CONFIRM row
(type 40, body {2: owner, 3: lsn}) commits it, a ROLLBACK row (41) undoes it and every transaction written after
it. The streamer's ACKs never vote, its segments never end inside an undecided tail, and a restore never holds a
transaction a ROLLBACK undid. Without I/O first (synthesized packets, RAFT/PROMOTE/DEMOTE of newer versions
too), then against a real 2.6 whose quorum no replica can reach; then the connection between the streamer and
the instance through a loopback proxy that resets it or stops forwarding, and a multi-statement transaction cut by
a segment boundary or a disconnect.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zstandard

import tarantool_real as tr
from conftest import new_repository, require_tarantool, run_cli, walvault_command
from test_stream import PASSWORD, Instance, Streamer, _segments, instance  # noqa: F401 (a fixture)
from walcore.tarantool import iproto
from walcore.tarantool.receiver import Gap, Receiver, Transaction
from walcore.tarantool.subscription import Subscription

SYNC_SPACE, ASYNC_SPACE = 513, 512


# -- without I/O: synchronous transactions held until decided


def _packet(header: dict, body: dict | None = None) -> iproto.Packet:
    reader = iproto.PacketReader()
    reader.feed(iproto._packet(header, body))
    return reader.next_packet()


def _dml(lsn: int, space: int, *, tsn: int | None = None, commit: bool = False) -> iproto.Packet:
    header = {iproto.TYPE: iproto.REPLACE, iproto.REPLICA_ID: 1, iproto.LSN: lsn, iproto.TIMESTAMP: 1000.0 + lsn}
    if tsn is not None:
        header[iproto.TSN] = lsn - tsn
        if commit:
            header[iproto.FLAGS] = iproto.COMMIT_FLAG
    return _packet(header, {iproto.SPACE_ID: space, iproto.TUPLE: [lsn]})


def _decision(row_type: int, lsn: int, upto: int, owner: int = 1) -> iproto.Packet:
    return _packet({iproto.TYPE: row_type, iproto.REPLICA_ID: 1, iproto.LSN: lsn, iproto.TIMESTAMP: 1000.0 + lsn},
                   {iproto.REPLICA_ID: owner, iproto.LSN: upto})


def _given(receiver: Receiver, *packets: iproto.Packet) -> list[tuple[int, int]]:
    """The (first, last) LSN of each transaction given while the packets are fed."""
    out = []
    for packet in packets:
        out += [(e.first_lsn, e.last_lsn) for e in receiver.receive(packet) if isinstance(e, Transaction)]
    return out


def test_a_synchronous_transaction_and_those_after_it_are_held_until_a_confirm():
    r = Receiver({1: 10}, {SYNC_SPACE})
    assert _given(r, _dml(11, ASYNC_SPACE)) == [(11, 11)]
    assert _given(r, _dml(12, SYNC_SPACE), _dml(13, ASYNC_SPACE), _dml(14, ASYNC_SPACE, tsn=14),
                  _dml(15, SYNC_SPACE, tsn=14, commit=True)) == []
    assert r.vclock == {1: 11}  # a reconnection starts before the undecided tail: it is sent again
    # CONFIRM of 12 only: 13 follows (asynchronous), 14-15 (synchronous: its last row's space) waits; the CONFIRM
    # row itself comes after 15 in the log, so it waits too
    assert _given(r, _decision(iproto.CONFIRM, 16, 12)) == [(12, 12), (13, 13)]
    assert _given(r, _decision(iproto.CONFIRM, 17, 15)) == [(14, 15), (16, 16), (17, 17)]
    assert r.vclock == {1: 17} and _given(r, _dml(18, ASYNC_SPACE)) == [(18, 18)]


def test_a_rollback_gives_what_it_undid_with_it_and_a_disconnect_drops_the_undecided_tail():
    r = Receiver({1: 10}, {SYNC_SPACE})
    assert _given(r, _dml(11, SYNC_SPACE), _dml(12, ASYNC_SPACE)) == []
    r.drop_open()  # disconnected: sent again from 10
    assert r.vclock == {1: 10}
    assert _given(r, _dml(11, SYNC_SPACE), _dml(12, ASYNC_SPACE)) == []
    # the rows it undid go into the log with it, never without it: a replay undoes them
    assert _given(r, _decision(iproto.ROLLBACK, 13, 11)) == [(11, 11), (12, 12), (13, 13)]
    # a ROLLBACK from a later LSN leaves the transactions before it undecided
    assert _given(r, _dml(14, SYNC_SPACE), _dml(15, SYNC_SPACE), _decision(iproto.ROLLBACK, 16, 15)) == []
    assert _given(r, _decision(iproto.CONFIRM, 17, 14)) == [(14, 14), (15, 15), (16, 16), (17, 17)]


def test_promote_and_demote_decide_the_queue_and_raft_never_cuts_a_transaction():
    """Newer versions (2.10+): PROMOTE and DEMOTE rows (with an LSN, their own transaction) hand the queue to a new
    owner: the old one's transactions are decided. A RAFT packet (no LSN) is no row of the log, even inside a
    multi-statement transaction."""
    for row_type in (iproto.PROMOTE, iproto.DEMOTE):
        r = Receiver({1: 10}, {SYNC_SPACE})
        assert _given(r, _dml(11, SYNC_SPACE), _dml(12, ASYNC_SPACE, tsn=12)) == []
        assert r.receive(_packet({iproto.TYPE: iproto.RAFT, iproto.REPLICA_ID: 1}, {0: 2, 1: 3})) == []
        assert _given(r, _dml(13, ASYNC_SPACE, tsn=12, commit=True)) == []
        assert _given(r, _decision(row_type, 14, 11, owner=1)) == [(11, 11), (12, 13), (14, 14)]
        assert r.vclock == {1: 14} and not r.in_transaction


def test_which_spaces_are_synchronous_follows_the_space_rows_streamed():
    r = Receiver({1: 10})
    r.know_spaces([[512, 1, "mem", "memtx", 0, {}, []], [600, 1, "syn", "memtx", 0, {"is_sync": True}, []]])
    assert r.sync_spaces == {600}

    def space_row(lsn, row_type, body):
        return _packet({iproto.TYPE: row_type, iproto.REPLICA_ID: 1, iproto.LSN: lsn}, {iproto.SPACE_ID: 280, **body})

    assert _given(r, space_row(11, iproto.INSERT, {iproto.TUPLE: [601, 1, "s2", "memtx", 0, {"is_sync": True}, []]}),
                  space_row(12, iproto.UPDATE, {iproto.KEY: [600], iproto.TUPLE: [["=", 6, {}]]}),
                  space_row(13, iproto.DELETE, {iproto.KEY: [601]})) == [(11, 11), (12, 12), (13, 13)]
    assert r.sync_spaces == set()
    assert _given(r, space_row(14, iproto.REPLACE, {iproto.TUPLE: [512, 1, "mem", "memtx", 0, {"is_sync": True},
                                                                    []]})) == [(14, 14)]
    assert r.sync_spaces == {512}


def test_the_synchronous_spaces_given_are_those_at_the_last_transaction_given():
    """A `_space` row held behind an undecided transaction is not yet where a later subscription resumes: a disconnect
    drops it with the tail (sent again), a ROLLBACK undoes it, a CONFIRM gives it."""

    def made_sync(lsn, space):
        return _packet({iproto.TYPE: iproto.REPLACE, iproto.REPLICA_ID: 1, iproto.LSN: lsn},
                       {iproto.SPACE_ID: 280, iproto.TUPLE: [space, 1, "s", "memtx", 0, {"is_sync": True}, []]})

    r = Receiver({1: 10}, {SYNC_SPACE})
    assert _given(r, _dml(11, SYNC_SPACE), made_sync(12, ASYNC_SPACE)) == []
    assert r.sync_spaces == {SYNC_SPACE, ASYNC_SPACE} and r.given_spaces == {SYNC_SPACE}
    r.drop_open()
    assert r.sync_spaces == {SYNC_SPACE} and r.vclock == {1: 10}
    assert _given(r, _dml(11, SYNC_SPACE), made_sync(12, ASYNC_SPACE), _decision(iproto.ROLLBACK, 13, 11)) \
        == [(11, 11), (12, 12), (13, 13)]
    assert r.sync_spaces == r.given_spaces == {SYNC_SPACE}  # undone with the write before it
    assert _given(r, _dml(14, SYNC_SPACE), made_sync(15, ASYNC_SPACE), _decision(iproto.CONFIRM, 16, 14)) \
        == [(14, 14), (15, 15), (16, 16)]
    assert r.sync_spaces == r.given_spaces == {SYNC_SPACE, ASYNC_SPACE}


def test_a_gap_inside_an_undecided_tail_takes_the_tail_with_it():
    """The rows after an undecided transaction never came: it is never decided now, and what it held back is part
    of the gap said (from the last transaction given)."""
    r = Receiver({1: 10}, {SYNC_SPACE})
    assert _given(r, _dml(11, SYNC_SPACE), _dml(12, ASYNC_SPACE)) == []
    gap, after = r.receive(_dml(20, ASYNC_SPACE))
    assert gap == Gap(1, 10, 20) and (after.first_lsn, after.last_lsn) == (20, 20) and r.vclock == {1: 20}



# -- without I/O: a point-in-time cut never keeps what a later ROLLBACK undid


def _xlog(path, start: dict, rows: list[bytes]):
    from walcore.tarantool.writer import TarantoolWriter

    writer = TarantoolWriter(path, "XLOG", instance="1f7ab73f-901e-431e-a517-04be6ff6a291", vclock=start)
    for row in rows:  # a block per row: a cut may fall anywhere
        writer.write_rows(row)
    return writer.close()


@pytest.mark.parametrize("decision, point, kept", [
    (iproto.ROLLBACK, 5, 3),  # 4 (synchronous) and 5 (behind it) undone: the point moves back before 4
    (iproto.ROLLBACK, 4, 3),
    (iproto.ROLLBACK, 6, 6),  # the ROLLBACK row itself kept: a replay undoes them
    (iproto.CONFIRM, 5, 5),  # 5 (asynchronous, behind 4) committed with it
    (iproto.PROMOTE, 5, 4),  # a new owner: the old one's confirmed up to 4, 5 undone
])
def test_a_point_never_keeps_a_transaction_a_later_rollback_undoes(tmp_path, decision, point, kept):
    from walcore.tarantool.pitr import Point, cut_chain
    from walcore.tarantool.writer import REPLACE, dml_header, encode_row

    def dml(lsn):
        return encode_row(dml_header(REPLACE, lsn, 1, timestamp=1.7e9 + lsn), {iproto.SPACE_ID: 512,
                                                                                 iproto.TUPLE: [lsn]})

    decides = encode_row({iproto.TYPE: decision, iproto.REPLICA_ID: 1, iproto.LSN: 6, iproto.TIMESTAMP: 1.7e9 + 6},
                         {iproto.REPLICA_ID: 1, iproto.LSN: 4})  # its owner's queue from (or up to) 4
    first = _xlog(tmp_path / "00000000000000000000.xlog", {1: 0}, [dml(n) for n in range(1, 6)])
    second = _xlog(tmp_path / "00000000000000000005.xlog", {1: 5}, [decides, dml(7)])
    out = tmp_path / "out"
    out.mkdir()
    result = cut_chain([first, second], out, Point(vclock={1: point}), start_vclock={1: 0})
    assert result.vclock == {1: kept}
    # a time point between them is the same point
    out = tmp_path / "by-time"
    out.mkdir()
    assert cut_chain([first, second], out, Point(time=1.7e9 + point), start_vclock={1: 0}).vclock == {1: kept}


# -- against a real 2.6 whose synchronous quorum no replica can reach


class SyncInstance(Instance):
    """tests/lua/sync_server.lua: `syn` is_sync, quorum 2, no replica; nothing writes but the test."""

    script = "sync_server.lua"

    def ready(self) -> bool:
        return self.eval("return box.info.status")[0] == "running"

    def lsn(self) -> int:
        return self.eval("return box.info.vclock[1]")[0]


@pytest.fixture
def sync_instance(tmp_path):
    found = SyncInstance(tmp_path)
    found.start()
    yield found
    found.kill()


def _undecided(instance: SyncInstance, synchro_timeout: float, *, behind: int) -> int:
    """A synchronous insert of {1} into `syn` waiting up to `synchro_timeout` s for its quorum, and an asynchronous
    insert of {behind} into `mem` behind it; returns the instance's LSN before them."""
    before = instance.lsn()
    instance.eval(f"""
        local fiber = require('fiber')
        box.cfg{{replication_synchro_timeout = {synchro_timeout}}}
        fiber.create(function() write('syn', {{1}}) end)
        fiber.create(function() fiber.sleep(0.1) write('mem', {{{behind}}}) end)""")
    return before


def _streaming(instance: Instance, tmp_path: Path, *options: str, proxy: StreamProxy | None = None,
               wait: bool = True) -> tuple[Path, Streamer]:
    """A repository with a backup of the instance (a base to restore), and a streamer into it with `options`,
    started (through `proxy` when given), connected unless not to `wait`."""
    repo = new_repository(tmp_path / "repo")
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    done = subprocess.run([*walvault_command(), "backup", str(instance.work_dir), "--connect",
                           f"bk@127.0.0.1:{instance.port}", "--repo", str(repo)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    streamer = Streamer(instance, repo, tmp_path)
    if proxy is not None:
        streamer.args[streamer.args.index("--connect") + 1] = f"repl@127.0.0.1:{proxy.port}"
    streamer.args += options
    streamer.start()
    if wait:
        _connected(streamer)
    return repo, streamer


def _caught_up(streamer: Streamer, lsn: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (streamer.status_path.exists() and int(streamer.status()["vclock"].get("1", 0)) >= lsn):
        assert streamer.proc.poll() is None, streamer.proc.communicate()
        assert time.monotonic() < deadline, (lsn, streamer.status() if streamer.status_path.exists() else None)
        time.sleep(0.05)


def _connected(streamer: Streamer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (streamer.status_path.exists() and streamer.status()["connected"]):
        assert streamer.proc.poll() is None, streamer.proc.communicate()
        assert time.monotonic() < deadline, "the streamer never connected"
        time.sleep(0.05)


def _restored(repo: Path, target: Path, to: str) -> dict:
    restored = run_cli("restore", "latest", target, "--repo", repo, "--to", to, "--json")
    assert restored.returncode == 0, restored.stderr
    return {**tr.dump_data_dir(target), "point": json.loads(restored.stdout)["point"]}


@require_tarantool
def test_the_streamer_never_votes_in_a_synchronous_quorum(sync_instance, tmp_path):
    """quorum 2, no replica, the streamer attached and acknowledging: a synchronous insert times out and is
    rolled back. The converse, to prove the setup can commit: a replica whose ACK carries its vclock votes."""
    streamer = Streamer(sync_instance, new_repository(tmp_path / "repo"), tmp_path)
    streamer.start()
    _connected(streamer)
    time.sleep(1.5)  # a heartbeat and its ACK went by
    assert sync_instance.eval("return write('syn', {1})") == [False, "Quorum collection for a synchronous "
                                                                      "transaction is timed out"]
    with Subscription(f"repl@127.0.0.1:{sync_instance.port}", PASSWORD) as voter:
        voter.hello()
        voter.subscribe({1: sync_instance.lsn()})
        writing = threading.Thread(target=lambda: result.append(sync_instance.eval("return write('syn', {2})")))
        result: list = []
        writing.start()
        deadline = time.monotonic() + 5
        while writing.is_alive() and time.monotonic() < deadline:
            for packet in voter.packets(0.1):
                if iproto.LSN in packet.header:  # the row: an ACK with its LSN votes for it
                    voter.sock.sendall(iproto._packet({iproto.TYPE: iproto.OK},
                                                      {iproto.VCLOCK: {1: packet.header[iproto.LSN]}}))
        writing.join()
    assert result == [[True]]
    code, _out, err = streamer.stop()
    assert code == 0, err


@require_tarantool
def test_a_rolled_back_synchronous_transaction_is_never_restored(sync_instance, tmp_path):
    """A synchronous insert, and an asynchronous one behind it, rolled back after 1 s, while segments are sealed
    every 0.1 s: no segment ends between them and the ROLLBACK; a restore to the end, to the undone transaction's
    own vclock, or to a time before its ROLLBACK holds neither; the confirmed one after them is restored."""
    repo, streamer = _streaming(sync_instance, tmp_path, "--segment-seconds", "0.1")
    before = sync_instance.lsn()
    written = time.time()
    assert sync_instance.eval("""
        local fiber = require('fiber')
        local behind
        fiber.create(function() fiber.sleep(0.2) behind = {write('mem', {1})} end)
        local ok = write('syn', {1})
        while behind == nil do fiber.sleep(0.01) end
        return ok, behind[1], behind[2]""") == [False, False, "A rollback for a synchronous transaction is received"]
    time.sleep(0.3)  # stored: the confirmed ones go into a segment of their own
    sync_instance.eval("box.cfg{replication_synchro_quorum = 1}")
    assert sync_instance.eval("return write('syn', {2})") == [True]
    assert sync_instance.eval("return write('mem', {2})") == [True]
    end = sync_instance.lsn()
    assert end == before + 6  # syn 1, mem 1, ROLLBACK, syn 2, its CONFIRM, mem 2
    _caught_up(streamer, end)
    time.sleep(0.3)  # the last segment sealed and stored
    code, _out, err = streamer.stop()
    assert code == 0, err
    spans = _segments(repo)
    assert len(spans) >= 2 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert not [s for s in spans if before + 1 <= s[1].get(1, 0) < before + 3], \
        f"a segment ends inside the undecided tail {before + 1}..{before + 3}: {spans}"
    at_end = _restored(repo, tmp_path / "end", "end")
    assert at_end["spaces"]["syn"] == [[2]] and at_end["spaces"]["mem"] == [[2]], at_end
    assert at_end["vclock"][1] == end
    for to in (f"{{1: {before + 1}}}", f"{{1: {before + 2}}}", f"@{written + 0.5}"):
        inside = _restored(repo, tmp_path / f"to-{to}", to)
        assert inside["spaces"]["syn"] == [] and inside["spaces"]["mem"] == [], (to, inside)
        assert inside["vclock"][1] == before, (to, inside)


@require_tarantool
def test_an_undecided_transaction_is_never_stored_and_the_instance_dying_leaves_it_out(sync_instance, tmp_path):
    """A synchronous insert waits 30 s for a quorum: the streamer, stopped and started again meanwhile, stores the
    log up to before it (and the asynchronous one behind it), never into it. The instance killed with it undecided:
    restore --to end leaves both out; Tarantool 2.6 itself, recovering its own files, shows them (an undecided
    transaction is visible), which no client was told is committed."""
    repo, streamer = _streaming(sync_instance, tmp_path, "--segment-seconds", "0.1")
    assert sync_instance.eval("return write('mem', {1})") == [True]
    before = _undecided(sync_instance, 30, behind=2)
    time.sleep(0.5)
    assert sync_instance.lsn() == before + 2
    _caught_up(streamer, before)
    time.sleep(0.5)  # five segment intervals with the tail undecided
    code, _out, err = streamer.stop()
    assert code == 0, err
    assert _segments(repo)[-1][1][1] == before
    streamer.start()  # from before the tail: received again, held again
    _connected(streamer)
    time.sleep(0.5)
    sync_instance.kill()
    time.sleep(0.5)
    code, _out, err = streamer.stop()
    assert code == 0, err
    assert _segments(repo)[-1][1][1] == before
    at_end = _restored(repo, tmp_path / "end", "end")
    assert at_end["spaces"]["syn"] == [] and at_end["spaces"]["mem"] == [[1]], at_end
    itself = tr.dump_data_dir(sync_instance.work_dir)
    assert itself["spaces"]["syn"] == [[1]] and itself["spaces"]["mem"] == [[1], [2]], itself


# -- the connection cut and stalled through a loopback proxy


class StreamProxy:
    """A loopback TCP proxy between the streamer and the instance (plain sockets, a thread per direction). The
    first `cuts` connections are reset right after a row that leaves a multi-statement transaction open (once
    `after_rows` rows went through): the streamer has half a transaction. `reset()` resets every connection now.
    `stalled` set: no byte is forwarded, and no connection closed."""

    def __init__(self, upstream_port: int, *, cuts: int = 0, after_rows: int = 200):
        self.upstream_port, self.after_rows = upstream_port, after_rows
        self.cuts_left, self.cut = cuts, 0
        self.stalled = threading.Event()
        self.sockets: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return
            cut, self.cuts_left = self.cuts_left > 0, self.cuts_left - 1
            self.sockets += [client, upstream]
            threading.Thread(target=self._copy, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._copy, args=(upstream, client, cut), daemon=True).start()

    def _copy(self, src: socket.socket, dst: socket.socket, cut: bool) -> None:
        reader, greeting, rows = iproto.PacketReader(), 0, 0
        try:
            while data := src.recv(1 << 16):
                while self.stalled.is_set():
                    time.sleep(0.02)
                if not cut:
                    dst.sendall(data)
                    continue
                if greeting < iproto.GREETING_SIZE:  # the greeting is no packet
                    take = data[:iproto.GREETING_SIZE - greeting]
                    dst.sendall(take)
                    greeting, data = greeting + len(take), data[len(take):]
                reader.feed(data)
                while (packet := reader.next_packet()) is not None:
                    dst.sendall(b"\xce" + len(packet.row).to_bytes(4, "big") + packet.row)
                    rows += iproto.LSN in packet.header
                    if rows > self.after_rows and iproto.TSN in packet.header \
                            and not packet.header.get(iproto.FLAGS, 0) & iproto.COMMIT_FLAG:
                        self.cut += 1
                        return
        except OSError:
            pass
        finally:
            _reset(src, dst)

    def reset(self) -> None:
        _reset(*self.sockets)
        self.sockets = []

    def close(self) -> None:
        self.stalled.clear()
        self.listener.close()


def _reset(*socks: socket.socket) -> None:
    for sock in socks:  # reset (RST), not closed: SO_LINGER 0
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RD)  # wakes the other direction's recv
        except OSError:
            pass
        sock.close()


def _segment_transactions(repo: Path, tmp_path: Path) -> int:
    """The transactions in the stored segments, each checked whole inside one segment."""
    from walcore.tarantool.row import iter_rows
    from walcore.tarantool.segments import _payloads

    transactions = 0
    for stored in sorted(repo.glob("tarantool/*/stream/*.xlog.zst")):
        plain = tmp_path / stored.stem
        plain.write_bytes(zstandard.ZstdDecompressor().decompressobj().decompress(stored.read_bytes()))
        inside = False
        for payload in _payloads(plain):
            for row in iter_rows(payload, require_lsn=True):
                assert inside or row.tsn == row.lsn, f"{stored.name} starts inside a transaction at {row.lsn}"
                inside = not row.commit
                transactions += row.commit
        assert not inside, f"{stored.name} ends inside a transaction"
        plain.unlink()
    return transactions


def _stopped_equal_to_the_instance(instance: Instance, streamer: Streamer, repo: Path, tmp_path: Path) -> str:
    """The writes paused, the stream caught up and stopped, the instance killed: restore --to end holds what
    the instance itself recovers, and the segments are one unbroken log. Returns the streamer's stderr."""
    instance.eval("paused = true")
    written = instance.eval("return box.info.vclock[1]")[0]
    _caught_up(streamer, written, timeout=60)
    deadline = time.monotonic() + 30
    while not (_segments(repo) and _segments(repo)[-1][1][1] == written):
        assert time.monotonic() < deadline, f"stored to {_segments(repo)[-1][1]}, the instance wrote {written}"
        time.sleep(0.1)
    code, out, err = streamer.stop()
    assert code == 0 and "0 gaps" in out, out + err
    instance.kill()
    spans = _segments(repo)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "the segments are not one unbroken log"
    source = tr.dump_data_dir(instance.work_dir)
    restored = _restored(repo, tmp_path / "restored", "end")
    assert restored["vclock"][1] == source["vclock"][1] == written
    assert restored["spaces"]["mem"] == source["spaces"]["mem"] and len(source["spaces"]["mem"]) > 1000
    return err


@require_tarantool
def test_connections_reset_inside_transactions_lose_and_repeat_nothing(instance, tmp_path):
    """Ten connections in a row reset right after a row inside a multi-statement transaction, segments of 4 KiB
    (a boundary every few transactions): the streamer reconnects each time from the whole transactions received;
    every segment holds whole transactions only, and the restore to the end equals the instance."""
    proxy = StreamProxy(instance.port, cuts=10)
    repo, streamer = _streaming(instance, tmp_path, "--segment-bytes", "4096", proxy=proxy, wait=False)
    deadline = time.monotonic() + 60
    while proxy.cut < 10:
        assert streamer.proc.poll() is None and time.monotonic() < deadline, (proxy.cut, streamer.proc.poll())
        time.sleep(0.1)
    time.sleep(1)
    err = _stopped_equal_to_the_instance(instance, streamer, repo, tmp_path)
    proxy.close()
    assert err.count("disconnected:") >= 10, err
    assert _segment_transactions(repo, tmp_path) > 1000


@require_tarantool
def test_a_stalled_connection_is_taken_for_lost_after_the_timeout(instance, tmp_path):
    """The proxy stops forwarding without closing anything: after --timeout 1.5 s without a packet (the instance's
    heartbeats stalled too) the streamer takes the connection for lost and reconnects; once the proxy forwards
    again, the stream goes on with no gap and no duplicate."""
    proxy = StreamProxy(instance.port)
    repo, streamer = _streaming(instance, tmp_path, "--timeout", "1.5", proxy=proxy)
    streamer.wait_stored(2)
    proxy.stalled.set()
    stalled = time.monotonic()
    deadline = stalled + 20
    while "nothing came in 1.5 s" not in (streamer.status().get("error") or ""):
        assert streamer.proc.poll() is None and time.monotonic() < deadline, streamer.status()
        time.sleep(0.05)
    assert time.monotonic() - stalled >= 1.5
    proxy.stalled.clear()
    _connected(streamer)
    err = _stopped_equal_to_the_instance(instance, streamer, repo, tmp_path)
    proxy.close()
    assert "nothing came in 1.5 s, not even a heartbeat: the connection is taken for lost" in err, err


@require_tarantool
def test_a_disconnect_while_a_transaction_is_undecided_receives_it_again(sync_instance, tmp_path):
    """The connection reset while a synchronous insert (and an asynchronous one behind it) waits for its quorum:
    the held tail is dropped and received again on the next connection, with the ROLLBACK that undoes it; no
    segment ends inside it and the restore to the end holds neither, but the confirmed insert after them."""
    proxy = StreamProxy(sync_instance.port)
    repo, streamer = _streaming(sync_instance, tmp_path, "--segment-seconds", "0.1", proxy=proxy)
    before = _undecided(sync_instance, 2, behind=1)
    time.sleep(0.7)
    proxy.reset()
    deadline = time.monotonic() + 10
    while sync_instance.lsn() < before + 3:  # the ROLLBACK
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sync_instance.eval("box.cfg{replication_synchro_quorum = 1}")
    assert sync_instance.eval("return write('syn', {2})") == [True]
    end = sync_instance.lsn()
    _caught_up(streamer, end)
    time.sleep(0.3)
    code, _out, err = streamer.stop()
    proxy.close()
    assert code == 0 and "disconnected:" in err, err
    spans = _segments(repo)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert not [s for s in spans if before + 1 <= s[1].get(1, 0) < before + 3], spans
    at_end = _restored(repo, tmp_path / "end", "end")
    assert at_end["spaces"]["syn"] == [[2]] and at_end["spaces"]["mem"] == [] and at_end["vclock"][1] == end

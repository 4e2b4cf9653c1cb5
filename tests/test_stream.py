"""walvault stream: a running Tarantool 2.6's rows received as an anonymous replica, sealed into segments every
second and stored; restore --to end reaches what the instance had committed when it was killed.

The protocol and the receiver are checked without I/O first (framing cut anywhere, transactions, gaps); then
against a real instance that keeps writing (tests/lua/stream_server.lua): the streamer killed and started again
(its spool recovered, no gap, no duplicate), the instance killed and its data dir restored to the end and compared
row by row with what the instance itself recovers; and the instance's garbage collection removing the xlogs the
stream needed: the gap is said (exit 1, the status file) and the stream goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import pytest
import tarantool

import tarantool_real as tr
from conftest import new_repository, require_tarantool, run_main, walvault_command
from test_tarantool_live import free_port
from walcore.tarantool import iproto
from walcore.tarantool.meta import vclock_from_json
from walcore.tarantool.receiver import Gap, Heartbeat, Receiver, StreamBroken, Transaction

PASSWORD = "stream-pw"
READY_TIMEOUT = 30.0


# -- without I/O: the protocol and the receiver


def _row(header: dict, body: dict | None = None) -> bytes:
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    return b"\xce" + len(payload).to_bytes(4, "big") + payload


def _packets(data: bytes, cuts: list[int]) -> list[iproto.Packet]:
    reader, out, at = iproto.PacketReader(), [], 0
    for cut in [*cuts, len(data)]:
        reader.feed(data[at:cut])
        at = cut
        while (p := reader.next_packet()) is not None:
            out.append(p)
    return out


def test_packets_cut_anywhere_come_whole_with_their_row_bytes():
    rows = [_row({0: 3, 2: 1, 3: n, 4: 1.5}, {0x10: 512, 0x21: [n, "x" * n]}) for n in range(1, 40)]
    data = b"".join(rows)
    for cuts in ([], list(range(1, len(data))), [3, 4, 5, 700, 701]):
        packets = _packets(data, cuts)
        assert [p.row for p in packets] == [r[5:] for r in rows]
        assert [p.header[3] for p in packets] == list(range(1, 40))
        assert packets[3].body() == {0x10: 512, 0x21: [4, "xxxx"]}


def test_a_greeting_and_an_error_packet_are_read():
    greeting = iproto.parse_greeting(b"Tarantool 2.6.0 (Binary) 1f7ab73f-901e-431e-a517-04be6ff6a291".ljust(63)
                                     + b"\n" + b"QK2HoFZGXTXBq2vFj7soCsHqTo6PGTF575ssUBAJLAI=".ljust(63) + b"\n")
    assert greeting.instance_uuid == "1f7ab73f-901e-431e-a517-04be6ff6a291" and greeting.version_id == 0x020600
    with pytest.raises(iproto.ProtocolError, match="not a Tarantool binary port"):
        iproto.parse_greeting(b"SSH-2.0-OpenSSH".ljust(128))
    (error,) = _packets(_row({0: 0x8000 | 32}, {0x52: {0: [{3: "Missing .xlog file between LSN 5 and 9"}]}}), [])
    assert error.is_error and error.error() == (32, "Missing .xlog file between LSN 5 and 9")


def test_the_receiver_gives_whole_transactions_and_says_gaps():
    def row(lsn, tsn=None, commit=False):
        header = {0: 3, 2: 1, 3: lsn, 4: 1000.0 + lsn}
        if tsn is not None:
            header[8] = lsn - tsn
            if commit:
                header[9] = 1
        return _packets(_row(header, {0x10: 512}), [])[0]

    r = Receiver({1: 10})
    assert r.receive(_packets(_row({0: 0, 2: 1, 4: 5.0}), [])[0]) == [Heartbeat(5.0)]
    assert r.receive(_packets(_row({0: 30, 2: 1}, {0: 2, 1: 3}), [])[0]) == []  # RAFT: an election's state
    with pytest.raises(StreamBroken, match="without an LSN"):
        r.receive(_packets(_row({0: 2, 2: 1}, {0x10: 512}), [])[0])
    (single,) = r.receive(row(11))
    assert isinstance(single, Transaction) and (single.first_lsn, single.last_lsn) == (11, 11)
    assert r.receive(row(12, tsn=12)) == [] and r.receive(row(13, tsn=12)) == [] and r.in_transaction
    (multi,) = r.receive(row(14, tsn=12, commit=True))
    assert (multi.first_lsn, multi.last_lsn, len(multi.rows), multi.timestamp) == (12, 14, 3, 1014.0)
    assert r.vclock == {1: 14}
    gap, after = r.receive(row(20))
    assert gap == Gap(1, 14, 20) and after.first_lsn == 20 and "rows 15 to 19 of replica 1" in gap.describe()
    with pytest.raises(StreamBroken, match="came again"):
        r.receive(row(20))
    r.receive(row(21, tsn=21))
    with pytest.raises(StreamBroken, match="was cut by row"):
        r.receive(row(23))


def test_a_subscription_proves_the_instance_sends_the_last_row_stored_first(tmp_path):
    """The last row stored ends a multi-row transaction: sent again first, it is checked and dropped, never given
    to the receiver (alone it would be half a transaction). Other bytes at that row are another history; a row past
    it with rows missing between is a gap the receiver says; the row right after it means the instance lacks it."""
    from walcore.command import stream as stream_command
    from walcore.tarantool.segments import Spool

    def row(lsn, tsn=None, commit=False, when=1000.0):
        header = {0: 3, 2: 1, 3: lsn, 4: when + lsn}
        if tsn is not None:
            header[8] = lsn - tsn
            if commit:
                header[9] = 1
        return _packets(_row(header, {0x10: 512}), [])[0]

    last = row(14, tsn=12, commit=True)
    proof = stream_command.LastRow(1, 14, last.row, 1014.0, "stream/00000000000000000012.xlog")
    assert proof.subscribe_from({0: 3, 1: 14}) == {0: 3, 1: 13}

    class Resent:
        display = "repl@127.0.0.1:3301"

        def __init__(self, packets):
            self.sent = [packets]

        def packets(self, wait):
            if not self.sent:
                raise stream_command.LiveError("the instance closed the connection")
            return self.sent.pop()

        def ack(self):
            pass

    heartbeat = _packets(_row({0: 0, 2: 1, 4: 5.0}), [])[0]
    with Spool(tmp_path, "instance") as spool:
        state = stream_command.StreamState("x", vclock={1: 14})
        writer = stream_command._SegmentStore(None, "instance", spool, None, state, print)
        receiver = Receiver({1: 14})
        with pytest.raises(stream_command.LiveError):
            stream_command._receive(Resent([heartbeat, last, row(15)]), receiver, writer, threading.Event(), 60.0,
                                    1 << 20, None, 30.0, proof)
        assert receiver.vclock == {1: 15} and (writer.last_row.lsn, writer.state.vclock) == (15, {1: 15})
    assert proof.check(row(20), "uri", {1: 14}) is False  # rows 15 to 19 never come: the receiver says the gap
    with pytest.raises(StreamBroken, match="holds another history of the instance"):
        proof.check(row(14, tsn=12, commit=True, when=2000.0), "uri", {1: 14})
    with pytest.raises(StreamBroken, match="no longer has row 1:14"):
        proof.check(row(15), "uri", {1: 14})


def test_a_connection_silent_past_the_limit_is_taken_for_lost(tmp_path):
    """A connection dropped on the way (a NAT, a firewall) is never closed: without a packet, not even the
    master's heartbeat, for --timeout seconds the streamer reconnects rather than wait forever."""
    from walcore.command import stream as stream_command
    from walcore.tarantool.live import LiveError
    from walcore.tarantool.segments import Spool

    class Silent:
        display = "repl@127.0.0.1:3301"

        def packets(self, wait):
            time.sleep(min(wait, 0.01))
            return []

    with Spool(tmp_path, "instance") as spool:
        writer = stream_command._SegmentStore(None, "instance", spool, None, stream_command.StreamState("x"), print)
        with pytest.raises(LiveError, match="nothing came in 0.2 s, not even a heartbeat"):
            stream_command._receive(Silent(), Receiver({}), writer, threading.Event(), 1.0, 1 << 20, None, 0.2,
                                    None)


def test_a_spool_is_used_by_one_streamer_at_a_time(tmp_path):
    """Two streamers of one instance (into two repositories) given one spool would write one open segment."""
    from walcore.tarantool.segments import Spool, SpoolBusy

    with Spool(tmp_path, "instance"):
        with pytest.raises(SpoolBusy, match="give each stream its own --spool"):
            Spool(tmp_path, "instance")
    with Spool(tmp_path, "instance"):  # unlocked when the first one was left
        pass


def test_a_stored_segment_is_never_replaced_by_other_bytes_under_its_name(tmp_path):
    """A spool left over by a streamer killed earlier, while another streamer stored the same rows under the same
    name: storing it must not replace what is committed (the stream stops and says why); the same bytes again (a
    streamer killed after the commit, before it removed its file) are taken as stored."""
    from walcore.command import stream as stream_command
    from walcore.repository import Repository
    from walcore.repository.lease import LeaseLost
    from walcore.tarantool.segments import Spool
    from walcore.tarantool.writer import REPLACE, dml_header, encode_row

    instance = "1f7ab73f-901e-431e-a517-04be6ff6a291"
    repo = Repository(str(new_repository(tmp_path / "repo")), {})

    class Lease:
        lost = None

        def confirm(self):
            if self.lost:
                raise LeaseLost(self.lost)

    def store(name: str, tag: str, rows: int, lease=None) -> None:
        with Spool(tmp_path / name, instance) as spool:
            spool.append([Transaction(1, lsn, lsn, 1.7e9, [encode_row(dml_header(REPLACE, lsn, 1), {0x21: [lsn, tag]})])
                          for lsn in range(11, 11 + rows)], {1: 10 + rows})
            path = spool.seal()
            stream_command._SegmentStore(repo, instance, spool, lease or Lease(), stream_command.StreamState("x"),
                                         print)._store(path)

    store("first", "a", 5)
    (stored,) = (tmp_path / "repo").glob("tarantool/*/stream/*.xlog.zst")
    committed = stored.read_bytes()
    with pytest.raises(StreamBroken, match="is stored already with other bytes"):
        store("second", "b", 3)
    assert stored.read_bytes() == committed
    fenced = Lease()
    fenced.lost = "lease was lost: another process broke it"
    with pytest.raises(LeaseLost, match="was lost"):  # the cause said, not the name it collided with
        store("third", "c", 3, fenced)
    assert stored.read_bytes() == committed
    store("first", "a", 5)  # the same bytes: stored already, its spool file removed
    assert not list((tmp_path / "first").rglob("*.xlog")) and stored.read_bytes() == committed


# -- against a real instance


class Instance:
    script = "stream_server.lua"

    def __init__(self, root: Path):
        self.work_dir = root / "instance"
        self.port = free_port()
        self.log = root / "tarantool.log"
        self.proc = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([tr.TARANTOOL, str(tr.LUA_DIR / self.script), str(self.work_dir),
                                          str(self.port), PASSWORD], cwd=self.work_dir.parent,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                if self.ready():
                    return
            except tarantool.Error:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{self.script} not ready (exit {self.proc.poll()}):\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)

    def ready(self) -> bool:
        return self.eval("return committed")[0] > 300  # its writer writes

    def eval(self, code: str) -> list:
        conn = tarantool.Connection("127.0.0.1", self.port, user="bk", password=PASSWORD, fetch_schema=False,
                                    connection_timeout=5, socket_timeout=30)
        try:
            return conn.eval(code).data
        finally:
            conn.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def instance(tmp_path):
    found = Instance(tmp_path)
    found.start()
    yield found
    found.kill()


class Streamer:
    """`walvault stream` as a service runs it: its own process, its password in the environment."""

    def __init__(self, instance: Instance, repo: Path, root: Path):
        self.args = [*walvault_command(), "stream", "--connect", f"repl@127.0.0.1:{instance.port}", "--repo",
                     str(repo), "--spool", str(root / "spool"), "--status", str(root / "status.json")]
        self.status_path = root / "status.json"
        self.proc = None

    def start(self) -> None:
        self.status_path.unlink(missing_ok=True)  # the new run's own
        env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
        self.proc = subprocess.Popen(self.args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)

    def status(self) -> dict:
        return json.loads(self.status_path.read_text())

    def wait_stored(self, segments: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not (self.status_path.exists() and self.status()["segments"] >= segments):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, \
                f"{segments} segments not stored in {timeout} s: {self.status() if self.status_path.exists() else ''}"
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM) -> tuple[int, str, str]:
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=60)
        assert "Traceback" not in err, err
        return self.proc.returncode, out, err


def _segments(repo: Path) -> list[tuple[dict, dict]]:
    """Each stored segment's (start, end) vclock by its record, in log order."""
    spans = []
    for record in repo.glob("tarantool/*/stream/*.zst.json"):
        first, last = json.loads(record.read_text())["range"]["vclock"]
        spans.append((vclock_from_json(first), vclock_from_json(last)))
    return sorted(spans, key=lambda s: s[0].get(1, 0))


def _caught_up(instance: Instance, streamer: Streamer) -> int:
    """The writes paused and the stream caught up with them: what the instance wrote (component 1), every row of
    it received."""
    instance.eval("paused = true")
    written = instance.eval("return box.info.vclock[1]")[0]
    deadline = time.monotonic() + 30
    while int(streamer.status()["vclock"].get("1", 0)) < written:
        assert time.monotonic() < deadline, (written, streamer.status())
        time.sleep(0.05)
    return written


@require_tarantool
def test_a_killed_instance_restores_to_its_last_commit_from_the_stream(instance, tmp_path):
    repo = new_repository(tmp_path / "repo")
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    backup = subprocess.run([*walvault_command(), "backup", str(instance.work_dir), "--connect",
                             f"bk@127.0.0.1:{instance.port}", "--repo", str(repo), "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert backup.returncode == 0, backup.stderr
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(2)
    streamer.proc.kill()  # killed mid-segment: its spool holds an open one
    streamer.proc.wait()
    streamer.start()
    streamer.wait_stored(2)
    # The writes stop, the stream catches up, then the instance is killed: a row committed in the instance's WAL
    # but not yet sent when it dies is lost to any replica (bench/rpo.py measures that); here every row must come.
    written = _caught_up(instance, streamer)
    instance.kill()
    # the instance is gone: what it committed is stored while the streamer tries to reconnect, not once stopped
    committed = tr.dump_data_dir(instance.work_dir)["vclock"][1]
    deadline = time.monotonic() + 20
    while not (_segments(repo) and _segments(repo)[-1][1][1] == committed):
        assert time.monotonic() < deadline, f"stored to {_segments(repo)[-1][1]}, the instance committed {committed}"
        time.sleep(0.2)
    code, out, err = streamer.stop()
    assert code == 0 and "0 gaps" in out, out + err
    spans = _segments(repo)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "the segments are not one unbroken log"
    # status: the archive reaches as far as the stream, the stream's last commit is seconds old
    status = json.loads(run_main("status", "--repo", repo, "--json").stdout)
    (source,) = status["sources"]
    assert source["stream"]["segments"] == len(spans) and source["stream"]["age_seconds"] < 120, source
    assert source["archive"]["position"] == source["stream"]["position"], source
    assert source["stream"]["position"]["vclock"]["1"] == spans[-1][1][1], source
    exposition = run_main("status", "--repo", repo, "--prometheus").stdout
    assert "walvault_stream_last_commit_timestamp_seconds{" in exposition
    # what the instance itself recovers from its own files, and the restore to the end: the same rows
    source = tr.dump_data_dir(instance.work_dir)
    restored = run_main("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    point = json.loads(restored.stdout)
    assert point["point"]["segments"] >= 3, point
    dumped = tr.dump_data_dir(tmp_path / "restored")
    assert dumped["vclock"][1] == source["vclock"][1] == spans[-1][1][1], (dumped["vclock"], source["vclock"])
    assert dumped["spaces"]["mem"] == source["spaces"]["mem"]
    assert len(dumped["spaces"]["mem"]) > 1000


@require_tarantool
def test_xlogs_the_instance_removed_while_the_stream_was_stopped_are_a_gap_said_and_streamed_past(instance,
                                                                                                   tmp_path):
    """checkpoint_count = 1: two box.snapshot() while the streamer is down delete every xlog it still needed.
    Tarantool answers XlogGapError naming where its log goes on (or, when its oldest xlog names no PrevVClock,
    sends it without an error: the receiver's LSN check, tested above): the gap is said, and the stream goes on
    from there; the segments after the gap start where the instance's log does."""
    repo = new_repository(tmp_path / "repo")
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(1)
    code, _out, err = streamer.stop()
    assert code == 0, err
    stopped_at = _segments(repo)[-1][1][1]
    for _ in range(2):
        time.sleep(0.5)
        instance.eval("box.snapshot()")
    streamer.start()
    streamer.wait_stored(1)
    code, out, err = streamer.stop()
    assert code == 1, out + err
    (gap,) = streamer.status()["gaps"]
    assert gap.startswith(f"rows {stopped_at + 1} to ") and "of replica 1 never came: the instance no longer has " \
        "them" in gap, gap
    assert f"GAP: {gap}" in err and "1 gaps" in out and f"  gap: {gap}" in out
    spans = _segments(repo)
    after = [s for s in spans if s[0].get(1, 0) > stopped_at]
    assert after and after[0][0][1] > stopped_at + 1, "the segment after the gap starts where the log does"


@require_tarantool
def test_segments_are_verified_and_expire_once_a_snapshot_covers_them(instance, tmp_path):
    """verify --repo re-reads every segment (hash and scan, as an xlog): one flipped byte is named. A snapshot
    taken after them covers them: expire deletes them once the window passed them, and not before."""
    repo = new_repository(tmp_path / "repo")
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(2)
    code, _out, err = streamer.stop()
    assert code == 0, err
    spans = _segments(repo)
    verified = json.loads(run_main("verify", "--repo", repo, "--json").stdout)
    (archive,) = verified["archive"]
    assert verified["intact"] and archive["files"] == len(spans) and archive["status"] == "ok", archive
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    snapshot = subprocess.run([*walvault_command(), "snapshot", str(instance.work_dir), "--connect",
                               f"bk@127.0.0.1:{instance.port}", "--repo", str(repo)], env=env, capture_output=True,
                              text=True, timeout=120)
    assert snapshot.returncode == 0, snapshot.stderr
    segment_objects = sorted(repo.glob("tarantool/*/stream/*.xlog.zst"))
    assert len(segment_objects) == len(spans)
    # within the window: kept; a day later (as of), past the window: deleted, each covered by the snapshot
    now = run_main("expire", "--repo", repo, "--days", "1", "--json")
    assert not [d for d in json.loads(now.stdout)["sources"][0]["delete"] if "/stream/" in d["path"]]
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2 * 86400))
    planned = json.loads(run_main("expire", "--repo", repo, "--days", "1", "--as-of", later, "--json").stdout)
    deleted = sorted(d["path"] for d in planned["sources"][0]["delete"] if "/stream/" in d["path"])
    assert deleted == sorted(str(p.relative_to(repo)) for p in segment_objects), planned
    # a flipped byte in a segment is named by verify --repo
    victim = segment_objects[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    damaged = run_main("verify", "--repo", repo, "--json")
    assert damaged.returncode == 1
    (archive,) = json.loads(damaged.stdout)["archive"]
    assert archive["status"] == "damaged" and any(f["code"] == "object_damaged" for f in archive["findings"])


@require_tarantool
def test_a_backup_after_many_local_rows_does_not_take_the_stream_back(instance, tmp_path):
    """A segment's component 0 is where its stream started (local rows are never streamed): a backup taken after
    many local rows has the larger vclock sum though the stream reaches further. Started again, the stream goes on
    from its own end, component by component: no row stored twice."""
    repo = new_repository(tmp_path / "repo")
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(1)
    instance.eval("box.session.su('admin', function() for i = 1, 30000 do box.space.loc:replace{i} end end)")
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    backup = subprocess.run([*walvault_command(), "backup", str(instance.work_dir), "--connect",
                             f"bk@127.0.0.1:{instance.port}", "--repo", str(repo)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert backup.returncode == 0, backup.stderr
    streamer.wait_stored(streamer.status()["segments"] + 2)  # the stream goes past the backup
    code, _out, err = streamer.stop()
    assert code == 0, err
    streamer.start()
    streamer.wait_stored(2)
    code, out, err = streamer.stop()
    assert code == 0, out + err
    spans = _segments(repo)
    assert all(a[1].get(1) == b[0].get(1) for a, b in zip(spans, spans[1:])), \
        f"rows stored twice: {[(a[0].get(1), a[1].get(1)) for a in spans]}"
    # the segments after the restart start at the backup's component 0: restore --to end follows them all the same
    restored = run_main("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    result = json.loads(restored.stdout)
    assert result["point"]["vclock"]["1"] == spans[-1][1][1] and not result["notes"], result


def _copy_of(instance: Instance, to: Path) -> Path:
    """A copy of the instance's data dir as it is now (stopped for it, started again): another history of it, once
    each goes on writing."""
    instance.kill()
    shutil.copytree(instance.work_dir, to)
    instance.start()
    return to


def _replace_files(instance: Instance, by: Path) -> None:
    """The instance started again on another copy of its files: the same instance UUID."""
    instance.kill()
    shutil.rmtree(instance.work_dir)
    shutil.copytree(by, instance.work_dir)
    instance.start()


@require_tarantool
def test_an_instance_restored_to_an_earlier_point_is_not_streamed_on(instance, tmp_path):
    """The instance at the URI restored to an earlier point (its files replaced: the same instance UUID) writes
    another history from there: a stream that went on would continue its segments with rows of that other
    history, and a restore to the end would hold both. The stream stops and says why (exit 1)."""
    repo = new_repository(tmp_path / "repo")
    earlier = _copy_of(instance, tmp_path / "earlier")
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(5)
    _replace_files(instance, earlier)
    out, err = streamer.proc.communicate(timeout=60)
    assert streamer.proc.returncode == 1 and "behind what the stream holds" in err, out + err
    # the status file says why it stopped, not its last good moment
    assert not streamer.status()["connected"] and "behind what the stream holds" in streamer.status()["error"]


@require_tarantool
def test_another_history_of_the_instance_ahead_of_the_stream_is_not_streamed_on(instance, tmp_path):
    """The instance's files replaced by a copy from earlier that went on writing (the same instance UUID) and is
    already past where the stream stopped: its vclock is not behind, but its rows are another history. Started
    again, the stream subscribes one row before the last it stored; the instance sends that row with other bytes,
    so the stream stops and says why (exit 1), storing nothing of it."""
    repo = new_repository(tmp_path / "repo")
    earlier = _copy_of(instance, tmp_path / "earlier")
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(3)
    code, out, err = streamer.stop()
    assert code == 0, out + err
    stored = _segments(repo)
    _replace_files(instance, earlier)
    deadline = time.monotonic() + 60
    while instance.eval("return box.info.vclock[1]")[0] <= stored[-1][1][1] + 100:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    streamer.start()
    out, err = streamer.proc.communicate(timeout=60)
    assert streamer.proc.returncode == 1 and "holds another history of the instance" in err, out + err
    assert "holds another history of the instance" in streamer.status()["error"]
    assert _segments(repo) == stored


@require_tarantool
def test_a_backup_of_a_cleanly_stopped_instance_restores_through_the_stream(instance, tmp_path):
    """A clean stop leaves an empty xlog, named by where the log ends; a backup of the stopped instance holds it, and
    the tail a restore builds of the segments that follow starts there, under the same name. It takes that xlog's
    place: `--to end`, and a point inside the streamed range, give a data dir Tarantool starts on (found by the
    nemesis suite: the tail overwrote the empty xlog, then was read twice, or named itself as its PrevVClock)."""
    repo = new_repository(tmp_path / "repo")
    try:
        instance.eval("require('fiber').create(function() os.exit(0) end)")
    except tarantool.Error:
        pass  # the connection went with the instance
    instance.proc.wait(30)
    wal = sorted((instance.work_dir / "wal").glob("*.xlog"))
    stopped_at = tr.dump_data_dir(instance.work_dir)["vclock"][1]
    assert wal[-1].stat().st_size < 200, "the clean stop left no empty xlog: nothing here tests the collision"
    backup = run_main("backup", instance.work_dir, "--repo", repo, "--json")
    assert backup.returncode == 0, backup.stderr
    instance.start()
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(3)
    written = _caught_up(instance, streamer)
    code, _out, err = streamer.stop()
    assert code == 0, err
    instance.kill()
    source = tr.dump_data_dir(instance.work_dir)
    assert source["vclock"][1] == written == _segments(repo)[-1][1][1]
    restored = run_main("restore", "latest", tmp_path / "end", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    dumped = tr.dump_data_dir(tmp_path / "end")
    assert dumped["vclock"][1] == written and dumped["spaces"]["mem"] == source["spaces"]["mem"]
    inside = stopped_at + 7
    point = f"1:{inside},0:{source['vclock'].get(0, 0)}"
    restored = run_main("restore", "latest", tmp_path / "inside", "--repo", repo, "--to", point, "--json")
    assert restored.returncode == 0, restored.stderr
    assert tr.dump_data_dir(tmp_path / "inside")["vclock"][1] == inside


@require_tarantool
def test_a_snapshot_inside_the_streamed_range_restores_to_the_end(instance, tmp_path):
    """A snapshot taken while the stream runs lies inside its segments, past the archived log: the tail a restore
    builds starts at the snapshot. Tarantool replays no xlog that starts before its snapshot (it takes the log for
    ended there): a tail from the log's end was refused here (its component 0 behind the snapshot's), and without
    local rows read and not one row of it replayed: exit 0 with the snapshot's rows for the end's (found by the
    nemesis suite)."""
    repo = new_repository(tmp_path / "repo")
    backup = run_main("backup", instance.work_dir, "--repo", repo, "--json")  # the archived log ends here
    assert backup.returncode == 0, backup.stderr
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(2)
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    snapshot = subprocess.run([*walvault_command(), "snapshot", str(instance.work_dir), "--connect",
                               f"bk@127.0.0.1:{instance.port}", "--repo", str(repo), "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert snapshot.returncode == 0, snapshot.stderr
    snapshot_id = json.loads(snapshot.stdout)["id"]
    streamer.wait_stored(streamer.status()["segments"] + 2)
    written = _caught_up(instance, streamer)
    code, _out, err = streamer.stop()
    assert code == 0, err
    instance.kill()
    source = tr.dump_data_dir(instance.work_dir)
    restored = run_main("restore", snapshot_id, tmp_path / "end", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["point"]["vclock"]["1"] == written
    dumped = tr.dump_data_dir(tmp_path / "end")
    assert dumped["vclock"][1] == written and dumped["spaces"]["mem"] == source["spaces"]["mem"]

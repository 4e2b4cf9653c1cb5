"""Adversarial review of continuous archiving (issue 25): each test a finding's reproduction."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import tarantool_real as tr  # noqa: F401 (the Tarantool of the real-instance tests)
from conftest import new_repository, require_tarantool, run_cli, walvault_command
from test_stream import PASSWORD, Streamer, _segments
from test_stream_sync import SyncInstance, _streaming, sync_instance  # noqa: F401 (a fixture)
from walcore.repository import Repository
from walcore.repository.archive import newest_segment_record
from walcore.tarantool.meta import vclock_from_json

_HOLD_LEASE = """
import sys, time
from walcore.repository import Repository
from walcore.repository.lease import acquire
repo = Repository(sys.argv[1], {})
acquire(repo.locks, repo._stream_lease_name("tarantool", sys.argv[2]), "stream", ttl=float(sys.argv[3]))
print("held", flush=True)
time.sleep(600)
"""


def test_a_stopped_streamer_that_no_longer_renews_its_lease_is_not_called_alive(tmp_path):
    """A streamer frozen by SIGSTOP (or wedged) on this host keeps its pid: its lease, no longer renewed, must stop
    calling it alive once expired (status and the stream freshness alert read stream_holder)."""
    repo_url = new_repository(tmp_path / "repo")
    instance = "00000000-0000-0000-0000-000000000001"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LEASE, str(repo_url), instance, "1"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        repo = Repository(str(repo_url), {})
        assert repo.stream_holder("tarantool", instance) is not None  # renewed: alive
        holder.send_signal(signal.SIGSTOP)
        time.sleep(2.5)  # more than its TTL of 1 s without a renewal
        assert repo.stream_holder("tarantool", instance) is None, "a frozen streamer is called alive"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def _backed_up(instance: SyncInstance, tmp_path) -> Path:
    """A repository holding a backup of the instance: where a first streamer subscribes from."""
    repo = new_repository(tmp_path / "repo")
    done = subprocess.run([*walvault_command(), "backup", str(instance.work_dir), "--connect",
                           f"bk@127.0.0.1:{instance.port}", "--repo", str(repo)],
                          env={**os.environ, "WALVAULT_PASSWORD": PASSWORD}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return repo


@require_tarantool
def test_a_space_made_synchronous_after_the_subscribed_position_does_not_hold_the_stream(sync_instance, tmp_path):
    """The receiver learns which spaces are is_sync from _space as it is now, but replays the log from the
    repository's position: an asynchronous write to `mem` made before `mem` became is_sync is taken for an
    undecided synchronous one, and it and everything after it are held until some CONFIRM, which no write of a
    synchronous space brings here: nothing is stored, the streamer's memory grows with the log."""
    repo = _backed_up(sync_instance, tmp_path)
    sync_instance.eval("box.cfg{replication_synchro_quorum = 1}")
    assert sync_instance.eval("return write('mem', {1})") == [True]
    sync_instance.eval("""box.session.su('admin', function()
        box.space._space:update(box.space.mem.id, {{'=', 6, {is_sync = true}}})
        box.schema.space.create('other'):create_index('pk')
    end)""")
    for key in range(1, 51):
        assert sync_instance.eval(f"return write('other', {{{key}}})") == [True]
    end = sync_instance.lsn()
    streamer = Streamer(sync_instance, repo, tmp_path)
    streamer.args += ["--segment-seconds", "0.1"]
    streamer.start()
    try:
        deadline = time.monotonic() + 15
        while not (streamer.status_path.exists() and int(streamer.status()["vclock"].get("1", 0)) >= end):
            assert streamer.proc.poll() is None, streamer.proc.communicate()
            assert time.monotonic() < deadline, \
                f"the stream is held at {streamer.status()['vclock'] if streamer.status_path.exists() else None}, " \
                f"the instance committed up to {end} (no synchronous transaction undecided)"
            time.sleep(0.1)
    finally:
        streamer.stop()


@require_tarantool
def test_a_space_no_longer_synchronous_keeps_a_rolled_back_write_out_of_sealed_segments(sync_instance, tmp_path):
    """The converse: `syn` was is_sync when a write to it was rolled back (with the writes behind it), and is no
    longer when the streamer starts from before it: the undone writes are given as committed one by one, and
    small segments end inside the undone tail, before the ROLLBACK that undoes it (a stream dying there leaves
    restore --to end holding writes the master undid)."""
    repo = _backed_up(sync_instance, tmp_path)
    before = sync_instance.lsn()
    undone = sync_instance.eval("""
        local fiber = require('fiber')
        box.cfg{replication_synchro_timeout = 1}
        local behind = {}
        for i = 1, 300 do
            fiber.create(function() fiber.sleep(0.1) behind[i] = write('mem', {i, string.rep('x', 8000)}) end)
        end
        local ok = write('syn', {1})
        while #behind < 300 do fiber.sleep(0.01) end
        for _, committed in ipairs(behind) do assert(not committed) end
        return ok""")
    assert undone == [False]
    rollback = sync_instance.lsn()
    assert rollback == before + 302  # syn 1, mem 1..300 (2.4 MB: more than a read), ROLLBACK
    sync_instance.eval("""box.session.su('admin', function()
        box.space._space:update(box.space.syn.id, {{'=', 6, {is_sync = false}}})
    end)""")
    streamer = Streamer(sync_instance, repo, tmp_path)
    streamer.args += ["--segment-bytes", "4096", "--segment-seconds", "0.1"]
    streamer.start()
    try:
        deadline = time.monotonic() + 30
        while not (_segments(repo) and _segments(repo)[-1][1].get(1, 0) >= rollback):
            assert streamer.proc.poll() is None, streamer.proc.communicate()
            assert time.monotonic() < deadline, _segments(repo)
            time.sleep(0.1)
    finally:
        streamer.stop()
    inside = [s for s in _segments(repo) if before + 1 <= s[1].get(1, 0) < rollback]
    assert not inside, f"segments end inside the undone tail {before + 1}..{rollback - 1}: {inside}"


def _restored_after_a_rollback(instance: SyncInstance, tmp_path, space: str, alter: str) -> list:
    """`alter` run as admin with a streamer attached, then a write to `space` that the master rolls back (no
    quorum), the streamer killed before the ROLLBACK: what restore --to end holds of `space`."""
    repo, streamer = _streaming(instance, tmp_path, "--segment-seconds", "0.1")
    instance.eval(f"box.session.su('admin', function() {alter} end)")
    assert instance.eval(f"return box.space.{space}.is_sync") == [True]
    before = instance.lsn()
    instance.eval(f"""
        local fiber = require('fiber')
        box.cfg{{replication_synchro_timeout = 3}}
        fiber.create(function() result = {{write('{space}', {{1}})}} end)""")
    time.sleep(1.5)  # received; the ROLLBACK comes at 3 s
    streamer.proc.kill()
    streamer.proc.communicate()
    deadline = time.monotonic() + 10
    while instance.eval("return result") in ([None], []):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert instance.eval("return result[1]") == [False]  # the client was told it failed
    assert instance.lsn() == before + 2  # the write, its ROLLBACK
    restored = run_cli("restore", "latest", tmp_path / "end", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    return tr.dump_data_dir(tmp_path / "end")["spaces"][space]


@require_tarantool
def test_a_space_made_synchronous_by_a_json_path_update_is_held_while_undecided(sync_instance, tmp_path):
    """`_space:update(id, {{'=', '[6].is_sync', true}})` makes a space synchronous in 2.6 as well as setting the
    whole field 6 does; the receiver read only the latter. A write to it, live, was then stored at once as
    committed: the streamer killed before the ROLLBACK that undoes it, restore --to end held a write the master
    undid and told its client failed."""
    assert _restored_after_a_rollback(sync_instance, tmp_path, "mem", """
        box.space._space:update(box.space.mem.id, {{'=', '[6].is_sync', true}})""") == []


@require_tarantool
def test_a_synchronous_space_stays_so_when_its_format_is_updated_by_a_json_path(sync_instance, tmp_path):
    """`_space:update(id, {{'=', '[7][1]', {name = ..., type = ...}}})` sets one field's format: a map, the last
    item of the op, which the receiver took for the space's options without is_sync: `syn` then counted as
    asynchronous, its rolled-back write stored at once as committed and restored."""
    assert _restored_after_a_rollback(sync_instance, tmp_path, "syn", """
        box.space.syn:format({{name = 'id', type = 'unsigned'}})
        box.space._space:update(box.space.syn.id, {{'=', '[7][1]', {name = 'key', type = 'unsigned'}}})""") == []


@require_tarantool
def test_a_restarted_streamer_takes_the_synchronous_spaces_its_newest_segment_kept(sync_instance, tmp_path,
                                                                                    monkeypatch):
    """A streamer stopped, `mem` made is_sync after an asynchronous write to it, then one started again: it resumes
    at the end of the newest segment, whose record keeps which spaces were is_sync there (`syn` only), so the write is
    given at once; the record is what says it (no restore of the repository is needed)."""
    from walcore.command import stream as stream_command

    repo, streamer = _streaming(sync_instance, tmp_path, "--segment-seconds", "0.1")
    sync_instance.eval("box.cfg{replication_synchro_quorum = 1}")
    assert sync_instance.eval("return write('mem', {1})") == [True]
    streamer.wait_stored(1)
    assert streamer.stop()[0] == 0
    syn, instance = sync_instance.eval("return box.space.syn.id, box.info.uuid")
    position = _segments(repo)[-1][1]
    monkeypatch.setattr(stream_command, "_sync_spaces_restored", lambda *args: None)
    repository = Repository(str(repo), {})
    newest = newest_segment_record(repository, "tarantool", instance)
    assert stream_command.sync_spaces_at(repository, instance, position, tmp_path, print, newest) == {syn}

    assert sync_instance.eval("return write('mem', {2})") == [True]
    sync_instance.eval("""box.session.su('admin', function()
        box.space._space:update(box.space.mem.id, {{'=', 6, {is_sync = true}}})
    end)""")
    end = sync_instance.lsn()
    streamer.start()
    try:
        deadline = time.monotonic() + 15
        while not (streamer.status_path.exists() and int(streamer.status()["vclock"].get("1", 0)) >= end):
            assert streamer.proc.poll() is None, streamer.proc.communicate()
            assert time.monotonic() < deadline, "the asynchronous write to mem is held as synchronous"
            time.sleep(0.1)
    finally:
        streamer.stop()


@require_tarantool
def test_a_segment_a_killed_streamer_left_open_keeps_its_synchronous_spaces(sync_instance, tmp_path):
    """The segment left open by a streamer killed after `mem` was made is_sync, sealed and stored by the next start:
    its record keeps the spaces of the one before it with its own `_space` rows followed (`mem` and `syn`)."""
    repo, streamer = _streaming(sync_instance, tmp_path, "--segment-seconds", "2")
    sync_instance.eval("box.cfg{replication_synchro_quorum = 1}")
    assert sync_instance.eval("return write('mem', {1})") == [True]
    streamer.wait_stored(1)
    sync_instance.eval("""box.session.su('admin', function()
        box.space._space:update(box.space.mem.id, {{'=', 6, {is_sync = true}}})
    end)""")
    time.sleep(0.5)  # in the open segment, fsynced; sealed only at 2 s
    streamer.proc.kill()
    streamer.proc.communicate()
    streamer.start()
    streamer.wait_stored(1)
    assert streamer.stop()[0] == 0
    ids = sorted(sync_instance.eval("return box.space.mem.id, box.space.syn.id"))
    records = sorted((json.loads(p.read_text()) for p in repo.glob("tarantool/*/stream/*.zst.json")),
                     key=lambda r: vclock_from_json(r["range"]["vclock"][0]).get(1, 0))
    assert records[-1]["sync_spaces"] == ids, records[-1]

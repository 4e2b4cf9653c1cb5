"""walcore.tarantool.live against a real, running Tarantool 2.6 that keeps writing (lua/live_server.lua).

What is proved on the instance itself: the pinned files survive checkpoints that would delete them, and
they are deleted once the session ends, so box.backup.stop() really ran.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tarantool

from conftest import REPO, require_tarantool
from tarantool_real import LUA_DIR, TARANTOOL
from walcore.tarantool.layout import kind_of
from walcore.tarantool.live import Checkpoint, LiveError, _vclock, backup_session, current_vclock, redact_uri
from walcore.tarantool.meta import MAX_META_SIZE, parse_meta

USER = "backup"
PASSWORD = "s3cret:with@signs"  # ':' and '@' must not confuse the URI parser
READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveInstance:
    work_dir: Path
    port: int

    @property
    def uri(self) -> str:
        return f"{USER}:{PASSWORD}@127.0.0.1:{self.port}"

    def eval(self, code: str) -> list:
        """Run Lua on the instance through a connection of the test's own."""
        conn = tarantool.Connection("127.0.0.1", self.port, user=USER, password=PASSWORD, fetch_schema=False,
                                    connection_timeout=10, socket_timeout=30)
        try:
            return conn.eval(code).data
        finally:
            conn.close()

    def backup_pinned(self) -> bool:
        return any("backup" in c["references"] for c in self.eval("return box.info.gc().checkpoints")[0])

    def files(self, pattern: str) -> set[Path]:
        return set(self.work_dir.glob(pattern))


@pytest.fixture
def live(tmp_path) -> Iterator[LiveInstance]:
    """A writing instance on a free loopback port, ready once it accepts our user; killed at the end."""
    work_dir = (tmp_path / "instance").resolve()
    log = tmp_path / "tarantool.log"
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([TARANTOOL, str(LUA_DIR / "live_server.lua"), str(work_dir), str(port), USER,
                                 PASSWORD], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    instance = LiveInstance(work_dir, port)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                instance.eval("return true")
                break
            except tarantool.Error:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"live_server.lua not ready (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
                time.sleep(0.05)
        yield instance
    finally:
        proc.kill()
        proc.wait()


def covers(a: dict[int, int], b: dict[int, int]) -> bool:
    """Every component of b is reached by a."""
    return all(a.get(k, 0) >= v for k, v in b.items())


def by_kind(checkpoint: Checkpoint) -> dict[str, list[Path]]:
    kinds: dict[str, list[Path]] = {}
    for p in checkpoint.files:
        kinds.setdefault(kind_of(p)[0], []).append(p)
    return kinds


@require_tarantool
def test_session_names_the_pinned_checkpoint_of_a_writing_instance(live):
    with backup_session(live.uri) as cp:
        kinds = by_kind(cp)
        assert sorted(kinds) == ["index", "run", "snap", "vylog"]
        assert len(kinds["snap"]) == len(kinds["vylog"]) == 1
        assert all(p.is_absolute() and p.is_file() for p in cp.files)
        assert cp.dirs == {"memtx_dir": live.work_dir / "memtx", "wal_dir": live.work_dir / "wal",
                           "vinyl_dir": live.work_dir / "vinyl", "work_dir": live.work_dir}
        snap, vylog = kinds["snap"][0], kinds["vylog"][0]
        assert snap.parent == cp.dirs["memtx_dir"] and vylog.parent == cp.dirs["vinyl_dir"]
        # vinyl space 513 has two indexes: a run and its index file under each
        assert {p.parent.relative_to(cp.dirs["vinyl_dir"]) for p in kinds["run"] + kinds["index"]} == \
            {Path("513/0"), Path("513/1")}
        assert {p.with_suffix("") for p in kinds["run"]} == {p.with_suffix("") for p in kinds["index"]}

        meta = parse_meta(snap.read_bytes()[:MAX_META_SIZE])
        assert cp.snapshot_vclock == meta.vclock
        assert cp.instance_uuid == meta.instance
        # the fiber has kept writing since the snapshot, to a local space (component 0) too
        assert 0 in cp.vclock and 1 in cp.vclock
        assert covers(cp.vclock, cp.snapshot_vclock) and sum(cp.vclock.values()) > sum(meta.vclock.values())
        assert live.backup_pinned()
        time.sleep(0.1)
        now = current_vclock(live.uri)
        assert covers(now, cp.vclock) and now != cp.vclock
    assert not live.backup_pinned()


@require_tarantool
def test_pinned_files_outlive_checkpoints_until_the_session_ends(live):
    """checkpoint_count = 1: unpinned, each box.snapshot() deletes the previous checkpoint's files."""
    with backup_session(live.uri) as cp:
        pinned = by_kind(cp)
        for _ in range(2):
            before = live.files("memtx/*.snap")
            live.eval("box.snapshot()")
            assert live.files("memtx/*.snap") - before, "box.snapshot() made no new snapshot"
            missing = [p for p in cp.files if not p.exists()]
            assert not missing, f"pinned files deleted while the backup ran: {missing}"
        # Tarantool collects garbage up to the oldest pinned checkpoint: the middle one stays too
        assert len(live.files("memtx/*.snap")) == 3
    live.eval("box.snapshot()")
    assert not pinned["snap"][0].exists() and not pinned["vylog"][0].exists()
    assert len(live.files("memtx/*.snap")) == 1


@require_tarantool
def test_body_raising_still_stops_the_backup(live):
    with pytest.raises(ZeroDivisionError):
        with backup_session(live.uri):
            assert live.backup_pinned()
            1 / 0
    assert not live.backup_pinned()
    with backup_session(live.uri) as cp:
        assert cp.files


@require_tarantool
def test_second_session_is_refused_and_leaves_the_first_pinned(live):
    with backup_session(live.uri) as cp:
        with pytest.raises(LiveError, match="already in progress"):
            with backup_session(live.uri):
                pytest.fail("a second backup started")
        assert live.backup_pinned(), "the refused session stopped the running backup"
        live.eval("box.snapshot()")
        assert all(p.exists() for p in cp.files)
    assert not live.backup_pinned()


@require_tarantool
def test_vclocks_come_as_maps_or_arrays_and_are_normalized(live):
    """msgpack sends a Lua table as an array when its keys are 1..n, as a map once key 0 is there."""
    as_array, as_map = live.eval("return {[1] = 5, [2] = 7}, {[0] = 1, [1] = 5}")
    assert as_array == [5, 7] and as_map == {0: 1, 1: 5}
    assert _vclock(as_array) == {1: 5, 2: 7} and _vclock(as_map) == {0: 1, 1: 5}


def assert_hidden(error: LiveError, uri: str) -> None:
    text = "".join(traceback.format_exception(error))
    for shown in (str(error), repr(error), text):
        assert PASSWORD not in shown and uri not in shown
    assert redact_uri(uri) in str(error)


@require_tarantool
def test_wrong_password_is_refused_without_showing_it(live):
    uri = f"tarantool://{USER}:{PASSWORD}x@127.0.0.1:{live.port}"
    with pytest.raises(LiveError, match="cannot connect") as caught:
        with backup_session(uri):
            pytest.fail("connected with a wrong password")
    assert_hidden(caught.value, uri)
    assert "***" in str(caught.value) and "Incorrect password" in str(caught.value)
    with pytest.raises(LiveError) as caught:
        current_vclock(uri)
    assert_hidden(caught.value, uri)
    assert not live.backup_pinned()


def test_nothing_listening_fails_fast():
    uri = f"{USER}:{PASSWORD}@127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(LiveError, match="cannot connect") as caught:
        with backup_session(uri, timeout=2.0):
            pytest.fail("connected to nothing")
    assert time.monotonic() - started < 2.0
    assert_hidden(caught.value, uri)


def test_a_silent_listener_times_out():
    """A port that accepts but never greets (not Tarantool, or a hung one): the timeout bounds the wait."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"{USER}:{PASSWORD}@127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(LiveError) as caught:
            current_vclock(uri, timeout=1.0)
        assert 0.9 < time.monotonic() - started < 5.0
    assert_hidden(caught.value, uri)


@pytest.mark.parametrize("uri, redacted", [
    ("admin:secret@127.0.0.1:3301", "admin:***@127.0.0.1:3301"),
    ("tarantool://user:pw@host:3301", "tarantool://user:***@host:3301"),
    ("u:p:a@ss@[::1]:3301", "u:***@[::1]:3301"),
    ("user@host:3301", "user@host:3301"),
    ("127.0.0.1:3301", "127.0.0.1:3301"),
    ("tarantool://host:3301", "tarantool://host:3301"),
    ("TARANTOOL://u:pw@host:3301", "TARANTOOL://u:***@host:3301"),
])
def test_redact_uri(uri, redacted):
    assert redact_uri(uri) == redacted


@pytest.mark.parametrize("uri", ["admin:secret@host", "admin:secret@:3301", ":secret@host:3301",
                                 "http://admin:secret@host:3301", "admin:secret@unix/:/run/tarantool.sock"])
def test_malformed_uri_is_refused_without_its_password(uri):
    with pytest.raises(LiveError, match="not a Tarantool URI") as caught:
        current_vclock(uri)
    assert "secret" not in str(caught.value)


def test_without_the_connector_only_calling_fails():
    code = """
import sys
sys.modules['tarantool'] = None  # makes `import tarantool` fail
from walcore.tarantool.live import LiveError, current_vclock
try:
    current_vclock('127.0.0.1:3301')
except LiveError as e:
    print(e)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "pip install tarantool" in proc.stdout

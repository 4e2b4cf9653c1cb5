"""The fault-injection harness (issue 22, section 7): random schedules of real `walvault` commands, two at a time,
with faults between and during them, over a local repository or S3 (moto's server behind a loopback TCP proxy the
harness stalls and resets), then the invariants.

A schedule is generated from a seed (`plan(seed, storage)`: deterministic, no I/O) and run by `run_schedule`.
Sources are copies of one Tarantool data dir built once per `Env` (`template`): every write after it is a
single-row `replace` into the space `nem` whose LSN the harness knows, so the source's state at any vclock is known
without asking walvault: `History.state_at`. Writes of a second history (a copy of the data dir that goes on
writing, same instance UUID) carry another tag, so rows of one history restored as the other's are seen.

Operations: backup full/incremental (plain, or `--connect` to a Tarantool writing all the time), archive,
snapshot, policy, `expire --apply` (with `--days`, and `--as-of` past or future), restore (whole, `--to` a
vclock, and `--to end`), `verify --repo`. Faults: SIGSTOP past the lease while a second backup of the source runs,
SIGKILL at a random moment, proxy stalls and resets (S3), a per-process clock offset (`faketime`), a full
filesystem (a tmpfs as a restore target, or as a local repository), a second history of the instance, and
deliberate damage to one repository object at the end.

The streamer (`walvault stream`, its own spool, through a proxy in front of the writing Tarantool) runs during
most live phases over a local repository (`_stream_steps`, a generator of its own: the rest of a seed's plan is unchanged) and suffers:
SIGKILL, then a restart on its spool; SIGSTOP while a second streamer starts on "another host" (a UTS namespace of
its own, its clock past the lease): the second refuses or takes over, and the first, woken, must commit no
segment; its connection stalled and reset; its clock off; the instance's other history served at its address,
behind or ahead of where the stream stopped, which it must not stream on as the continuation of its log.

Every schedule copies the repository (`walvault copy --all --archive`) into a second one, a local directory, near
its end (`_copy_steps`, a generator of its own: the rest of a seed's plan is unchanged): a copy killed (SIGKILL) at a
random moment, then one run to its end; after each, every backup the destination lists is `ok` or an interrupted
copy's leftovers, `verify --repo` of the destination exits 0, and after the last, the backups it lists `ok` restore
to their source's rows (sampled, as below).

A quarter of the schedules back up into an encrypted repository (`_key_steps`, a generator of its own: the rest of a
seed's plan is unchanged but for the streamer, left out: the harness reads its segments in clear), every command
given its key (WALVAULT_KEY), and rotate its key (`walvault key rotate`) after the checked expiry: alone or beside a
backup, an archive or an expiry, SIGKILLed at a random moment then run again, or not. Then the repository opens with
exactly one of the old and the new key (after the kill too), the new one once a rotation exited 0, and every later
command is given that one; a command given a key that never was the repository's (before the rotation) or the old
one (once the rotation finished) exits 2 and writes nothing (the repository's object listing unchanged); the
backups listed ok restore to their source's rows (sampled) and `verify --repo` exits 0.

Invariants (a `Violation` each): no traceback on any stderr; exit codes 0/1/2 only; a command exiting 0 tells
the truth (a restore gives the source's rows at the point); every backup `backups` lists `ok` restores to its
source's rows at its position (Tarantool started on the restore; sampled, at least one per schedule); every point
of the window restorable before an `expire --apply` still is after it; `verify --repo` exits 0, or when the
schedule damaged the repository on purpose exits 1 naming the damaged object; a restore into a full filesystem
removes its staging directory. With a streamer: `restore --to end` exiting 0 gives the source's rows at the point
it names, a point no earlier than the newest segment stored before it started (from the newest backup, one
history streamed, no gap said); no row is in two segments; `walvault stream` exits 0 only with no gap said.

A refusal (exit 1 or 2, said on stderr) is always a legitimate outcome: the harness never requires a command to
succeed, only that what succeeds is true. A pause cannot outlast the 60 s lease in a short schedule: the second
backup sees the paused one's lease expired through its clock instead (`faketime`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import tarantool_real  # noqa: E402

DAY = 86400.0
HOUR = 3600.0
USER, PASSWORD = "nemesis", "nem:pa@ss"  # ':' and '@' in the password: the URI form must cope
OP_TIMEOUT = 120.0
S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "nemesis-key", "AWS_SECRET_ACCESS_KEY": "nemesis-secret-value",
                  "AWS_DEFAULT_REGION": "us-east-1"}
# copy_kill is every schedule's (two copy steps in each plan): not a kind that chooses CI's covering seeds; nor is
# key_kill (an encrypted plan's), so that the covering seeds stay what they were: CI adds an encrypted one
FAULT_KINDS = ("pause", "kill", "clock", "stall", "reset", "fullfs", "fork", "damage", "junk_lease",
               "stream_kill", "stream_pause", "stream_clock", "stream_stall", "stream_reset", "stream_fork")
STREAM_SEGMENT_SECONDS = "0.5"  # more segments, so more commit points, in the few seconds a streamer runs
OTHER_HOST = "nemesis-other"  # a second streamer's hostname (its own UTS namespace): it judges the lease by expiry
# what a lease's `expires` may hold when something else wrote it: each must give a clear refusal, never a hang
JUNK_EXPIRES = ('"soon"', "NaN", "Infinity", "1e308", "-Infinity")
TEMPLATE_AGE_DAYS = 9  # the template's rows are this old (faketime): a window of days has something to expire

# Every write after the template: one row per transaction into `nem`, so LSN = first + i.
_WRITER_LUA = r"""
local json = require('json')
local cfg = json.decode(arg[1])
box.cfg{memtx_dir = cfg.dir .. '/memtx', wal_dir = cfg.dir .. '/wal', vinyl_dir = cfg.dir .. '/vinyl',
        work_dir = cfg.dir, feedback_enabled = false, checkpoint_count = 2, checkpoint_interval = 0,
        wal_max_size = 4096, log_level = 2}
if cfg.init then
    box.schema.space.create('nem', {if_not_exists = true}):create_index('pk', {if_not_exists = true})
    box.schema.user.create(cfg.user, {password = cfg.password, if_not_exists = true})
    box.schema.user.grant(cfg.user, 'execute', 'universe', nil, {if_not_exists = true})
    box.schema.user.grant(cfg.user, 'replication', nil, nil, {if_not_exists = true})  -- walvault stream's
end
local first = box.info.vclock[1] or 0
for i = 1, cfg.rows do
    box.space.nem:replace{i % 50, cfg.tag .. '-' .. i}
    if cfg.snapshot and i == math.floor(cfg.rows / 2) then box.snapshot() end
end
if cfg.init then box.snapshot() end
io.stdout:write(json.encode({first = first, last = box.info.vclock[1], time = require('fiber').time(),
                             local_lsn = box.info.vclock[0] or 0}) .. '\n')
os.exit(0)
"""

# A running instance on the data dir writing all the time (for --connect); stdin closed: it stops and says where.
_LIVE_LUA = r"""
local json = require('json')
local fiber = require('fiber')
local cfg = json.decode(arg[1])
box.cfg{memtx_dir = cfg.dir .. '/memtx', wal_dir = cfg.dir .. '/wal', vinyl_dir = cfg.dir .. '/vinyl',
        work_dir = cfg.dir, feedback_enabled = false, checkpoint_count = 2, checkpoint_interval = 0,
        wal_max_size = 65536, log_level = 2}
local first = box.info.vclock[1] or 0
local running, i = true, 0
for _ = 1, cfg.burst do  -- at once: this history ahead of where a stream of the other one stopped
    i = i + 1
    box.space.nem:replace{i % 50, cfg.tag .. '-' .. i}
end
local done = fiber.channel(1)
fiber.create(function()
    while running do
        i = i + 1
        box.space.nem:replace{i % 50, cfg.tag .. '-' .. i}
        fiber.sleep(0.01)  -- ~100 rows a second: a few xlogs while it runs, not hundreds
    end
    done:put(true)
end)
box.cfg{listen = '127.0.0.1:' .. cfg.port}
io.stdout:write(json.encode({first = first}) .. '\n')
io.stdout:flush()
local fio = require('fio')
local stdin = fio.open('/dev/stdin', {'O_RDONLY', 'O_NONBLOCK'})
while true do
    local data = stdin:read(1)
    if data ~= nil and #data == 0 then break end
    fiber.sleep(0.05)
end
running = false
done:get()
io.stdout:write(json.encode({last = box.info.vclock[1], rows = i}) .. '\n')
io.stdout:flush()
os.exit(0)
"""


def walvault_command() -> list[str]:
    entry = Path(sys.executable).with_name("walvault")
    if entry.exists():
        return [str(entry)]
    found = shutil.which("walvault")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'walvault'; from walcore.cli import run; run()"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the loopback proxy in front of moto


class StallableProxy:
    """A TCP proxy on 127.0.0.1 (asyncio, its own thread): `stall(s)` holds every byte for s seconds, `reset()`
    closes every connection abruptly (RST)."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self._stall_until = 0.0
        self._transports: set = set()
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="nemesis-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _handle(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer.transport, up_writer.transport)
        self._transports.update(pair)

        async def pipe(src, dst) -> None:
            try:
                while data := await src.read(65536):
                    while time.monotonic() < self._stall_until:
                        await asyncio.sleep(0.02)
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.transport.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        self._transports.difference_update(pair)

    def stall(self, seconds: float) -> None:
        self._stall_until = time.monotonic() + seconds

    def reset(self) -> int:
        done, count = threading.Event(), [0]

        def abort_all() -> None:
            for transport in list(self._transports):
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    try:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    except OSError:
                        pass
                transport.abort()
                count[0] += 1
            done.set()

        self._loop.call_soon_threadsafe(abort_all)
        done.wait(5)
        return count[0]

    def close(self) -> None:
        self._stall_until = 0.0
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


# -- sources and what they held


@dataclass
class History:
    """One history of the instance: a data dir and every `nem` write it holds, (lsn, key, value, time)."""

    name: str
    path: Path
    writes: list[tuple[int, int, str, float]]
    points: list[tuple[int, float]]  # (lsn after a write step, that step's time): candidate restore points

    @property
    def last_lsn(self) -> int:
        return self.writes[-1][0] if self.writes else 0

    def state_at(self, lsn: int) -> list[list]:
        rows: dict[int, str] = {}
        for at, key, value, _ in self.writes:
            if at > lsn:
                break
            rows[key] = value
        return [[k, rows[k]] for k in sorted(rows)]

    def add(self, first: int, rows: int, tag: str, when: float) -> None:
        self.writes += [(first + i, i % 50, f"{tag}-{i}", when) for i in range(1, rows + 1)]


class Env:
    """What every schedule shares: the template data dir, moto's server and the proxy, the tools found."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="nemesis-")).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.walvault = walvault_command()
        self.faketime = shutil.which("faketime")
        code = _walcore_dir().parent
        self.env = {**os.environ, **S3_CREDENTIALS, "PYTHONPATH": os.pathsep.join(
            [str(code), str(code / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for key, value in S3_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        self.env["WALVAULT_PASSWORD"] = PASSWORD  # a live backup's password, never on a command line
        self.can_mount = os.geteuid() == 0 and self._try_mount()
        # a second streamer on "another host": its own hostname, in a UTS namespace of its own
        self.can_unshare = os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
            ["unshare", "--uts", "true"], capture_output=True).returncode == 0
        self._build_template()
        self._moto = None
        self._lock = threading.Lock()

    # S3 comes up on first use: a run over local repositories never starts it
    def s3(self) -> str:
        with self._lock:
            if self._moto is None:
                self._start_moto()
        return self.s3_direct

    def s3_client(self):
        """A boto3 client of moto's server (made under a lock: boto3's default session is not thread-safe)."""
        import boto3

        with self._lock:
            return boto3.client("s3", endpoint_url=self.s3_direct, region_name="us-east-1")

    def _start_moto(self) -> None:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.s3_direct = f"http://{host}:{port}"
        self.s3_port = port

    def close(self) -> None:
        if self._moto is not None:
            self._moto.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _try_mount(self) -> bool:
        mnt = self.root / "mount-probe"
        mnt.mkdir()
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                            capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        mnt.rmdir()
        return ok

    def _build_template(self) -> None:
        """A small real data dir (vinyl too), its rows TEMPLATE_AGE_DAYS old, then `nem` with 200 rows."""
        self.template = self.root / "template"
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", "FAKETIME")}
        if self.faketime:
            os.environ["FAKETIME"] = f"-{TEMPLATE_AGE_DAYS * 24}h"
            os.environ["LD_PRELOAD"] = _libfaketime()
        try:
            tarantool_real.generate_instance(self.template, wal_max_size=4096, scale=1, snapshots=1)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        history = History("h1", self.template, [], [])
        self.write(history, rows=200, tag="t", offset=-(TEMPLATE_AGE_DAYS - 1) * DAY, init=True)
        self.template_writes, self.template_points = list(history.writes), list(history.points)
        dump = tarantool_real.dump_data_dir(self.template)
        self.local_lsn = dump["vclock"].get(0, 0)
        self.instance_uuid = dump["instance_uuid"]
        self.template_spaces = {k: v for k, v in dump["spaces"].items() if k != "nem"}

    def write(self, history: History, *, rows: int, tag: str, offset: float, snapshot: bool = False,
              init: bool = False) -> None:
        """Write `rows` rows into a stopped history's data dir with the clock `offset` seconds from now."""
        cfg = {"dir": str(history.path), "rows": rows, "tag": tag, "snapshot": snapshot, "init": init,
               "user": USER, "password": PASSWORD}
        with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="nemesis-", delete=False) as f:
            f.write(_WRITER_LUA)
        try:
            proc = subprocess.run([tarantool_real.TARANTOOL, f.name, json.dumps(cfg)], capture_output=True, text=True,
                                  timeout=60, cwd=history.path, env={**os.environ, **self.clock_env(offset)})
        finally:
            os.unlink(f.name)
        if proc.returncode != 0:
            raise tarantool_real.TarantoolError(f"writer on {history.path} exited {proc.returncode}",
                                                log=proc.stderr + proc.stdout)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["last"] - out["first"] == rows, out
        history.add(out["first"], rows, tag, out["time"])
        history.points.append((out["last"], out["time"]))

    def clock_env(self, offset: float | None) -> dict[str, str]:
        """The environment of a process whose clock is `offset` seconds off: libfaketime preloaded, not the faketime
        wrapper (a signal to a process group would reach the wrapper too; a killed wrapper leaves its semaphore,
        and a later one given the same pid fails on it: "sem_open: File exists"). The wall clock only, as a host's
        clock is wrong: a monotonic clock offset too put every timed wait's deadline hours off (a streamer so
        started stored no segment, ever)."""
        if not offset or not self.faketime:
            return {}
        return {"LD_PRELOAD": _libfaketime(), "FAKETIME": f"{'+' if offset > 0 else '-'}{abs(offset) / HOUR:.0f}h",
                "DONT_FAKE_MONOTONIC": "1"}


def _walcore_dir() -> Path:
    import walcore

    return Path(walcore.__file__).resolve().parent


def _libfaketime() -> str:
    for candidate in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"):
        if os.path.exists(candidate):
            return candidate
    return ""


# -- the plan


@dataclass
class Op:
    kind: str  # backup_full backup_inc archive snapshot expire restore restore_to verify policy
    source: str = "h1"
    live: bool = False
    clock: float | None = None  # seconds of clock offset (faketime)
    days: int | None = None
    as_of: float | None = None  # seconds from now (expire)
    fullfs: bool = False

    def label(self) -> str:
        extra = []
        if self.live:
            extra.append("connect")
        if self.clock:
            extra.append(f"clock{self.clock / HOUR:+.0f}h")
        if self.days is not None:
            extra.append(f"days={self.days}")
        if self.as_of is not None:
            extra.append(f"as_of{self.as_of / HOUR:+.0f}h")
        if self.fullfs:
            extra.append("fullfs")
        return f"{self.kind}({self.source}{''.join(',' + e for e in extra)})"


@dataclass
class Step:
    kind: str  # write fork live_start live_stop pair expire_check damage
    a: Op | None = None
    b: Op | None = None
    fault: str | None = None  # pause kill stall reset (during the pair)
    delay: float = 0.0  # when the fault strikes, seconds after A starts
    length: float = 0.0  # how long a stall holds
    source: str = "h1"
    rows: int = 0
    offset: float = 0.0
    snapshot: bool = False
    days: int = 0
    as_of: float | None = None
    junk: str = ""
    clock: float | None = None  # a streamer's clock offset (faketime)
    ahead: bool = False  # stream_fork: the other history has passed where the stream stopped

    def label(self) -> str:
        if self.kind == "stream_start":
            return f"stream_start{f' clock{self.clock / HOUR:+.0f}h' if self.clock else ''}"
        if self.kind == "stream_fault":
            length = f"x{self.length:.1f}s" if self.fault == "stall" else ""
            return f"stream_fault {self.fault}@{self.delay:.2f}s{length}"
        if self.kind == "stream_fork":
            return f"stream_fork ({'ahead of' if self.ahead else 'behind'} the stream)"
        if self.kind == "junk_lease":
            return f"junk_lease expires={self.junk} then backup_inc(h1)"
        if self.kind == "copy":
            return f"copy --all --archive{f' killed@{self.delay:.2f}s' if self.fault else ''}"
        if self.kind == "key_rotate":
            beside = f" + {self.b.label()}" if self.b else ""
            return f"key rotate{beside}{f' killed@{self.delay:.2f}s' if self.fault else ''}"
        if self.kind == "pair":
            fault = f" fault={self.fault}@{self.delay:.2f}s" if self.fault else ""
            if self.fault == "stall":
                fault += f"x{self.length:.1f}s"
            return f"pair {self.a.label()} + {self.b.label() if self.b else '-'}{fault}"
        if self.kind == "write":
            snapshot = " +snapshot" if self.snapshot else ""
            return f"write {self.source} rows={self.rows} at{self.offset / DAY:+.2f}d{snapshot}"
        if self.kind == "expire_check":
            as_of = "now" if self.as_of is None else f"{self.as_of / HOUR:+.0f}h"
            return f"expire_check days={self.days} as_of={as_of}"
        return self.kind


@dataclass
class Plan:
    seed: int
    storage: str
    steps: list[Step]
    repo_on_tmpfs: bool = False
    encrypted: bool = False  # an encrypted repository, its key rotated (`_key_steps`)

    def fault_kinds(self) -> set[str]:
        kinds = {s.fault for s in self.steps if s.kind == "pair" and s.fault}
        kinds |= {"clock" for s in self.steps if s.kind == "pair" for o in (s.a, s.b) if o and o.clock}
        kinds |= {"fullfs" for s in self.steps if s.kind == "pair" for o in (s.a, s.b) if o and o.fullfs}
        kinds |= {"fork" for s in self.steps if s.kind == "fork"}
        kinds |= {"damage" for s in self.steps if s.kind == "damage"}
        kinds |= {"junk_lease" for s in self.steps if s.kind == "junk_lease"}
        kinds |= {f"stream_{s.fault}" for s in self.steps if s.kind == "stream_fault"}
        kinds |= {"stream_clock" for s in self.steps if s.kind == "stream_start" and s.clock}
        kinds |= {"stream_fork" for s in self.steps if s.kind == "stream_fork"}
        if self.repo_on_tmpfs:
            kinds.add("fullfs")
        return kinds


def plan(seed: int, storage: str, copies: bool = True) -> Plan:
    """The schedule of a seed: a covered past (writes at -6 days, a full backup and an archive), then random
    writes and pairs with faults (a fork, a live phase, a streamer in it), the checked expiry, maybe damage.
    `copies=False`: without the copy steps (`_copy_steps`), as the plans were before copy joined them."""
    rng = random.Random(seed)
    steps: list[Step] = []
    offsets = sorted(-rng.uniform(0.05, 5.5) * DAY for _ in range(3)) + [0.0]
    forked = False
    live_phase = rng.random() < 0.35
    steps.append(Step("write", rows=rng.randint(20, 60), offset=-6 * DAY, snapshot=True))
    steps.append(Step("pair", a=Op("backup_full"), b=Op("archive")))
    writes_left = list(offsets)
    n_middle = rng.randint(2, 3)

    def random_op(allow_live: bool) -> Op:
        kind = rng.choice(["backup_full", "backup_inc", "backup_inc", "archive", "snapshot", "restore",
                           "restore_to", "verify", "expire", "policy"])
        source = "h2" if forked and kind in ("backup_full", "backup_inc", "archive", "restore", "restore_to") \
            and rng.random() < 0.5 else "h1"
        op = Op(kind, source=source)
        if allow_live and source == "h1" and kind in ("backup_full", "backup_inc", "snapshot"):
            op.live = True
        if kind == "expire":
            op.days = rng.choice([1, 2, 4])
            op.as_of = rng.choice([None, None, 3 * DAY, -HOUR])
        if kind in ("restore", "restore_to") and rng.random() < 0.3:
            op.fullfs = True
        if rng.random() < 0.2 and kind != "expire":
            op.clock = rng.choice([2 * HOUR, -2 * HOUR, 3 * DAY])
        elif rng.random() < 0.1 and kind == "expire":
            op.clock = -2 * HOUR  # a clock behind the records: a refusal is due, a deletion never
        return op

    def random_pair(allow_live: bool) -> Step:
        a, b = random_op(allow_live), random_op(allow_live)
        faults = ["pause", "kill", "kill", None, None] + (["stall", "reset"] if storage == "s3" else [])
        fault = rng.choice(faults)
        step = Step("pair", a=a, b=b, fault=fault, delay=rng.uniform(0.05, 0.6), length=rng.uniform(1.0, 3.0))
        if fault == "pause":
            # the second backs up the same source while the first is stopped holding its lease
            a.kind, a.live, a.fullfs = rng.choice(["backup_full", "backup_inc", "snapshot"]), False, False
            b.kind, b.source, b.live, b.fullfs = rng.choice(["backup_full", "backup_inc"]), a.source, False, False
            a.clock, b.clock, a.days, a.as_of, b.days, b.as_of = None, None, None, None, None, None
        return step

    for _ in range(n_middle):
        roll = rng.random()
        if writes_left and roll < 0.45:
            steps.append(Step("write", source="h2" if forked and rng.random() < 0.4 else "h1",
                              rows=rng.randint(10, 40), offset=writes_left.pop(0), snapshot=rng.random() < 0.5))
        elif not forked and roll < 0.6:
            steps.append(Step("fork"))
            steps.append(Step("write", source="h2", rows=rng.randint(10, 40),
                              offset=writes_left[0] if writes_left else 0.0, snapshot=rng.random() < 0.5))
            forked = True
        elif roll < 0.72:
            steps.append(Step("junk_lease", junk=rng.choice(JUNK_EXPIRES)))
        else:
            steps.append(random_pair(False))
    while writes_left:
        offset = writes_left.pop(0)
        steps.append(Step("write", source="h1", rows=rng.randint(10, 40), offset=offset, snapshot=rng.random() < 0.5))
        if offset == 0.0 and rng.random() < 0.6:
            steps.append(random_pair(False))
        elif offset != 0.0 and rng.random() < 0.4:
            # a backup and an archive inside the history: a base and a log for the window's points to need
            steps.append(Step("pair", a=Op("backup_inc"), b=Op("archive")))
    if live_phase:
        stream_before, stream_after = _stream_steps(seed, forked) if storage == "local" else ([], [])
        steps.append(Step("live_start"))
        steps += stream_before
        steps.append(random_pair(True))
        steps += stream_after
        steps.append(Step("live_stop"))
    # the window's points reach the archive before the checked expiry (the newest xlog is never archived)
    steps.append(Step("pair", a=Op("archive"), b=Op("backup_inc", source="h2" if forked else "h1")))
    steps.append(Step("expire_check", days=rng.choice([1, 2, 3]), as_of=rng.choice([None, None, 2 * DAY, -HOUR])))
    repo_on_tmpfs = storage == "local" and rng.random() < 0.15
    if repo_on_tmpfs:  # a repository full from the start: a streamer would store nothing, its faults strike none
        steps = [s for s in steps if not s.kind.startswith("stream_")
                 and not (s.kind == "pair" and s.a.kind == "restore_end")]
    encrypted, key_steps = _key_steps(seed)
    if encrypted:  # the harness reads the streamer's segments in clear: an encrypted plan has no streamer
        steps = [s for s in steps if not s.kind.startswith("stream_")
                 and not (s.kind == "pair" and s.a.kind == "restore_end")]
    steps += key_steps
    steps += _copy_steps(seed) if copies else []
    if rng.random() < 0.3:
        steps.append(Step("pair", a=Op("policy"), b=Op("backup_inc")))
        steps.append(Step("damage"))
    return Plan(seed, storage, steps, repo_on_tmpfs, encrypted)


def _key_steps(seed: int) -> tuple[bool, list[Step]]:
    """Whether the repository is encrypted and, when it is, its `key rotate` after the checked expiry, from a
    generator of its own (the rest of a seed's plan is what it was before encryption joined): the rotation SIGKILLed
    at a random moment (then run again) or not, alone or beside a backup, an archive or an expiry."""
    rng = random.Random(seed * 7368787 + 13)
    if rng.random() >= 0.25:
        return False, []
    beside = rng.choice([None, Op("backup_inc"), Op("archive"), Op("expire", days=rng.choice([2, 4]))])
    fault = rng.choice([None, "kill"])
    return True, [Step("key_rotate", b=beside, fault=fault, delay=rng.uniform(0.3, 2.0))]  # a rotation: 1-1.5 s


def _copy_steps(seed: int) -> list[Step]:
    """`walvault copy` of the repository into a second one, from a generator of its own (the rest of a seed's plan is
    what it was before copy joined): always two steps, so that every plan grows alike and the plans' lengths, which
    choose CI's covering seeds among equals, keep their order: a copy killed at a random moment, then one to its
    end."""
    rng = random.Random(seed * 15485863 + 11)
    return [Step("copy", fault="kill", delay=rng.uniform(0.2, 2.0)), Step("copy")]


def _stream_steps(seed: int, forked: bool) -> tuple[list[Step], list[Step]]:
    """The streamer's part of a live phase over a local repository (moto serves S3 in the harness's own process: a
    streamer's requests, a few a second, would slow every other operation's), from a generator of its own (the rest
    of a seed's plan is what it was before the streamer joined): its start and faults before the live pair, then a
    `restore --to end` beside a live backup, the instance's other history, its stop."""
    rng = random.Random(seed * 104729 + 3)
    if rng.random() < 0.2:
        return [], []
    before = [Step("stream_start", clock=rng.choice([None, None, 2 * HOUR, -2 * HOUR, 3 * DAY]))]
    # the pause last: the second streamer, of another host, goes on in the first one's place
    for fault in ("kill", "stall", "reset", "pause"):
        if rng.random() < 0.5:
            before.append(Step("stream_fault", fault=fault, delay=rng.uniform(0.1, 1.5), length=rng.uniform(1.0, 3.0)))
    after = [Step("pair", a=Op("restore_end"), b=Op("backup_inc", live=True) if rng.random() < 0.5 else None)]
    if forked and rng.random() < 0.6:
        after.append(Step("stream_fork", ahead=rng.random() < 0.5))
    after.append(Step("stream_stop"))
    return before, after


# -- running it


@dataclass
class Violation:
    kind: str
    detail: str


@dataclass
class Outcome:
    seed: int
    storage: str
    seconds: float = 0.0
    operations: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    error: str | None = None  # the harness itself failed (not walvault): a bug to fix here

    @property
    def ok(self) -> bool:
        return not self.violations and self.error is None

    def as_dict(self) -> dict:
        return {"seed": self.seed, "storage": self.storage, "seconds": round(self.seconds, 2),
                "operations": self.operations, "faults": self.faults,
                "violations": [{"kind": v.kind, "detail": v.detail} for v in self.violations],
                "error": self.error, "log": self.log}


@dataclass
class Finished:
    op: Op
    argv: list[str]
    rc: int | None
    stdout: str
    stderr: str
    killed: bool = False
    target: Path | None = None
    backup_id: str | None = None
    point: int | None = None
    mount: Path | None = None
    floor: int | None = None  # restore_end: the newest segment's end when it started (None: not judged by it)


@dataclass
class Streamer:
    """One run of `walvault stream`; `profile` says how it was started (a restart is started the same way)."""

    proc: subprocess.Popen
    log: Path  # its stdout and stderr
    profile: dict  # spool, status, clock, host

    def status(self) -> dict:
        try:
            return json.loads(self.profile["status"].read_text())
        except (OSError, ValueError):
            return {}

    def gaps(self) -> list | bool:
        """The gaps this run said, in its status file or on its output (so far, while it runs)."""
        return self.status().get("gaps") or "GAP:" in self.log.read_text()


class Schedule:
    def __init__(self, env: Env, seed: int, storage: str, copies: bool = True):
        self.env, self.plan = env, plan(seed, storage, copies)
        self.rng = random.Random(seed * 7919 + 1)  # runtime choices (which backup, which point)
        self.out = Outcome(seed, storage)
        self.dir = env.root / f"s{seed}-{storage}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.histories: dict[str, History] = {}
        self.backups: dict[str, dict] = {}  # id -> {"path", "position", "suspect"} from the op's own output
        self.damaged: dict | None = None
        self.live: subprocess.Popen | None = None
        self.live_hist: History | None = None  # the history the live instance writes
        self.streamer: Streamer | None = None
        self.stream_proxy: StallableProxy | None = None  # between the streamer and the live instance
        self.stream_points: list[tuple[str, int]] = []  # (history, lsn) restored to the end: points once known
        self.stream_gapped = False  # a streamer said rows never came: its end may be short of the newest segment
        self.stream_other_history = False  # the other history was streamed: two ends
        self.copy_url: str | None = None  # the second repository `walvault copy` copies into
        self.copy_rng = random.Random(seed * 104723 + 5)  # its checks' choices: the schedule's own are unchanged
        # an encrypted repository's keys: every command is given `key`, the one the repository opens with now
        self.old_key, self.new_key = f"nemesis old key {seed}", f"nemesis new key {seed}"
        self.key = self.old_key if self.plan.encrypted else None
        self.mounts: list[Path] = []
        self.procs: list[subprocess.Popen] = []  # every walvault started: none outlives the schedule
        self._scratch = 0

    # -- helpers

    def note(self, text: str) -> None:
        self.out.log.append(text)

    def violate(self, kind: str, detail: str) -> None:
        self.out.violations.append(Violation(kind, detail))
        self.note(f"  VIOLATION {kind}: {detail}")

    def fault(self, kind: str) -> None:
        self.out.faults[kind] = self.out.faults.get(kind, 0) + 1

    def scratch(self, name: str) -> Path:
        self._scratch += 1
        return self.dir / f"{name}-{self._scratch}"

    def mount_tmpfs(self, path: Path, size: str) -> bool:
        path.mkdir(parents=True, exist_ok=True)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode:
            return False
        self.mounts.append(path)
        return True

    @property
    def run_env(self) -> dict[str, str]:
        """The environment of every walvault the schedule runs: the repository's key in it when it has one."""
        return self.with_key(self.key) if self.key else self.env.env

    def with_key(self, key: str) -> dict[str, str]:
        return {**self.env.env, "WALVAULT_KEY": key}

    def repo_args(self, direct: bool = False) -> list[str]:
        if self.plan.storage == "local":
            return ["--repo", self.repo_url]
        endpoint = self.env.s3_direct if direct else f"http://127.0.0.1:{self.proxy.port}"
        return ["--repo", self.repo_url, "--repo-option", f"endpoint_url={endpoint}"]

    # -- setup and teardown

    def setup(self) -> None:
        h1 = self.dir / "h1"
        shutil.copytree(self.env.template, h1)
        self.histories["h1"] = History("h1", h1, list(self.env.template_writes), list(self.env.template_points))
        from walcore.repository import Repository

        if self.plan.storage == "local":
            self.repo_url = str(self.dir / "repo")
            if self.plan.repo_on_tmpfs and self.env.can_mount and self.mount_tmpfs(self.dir / "repo", "900k"):
                self.fault("fullfs")
                self.note("local repository on a 900 KiB tmpfs")
            if self.plan.encrypted:
                Repository.init(self.repo_url, {}, encrypt=True, key=self.key)
            else:
                Repository(self.repo_url, {}, create=True)
        else:
            direct = self.env.s3()
            self.proxy = StallableProxy(self.env.s3_port)  # its own: a stall here reaches no other schedule
            self.s3 = self.env.s3_client()

            bucket = f"nemesis-{self.plan.seed}-{os.getpid()}-{int(time.time() * 1000) % 100000}"
            self.s3.create_bucket(Bucket=bucket)
            self.bucket = bucket
            self.repo_url = f"s3://{bucket}/repo"
            if self.plan.encrypted:
                Repository.init(self.repo_url, {"endpoint_url": direct}, encrypt=True, key=self.key)
            else:
                Repository(self.repo_url, {"endpoint_url": direct}, create=True)

    def teardown(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.live is not None:
            self.live.kill()
            self.live.wait()
        if self.stream_proxy is not None:
            self.stream_proxy.close()
        if self.plan.storage == "s3":
            self.proxy.close()
        for mnt in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- commands

    def argv(self, op: Op) -> tuple[list[str], dict]:
        """The command line of an op, and what the harness needs to judge its result."""
        h = self.histories.get(op.source) or self.histories["h1"]
        info: dict = {}
        repo = self.repo_args()
        if op.kind in ("backup_full", "backup_inc", "snapshot"):
            args = ["backup" if op.kind != "snapshot" else "snapshot", str(h.path), *repo, "--json"]
            if op.kind == "backup_inc":
                args += ["--type", "incremental"]
            if op.live and self.live is not None:
                args += ["--connect", f"{USER}@127.0.0.1:{self.live_port}"]
            return args, info
        if op.kind == "archive":
            paths = [str(self.histories[n].path) for n in sorted(self.histories)]
            return ["archive", *paths, *repo, "--json"], info
        if op.kind == "verify":
            return ["verify", *repo], info
        if op.kind == "policy":
            return ["policy", *repo, "--days", str(self.rng.choice([2, 3, 5]))], info
        if op.kind == "expire":
            args = ["expire", *repo, "--days", str(op.days), "--apply", "--json"]
            if op.as_of is not None:
                args += ["--as-of", f"@{time.time() + op.as_of:.0f}"]
            return args, info
        if op.kind in ("restore", "restore_to"):
            candidates = [i for i, b in self.backups.items() if b["path"] == str(h.path)] or list(self.backups)
            if not candidates:
                return ["verify", *repo], info  # nothing to restore yet
            backup_id = self.rng.choice(candidates)
            info["backup_id"] = backup_id
            if op.fullfs and self.env.can_mount:
                mnt = self.scratch("full")
                if self.mount_tmpfs(mnt, "48k"):
                    info["mount"] = mnt
            target = (info.get("mount") or self.dir) / f"restore-{self._scratch}-{self.rng.randrange(10**6)}"
            info["target"] = target
            args = ["restore", backup_id, str(target), *repo, "--json"]
            if op.kind == "restore_to":
                hist = self.history_of(self.backups[backup_id]["path"])
                lsn = self.rng.choice(hist.points)[0] if hist and hist.points else None
                if lsn is not None:
                    info["point"] = lsn
                    args += ["--to", f"1:{lsn},0:{self.env.local_lsn}"]
            return args, info
        if op.kind == "copy":
            source = ["--from", self.repo_url] + (["--from-option", repo[3]] if len(repo) > 2 else [])
            return ["copy", "--all", "--archive", *source, "--to", self.copy_url, "--json"], info
        if op.kind == "restore_end":
            h1 = self.histories["h1"]
            mine = [i for i, b in self.backups.items() if b["path"] == str(h1.path)]
            if not mine:
                return ["verify", *repo], info  # nothing to restore yet
            newest = max(mine, key=lambda i: int(self.backups[i]["position"]["vclock"].get("1", 0)))
            backup_id = newest if self.rng.random() < 0.7 else self.rng.choice(mine)
            info["backup_id"], info["target"] = backup_id, self.scratch("end")
            segments = self.stream_objects()
            if backup_id == newest and segments and not self.gap_said() and not self.stream_other_history:
                # read before it starts: what it must reach at least
                info["floor"] = max(s["end"] for s in segments)
            return ["restore", backup_id, str(info["target"]), *repo, "--to", "end", "--json"], info
        raise ValueError(op.kind)

    def history_of(self, path: str) -> History | None:
        return next((h for h in self.histories.values() if str(h.path) == path), None)

    def start(self, op: Op, *, direct: bool = False) -> tuple[subprocess.Popen, list[str], dict]:
        args, info = self.argv(op)
        if direct and self.plan.storage == "s3":
            args = [a.replace(f"127.0.0.1:{self.proxy.port}", self.env.s3_direct.split("//")[1]) for a in args]
        if op.clock:
            self.fault("clock")
        proc = subprocess.Popen([*self.env.walvault, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**self.run_env, **self.env.clock_env(op.clock)},
                                start_new_session=True, cwd=self.dir)
        self.procs.append(proc)
        if info.get("mount"):
            self.fault("fullfs")
        self.out.operations += 1
        return proc, args, info

    def finish(self, op: Op, proc: subprocess.Popen, args: list[str], info: dict, killed: bool,
               timeout: float = OP_TIMEOUT) -> Finished:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            killed = True
            self.violate("hang", f"{op.label()} ran over {timeout:.0f} s: {' '.join(args)}")
        done = Finished(op, args, proc.returncode, stdout, stderr, killed, info.get("target"),
                        info.get("backup_id"), info.get("point"), info.get("mount"), info.get("floor"))
        self.judge(done)
        return done

    def judge(self, done: Finished) -> None:
        """The invariants one command's result must hold on its own."""
        op, rc = done.op, done.rc
        first = next((ln for ln in done.stderr.splitlines() if ln.strip()), "")
        said = done.stderr.strip()[:600] if op.kind == "restore_end" else first[:160]  # why the end is refused
        self.note(f"    {op.label()}: rc={rc}{' (killed)' if done.killed else ''} {said}")
        if "Traceback (most recent call last)" in done.stderr:
            self.violate("traceback", f"{op.label()}: {' '.join(done.argv)}\n{done.stderr[-1500:]}")
        if not done.killed and rc not in (0, 1, 2):
            self.violate("exit_code", f"{op.label()} exited {rc}: {' '.join(done.argv)}\n{done.stderr[-600:]}")
        if rc != 0:
            if done.mount is not None and done.target is not None and not done.killed:
                left = [p.name for p in done.mount.iterdir()] if done.mount.is_dir() else []
                if left:
                    self.violate("fullfs_staging_left", f"{op.label()} exited {rc} on a full filesystem and left "
                                 f"{left} in it")
            return
        if op.kind in ("backup_full", "backup_inc", "snapshot"):
            try:
                result = json.loads(done.stdout)
            except ValueError:
                self.violate("exit_0_untrue", f"{op.label()} exited 0 without its JSON: {done.stdout[:300]!r}")
                return
            self.backups[result["id"]] = {"path": result["source"]["path"], "position": result["position"],
                                          "suspect": False}
            self.out.log[-1] += f" -> {result['id']}"
            if result.get("removed_leftovers"):
                self.out.log[-1] += f" (removed leftovers {result['removed_leftovers']})"
        elif op.kind == "restore_end" and done.backup_id:
            self.judge_restore_end(done)
        elif op.kind in ("restore", "restore_to") and done.backup_id:
            record = self.backups[done.backup_id]
            hist = self.history_of(record["path"])
            lsn = done.point if done.point is not None else int(record["position"]["vclock"].get("1", 0))
            if done.point is None and self.live is not None and hist is self.live_hist:
                return  # the live history's rows are known once it stops: judged at the end
            self.check_restored(done.target, hist, lsn, f"{op.label()} of {done.backup_id}"
                                + (f" --to 1:{done.point}" if done.point is not None else ""))

    def judge_restore_end(self, done: Finished) -> None:
        """`restore --to end` exiting 0: the source's rows at the point it names, a point no earlier than the newest
        segment stored before it started (when one stream of one history, with no gap, stored them)."""
        hist = self.history_of(self.backups[done.backup_id]["path"])
        try:
            result = json.loads(done.stdout)
            lsn = int(result["point"]["vclock"].get("1", 0))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.violate("exit_0_untrue", f"{done.op.label()} exited 0 without its point: {done.stdout[:300]!r}")
            return
        floor = "" if done.floor is None else f", the newest segment ending at 1:{done.floor}"
        self.out.log[-1] += f" -> 1:{lsn} ({result['point'].get('segments')} segments{floor})"
        what = f"{done.op.label()} of {done.backup_id}, to 1:{lsn}"
        if done.floor is not None and lsn < done.floor:
            self.violate("end_short_of_stream", f"{what}: short of 1:{done.floor}, where the newest segment stored "
                         f"before it started ends; it said {result['point'].get('unreached')!r}, notes "
                         f"{result.get('notes')}")
        if self.check_restored(done.target, self.known(hist, lsn), lsn, what):
            if self.live is not None and hist is self.live_hist:
                self.stream_points.append((hist.name, lsn))  # a point of the window once its rows are known
            else:
                hist.points.append((lsn, time.time()))
        shutil.rmtree(done.target, ignore_errors=True)

    def known(self, hist: History | None, lsn: int) -> History | None:
        """The history with the live instance's rows up to lsn, while it writes them (one row per LSN)."""
        if hist is None or self.live is None or hist is not self.live_hist or lsn <= hist.last_lsn:
            return hist
        now = History(hist.name, hist.path, list(hist.writes), [])
        now.add(self.live_first, lsn - self.live_first, self.live_tag, time.time())
        return now

    def check_restored(self, target: Path, hist: History | None, lsn: int, what: str) -> bool:
        """Tarantool started on a restore must hold the history's rows at lsn (the template's spaces unchanged)."""
        if hist is None:
            self.violate("unknown_source", f"{what}: no history the harness wrote has this source path")
            return False
        try:
            dump = tarantool_real.dump_data_dir(target)
        except tarantool_real.TarantoolError as exc:
            self.violate("restore_does_not_start", f"{what}: exit 0 but Tarantool does not start on it: "
                         f"{str(exc).splitlines()[0]}")
            return False
        expected_vclock = {1: lsn, 0: self.env.local_lsn}
        problems = []
        if {k: v for k, v in dump["vclock"].items() if v} != {k: v for k, v in expected_vclock.items() if v}:
            problems.append(f"vclock {dump['vclock']} != {expected_vclock}")
        if lsn > hist.last_lsn:
            problems.append(f"position {lsn} is past everything {hist.name} wrote ({hist.last_lsn})")
        nem = dump["spaces"].get("nem")
        want = hist.state_at(lsn)
        if nem != want:
            got_tags = sorted({str(v).split("-")[0] for _, v in nem or []})
            problems.append(f"rows of nem differ from {hist.name} at {lsn}: {len(nem or [])} rows tagged {got_tags}, "
                            f"{len(want)} expected; first difference "
                            f"{next(((g, w) for g, w in zip(nem or [], want) if g != w), None)}")
        others = {k: v for k, v in dump["spaces"].items() if k != "nem"}
        if others != self.env.template_spaces:
            problems.append("the template's spaces differ")
        if problems:
            self.violate("restore_wrong_state", f"{what}: " + "; ".join(problems))
            return False
        return True

    # -- steps

    def run(self) -> Outcome:
        t0 = time.monotonic()
        self.note(f"schedule seed={self.plan.seed} storage={self.plan.storage}"
                  f"{' repo_on_tmpfs' if self.plan.repo_on_tmpfs else ''}{' encrypted' if self.plan.encrypted else ''}")
        try:
            self.setup()
            for number, step in enumerate(self.plan.steps):
                started = time.monotonic()
                self.note(f"{number:2d} {step.label()}")
                getattr(self, f"step_{step.kind}")(step)
                self.note(f"   [{time.monotonic() - started:.2f}s]")
            started = time.monotonic()
            self.final_checks()
            self.note(f"   [final {time.monotonic() - started:.2f}s]")
        except Exception as exc:  # the harness's own failure: reported with the log, never hidden
            import traceback

            self.out.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-2000:]}"
            self.note(f"HARNESS ERROR {self.out.error}")
        finally:
            self.teardown()
            self.out.seconds = time.monotonic() - t0
        return self.out

    def step_write(self, step: Step) -> None:
        hist = self.histories.get(step.source) or self.histories["h1"]
        self.env.write(hist, rows=step.rows, tag=hist.name, offset=step.offset, snapshot=step.snapshot)

    def step_fork(self, step: Step) -> None:
        """A copy of the data dir that goes on writing: the same instance UUID, another history."""
        h1 = self.histories["h1"]
        path = self.dir / "h2"
        shutil.copytree(h1.path, path)
        self.histories["h2"] = History("h2", path, list(h1.writes), list(h1.points))
        self.fork_lsn = h1.last_lsn
        self.fault("fork")

    def step_live_start(self, step: Step) -> None:
        self.live_port = _free_port()
        self.start_live(self.histories["h1"], "h1L")

    def start_live(self, hist: History, tag: str, burst: int = 0) -> None:
        script = self.dir / "live.lua"
        script.write_text(_LIVE_LUA)
        cfg = {"dir": str(hist.path), "port": self.live_port, "tag": tag, "burst": burst}
        self.live = subprocess.Popen([tarantool_real.TARANTOOL, str(script), json.dumps(cfg)], cwd=hist.path,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.live_hist, self.live_tag = hist, tag
        self.live_first = json.loads(self.live.stdout.readline())["first"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.live_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)

    def step_live_stop(self, step: Step) -> None:
        if self.live is None:
            return  # stopped already, for the other history's instance (stream_fork)
        self.live.stdin.close()
        out = json.loads(self.live.stdout.readline())
        self.live.wait(30)
        self.live = None
        hist = self.live_hist
        assert out["last"] - self.live_first == out["rows"], (out, self.live_first)
        hist.add(self.live_first, out["rows"], self.live_tag, time.time())
        # the ends restored meanwhile are points of the window now that their rows are known
        hist.points += [(lsn, time.time()) for name, lsn in self.stream_points if name == hist.name]
        hist.points.append((out["last"], time.time()))
        self.stream_points = [(name, lsn) for name, lsn in self.stream_points if name != hist.name]

    # -- the streamer

    def stream_objects(self) -> list[dict]:
        """The stored segments by their records, in log order: {"name", "start", "end" (component 1), "host"}."""
        found = []
        for name in self.list_objects(f"tarantool/{self.env.instance_uuid}/stream/"):
            if name.endswith(".zst.json"):
                record = json.loads(self.read_object(name))
                first, last = record["range"]["vclock"]
                found.append({"name": name, "start": int(first.get("1", 0)), "end": int(last.get("1", 0)),
                              "host": record.get("host")})
        return sorted(found, key=lambda r: (r["start"], r["end"]))

    def segment_tags(self, record: str) -> set[str]:
        """The history tags of the rows of `nem` in the segment a record names (read with walcore's reader)."""
        import zstandard

        from walcore.tarantool.xlog import read_rows

        path = self.scratch("segment").with_suffix(".xlog")
        path.write_bytes(zstandard.ZstdDecompressor().decompressobj().decompress(
            self.read_object(record.removesuffix(".json"))))
        tags = set()
        for _pos, row in read_rows(path):
            value = (row.body or {}).get(0x21)
            if isinstance(value, list) and len(value) == 2 and isinstance(value[1], bytes):
                tags.add(value[1].decode().split("-")[0])
        path.unlink()
        return tags

    def start_streamer(self, profile: dict) -> Streamer:
        """`walvault stream` against the live instance, through its proxy, into the repository (S3 directly: its
        faults are the instance's connection's)."""
        args = ["stream", "--connect", f"{USER}@127.0.0.1:{self.stream_proxy.port}", *self.repo_args(direct=True),
                "--spool", str(profile["spool"]), "--status", str(profile["status"]),
                "--segment-seconds", STREAM_SEGMENT_SECONDS]
        host = []
        if profile["host"]:  # another host: a UTS namespace of its own, so named
            host = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', profile["host"]]
        profile["status"].unlink(missing_ok=True)  # this run's own
        log = self.scratch("stream").with_suffix(".log")
        with open(log, "w") as out:
            proc = subprocess.Popen([*host, *self.env.walvault, *args], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True, cwd=self.dir,
                                    env={**self.run_env, **self.env.clock_env(profile["clock"])})
        self.procs.append(proc)
        self.out.operations += 1
        return Streamer(proc, log, profile)

    def wait_stored(self, run: Streamer, segments: int, timeout: float = 20.0) -> bool:
        """Until the run stored `segments` segments; False when it ended or the time ran out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and run.proc.poll() is None:
            if run.status().get("segments", 0) >= segments:
                return True
            time.sleep(0.05)
        return False

    def end_streamer(self, run: Streamer, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, sig)
        try:
            run.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()
            self.violate("hang", f"walvault stream did not stop {timeout:.0f} s after signal {sig}")
        self.judge_streamer(run, killed=sig == signal.SIGKILL)

    def judge_streamer(self, run: Streamer, killed: bool = False) -> None:
        said = run.log.read_text()
        status = run.status()
        gaps = run.gaps()
        self.stream_gapped |= bool(gaps)
        rc = run.proc.returncode
        last = said.strip().splitlines()[-1][:200] if said.strip() else ""
        self.note(f"    stream run ended: rc={rc}{' (killed)' if killed else ''}, {status.get('segments', 0)} "
                  f"segments stored, vclock {status.get('vclock')}{', gaps ' + str(gaps) if gaps else ''}: {last}")
        if "Traceback (most recent call last)" in said:
            self.violate("traceback", f"walvault stream\n{said[-1500:]}")
        started = bool(status) or bool(said.strip())  # before that, SIGTERM's default action (Python starting)
        if not killed and rc not in (0, 1, 2) and (rc != -signal.SIGTERM or started):
            self.violate("exit_code", f"walvault stream exited {rc}: {said[-600:]}")
        if rc == 0 and gaps:
            self.violate("exit_0_untrue", f"walvault stream exited 0 after a gap: {gaps}")

    def step_stream_start(self, step: Step) -> None:
        self.stream_proxy = StallableProxy(self.live_port)
        if step.clock:
            self.fault("stream_clock")
        profile = {"spool": self.dir / "spool", "status": self.dir / "stream.json", "clock": step.clock, "host": None}
        self.streamer = self.start_streamer(profile)
        self.check_storing()

    def gap_said(self) -> bool:
        """A streamer, ended or still running, said rows never came: the end restored may be short of its
        segments."""
        return self.stream_gapped or bool(self.streamer and self.streamer.gaps())

    def check_storing(self) -> None:
        """The streamer just started stores segments, or it ended: judged, and none runs on."""
        if not self.wait_stored(self.streamer, 1):
            self.note("    (the streamer stored no segment in 20 s)")
            if self.streamer.proc.poll() is not None:
                self.judge_streamer(self.streamer)
                self.streamer = None

    def step_stream_fault(self, step: Step) -> None:
        run = self.streamer
        if run is None or run.proc.poll() is not None:
            self.note("    (no streamer running)")
            return
        time.sleep(step.delay)
        if step.fault == "kill":
            self.end_streamer(run, signal.SIGKILL)
            self.fault("stream_kill")
            left = sorted(str(p.relative_to(run.profile["spool"])) for p in run.profile["spool"].rglob("*")
                          if p.is_file())
            self.note(f"    killed; the spool holds {left}")
            # started again on its spool: what it left is sealed and stored first
            self.streamer = self.start_streamer(run.profile)
            self.check_storing()
        elif step.fault in ("stall", "reset"):
            stored = run.status().get("segments", 0)
            if step.fault == "stall":
                self.stream_proxy.stall(step.length)
                time.sleep(step.length)
            else:
                self.note(f"    reset {self.stream_proxy.reset()} connections")
            self.fault(f"stream_{step.fault}")
            if not self.wait_stored(run, stored + 1):
                self.note(f"    (the streamer stored nothing new in 20 s after the {step.fault})")
        elif step.fault == "pause":
            self.pause_streamer(run)

    def pause_streamer(self, run: Streamer) -> None:
        """The streamer stopped (SIGSTOP) holding the stream lease; a second of the instance starts, on another
        host whose clock is past the lease: it must refuse or take over. Once it took over, the first, woken,
        must stop without committing a segment (its lease proven before each commit)."""
        os.killpg(run.proc.pid, signal.SIGSTOP)
        self.fault("stream_pause")
        other = {"spool": self.dir / "spool-other", "status": self.dir / "stream-other.json", "clock": 2 * HOUR,
                 "host": OTHER_HOST if self.env.can_unshare else None}
        second = self.start_streamer(other)
        took = self.wait_stored(second, 1)
        where = f"a second one{' on ' + OTHER_HOST if other['host'] else ''}"
        if not took:
            self.end_streamer(second)  # stopped before the first wakes: what it stored, it stored while in charge
            took = second.status().get("segments", 0) > 0  # slow under load: it took over past the wait
            second = None
        self.note(f"    paused the streamer; {where} {'took over' if took else 'did not store a segment'}"
                  f"{' (stopped before the first was woken)' if took and second is None else ''}")
        seen = {r["name"] for r in self.stream_objects()}
        os.killpg(run.proc.pid, signal.SIGCONT)
        if not took:
            return  # a refusal (the lease held): the first goes on
        try:
            run.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.violate("fenced_streamer_runs", "a streamer whose stream lease another took over still runs 20 s "
                         "after it was woken")
            self.end_streamer(run, signal.SIGKILL)
        else:
            self.judge_streamer(run)
        here = socket.gethostname()
        late = [r["name"] for r in self.stream_objects() if r["name"] not in seen and r["host"] == here]
        if late:
            self.violate("fenced_streamer_committed", f"the paused streamer, its lease taken over by one on "
                         f"{OTHER_HOST}, committed {late} once woken")
        self.streamer = second

    def step_stream_fork(self, step: Step) -> None:
        """The live instance becomes the other history (its files replaced: the same instance UUID), behind or
        ahead of where the stream stopped; the streamer, started again, must not continue the stream's log with
        that history's rows."""
        run, h2 = self.streamer, self.histories["h2"]
        if run is None:
            self.note("    (no streamer running)")
            return
        self.end_streamer(run)
        self.streamer = None
        segments = self.stream_objects()
        held = max((s["end"] for s in segments), default=0)
        self.step_live_stop(step)
        burst = held - h2.last_lsn + 30 if step.ahead and held > h2.last_lsn else 0
        self.start_live(h2, "h2L", burst)
        self.fault("stream_fork")
        before = {s["name"] for s in segments}
        again = self.start_streamer(run.profile)
        stored = self.wait_stored(again, 1, timeout=10)
        self.end_streamer(again)
        new = [s for s in self.stream_objects() if s["name"] not in before]
        theirs = [s for s in new if {"h2", "h2L"} & self.segment_tags(s["name"])]
        # the restart first stores what its spool holds: h1's rows, received before it stopped
        held = max([held, *(s["end"] for s in new if s not in theirs)])
        self.note(f"    h2's instance at 1:{self.live_first + burst}+ (burst {burst}), the stream held 1:{held}: "
                  f"{'stored ' + str([(s['start'], s['end']) for s in new]) if new else 'stored nothing'}")
        self.stream_other_history |= bool(theirs)
        mixed = [s for s in theirs if s["start"] <= held + 1]
        if mixed:
            self.violate("stream_histories_mixed", f"segments {[(s['start'], s['end']) for s in mixed]} of h2's rows "
                         f"continue the stream's log of h1 (it held 1:{held}; the histories part at 1:{self.fork_lsn})")
        self.step_live_stop(step)

    def step_stream_stop(self, step: Step) -> None:
        if self.streamer is not None:
            self.end_streamer(self.streamer)
            self.streamer = None

    def step_pair(self, step: Step) -> None:
        proc_a, args_a, info_a = self.start(step.a)
        killed = False
        fault = step.fault
        procs_b = None
        if fault == "pause":
            if not self._wait_to_pause(proc_a, stored=step.delay > 0.3, extra=max(0.0, step.delay - 0.3) * 2):
                self.note("    (the first ended before it could be paused)")
                fault = None
            else:
                os.killpg(proc_a.pid, signal.SIGSTOP)
                self.fault("pause")
                self.note(f"    paused {step.a.label()} holding its lease"
                          f"{' with files stored' if step.delay > 0.3 else ''}")
                # the 60 s lease cannot run out in a short schedule: the second judges it by a clock past it
                step.b.clock = 2 * HOUR
                procs_b = self.start(step.b, direct=True)
                done_b = self.finish(step.b, *procs_b, killed=False)
                os.killpg(proc_a.pid, signal.SIGCONT)
                done_a = self.finish(step.a, proc_a, args_a, info_a, killed=False)
                self._mark_suspect(done_b)
                self._mark_suspect(done_a)
                # judged at once: a later expiry may delete a backup that lies, and the evidence with it
                for done in (done_b, done_a):
                    if done.rc == 0 and self.live is None:
                        result = json.loads(done.stdout)
                        self.check_backup(result["id"], result["position"])
                return
        if step.b is not None:
            procs_b = self.start(step.b)
        if fault and fault != "pause":
            time.sleep(step.delay)
            if proc_a.poll() is None:
                if fault == "kill":
                    os.killpg(proc_a.pid, signal.SIGKILL)
                    killed = True
                elif fault == "stall":
                    self.proxy.stall(step.length)
                elif fault == "reset":
                    self.proxy.reset()
                self.fault(fault)
            else:
                self.note(f"    ({fault} missed: the first had ended)")
        done_a = self.finish(step.a, proc_a, args_a, info_a, killed)
        done_b = self.finish(step.b, *procs_b, killed=False) if procs_b is not None else None
        if fault in ("stall", "reset"):
            self.proxy.stall(0)
        if fault or step.a.clock or (step.b and step.b.clock):
            # a fault on one reaches the other too (a clock judges the other's lease, a kill leaves leftovers)
            for done in (done_a, done_b):
                if done is not None:
                    self._mark_suspect(done)

    def _wait_to_pause(self, proc: subprocess.Popen, stored: bool, extra: float = 0.0) -> bool:
        """Until the op holds its lease (so that the pause stops a holder) and, when `stored`, has stored files of a
        backup that has no manifest yet (what a breaker removes as leftovers), or until it ends."""
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            if any(n.endswith(".lease") and ".restore-" not in n for n in self.list_objects("locks/")):
                if not stored:
                    return True
                backups: dict[str, set[str]] = {}
                for name in self.list_objects(""):
                    if "/backups/" in name:
                        head, _, rest = name.partition("/backups/")
                        backup_id, _, leaf = rest.partition("/")
                        backups.setdefault(backup_id, set()).add(leaf)
                if any(not any(leaf.startswith("backup.manifest") for leaf in leaves) for leaves in backups.values()):
                    time.sleep(extra)  # later into the storing, up to just before the manifest
                    return True
            time.sleep(0.005 if self.plan.storage == "local" else 0.02)
        return False

    def _mark_suspect(self, done: Finished) -> None:
        if done.rc == 0 and done.op.kind in ("backup_full", "backup_inc", "snapshot"):
            backup_id = json.loads(done.stdout)["id"]
            self.backups[backup_id]["suspect"] = True

    def step_copy(self, step: Step) -> None:
        """A copy into the second repository (killed at the step's moment, for a step with a fault), then what the
        destination must hold after it."""
        from walcore.repository import Repository

        if self.copy_url is None:
            self.copy_url = str(self.dir / "copy")
            Repository(self.copy_url, {}, create=True)
        op = Op("copy")
        proc, args, info = self.start(op)
        killed = step.fault == "kill" and self.kill_at(proc, step.delay, "copy_kill", "the copy")
        self.finish(op, proc, args, info, killed)
        self.check_copy(restore=step.fault is None)

    def kill_at(self, proc: subprocess.Popen, delay: float, fault: str, what: str) -> bool:
        """SIGKILL `proc` `delay` seconds from now; False when it had ended by then."""
        time.sleep(delay)
        if proc.poll() is not None:
            self.note(f"    (kill missed: {what} had ended)")
            return False
        os.killpg(proc.pid, signal.SIGKILL)
        self.fault(fault)
        return True

    def check_copy(self, restore: bool) -> None:
        """The destination lists every backup `ok` (or an interrupted copy's leftovers), verifies, and (`restore`)
        its backups listed ok restore to their source's rows: the newest and one other, sampled."""
        copy_args = ["--repo", self.copy_url]  # a plain repository: it takes no key (one given is refused)
        proc = subprocess.run([*self.env.walvault, "backups", *copy_args, "--json"], capture_output=True, text=True,
                              env=self.env.env, timeout=OP_TIMEOUT)
        self.out.operations += 1
        if proc.returncode != 0 or "Traceback (most recent call last)" in proc.stderr:
            self.violate("copy_backups_fails", f"`backups --json` of the copy exited {proc.returncode}: "
                         f"{proc.stderr[-600:]}")
            return
        listed = json.loads(proc.stdout)["backups"]
        for b in listed:
            if b.get("status") not in ("ok", "incomplete"):
                self.violate("copy_backup_status", f"the copy lists {b['id']} {b.get('status')}: {b.get('problem')}")
        ok = [b for b in listed if b.get("status") == "ok"]
        self.note(f"    the copy lists {len(listed)} backups, {len(ok)} ok")
        if restore and ok:
            unknown = [b["id"] for b in ok if b["id"] not in self.backups]
            if unknown:
                self._learn_paths(unknown)
            sample = [ok[-1]["id"]] + ([self.copy_rng.choice(ok[:-1])["id"]] if len(ok) > 1 else [])
            for backup_id in sample:
                target = self.scratch("copy-check")
                proc = subprocess.run([*self.env.walvault, "restore", backup_id, str(target), *copy_args, "--json"],
                                      capture_output=True, text=True, env=self.env.env, timeout=OP_TIMEOUT)
                self.out.operations += 1
                self.note(f"    restore {backup_id} from the copy: rc={proc.returncode} {proc.stderr.strip()[:200]}")
                if proc.returncode != 0:
                    self.violate("copy_does_not_restore", f"backup {backup_id}, listed ok in the copy: restore "
                                 f"exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
                    continue
                record = self.backups.get(backup_id)
                position = next(b["position"] for b in ok if b["id"] == backup_id)
                self.check_restored(target, self.history_of(record["path"]) if record else None,
                                    int(position["vclock"].get("1", 0)), f"backup {backup_id} restored from the copy")
                shutil.rmtree(target, ignore_errors=True)
        proc = subprocess.run([*self.env.walvault, "verify", *copy_args], capture_output=True, text=True,
                              env=self.env.env, timeout=OP_TIMEOUT)
        self.out.operations += 1
        said = (proc.stdout + proc.stderr).strip()
        self.note(f"    verify --repo of the copy: rc={proc.returncode} {said.splitlines()[-1][:200] if said else ''}")
        if proc.returncode != 0 and not self.conflict_only(proc.returncode, said):
            self.violate("copy_verify_not_intact", f"`verify --repo` of the copy exited {proc.returncode}: "
                         f"{said[-800:]}")

    def step_key_rotate(self, step: Step) -> None:
        """`walvault key rotate` (beside another command, SIGKILLed at the step's moment then run again, for a step
        with a fault); then the repository opens with exactly one of the two keys, the one every later command is
        given; a wrong key, and the old one once the rotation finished, is refused and writes nothing; the backups
        listed ok restore (sampled) and `verify --repo` exits 0."""
        self.refused_writes_nothing("a key that never was the repository's", "archive", "not the key")
        op = Op("key_rotate")
        proc = self.start_key_rotate()
        procs_b = self.start(step.b) if step.b is not None else None
        killed = step.fault == "kill" and self.kill_at(proc, step.delay, "key_kill", "the rotation")
        done = self.finish(op, proc, proc.args[len(self.env.walvault):], {}, killed)
        if procs_b is not None:
            self._mark_suspect(self.finish(step.b, *procs_b, killed=False))
        if killed:
            self.key = self.opening_key("after the killed rotation")
            op = Op("key_rotate")
            proc = self.start_key_rotate()
            done = self.finish(op, proc, proc.args[len(self.env.walvault):], {}, killed=False)
        self.key = self.opening_key("after the rotation") or self.key
        if done.rc == 0 and self.key != self.new_key:
            self.violate("rotation_untrue", "`key rotate` exited 0 and the new key does not open the repository")
        if self.key == self.new_key:
            self.refused_writes_nothing("the old key, after the rotation", "backup", self.old_key)
        listed = self.list_backups()
        ok = [b for b in listed if b.get("status") == "ok"]
        unknown = [b["id"] for b in ok if b["id"] not in self.backups]
        if unknown:
            self._learn_paths(unknown)
        sample = [ok[-1]] + ([self.copy_rng.choice(ok[:-1])] if len(ok) > 1 else []) if ok else []
        for b in sample:
            self.check_backup(b["id"], b["position"])
        self.check_verify()

    def start_key_rotate(self) -> subprocess.Popen:
        proc = subprocess.Popen([*self.env.walvault, "key", "rotate", *self.repo_args()], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env={**self.run_env, "WALVAULT_NEW_KEY": self.new_key}, cwd=self.dir)
        self.procs.append(proc)
        self.out.operations += 1
        return proc

    def opening_key(self, when: str) -> str | None:
        """The one key of the two that opens the repository's key file (read by the harness itself)."""
        from walcore.repository.encrypted import KEY_NAME
        from walcore.repository.envelope import Keyring, WrongKey

        data = self.read_object(KEY_NAME)
        opening = []
        for key in (self.old_key, self.new_key):
            try:
                Keyring.open(data, key)
            except WrongKey:
                continue
            opening.append(key)
        self.note(f"    {when}: the {' and the '.join('old' if k == self.old_key else 'new' for k in opening) or 'no'}"
                  f" key opens the repository")
        if len(opening) != 1:
            self.violate("key_not_one", f"{when}: {len(opening)} of the old and the new key open the repository")
            return None
        return opening[0]

    def refused_writes_nothing(self, what: str, command: str, key: str) -> None:
        """A command given a key that does not open the repository exits 2 and writes nothing."""
        before = self.list_objects("")
        args = [command, str(self.histories["h1"].path), *self.repo_args(direct=True), "--json"]
        proc = subprocess.run([*self.env.walvault, *args], capture_output=True, text=True, env=self.with_key(key),
                              timeout=OP_TIMEOUT, cwd=self.dir)
        self.out.operations += 1
        first = proc.stderr.strip().splitlines()[0][:160] if proc.stderr.strip() else ""
        self.note(f"    {command} with {what}: rc={proc.returncode} {first}")
        if "Traceback (most recent call last)" in proc.stderr:
            self.violate("traceback", f"{' '.join(args)} with {what}\n{proc.stderr[-1500:]}")
        if proc.returncode != 2:
            self.violate("wrong_key_accepted", f"`{command}` with {what} exited {proc.returncode}: "
                         f"{proc.stderr.strip()[-400:]}")
        after = self.list_objects("")
        if after != before:
            self.violate("wrong_key_wrote", f"`{command}` with {what} changed the repository: added "
                         f"{sorted(set(after) - set(before))[:5]}, removed {sorted(set(before) - set(after))[:5]}")

    def step_junk_lease(self, step: Step) -> None:
        """A lease of the source whose `expires` is junk (written by something else): a backup must say so and
        name it, at once, not crash or wait forever; then the harness clears it."""
        name = f"locks/tarantool-{self.env.instance_uuid}.lease"
        body = ('{"holder": "%s", "command": "backup", "host": "elsewhere.example", "pid": 1, "taken": 0, '
                '"expires": %s}' % ("f" * 32, step.junk)).encode()
        if name in self.list_objects("locks/"):
            return  # a real holder: leave it be
        self.write_object(name, body)
        self.fault("junk_lease")
        op = Op("backup_inc")
        done = self.finish(op, *self.start(op), killed=False, timeout=30)
        if re.search(r"expires in (nan|-?inf|-?\d{7,}) s", done.stderr):
            self.violate("junk_lease_believed", f"a lease with expires={step.junk} was taken for a live holder's: "
                         f"{done.stderr.strip()[:300]}")
        elif done.rc in (1, 2) and "Traceback" not in done.stderr and Path(name).name not in done.stderr:
            self.violate("junk_lease_unnamed", f"a lease with expires={step.junk}: {op.label()} exited {done.rc} "
                         f"without naming {name}: {done.stderr.strip()[-300:]}")
        if name in self.list_objects("locks/") and self.read_object(name) == body:
            self.remove_object(name)

    def step_damage(self, step: Step) -> None:
        """Flip one byte of one object that a good repository checks: a redundant copy, the policy, a stored
        file of a backup, an archived file."""
        names = self.list_objects("")
        pick = {
            "backup_object": [n for n in names if "/backups/" in n and n.endswith(".zst")],
            "manifest_copy": [n for n in names if n.endswith("backup.manifest.copy")],
            "repo_copy": [n for n in names if n == "walvault.repo.copy"],
            "policy": [n for n in names if n in ("walvault.policy", "walvault.policy.copy")],
            "archive_object": [n for n in names if "/archive/" in n and n.endswith(".zst")],
        }
        kinds = [k for k, v in pick.items() if v]
        if not kinds:
            return
        kind = self.rng.choice(kinds)
        name = self.rng.choice(sorted(pick[kind]))
        data = bytearray(self.read_object(name))
        at = len(data) // 2
        data[at] ^= 0x01
        self.write_object(name, bytes(data))
        self.damaged = {"kind": kind, "name": name}
        self.fault("damage")
        self.note(f"    damaged {name} at byte {at}")

    def step_expire_check(self, step: Step) -> None:
        """An `expire --apply` alone, with points of the window restored before and after it."""
        now = time.time()
        as_of = now + step.as_of if step.as_of is not None else now
        window_start = min(as_of, now) - step.days * DAY
        h1, h2 = self.histories["h1"], self.histories.get("h2")
        in_window = {h.name: [lsn for lsn, t in h.points if t >= window_start + HOUR] for h in (h1, h2) if h}
        if h2 is None:
            # the oldest point of the window is the one an expiry that judges wrongly takes away first
            candidates = [(h1, lsn) for lsn in dict.fromkeys(in_window["h1"][:1] + in_window["h1"][-2:-1])]
        else:
            # after the fork the two histories share names and positions: each must restore its own rows
            after_fork = [lsn for lsn in in_window["h1"] if lsn > self.fork_lsn]
            mine = [lsn for lsn in in_window["h2"] if lsn > self.fork_lsn]
            candidates = [(h1, self.rng.choice(after_fork or in_window["h1"] or [0]))]
            candidates += [(h2, self.rng.choice(mine))] if mine else []
            candidates = [(h, lsn) for h, lsn in candidates if lsn]
        before = []
        for hist, lsn in candidates[:2 if self.plan.storage == "local" else 1]:
            backup_id = self._newest_backup_of(hist)
            if backup_id is None:
                continue
            if self._restore_point(hist, backup_id, lsn, "before the expiry"):
                before.append((hist, lsn))
        op = Op("expire", days=step.days, as_of=step.as_of)
        self.finish(op, *self.start(op), killed=False)
        self.note(f"    window points restorable before: {[(h.name, lsn) for h, lsn in before]}")
        for hist, lsn in before:
            backup_id = self._newest_backup_of(hist)
            if backup_id is None or not self._restore_point(hist, backup_id, lsn, "after the expiry"):
                self.violate("window_point_lost", f"{hist.name} at 1:{lsn} was restorable before `expire --apply "
                             f"--days {step.days}` (as of {as_of - now:+.0f} s from now) and is not after it")

    def _newest_backup_of(self, hist: History) -> str | None:
        listed = self.list_backups()
        ids = [b["id"] for b in listed if b.get("status") == "ok" and b["id"] in self.backups
               and self.backups[b["id"]]["path"] == str(hist.path)]
        return ids[-1] if ids else None

    def _restore_point(self, hist: History, backup_id: str, lsn: int, when: str) -> bool:
        target = self.scratch("point")
        args = ["restore", backup_id, str(target), *self.repo_args(), "--to", f"1:{lsn},0:{self.env.local_lsn}"]
        proc = subprocess.run([*self.env.walvault, *args], capture_output=True, text=True, env=self.run_env,
                              timeout=OP_TIMEOUT, cwd=self.dir)
        self.out.operations += 1
        self.note(f"    restore {backup_id} --to 1:{lsn} ({when}): rc={proc.returncode} "
                  f"{proc.stderr.strip().splitlines()[0][:160] if proc.stderr.strip() else ''}")
        if "Traceback (most recent call last)" in proc.stderr:
            self.violate("traceback", f"{' '.join(args)}\n{proc.stderr[-1500:]}")
        if proc.returncode not in (0, 1, 2):
            self.violate("exit_code", f"{' '.join(args)} exited {proc.returncode}")
        ok = proc.returncode == 0 and self.check_restored(target, hist, lsn, f"restore {backup_id} --to 1:{lsn} "
                                                          f"({when})")
        shutil.rmtree(target, ignore_errors=True)
        return ok

    # -- the end

    def list_backups(self) -> list[dict]:
        proc = subprocess.run([*self.env.walvault, "backups", *self.repo_args(direct=True), "--json"],
                              capture_output=True, text=True, env=self.run_env, timeout=OP_TIMEOUT)
        self.out.operations += 1
        if "Traceback (most recent call last)" in proc.stderr:
            self.violate("traceback", f"backups --json\n{proc.stderr[-1500:]}")
        if proc.returncode != 0:
            self.violate("backups_fails", f"`backups --json` exited {proc.returncode}: {proc.stderr[-400:]}")
            return []
        return json.loads(proc.stdout)["backups"]

    def final_checks(self) -> None:
        if self.streamer is not None:
            self.step_stream_stop(Step("stream_stop"))
        if self.live is not None:
            self.step_live_stop(Step("live_stop"))
        if self.plan.storage == "s3":
            self.proxy.stall(0)
        if self.plan.repo_on_tmpfs and self.mounts and self.mounts[0] == self.dir / "repo":
            # the fault ends before the invariants: a restore writes its mark into the repository
            subprocess.run(["mount", "-o", "remount,size=64m", str(self.mounts[0])], capture_output=True)
        listed = self.list_backups()
        for b in listed:
            if b.get("status") not in ("ok", "incomplete") and not self.damaged:
                self.violate("backup_status", f"{b['id']} is listed {b.get('status')} with no damage done: "
                             f"{b.get('problem')}")
        ok = [b for b in listed if b.get("status") == "ok"]
        unknown = [b["id"] for b in ok if b["id"] not in self.backups]
        if unknown:
            self._learn_paths(unknown)
        suspects = [b["id"] for b in ok if self.backups.get(b["id"], {}).get("suspect")]
        others = [b["id"] for b in ok if b["id"] not in suspects]
        sample = suspects[:3]
        if others:
            sample.append(others[-1])
            if not suspects and len(others) > 1:
                sample.append(self.rng.choice(others[:-1]))
        self.note(f"final: {len(listed)} backups listed, {len(ok)} ok; restoring {sample}")
        for backup_id in dict.fromkeys(sample):
            self.check_backup(backup_id, next(b["position"] for b in ok if b["id"] == backup_id))
        if self.stream_proxy is not None:  # a streamer ran: its segments, and the newest point they reach
            self.check_segments()
            op = Op("restore_end")
            self.finish(op, *self.start(op), killed=False)
        self.check_verify()

    def check_segments(self) -> None:
        """No row in two segments: a restarted, reconnected or second streamer goes on where the last one stopped."""
        spans = self.stream_objects()
        self.note(f"    {len(spans)} segments stored, 1:{spans[0]['start'] if spans else '-'} to "
                  f"1:{max((s['end'] for s in spans), default='-')}")
        for before, after in zip(spans, spans[1:]):
            if after["start"] < before["end"]:
                self.violate("segment_rows_twice", f"{after['name']} (1:{after['start']}-{after['end']}) holds rows "
                             f"of {before['name']} (1:{before['start']}-{before['end']})")

    def check_backup(self, backup_id: str, position: dict) -> None:
        """A backup listed ok must restore (or refuse naming the object damaged on purpose) to its source's rows."""
        record = self.backups.get(backup_id)
        target = self.scratch("check")
        proc = subprocess.run([*self.env.walvault, "restore", backup_id, str(target), *self.repo_args(direct=True),
                               "--json"], capture_output=True, text=True, env=self.run_env, timeout=OP_TIMEOUT)
        self.out.operations += 1
        what = f"backup {backup_id} (listed ok{', made under a fault' if record and record['suspect'] else ''})"
        self.note(f"    restore {backup_id}: rc={proc.returncode} {proc.stderr.strip()[:200]}")
        if "Traceback (most recent call last)" in proc.stderr:
            self.violate("traceback", f"restore {backup_id}\n{proc.stderr[-1500:]}")
        if proc.returncode != 0:
            # a backup whose chain holds the object damaged on purpose must refuse, naming it
            if not (self.damaged and proc.returncode == 1 and self.damaged["name"] in proc.stderr):
                self.violate("ok_backup_does_not_restore", f"{what}: restore exited {proc.returncode}: "
                             f"{proc.stderr.strip()[-500:]}")
            return
        hist = self.history_of(record["path"]) if record else None
        self.check_restored(target, hist, int(position["vclock"].get("1", 0)), what)
        shutil.rmtree(target, ignore_errors=True)

    def _learn_paths(self, ids: list[str]) -> None:
        """Source paths of backups whose own output the harness did not see (killed, paused): their manifests."""
        from walcore.repository import Repository

        options = {} if self.plan.storage == "local" else {"endpoint_url": self.env.s3_direct}
        try:
            for record in Repository(self.repo_url, options, key=self.key).backups():
                if record.id in ids and record.manifest is not None:
                    self.backups[record.id] = {"path": record.manifest.source.get("path"),
                                               "position": record.manifest.position, "suspect": True}
        except Exception as exc:  # noqa: BLE001 - the harness reading a manifest it did not write
            self.note(f"    (manifests not read: {exc})")

    def check_verify(self) -> None:
        proc = subprocess.run([*self.env.walvault, "verify", *self.repo_args(direct=True)], capture_output=True,
                              text=True, env=self.run_env, timeout=OP_TIMEOUT)
        self.out.operations += 1
        said = proc.stdout + proc.stderr
        last = said.strip().splitlines()[-1][:200] if said.strip() else ""
        self.note(f"    verify --repo: rc={proc.returncode} {last}")
        if "Traceback (most recent call last)" in proc.stderr:
            self.violate("traceback", f"verify --repo\n{proc.stderr[-1500:]}")
        if self.damaged is None:
            if self.conflict_only(proc.returncode, said):
                self.note("    (verify reports the second history's archive conflict: an honest finding)")
                return
            if proc.returncode != 0:
                self.violate("verify_not_intact", f"`verify --repo` exited {proc.returncode} with no damage done: "
                             f"{said[-800:]}")
            return
        name = self.damaged["name"]
        named = any(form in said for form in (name, name.removesuffix(".zst"), Path(name).name,
                                              Path(name).name.removesuffix(".zst")))
        if proc.returncode != 1 or not named:
            self.violate("damage_unreported", f"{name} ({self.damaged['kind']}) was damaged on purpose; `verify "
                         f"--repo` exited {proc.returncode}{'' if named else ' without naming it'}: {said[-500:]}")

    def conflict_only(self, rc: int, said: str) -> bool:
        """`verify --repo` exited 1 for the one honest finding a repository without damage may hold: two histories
        of one instance archived into it, a conflict of their archived files."""
        findings = [ln for ln in said.splitlines() if re.search(r"missing|damaged|mismatch|not found|conflict", ln)]
        return rc == 1 and "h2" in self.histories and bool(findings) and all(
            "conflict" in ln or re.match(r"archive \S+ \S+: \d+ files, damaged$", ln) for ln in findings)

    # -- the repository's objects, read by the harness itself

    def list_objects(self, prefix: str) -> list[str]:
        if self.plan.storage == "local":
            root = Path(self.repo_url)
            base = root / prefix if prefix else root
            if not base.exists():
                return []
            return sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())
        client = self.s3
        names, token = [], None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": f"repo/{prefix}"}
            if token:
                kwargs["ContinuationToken"] = token
            page = client.list_objects_v2(**kwargs)
            names += [o["Key"].removeprefix("repo/") for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return names
            token = page["NextContinuationToken"]

    def read_object(self, name: str) -> bytes:
        if self.plan.storage == "local":
            return (Path(self.repo_url) / name).read_bytes()
        return self.s3.get_object(Bucket=self.bucket, Key=f"repo/{name}")["Body"].read()

    def remove_object(self, name: str) -> None:
        if self.plan.storage == "local":
            (Path(self.repo_url) / name).unlink()
            return
        self.s3.delete_object(
            Bucket=self.bucket, Key=f"repo/{name}")

    def write_object(self, name: str, data: bytes) -> None:
        if self.plan.storage == "local":
            (Path(self.repo_url) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(self.repo_url) / name).write_bytes(data)
            return
        self.s3.put_object(Bucket=self.bucket, Key=f"repo/{name}", Body=data)


def run_schedule(env: Env, seed: int, storage: str, copies: bool = True) -> Outcome:
    return Schedule(env, seed, storage, copies).run()


def covering_seeds(storages: tuple[str, ...] = ("local", "s3"), count: int = 3, search: int = 400,
                   given: list[tuple[int, str]] = ()) -> list[tuple[int, str]]:
    """At most `count` (seed, storage), one storage after the other, whose plans together with those of `given`
    (schedules run anyway) inject every fault kind (the shortest plans among equals): CI's schedules."""
    chosen: list[tuple[int, str]] = []
    covered: set[str] = set().union(*(plan(seed, storage).fault_kinds() for seed, storage in given))
    for storage in (storages * count)[:count]:
        if covered >= set(FAULT_KINDS):
            break
        plans = [plan(seed, storage) for seed in range(search) if (seed, storage) not in chosen]
        # a rotation's step left out of the length: encryption changed no plain plan's rank
        best = max(plans, key=lambda p: (len(p.fault_kinds() - covered),
                                         -sum(s.kind != "key_rotate" for s in p.steps)))
        chosen.append((best.seed, storage))
        covered |= best.fault_kinds()
    return chosen


def encrypted_seed(storage: str, search: int = 400) -> tuple[int, str]:
    """The (seed, storage) of the shortest encrypted plan whose rotation is killed beside another command: CI's
    schedule of an encrypted repository (the covering ones stay what they were)."""
    plans = [plan(seed, storage) for seed in range(search)]
    best = min((p for p in plans if any(s.kind == "key_rotate" and s.fault and s.b for s in p.steps)),
               key=lambda p: len(p.steps))
    return best.seed, storage


def summarize(outcomes: list[Outcome]) -> dict:
    faults: dict[str, int] = {}
    violations: dict[str, list[int]] = {}
    for out in outcomes:
        for kind, n in out.faults.items():
            faults[kind] = faults.get(kind, 0) + n
        for v in out.violations:
            violations.setdefault(v.kind, [])
            if out.seed not in violations[v.kind]:
                violations[v.kind].append(out.seed)
    seconds = sum(o.seconds for o in outcomes)
    return {"schedules": len(outcomes), "operations": sum(o.operations for o in outcomes), "faults": faults,
            "violations": {k: {"schedules": len(v), "seeds": v} for k, v in sorted(violations.items())},
            "failed_schedules": sum(not o.ok for o in outcomes),
            "harness_errors": [o.seed for o in outcomes if o.error],
            "seconds": round(seconds, 1), "seconds_per_schedule": round(seconds / max(1, len(outcomes)), 2)}


def format_outcome(out: Outcome) -> str:
    kinds = sorted({v.kind for v in out.violations})
    verdict = "ok" if out.ok else ("HARNESS ERROR" if out.error else "VIOLATIONS " + ",".join(kinds))
    faults = ",".join(f"{k}={n}" for k, n in sorted(out.faults.items())) or "none"
    return (f"seed {out.seed:6d} {out.storage:5s} {out.seconds:6.1f}s ops={out.operations:3d} faults[{faults}] "
            f"{verdict}")

"""Retention over random histories (hypothesis): writes, checkpoints, rotations, archives, backups, snapshots,
pins, unpins and expiries of a Tarantool-format and a limestone-format source sharing one repository, on a
simulated clock (the rows' timestamps and the rotation names carry it; expiry judges as of it), under a policy of a
window and a count of full backups kept.

After every expiry:
- every backup still listed restores, and holds the state the source had at the backup's position;
- every pinned backup and the newest `keep_full` full backups of each source are still listed (so they restore,
  with their parent chains);
- every point of the window that could be restored before the expiry still can, to the same state (for
  Tarantool a restore `--to` a time, for limestone `--to` an epoch).
The model's states are the sources' own history, never walvault's output.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import clock_at
from walcore.command.archive import archive
from walcore.command.backup import backup
from walcore.command.expire import expire
from walcore.command.pin import pin, unpin
from walcore.command.restore import restore
from walcore.command.snapshot import snapshot
from walcore.findings import Refused
from walcore.limestone.epoch import EPOCH_NAME
from walcore.limestone.pwal import CLEAR_STORAGE
from walcore.limestone.state import build_state
from walcore.limestone.writer import LogDir, put, remove, storage_op
from walcore.repository import Repository
from walcore.runner import LocalRunner
from walcore.tarantool.row import SPACE_ID
from walcore.tarantool.writer import REPLACE, TarantoolWriter, dml_header, file_name
from walcore.tarantool.xlog import read_rows

DAY = 86400.0
INSTANCE = "0000aaaa-1111-4222-8333-444455556666"
T0 = 1_900_000_000.0  # the simulated clock's start (2030): rows and rotation names carry it
RUNNER = LocalRunner(1)


# -- the Tarantool-format source: a data dir of synthetic but real-format files


class TarantoolSource:
    def __init__(self, root: Path):
        self.root, self.lsn, self.prev = root, 0, None
        (root / "memtx").mkdir(parents=True)
        (root / "wal").mkdir()
        self.data: dict[int, str] = {0: "initial"}
        self.history: list[tuple[float, int, dict]] = [(T0, 0, dict(self.data))]  # (time, lsn, state)
        self._snap(T0)

    def _snap(self, now: float) -> None:
        with TarantoolWriter(self.root / "memtx" / file_name({1: self.lsn}, "snap"), "SNAP", instance=INSTANCE,
                             vclock={1: self.lsn}) as w:
            w.write_block([({0: 2, 4: now}, {SPACE_ID: 512, 0x21: [k, v]}) for k, v in sorted(self.data.items())])

    def write(self, rng: random.Random, rows: int, clock: list[float]) -> None:
        start = {1: self.lsn}
        with TarantoolWriter(self.root / "wal" / file_name(start, "xlog"), "XLOG", instance=INSTANCE, vclock=start,
                             prev_vclock=self.prev) as w:
            for _ in range(rows):
                clock[0] += rng.uniform(60, 6 * 3600)
                self.lsn += 1
                key, value = rng.randrange(12), f"v{self.lsn}"
                w.write_block([(dml_header(REPLACE, self.lsn, 1, timestamp=clock[0]),
                                {SPACE_ID: 512, 0x21: [key, value]})])
                self.data[key] = value
                self.history.append((clock[0], self.lsn, dict(self.data)))
        self.prev = start

    def checkpoint(self, clock: list[float]) -> None:
        self._snap(clock[0])

    def state_at_lsn(self, lsn: int) -> dict:
        return next(s for _, n, s in reversed(self.history) if n <= lsn)

    def state_at_time(self, t: float) -> dict:
        return next(s for when, _, s in reversed(self.history) if when <= t)


def tarantool_state(root: Path) -> tuple[dict, int]:
    """The state of a restored data dir: its snapshot's tuples, then every xlog row past the snapshot."""
    snaps = sorted(root.rglob("*.snap"))
    data, lsn = {}, 0
    for _pos, row in read_rows(snaps[-1]):
        key, value = row.body[0x21]
        data[key] = value.decode()  # rows are read raw: strings come as bytes
    lsn = int(snaps[-1].name.split(".")[0])
    for xlog in sorted(root.rglob("*.xlog")):
        for _pos, row in read_rows(xlog):
            if row.lsn > lsn:
                key, value = row.body[0x21]
                data[key] = value.decode()
                lsn = row.lsn
    return data, lsn


# -- the limestone-format source


class LimestoneSource:
    def __init__(self, root: Path):
        self.root, self.epoch, self.minor = root, 0, 0
        self.epoch_times: dict[int, float] = {}
        LogDir(root, channels=2).close()

    def write(self, rng: random.Random, epochs: int, clock: list[float]) -> None:
        d = LogDir(self.root, channels=2)
        for _ in range(epochs):
            self.epoch += 1
            clock[0] += rng.uniform(60, 6 * 3600)
            for ch in range(2):
                entries = []
                for _ in range(rng.randint(0, 3)):
                    self.minor += 1
                    wv, sid, key = (self.epoch, self.minor), rng.choice((3, 700)), rng.choice((b"a", b"b\x00", b"c"))
                    roll = rng.random()
                    entries.append(put(sid, key, f"e{self.epoch}".encode(), wv) if roll < 0.6 else
                                   remove(sid, key, wv) if roll < 0.9 else storage_op(CLEAR_STORAGE, sid, wv))
                if entries:
                    d.session(ch, self.epoch, entries)
            d.make_durable(self.epoch)
            self.epoch_times[self.epoch] = clock[0]
        d.close()

    def rotate(self, clock: list[float], rng: random.Random | None = None) -> None:
        """As limestone's rotation names them: the time in milliseconds, the epoch file by its current epoch. With
        `rng`, only some channels (as `walvault rotate --min-bytes` leaves small ones)."""
        ms = int(clock[0] * 1000)
        for p in sorted(self.root.glob("pwal_????")):
            if p.stat().st_size and (rng is None or rng.random() < 0.5):
                p.rename(self.root / f"{p.name}.{ms:014d}.0")
        epoch = self.root / EPOCH_NAME
        if epoch.stat().st_size:
            epoch.rename(self.root / f"epoch.{ms:014d}.{self.epoch}")
        LogDir(self.root, channels=2).close()

    def state_at(self, epoch: int):
        return build_state(sorted(self.root.glob("pwal_*")), epoch, set())


def limestone_state(root: Path, epoch: int):
    from walcore.limestone.check import prepare

    plan = prepare(root)
    covered = set(plan.catalog.detached_pwals) if plan.catalog else set()
    return build_state(sorted(root.glob("pwal_*")), epoch, covered)


# -- a history


@dataclass
class World:
    tmp: Path
    tt: TarantoolSource
    ls: LimestoneSource
    repo: Repository
    clock: list[float] = field(default_factory=lambda: [T0])
    expected: dict[str, object] = field(default_factory=dict)  # backup id -> the state it must restore
    pinned: set[str] = field(default_factory=set)
    fulls: dict[str, list[str]] = field(default_factory=dict)  # family -> its full backups' ids, oldest first
    restores: int = 0

    def scratch(self) -> Path:
        self.restores += 1
        return self.tmp / f"r{self.restores}"


OPS = st.sampled_from(["tt_write", "tt_write", "tt_checkpoint", "ls_write", "ls_write", "ls_rotate",
                       "ls_rotate_some", "archive", "backup_full", "backup_incremental", "snapshot", "pin", "unpin",
                       "expire"])


def _run(world: World, op: str, rng: random.Random, days: int, keep_full: int) -> None:
    repo = world.repo
    if op == "tt_write":
        world.tt.write(rng, rng.randint(1, 6), world.clock)
    elif op == "tt_checkpoint":
        world.tt.checkpoint(world.clock)
    elif op == "ls_write":
        world.ls.write(rng, rng.randint(1, 4), world.clock)
    elif op == "ls_rotate":
        world.ls.rotate(world.clock)
    elif op == "ls_rotate_some":
        world.ls.rotate(world.clock, rng)
    elif op == "archive":
        archive([world.tt.root, world.ls.root], repo, runner=RUNNER)
    elif op in ("backup_full", "backup_incremental", "snapshot"):
        for family, src in (("tarantool", world.tt.root), ("limestone", world.ls.root)):
            try:
                if op == "snapshot":
                    result = snapshot(src, repo, runner=RUNNER)
                else:
                    result = backup(src, repo, incremental=op == "backup_incremental", runner=RUNNER)
            except Refused:
                continue  # nothing to snapshot yet, no full backup to build on: refusals are outcomes
            m = result.manifest
            if m.type == "full":
                world.fulls.setdefault(family, []).append(m.id)
            if family == "tarantool":
                world.expected[m.id] = world.tt.state_at_lsn(int(m.position["vclock"].get("1", 0)))
            else:
                world.expected[m.id] = world.ls.state_at(m.position["epoch"])
    elif op == "pin":
        listed = sorted(r.id for r in repo.backups() if r.manifest is not None)
        if listed:
            chosen = rng.choice(listed)
            pin(repo, chosen, rng.choice((None, "kept by the test")))
            world.pinned.add(chosen)
    elif op == "unpin":
        if world.pinned:
            chosen = rng.choice(sorted(world.pinned))
            unpin(repo, chosen)
            world.pinned.discard(chosen)
    elif op == "expire":
        as_of = world.clock[0] + rng.uniform(0, 2 * DAY)
        window_start = as_of - days * DAY
        points = _window_points(world, window_start)
        before = {p: _restore_point(world, p) for p in points}
        with clock_at(as_of):  # the world's clock: an apply never judges as of a time its clock has not reached
            result = expire(repo, days, keep_full=keep_full, as_of=as_of, apply=True)
        event(f"an expiry deleted {'something' if result.deleted else 'nothing'}")
        reasons = [k["reason"] for src in result.sources for k in src.keep]
        event(f"an expiry kept a backup as pinned: {'pinned' in reasons}")
        event(f"an expiry kept a backup by count: {any(r.startswith('kept by count') for r in reasons)}")
        event(f"window points restorable before it: {sum(v is not None for v in before.values())}")
        listed = {r.id for r in repo.backups()}
        assert world.pinned <= listed, f"pinned backups expired: {world.pinned - listed}"
        for family, fulls in world.fulls.items():
            newest = set(fulls[-keep_full:] if keep_full else [])
            assert newest <= listed, f"of the newest {keep_full} full {family} backups, {newest - listed} expired"
        _check_backups(world)
        for p, state in before.items():
            if state is not None:
                assert _restore_point(world, p) == state, f"{p} was restorable before the expiry, not after"


def _window_points(world: World, window_start: float) -> list[tuple[str, float | int]]:
    times = [t for t, _, _ in world.tt.history if t >= window_start]
    points = [("tarantool", t) for t in (times[:1] + times[len(times) // 2:][:1] + times[-1:])]
    epochs = [e for e, t in world.ls.epoch_times.items() if t >= window_start]
    points += [("limestone", e) for e in dict.fromkeys(epochs[:1] + epochs[len(epochs) // 2:][:1] + epochs[-1:])]
    return list(dict.fromkeys(points))


def _restore_point(world: World, point) -> object | None:
    """The state restores to the point give, from every backup of the source (None when none can reach it); a
    restore that gives another state than the source had there fails the test."""
    family, at = point
    ids = [r.id for r in world.repo.backups() if r.manifest is not None and r.family == family]
    found = None
    for backup_id in sorted(ids, reverse=True):
        target = world.scratch()
        to = f"@{at!r}" if family == "tarantool" else str(at)
        try:
            restore(world.repo, backup_id, target, to=to)
        except Refused:
            continue
        if family == "tarantool":
            state, _ = tarantool_state(target)
            assert state == world.tt.state_at_time(at), (point, backup_id)
        else:
            state = limestone_state(target, at)
            assert state == world.ls.state_at(at), (point, backup_id)
        shutil.rmtree(target)
        found = state
    return found


def _check_backups(world: World) -> None:
    for record in world.repo.backups():
        assert record.manifest is not None, f"{record.id} was left without a readable manifest: {record.problem}"
        target = world.scratch()
        restore(world.repo, record.id, target)
        if record.family == "tarantool":
            assert tarantool_state(target)[0] == world.expected[record.id], record.id
        else:
            assert limestone_state(target, record.manifest.position["epoch"]) == world.expected[record.id], record.id
        shutil.rmtree(target)


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=int(os.environ.get("WALVAULT_PROPERTY_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=4, max_size=18), seed=st.integers(0, 2**32 - 1), days=st.integers(1, 3),
       keep_full=st.integers(0, 2))
def test_expiry_keeps_every_backup_and_every_point_of_the_window(tmp_path_factory, monkeypatch, ops, seed, days,
                                                                  keep_full):
    # No power is lost here: an fsync changes nothing any check reads, and it was a third of the run's time.
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    tmp = tmp_path_factory.mktemp("history")
    world = World(tmp, TarantoolSource(tmp / "tt"), LimestoneSource(tmp / "ls"),
                  Repository(str(tmp / "repo"), create=True))
    rng = random.Random(seed)
    # every history ends with a covered past and a window with a sealed, archived log in it, after a full backup
    # that only a pin or the count keeps (it is neither the anchor nor the newest backup)
    for op in ops + ["backup_full", "tt_write", "ls_write", "ls_rotate", "archive", "snapshot", "backup_full", "tt_write",
                     "ls_write", "ls_rotate", "tt_write", "archive", "expire"]:
        _run(world, op, rng, days, keep_full)
    shutil.rmtree(tmp, ignore_errors=True)

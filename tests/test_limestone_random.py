"""Randomized property tests for the limestone half: generated workloads and damaged real fixtures.

1. Generated directories. A seeded generator writes a limestone directory with walcore's own
   writer (`walcore.limestone.writer.LogDir`) in a random persistent format version 1..7 (v6+ with
   end markers) -- random puts, removes, blob puts (v3+), storage operations, binary keys, durable
   epochs recorded at random points -- and ends it cleanly, with nondurable sessions, with a crash
   mid-entry / mid-end-marker / mid-header, with zero-filled tails, or (on purpose) with
   unrepairable damage. verify, state and repair are checked against each other and against an
   independent model of the generator's operations (tests/limestone_model.py, written from the
   spec, not from walcore).
2. Damaged real fixtures. Copies of shared/fixtures/limestone directories get random byte flips,
   truncations, insertions and deletions in one pwal file. verify must never raise, must agree with
   a byte-level model of tglogutil's scan, and must never call "ok" a directory whose durable
   snippet lost or changed bytes unless limestone's format cannot show it (no CRC): the entries
   keep their boundaries and types (then the state may differ only in the damaged entries' keys),
   or the file was cut exactly on an entry boundary.

Every case is seeded; the seed is in every failure message. Replay one generated case with
`pytest tests/test_limestone_random.py -k 'generated and [SEED]'`. Set LIMESTONE_RANDOM_STATS to a
file name to get counts of the damage outcome classes (JSON lines).

WALVAULT_TEST_EXAMPLES=N (default 20) runs up to N cases of each kind: N generated directories (first those that
together reach every case the generator makes, then the lowest seeds) and N damaged copies of each fixture; 300
runs every one.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

import limestone_model as model
from limestone_bytes import walk
from conftest import copy_limestone_fixture, require_limestone, run_main
from limestone_model import (ADD, CLEAR, EPOCH_RECORD, OK, PUT, PUT_BLOB, REMOVE, REMOVE_STORAGE, REPAIRABLE,
                             UNREPAIRABLE, Op, PartialHeader, Session, Stray, Workload, ZeroTail)
from walcore.runner import LocalRunner
from walcore.limestone import pwal, writer
from walcore.limestone.scan import scan_pwal
from walcore.limestone.writer import LogDir
from walcore.command.repair import RepairRefused, apply_repair, plan_repair
from walcore.command.state import StateRefused, directory_state
from walcore.scan_paths import verify_paths


pytestmark = pytest.mark.usefixtures("scan_core")  # each test on both scan cores

N_SEEDS = 300  # the generator's seeds (test_generator_covers_every_case walks them all)
EXAMPLES = int(os.environ.get("WALVAULT_TEST_EXAMPLES", "20"))
LEVEL = {OK: 0, REPAIRABLE: 1, UNREPAIRABLE: 2}

# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------

STORAGES = (1, 2, 7, 255, 256, 300, 1 << 40)
SPECIAL_KEYS = (b"", b"\x00", b"\xff", b"\xff" * 16, b"k\x00z", b"\x00\xff\x00", b"a", b"b")


class _Gen:
    def __init__(self, rng: random.Random, version: int, big: bool):
        self.rng, self.version, self.big = rng, version, big
        self.minor = 0
        self.blob_ids: list[int] = []
        self.storages = rng.sample(STORAGES, rng.randint(1, 3))
        self.keys = {s: rng.sample(SPECIAL_KEYS, 4) + [rng.randbytes(rng.randint(1, 12)) for _ in range(4)]
                     for s in self.storages}

    def value(self) -> bytes:
        r = self.rng.random()
        if self.big and r < 0.7:
            return self.rng.randbytes(self.rng.randint(40_000, 300_000))
        if r < 0.05:
            return self.rng.randbytes(self.rng.randint(2048, 8192))
        return self.rng.randbytes(self.rng.randint(0, 300))

    def wv(self, epoch: int) -> tuple[int, int]:
        self.minor += self.rng.randint(1, 3)
        return epoch, self.minor

    def op(self, epoch: int, *, data_only: bool = False) -> Op:
        rng = self.rng
        kinds = [PUT] * 11 + [REMOVE] * 4 + [CLEAR, ADD, REMOVE_STORAGE]
        if self.version >= 3:
            kinds += [PUT_BLOB] * 2
        kind = rng.choice(kinds)
        storage = rng.choice(self.storages)
        key = rng.choice(self.keys[storage])
        wv = self.wv(epoch)
        if kind in (PUT, PUT_BLOB):
            blobs = ()
            if kind == PUT_BLOB:
                blobs = tuple(self.new_blob() for _ in range(rng.randint(1, 2)))
            return Op(kind, storage, key, self.value(), wv, blobs)
        if kind == REMOVE:
            return Op(kind, storage, key, b"", wv)
        return Op(kind, storage, b"", b"", wv)

    def new_blob(self) -> int:
        blob = self.rng.choice((len(self.blob_ids) + 1, self.rng.randint(1, 1 << 40)))
        self.blob_ids.append(blob)
        return blob

    def ops(self, epoch: int, *, at_least: int = 0) -> list[Op]:
        rng = self.rng
        out: list[Op] = []
        for _ in range(max(at_least, rng.choice((0, 1, 2, 2, 3, 4, 6)))):
            op = self.op(epoch)
            if out and rng.random() < 0.06:
                # the same write version twice in one session: the later entry wins (spec 9);
                # a put at a clear's own version survives it (the drop is strict)
                op.wv = out[-1].wv
            out.append(op)
        return out


def encode(op: Op) -> bytes:
    if op.kind in (PUT, PUT_BLOB):
        return writer.put(op.storage, op.key, op.value, op.wv, op.blobs)
    if op.kind == REMOVE:
        return writer.remove(op.storage, op.key, op.wv)
    if op.kind == EPOCH_RECORD:
        return writer.durable_epoch(op.epoch)
    kind = {CLEAR: pwal.CLEAR_STORAGE, ADD: pwal.ADD_STORAGE, REMOVE_STORAGE: pwal.REMOVE_STORAGE}[op.kind]
    return writer.storage_op(kind, op.storage, op.wv)


def generate(seed: int) -> tuple[Workload, list[str]]:
    """A random workload and the names of what was done to its end (for messages and coverage)."""
    rng = random.Random(seed)
    version = rng.randint(1, 7)
    ends = version >= 6
    big = rng.random() < 0.05  # files of over 1 MiB: the fast walk refills its buffer mid-entry
    g = _Gen(rng, version, big)
    nch = rng.randint(1, 4)
    chans: list[list] = [[] for _ in range(nch)]
    records: list[int] = []
    tags: list[str] = [f"v{version}", f"{nch}ch"] + (["big"] if big else [])
    epoch = rng.randint(1, 4)
    used: list[int] = []
    for _ in range(rng.randint(1, 6)):
        for ch in range(nch):
            for _ in range(rng.choice((0, 1, 1, 1, 2))):
                chans[ch].append(Session(epoch, g.ops(epoch), ended=ends))
        used.append(epoch)
        r = rng.random()
        if r < 0.65:
            records.append(epoch)
        elif r < 0.75 and records:
            records.append(rng.choice(records))  # an older record again: D is the maximum, not the last
        epoch += rng.randint(1, 3)
    if rng.random() < 0.15:
        # a snippet an earlier recovery canceled (06): skipped even with E <= D
        ch = rng.randrange(nch)
        e = rng.choice(used)
        chans[ch].insert(rng.randint(0, len(chans[ch])), Session(e, g.ops(e), ended=ends, canceled=True))
        tags.append("canceled")

    mode = rng.choices(("clean", "open", "broken"), weights=(3, 6, 2))[0]
    tags.append(mode)
    if mode == "clean":
        if used and rng.random() < 0.9:
            records.append(max(used))
    tail_channels = set(range(nch))
    if mode == "broken":
        choices = ["durable_cut", "stray_data", "stray_end", "epoch_record"]
        if not ends:
            choices += ["zero_after_durable", "partial_header_after_durable"]
        what = rng.choice(choices)
        tags.append(what)
        ch = rng.randrange(nch)
        if what in ("durable_cut", "zero_after_durable", "partial_header_after_durable"):
            tail_channels.discard(ch)
            e = epoch
            epoch += rng.randint(1, 2)
            if what == "durable_cut":
                ops = g.ops(e, at_least=1)
                cut = rng.choice(("entry", "end")) if ends else "entry"
                n = len(encode(ops[-1])) if cut == "entry" else 10
                chans[ch].append(Session(e, ops, ended=False, cut=cut, cut_len=rng.randint(1, n - 1)))
            else:
                chans[ch].append(Session(e, g.ops(e), ended=False))
                if what == "zero_after_durable":
                    chans[ch].append(ZeroTail(rng.randint(1, 64)))
                else:
                    chans[ch].append(PartialHeader(epoch, rng.randint(1, 8)))
            records.append(e)
        elif what in ("stray_data", "stray_end"):
            # where only a header may come: the file start, or right after an end marker
            spots = [0] + [i + 1 for i, it in enumerate(chans[ch]) if isinstance(it, Session) and it.ended]
            at = rng.choice(spots)
            stray = Stray("data", g.op(epoch)) if what == "stray_data" else Stray("end", epoch=rng.choice(used))
            chans[ch].insert(at, stray)
        else:
            sessions = [it for items in chans for it in items if isinstance(it, Session)]
            if not sessions:
                chans[ch].append(Session(epoch, [], ended=ends))
                sessions = chans[ch][-1:]
            s = rng.choice(sessions)
            s.ops.insert(rng.randint(0, len(s.ops)), Op(EPOCH_RECORD, epoch=rng.randint(0, epoch)))
    if mode in ("open", "broken"):
        last = epoch  # beyond every epoch so far, hence beyond the durable epoch
        for ch in sorted(tail_channels):
            if mode == "broken" and rng.random() < 0.5:
                continue
            tail = rng.choices(("none", "session", "crash_entry", "crash_end", "partial_header", "zero"),
                               weights=(3, 3, 4, 2 if ends else 0, 2, 3))[0]
            if tail != "none":
                tags.append(tail)
            if tail == "session":
                chans[ch].append(Session(last, g.ops(last), ended=ends and rng.random() < 0.5))
            elif tail == "crash_entry":
                ops = g.ops(last, at_least=1)
                n = len(encode(ops[-1]))
                cut_len = rng.choice((1, n - 1, rng.randint(1, n - 1)))
                chans[ch].append(Session(last, ops, ended=False, cut="entry", cut_len=cut_len))
            elif tail == "crash_end":
                chans[ch].append(Session(last, g.ops(last), ended=False, cut="end", cut_len=rng.randint(1, 9)))
            elif tail == "partial_header":
                if rng.random() < 0.5:
                    chans[ch].append(Session(last, g.ops(last), ended=ends))
                chans[ch].append(PartialHeader(last + rng.randint(0, 1), rng.randint(1, 8)))
            elif tail == "zero":
                if rng.random() < 0.5:
                    chans[ch].append(Session(last, g.ops(last), ended=ends and rng.random() < 0.5))
                chans[ch].append(ZeroTail(rng.choice((1, 8, 9, 10, 17, 64, 4096, rng.randint(1, 300)))))
    present = {b for b in g.blob_ids if rng.random() < 0.7}
    w = Workload(version, chans, records, present)
    if rng.random() < 0.2:
        # an earlier rotation: some channels' files renamed to detached names (an empty active file
        # may have been opened again)
        w.detached = {ch for ch in range(nch) if rng.random() < 0.6} or {0}
        tags.append("detached")
    if rng.random() < 0.15 and records:
        # a rotated epoch file holds the first records; `epoch` holds the rest, or is empty or missing
        k = rng.randint(1, len(records))
        w.rotated_records, w.records = records[:k], records[k:]
        w.epoch_file = bool(w.records) or rng.random() < 0.5
        tags.append("epoch_rotated" if w.epoch_file else "epoch_missing")
    return w, tags


def write_workload(w: Workload, root: Path) -> None:
    d = LogDir(root, version=w.version, channels=len(w.channels))
    for ch, items in enumerate(w.channels):
        for it in items:
            if isinstance(it, Session):
                entries = [encode(op) for op in it.ops]
                assert not it.ended or w.version >= 6
                if it.canceled:
                    d.raw(ch, writer.snippet_header(it.epoch, canceled=True) + b"".join(entries)
                          + (writer.snippet_end(it.epoch) if it.ended else b""))
                elif it.cut == "entry":
                    d.session(ch, it.epoch, entries[:-1], finished=False)
                    assert 0 < it.cut_len < len(entries[-1])
                    d.raw(ch, entries[-1][:it.cut_len])
                elif it.cut == "end":
                    d.session(ch, it.epoch, entries, finished=False)
                    d.raw(ch, writer.snippet_end(it.epoch)[:it.cut_len])
                else:
                    d.session(ch, it.epoch, entries, finished=it.ended)
            elif isinstance(it, PartialHeader):
                d.raw(ch, writer.snippet_header(it.epoch)[:it.length])
            elif isinstance(it, ZeroTail):
                d.raw(ch, bytes(it.length))
            elif isinstance(it, Stray):
                d.raw(ch, encode(it.op) if it.what == "data" else writer.snippet_end(it.epoch))
    for e in w.records:
        d.make_durable(e)
    d.close()
    for ch in w.detached:
        name = f"pwal_{ch:04d}"
        os.rename(root / name, root / f"{name}.01795335762219.0")
        if ch % 2:
            (root / name).touch()
    if w.rotated_records:
        (root / f"epoch.01795335762217.{max(w.rotated_records) + 1}").write_bytes(
            b"".join(writer.durable_epoch(e) for e in w.rotated_records))
    if not w.epoch_file:
        assert not w.records
        (root / "epoch").unlink()
    for blob in w.blobs_present:
        path = root / "blob" / f"dir_{blob % 100:02d}" / f"{blob:016x}.blob"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"blob %d" % blob)


def describe(w: Workload, tags: list[str]) -> str:
    def item(it) -> str:
        if isinstance(it, Session):
            s = f"{'C' if it.canceled else 'S'}{it.epoch}[{len(it.ops)}]{'$' if it.ended else ''}"
            return s + (f"~cut-{it.cut}:{it.cut_len}" if it.cut else "")
        if isinstance(it, PartialHeader):
            return f"hdr{it.epoch}:{it.length}"
        if isinstance(it, ZeroTail):
            return f"zero{it.length}"
        return f"stray-{it.what}"

    chans = "; ".join(f"ch{i}: " + " ".join(item(it) for it in items) for i, items in enumerate(w.channels))
    return (f"{' '.join(tags)} | records {w.records} rotated {w.rotated_records} detached {sorted(w.detached)}"
            f" | {chans}")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

def dir_report(root: Path):
    report = verify_paths([root], runner=LocalRunner(1))
    assert len(report.dirs) == 1
    return report.dirs[0].to_json()


def verdict(d: dict) -> dict:
    return {k: d[k] for k in ("status", "durable_epoch", "max_appeared_epoch", "count_durable_wal_entries",
                              "durable_entries")}


def expected_verdict(exp: model.Expected) -> dict:
    return {"status": exp.status, "durable_epoch": exp.durable_epoch, "max_appeared_epoch": exp.max_appeared_epoch,
            "count_durable_wal_entries": exp.count_durable_wal_entries, "durable_entries": exp.durable_entries}


def missing_blobs(d: dict) -> set[int]:
    return {int(re.match(r"blob (\d+) ", f["message"]).group(1)) for f in d["findings"] if f["code"] == "missing_blob"}


def state_dict(rows) -> dict[tuple[int, bytes], bytes]:
    out = {}
    for storage, key, value in rows:
        assert (storage, key) not in out, f"state lists {(storage, key)} twice"
        out[(storage, key)] = value
    return out


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


SCAN_FIELDS = ("size", "code", "max_epoch", "min_epoch", "durable", "entries", "snippets", "missing_blobs", "findings",
               "marks", "tail_mark", "cut_at", "repair_code", "canceled_tail")


def check_walks_agree(root: Path, durable_epoch: int, ctx: str) -> None:
    """verify's walk (scan_pwal without on_durable: the fast walk when the file is well-formed) and
    the exact walk state uses (with on_durable) say the same about every pwal file."""
    for p in sorted(root.glob("pwal_*")):
        fast = scan_pwal(p, durable_epoch)
        exact = scan_pwal(p, durable_epoch, on_durable=lambda e: None)
        for name in SCAN_FIELDS:
            assert getattr(fast, name) == getattr(exact, name), f"{ctx}: {p.name}: {name}: fast walk " \
                f"{getattr(fast, name)!r}, exact walk {getattr(exact, name)!r}"


def diff_positions(a: bytes, b: bytes) -> dict[int, tuple[int, int]]:
    assert len(a) == len(b)
    return {i: (x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y}


# ---------------------------------------------------------------------------------------------
# 1. Generated directories
# ---------------------------------------------------------------------------------------------

@functools.cache  # generated_seeds walks every seed: tests/test_spark_jobs.py asks for the seeds again
def _outcomes(seed: int) -> frozenset[str]:
    """What the generator did for a seed, as test_generator_covers_every_case counts it."""
    w, tags = generate(seed)
    status = model.expect(w).status
    return frozenset({*tags, status, f"{status}/v{'marker' if w.version >= 6 else 'plain'}"})


def generated_seeds(count: int) -> list[int]:
    """`count` seeds of range(N_SEEDS): first a few that together reach every outcome (greedily, the one adding
    most first), then the lowest others."""
    outcomes = {seed: _outcomes(seed) for seed in range(N_SEEDS)}
    cover, missing = [], set().union(*outcomes.values())
    while missing and len(cover) < count:
        seed = max(outcomes, key=lambda s: len(outcomes[s] & missing))
        cover.append(seed)
        missing -= outcomes[seed]
    return cover + [seed for seed in range(N_SEEDS) if seed not in cover][:max(0, count - len(cover))]


@pytest.mark.parametrize("seed", generated_seeds(EXAMPLES))
def test_generated(seed: int, tmp_path: Path):
    w, tags = generate(seed)
    ctx = f"seed {seed}: {describe(w, tags)}"
    root = tmp_path / "log"
    write_workload(w, root)
    exp = model.expect(w)

    d = dir_report(root)
    assert verdict(d) == expected_verdict(exp), ctx
    check_walks_agree(root, exp.durable_epoch, ctx)
    assert missing_blobs(d) == exp.missing_blobs, ctx
    # the byte-level model of tglogutil agrees with the operation-level one (a check on the test)
    spec = model.spec_dir(root)
    assert (spec.status, spec.durable_epoch, spec.max_appeared_epoch, spec.count) == (
        exp.status, exp.durable_epoch, exp.max_appeared_epoch, exp.count_durable_wal_entries), ctx

    before = snapshot(root)
    if exp.status == UNREPAIRABLE:
        with pytest.raises(StateRefused):
            directory_state(root)
        for cut in (False, True):
            with pytest.raises(RepairRefused):
                plan_repair(root, cut=cut)
        assert snapshot(root) == before, f"{ctx}: refused repair changed the directory"
        return

    assert state_dict(directory_state(root)) == exp.state, ctx
    assert model.spec_state(root, spec) == exp.state, ctx
    if exp.status == OK:
        for cut in (False, True):
            rp = plan_repair(root, cut=cut)
            assert (rp.status, rp.needed) == (OK, False), ctx
            assert not apply_repair(rp).applied, ctx
        assert snapshot(root) == before, f"{ctx}: repair of an ok directory changed it"
        return

    for cut in (False, True):
        _check_repair(root, tmp_path / f"cut-{cut}" / "log", cut, exp, before, ctx)
    assert snapshot(root) == before, f"{ctx}: repair of a copy changed the original"


def _check_repair(root: Path, work: Path, cut: bool, exp: model.Expected, before: dict, ctx: str) -> None:
    ctx = f"{ctx} (repair{' --cut' if cut else ''})"
    work.parent.mkdir()
    shutil.copytree(root, work)
    rp = plan_repair(work, cut=cut)
    assert (rp.status, rp.needed) == (REPAIRABLE, True), ctx
    done = apply_repair(rp, now_ms=1795335761951)
    assert done.applied, ctx

    after = dir_report(work)
    assert after["status"] == OK, f"{ctx}: {after['findings']} / {[f.findings for f in verify_paths([work]).files]}"
    assert after["durable_epoch"] == exp.durable_epoch, ctx
    assert after["count_durable_wal_entries"] == exp.count_durable_wal_entries, ctx
    assert after["durable_entries"] == exp.durable_entries, ctx
    if cut:
        assert exp.durable_epoch <= after["max_appeared_epoch"] <= exp.max_appeared_epoch, ctx
    else:
        assert after["max_appeared_epoch"] == exp.max_appeared_epoch, ctx
    assert state_dict(directory_state(work)) == exp.state, f"{ctx}: repair changed the state"
    again = plan_repair(work, cut=cut)
    assert (again.status, again.needed) == (OK, False), f"{ctx}: a second repair: {again.to_json()}"

    # what was written: every non-empty active file detached; only header bytes 2 -> 6 (and the
    # broken tail's mark); with --cut, the saved tail + the truncated file give back the original
    names = {f.name for f in done.files}
    for f in done.files:
        orig = before[f.name]
        assert (f.detach_to is not None) == (len(orig) > 0 and len(f.name) == 9), ctx
        now = (work / (f.detach_to or f.name)).read_bytes()
        marks = set(f.cancel)
        if cut and f.cut_at is not None:
            marks = {o for o in f.cancel if o < f.cut_at}  # the cut part is saved as it was
            assert len(now) == f.cut_at, ctx
            saved = [Path(s) for s in done.saved if Path(s).name == f"{f.detach_to or f.name}.{f.cut_at}"]
            assert len(saved) == 1, f"{ctx}: saved tails {done.saved}"
            now += saved[0].read_bytes()
        elif f.tail_mark is not None:
            marks.add(f.tail_mark)
        changed = diff_positions(orig, now)
        assert set(changed) == marks, f"{ctx}: {f.name} changed at {sorted(changed)}, planned {sorted(marks)}"
        assert all(new == 6 for _, new in changed.values()), ctx
        assert all(orig[o] == 2 for o in f.cancel), ctx
    left = {p.name for p in work.iterdir() if p.name.startswith("pwal_")}
    assert left == {f.detach_to or f.name for f in done.files}, ctx
    assert names == {n for n in before if n.startswith("pwal_")}, ctx


def test_generator_covers_every_case():
    """The seeds above reach every version, verdict, crash kind and on-purpose damage."""
    statuses, tags = Counter(), Counter()
    for seed in range(N_SEEDS):
        w, t = generate(seed)
        exp = model.expect(w)
        statuses[exp.status] += 1
        tags.update(set(t))
        tags[f"{exp.status}/v{'marker' if w.version >= 6 else 'plain'}"] += 1
    assert min(statuses.values()) >= 25 and len(statuses) == 3, statuses
    for tag in [f"v{v}" for v in range(1, 8)] + [
            "detached", "epoch_rotated", "epoch_missing", "big", "canceled", "clean", "open", "broken", "session",
            "crash_entry", "crash_end", "partial_header", "zero", "durable_cut", "stray_data", "stray_end",
            "epoch_record", "zero_after_durable", "partial_header_after_durable"]:
        assert tags[tag] >= 2, (tag, tags)
    for status in (OK, REPAIRABLE, UNREPAIRABLE):
        for kind in ("marker", "plain"):
            assert tags[f"{status}/v{kind}"] >= 5, tags


def test_cli_agrees_on_generated(tmp_path: Path):
    """The CLI gives the same verdict and state as the API (and the model) on a few generated dirs."""
    picked: dict[str, int] = {}
    for seed in range(N_SEEDS):
        w, _ = generate(seed)
        exp = model.expect(w)
        status = exp.status
        if status not in picked and sum(len(items) for items in w.channels) > 3:
            picked[status] = seed
    assert len(picked) == 3
    for status, seed in picked.items():
        w, tags = generate(seed)
        ctx = f"seed {seed}: {describe(w, tags)}"
        exp = model.expect(w)
        root = tmp_path / f"log-{seed}"
        write_workload(w, root)
        r = run_main("verify", "--json", root)
        assert r.returncode == (0 if status == OK and not exp.missing_blobs else 1), (ctx, r.stderr)
        assert verdict(json.loads(r.stdout)["dirs"][0]) == expected_verdict(exp), ctx
        r = run_main("state", root, "--format", "tsv")
        if status == UNREPAIRABLE:
            assert r.returncode == 1 and r.stdout == "", (ctx, r.stderr)
            before = snapshot(root)
            r = run_main("repair", root, "--apply")
            assert r.returncode == 1 and snapshot(root) == before, (ctx, r.stdout, r.stderr)
            continue
        assert r.returncode == 0, (ctx, r.stderr)
        rows = {}
        for line in r.stdout.splitlines():
            sid, key, value = line.split("\t")
            rows[(int(sid), bytes.fromhex(key))] = bytes.fromhex(value)
        assert rows == exp.state, ctx
        if status == REPAIRABLE:
            r = run_main("repair", root, "--apply")
            assert r.returncode == 0, (ctx, r.stdout, r.stderr)
            r = run_main("verify", "--json", root)
            assert json.loads(r.stdout)["dirs"][0]["status"] == OK, ctx
            assert r.returncode == (1 if exp.missing_blobs else 0), (ctx, r.stderr)


# ---------------------------------------------------------------------------------------------
# 2. Randomly damaged real fixtures
# ---------------------------------------------------------------------------------------------

DAMAGE_FIXTURES = {"01-clean": 120, "10-backup-source": 120, "11-online-compaction": 120, "20-random-small": 80}
CHUNKS = 4
INTERESTING = (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x0A, 0x2A, 0xFF)


class Damage:
    def __init__(self, kind: str, data: bytes, *, pos: int = 0, length: int = 0, flips: tuple = ()):
        self.kind, self.data, self.pos, self.length, self.flips = kind, data, pos, length, flips

    def __repr__(self) -> str:
        if self.kind == "flip":
            return f"flip {', '.join(f'@{o}: {a:#04x}->{b:#04x}' for o, a, b in self.flips)}"
        if self.kind == "truncate":
            return f"truncate at {self.pos}"
        return f"{self.kind} {self.length} bytes at {self.pos}"

    def touches(self, start: int, end: int) -> bool:
        """Whether an original byte in [start, end) changed, or bytes were put between two of them."""
        if self.kind == "flip":
            return any(start <= o < end for o, _, _ in self.flips)
        if self.kind == "truncate":
            return self.pos < end
        if self.kind == "delete":
            return self.pos < end and start < self.pos + self.length
        return start < self.pos < end  # insert


def make_damage(rng: random.Random, data: bytes, toks: list[model.Tok]) -> Damage:
    n = len(data)
    bounds = sorted({t.offset for t in toks} | {t.offset + t.size for t in toks})

    def pos(limit: int) -> int:
        r = rng.random()
        if r < 0.4 or not toks:
            p = rng.randrange(limit)
        elif r < 0.6:
            p = rng.choice(toks).offset  # a type byte
        elif r < 0.8:
            t = rng.choice(toks)
            p = t.offset + rng.randrange(min(t.size, 17))  # type, lengths, storage id
        else:
            p = rng.choice(bounds) + rng.choice((-2, -1, 0, 0, 0, 1, 2))
        return min(max(p, 0), limit - 1)

    kind = rng.choices(("flip", "truncate", "insert", "delete"), weights=(4, 3, 2, 2))[0]
    if kind == "flip":
        buf = bytearray(data)
        flips = []
        for o in sorted({pos(n) for _ in range(rng.choice((1, 1, 1, 2, 3)))}):
            new = rng.choice(INTERESTING) if rng.random() < 0.35 else buf[o] ^ rng.randint(1, 255)
            if new == buf[o]:
                new ^= 0x80
            flips.append((o, buf[o], new))
            buf[o] = new
        return Damage(kind, bytes(buf), flips=tuple(flips))
    if kind == "truncate":
        p = pos(n)
        return Damage(kind, data[:p], pos=p, length=n - p)
    if kind == "insert":
        p = pos(n + 1)
        r = rng.random()
        if r < 0.3:
            extra = bytes(rng.randint(1, 16))
        elif r < 0.6:
            extra = rng.randbytes(rng.randint(1, 16))
        elif r < 0.8 and toks:
            t = rng.choice(toks)  # a copy of a whole entry: well-formed, in the wrong place
            extra = data[t.offset:t.offset + t.size]
        else:
            extra = bytes([rng.choice(INTERESTING)])
        return Damage(kind, data[:p] + extra + data[p:], pos=p, length=len(extra))
    if rng.random() < 0.3 and toks:
        t = rng.choice(toks)  # a whole entry
        p, k = t.offset, t.size
    else:
        p = pos(n)
        k = min(rng.randint(1, 16), n - p)
    return Damage("delete", data[:p] + data[p + k:], pos=p, length=k)


class Baseline:
    """A fixture copy before damage: its bytes, entries, durable snippets, verdict and state."""

    def __init__(self, work: Path):
        self.work = work
        self.names = model.pwal_names(work)
        self.data = {n: (work / n).read_bytes() for n in self.names}
        self.cache: dict = {}
        self.spec = model.spec_dir(work, cache=self.cache)
        assert self.spec.status == OK
        self.toks = {}
        self.extents = {}
        for n in self.names:
            toks, bad = model.parse_pwal(self.data[n])
            assert bad is None
            self.toks[n] = toks
            self.extents[n] = [(s, e) for s, e, kind in
                               model.snippet_extents(toks, len(self.data[n]), self.spec.durable_epoch)
                               if kind == "durable"]
        d = dir_report(work)
        assert (d["status"], d["durable_epoch"], d["max_appeared_epoch"], d["count_durable_wal_entries"]) == (
            OK, self.spec.durable_epoch, self.spec.max_appeared_epoch, self.spec.count)
        self.state = state_dict(directory_state(work))
        assert model.spec_state(work, self.spec) == self.state


class Stats(Counter):
    """Counts of the damage outcomes, with a few seeds of each (for LIMESTONE_RANDOM_STATS)."""

    def __init__(self):
        super().__init__()
        self.examples: dict[str, list[str]] = {}

    def note(self, key: str, ctx: str, happened: bool = True) -> None:
        if happened:
            self[key] += 1
            self.examples.setdefault(key, [])
            if len(self.examples[key]) < 3:
                self.examples[key].append(ctx)

    def write(self, label: str) -> None:
        out = os.environ.get("LIMESTONE_RANDOM_STATS")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"test": label, "counts": self, "examples": self.examples}) + "\n")


@require_limestone
@pytest.mark.parametrize("fixture,chunk", [(f, c) for f in DAMAGE_FIXTURES for c in range(CHUNKS)])
def test_damaged_fixture(fixture: str, chunk: int, tmp_path: Path):
    work = copy_limestone_fixture(fixture, tmp_path)
    base = Baseline(work)
    stats = Stats()
    cases = range(chunk, min(DAMAGE_FIXTURES[fixture], EXAMPLES), CHUNKS)
    for i in cases:
        seed = f"{fixture}/{i}"
        rng = random.Random(seed)
        name = rng.choice(base.names)
        dmg = make_damage(rng, base.data[name], base.toks[name])
        ctx = f"seed {seed!r}: {name}: {dmg!r}"
        (work / name).write_bytes(dmg.data)
        try:
            _check_damaged(base, name, dmg, ctx, stats, tmp_path / f"repair-{i}")
        finally:
            (work / name).write_bytes(base.data[name])
    assert sum(v for k, v in stats.items() if k.startswith("status ")) == len(cases)
    stats.write(f"{fixture}/{chunk}")


def _check_damaged(base: Baseline, name: str, dmg: Damage, ctx: str, stats: Stats, scratch: Path) -> None:
    work = base.work
    d = dir_report(work)  # never raises
    status = d["status"]
    stats.note(f"status {status}", ctx)
    spec = model.spec_dir(work, cache=base.cache)
    ctx = f"{ctx}: walvault {status}, tglogutil model {spec.status}"
    if spec.chunk:
        # a marker_chunk byte (42): tglogutil's lexer stops there silently; walvault calls it broken
        stats.note("marker chunk (42): walvault stricter", ctx, LEVEL[status] > LEVEL[spec.status])
        assert LEVEL[status] >= LEVEL[spec.status], ctx
    else:
        assert status == spec.status, ctx
    assert (d["durable_epoch"], d["max_appeared_epoch"], d["count_durable_wal_entries"]) == (
        spec.durable_epoch, spec.max_appeared_epoch, spec.count), ctx
    check_walks_agree(work, spec.durable_epoch, ctx)
    if model.spec_dir(work, keep_worse=False, cache=base.cache).status != spec.status:
        stats.note("tglogutil would lower the verdict (walvault keeps the worse)", ctx)

    touched = any(dmg.touches(s, e) for s, e in base.extents[name])
    toks, bad = model.parse_pwal(dmg.data)
    same_structure = model.structure(toks, bad) == model.structure(*model.parse_pwal(base.data[name]))
    orig_toks = base.toks[name]
    boundary = dmg.kind == "truncate" and bad is None and toks == orig_toks[:len(toks)]
    if dmg.kind == "truncate" and touched and not boundary:
        assert status != OK, f"{ctx}: a durable snippet lost bytes mid-entry and verify says ok"
    if dmg.kind == "truncate" and boundary:
        cut = [s for s, e in base.extents[name] if s < dmg.pos < e]
        if cut and any(t.type == model.T_END and t.offset < cut[0] for t in toks):
            # after the file's first end marker, a durable snippet cut on an entry boundary has lost its own
            assert status != OK, f"{ctx}: a durable snippet lost its end on an entry boundary and verify says ok"
    if touched:
        if status != OK:
            stats.note("durable damage detected", ctx)
        elif same_structure:
            stats.note("durable damage undetectable: same entries, types and sizes (no CRC)", ctx)
        elif boundary:
            cut_snippet = any(s < dmg.pos < e for s, e in base.extents[name])
            stats.note("durable damage undetectable: cut on an entry boundary" +
                       (" inside a durable snippet" if cut_snippet else " between snippets"), ctx)
        elif bad is None:
            # e.g. a whole entry or end marker deleted or copied, a header flipped 02 -> 06
            stats.note("durable damage undetectable: reparses as other well-formed entries", ctx)
        else:
            # limestone ignores whatever follows a canceled (06) header in a detached file (spec 1.3);
            # a data entry's type byte flipped to 06 inside a durable snippet is read as one
            assert len(name) > 9 and any(t.type == model.T_CANCELED for t in toks), ctx
            stats.note("durable damage reported ok: broken tail after a (fake) canceled header in a detached "
                       "file", ctx)
    else:
        stats.note("damage outside durable snippets", ctx)

    # the state: refused when unrepairable; else what recovery rebuilds from the entries read
    if status == UNREPAIRABLE:
        with pytest.raises(StateRefused):
            directory_state(work)
        with pytest.raises(RepairRefused):
            plan_repair(work)
        return
    rows = state_dict(directory_state(work))
    if spec.status != UNREPAIRABLE and ".compacted" not in name:
        assert rows == model.spec_state(work, spec), ctx
    if status == OK and same_structure:
        assert d["count_durable_wal_entries"] == base.spec.count, ctx
        # only the keys (or storages) of the entries whose bytes changed may differ
        keys, storages = set(), set()
        for o, e in zip(orig_toks, toks):
            if base.data[name][o.offset:o.offset + o.size] == dmg.data[e.offset:e.offset + e.size]:
                continue
            if o.type in model.DATA:
                if o.key is not None:
                    keys |= {(o.storage, o.key), (e.storage, e.key)}
                else:
                    storages |= {o.storage, e.storage}
        differ = {k for k in rows.keys() | base.state.keys() if rows.get(k) != base.state.get(k)}
        assert all(k in keys or k[0] in storages for k in differ), f"{ctx}: state differs at {sorted(differ)[:5]}"
        stats.note("same structure: state changed", ctx, bool(differ))
    if status == REPAIRABLE:
        # Repair of the damaged copy leaves it ok (README). The state may change: a torn durable snippet is
        # canceled, as tglogutil does; how often is recorded.
        copy = scratch / work.name
        shutil.copytree(work, copy)
        rp = plan_repair(copy)
        assert rp.status == REPAIRABLE and rp.needed, ctx
        apply_repair(rp)
        after = dir_report(copy)
        assert after["status"] == OK, f"{ctx}: after repair {after['status']}"
        stats.note("after repair: state changed", ctx, state_dict(directory_state(copy)) != rows)
        shutil.rmtree(scratch)


def test_repair_detaches_a_broken_tail_after_a_canceled_header(tmp_path: Path):
    """After a crash, limestone's own failed start (or an older repair) leaves the crashed snippet's
    header canceled (2 -> 6) and its truncated entry in the active file. tglogutil inspect: that is
    broken_after_marked, auto-repairable; tglogutil repair detaches the file, and in a detached file
    the tail after a canceled header is ignored (spec 1.3, 2). walvault says why it is repairable
    (a finding at the cut entry), and repair detaches the file, which is all it needs."""
    root = tmp_path / "log"
    d = LogDir(root, version=7, channels=1)
    d.session(0, 1, [writer.put(1, b"k", b"v", (1, 1))])
    d.make_durable(1)
    durable_size = (root / "pwal_0000").stat().st_size
    d.raw(0, writer.snippet_header(2, canceled=True) + writer.put(1, b"k", b"w" * 50, (2, 1))[:20])
    d.close()
    assert dir_report(root)["status"] == REPAIRABLE
    report = verify_paths([root], runner=LocalRunner(1)).to_json()
    (active,) = [f for f in report["files"] if f["kind"] == "pwal"]
    assert [(x["code"], x["offset"]) for x in active["findings"]] == [("broken_tail", durable_size + 9)]
    rp = plan_repair(root)
    assert rp.needed
    apply_repair(rp)
    assert dir_report(root)["status"] == OK


@require_limestone
def test_put_type_byte_flipped_to_canceled_in_a_detached_file(tmp_path: Path):
    """In a detached (rotated) v7 file, one put's type byte flipped 01 -> 06 reads as a canceled
    snippet header (with a garbage epoch), and the rest of the file as that snippet's body;
    limestone ignores what follows a canceled header in a detached file (spec 1.3), so tglogutil
    says OK although two durable entries are gone. walvault sees that the durable snippet before it
    has no end marker although the file's sessions end with one, and calls it unrepairable."""
    work = copy_limestone_fixture("10-backup-source", tmp_path, "dir")
    path = work / "pwal_0000.01795335762219.0"
    data = bytearray(path.read_bytes())
    assert data[152] == model.T_PUT  # the epoch-2 put of 100/"k1"
    snippet = max(off for off, t, _ in walk(bytes(data)) if t == 2 and off < 152)  # its snippet header
    data[152] = model.T_CANCELED
    path.write_bytes(bytes(data))
    assert model.spec_dir(work, keep_worse=False).status == OK  # tglogutil's rules see nothing
    d = dir_report(work)
    assert (model.spec_dir(work).status, d["status"]) == (UNREPAIRABLE, UNREPAIRABLE)
    report = verify_paths([work], runner=LocalRunner(1)).to_json()
    (f,) = [x for x in report["files"] if x["path"] == str(path)]
    assert ("unclosed_durable_snippet", snippet) in [(x["code"], x["offset"]) for x in f["findings"]]

"""Benchmark `walvault verify` on a limestone log directory against a bare Python header walk.

    .venv/bin/python bench/verify_limestone.py [--size-mb 3000] [--channels 8] [--dir DIR] [--keep] [--profile]

Generates (or reuses) >= size-mb MB (10**6 bytes) of pwal files (persistent format 7) with
walcore.limestone.writer.LogDir, warms the page cache, then times side by side:

  a. read every pwal file in 4 MiB chunks (the I/O limit; pwal files carry no CRC)
  b. a bare Python loop that only walks entry headers: type byte, the fixed fields that give the
     entry's length (struct), seek past key/value; no checks, no state machine
  c. `walvault verify --jobs 1` (pinned to core 0 when taskset exists)
  d. `walvault verify` with the default jobs (one per core)
  e. for information: walcore.limestone.scan.scan_pwal over every file, in this process (no process start)
  f. for comparison: (c) on the pure-Python scan core (WALVAULT_PURE=1); (c), (d) and (e) run on the
     compiled core walcore._scan when it is built (the first line printed says which)

The scan core's targets are printed on labelled lines (and under "targets" in the JSON): (c) within 2x of
(a), the read floor; (d) at least 1.8x as fast as (c).

The in-process readers (a, b, e) run pinned to core 0 too, so that every one-core figure is
comparable. Each reader runs RUNS times; the table shows the best run (min time) and the median.
Results also go to --json (default bench/out/verify_limestone.json). This is a benchmark: it never fails
on timings; it exits 1 when a reader misses entries or verify does not find the generated files intact.
With --profile, scan_pwal is also run under cProfile on the largest pwal file (top functions printed).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from walcore import scancore
from walcore.limestone.epoch import EPOCH_NAME
from walcore.limestone.manifest import MANIFEST_NAME
from walcore.limestone.pwal import (ADD_STORAGE, CANCELED_HEADER, CLEAR_STORAGE, DURABLE_EPOCH, PUT, PUT_BLOB,
                                    REMOVE, REMOVE_STORAGE, SNIPPET_END, SNIPPET_HEADER)
from walcore.limestone.scan import OK, scan_pwal
from walcore.limestone.writer import LogDir, put, remove, storage_op

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
import common  # noqa: E402
from common import MB, RUNS, WALVAULT  # noqa: E402

SEED = 1
VERSION = 7  # persistent format version: sessions end with a type-3 marker
MIX = "oltp-1"  # bump when the mix below changes, so that stale data is regenerated

# --------------------------------------------------------------------------- the entry mix
#
# Chosen to look like an OLTP log (TPC-C-like traffic on a Tsurugi database), not to reach a
# given throughput:
#  - 12 tables (storage ids 1001..1012), written by CHANNELS log channels (one per worker thread).
#  - Per epoch, each channel commits one session with probability 0.75 (idle workers write nothing
#    in an epoch). A session is one transaction: 1..50 data entries, skewed towards small ones
#    (triangular, mode 4, mean ~18: most OLTP transactions touch a handful of rows, a few touch
#    dozens, like TPC-C new-order with its order lines). All entries of one transaction share its
#    write version (epoch, serial within the epoch).
#  - Data entries: 85 % puts, 15 % removes (deletes, e.g. TPC-C delivery removing new-order rows).
#  - Keys: Tsurugi's order-preserving encoding of a primary key: 8..40 bytes (90 %), composite
#    string keys 41..128 bytes (10 %).
#  - Put values (row images): 90 % 100..500 B (narrow rows: stock, customer, order-line), 9.7 %
#    2..8 KiB (wide rows with text columns), 0.3 % 64..256 KiB (documents / large objects stored
#    inline). The last class is rare but carries a large share of the bytes.
#  - DDL: about one session in 500 is a lone storage op (add_storage for a table being created,
#    clear_storage for a TRUNCATE, remove_storage for a DROP); every table is added in epoch 1.
#  - Durable epochs: one record after ~70 % of the epochs (gaps are normal), and the last epoch
#    is made durable at the end, so every snippet is durable and the directory verifies ok.
TABLES = list(range(1001, 1013))
SESSION_P = 0.75
SESSION_MAX = 50
PUT_P = 0.85
DDL_P = 0.002
VALUE_CLASSES = ((0.90, 100, 500), (0.097, 2 << 10, 8 << 10), (0.003, 64 << 10, 256 << 10))
DURABLE_RECORD_P = 0.7
POOL_BYTES = 1 << 20  # random bytes that keys and values are sliced from (content is irrelevant to a walk)


# --------------------------------------------------------------------------- data


def generate(log: Path, target_bytes: int, channels: int, seed: int) -> dict:
    """Write the directory; returns what was written (entry counts include headers and end markers)."""
    rng = random.Random(seed)
    pool = rng.randbytes(POOL_BYTES)
    cum, acc = [], 0.0
    for p, lo, hi in VALUE_CLASSES:
        acc += p
        cum.append((acc, lo, hi))

    def blob(n: int) -> bytes:
        off = rng.randrange(POOL_BYTES - n)
        return pool[off:off + n]

    def value_len() -> int:
        r = rng.random()
        for edge, lo, hi in cum:
            if r < edge:
                return rng.randint(lo, hi)
        return rng.randint(*cum[-1][1:])

    def key_len() -> int:
        return rng.randint(8, 40) if rng.random() < 0.9 else rng.randint(41, 128)

    stats = {"entries": 0, "put": 0, "remove": 0, "storage_ops": 0, "sessions": 0, "epochs": 0,
             "durable_records": 0, "pwal_bytes": 0, "value_bytes": 0}
    d = LogDir(log, version=VERSION, channels=channels)
    written = 0
    epoch = 0
    while written < target_bytes:
        epoch += 1
        serial = 0
        for ch in range(channels):
            if epoch == 1 and ch == 0:
                entries = [storage_op(ADD_STORAGE, t, (epoch, 0)) for t in TABLES]
                stats["storage_ops"] += len(entries)
            elif rng.random() >= SESSION_P:
                continue
            elif rng.random() < DDL_P:
                serial += 1
                entries = [storage_op(rng.choice((ADD_STORAGE, CLEAR_STORAGE, REMOVE_STORAGE)),
                                      rng.choice(TABLES), (epoch, serial))]
                stats["storage_ops"] += 1
            else:
                serial += 1
                wv = (epoch, serial)
                entries = []
                for _ in range(min(SESSION_MAX, int(rng.triangular(1, SESSION_MAX + 1, 4)))):
                    storage = rng.choice(TABLES)
                    if rng.random() < PUT_P:
                        n = value_len()
                        entries.append(put(storage, blob(key_len()), blob(n), wv))
                        stats["put"] += 1
                        stats["value_bytes"] += n
                    else:
                        entries.append(remove(storage, blob(key_len()), wv))
                        stats["remove"] += 1
            d.session(ch, epoch, entries)
            stats["sessions"] += 1
            stats["entries"] += len(entries) + 2  # header + end marker
            written += 9 + sum(map(len, entries)) + 10
        if rng.random() < DURABLE_RECORD_P:
            d.make_durable(epoch)
            stats["durable_records"] += 1
    d.make_durable(epoch)
    stats["durable_records"] += 1
    d.close()
    stats["epochs"] = epoch
    stats["pwal_bytes"] = written
    return stats


def prepare_data(root: Path, size_mb: int, channels: int) -> tuple[list[Path], dict]:
    """The limestone directory root/log and its pwal files, reused when the stamp says they match."""
    log = root / "log"
    want = {"size_mb": size_mb, "seed": SEED, "channels": channels, "version": VERSION, "mix": MIX}
    if stamp := common.reusable_stamp(root, log, want):
        return sorted(log / name for name in stamp["files"] if name.startswith("pwal_")), stamp["stats"]
    clear_data(root)
    t0 = time.perf_counter()
    stats = generate(log, size_mb * MB, channels, SEED)
    files = sorted(log.iterdir())
    print(f"generated {len(files)} files in {log} in {time.perf_counter() - t0:.1f} s")
    common.write_stamp(root, want, files, stats=stats)
    return [p for p in files if p.name.startswith("pwal_")], stats


def clear_data(root: Path) -> None:
    """Remove only what prepare_data writes."""
    common.clear_data(root, root / "log",
                      lambda p: p.name in (MANIFEST_NAME, EPOCH_NAME) or p.name.startswith("pwal_"))


# --------------------------------------------------------------------------- in-process readers


def read_all(paths: list[Path]) -> dict:
    """(a) The limit: read every byte in 4 MiB chunks into one buffer."""
    total = 0
    for chunk in common.chunks(paths):
        total += len(chunk)
    return {"entries": None, "bytes": total}


_U32_U32 = struct.Struct("<II")  # put: key_len, value_len (then u64 storage_id)
_U32 = struct.Struct("<I")
# bytes after the type byte for the entries of fixed size
_FIXED = {SNIPPET_HEADER: 8, CANCELED_HEADER: 8, DURABLE_EPOCH: 8, SNIPPET_END: 9,
          CLEAR_STORAGE: 24, ADD_STORAGE: 24, REMOVE_STORAGE: 24}


def bare_loop(paths: list[Path]) -> dict:
    """(b) The bare baseline: per entry, the type byte and the length fields, then seek past the rest.

    No checks (an unknown type byte ends the file's walk, only so the loop cannot run away), no
    snippet state, no entry objects. Buffered reads: seeks inside the buffer cost no system call.
    """
    entries = 0
    fixed = _FIXED
    for p in paths:
        with open(p, "rb", buffering=1 << 20) as f:
            read, seek = f.read, f.seek
            while t := read(1):
                kind = t[0]
                if kind == PUT or kind == PUT_BLOB:
                    key_len, value_len = _U32_U32.unpack(read(8))
                    seek(8 + key_len + 16 + value_len, 1)  # storage_id, key, wv, value
                    if kind == PUT_BLOB:
                        (count,) = _U32.unpack(read(4))
                        seek(8 * count, 1)
                elif kind == REMOVE:
                    (key_len,) = _U32.unpack(read(4))
                    seek(8 + key_len + 16, 1)  # storage_id, key, wv
                elif kind in fixed:
                    seek(fixed[kind], 1)
                else:
                    break
                entries += 1
    return {"entries": entries}


def scan_all(paths: list[Path], durable_epoch: int) -> dict:
    """(e) walvault's own per-file scan (limestone's state machine + findings), in this process."""
    entries, bad = 0, []
    for p in paths:
        s = scan_pwal(p, durable_epoch)
        entries += s.entries
        if s.code != OK or s.findings:
            bad.append(p.name)
    return {"entries": entries, "not_ok": bad}


def time_inprocess(fn, paths: list[Path], *args) -> dict:
    runs, result = common.time_runs(fn, paths, *args)
    return {"runs": runs, **result}


class pinned:
    """Run this process on core 0 for the block (the in-process readers), then restore."""

    def __enter__(self):
        self.saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        if self.saved and 0 in self.saved:
            os.sched_setaffinity(0, {0})
        else:
            self.saved = None
        return self

    def __exit__(self, *exc):
        if self.saved:
            os.sched_setaffinity(0, self.saved)


# --------------------------------------------------------------------------- subprocess readers


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            pass
    return out


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeRss(threading.Thread):
    """Samples, every 20 ms, the RSS summed over a process's descendants (the pool workers included); used
    on an untimed run only.

    An upper bound on the memory used together: pages a forked worker still shares with its parent
    are counted in both. /usr/bin/time's %M is the largest single process instead.
    """

    def __init__(self, pid: int, include_root: bool):
        super().__init__(daemon=True)
        self.pid, self.include_root = pid, include_root
        self.peak = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.02):
            pids = _descendants(self.pid) + ([self.pid] if self.include_root else [])
            self.peak = max(self.peak, sum(_rss_kib(p) for p in pids))

    def finish(self) -> int | None:
        """Stops sampling: the peak in KiB (None when no sample saw a process)."""
        self.stop.set()
        self.join()
        return self.peak or None


def sample_tree_rss(pid: int) -> TreeRss | None:
    """A started TreeRss on pid's tree (not pid itself when it is /usr/bin/time); None without /proc."""
    if not Path("/proc/self/task").is_dir():
        return None
    sampler = TreeRss(pid, include_root=not common.GNU_TIME.exists())
    sampler.start()
    return sampler


def verify_entries(report: dict | None) -> dict:
    """The pwal entries and the per-directory summary of a `walvault verify --json` report."""
    if report is None:
        return {"entries": None, "dirs": None}
    return {"entries": sum(f["rows"] for f in report["files"] if f["kind"].startswith("pwal")),
            "dirs": [{k: d[k] for k in ("status", "durable_epoch", "count_durable_wal_entries",
                                        "durable_entries", "snippets")} for d in report["dirs"]]}


def time_verify(data_dir: Path, jobs: int | None, pin: bool, env: dict | None = None) -> dict:
    """(c)/(d) `walvault verify --json` as a subprocess: wall time (process start included) and peak RSS.

    RUNS timed runs, then one more that samples the tree's RSS: the sampler polls /proc and would
    take CPU from the workers of a timed run on a 2-core machine.
    """
    r = common.time_verify(data_dir, jobs, pin, verify_entries, sampler=sample_tree_rss, env=env)
    tree = r.pop("sampled")
    known_tree = [t for t in tree if t is not None]
    return {**r, "jobs": jobs, "tree_rss_kib": max(known_tree) if known_tree else None, "tree_rss_runs_kib": tree}


def time_start(tmp_root: Path) -> dict:
    """For information: `walvault verify --jobs 1` on a tiny directory = the process start + import cost."""
    log = tmp_root / "tiny"
    d = LogDir(log, version=VERSION, channels=1)
    d.session(0, 1, [put(TABLES[0], b"k", b"v", (1, 1))])
    d.make_durable(1)
    d.close()
    cmd = [*common.taskset_core0(), str(WALVAULT), "verify", "--jobs", "1", "--no-progress", str(log)]  # as (c)
    runs, _ = common.time_runs(subprocess.run, cmd, capture_output=True)
    return {"runs": runs, "best_s": min(runs), "median_s": statistics.median(runs)}


# --------------------------------------------------------------------------- report


def profile_scan(path: Path, durable_epoch: int, top: int = 15) -> str:
    prof = cProfile.Profile()
    prof.enable()
    scan_pwal(path, durable_epoch)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=3000, help="pwal data to generate, in 10**6 bytes (default 3000: enough for the fixed costs of process start to fade)")
    ap.add_argument("--channels", type=int, default=8, help="log channels = pwal files (default 8)")
    common.add_data_args(ap, "limestone")
    ap.add_argument("--profile", action="store_true", help="also cProfile scan_pwal on the largest pwal file")
    args = ap.parse_args()

    t_start = time.perf_counter()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    paths, gen = prepare_data(root, args.size_mb, args.channels)
    log = root / "log"
    nbytes = sum(p.stat().st_size for p in paths)
    durable_epoch = gen["epochs"]
    print(f"{len(paths)} pwal files, {nbytes / MB:.1f} MB, {gen['entries']:,} entries "
          f"(average {nbytes / gen['entries']:,.0f} B/entry; {gen['put']:,} puts, {gen['remove']:,} removes, "
          f"{gen['storage_ops']:,} storage ops, {gen['sessions']:,} sessions in {gen['epochs']:,} epochs; "
          f"average put value {gen['value_bytes'] / max(gen['put'], 1):,.0f} B)")
    print(common.cores_and_load(load_before))
    print(f"scan core: {scancore.describe()}")

    read_all(paths)  # warm the page cache: every reader below reads from memory

    with pinned() as pin:
        pinned_inprocess = pin.saved is not None
        core = " (core 0)" if pinned_inprocess else ""
        read = time_inprocess(read_all, paths)
        measured = {f"read limit, 4 MiB chunks{core}": read}
        measured[f"bare Python header walk{core}"] = bare = time_inprocess(bare_loop, paths)
        measured[f"scan_pwal in-process{core}"] = scan = time_inprocess(scan_all, paths, durable_epoch)
    verify_1 = time_verify(log, jobs=1, pin=True)
    measured[f"walvault verify --jobs 1{' (core 0)' if verify_1['pinned'] else ''}"] = verify_1
    verify_n = time_verify(log, jobs=None, pin=False)
    measured[f"walvault verify (default jobs: {os.cpu_count()})"] = verify_n
    verify_pure = time_verify(log, jobs=1, pin=True, env={**os.environ, "WALVAULT_PURE": "1"})
    measured[f"walvault verify --jobs 1, WALVAULT_PURE=1{' (core 0)' if verify_pure['pinned'] else ''}"] = verify_pure
    with tempfile.TemporaryDirectory(prefix="walvault-bench-") as tmp:
        start = time_start(Path(tmp))

    # Entry totals: every reader must have seen what was written.
    wrong = []
    for name, r in measured.items():
        if r["entries"] is not None and r["entries"] != gen["entries"]:
            wrong.append(name)
            print(f"\n!!!!!! ENTRY COUNT MISMATCH: {name} saw {r['entries']:,} entries, "
                  f"{gen['entries']:,} were written !!!!!!\n")
    if scan["not_ok"]:
        wrong.append("scan_pwal")
        print(f"!! scan_pwal found the generated files not ok: {', '.join(scan['not_ok'])}")
    for r in (verify_1, verify_n, verify_pure):
        if any(r["exit_codes"]) or not r["dirs"]:
            wrong.append("walvault verify")
        for d in r["dirs"] or []:
            if d["status"] != "ok" or d["count_durable_wal_entries"] != gen["put"] + gen["remove"]:
                wrong.append("walvault verify")
                print(f"!! verify says {d['status']}, {d['count_durable_wal_entries']:,} durable puts+removes "
                      f"(written: ok, {gen['put'] + gen['remove']:,})")

    results = [common.summarize(name, r, nbytes, "entries") for name, r in measured.items()]
    load_after = os.getloadavg()
    bare_s = min(bare["runs"])
    print()
    common.print_table(results, 38, "entries", "x bare", bare_s,
                       {"peak RSS": "peak_rss_kib", "tree RSS": "tree_rss_kib"})
    print(f"\nMB = 10**6 bytes of pwal files; best of {RUNS} runs; 'x bare' = speed relative to the bare Python "
          f"header walk (> 1 is faster); verify times are wall times including process start "
          f"(a tiny directory takes {start['best_s']:.2f} s); peak RSS = largest single process (/usr/bin/time), "
          f"tree RSS = sampled sum over the process tree (shared pages counted twice)")
    r1, rn = min(verify_1["runs"]), min(verify_n["runs"])
    rss_max = max(x for x in (verify_1["peak_rss_kib"], verify_n["peak_rss_kib"],
                              verify_1["tree_rss_kib"], verify_n["tree_rss_kib"], 0) if x)
    print(f"issue targets (information only): verify --jobs 1 = {bare_s / r1:.2f}x bare (target >= 0.8); "
          f"verify default jobs = {bare_s / rn:.2f}x bare (target >= 1.6); "
          f"peak RSS {rss_max / 1024:.0f} MiB (target < 200 MB)")
    read_s, pure_s = min(read["runs"]), min(verify_pure["runs"])
    targets = {"scan_core": scancore.describe(), "read_floor_s": read_s, "verify_jobs_1_s": r1,
               "verify_default_jobs_s": rn, "verify_jobs_1_pure_s": pure_s, "process_start_s": start["best_s"],
               "jobs_1_over_read_floor": r1 / read_s, "default_jobs_speedup": r1 / rn,
               "pure_over_compiled": pure_s / r1}
    print(f"scan core target: verify --jobs 1 / read floor = {r1:.2f} s / {read_s:.2f} s = "
          f"{targets['jobs_1_over_read_floor']:.2f} (target <= 2; process start included)")
    print(f"scan core target: verify default jobs speedup = {r1:.2f} s / {rn:.2f} s = "
          f"{targets['default_jobs_speedup']:.2f}x --jobs 1 (target >= 1.8)")
    print(f"pure-Python core: verify --jobs 1 with WALVAULT_PURE=1 = {pure_s:.2f} s "
          f"({targets['pure_over_compiled']:.2f}x the compiled core's time)")
    elapsed = time.perf_counter() - t_start
    print(common.load_line(load_before, load_after, elapsed))

    profile = None
    if args.profile:
        largest = max(paths, key=lambda p: p.stat().st_size)
        print(f"\ncProfile of scan_pwal on {largest.name} ({largest.stat().st_size / MB:.1f} MB):")
        profile = profile_scan(largest, durable_epoch)
        print(profile)

    common.write_json(args.json, {
        "data_dir": str(log), "pwal_files": len(paths), "bytes": nbytes, "generated": gen,
        "channels": args.channels, "persistent_format_version": VERSION, "mix": MIX,
        "avg_entry_bytes": nbytes / gen["entries"], "runs_per_reader": RUNS, "cores": os.cpu_count(),
        "inprocess_pinned_core0": pinned_inprocess, "load_avg_before": load_before, "load_avg_after": load_after,
        "python": platform.python_version(), "process_start": start, "elapsed_s": elapsed,
        "ratio_to_bare": {r["reader"]: bare_s / r["best_s"] for r in results}, "targets": targets, "results": results,
        "profile": profile,
    })

    if not args.keep:
        clear_data(root)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark the Spark `verify` job against `walvault verify` on the same data and the same cores.

    .venv/bin/python bench/verify_spark.py [--size-mb 4000] [--rounds 2] [--cluster] [--dir DIR] [--keep]

Generates (or reuses) real-format Tarantool files (the data of bench/verify_tarantool.py: a snapshot and
64 MiB xlogs) and times, round by round, each as a fresh process the way a user runs it:

  a. Spark's start-up: the verify job on one small xlog (`walvault verify X --spark local[2]`)
  b. `walvault verify --jobs 1`             c. `walvault verify` (both cores)
  d. `walvault verify --spark local[1]`     e. `walvault verify --spark local[2]`
  (b and d pinned to core 0, their whole process trees, where taskset exists)
  with --cluster also a real standalone cluster on 127.0.0.1 (one-core workers):
  f. one worker                              g. two workers

and reports local[2] over local[1] (the job's scaling), the job against the CLI on the same cores, and the
share of each job's time that is Spark's start-up. Every reader's JSON must equal the CLI's: the bench exits
1 when it does not (timings never fail it). Results also go to --json (default bench/out/verify_spark.json).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import MB  # noqa: E402
from verify_tarantool import clear_data, prepare_data  # noqa: E402

from spark_jobs.cluster import standalone_cluster  # noqa: E402

ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def walvault(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "walvault"), *args]


def timed(cmd: list[str]) -> dict:
    """A command's wall time (after an untimed sync) and its JSON output."""
    import json

    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **ENV})
    seconds = time.perf_counter() - t0
    if proc.returncode:
        print(f"!! {' '.join(cmd)}: exit {proc.returncode}: {proc.stderr.decode(errors='replace')[-1500:]}")
    return {"runs": [seconds], "rc": [proc.returncode], "out": json.loads(proc.stdout) if proc.stdout.strip() else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cluster", action="store_true", help="also a standalone cluster of one and of two workers")
    common.add_data_args(ap, "spark")
    args = ap.parse_args()
    root = Path(args.dir)
    files = prepare_data(root, args.size_mb)
    data = root / "wal"
    nbytes = sum(p.stat().st_size for p in files)
    print(f"{len(files)} files, {nbytes / MB:,.0f} MB; {common.cores_and_load(os.getloadavg())}")
    for _ in common.chunks(files):  # warm the page cache
        pass
    # One core is one core: the process tree of `--jobs 1` and of local[1] (Spark's JVM and driver included) is
    # pinned to core 0 where taskset exists, else local[1] would use the second core for its JVM.
    pin = common.taskset_core0()
    small = min((p for p in files if p.suffix == ".xlog"), key=lambda p: p.stat().st_size)
    readers = {
        "Spark start-up (verify job on one small xlog, local[2])":
            lambda: timed(walvault("verify", str(small), "--json", "--spark", "local[2]")),
        "walvault verify --jobs 1": lambda: timed(pin + walvault("verify", str(data), "--json", "--jobs", "1")),
        "walvault verify (2 jobs)": lambda: timed(walvault("verify", str(data), "--json")),
        "verify job, local[1]": lambda: timed(pin + walvault("verify", str(data), "--json", "--spark", "local[1]")),
        "verify job, local[2]": lambda: timed(walvault("verify", str(data), "--json", "--spark", "local[2]")),
    }
    started = time.perf_counter()
    results = common.interleave(readers, args.rounds)
    if args.cluster:
        for workers in (1, 2):
            with tempfile.TemporaryDirectory(prefix="walvault-bench-cluster-") as scratch, \
                    standalone_cluster(Path(scratch), workers=workers, cores=1, memory="2g") as master:
                name = f"verify job, standalone cluster of {workers} one-core worker{'s' * (workers > 1)}"
                results.update(common.interleave(
                    {name: lambda m=master: timed(walvault("verify", str(data), "--json", "--spark", m))}, args.rounds))
    ok = True
    reference = results["walvault verify --jobs 1"]["out"]
    for name, r in results.items():
        if set(r["rc"]) != {0}:
            ok = False
            print(f"!! {name}: exit codes {r['rc']}")
        if "start-up" not in name and r["out"] != reference:
            ok = False
            print(f"!! {name}: its report differs from walvault verify's")
    startup = min(results["Spark start-up (verify job on one small xlog, local[2])"]["runs"])
    best = {name: min(r["runs"]) for name, r in results.items()}
    print(f"\n{'reader':<62} {'best s':>7} {'median s':>8} {'MB/s':>6} {'start-up share':>14}")
    for name, r in results.items():
        share = f"{startup / best[name]:.0%}" if name.startswith("verify job") else ""
        print(f"{name:<62} {best[name]:>7.2f} {statistics.median(r['runs']):>8.2f} "
              f"{nbytes / MB / best[name]:>6.0f} {share:>14}")
    ratios = {
        "local[2] over local[1] (scaling, target >= 1.7)": best["verify job, local[1]"] / best["verify job, local[2]"],
        "job local[1] over CLI --jobs 1 (target >= 0.8)": best["walvault verify --jobs 1"] / best["verify job, local[1]"],
        "job local[2] over CLI 2 jobs (target >= 0.8)": best["walvault verify (2 jobs)"] / best["verify job, local[2]"],
        "job local[2] over CLI 2 jobs, start-up left out":
            (best["walvault verify (2 jobs)"]) / (best["verify job, local[2]"] - startup),
    }
    if args.cluster:
        one, two = (best[f"verify job, standalone cluster of {n} one-core worker{'s' * (n > 1)}"] for n in (1, 2))
        ratios["cluster: two workers over one (scaling)"] = one / two
    print()
    for name, value in ratios.items():
        print(f"{name:<52} {value:.2f}x")
    print(common.load_line((0, 0, 0), os.getloadavg(), time.perf_counter() - started))
    for r in results.values():
        r.pop("out")
    common.write_json(Path(args.json), {"bytes": nbytes, "files": len(files), "startup_s": startup,
                                         "results": {n: r for n, r in results.items()}, "ratios": ratios})
    if not args.keep:
        clear_data(root)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

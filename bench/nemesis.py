#!/usr/bin/env python3
"""The fault-injection suite's long runs (issue 22, section 7): random schedules of real `walvault` commands, two
at a time, with faults, over a local repository and S3, then the invariants (tests/nemesis.py says which).

    .venv/bin/python bench/nemesis.py --schedules 500 --seed 1 --storage both --jobs 2 --json bench/out/nemesis.json
    .venv/bin/python bench/nemesis.py --seed S --schedules 1 --storage both   # replay one schedule, with its log

Schedule i runs seed S+i; with `--storage both` a seed's parity picks its storage (even: local, odd: S3), so
`--seed S --schedules 1` replays it as it ran. One line per schedule (its seconds, operations, faults injected,
verdict); a schedule with violations prints them and its operation log. Then the summary: schedules run,
operations, faults by kind, violations by kind with the seeds to replay. Exit 0 when no invariant was violated,
1 otherwise. Runs as root for the tmpfs faults (else they are left out, and the summary says so); `faketime`
(Debian) for the clock offsets.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))
# the walvault subprocesses run this tree's code, as the harness does
os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "plugins"),
                                            *filter(None, [os.environ.get("PYTHONPATH")])])

import nemesis  # noqa: E402


def storage_of(seed: int, storage: str) -> str:
    return ("local", "s3")[seed % 2] if storage == "both" else storage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1, help="the first schedule's seed (schedule i: seed + i)")
    ap.add_argument("--storage", choices=["local", "s3", "both"], default="both")
    ap.add_argument("--json", type=Path, help="write every outcome (with its log) and the summary here")
    ap.add_argument("--jobs", type=int, default=1, help="schedules run at once (each has its own proxy; 2 suits "
                    "two cores: a schedule spends much of its time waiting on one process)")
    ap.add_argument("--log", action="store_true", help="print every schedule's operation log, not only failing ones")
    args = ap.parse_args()

    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # a killed run still tears its schedules down (mounts, processes)
    env = nemesis.Env()
    print(f"nemesis: faketime {'yes' if env.faketime else 'MISSING'}; "
          f"tmpfs {'yes' if env.can_mount else 'NO (not root): full-filesystem faults left out'}", flush=True)
    outcomes = []
    started = time.monotonic()
    seeds = [args.seed + i for i in range(args.schedules)]
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        futures = [pool.submit(nemesis.run_schedule, env, seed, storage_of(seed, args.storage)) for seed in seeds]
        for future in as_completed(futures):
            out = future.result()
            outcomes.append(out)
            print(nemesis.format_outcome(out), flush=True)
            if not out.ok or args.log:
                for v in out.violations:
                    print(f"  {v.kind}: {v.detail}")
                if out.error:
                    print(f"  harness error: {out.error}")
                print("  log:\n" + "\n".join("    " + line for line in out.log), flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        for future in futures:
            future.cancel()
    finally:
        pool.shutdown(wait=True)
        env.close()
    outcomes.sort(key=lambda o: o.seed)
    summary = nemesis.summarize(outcomes)
    summary["wall_seconds"] = round(time.monotonic() - started, 1)
    print("\nsummary:")
    print(f"  schedules run: {summary['schedules']} ({summary['failed_schedules']} with violations), "
          f"operations: {summary['operations']}, {summary['seconds_per_schedule']} s per schedule, "
          f"{summary['wall_seconds']} s in all")
    print("  faults injected: " + (", ".join(f"{k} {n}" for k, n in sorted(summary["faults"].items())) or "none"))
    if summary["violations"]:
        print("  invariant violations:")
        for kind, v in summary["violations"].items():
            print(f"    {kind}: {v['schedules']} schedule(s), seeds {v['seeds']}")
    else:
        print("  invariant violations: none")
    if summary["harness_errors"]:
        print(f"  harness errors (seeds): {summary['harness_errors']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"summary": summary, "schedules": [o.as_dict() for o in outcomes]},
                                        indent=1))
    return 0 if not summary["violations"] and not summary["harness_errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

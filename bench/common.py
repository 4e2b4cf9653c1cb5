"""What the `walvault verify` benchmarks (bench/verify_tarantool.py, bench/verify_limestone.py) share.

Data kept between runs (a stamp next to the data directory), the timing loops (in-process readers
RUNS times; `walvault verify --json` as a subprocess under /usr/bin/time and taskset; or every reader
once per round, interleaved), the summary
of a reader's runs, the table, the load averages and the JSON output. What a benchmark reads, how it
generates its data and what it counts (rows, entries) stay in its script.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WALVAULT = REPO / ".venv" / "bin" / "walvault"
GNU_TIME = Path("/usr/bin/time")
RUNS = 3
CHUNK = 4 << 20
MB = 10**6
STAMP = "stamp.json"


# --------------------------------------------------------------------------- options


def byte_compile() -> None:
    """walvault's modules compiled to bytecode, as a Python that writes it leaves them after a first run (where
    PYTHONDONTWRITEBYTECODE is set, every command would otherwise compile the modules changed since: tens of ms)."""
    import compileall

    for package in ("walcore", "spark_jobs", "plugins"):
        compileall.compile_dir(REPO / package, quiet=1)


def add_data_args(ap: argparse.ArgumentParser, name: str) -> None:
    """--dir (default bench/out/<name>), --json (default bench/out/verify_<name>.json) and --keep."""
    ap.add_argument("--dir", type=Path, default=REPO / "bench" / "out" / name,
                    help=f"where the data lives (default bench/out/{name})")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "out" / f"verify_{name}.json",
                    help=f"where the results go (default bench/out/verify_{name}.json)")
    ap.add_argument("--keep", action="store_true", help="keep the data afterwards so the next run reuses it")


# --------------------------------------------------------------------------- data


def reusable_stamp(root: Path, data: Path, params: dict) -> dict | None:
    """The stamp root/STAMP when it was written for params and every file it lists is in data, same size.

    The stamp lives outside the verified directory data, so that verify never sees it.
    """
    stamp_path = root / STAMP
    if not stamp_path.exists():
        return None
    stamp = json.loads(stamp_path.read_text())
    files = [data / name for name in stamp.get("files", {})]
    if (stamp.get("params") == params and files
            and all(p.is_file() and p.stat().st_size == stamp["files"][p.name] for p in files)):
        print(f"reusing {len(files)} files in {data}")
        return stamp
    return None


def write_stamp(root: Path, params: dict, files: list[Path], **extra) -> None:
    """Records params, extra and the size of every file (what reusable_stamp checks)."""
    (root / STAMP).write_text(json.dumps({"params": params, **extra,
                                          "files": {p.name: p.stat().st_size for p in files}}, indent=1))


def clear_data(root: Path, data: Path, ours: Callable[[Path], bool]) -> None:
    """Remove the stamp and the files in data that ours() accepts, then data if it is empty.

    Only what the benchmark wrote: never rmtree a user-given --dir.
    """
    (root / STAMP).unlink(missing_ok=True)
    if data.is_dir():
        for p in data.iterdir():
            if ours(p):
                p.unlink()
        if not any(data.iterdir()):
            data.rmdir()


# --------------------------------------------------------------------------- in-process readers


def chunks(paths: list[Path]) -> Iterator[memoryview]:
    """Every byte of paths, read in CHUNK-sized pieces into one buffer (each view is valid until the next)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                yield view[:n]


def time_runs(fn: Callable[..., Any], *args, runs: int = RUNS, **kwargs) -> tuple[list[float], Any]:
    """Calls fn `runs` times: the wall time of every call and the last call's result."""
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return times, result


# --------------------------------------------------------------------------- subprocess readers


def taskset_core0() -> list[str]:
    """The command prefix that pins a process to core 0, or [] when taskset is not there."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", "0"] if taskset else []


def time_verify(data_dir: Path, jobs: int | None, pin: bool, parse: Callable[[dict | None], dict],
                sampler: Callable[[int], Any] | None = None, runs: int = RUNS, env: dict | None = None) -> dict:
    """`walvault verify --json` as a subprocess, `runs` times: wall time (process start included) and peak RSS.

    /usr/bin/time's %M, like ru_maxrss of RUSAGE_CHILDREN, is the largest single process
    (main or one worker), not the sum over workers.

    parse(report) gives the fields read from the first usable JSON report (they follow "runs" in the
    result); parse(None) the same fields when no run printed one. With a sampler, one more run follows
    the timed ones, untimed: sampler(pid) is called once it has started and returns None or an object
    whose finish() is called when it has ended; what finish() returns is listed under "sampled". env: the
    processes' environment (default: this one's).
    """
    prefix = taskset_core0() if pin else []
    times, rss, rcs, fields, sampled = [], [], [], None, []
    with tempfile.TemporaryDirectory(prefix="walvault-bench-") as tmp:
        rss_file = Path(tmp) / "rss"
        out_file = Path(tmp) / "out.json"
        cmd = [str(WALVAULT), "verify", "--json", "--no-progress", str(data_dir)]
        if jobs is not None:
            cmd[2:2] = ["--jobs", str(jobs)]
        if GNU_TIME.exists():
            cmd = [str(GNU_TIME), "-f", "%M", "-o", str(rss_file), *cmd]
        cmd = [*prefix, *cmd]
        for k in range(runs + (sampler is not None)):
            timed = k < runs
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            with open(out_file, "wb") as out, tempfile.TemporaryFile() as err:
                t0 = time.perf_counter()
                proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
                watch = None if timed else sampler(proc.pid)
                proc.wait()
                if timed:
                    times.append(time.perf_counter() - t0)
                if watch is not None:
                    sampled.append(watch.finish())
                err.seek(0)
                stderr = err.read().decode(errors="replace")
            after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            rcs.append(proc.returncode)
            if GNU_TIME.exists():
                rss.append(int(rss_file.read_text().split()[-1]))
            else:
                # the children's maximum so far: only meaningful when this call raised it
                rss.append(after if after > before else None)
            if fields is None:
                try:
                    fields = parse(json.loads(out_file.read_text()))
                except (ValueError, KeyError, TypeError):
                    print(f"!! walvault verify printed no JSON (rc {proc.returncode}): {stderr[-2000:]}")
    if any(rcs):
        print(f"!! walvault verify exit codes {rcs} (0 = intact)")
    known = [r for r in rss if r is not None]
    result = {"runs": times, **(fields if fields is not None else parse(None)), "exit_codes": rcs,
              "pinned": bool(prefix), "peak_rss_kib": max(known) if known else None, "rss_runs_kib": rss,
              "rss_source": "/usr/bin/time %M" if GNU_TIME.exists() else "getrusage(RUSAGE_CHILDREN)"}
    if sampler is not None:
        result["sampled"] = sampled
    return result


def interleave(readers: dict[str, Callable[[], dict]], rounds: int) -> dict[str, dict]:
    """Call every reader once per round, in turn, for `rounds` rounds, and join what they return.

    A machine that slows down for a while (a shared VM does) then slows every reader alike, and the
    per-round ratios stay honest. Each reader returns a result of one run; list fields ("runs",
    "rss_runs_kib", "exit_codes") are joined, "peak_rss_kib" is the largest, the rest is the first round's.
    """
    joined: dict[str, dict] = {}
    for _ in range(rounds):
        for name, reader in readers.items():
            r = reader()
            if name not in joined:
                joined[name] = r
                continue
            j = joined[name]
            for key, value in r.items():
                if isinstance(value, list):
                    j[key] = j[key] + value
            peaks = [x for x in (j.get("peak_rss_kib"), r.get("peak_rss_kib")) if x is not None]
            if peaks:
                j["peak_rss_kib"] = max(peaks)
    return joined


# --------------------------------------------------------------------------- report


def summarize(name: str, r: dict, nbytes: int, count: str) -> dict:
    """The best and median run of a reader, in seconds, MB/s and r[count] per second (None without a count)."""
    best, median = min(r["runs"]), statistics.median(r["runs"])
    n = r[count]  # None for the read limit, which sees no rows or entries
    return {"reader": name, **r, "best_s": best, "median_s": median,
            "mb_s": nbytes / MB / best, "median_mb_s": nbytes / MB / median,
            f"{count}_s": n / best if n else None}


def print_table(results: list[dict], reader_width: int, count: str, ratio_head: str, ref_s: float | None,
                mib: dict[str, str], ref_runs: list[float] | None = None) -> None:
    """One row per summarized reader: times, MB/s, {count}/s, speed relative to ref_s seconds (column
    ratio_head, '-' without ref_s), then one column per mib item (head: the result's key in KiB).

    With ref_runs (the reference's runs, interleaved with every reader's), one more column after
    ratio_head: the median over rounds of the reference's time over the reader's in the same round.
    """
    rw = len(ratio_head)
    median_head = f"median {ratio_head}" if ref_runs else ""
    head = (f"{'reader':<{reader_width}} {'best s':>7} {'median s':>8} {'MB/s':>7} {count + '/s':>10} "
            f"{ratio_head:>{rw}}" + (f" {median_head}" if ref_runs else "") + "".join(f" {h:>9}" for h in mib))
    print(head)
    print("-" * len(head))
    for r in results:
        per_s = f"{r[count + '_s'] / 1e3:,.0f} k" if r[count + "_s"] else "-"
        ratio = f"{ref_s / r['best_s']:.2f}" if ref_s else "-"
        ratios = f"{ratio:>{rw}}"
        if ref_runs:
            ratios += f" {median_ratio(ref_runs, r['runs']):>{len(median_head)}.2f}"
        sizes = "".join(f" {f'{r[k] / 1024:.0f} MiB' if r.get(k) else '-':>9}" for k in mib.values())
        print(f"{r['reader']:<{reader_width}} {r['best_s']:>7.2f} {r['median_s']:>8.2f} {r['mb_s']:>7.0f} "
              f"{per_s:>10} {ratios}{sizes}")


def median_ratio(ref_runs: list[float], runs: list[float]) -> float:
    """The median over rounds of ref_runs[i] / runs[i]: how many times faster than the reference."""
    return statistics.median(a / b for a, b in zip(ref_runs, runs, strict=True))


def cores_and_load(load: tuple[float, float, float]) -> str:
    return f"{os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in load)}"


def load_line(before: tuple[float, float, float], after: tuple[float, float, float], elapsed: float) -> str:
    return f"load average before {before[0]:.2f}, after {after[0]:.2f} (1 min); whole run {elapsed:.0f} s"


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")

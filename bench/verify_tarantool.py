"""Benchmark `walvault verify` against real Tarantool's xlog.pairs() and plain Python readers.

    .venv/bin/python bench/verify_tarantool.py [--size-mb 220] [--dir DIR] [--keep]

Generates (or reuses) >= size-mb MB (10**6 bytes) of real-format Tarantool files with
walcore.tarantool.writer.generate_wal, warms the page cache, then times side by side:

  a. read + CRC-32C in 4 MiB chunks (the I/O + checksum limit)
  b. a plain Python loop: blocks + CRC + zstd + msgpack (decode every row header, skip every body)
  c. Tarantool's own xlog.pairs() over all rows (timed inside Lua)
  d. `walvault verify --jobs 1` (pinned to core 0 when taskset exists)
  e. `walvault verify` with the default jobs (one per core)

Each reader runs RUNS times; the table shows the best run (min time) and the median.
Results also go to bench/out/verify_tarantool.json. This is a benchmark: it never fails on timings.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import crc32c
import msgpack
import zstandard

from walcore.tarantool.block import EOF_MAGIC, FIXHEADER_SIZE, parse_fixheader
from walcore.tarantool.writer import generate_wal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import tarantool_real  # noqa: E402  (test support module, stdlib only)

OUT_JSON = REPO / "bench" / "out" / "verify_tarantool.json"
WALVAULT = REPO / ".venv" / "bin" / "walvault"
RUNS = 3
SEED = 1
FILE_BYTES = 64 << 20
CHUNK = 4 << 20
MB = 10**6
STAMP = "stamp.json"


# --------------------------------------------------------------------------- data


def prepare_data(root: Path, size_mb: int) -> list[Path]:
    """Files under root/wal (a .snap, then xlogs), reused when the stamp says they match."""
    wal = root / "wal"  # the stamp lives outside the verified dir so verify never sees it
    stamp_path = root / STAMP
    want = {"size_mb": size_mb, "seed": SEED, "file_bytes": FILE_BYTES}
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        files = [wal / name for name in stamp.get("files", {})]
        if (stamp.get("params") == want and files
                and all(p.is_file() and p.stat().st_size == stamp["files"][p.name] for p in files)):
            print(f"reusing {len(files)} files in {wal}")
            return files
    clear_data(root)
    t0 = time.perf_counter()
    files = generate_wal(wal, target_bytes=size_mb * MB, seed=SEED, file_bytes=FILE_BYTES)
    print(f"generated {len(files)} files in {wal} in {time.perf_counter() - t0:.1f} s")
    stamp_path.write_text(json.dumps({"params": want, "files": {p.name: p.stat().st_size for p in files}}, indent=1))
    return files


def clear_data(root: Path) -> None:
    """Remove only what prepare_data writes (never rmtree a user-given --dir)."""
    (root / STAMP).unlink(missing_ok=True)
    wal = root / "wal"
    if wal.is_dir():
        for p in wal.iterdir():
            if p.suffix in (".snap", ".xlog", ".inprogress"):
                p.unlink()
        if not any(wal.iterdir()):
            wal.rmdir()


# --------------------------------------------------------------------------- in-process readers


def read_crc(paths: list[Path]) -> dict:
    """(a) The limit: read every byte in 4 MiB chunks into one buffer and CRC it."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    crc = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                crc = crc32c.crc32c(view[:n], crc)
    return {"rows": None, "crc": crc}


def python_loop(paths: list[Path]) -> dict:
    """(b) The plain Python baseline: every block's frame, CRC and zstd, every row header decoded."""
    dctx = zstandard.ZstdDecompressor()
    rows = 0
    for p in paths:
        data = memoryview(p.read_bytes())
        pos = bytes(data[:4096]).index(b"\n\n") + 2  # the text meta block ends with an empty line
        end = len(data)
        while pos < end and data[pos:pos + 4] != EOF_MAGIC:  # the newest xlog has no EOF marker
            compressed, length, crc = parse_fixheader(data[pos:pos + FIXHEADER_SIZE])
            pos += FIXHEADER_SIZE
            payload = data[pos:pos + length]
            pos += length
            # Tarantool's CRC-32C: init 0, no final xor (see shared/docs/tarantool-files.md)
            if crc32c.crc32c(payload, 0xFFFFFFFF) ^ 0xFFFFFFFF != crc:
                raise ValueError(f"{p}: crc mismatch at {pos - length - FIXHEADER_SIZE}")
            if compressed:
                # frames carry no content size: ZstdDecompressor().decompress() refuses them
                payload = dctx.decompressobj().decompress(payload)
            unpacker = msgpack.Unpacker(strict_map_key=False)  # row maps have int keys
            unpacker.feed(payload)
            n = len(payload)
            while unpacker.tell() < n:
                header = unpacker.unpack()
                if header.get(0) != 12:  # NOP rows have no body
                    unpacker.skip()
                rows += 1
    return {"rows": rows}


def time_inprocess(fn, paths: list[Path]) -> dict:
    runs, result = [], {}
    for _ in range(RUNS):
        t0 = time.perf_counter()
        result = fn(paths)
        runs.append(time.perf_counter() - t0)
    return {"runs": runs, "rows": result["rows"]}


# --------------------------------------------------------------------------- subprocess readers


def time_xlog_pairs(paths: list[Path]) -> dict:
    """(c) Tarantool's xlog.pairs(); seconds are measured inside Lua (no process start)."""
    runs, rows = [], None
    for _ in range(RUNS):
        r = tarantool_real.time_xlog_pairs(paths)
        runs.append(r["seconds"])
        rows = r["rows"]
    return {"runs": runs, "rows": rows}


def time_verify(data_dir: Path, jobs: int | None, pin: bool) -> dict:
    """(d)/(e) `walvault verify --json` as a subprocess: wall time (process start included) and peak RSS.

    /usr/bin/time's %M, like ru_maxrss of RUSAGE_CHILDREN, is the largest single process
    (main or one worker), not the sum over workers.
    """
    gnu_time = Path("/usr/bin/time")
    taskset = shutil.which("taskset") if pin else None
    runs, rss, rows, rcs = [], [], None, []
    with tempfile.TemporaryDirectory(prefix="walvault-bench-") as tmp:
        rss_file = Path(tmp) / "rss"
        for _ in range(RUNS):
            cmd = [str(WALVAULT), "verify", "--json", "--no-progress", str(data_dir)]
            if jobs is not None:
                cmd[2:2] = ["--jobs", str(jobs)]
            if gnu_time.exists():
                cmd = [str(gnu_time), "-f", "%M", "-o", str(rss_file), *cmd]
            if taskset:
                cmd = [taskset, "-c", "0", *cmd]
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            runs.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            rcs.append(proc.returncode)
            if gnu_time.exists():
                rss.append(int(rss_file.read_text().split()[-1]))
            else:
                # the children's maximum so far: only meaningful when this call raised it
                rss.append(after if after > before else None)
            if rows is None:
                try:
                    rows = sum(f["rows"] for f in json.loads(proc.stdout)["files"])
                except (ValueError, KeyError, TypeError):
                    print(f"!! walvault verify printed no JSON (rc {proc.returncode}): {proc.stderr[-2000:]}")
    if any(rcs):
        print(f"!! walvault verify exit codes {rcs} (0 = intact)")
    known = [r for r in rss if r is not None]
    return {"runs": runs, "rows": rows, "exit_codes": rcs, "pinned": bool(taskset),
            "peak_rss_kib": max(known) if known else None, "rss_runs_kib": rss,
            "rss_source": "/usr/bin/time %M" if gnu_time.exists() else "getrusage(RUSAGE_CHILDREN)"}


# --------------------------------------------------------------------------- report


def summarize(name: str, r: dict, nbytes: int) -> dict:
    best, median = min(r["runs"]), statistics.median(r["runs"])
    rows = r["rows"]  # None for the read + CRC limit, which sees no rows
    return {"reader": name, **r, "best_s": best, "median_s": median,
            "mb_s": nbytes / MB / best, "median_mb_s": nbytes / MB / median,
            "rows_s": rows / best if rows else None}


def print_table(results: list[dict], pairs_s: float | None) -> None:
    head = f"{'reader':<36} {'best s':>7} {'median s':>8} {'MB/s':>7} {'rows/s':>10} {'x pairs':>7} {'peak RSS':>9}"
    print(head)
    print("-" * len(head))
    for r in results:
        ratio = f"{pairs_s / r['best_s']:.2f}" if pairs_s else "-"
        rows_s = f"{r['rows_s'] / 1e3:,.0f} k" if r["rows_s"] else "-"
        rss = f"{r['peak_rss_kib'] / 1024:.0f} MiB" if r.get("peak_rss_kib") else "-"
        print(f"{r['reader']:<36} {r['best_s']:>7.2f} {r['median_s']:>8.2f} {r['mb_s']:>7.0f} "
              f"{rows_s:>10} {ratio:>7} {rss:>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=220, help="data to generate, in 10**6 bytes (default 220)")
    ap.add_argument("--dir", type=Path, default=REPO / "bench" / "out" / "tarantool",
                    help="where the data lives (default bench/out/tarantool)")
    ap.add_argument("--keep", action="store_true", help="keep the data afterwards so the next run reuses it")
    args = ap.parse_args()

    t_start = time.perf_counter()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    paths = prepare_data(root, args.size_mb)
    nbytes = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {nbytes / MB:.1f} MB; {os.cpu_count()} cores; "
          f"load average {' '.join(f'{x:.2f}' for x in load_before)}")

    read_crc(paths)  # warm the page cache: every reader below reads from memory

    measured = {"read + CRC-32C (4 MiB chunks)": time_inprocess(read_crc, paths)}
    measured["plain Python: blocks+CRC+zstd+msgpack"] = time_inprocess(python_loop, paths)
    if tarantool_real.TARANTOOL:
        measured["Tarantool xlog.pairs (all rows)"] = time_xlog_pairs(paths)
    else:
        print("!! tarantool not on PATH: xlog.pairs skipped")
    verify_1 = time_verify(root / "wal", jobs=1, pin=True)
    measured[f"walvault verify --jobs 1{' (core 0)' if verify_1['pinned'] else ''}"] = verify_1
    measured["walvault verify (default jobs)"] = time_verify(root / "wal", jobs=None, pin=False)

    # Row totals: walvault's per-file rows must equal what Tarantool's own reader sees.
    rows = verify_1["rows"]
    pairs = measured.get("Tarantool xlog.pairs (all rows)")
    for name, r in measured.items():
        if r["rows"] is not None and rows is not None and r["rows"] != rows:
            print(f"\n!!!!!! ROW COUNT MISMATCH: {name} read {r['rows']:,} rows, walvault verify {rows:,} !!!!!!\n")

    results = [summarize(name, r, nbytes) for name, r in measured.items()]
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - t_start
    print()
    print_table(results, min(pairs["runs"]) if pairs else None)
    print(f"\ntotals: {nbytes:,} bytes, {rows:,} rows (walvault verify --json)" if rows is not None else "")
    print(f"MB = 10**6 bytes; best of {RUNS} runs; 'x pairs' = speed relative to xlog.pairs (> 1 is faster); "
          f"verify times are wall times including process start")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); whole run {elapsed:.0f} s")

    OUT_JSON.parent.mkdir(parents=True, exist_ok=True)
    OUT_JSON.write_text(json.dumps({
        "data_dir": str(root / "wal"), "files": len(paths), "bytes": nbytes, "rows": rows,
        "rows_xlog_pairs": pairs["rows"] if pairs else None, "runs_per_reader": RUNS,
        "cores": os.cpu_count(), "load_avg_before": load_before, "load_avg_after": load_after,
        "python": platform.python_version(), "tarantool": tarantool_real.TARANTOOL,
        "elapsed_s": elapsed, "results": results,
    }, indent=1) + "\n")
    print(f"wrote {OUT_JSON}")

    if not args.keep:
        clear_data(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())

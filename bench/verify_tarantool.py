"""Benchmark `walvault verify` against real Tarantool's xlog.pairs() and plain Python readers.

    .venv/bin/python bench/verify_tarantool.py [--size-mb 220] [--dir DIR] [--keep]

Generates (or reuses) >= size-mb MB (10**6 bytes) of real-format Tarantool files with
walcore.tarantool.writer.generate_wal, warms the page cache, then times side by side:

  a. read + CRC-32C in 4 MiB chunks (the I/O + checksum limit)
  b. a plain Python loop: blocks + CRC + zstd + msgpack (decode every row header, skip every body)
  c. Tarantool's own xlog.pairs() over all rows (timed inside Lua)
  d. walcore's scan_file over each file, in process: verify's per-file work without process start,
     verdicts and chain checks (like for like with b)
  e. `walvault verify --jobs 1` (pinned to core 0 when taskset exists)
  f. `walvault verify` with the default jobs (one per core)

The readers take turns: each runs once per round, for --rounds rounds (default 5), so that a machine
slowing down for a while (a shared VM does) slows them all alike. The table shows each reader's best
run (min time) and median, its speed relative to xlog.pairs from the best runs, and the median over
rounds of that ratio within a round. Results also go to --json (default bench/out/verify_tarantool.json).
This is a benchmark: it never fails on timings. It exits 1 when a reader's row total differs from
walvault's, or verify finds the generated files not intact.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import crc32c
import msgpack
import zstandard

from walcore.tarantool.block import EOF_MAGIC, FIXHEADER_SIZE, parse_fixheader
from walcore.tarantool.writer import generate_wal
from walcore.tarantool.xlog import scan_file

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
import common  # noqa: E402
from common import MB  # noqa: E402

sys.path.insert(0, str(common.REPO / "tests"))
import tarantool_real  # noqa: E402  (test support module, stdlib only)

SEED = 1
FILE_BYTES = 64 << 20


# --------------------------------------------------------------------------- data


def prepare_data(root: Path, size_mb: int) -> list[Path]:
    """Files under root/wal (a .snap, then xlogs), reused when the stamp says they match."""
    wal = root / "wal"
    want = {"size_mb": size_mb, "seed": SEED, "file_bytes": FILE_BYTES}
    if stamp := common.reusable_stamp(root, wal, want):
        return [wal / name for name in stamp["files"]]
    clear_data(root)
    t0 = time.perf_counter()
    files = generate_wal(wal, target_bytes=size_mb * MB, seed=SEED, file_bytes=FILE_BYTES)
    print(f"generated {len(files)} files in {wal} in {time.perf_counter() - t0:.1f} s")
    common.write_stamp(root, want, files)
    return files


def clear_data(root: Path) -> None:
    """Remove only what prepare_data writes."""
    common.clear_data(root, root / "wal", lambda p: p.suffix in (".snap", ".xlog", ".inprogress"))


# --------------------------------------------------------------------------- in-process readers


def read_crc(paths: list[Path]) -> dict:
    """(a) The limit: read every byte in 4 MiB chunks into one buffer and CRC it."""
    crc = 0
    for chunk in common.chunks(paths):
        crc = crc32c.crc32c(chunk, crc)
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


def walcore_scan(paths: list[Path]) -> dict:
    """(d) walcore's scan of every file: every block and every row checked, in this process."""
    rows = 0
    for p in paths:
        scan = scan_file(p)
        if scan.findings:
            raise ValueError(f"{p}: {scan.findings[0].message}")
        rows += scan.span.rows
    return {"rows": rows}


def time_inprocess(fn, paths: list[Path]) -> dict:
    runs, result = common.time_runs(fn, paths, runs=1)
    return {"runs": runs, "rows": result["rows"]}


# --------------------------------------------------------------------------- subprocess readers


def time_xlog_pairs(paths: list[Path]) -> dict:
    """(c) Tarantool's xlog.pairs(); seconds are measured inside Lua (no process start)."""
    r = tarantool_real.time_xlog_pairs(paths)
    return {"runs": [r["seconds"]], "rows": r["rows"]}


def verify_rows(report: dict | None) -> dict:
    """The rows over all files of a `walvault verify --json` report."""
    return {"rows": sum(f["rows"] for f in report["files"]) if report is not None else None}


def time_verify(data_dir: Path, jobs: int | None, pin: bool) -> dict:
    """(e)/(f) `walvault verify --json` as a subprocess: wall time (process start included) and peak RSS."""
    return common.time_verify(data_dir, jobs, pin, verify_rows, runs=1)


# --------------------------------------------------------------------------- report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=220, help="data to generate, in 10**6 bytes (default 220)")
    ap.add_argument("--rounds", type=int, default=5, help="runs of every reader, taken in turns (default 5)")
    common.add_data_args(ap, "tarantool")
    args = ap.parse_args()

    t_start = time.perf_counter()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    paths = prepare_data(root, args.size_mb)
    nbytes = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {nbytes / MB:.1f} MB; {common.cores_and_load(load_before)}")

    read_crc(paths)  # warm the page cache: every reader below reads from memory

    readers = {
        "read + CRC-32C (4 MiB chunks)": lambda: time_inprocess(read_crc, paths),
        "plain Python: blocks+CRC+zstd+msgpack": lambda: time_inprocess(python_loop, paths),
    }
    if tarantool_real.TARANTOOL:
        readers["Tarantool xlog.pairs (all rows)"] = lambda: time_xlog_pairs(paths)
    else:
        print("!! tarantool not on PATH: xlog.pairs skipped")
    readers["walcore scan_file, in process"] = lambda: time_inprocess(walcore_scan, paths)
    pinned = " (core 0)" if common.taskset_core0() else ""
    readers[f"walvault verify --jobs 1{pinned}"] = lambda: time_verify(root / "wal", jobs=1, pin=True)
    readers["walvault verify (default jobs)"] = lambda: time_verify(root / "wal", jobs=None, pin=False)
    measured = common.interleave(readers, args.rounds)
    verify_1 = measured[f"walvault verify --jobs 1{pinned}"]

    # Row totals: walvault's per-file rows must equal what Tarantool's own reader sees.
    rows = verify_1["rows"]
    pairs = measured.get("Tarantool xlog.pairs (all rows)")
    wrong = [name for name, r in measured.items()
             if any(r.get("exit_codes", ())) or (r["rows"] is not None and r["rows"] != rows)]
    for name in wrong:
        print(f"\n!!!!!! {name}: {measured[name]['rows']} rows (walvault verify --jobs 1: {rows}), "
              f"exit codes {measured[name].get('exit_codes')} !!!!!!\n")

    results = [common.summarize(name, r, nbytes, "rows") for name, r in measured.items()]
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - t_start
    print()
    common.print_table(results, 36, "rows", "x pairs", min(pairs["runs"]) if pairs else None,
                       {"peak RSS": "peak_rss_kib"}, ref_runs=pairs["runs"] if pairs else None)
    print(f"\ntotals: {nbytes:,} bytes, {rows:,} rows (walvault verify --json)" if rows is not None else "")
    print(f"MB = 10**6 bytes; {args.rounds} rounds; 'x pairs' = speed relative to xlog.pairs (> 1 is faster), "
          f"best run over best run; 'median x pairs' = the median of that ratio within each round; "
          f"verify times are wall times including process start")
    print(common.load_line(load_before, load_after, elapsed))

    common.write_json(args.json, {
        "data_dir": str(root / "wal"), "files": len(paths), "bytes": nbytes, "rows": rows,
        "rows_xlog_pairs": pairs["rows"] if pairs else None, "runs_per_reader": args.rounds,
        "cores": os.cpu_count(), "load_avg_before": load_before, "load_avg_after": load_after,
        "python": platform.python_version(), "tarantool": tarantool_real.TARANTOOL,
        "elapsed_s": elapsed, "results": results,
    })

    if not args.keep:
        clear_data(root)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

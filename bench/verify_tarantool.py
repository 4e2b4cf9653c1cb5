"""Benchmark `walvault verify` against real Tarantool's xlog.pairs(), the physical floor and plain Python.

    .venv/bin/python bench/verify_tarantool.py [--size-mb 220] [--shapes one_row,multi_row] [--dir DIR] [--keep]

For each data shape, generates (or reuses) >= size-mb MB (10**6 bytes) of real-format Tarantool files with
walcore.tarantool.writer.generate_wal: "one_row", one single-statement transaction per block (no zstd: a
busy instance's typical log); "multi_row", transactions of 10-40 statements, nearly every block zstd. It warms
the page cache, then times side by side:

  a. the floor: each file read whole into one buffer, CRC-32C over all of it, every zstd block decompressed
     (zstandard, as walvault does): what no verification can go below
  b. a plain Python loop: blocks + CRC + zstd + msgpack (decode every row header, skip every body)
  c. Tarantool's own xlog.pairs() over all rows (timed inside Lua)
  d. walcore's scan_file over each file, in process, with the compiled scan core: verify's per-file work
     without process start, verdicts and chain checks; and d'. the same with the pure-Python reference
  e. `walvault verify --jobs 1` (pinned to core 0 when taskset exists)
  f. `walvault verify` with the default jobs (one per core)
  g. start-up: `walvault verify` of one small file, compiled core and WALVAULT_PURE=1

and prints the issue's targets: e >= 3x c and f >= 5x c, d within 1.5x of a, verify's peak RSS < 200 MB.

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
import subprocess
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
from tarantool_bytes import framing  # noqa: E402  (the tests' independent reader of the framing)

SEED = 1
FILE_BYTES = 64 << 20


# --------------------------------------------------------------------------- data


def prepare_data(root: Path, size_mb: int, shape: str = "mixed") -> list[Path]:
    """Files under root/wal (a .snap, then xlogs), reused when the stamp says they match."""
    wal = root / "wal"
    want = {"size_mb": size_mb, "seed": SEED, "file_bytes": FILE_BYTES, "shape": shape}
    if stamp := common.reusable_stamp(root, wal, want):
        return [wal / name for name in stamp["files"]]
    clear_data(root)
    t0 = time.perf_counter()
    files = generate_wal(wal, target_bytes=size_mb * MB, seed=SEED, file_bytes=FILE_BYTES, shape=shape)
    print(f"generated {len(files)} files in {wal} in {time.perf_counter() - t0:.1f} s")
    common.write_stamp(root, want, files)
    return files


def clear_data(root: Path) -> None:
    """Remove only what prepare_data writes."""
    common.clear_data(root, root / "wal", lambda p: p.suffix in (".snap", ".xlog", ".inprogress"))


# --------------------------------------------------------------------------- in-process readers


def read_crc(paths: list[Path]) -> dict:
    """Read every byte in 4 MiB chunks into one buffer and CRC it (warms the page cache)."""
    crc = 0
    for chunk in common.chunks(paths):
        crc = crc32c.crc32c(chunk, crc)
    return {"rows": None, "crc": crc}


def zstd_blocks(paths: list[Path]) -> dict[Path, list[tuple[int, int]]]:
    """(offset, length) of every zstd payload, per file: found before the floor is timed."""
    return {p: [(b.pos + FIXHEADER_SIZE, b.length) for b in framing(p.read_bytes()).blocks if b.kind == "zstd"]
            for p in paths}


def floor(paths: list[Path], zstd: dict[Path, list[tuple[int, int]]]) -> dict:
    """(a) The floor: each file read once into one buffer, CRC-32C over every byte, every zstd frame decompressed."""
    buf = bytearray(max(p.stat().st_size for p in paths))
    view = memoryview(buf)
    dctx = zstandard.ZstdDecompressor()
    crc = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            n = f.readinto(buf)
        crc = crc32c.crc32c(view[:n], crc)
        for pos, length in zstd[p]:
            dctx.decompressobj().decompress(view[pos:pos + length])
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


def time_inprocess(fn, *args, pure: bool = False) -> dict:
    if pure:
        os.environ["WALVAULT_PURE"] = "1"
    try:
        runs, result = common.time_runs(fn, *args, runs=1)
    finally:
        os.environ.pop("WALVAULT_PURE", None)
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


def time_start_up(small: Path, pure: bool) -> dict:
    """(g) `walvault verify` of one small file, five times: the CLI's start-up with either core."""
    env = dict(os.environ, WALVAULT_PURE="1") if pure else {k: v for k, v in os.environ.items() if k != "WALVAULT_PURE"}
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([str(common.WALVAULT), "verify", "--no-progress", str(small)], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        runs.append(time.perf_counter() - t0)
    return {"runs": [min(runs)], "rows": None}


# --------------------------------------------------------------------------- report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=220, help="data per shape, in 10**6 bytes (default 220)")
    ap.add_argument("--shapes", default="one_row,multi_row", help="data shapes (default one_row,multi_row)")
    ap.add_argument("--rounds", type=int, default=5, help="runs of every reader, taken in turns (default 5)")
    common.add_data_args(ap, "tarantool")
    args = ap.parse_args()

    t_start = time.perf_counter()
    root = args.dir.resolve()
    load_before = os.getloadavg()
    shapes, wrong = {}, []
    for shape in args.shapes.split(","):
        shapes[shape] = run_shape(root / shape, shape, args, wrong)
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - t_start
    print(common.load_line(load_before, load_after, elapsed))
    common.write_json(args.json, {
        "shapes": shapes, "runs_per_reader": args.rounds, "cores": os.cpu_count(), "load_avg_before": load_before,
        "load_avg_after": load_after, "python": platform.python_version(), "tarantool": tarantool_real.TARANTOOL,
        "elapsed_s": elapsed,
    })
    return 1 if wrong else 0


def run_shape(root: Path, shape: str, args, wrong: list[str]) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    paths = prepare_data(root, args.size_mb, shape)
    nbytes = sum(p.stat().st_size for p in paths)
    zstd = zstd_blocks(paths)
    print(f"\n=== shape {shape}: {len(paths)} files, {nbytes / MB:.1f} MB, "
          f"{sum(map(len, zstd.values()))} zstd blocks; {common.cores_and_load(os.getloadavg())}")
    read_crc(paths)  # warm the page cache: every reader below reads from memory

    floor_name = "floor: read + CRC-32C + zstd"
    readers = {
        floor_name: lambda: time_inprocess(floor, paths, zstd),
        "plain Python: blocks+CRC+zstd+msgpack": lambda: time_inprocess(python_loop, paths),
    }
    if tarantool_real.TARANTOOL:
        readers["Tarantool xlog.pairs (all rows)"] = lambda: time_xlog_pairs(paths)
    else:
        print("!! tarantool not on PATH: xlog.pairs skipped")
    readers["walcore scan_file, in process"] = lambda: time_inprocess(walcore_scan, paths)
    readers["walcore scan_file, in process, pure Python"] = lambda: time_inprocess(walcore_scan, paths, pure=True)
    pinned = " (core 0)" if common.taskset_core0() else ""
    one_core = f"walvault verify --jobs 1{pinned}"
    readers[one_core] = lambda: time_verify(root / "wal", jobs=1, pin=True)
    readers["walvault verify (default jobs)"] = lambda: time_verify(root / "wal", jobs=None, pin=False)
    small = min(paths, key=lambda p: p.stat().st_size)
    readers["start-up: verify of one small file"] = lambda: time_start_up(small, pure=False)
    readers["start-up: verify of one small file, pure Python"] = lambda: time_start_up(small, pure=True)
    measured = common.interleave(readers, args.rounds)

    # Row totals: walvault's per-file rows must equal what Tarantool's own reader sees.
    rows = measured[one_core]["rows"]
    pairs = measured.get("Tarantool xlog.pairs (all rows)")
    for name, r in measured.items():
        if any(r.get("exit_codes", ())) or (r["rows"] is not None and r["rows"] != rows):
            wrong.append(f"{shape}: {name}")
            print(f"\n!!!!!! {name}: {r['rows']} rows (walvault verify --jobs 1: {rows}), "
                  f"exit codes {r.get('exit_codes')} !!!!!!\n")

    results = [common.summarize(name, r, nbytes, "rows") for name, r in measured.items()]
    print()
    common.print_table(results, 48, "rows", "x pairs", min(pairs["runs"]) if pairs else None,
                       {"peak RSS": "peak_rss_kib"}, ref_runs=pairs["runs"] if pairs else None)
    print(f"\ntotals: {nbytes:,} bytes, {rows:,} rows (walvault verify --json)" if rows is not None else "")
    best = {r["reader"]: r["best_s"] for r in results}
    targets = {
        "scan / floor (<= 1.5)": best["walcore scan_file, in process"] / best[floor_name],
        "start-up compiled / pure (about 1)": best["start-up: verify of one small file"]
        / best["start-up: verify of one small file, pure Python"],
        "verify peak RSS MiB (< 200)": max(r.get("peak_rss_kib") or 0 for r in results) / 1024,
    }
    if pairs:
        targets = {"one core: pairs / verify --jobs 1 (>= 3)": min(pairs["runs"]) / best[one_core],
                   "both cores: pairs / verify (>= 5)": min(pairs["runs"]) / best["walvault verify (default jobs)"],
                   **targets}
    for name, value in targets.items():
        print(f"target {name}: {value:.2f}")
    print(f"MB = 10**6 bytes; {args.rounds} rounds; 'x pairs' = speed relative to xlog.pairs (> 1 is faster), "
          f"best run over best run; 'median x pairs' = the median of that ratio within each round; "
          f"verify times are wall times including process start")
    if not args.keep:
        clear_data(root)
    return {"data_dir": str(root / "wal"), "files": len(paths), "bytes": nbytes, "rows": rows,
            "rows_xlog_pairs": pairs["rows"] if pairs else None, "targets": targets, "results": results}


if __name__ == "__main__":
    sys.exit(main())

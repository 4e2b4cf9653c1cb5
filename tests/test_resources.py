"""Bounded memory and a light CLI start-up (the throughput figures live in bench/)."""

from __future__ import annotations

import subprocess
import sys
from array import array

import pytest

from walcore.limestone import writer
from walcore.limestone.pwal import PUT_BLOB
from walcore.limestone.scan import MISSING_BLOBS
from walcore.tarantool.writer import generate_wal


def traced(imports: str, code: str) -> tuple[int, object]:
    """Run `code` (which sets `result`) in a fresh interpreter under tracemalloc, after `imports`: (peak bytes,
    result). Not in this process: tracemalloc counts every thread's allocations, and other tests leave threads
    here (a Spark gateway, the S3 server)."""
    import json

    script = (f"import json, tracemalloc\n{imports}\ntracemalloc.start()\n" + code.strip() + "\n"
              "print(json.dumps([tracemalloc.get_traced_memory()[1], result]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    peak, result = json.loads(proc.stdout)
    return peak, result


@pytest.mark.usefixtures("scan_core")
def test_memory_does_not_grow_with_file_size(tmp_path):
    """Scanning holds one block at a time: the peak is far below the file size and does not grow when
    the file is four times larger."""
    small = generate_wal(tmp_path / "small", target_bytes=6 << 20, file_bytes=64 << 20, open_last=False)[-1]
    large = generate_wal(tmp_path / "large", target_bytes=24 << 20, file_bytes=64 << 20, open_last=False)[-1]
    peaks = {}
    for name, path in (("small", small), ("large", large)):
        peaks[name], result = traced("from walcore.tarantool.xlog import scan_file", f"""
scan = scan_file({str(path)!r})
result = [scan.span.eof, len(scan.findings)]""")
        assert result == [True, 0]
    large_size = large.stat().st_size
    assert large_size > 3 * small.stat().st_size
    assert peaks["large"] < min(8 << 20, large_size / 4)
    assert peaks["large"] < 1.5 * peaks["small"] + (1 << 20)


@pytest.mark.usefixtures("scan_core")
def test_memory_does_not_grow_with_a_huge_blob_count(tmp_path):
    """A put_blob entry whose id count (damaged, or just huge) still fits in the file refers to millions of
    blobs: they are read in chunks and only the missing ones a report can list are kept."""
    n = 2_000_000
    entry = bytearray(writer.put(100, b"k", b"v", (1, 1), blob_ids=(7,)))
    count_at = len(entry) - 8 - 4
    assert int.from_bytes(entry[count_at:count_at + 4], "little") == 1
    entry[count_at:count_at + 4] = n.to_bytes(4, "little")
    log = writer.LogDir(tmp_path / "log")
    log.session(0, 1, [bytes(entry[:count_at + 4]) + array("Q", range(1, n + 1)).tobytes()])
    log.make_durable(1)
    log.close()
    pwal = tmp_path / "log" / "pwal_0000"
    assert pwal.stat().st_size > 8 * n
    for on_durable in ("None", "lambda e: None"):  # the fast walk, and the exact one
        peak, result = traced("from walcore.limestone.scan import scan_pwal", f"""
scan = scan_pwal({str(pwal)!r}, 1, {on_durable})
result = [scan.durable, len(scan.findings), sorted(scan.missing_blobs)]""")
        assert result == [{str(PUT_BLOB): 1}, 0, list(range(1, MISSING_BLOBS + 1))]
        assert peak < 4 << 20, peak  # the ids alone are 16 MB; as Python ints in a tuple, 80 MB more


def test_cli_imports_no_airflow_or_spark():
    code = ("import sys; from walcore.cli import main; rc = main(['verify', '--jobs', '1', sys.argv[1]]); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pyspark', 'pandas')); "
            "print('HEAVY', heavy); sys.exit(rc)")
    sample = "samples/tarantool/features"
    out = subprocess.run([sys.executable, "-c", code, sample], capture_output=True, text=True, timeout=120,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_backup_jobs_1_starts_no_worker_process(tmp_path):
    """`--jobs N`: worker processes. With --jobs 1 a backup, the scan of its spooled newest xlog included, runs
    in its own process: a host given one core for it gets no more. (Split size lowered so that the newest xlog
    is cut into byte ranges, as one over 32 MiB is.)"""
    wal = tmp_path / "wal"
    generate_wal(wal, target_bytes=3 << 20, file_bytes=1 << 20)  # its last xlog left open: spooled
    repo = tmp_path / "repo"
    script = f"""
import os, sys
forks = []
os.register_at_fork(before=lambda: forks.append(1))
import walcore.scan_paths
walcore.scan_paths.SPLIT_SIZE = 256 << 10
from walcore.cli import main
from walcore.repository import Repository
Repository({str(repo)!r}, {{}}, create=True)
code = main(["backup", {str(wal)!r}, "--repo", {str(repo)!r}, "--jobs", "1"])
print(code, len(forks))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["0", "0"], (proc.stdout, proc.stderr[-2000:])

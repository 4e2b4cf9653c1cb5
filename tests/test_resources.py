"""Bounded memory and a light CLI start-up (the throughput figures live in bench/)."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

from walcore.tarantool.writer import generate_wal
from walcore.tarantool.xlog import scan_file


def test_memory_does_not_grow_with_file_size(tmp_path):
    """Scanning holds one block at a time: the peak is far below the file size and does not grow when
    the file is four times larger."""
    small = generate_wal(tmp_path / "small", target_bytes=6 << 20, file_bytes=64 << 20, open_last=False)[-1]
    large = generate_wal(tmp_path / "large", target_bytes=24 << 20, file_bytes=64 << 20, open_last=False)[-1]
    peaks = {}
    for name, path in (("small", small), ("large", large)):
        tracemalloc.start()
        scan = scan_file(path)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert scan.span.eof and not scan.findings
    large_size = large.stat().st_size
    assert large_size > 3 * small.stat().st_size
    assert peaks["large"] < min(8 << 20, large_size / 4)
    assert peaks["large"] < 1.5 * peaks["small"] + (1 << 20)


def test_cli_imports_no_airflow_or_spark():
    code = ("import sys; from walcore.cli import main; rc = main(['verify', '--jobs', '1', sys.argv[1]]); "
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pyspark', 'pandas')); "
            "print('HEAVY', heavy); sys.exit(rc)")
    sample = "samples/tarantool/features"
    out = subprocess.run([sys.executable, "-c", code, sample], capture_output=True, text=True, timeout=120,
                         cwd=__file__.rsplit("/tests/", 1)[0])
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout

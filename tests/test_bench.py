"""The benchmarks still run, on tiny data, and every reader in them agrees with walvault on what is there.

Timings are not looked at (they live in bench/ and the README); what is checked is that each reader
read the same rows or entries, that verify found the generated files intact, and that the results
JSON has every reader the README's tables show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tarantool

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _run(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(BENCH / script), "--dir", str(tmp_path / "data"),
                           "--json", str(out), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not any((tmp_path / "data").rglob("*.*")), "the bench left its data behind without --keep"
    return json.loads(out.read_text())


@require_tarantool
def test_tarantool_bench_readers_agree(tmp_path):
    report = _run("verify_tarantool.py", tmp_path, "--size-mb", "3", "--rounds", "2")
    readers = {r["reader"].split(" (")[0]: r for r in report["results"]}
    assert set(readers) == {"read + CRC-32C", "plain Python: blocks+CRC+zstd+msgpack", "Tarantool xlog.pairs",
                            "walcore scan_file, in process", "walvault verify --jobs 1", "walvault verify"}
    assert report["rows"] > 1000 and report["rows_xlog_pairs"] == report["rows"]
    for name, r in readers.items():
        assert len(r["runs"]) == 2, name
        if name != "read + CRC-32C":
            assert r["rows"] == report["rows"], name
    assert report["bytes"] >= 3 * 10**6


def test_limestone_bench_readers_agree(tmp_path):
    report = _run("verify_limestone.py", tmp_path, "--size-mb", "3", "--channels", "2")
    gen = report["generated"]
    assert gen["entries"] > 100
    for r in report["results"]:
        if r["entries"] is not None:
            assert r["entries"] == gen["entries"], r["reader"]
        for d in r.get("dirs") or []:
            assert d["status"] == "ok" and d["count_durable_wal_entries"] == gen["put"] + gen["remove"]
    assert sum(1 for r in report["results"] if r["reader"].startswith("walvault verify")) == 2


def test_backup_bench_backs_up_and_restores(tmp_path):
    report = _run("backup.py", tmp_path, "--size-mb", "4", "--file-mib", "1", "--rounds", "2")
    steps = {r["step"]: r for r in report["results"]}
    assert set(steps) == {"zstd -3 -T0", "zstd -3 -T0, then sync of its output", "walvault archive (verify + store)",
                          "walvault backup, ledger on record", "walvault backup, verification included",
                          "walvault backup --type incremental", "walvault restore (incremental + full)"}
    for name, r in steps.items():
        assert len(r["runs"]) == 2 and r["exit_codes"] == [0, 0], name
    assert report["problems"] == [] and report["restore_equal"] is True
    files, nbytes = report["files"], report["bytes"]
    assert files >= 4 and nbytes >= 4 * 10**6 and report["grow_bytes"] > 0
    assert steps["zstd -3 -T0"]["files"] == files and 0 < steps["zstd -3 -T0"]["stored_bytes"] < nbytes
    # archive: every sealed file (all but the open xlog), each verified and put in the ledger
    archive = steps["walvault archive (verify + store)"]
    assert archive["files"] == files - 1 and len(archive["not_sealed"]) == 1
    # the full backup after archive takes every sealed file's verdict from the ledger; the fresh one scans all
    ledger, full = steps["walvault backup, ledger on record"], steps["walvault backup, verification included"]
    assert ledger["files"] == full["files"] == files
    assert ledger["checked_by"] == {"ledger": files - 1, "scan": 1} and full["checked_by"] == {"scan": files}
    assert ledger["own_files"] == full["own_files"] == files
    # the incremental stores the grown xlog and the new one, and refers to the rest
    inc = steps["walvault backup --type incremental"]
    assert inc["own_files"] == 2 and inc["referenced_files"] == files - 1
    assert nbytes + report["grow_bytes"] <= inc["bytes"] < nbytes + 2 * report["grow_bytes"]
    restore = steps["walvault restore (incremental + full)"]
    assert restore["files"] == files + 1 and restore["bytes"] == inc["bytes"] and restore["equal"] == [True, True]


@pytest.mark.xdist_group("spark")
def test_spark_bench_jobs_agree_with_the_command(tmp_path):
    """Every run of the Spark verify job (local[1], local[2]) printed what `walvault verify` printed."""
    report = _run("verify_spark.py", tmp_path, "--size-mb", "3", "--rounds", "1")
    names = set(report["results"])
    assert names == {"Spark start-up (verify job on one small xlog, local[2])", "walvault verify --jobs 1",
                     "walvault verify (2 jobs)", "verify job, local[1]", "verify job, local[2]"}
    for name, r in report["results"].items():
        assert r["rc"] == [0] and len(r["runs"]) == 1, name
    assert report["bytes"] >= 3 * 10**6 and report["startup_s"] > 0
    assert set(report["ratios"]) >= {"local[2] over local[1] (scaling, target >= 1.7)"}

"""The benchmarks still run, on tiny data, and every reader in them agrees with walvault on what is there.

Timings are not looked at (they live in bench/ and docs/performance.md); what is checked is that each reader
read the same rows or entries, that verify found the generated files intact, and that the results
JSON has every reader the tables of docs/performance.md show.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_tarantool
from walcore import scancore

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _run(script: str, tmp_path: Path, *args: str, timeout: float = 300) -> dict:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(BENCH / script), "--dir", str(tmp_path / "data"),
                           "--json", str(out), *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not any((tmp_path / "data").rglob("*.*")), "the bench left its data behind without --keep"
    return json.loads(out.read_text())


@require_tarantool
def test_tarantool_bench_readers_agree(tmp_path):
    report = _run("verify_tarantool.py", tmp_path, "--size-mb", "3", "--rounds", "2")
    assert set(report["shapes"]) == {"one_row", "multi_row"}
    for shape in report["shapes"].values():
        readers = {r["reader"].split(" (")[0]: r for r in shape["results"]}
        assert set(readers) == {"floor: read + CRC-32C + zstd", "plain Python: blocks+CRC+zstd+msgpack",
                                "Tarantool xlog.pairs", "walcore scan_file, in process",
                                "walcore scan_file, in process, pure Python", "walvault verify --jobs 1",
                                "walvault verify", "start-up: verify of one small file",
                                "start-up: verify of one small file, pure Python"}
        assert shape["rows"] > 1000 and shape["rows_xlog_pairs"] == shape["rows"]
        for name, r in readers.items():
            assert len(r["runs"]) == 2, name
            if r["rows"] is not None:
                assert r["rows"] == shape["rows"], name
        assert shape["bytes"] >= 3 * 10**6
        assert len(shape["targets"]) == 5


def test_limestone_bench_readers_agree(tmp_path):
    report = _run("verify_limestone.py", tmp_path, "--size-mb", "3", "--channels", "2")
    gen = report["generated"]
    assert gen["entries"] > 100
    for r in report["results"]:
        if r["entries"] is not None:
            assert r["entries"] == gen["entries"], r["reader"]
        for d in r.get("dirs") or []:
            assert d["status"] == "ok" and d["count_durable_wal_entries"] == gen["put"] + gen["remove"]
    assert sum(1 for r in report["results"] if r["reader"].startswith("walvault verify")) == 3  # one pure
    targets = report["targets"]
    assert targets["scan_core"] == scancore.describe()
    assert targets["jobs_1_over_read_floor"] > 0 and targets["default_jobs_speedup"] > 0


def test_backup_bench_backs_up_and_restores(tmp_path):
    report = _run("backup.py", tmp_path, "--size-mb", "4", "--file-mib", "1", "--rounds", "2")
    steps = {r["step"]: r for r in report["results"]}
    restic = {"restic backup", "restic backup, after the growth", "restic restore latest"}  # where installed
    assert set(steps) == {"zstd -3 -T0", "zstd -3 -T0, then sync of its output", "zstd -d -T0 of zstd's output",
                          "zstd -d -T0, then sync of its output",
                          "walvault archive (verify + store)",
                          "walvault backup, ledger on record", "walvault backup, verification included",
                          "walvault backup, encrypted repository",
                          "walvault backup --type incremental, nothing new",
                          "walvault backup --type incremental",
                          "walvault restore (incremental + full)"} | (restic if shutil.which("restic") else set())
    for name, r in steps.items():
        assert len(r["runs"]) == 2 and r["exit_codes"] == [0, 0], name
    assert report["problems"] == [] and report["restore_equal"] is True
    files, nbytes = report["files"], report["bytes"]
    assert files >= 4 and nbytes >= 4 * 10**6 and report["grow_bytes"] > 0
    assert steps["zstd -3 -T0"]["files"] == files and 0 < steps["zstd -3 -T0"]["stored_bytes"] < nbytes
    assert steps["zstd -d -T0 of zstd's output"]["bytes"] == nbytes  # the restore's floor: the same bytes back
    assert report["ratios"]["restore_x_unzstd"] > 0
    # archive: every sealed file (all but the open xlog), each verified and put in the ledger
    archive = steps["walvault archive (verify + store)"]
    assert archive["files"] == files - 1 and len(archive["not_sealed"]) == 1
    # the full backup after archive takes every sealed file's verdict from the ledger; the fresh one scans all
    ledger, full = steps["walvault backup, ledger on record"], steps["walvault backup, verification included"]
    assert ledger["files"] == full["files"] == files
    assert ledger["checked_by"] == {"ledger": files - 1, "scan": 1} and full["checked_by"] == {"scan": files}
    assert ledger["own_files"] == full["own_files"] == files
    # the same backup into an encrypted repository, beside it: same files, same checks
    encrypted = steps["walvault backup, encrypted repository"]
    assert encrypted["files"] == files and encrypted["checked_by"] == {"scan": files}
    assert report["ratios"]["encrypted_over_plain"] > 0
    # an incremental with nothing new stores nothing: every file, the open xlog too, is referenced
    unchanged = steps["walvault backup --type incremental, nothing new"]
    assert unchanged["own_files"] == 0 and unchanged["referenced_files"] == files
    assert 0 < report["ratios"]["unchanged_s"] <= report["ratios"]["unchanged_s_median"]
    # the incremental stores the grown xlog and the new one, and refers to the rest
    inc = steps["walvault backup --type incremental"]
    assert inc["own_files"] == 2 and inc["referenced_files"] == files - 1
    assert nbytes + report["grow_bytes"] <= inc["bytes"] < nbytes + 2 * report["grow_bytes"]
    restore = steps["walvault restore (incremental + full)"]
    assert restore["files"] == files + 1 and restore["bytes"] == inc["bytes"] and restore["equal"] == [True, True]


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


def test_airflow_pipeline_bench_agrees(tmp_path):
    """The DAG folder parses (six DAGs, no import error, a stat per file) and the pipeline run by the DAGs
    (`airflow dags test`, Spark on local[2]) leaves what the commands run by hand leave."""
    # two `airflow dags test` runs and the DAG folder parsed: over 150 s on a loaded two-core machine. Each file
    # alone in a process forked from one that imported airflow: an interpreter's start per file was 15 s more each
    report = _run("airflow_pipeline.py", tmp_path, "--size-mb", "3", "--rounds", "1", "--parse-runs", "1",
                  "--alone-forked", timeout=900)
    assert report["problems"] == []
    dags = ("walvault_archive", "walvault_backup", "walvault_restore_drill", "walvault_retention", "walvault_snapshot")
    parse = report["parse"]
    assert set(dags) <= set(parse["dags"]) and parse["import_errors"] == {}
    assert {f"{d}.py" for d in dags} <= set(parse["files"]) and len(parse["runs"]) == 1 and parse["best_s"] > 0
    assert parse["alone_forked"] is True
    assert all(len(f["runs"]) == len(f["alone_runs"]) == 1 and f["dag_num"] >= 1 and f["alone_best_s"] > 0
               for f in parse["files"].values())
    steps = {s["step"]: s for s in report["steps"]}
    assert len(steps) == 6 and all(s["exit_codes"] == [0] and len(s["runs"]) == 1 for s in steps.values())
    for name in ("airflow dags test walvault_archive", "airflow dags test walvault_backup (full, verify)"):
        (tasks,) = steps[name]["tasks_runs"]  # where the run's time went, from its log
        assert tasks["start-up"] > 0 and len(tasks) >= 4 and sum(tasks.values()) <= steps[name]["runs"][0] + 1, name
    (agreement,) = report["agreement"]
    # every sealed file archived by both, and verified by both (the CLI's verify, the archive DAG's Spark job)
    assert agreement["archived_files"]["cli"] == agreement["archived_files"]["airflow"] == report["files"] - 1 > 3
    assert agreement["verified_files"] == {"cli": report["files"] - 1, "airflow": report["files"] - 1}
    assert agreement["same_archive"] and agreement["same_backup_files"]
    for side in ("cli", "airflow"):
        (backup,) = agreement["backups"][side]
        assert backup["type"] == "full" and backup["status"] == "ok" and backup["files"] == report["files"]
        assert len(agreement["backup_files"][side]) == report["files"]
    assert agreement["backup_files"]["cli"] == agreement["backup_files"]["airflow"]
    assert report["bytes"] >= 3 * 10**6 and report["load_avg_before"] and report["size_mb"] == 3
    for path in ("cli", "airflow"):
        assert report["paths"][path]["best_s"] > 0 and report["paths"][path]["mb_s"] > 0
    assert set(report["overhead"]) == {"whole pipeline", "archive DAG vs archive + verify of the files",
                                       "backup DAG vs backup + verify --repo"}
    for name, o in report["overhead"].items():  # the figures follow from the runs (their size is the bench's)
        assert o["extra_s"] == pytest.approx(o["airflow_best_s"] - o["cli_best_s"]), name
        assert o["ratio"] == pytest.approx(o["airflow_best_s"] / o["cli_best_s"]), name

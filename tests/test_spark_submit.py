"""walvault's `--spark` flag and the Spark jobs as spark-submit runs them, each in processes of its own (a JVM
started per job, so these tests spread over the test workers; tests/test_spark_jobs.py runs the jobs on one shared
session): a plan file read once, a killed job, a stopped walvault, a real standalone cluster (master and worker
from the pip package, on 127.0.0.1) running the verify and limestone_state jobs.

Every comparison is between the same command run without Spark (in process) and with `--spark`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import copy_limestone_fixture, new_repository, run_cli, run_main, walvault_command
from test_spark_jobs import SPARK_ENV, _parquet_state, report_of, run_local, tarantool_copy, without_report_line

from walcore.tarantool.writer import generate_wal


def test_a_bad_plan_stops_the_job_before_spark_starts():
    from spark_jobs.submit import job_file

    proc = subprocess.run([sys.executable, job_file("verify"), "{"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "bad plan: the plan is not JSON" in proc.stderr


def test_a_plan_file_with_an_output_dir_is_read_once_and_the_verdict_left_there(tmp_path, monkeypatch):
    """What Airflow's Spark tasks rely on: the plan (credentials and an encrypted repository's key included) is
    gone as soon as the job has read it, and the job succeeds once the command's verdict and its cause are in the
    output dir, for the next task. The key is the plan's alone: spark-submit's environment has none."""
    from spark_jobs.submit import job_file, spark_submit

    out = tmp_path / "out"
    out.mkdir()
    plan = tmp_path / "plan.json"
    repo = str(tmp_path / "repo")
    monkeypatch.setenv("WALVAULT_KEY", "the plan's key")
    assert run_main("init", "--repo", repo, "--encrypt").returncode == 0
    monkeypatch.delenv("WALVAULT_KEY")
    plan.write_text(json.dumps({"sources": [str(tarantool_copy(tmp_path))], "repo": repo, "repo_key": "the plan's key",
                                "options": {"type": "incremental"}, "output": str(out)}))
    proc = subprocess.run([spark_submit(), "--master", "local[1]", job_file("backup"), f"@{plan}"],
                          env={**os.environ, **SPARK_ENV}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not plan.exists()
    # the repository opened (without its key: exit 2, "give its key"), and the command's own verdict
    assert json.loads((out / "result.json").read_text()) == {"exit": 1}, (out / "stderr").read_text()
    assert "take a full backup first" in (out / "stderr").read_text()


def test_a_key_in_a_plan_on_the_command_line_is_refused_before_spark_starts(tmp_path):
    from spark_jobs.submit import job_file

    plan = json.dumps({"sources": [str(tmp_path)], "repo": str(tmp_path / "repo"), "repo_key": "secret"})
    proc = subprocess.run([sys.executable, job_file("backup"), plan],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "repo_key: only in a plan file" in proc.stderr, proc.stderr
    assert "secret" not in proc.stderr and not (tmp_path / "repo").exists()


def test_killed_backup_job_leaves_no_backup_and_the_next_run_cleans_up(tmp_path):
    source = tmp_path / "data"
    generate_wal(source, target_bytes=48 << 20, file_bytes=16 << 20)  # a snapshot and xlogs: seconds each at level 19
    repo = new_repository(tmp_path / "repo")
    env = {**os.environ, **SPARK_ENV}
    proc = subprocess.Popen([*walvault_command(), "backup", str(source), "--repo", str(repo), "--spark", "local[2]",
                             "--level", "19"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    deadline = time.monotonic() + 240
    while not list(repo.glob("tarantool/*/backups/*/*.zst")) and proc.poll() is None:
        assert time.monotonic() < deadline, "the job stored nothing in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # spark-submit, its JVM and the Python driver and workers with it
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the job ended before it was killed"
    _wait_group_gone(proc.pid)  # a killed process holds its lease until the kernel has ended it
    listed = json.loads(run_main("backups", "--repo", str(repo), "--json").stdout)["backups"]
    assert [b["status"] for b in listed] == ["incomplete"]

    text = run_main("backup", str(source), "--repo", str(repo), "--level", "1")
    assert text.returncode == 0, text.stderr
    assert f"removed the leftovers of interrupted backup {listed[0]['id']}" in text.stdout
    after = json.loads(run_main("backups", "--repo", str(repo), "--json").stdout)["backups"]
    assert [b["status"] for b in after] == ["ok"]
    assert run_main("verify", "--repo", str(repo)).returncode == 0


def _wait_group_gone(pgid: int) -> None:
    import psutil

    deadline = time.monotonic() + 30
    while True:
        left = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
        if not left:
            return
        assert time.monotonic() < deadline, f"processes {left} of the killed job still run"
        time.sleep(0.05)


def test_command_line_errors_are_said_before_spark_starts():
    started = time.monotonic()
    for argv, message in ((["verify", "x", "--jobs", "0"], "--jobs must be at least 1"),
                          (["verify"], "verify needs a PATH (or --repo URL to verify a repository)"),
                          (["backup", "x", "--repo", "r", "--level", "30"], "--level is 1..19")):
        spark_out = run_local([*argv, "--spark", "local[1]"])
        assert spark_out == run_local(argv) == (2, "", f"walvault: {message}\n")
    assert time.monotonic() - started < 5, "a JVM was started"


def test_sources_that_look_like_options_are_sources():
    from spark_jobs.plan import request
    from walcore.requests import VerifyRequest

    verify = request({"sources": ["-w", "--json"], "repo": "/r", "options": {"full": True}}, "verify")
    assert verify == VerifyRequest(paths=[Path("-w"), Path("--json")], repo="/r", full=True)


def test_a_stopped_walvault_stops_its_job_and_leaves_no_plan(tmp_path):
    data = tmp_path / "wal"
    generate_wal(data, target_bytes=40 << 20, file_bytes=8 << 20)
    proc = subprocess.Popen([*walvault_command(), "verify", str(data), "--spark", "local[1]"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **SPARK_ENV})
    mine = Path(tempfile.gettempdir())
    deadline = time.monotonic() + 60
    while not list(mine.glob(f"walvault-spark-{proc.pid}-*/spark.log")) or \
            b"SparkContext" not in b"".join(p.read_bytes() for p in mine.glob(f"walvault-spark-{proc.pid}-*/spark.log")):
        assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
        time.sleep(0.1)
    group = [int(p) for p in subprocess.run(["pgrep", "-f", f"walvault-spark-{proc.pid}-"], capture_output=True,
                                            text=True).stdout.split()]
    assert group, "no process of the job was found"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    time.sleep(0.5)
    from walcore.fsutil import pid_alive

    assert not [p for p in group if pid_alive(p)], "the job went on without walvault"
    assert not list(mine.glob(f"walvault-spark-{proc.pid}-*")), "its plan (which may hold secrets) was left"


def test_scratch_directories_of_dead_processes_are_removed(tmp_path):
    """The first scratch dir a process (a new walvault run) makes removes those its dead predecessors left."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    orphan = Path(tempfile.gettempdir()) / f"walvault-spool-{child.pid}-test"
    orphan.mkdir()
    (orphan / "00000000000000000001.xlog").write_bytes(b"x")
    made = subprocess.run([sys.executable, "-c", "import os; from walcore.fsutil import owned_tempdir; "
                           "print(os.getpid(), owned_tempdir('walvault-spool-'))"],
                          capture_output=True, text=True, timeout=60)
    pid, mine = made.stdout.split()
    mine = Path(mine)
    try:
        assert not orphan.exists() and mine.is_dir() and mine.name.startswith(f"walvault-spool-{pid}-")
        assert mine.is_dir()
    finally:
        shutil.rmtree(mine)


# --------------------------------------------------------------------------- a standalone cluster


@pytest.fixture
def standalone_cluster(tmp_path):
    """A real Spark standalone master and one worker (2 cores, 1 GiB) on 127.0.0.1; stopped after the test."""
    from spark_jobs.cluster import standalone_cluster

    with standalone_cluster(tmp_path, workers=1, cores=2) as master:
        yield master


def test_spark_flag_on_a_standalone_cluster_prints_what_the_command_prints(standalone_cluster, tmp_path):
    """verify and limestone_state submitted to the cluster: what each prints and its exit equal the command's
    without Spark, verify on both families; the state's Parquet parts hold its rows. (The backup job on a standalone
    cluster, restored byte for byte: tests/test_dags.py, submitted by Airflow; what it stores and prints against
    the command's: tests/test_spark_jobs.py; `backup --spark` through spark-submit: the killed job's test above.)"""
    source = tarantool_copy(tmp_path)
    limestone = copy_limestone_fixture("11-online-compaction", tmp_path)
    repo = str(new_repository(tmp_path / "repo"))
    # verify, with the ledger and the report in the repository
    argv = ("verify", str(source), str(limestone), "--repo", repo, "--json")
    plain, spark = run_main(*argv), run_cli(*argv, "--spark", standalone_cluster, timeout=600)
    assert (spark.returncode, spark.stdout, without_report_line(spark.stderr)) == \
        (plain.returncode, plain.stdout, without_report_line(plain.stderr)) == (0, plain.stdout, "")
    summary = json.loads(Path(report_of(spark.stderr), "summary.json").read_text())
    assert summary["runner"] == "spark" and summary["verdict"] == "INTACT"
    # limestone_state: the TSV, and its Parquet parts written by the worker's executors
    out = tmp_path / "state"
    plain = run_main("state", str(limestone))
    spark = run_cli("state", str(limestone), "--parquet", str(out), "--spark", standalone_cluster, timeout=600)
    assert (spark.returncode, spark.stdout) == (plain.returncode, plain.stdout) and plain.stdout.count("\n") == 6
    assert "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for s, k, v in _parquet_state(out)) == plain.stdout
    # the jobs ran on the cluster: the worker started executors for each of them
    assert len(list((tmp_path / "work").iterdir())) >= 2

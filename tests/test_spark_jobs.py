"""The Spark jobs (spark_jobs/) against the commands they distribute, on a real Spark session on local[2] (one per
test worker, shared; tests/test_spark_submit.py runs them through spark-submit and on a standalone cluster).

Every comparison is between the same command run by walcore's LocalRunner and by the Spark job on the same
data: findings, manifests (modulo ids, times and where objects are stored), state rows.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LIMESTONE_FIXTURES, S3_CREDENTIALS, TARANTOOL_FIXTURES, copy_limestone_fixture, copy_tree, \
    new_repository, walvault_command

from walcore.cli import main as cli_main
from walcore.command.state import directory_state
from walcore.scan_paths import verify_paths
from walcore.repository import Repository
from walcore.runner import LocalRunner
from walcore.tarantool.writer import generate_wal


SPARK_ENV = {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


@pytest.fixture(scope="module")
def spark():
    # Executors take the environment their JVM started with: the loopback S3 server's credentials must be
    # there before (as on a cluster, where they are in the workers' environment).
    for key, value in {**SPARK_ENV, **S3_CREDENTIALS}.items():
        os.environ.setdefault(key, value)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("walvault-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "4").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def spark_runner(spark):
    from spark_jobs.runner import SparkRunner

    return SparkRunner(spark)


def run_job(spark, job: str, plan: dict, tmp_path: Path) -> tuple[int, str, str]:
    """A job as spark-submit runs it (spark_jobs.job.run), on the shared session: (exit, stdout, stderr)."""
    from spark_jobs.job import run

    out = tmp_path / f"job-{job}-{time.monotonic_ns()}"
    out.mkdir()
    code = run(spark, job, {**plan, "output": str(out)})
    assert json.loads((out / "result.json").read_text()) == {"exit": code}
    return code, (out / "stdout").read_text(), (out / "stderr").read_text()


def run_local(argv: list[str]) -> tuple[int, str, str]:
    """The same command without Spark, in process: (exit, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(argv)
    return code, out.getvalue(), err.getvalue()


def without_report_line(stderr: str) -> str:
    return re.sub(r"walvault: report written to \S+\n", "", stderr)


def report_of(stderr: str) -> Path:
    return Path(re.search(r"walvault: report written to (\S+)", stderr).group(1))


def tarantool_copy(tmp_path: Path, name: str = "many-xlogs") -> Path:
    return copy_tree(TARANTOOL_FIXTURES / name, tmp_path / name)


# --------------------------------------------------------------------------- verify


@pytest.mark.parametrize("as_json", [True, False])
def test_verify_job_prints_what_verify_prints(spark, tmp_path, as_json):
    sources = [str(TARANTOOL_FIXTURES / n) for n in ("many-xlogs", "features", "concurrent")]
    sources += [str(LIMESTONE_FIXTURES / n) for n in ("01-clean", "02-unfinished", "11-online-compaction")]
    local = run_local(["verify", *sources] + (["--json"] if as_json else []))
    spark_out = run_job(spark, "verify", {"sources": sources, "options": {"json": as_json}}, tmp_path)
    assert spark_out == local
    assert local[0] == 1  # 02-unfinished is repairable: a finding, so both say exit 1
    if as_json:
        report = json.loads(local[1])
        assert len(report["files"]) > 60 and len(report["chains"]) == 3 and len(report["dirs"]) == 3


@pytest.mark.parametrize("damage_at", ["start", "middle", "end"])
def test_verify_job_cuts_big_files_into_ranges_and_merges_them_exactly(spark, tmp_path, monkeypatch, damage_at):
    import walcore.scan_paths as verify_mod

    files = generate_wal(tmp_path / "wal", target_bytes=10 << 20, file_bytes=10 << 20)
    big = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    at = {"start": 4096, "middle": len(data) // 2, "end": len(data) - 3000}[damage_at]
    data[at:at + 8] = b"\xff" * 8
    big.write_bytes(bytes(data))
    monkeypatch.setattr(verify_mod, "SPLIT_SIZE", 1 << 20)  # the cut is planned on the driver
    units = []
    real = verify_mod._tarantool_units
    monkeypatch.setattr(verify_mod, "_tarantool_units", lambda *a: units.extend(real(*a)) or units)
    distributed = verify_paths([tmp_path / "wal"], runner=spark_runner(spark)).to_json()
    assert sum(1 for u in units if u[1] == str(big)) > 4, "the big file was not cut into ranges"
    sequential = verify_paths([tmp_path / "wal"], runner=LocalRunner(1)).to_json()
    assert distributed == sequential
    damaged = [f for f in sequential["files"] if f["status"] == "damaged"]
    assert [f["path"] for f in damaged] == [str(big)] and damaged[0]["findings"]


def test_verify_job_is_incremental_through_the_ledger(spark, tmp_path, repo_target):
    repo_target.repository(create=True)
    source = tarantool_copy(tmp_path)
    argv = ["verify", str(source), *repo_target.cli, "--json"]
    plan = {"sources": [str(source)], "repo": repo_target.url, "repo_options": repo_target.options,
            "options": {"json": True}}
    first = run_job(spark, "verify", plan, tmp_path)
    second = run_job(spark, "verify", plan, tmp_path)
    full = run_job(spark, "verify", {**plan, "options": {"json": True, "full": True}}, tmp_path)
    local = run_local(argv)
    assert first[0] == second[0] == full[0] == local[0] == 0
    assert first[1] == second[1] == full[1] == local[1], "the ledger changed what verify says"

    repo = repo_target.repository(create=False)
    summaries = [_summary(repo, report_of(r[2])) for r in (first, second, full, local)]
    sealed = sum(1 for f in json.loads(first[1])["files"] if f["status"] == "ok")
    opened = sum(1 for f in json.loads(first[1])["files"] if f["status"] != "ok")
    rescanned = {"ledger": sealed} | ({"scan": opened} if opened else {})  # an open xlog is read again
    assert sealed > 30
    assert summaries[0]["checked_by"] == {"scan": sealed + opened}
    assert summaries[1]["checked_by"] == rescanned
    assert summaries[2]["checked_by"] == {"scan": sealed + opened}  # --full
    assert summaries[3]["checked_by"] == rescanned
    assert [s["runner"] for s in summaries] == ["spark", "spark", "spark", "local"]
    assert all(s["verdict"] == "INTACT" for s in summaries)

    rows = _parquet_rows(repo, report_of(second[2]))
    by_path = {r["path"]: r for r in rows}
    assert set(by_path) == {f["path"] for f in json.loads(second[1])["files"]}
    for f in json.loads(second[1])["files"]:
        row = by_path[f["path"]]
        assert (row["status"], row["size"], row["rows"]) == (f["status"], f["size"], f["rows"])
        assert row["checked_by"] == ("ledger" if f["status"] == "ok" else "scan")
        assert re.fullmatch(r"[0-9a-f]{64}", row["sha256"])


def test_ledger_of_another_walvault_version_is_not_trusted(spark, tmp_path, monkeypatch):
    source = tarantool_copy(tmp_path)
    repo_url = str(new_repository(tmp_path / "repo"))
    plan = {"sources": [str(source)], "repo": repo_url, "options": {"json": True}}
    run_job(spark, "verify", plan, tmp_path)
    import walcore.repository as repository

    monkeypatch.setattr(repository, "walvault_version", lambda: "0.0.0-older")
    code, _out, err = run_job(spark, "verify", plan, tmp_path)
    assert code == 0
    assert set(_summary(Repository(repo_url), report_of(err))["checked_by"]) == {"scan"}


def _summary(repo: Repository, where: Path) -> dict:
    from walcore.repository.manifest import decode_checked

    return decode_checked(repo.storage.read_bytes(f"reports/verify/{where.name}/summary.json"), "summary")


def _parquet_rows(repo: Repository, where: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(repo.storage.read_bytes(f"reports/verify/{where.name}/files.parquet"))).to_pylist()


def test_damaged_file_among_many_is_reported_and_the_backup_refuses(spark, tmp_path):
    source = tarantool_copy(tmp_path)
    xlogs = sorted((source / "wal").glob("*.xlog"))
    victim = xlogs[-2]  # in the backup set: the snapshot replays from it
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    repo_url = str(new_repository(tmp_path / "repo"))

    code, out, err = run_job(spark, "verify", {"sources": [str(source)], "repo": repo_url,
                                               "options": {"json": True}}, tmp_path)
    assert code == 1, "the job itself succeeds; its verdict is a finding"
    damaged = [f["path"] for f in json.loads(out)["files"] if f["status"] == "damaged"]
    assert damaged == [str(victim)]
    repo = Repository(repo_url)
    assert _summary(repo, report_of(err))["damaged"] == [str(victim)]
    assert [r["path"] for r in _parquet_rows(repo, report_of(err)) if r["status"] == "damaged"] == [str(victim)]

    code, out, err = run_job(spark, "backup", {"sources": [str(source)], "repo": repo_url}, tmp_path)
    assert (code, out) == run_local(["backup", str(source), "--repo", repo_url])[:2] == (1, "")
    assert victim.name in err and "not backed up" in err
    assert repo.backups() == [] and not repo.storage.list("tarantool/" + _instance(source) + "/backups")


def _instance(source: Path) -> str:
    from walcore.tarantool.backup_set import instance_of

    return instance_of(source)


def test_verify_job_rehashes_the_repository_and_finds_a_damaged_object(spark, tmp_path):
    source = tarantool_copy(tmp_path)
    repo_url = str(new_repository(tmp_path / "repo"))
    assert run_local(["backup", str(source), "--repo", repo_url])[0] == 0
    plan = {"repo": repo_url, "options": {"json": True, "full": True}}
    clean = run_job(spark, "verify", plan, tmp_path)
    assert clean[0] == 0 and json.loads(clean[1])["objects"] == 8
    assert clean[1] == run_local(["verify", "--repo", repo_url, "--json", "--full"])[1]
    stored = sorted(Path(repo_url).rglob("*.xlog.zst"))[0]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 1
    stored.write_bytes(bytes(data))
    code, out, err = run_job(spark, "verify", {**plan, "backup": "latest"}, tmp_path)
    assert (code, out) == run_local(["verify", "--repo", repo_url, "latest", "--json", "--full"])[:2]
    assert code == 1
    found = [f for b in json.loads(out)["backups"] for f in b["findings"]]
    assert [(f["code"], f["file"]) for f in found] == [("object_damaged", f"wal/{stored.name[:-4]}")]
    rows = _parquet_rows(Repository(repo_url), report_of(err))
    assert [r["path"] for r in rows if r["status"] == "damaged"] == [stored.relative_to(repo_url).as_posix()]


# --------------------------------------------------------------------------- backup


def _comparable(manifest: dict) -> dict:
    """A manifest without what differs between two backups of the same bytes: ids, times, object names."""
    out = {k: v for k, v in manifest.items() if k not in ("id", "started", "finished", "parent", "sha256")}
    # (a mutable file is copied to a spool first: its mtime is the copy's)
    out["files"] = [{k: v for k, v in f.items() if k not in ("stored", "reference", "stored_sha256", "stored_size")
                     and not (k == "mtime_ns" and f["mutable"])} for f in manifest["files"]]
    out["source"] = {k: v for k, v in manifest["source"].items() if k != "path"}
    return out


def _manifests(repo: Repository) -> list[dict]:
    return [r.manifest.to_json() for r in repo.backups()]


def test_backup_job_stores_what_backup_stores(spark, tmp_path, repo_target):
    repo_target.repository(create=True)
    source = tarantool_copy(tmp_path)
    local_repo = new_repository(tmp_path / "local-repo")
    assert run_local(["backup", str(source), "--repo", str(local_repo)])[0] == 0
    plan = {"sources": [str(source)], "repo": repo_target.url, "repo_options": repo_target.options,
            "options": {"json": True}}
    code, out, err = run_job(spark, "backup", plan, tmp_path)
    assert code == 0, err
    result = json.loads(out)
    assert result["files"] == 8 and result["type"] == "full"
    code, out, err = run_job(spark, "backup", {**plan, "options": {"json": True, "type": "incremental"}}, tmp_path)
    assert code == 0, err
    incremental = json.loads(out)
    assert incremental["parent"] == result["id"] and incremental["stored_bytes"] < result["stored_bytes"]
    assert run_local(["backup", str(source), "--repo", str(local_repo), "--type", "incremental"])[0] == 0

    spark_side = [_comparable(m) for m in _manifests(repo_target.repository(create=False))]
    local_side = [_comparable(m) for m in _manifests(Repository(str(local_repo)))]
    assert json.dumps(spark_side, indent=1, sort_keys=True).splitlines() == \
           json.dumps(local_side, indent=1, sort_keys=True).splitlines()

    # and it restores, byte for byte
    target = tmp_path / "restored"
    code, _out, err = run_local(["restore", "latest", str(target), *repo_target.cli])
    assert code == 0, err
    assert_restored(target, source, incremental["files"])



def test_backup_job_stores_a_torn_newest_xlog_cut_as_backup_does(spark, tmp_path):
    """The spooled newest xlog is stored on the driver while Spark stores the rest; found ending inside a block,
    it is cut and stored again: the note and the restored bytes are the local backup's."""
    from tarantool_bytes import tear_newest_xlog

    source = tarantool_copy(tmp_path)
    name, whole = tear_newest_xlog(source)
    repo_url = new_repository(tmp_path / "repo")
    code, out, err = run_job(spark, "backup", {"sources": [str(source)], "repo": str(repo_url),
                                               "options": {"json": True}}, tmp_path)
    assert code == 0, err
    notes = [n for n in json.loads(out)["notes"] if "ends inside a block" in n]
    assert notes and notes[0].startswith(f"{name} ends inside a block at byte {len(whole)} "), notes
    target = tmp_path / "restored"
    code, _out, err = run_local(["restore", "latest", str(target), "--repo", str(repo_url)])
    assert code == 0, err
    assert (target / name).read_bytes() == whole

def assert_restored(target: Path, source: Path, count: int) -> None:
    """Every restored file has its source's bytes (the sources here are stopped: nothing grew meanwhile)."""
    restored = [p for p in target.rglob("*") if p.is_file()]
    assert len(restored) == count
    for f in restored:
        assert f.read_bytes() == (source / f.relative_to(target)).read_bytes(), f


def test_backup_job_of_limestone_equals_backup(spark, tmp_path):
    source = copy_limestone_fixture("11-online-compaction", tmp_path)
    local_repo, spark_repo = new_repository(tmp_path / "a"), new_repository(tmp_path / "b")
    assert run_local(["backup", str(source), "--repo", str(local_repo)])[0] == 0
    code, _out, err = run_job(spark, "backup", {"sources": [str(source)], "repo": str(spark_repo)}, tmp_path)
    assert code == 0, err
    assert [_comparable(m) for m in _manifests(Repository(str(spark_repo)))] == \
           [_comparable(m) for m in _manifests(Repository(str(local_repo)))]


def test_task_failing_on_one_file_fails_the_job_without_a_manifest(spark, tmp_path, monkeypatch):
    from walcore.tarantool import backup_plan as backup_tarantool

    source = tarantool_copy(tmp_path)
    victim = sorted((source / "wal").glob("*.xlog"))[-2]  # sealed, in the set
    real = backup_tarantool.TarantoolPlan.candidates

    def listed_then_replaced(self, parent, runner):
        found = real(self, parent, runner)
        victim.unlink()  # replaced after the driver listed it: the executor's task cannot read it
        victim.mkdir()
        return found

    monkeypatch.setattr(backup_tarantool.TarantoolPlan, "candidates", listed_then_replaced)
    repo_url = str(new_repository(tmp_path / "repo"))
    code, out, err = run_job(spark, "backup", {"sources": [str(source)], "repo": repo_url}, tmp_path)
    assert (code, out) == (2, "")
    assert "not backed up" in err and str(victim) in err, err
    repo = Repository(repo_url)
    assert repo.backups() == []
    assert not any("/backups/" in n for n in repo.storage.list("tarantool")), "the failed backup left objects"


# --------------------------------------------------------------------------- limestone_state


def _parquet_state(url: Path) -> list[tuple[int, bytes, bytes]]:
    import pyarrow.parquet as pq

    success = json.loads((url / "_SUCCESS.json").read_text())
    rows = []
    for part in success["parts"]:
        table = pq.read_table(url / part["part"])
        assert table.num_rows == part["rows"]
        rows += [(r["storage_id"], r["key"], r["value"]) for r in table.to_pylist()]
    assert len(rows) == success["rows"]
    return rows


@pytest.mark.parametrize("fixture", sorted(p.name for p in LIMESTONE_FIXTURES.iterdir() if p.is_dir()))
def test_state_job_prints_what_state_prints_on_every_fixture(spark, tmp_path, fixture):
    source = LIMESTONE_FIXTURES / fixture
    local = run_local(["state", str(source)])
    out = tmp_path / "state"
    assert run_job(spark, "limestone_state", {"sources": [str(source)], "parquet": str(out)}, tmp_path) == local
    assert local[0] == 0 and local[1]
    rows = _parquet_state(out)
    assert "".join(f"{s}\t{k.hex()}\t{v.hex()}\n" for s, k, v in rows) == local[1]


def test_state_job_on_generated_workloads_equals_the_model(spark, tmp_path, monkeypatch):
    """The generated workloads limestone can read among those tests/test_limestone_random.py checks the command on
    (WALVAULT_TEST_EXAMPLES of them, those reaching every outcome of the generator first): the job's state equals
    the model's and the command's, cut into partitions of 2 rows."""
    from test_limestone_random import EXAMPLES, generate, generated_seeds, state_dict, write_workload

    import limestone_model as model
    import spark_jobs.state as state_job
    from walcore.parquet import ParquetOutput

    monkeypatch.setattr(state_job, "ROWS_PER_PARTITION", 2)  # many partitions: each holds a slice of the keys
    expected = {seed: model.expect(generate(seed)[0]) for seed in generated_seeds(EXAMPLES)}
    readable = [seed for seed, exp in expected.items() if exp.status != "unrepairable"]
    assert {expected[seed].status for seed in readable} == {"ok", "repairable"}, expected
    cut = 0
    for seed in readable:
        w, _tags = generate(seed)
        root = tmp_path / f"log-{seed}"
        write_workload(w, root)
        out = tmp_path / f"state-{seed}"
        rows = list(directory_state(root, runner=spark_runner(spark), parquet=ParquetOutput(str(out))))
        assert state_dict(rows) == expected[seed].state, f"seed {seed}"
        assert rows == list(directory_state(root)), f"seed {seed}"
        parts = json.loads((out / "_SUCCESS.json").read_text())["parts"]
        assert _parquet_state(out) == rows
        if len(rows) > 2:
            assert len(parts) > 1 and max(p["rows"] for p in parts) < len(rows), f"seed {seed}: one part holds all"
            cut += 1
    assert cut >= 3, "too few workloads cut into parts"


def test_state_job_refuses_what_state_refuses(spark, tmp_path):
    from test_limestone_random import generate, write_workload

    import limestone_model as model

    for seed in range(200):
        w, _tags = generate(seed)
        if model.expect(w).status == "unrepairable":
            break
    root = tmp_path / "log"
    write_workload(w, root)
    local = run_local(["state", str(root)])
    assert local[0] == 1 and "no state" in local[2]
    assert run_job(spark, "limestone_state", {"sources": [str(root)]}, tmp_path) == local
    out = tmp_path / "nonempty"
    out.mkdir()
    (out / "x").write_text("x")
    local = run_local(["state", str(LIMESTONE_FIXTURES / "01-clean"), "--parquet", str(out)])
    assert local[0] == 2 and "not empty" in local[2]
    assert run_job(spark, "limestone_state", {"sources": [str(LIMESTONE_FIXTURES / "01-clean")],
                                              "parquet": str(out)}, tmp_path) == local


# --------------------------------------------------------------------------- plans


@pytest.mark.parametrize("plan, why", [
    ({"sources": "x"}, "sources"),
    ({"sources": ["a"], "colour": 1}, "unknown plan keys: colour"),
    ({"sources": ["a"], "options": {"level": 3}}, "options"),
    ({"backup": "latest"}, "repo"),
    ({}, "sources"),
    ({"job": "backup", "sources": ["a"]}, "job"),
    ({"sources": ["a"], "repo_options": ["x"]}, "repo_options: a dict"),
    ({"backup": 5, "repo": "/r"}, "backup: a str"),
    ({"sources": ["a"], "options": {"full": "yes"}}, "options.full"),
    ({"sources": ["a"], "output": "/nonexistent/walvault"}, "output"),
    ({"sources": ["a"], "repo_key": "k"}, "repo_key: a key without the repository"),
    ({"sources": ["a"], "repo": "/r", "repo_key": 7}, "repo_key: a str"),
])
def test_bad_plans_are_refused_naming_the_key(plan, why):
    from spark_jobs.plan import PlanError, request

    with pytest.raises(PlanError, match=why):
        request(plan, "verify")


# --------------------------------------------------------------------------- the ledger's edges (found by review)


def test_a_renamed_copy_of_a_verified_file_is_scanned_not_taken_from_the_ledger(tmp_path):
    source = tarantool_copy(tmp_path)
    repo = str(new_repository(tmp_path / "repo"))
    assert run_local(["verify", str(source), "--repo", repo])[0] == 0
    xlog = sorted((source / "wal").glob("*.xlog"))[1]
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for name in ("00000000000000000999.xlog", "00000000000000000123.snap"):
        shutil.copy(xlog, renamed / name)
    plain = run_local(["verify", str(renamed), "--json"])
    with_ledger = run_local(["verify", str(renamed), "--repo", repo, "--json"])
    assert with_ledger[:2] == plain[:2]
    codes = {f["path"].rsplit("/", 1)[1]: {x["code"] for x in f["findings"]} for f in json.loads(plain[1])["files"]}
    assert codes == {"00000000000000000999.xlog": {"name_mismatch"}, "00000000000000000123.snap": {"kind_mismatch"}}


def test_a_file_replaced_between_its_hash_and_its_scan_is_not_recorded(tmp_path, monkeypatch):
    import walcore.command.verify as verify_mod

    source = tarantool_copy(tmp_path)
    xlog = sorted((source / "wal").glob("*.xlog"))[1]
    good = xlog.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x10
    xlog.write_bytes(bytes(bad))
    real = verify_mod._hash_file

    def hashed_then_replaced(path: str):
        key = real(path)
        if path == str(xlog):  # the damaged bytes were hashed; the good ones are put in place before the scan
            fresh = xlog.with_name("fresh")
            fresh.write_bytes(good)
            os.replace(fresh, xlog)
        return key

    monkeypatch.setattr(verify_mod, "_hash_file", hashed_then_replaced)
    repo = str(new_repository(tmp_path / "repo"))
    assert run_local(["verify", str(source), "--repo", repo, "--jobs", "1"])[0] == 0  # it scanned the good bytes
    monkeypatch.setattr(verify_mod, "_hash_file", real)
    xlog.write_bytes(bytes(bad))
    code, out, _err = run_local(["verify", str(source), "--repo", repo, "--json"])
    assert code == 1, "the damaged bytes were taken for verified ones"
    assert [f["path"] for f in json.loads(out)["files"] if f["status"] == "damaged"] == [str(xlog)]


def test_an_instance_no_repository_name_can_hold_is_scanned_and_not_recorded(tmp_path):
    source = tarantool_copy(tmp_path)
    xlog = sorted((source / "wal").glob("*.xlog"))[0]
    odd = tmp_path / "odd"
    odd.mkdir()
    data = xlog.read_bytes()
    instance = re.search(rb"Instance: (\S+)", data).group(1)
    forged = b"../" + instance[3:]
    (odd / xlog.name).write_bytes(data.replace(b"Instance: " + instance, b"Instance: " + forged, 1))
    repo = str(new_repository(tmp_path / "repo"))
    plain = run_local(["verify", str(odd), "--json"])
    assert run_local(["verify", str(odd), "--repo", repo, "--json"])[:2] == plain[:2]
    assert run_local(["verify", str(odd), "--repo", repo, "--json"])[:2] == plain[:2]  # nothing recorded to reuse
    assert not list(Path(repo).rglob("ledger/*.json"))


def test_a_read_only_repository_still_verifies_and_says_the_report_was_not_kept(tmp_path):
    source = tarantool_copy(tmp_path)
    repo = new_repository(tmp_path / "repo")
    assert run_local(["backup", str(source), "--repo", str(repo)])[0] == 0
    assert run_local(["verify", str(source), "--repo", str(repo)])[0] == 0
    if subprocess.run(["mount", "--bind", str(repo), str(repo)], capture_output=True).returncode:
        pytest.skip("mount --bind is not permitted here")
    try:
        assert subprocess.run(["mount", "-o", "remount,bind,ro", str(repo)], capture_output=True).returncode == 0
        for argv in (["verify", "--repo", str(repo)], ["verify", str(source), "--repo", str(repo)]):
            code, out, err = run_local(argv)
            assert code == 0 and "verdict: INTACT" in out, err
            assert "warning: the report was not kept" in err and "Traceback" not in err
    finally:
        subprocess.run(["umount", "-l", str(repo)], check=False)


def test_a_file_name_that_is_not_utf8_goes_into_the_report_escaped(tmp_path):
    source = tarantool_copy(tmp_path)
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xff"))
    shutil.copytree(source, odd)
    repo = str(new_repository(tmp_path / "repo"))
    code, out, err = run_local(["verify", str(odd), "--repo", repo])
    assert code == 0 and "Traceback" not in err
    rows = _parquet_rows(Repository(repo), report_of(err))
    assert rows and all("bad\\xff" in r["path"] for r in rows)


# --------------------------------------------------------------------------- what stored objects hold


def _forge_damaged_object(repo: Repository, tmp_path: Path) -> str:
    """Replace the newest backup's own copy of a sealed xlog with damaged bytes whose hashes the manifest records
    (what a walvault that missed the damage would have stored): only a scan of the content can find it."""
    from walcore.repository.manifest import MANIFEST_NAME, save_checked

    record = repo.backups()[-1]
    manifest = record.manifest
    entry = next(e for e in manifest.files if e.kind == "xlog" and not e.mutable and e.reference is None)
    data = bytearray(b"".join(repo.read_object(entry.stored, size=entry.size, sha256=entry.sha256,
                                               stored_sha256=entry.stored_sha256)))
    data[len(data) // 2] ^= 0x08
    bad = tmp_path / "damaged.bin"
    bad.write_bytes(bytes(data))
    stored = repo.put_object(entry.stored, bad)
    entry.sha256, entry.stored_sha256, entry.stored_size = stored.sha256, stored.stored_sha256, stored.stored_size
    save_checked(repo.storage, f"{repo.backup_dir(manifest.family, manifest.instance, manifest.id)}/{MANIFEST_NAME}",
                 manifest.to_json())
    return entry.name


def test_verify_of_the_repository_scans_what_objects_hold_and_uses_the_ledger(spark, tmp_path):
    source = tarantool_copy(tmp_path)
    repo_url = str(new_repository(tmp_path / "repo"))
    assert run_local(["backup", str(source), "--repo", repo_url])[0] == 0
    plan = {"repo": repo_url, "options": {"json": True}}
    # the backup put its sealed files' verdicts in the ledger: the newest xlog and vylog (mutable) are scanned,
    # and, being whole, recorded: the next verification scans nothing
    code, out, _err = run_job(spark, "verify", plan, tmp_path)
    assert code == 0 and json.loads(out)["checked_by"] == {"ledger": 6, "scan": 2}
    code, out, _err = run_job(spark, "verify", plan, tmp_path)
    assert code == 0 and json.loads(out)["checked_by"] == {"ledger": 8}
    code, out, _err = run_job(spark, "verify", {**plan, "options": {"json": True, "full": True}}, tmp_path)
    assert code == 0 and json.loads(out)["checked_by"] == {"scan": 8}
    assert out == run_local(["verify", "--repo", repo_url, "--json", "--full"])[1]

    name = _forge_damaged_object(Repository(repo_url), tmp_path)
    code, out, err = run_job(spark, "verify", plan, tmp_path)
    assert (code, out) == run_local(["verify", "--repo", repo_url, "--json"])[:2]
    assert code == 1
    found = [f for b in json.loads(out)["backups"] for f in b["findings"]]
    assert [(f["code"], f["file"]) for f in found] == [("file_damaged", name)] * len(found) and found
    assert "crc_mismatch" in found[0]["message"] or "bad_row" in found[0]["message"], found[0]
    rows = _parquet_rows(Repository(repo_url), report_of(err))
    damaged = [r for r in rows if r["status"] == "damaged"]
    assert len(damaged) == 1 and damaged[0]["checked_by"] == "scan" and damaged[0]["findings"]


def test_a_misnamed_stored_file_is_scanned_though_the_ledger_knows_its_bytes(tmp_path):
    from walcore.repository.manifest import MANIFEST_NAME, save_checked

    source = tarantool_copy(tmp_path)
    repo_url = str(new_repository(tmp_path / "repo"))
    assert run_local(["backup", str(source), "--repo", repo_url])[0] == 0
    assert run_local(["verify", "--repo", repo_url])[0] == 0  # every file's bytes now on record
    repo = Repository(repo_url)
    manifest = repo.backups()[-1].manifest
    entry = next(e for e in manifest.files if e.kind == "xlog" and not e.mutable)
    entry.name = entry.name.rsplit("/", 1)[0] + "/00000000000000009999.xlog"
    save_checked(repo.storage, f"{repo.backup_dir(manifest.family, manifest.instance, manifest.id)}/{MANIFEST_NAME}",
                 manifest.to_json())
    code, out, _err = run_local(["verify", "--repo", repo_url, "--json"])
    assert code == 1
    found = [f for b in json.loads(out)["backups"] for f in b["findings"]]
    assert [(f["code"], f["file"]) for f in found] == [("file_damaged", entry.name)]
    assert "name_mismatch" in found[0]["message"]
    assert list(json.loads(out)["checked_by"]) == sorted(json.loads(out)["checked_by"])


def test_an_object_that_cannot_be_copied_for_its_scan_is_named(tmp_path):
    source = tarantool_copy(tmp_path)
    repo_url = str(new_repository(tmp_path / "repo"))
    assert run_local(["backup", str(source), "--repo", repo_url])[0] == 0
    # 12 KiB of file size: the snapshot's copy (18 KB) cannot be written
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run(["bash", "-c", 'ulimit -f 12; exec "$@"', "-", *walvault_command(), "verify", "--repo",
                           repo_url, "--full"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ".snap.zst: cannot copy it to" in proc.stderr and "to scan it" in proc.stderr
    assert not list(scratch.iterdir()), "a scratch copy was left"

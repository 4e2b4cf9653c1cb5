"""Redundancy that is checked, and retention that cannot surprise (issue 22, §3 and §4's first point).

Each checksummed file of the repository is saved twice (`<name>` and `<name>.copy`): a damaged or missing one of
the two, or two good ones that differ, is a finding of `verify --repo` naming the file and how to mend it, also
when the other one is good. A retention policy whose main file fails its checksum is used from its copy only with
a warning; with both damaged nothing expires. An expiry applies only as of now or earlier, and not on a host whose
clock is behind what the repository records (Debian's faketime sets a process's clock back).

A repository holds a backup of a small data dir written by a real Tarantool (made in process: fast), and every
outcome under test comes from the real `walvault` command, over a local path and a real S3 API on 127.0.0.1.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

import tarantool_real as tr
from conftest import (REPO, RepoTarget, copy_tree, faketime_env, new_repository, require_tarantool, run_main,
                      tree_but_leases, tree_snapshot, walvault_command)
from walcore.repository.manifest import COPY_SUFFIX, encode_checked
from walcore.runner import LocalRunner

pytestmark = require_tarantool
DAY = 86400


@pytest.fixture(scope="module")
def small_instance(tmp_path_factory) -> Path:
    """A small real data dir (one snapshot, a few xlogs). Read only: tests copy it."""
    return tr.generate_instance(tmp_path_factory.mktemp("small"), wal_max_size=16384, scale=1, snapshots=1)


class Repo:
    """The test's repository: walvault's arguments for it, its API in process, its objects read and written
    below walvault's checks."""

    def __init__(self, target):
        self.target, self.cli = target, target.cli

    def storage(self):
        from walcore.repository.storage import open_storage

        storage = open_storage(self.target.url, self.target.options)
        if not storage.caps.consistent_listing:
            storage.fs.invalidate_cache()  # other processes write here
        return storage

    def api(self):
        self.storage()
        return self.target.repository(create=True)

    def read(self, name: str) -> bytes:
        return self.storage().read_bytes(name)

    def write(self, name: str, data: bytes) -> None:
        self.storage().write_bytes(name, data)

    def remove(self, name: str) -> None:
        self.storage().remove(name)

    def objects(self) -> dict[str, str]:
        """Every object -> the SHA-256 of its bytes."""
        storage = self.storage()
        root = storage.root.rstrip("/")
        return {name: hashlib.sha256(b"".join(storage.iter_bytes(name))).hexdigest() for name in storage.list()}

    def backup(self, src: Path, incremental: bool = False) -> str:
        from walcore.command.backup import backup

        return backup(src, self.api(), incremental=incremental, runner=LocalRunner(1)).manifest.id

    def manifest_name(self, backup_id: str) -> str:
        (record,) = [r for r in self.api().backups() if r.id == backup_id]
        return f"{self.api().backup_dir(record.family, record.instance, backup_id)}/backup.manifest"


def _repository(request, small_instance, tmp_path, kind: str) -> tuple[Repo, str]:
    """A repository (a local path, or a bucket of the loopback S3 server) holding one full backup of a copy of
    the small data dir, and a 30-day policy."""
    if kind == "local":
        target = RepoTarget("local", str(tmp_path / "repo"), {})
    else:
        import s3fs

        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"walvault-redundancy-{time.time_ns()}"
        s3fs.S3FileSystem(endpoint_url=endpoint).mkdir(bucket)
        target = RepoTarget("s3", f"s3://{bucket}/repo", {"endpoint_url": endpoint})
    src = copy_tree(small_instance, tmp_path / "src")
    r = Repo(target)
    backup_id = r.backup(src)
    r.api().set_policy(30)
    return r, backup_id


@pytest.fixture(params=["local", "s3"])
def repo(request, small_instance, tmp_path) -> tuple[Repo, str]:
    return _repository(request, small_instance, tmp_path, request.param)


def _flip(data: bytes) -> bytes:
    """One byte of the middle flipped (a digit or a letter of the JSON: what its checksum must catch)."""
    at = len(data) // 2
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def _verify(r: Repo, *args, text: bool = False) -> tuple[int, dict, str]:
    """`verify --repo`: its exit code, its JSON report and (`text`) what it prints without --json."""
    proc = run_main("verify", *r.cli, *args, "--json", "--jobs", "1")
    assert "Traceback" not in proc.stderr, proc.stderr
    printed = ""
    if text:
        plain = run_main("verify", *r.cli, *args, "--jobs", "1")
        assert plain.returncode == proc.returncode, (proc.stderr, plain.stderr)
        printed = plain.stdout
    return proc.returncode, json.loads(proc.stdout), printed


def _all_findings(report: dict) -> list[dict]:
    return report["repository"]["findings"] + [f for b in report["backups"] for f in b["findings"]]


# -- §3: every damaged or missing redundant file is a finding


@pytest.mark.parametrize("storage, which, how, code", [  # S3 where a storage could matter (a listing, a read)
    ("local", "backup.manifest.copy", "flip", "manifest_copy_damaged"),
    ("s3", "backup.manifest.copy", "flip", "manifest_copy_damaged"),
    ("local", "backup.manifest.copy", "delete", "manifest_copy_missing"),
    ("s3", "backup.manifest.copy", "delete", "manifest_copy_missing"),
    ("local", "backup.manifest", "flip", "manifest_damaged"),
    ("local", "walvault.repo.copy", "flip", "info_copy_damaged"),
    ("local", "walvault.repo.copy", "delete", "info_copy_missing"),
    ("local", "walvault.repo", "flip", "info_damaged"),
    ("local", "walvault.policy", "flip", "policy_damaged"),
    ("s3", "walvault.policy", "flip", "policy_damaged"),
    ("local", "walvault.policy.copy", "flip", "policy_copy_damaged"),
    ("local", "walvault.policy.copy", "delete", "policy_copy_missing"),
])
def test_a_damaged_or_missing_redundant_file_is_a_finding(request, small_instance, tmp_path, storage, which, how,
                                                           code):
    r, backup_id = _repository(request, small_instance, tmp_path, storage)
    name = which if which.startswith("walvault.") else r.manifest_name(backup_id) + which[len("backup.manifest"):]
    if how == "flip":
        r.write(name, _flip(r.read(name)))
    else:
        r.remove(name)
    printed = how == "flip" and which in ("backup.manifest.copy", "walvault.policy")  # the text output: twice
    rc, report, text = _verify(r, text=printed)
    assert rc == 1 and not report["intact"]
    (finding,) = [f for f in _all_findings(report) if f["path"] == name]
    assert finding["code"] == code and name in finding["message"]
    if printed:
        assert "verdict: DAMAGED" in text and f"{code}: " in text and name in text
    if which.startswith("walvault.policy"):  # how to mend it: set the policy again (both files are written)
        assert f"walvault policy --repo {r.api().display} --days 30" in finding["message"]
    else:
        good = name[:-len(COPY_SUFFIX)] if name.endswith(COPY_SUFFIX) else name + COPY_SUFFIX
        assert f"copy the bytes of {good}" in finding["message"]
    # the backup itself stays restorable: only its redundancy is gone
    (listed,) = report["backups"]
    assert listed["status"] == "ok"


@pytest.mark.parametrize("which", ["backup.manifest", "walvault.policy"])
def test_a_main_file_that_differs_from_its_good_copy_is_a_finding(request, small_instance, tmp_path, which):
    r, backup_id = _repository(request, small_instance, tmp_path, "local")
    name = which if which == "walvault.policy" else r.manifest_name(backup_id)
    obj = json.loads(r.read(name))
    del obj["checksum"]
    obj["started" if which == "backup.manifest" else "days"] = "2000-01-01T00:00:00Z" if which == "backup.manifest" \
        else 40
    r.write(name + COPY_SUFFIX, encode_checked(obj))  # a good copy (its checksum holds) of other contents
    rc, report, _ = _verify(r)
    assert rc == 1
    (finding,) = [f for f in _all_findings(report) if f["path"] == name + COPY_SUFFIX]
    assert finding["code"].endswith("_copies_differ") and name in finding["message"]


def test_verifying_one_backup_checks_its_parents_manifests_too(small_instance, tmp_path):
    src = copy_tree(small_instance, tmp_path / "src")
    r = Repo(RepoTarget("local", str(tmp_path / "repo"), {}))
    full = r.backup(src)
    tr.write_more(src, rows=200, snapshot=False, seed=5)
    incremental = r.backup(src, incremental=True)
    name = r.manifest_name(full) + COPY_SUFFIX
    r.write(name, _flip(r.read(name)))
    rc, report, text = _verify(r, incremental, text=True)
    assert rc == 1 and name in text
    (finding,) = _all_findings(report)
    assert finding["path"] == name and finding["code"] == "manifest_copy_damaged"
    # the report kept in the repository lists it too (its summary, and a row of its Parquet file)
    import pyarrow.parquet as pq

    summaries = list(Path(r.target.url).glob("reports/verify/*/summary.json"))
    assert len(summaries) == 2  # of the two runs: JSON and text
    for summary in summaries:
        assert [f["path"] for b in json.loads(summary.read_text())["backups"] for f in b["findings"]] == [name]
        rows = pq.read_table(summary.parent / "files.parquet").to_pylist()
        assert [row["findings"][0]["code"] for row in rows if row["path"] == name] == ["manifest_copy_damaged"]


# -- §3: a policy whose checksum fails is never used silently


def test_a_damaged_policy_is_read_from_its_copy_with_a_warning(repo):
    r, _ = repo
    r.write("walvault.policy", _flip(r.read("walvault.policy")))
    proc = run_main("expire", *r.cli, "--json")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(proc.stdout)["policy"] == {"days": 30}
    warning = re.fullmatch(r"walvault: warning: (.*)\n", proc.stderr)
    assert warning, proc.stderr
    assert "walvault.policy " in warning[1] and "read from walvault.policy.copy" in warning[1]
    assert f"walvault policy --repo {r.api().display} --days 30" in warning[1]
    shown = run_main("policy", *r.cli)
    assert shown.returncode == 0 and "keep every point of the last 30 days" in shown.stdout
    assert shown.stderr == proc.stderr
    # setting it again mends both files
    assert run_main("policy", *r.cli, "--days", "30").returncode == 0
    rc, report, _ = _verify(r)
    assert rc == 0 and report["repository"]["findings"] == []


def test_a_policy_damaged_in_both_files_expires_nothing(repo):
    r, _ = repo
    for name in ("walvault.policy", "walvault.policy.copy"):
        r.write(name, _flip(r.read(name)))
    before = {k: v for k, v in r.objects().items() if not k.startswith("locks/")}
    proc = run_main("expire", *r.cli, "--apply")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = re.fullmatch(r"walvault: nothing expired: (.*)\n", proc.stderr)
    assert line, proc.stderr
    assert "walvault.policy " in line[1] and "walvault.policy.copy " in line[1]
    assert f"walvault policy --repo {r.api().display} --days N" in line[1]
    assert {k: v for k, v in r.objects().items() if not k.startswith("locks/")} == before
    rc, report, _ = _verify(r)
    assert rc == 1
    assert {f["code"] for f in report["repository"]["findings"]} == {"policy_damaged", "policy_copy_damaged"}


# -- §4: an apply judges as of now or earlier, on a clock that is not behind the repository


def test_an_apply_as_of_a_future_time_is_refused_and_writes_nothing(repo):
    r, _ = repo
    before = r.objects()
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 31 * DAY))
    proc = run_main("expire", *r.cli, "--as-of", future, "--apply")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.fullmatch(rf"walvault: nothing expired: --as-of {future} is later than now \([^)]+\): [^\n]+\n",
                        proc.stderr), proc.stderr
    assert r.objects() == before, "no lease, no audit record, nothing deleted"
    plan = run_main("expire", *r.cli, "--as-of", future, "--json")  # a plan may look ahead
    assert plan.returncode == 0 and json.loads(plan.stdout)["applied"] is False
    assert r.objects() == before


def _behind(*args, days: int = 2) -> subprocess.CompletedProcess:
    """walvault run on a clock set back by `days` (Debian's faketime)."""
    return subprocess.run([*walvault_command(), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120, cwd=REPO, env=faketime_env(f"-{days}d", TZ="UTC"))


def test_a_clock_behind_the_repository_refuses_an_apply(small_instance, tmp_path):
    src = copy_tree(small_instance, tmp_path / "src")
    repo = new_repository(tmp_path / "repo")
    assert run_main("archive", src, "--repo", repo).returncode == 0
    assert run_main("snapshot", src, "--repo", repo).returncode == 0
    backup = json.loads(run_main("backup", src, "--repo", repo, "--json").stdout)
    now = _behind("--version")  # faketime works on the venv's walvault
    assert now.returncode == 0
    before = tree_snapshot(repo)
    proc = _behind("expire", "--repo", repo, "--days", "1", "--apply")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = re.fullmatch(r"walvault: nothing expired: the clock of this host \((\S+)\) is behind the repository: "
                        r"(.*); fix the clock \(NTP\) before expiring\n", proc.stderr)
    assert line, proc.stderr
    assert abs(calendar.timegm(time.strptime(line[1], "%Y-%m-%dT%H:%M:%SZ")) - (time.time() - 2 * DAY)) < 120
    # the newest record: the backup's finish (the snapshot before it may have finished in the same second)
    assert re.fullmatch(rf"backup \d{{8}}-\d{{6}}[FS] \(tarantool \S+\) finished at {backup['finished']}", line[2])
    assert tree_snapshot(repo) == before, "no lease, no audit record, nothing deleted"
    plan = _behind("expire", "--repo", repo, "--days", "1", "--json")
    assert plan.returncode == 0, plan.stderr
    assert "walvault: warning: the clock of this host" in plan.stderr and "an --apply would be refused" in plan.stderr
    assert json.loads(plan.stdout)["warnings"]
    assert tree_snapshot(repo) == before
    # on time, the same apply runs
    assert run_main("expire", "--repo", repo, "--days", "1", "--apply").returncode == 0


def test_an_audit_record_ahead_of_the_clock_refuses_an_apply(request, small_instance, tmp_path):
    r, _ = _repository(request, small_instance, tmp_path, "local")
    # an expiry's audit record dated one day ahead (another host's clock, or this one set back since)
    r.write(f"audit/{time.strftime('%Y%m%d-%H%M%S', time.gmtime(time.time() + DAY))}-0badc10c/000001.json",
            encode_checked({"run": "ahead"}))
    before = tree_but_leases(Path(r.target.url))
    proc = run_main("expire", *r.cli, "--days", "1", "--apply")
    assert proc.returncode == 2 and "is behind the repository: the expiry audit/" in proc.stderr, proc.stderr
    assert tree_but_leases(Path(r.target.url)) == before

"""Bad input changes nothing: exit 2, one line, no traceback; a repository is made only by `walvault init`; the
password of a running Tarantool never reaches a command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tarantool_real as tr
import test_tarantool_live
from conftest import (REPO, RepoTarget, new_repository, require_tarantool, run_cli, run_main, tree_snapshot,
                      walvault_command)

from test_tarantool_live import PASSWORD, USER

live = test_tarantool_live.live  # a writing instance on a loopback port, its user with a password (a fixture)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A stopped data dir written by real Tarantool (never changed: commands here only read it)."""
    if tr.TARANTOOL is None:
        pytest.skip("real Tarantool not installed")
    return tr.generate_instance(tmp_path_factory.mktemp("inputs-source") / "src", scale=1, snapshots=1)


def _one_line_exit_2(proc, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- --repo: a URL that does not say what it addresses


@pytest.mark.parametrize("url, says", [("", "empty"), ("s3:/b/r", "s3://"), ("xyz:r", "xyz://"),
                                       ("foo://x", "Protocol not known: foo")])
def test_bad_repository_urls_exit_2_and_write_nothing(source, tmp_path, url, says):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    before = tree_snapshot(cwd)
    for command in (["archive", source], ["backup", source], ["backups"], ["init"]):
        proc = run_main(*command, "--repo", url, cwd=cwd)
        _one_line_exit_2(proc, "--repo", says)
        assert tree_snapshot(cwd) == before, command


# -- a repository is made only on purpose


def test_init_makes_a_repository_once_and_refuses_a_directory_of_other_things(tmp_path):
    repo = tmp_path / "deep" / "repo"
    proc = run_main("init", "--repo", repo, "--json")
    assert proc.returncode == 0, proc.stderr
    made = json.loads(proc.stdout)
    assert made["created"] is True and made["format"] >= 1
    assert sorted(p.name for p in repo.iterdir()) == ["walvault.repo", "walvault.repo.copy"]
    before = tree_snapshot(repo)
    again = run_main("init", "--repo", repo)
    assert again.returncode == 0 and "already" in again.stdout, again.stderr
    assert tree_snapshot(repo) == before

    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"\xff\xd8")
    before = tree_snapshot(other)
    _one_line_exit_2(run_main("init", "--repo", other), str(other), "not empty")
    assert tree_snapshot(other) == before
    _one_line_exit_2(run_main("init", "--repo", other / "cat.jpg"), "is not a directory")
    assert tree_snapshot(other) == before


def test_init_over_local_and_s3_storage(repo_target):
    """The same over both kinds of storage: made once, then left alone; a prefix holding other objects refused."""
    from walcore.repository.storage import open_storage

    first = run_main("init", *repo_target.cli, "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["created"] is True
    storage = open_storage(repo_target.url, repo_target.options)
    assert storage.exists("walvault.repo") and storage.exists("walvault.repo.copy")
    second = run_main("init", *repo_target.cli, "--json")
    assert second.returncode == 0 and json.loads(second.stdout)["created"] is False
    other = RepoTarget(repo_target.kind, repo_target.url + "-other", repo_target.options)
    open_storage(other.url, other.options).write_bytes("notes.txt", b"not a repository")
    _one_line_exit_2(run_main("init", *other.cli), "not empty")
    assert not open_storage(other.url, other.options).exists("walvault.repo")
    _one_line_exit_2(run_main("backups", *other.cli), "is not a walvault repository")


@pytest.mark.parametrize("command", [
    ["archive", "SOURCE"], ["backup", "SOURCE"], ["snapshot", "SOURCE"], ["verify", "SOURCE"], ["backups"],
    ["restore", "latest", "TARGET"], ["expire", "--days", "7"], ["policy", "--days", "7"], ["drill", "latest"],
    ["verify"]], ids="-".join)
def test_every_command_on_a_location_without_a_repository_exits_2_and_creates_nothing(source, tmp_path, command):
    mistyped = tmp_path / "repo-typo"
    before = tree_snapshot(tmp_path)
    command = [{"TARGET": tmp_path / "restored", "SOURCE": source}.get(a, a) for a in command]
    proc = run_main(*command, "--repo", mistyped)
    _one_line_exit_2(proc, f"{mistyped} is not a walvault repository", f"walvault init --repo {mistyped}")
    assert not mistyped.exists()
    assert tree_snapshot(tmp_path) == before


# -- restore's target and point


@pytest.fixture(scope="module")
def tarantool_backup(source, tmp_path_factory) -> Path:
    """A repository holding one backup of `source`."""
    repo = tmp_path_factory.mktemp("inputs-backup") / "repo"
    new_repository(repo)
    proc = run_main("backup", source, "--repo", repo)
    assert proc.returncode == 0, proc.stderr
    return repo


@pytest.mark.parametrize("point", ["@1e30", "yesterday", "{1: x}", "epoch:", "1:2:3"])
def test_a_point_that_is_none_exits_2_before_anything_runs(tarantool_backup, tmp_path, point):
    before = tree_snapshot(tmp_path)
    proc = run_main("restore", "latest", tmp_path / "restored", "--repo", tarantool_backup, "--to", point)
    _one_line_exit_2(proc, "--to", "is not a point")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("seconds", ["nan", "inf", "-1"])
def test_wait_must_be_a_finite_number_of_seconds(tmp_path, seconds):
    before = tree_snapshot(tmp_path)
    proc = run_main("backup", tmp_path, "--repo", tmp_path / "repo", "--wait", seconds)
    _one_line_exit_2(proc, "--wait")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("seconds", ["nan", "inf", "0", "-1"])
def test_the_stream_timeout_must_be_a_positive_number_of_seconds(tmp_path, seconds):
    new_repository(tmp_path / "repo")
    before = tree_snapshot(tmp_path)
    proc = run_main("stream", "--connect", "repl@127.0.0.1:1", "--repo", tmp_path / "repo", "--spool",
                    tmp_path / "spool", "--timeout", seconds)
    _one_line_exit_2(proc, "--timeout must be a positive number")
    assert tree_snapshot(tmp_path) == before


@pytest.mark.parametrize("option", [("--spool", "spool"), ("--segment-bytes", "8192"), ("--timeout", "5"),
                                    ("--password-file", "pw")])
def test_options_of_a_tarantool_stream_are_refused_for_a_limestone_directory(tmp_path, option):
    new_repository(tmp_path / "repo")
    (tmp_path / "src").mkdir()
    before = tree_snapshot(tmp_path)
    proc = run_main("stream", tmp_path / "src", "--repo", tmp_path / "repo", *option)
    _one_line_exit_2(proc, "are for --connect (a running Tarantool), not a limestone SOURCE")
    assert tree_snapshot(tmp_path) == before


def test_restore_refuses_a_dangling_symlink_target(tarantool_backup, tmp_path):
    link = tmp_path / "restored"
    link.symlink_to(tmp_path / "nowhere")
    proc = run_cli("restore", "latest", link, "--repo", tarantool_backup)  # once through the real entry point
    _one_line_exit_2(proc, str(link), "symbolic link")
    assert os.listdir(tmp_path) == ["restored"] and link.is_symlink()
    assert not (tmp_path / "nowhere").exists()


def test_restore_refuses_a_target_inside_the_repository(tarantool_backup):
    before = tree_snapshot(tarantool_backup)
    for target in (tarantool_backup / "restored", tarantool_backup / "tarantool" / "restored"):
        _one_line_exit_2(run_main("restore", "latest", target, "--repo", tarantool_backup), str(target),
                         "inside the repository")
    assert tree_snapshot(tarantool_backup) == before


_LOCAL_AFTER_SNAPSHOT = """
box.cfg{work_dir = '.', memtx_dir = '.', wal_dir = '.', vinyl_dir = '.', log_level = 2, checkpoint_count = 10}
local g = box.schema.space.create('g')
g:create_index('pk')
local l = box.schema.space.create('l', {is_local = true})
l:create_index('pk')
for i = 1, 5 do g:insert{i} end
box.snapshot()
for i = 6, 10 do g:insert{i} end
for i = 1, 3 do l:insert{i} end
for i = 11, 15 do g:insert{i} end
os.exit(0)
"""


@require_tarantool
def test_a_vclock_point_without_a_component_says_it_took_it_as_0(tmp_path):
    """The snapshot holds no local row; the log after it does (component 0). A point naming only component 1
    stops before the first local row, and the restore says why."""
    source = tmp_path / "src"
    source.mkdir()
    proc = tr.run_lua_code(_LOCAL_AFTER_SNAPSHOT, cwd=source)
    assert proc.returncode == 0, proc.stderr
    repo = tmp_path / "repo"
    new_repository(repo)
    backup = run_main("backup", source, "--repo", repo, "--json")
    assert backup.returncode == 0, backup.stderr
    position = json.loads(backup.stdout)["position"]["vclock"]
    assert position.get("0") == 3, position
    proc = run_main("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", f"{{1: {position['1']}}}",
                   "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert any("no component 0: taken as 0" in note for note in result["notes"]), result["notes"]
    assert "0" not in result["point"]["vclock"]
    # a point naming both components needs no such note
    proc = run_main("restore", "latest", tmp_path / "restored-all", "--repo", repo, "--to",
                   f"{{1: {position['1']}, 0: 3}}", "--json")
    assert proc.returncode == 0, proc.stderr
    assert not any("taken as 0" in note for note in json.loads(proc.stdout)["notes"])


def test_a_full_target_filesystem_names_the_path_and_leaves_no_staging(tmp_path, real_instance):
    repo = tmp_path / "repo"
    new_repository(repo)
    backup = run_main("backup", real_instance, "--repo", repo, "--json")
    assert backup.returncode == 0, backup.stderr
    assert json.loads(backup.stdout)["bytes"] > 256 << 10, "the backup must not fit in the 128 KiB filesystem"
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here")
    try:
        target = mnt / "restored"
        proc = run_main("restore", "latest", target, "--repo", repo)
        _one_line_exit_2(proc, str(target), "No space left on device", "removed")
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- the configuration file


def test_a_duplicate_key_in_the_configuration_is_refused_naming_it(tmp_path):
    from walvault_provider import config

    path = tmp_path / "walvault.yaml"
    path.write_text("sources: []\nretention:\n  days: 30\nspark: {connections: [spark_default]}\n"
                    "retention:\n  days: 3\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(path)
    assert str(path) in str(e.value) and "'retention'" in str(e.value) and "lines 2 and 5" in str(e.value)
    path.write_text("sources: []\nretention: {days: 30, days: 3}\n")
    with pytest.raises(config.ConfigError, match="'days' is given twice"):
        config.load(path)


# -- the password of --connect


def test_a_spark_plan_keeps_the_password_out_of_the_command_line():
    from spark_jobs.plan import request
    from walcore.tarantool.live import split_password

    plan = {"sources": ["/data/tt"], "repo": "/backups", "options": {"connect": "backup:s3cret:x@y@127.0.0.1:3301"}}
    backup = request(plan, "backup")  # no command line: the job runs the request itself, the password in memory
    assert split_password(backup.connect) == ("backup@127.0.0.1:3301", "s3cret:x@y")
    assert "s3cret" not in repr(backup)
    assert split_password(request({**plan, "options": {"connect": "backup@127.0.0.1:3301"}}, "backup").connect) \
        == ("backup@127.0.0.1:3301", None)


def test_a_password_in_the_uri_is_warned_about_without_being_printed(tmp_path):
    repo = tmp_path / "repo"
    new_repository(repo)
    proc = run_main("backup", tmp_path, "--repo", repo, "--connect", "backup:pw-in-argv@127.0.0.1:1")
    assert proc.returncode == 2
    assert "pw-in-argv" not in proc.stderr + proc.stdout
    assert ("walvault: warning: a password in --connect is visible in the process list; use WALVAULT_PASSWORD or "
            "--password-file") in proc.stderr.splitlines()


def test_a_user_name_with_an_at_sign_still_hides_the_password(tmp_path, monkeypatch):
    """user@domain:password@host:port: the password is found (warned about, never printed), and a password given
    besides it is one line and exit 2, not a traceback."""
    repo = tmp_path / "repo"
    new_repository(repo)
    monkeypatch.setenv("WALVAULT_PASSWORD", "from-env")  # a process: what it reads from its environment
    proc = run_cli("backup", tmp_path, "--repo", repo, "--connect", "me@corp:pw-in-argv@127.0.0.1:1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "pw-in-argv" not in proc.stderr + proc.stdout and "from-env" not in proc.stderr + proc.stdout
    assert "visible in the process list" in proc.stderr


@pytest.mark.parametrize("scheme", ["tarantool", "http"])
def test_a_uri_with_a_scheme_holds_no_password_in_its_colon(tmp_path, monkeypatch, scheme):
    """scheme://user@host:port: the colon after the scheme starts no password (it was taken for one: a false
    warning, and the environment's password not given to the tarantool:// user)."""
    from walcore.requests import connect_with_password

    repo = tmp_path / "repo"
    new_repository(repo)
    monkeypatch.setenv("WALVAULT_PASSWORD", "from-env")
    proc = run_main("backup", tmp_path, "--repo", repo, "--connect", f"{scheme}://backup@127.0.0.1:1")
    assert proc.returncode == 2 and "visible in the process list" not in proc.stderr, proc.stderr
    assert connect_with_password("tarantool://backup@127.0.0.1:1", None) == "tarantool://backup:from-env@127.0.0.1:1"


@pytest.mark.parametrize("problem", ["missing", "empty", "both", "no-connect"])
def test_password_file_problems_exit_2(tmp_path, problem):
    repo = tmp_path / "repo"
    new_repository(repo)
    secret = tmp_path / "password"
    if problem != "missing":
        secret.write_text("" if problem == "empty" else "from-file\n")
    connect = {"both": ["--connect", "backup:in-uri@127.0.0.1:1"], "no-connect": []}.get(
        problem, ["--connect", "backup@127.0.0.1:1"])
    proc = run_main("backup", tmp_path, "--repo", repo, *connect, "--password-file", secret)
    line = _one_line_exit_2(proc, "--password-file")
    assert "from-file" not in line and "in-uri" not in line


def _cmdlines(pid: int) -> list[str]:
    """The command lines of a process and of its descendants now."""
    import psutil

    found = []
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                found.append(Path(f"/proc/{p.pid}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue  # gone meanwhile
    except psutil.NoSuchProcess:
        pass
    return found


def _backup_watching_command_lines(argv: list, env: dict) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run walvault; meanwhile collect the command line of it and of every process under it."""
    seen: list[str] = []
    proc = subprocess.Popen([*walvault_command(), *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=REPO)
    while proc.poll() is None:
        seen += _cmdlines(proc.pid)
        time.sleep(0.005)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), seen


@require_tarantool
@pytest.mark.parametrize("source", ["environment", "file"])
def test_a_live_backup_takes_the_password_from_outside_its_command_line(live, tmp_path, source):
    repo = tmp_path / "repo"
    new_repository(repo)
    env = {k: v for k, v in os.environ.items() if k != "WALVAULT_PASSWORD"}
    args = ["--connect", f"{USER}@127.0.0.1:{live.port}", "--jobs", "2", "--json"]
    if source == "environment":
        env["WALVAULT_PASSWORD"] = PASSWORD
    else:
        secret = tmp_path / "password"
        secret.write_text(PASSWORD + "\n")
        args += ["--password-file", secret]
    proc, seen = _backup_watching_command_lines(["backup", live.work_dir, "--repo", repo, *args], env)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err
    assert len(seen) > 1 and any("backup" in c for c in seen)
    assert not [c for c in seen if PASSWORD in c]
    assert PASSWORD not in out + err and "warning" not in err
    assert json.loads(out)["source"]["live"] is True

    # the password is really used: a wrong one fails to log in
    env["WALVAULT_PASSWORD"] = "not-the-password"
    wrong = subprocess.run([*walvault_command(), "backup", str(live.work_dir), "--repo", str(repo), "--connect",
                            f"{USER}@127.0.0.1:{live.port}"], capture_output=True, text=True, env=env)
    assert wrong.returncode == 2 and "not-the-password" not in wrong.stderr, wrong.stderr


@require_tarantool
def test_a_live_backup_as_a_spark_job_keeps_the_password_out_of_every_command_line(live, tmp_path):
    """spark-submit, its JVM, the Python driver and its workers: none is given the password on its command line."""
    repo = tmp_path / "repo"
    new_repository(repo)
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc, seen = _backup_watching_command_lines(["backup", live.work_dir, "--repo", repo, "--connect",
                                                 f"{USER}@127.0.0.1:{live.port}", "--spark", "local[1]", "--json"],
                                                env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any("spark" in c.lower() and "java" in c for c in seen), "the Spark job's JVM was not seen"
    assert not [c for c in seen if PASSWORD in c]
    assert PASSWORD not in proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["source"]["live"] is True

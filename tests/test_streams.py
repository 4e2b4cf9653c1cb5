"""The walvault-stream service's supervisor (walvault_provider.streams): one `walvault stream` per streamed source
of the configuration, its secrets in its environment only; against a real writing Tarantool
(tests/lua/stream_server.lua): it streams, `status` says the streamer live and lagging by nothing, the freshness
check passes; SIGTERM seals and stores every open segment and the supervisor exits 0; then the streamer is down,
and the check says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import new_repository, require_tarantool, run_cli
from test_stream import PASSWORD, instance  # noqa: F401  (instance: a writing Tarantool, a fixture)
from walvault_provider.config import ConfigError, load
from walvault_provider.operators.walvault import judge
from walvault_provider.streams import inherited_environment, children


def _repo_connection(url: str, **extra) -> str:
    return json.dumps({"conn_type": "walvault_repo", "login": extra.pop("login", None),
                       "password": extra.pop("password", None), "extra": {"url": url, **extra}})


def test_each_streamed_source_gets_a_streamer_whose_secrets_are_in_its_environment(tmp_path, monkeypatch):
    config = tmp_path / "walvault.yaml"
    config.write_text("""
sources:
  - {name: main, family: tarantool, path: /data/main, connection: main_backup, stream: {connection: main_repl}}
  - {name: fast, family: tarantool, path: /data/fast, connection: fast_live, stream: {segment_seconds: 0.25}}
  - {name: plain, family: tarantool, path: /data/plain, connection: plain_live}
""")
    monkeypatch.setenv("AIRFLOW_CONN_WALVAULT_REPO", _repo_connection(
        "s3://bucket/walvault", login="AKIDTEST", password="s3-secret", options={"endpoint_url": "http://minio:9000"}))
    monkeypatch.setenv("AIRFLOW_CONN_MAIN_REPL", "tarantool://repl:repl-secret@tt-main:3301")
    monkeypatch.setenv("AIRFLOW_CONN_FAST_LIVE", "tarantool://bk:fast-secret@tt-fast")
    main, fast = children(load(config), Path("/spool"), "walvault")
    assert (main.source, fast.source) == ("main", "fast"), "one per streamed source, none for the others"
    assert main.argv == ["walvault", "stream", "--connect", "repl@tt-main:3301", "--repo", "s3://bucket/walvault",
                         "--repo-option", 'endpoint_url="http://minio:9000"', "--spool", "/spool/main",
                         "--segment-seconds", "1", "--status", "/spool/main/status.json"]
    assert main.env == {"WALVAULT_PASSWORD": "repl-secret", "AWS_ACCESS_KEY_ID": "AKIDTEST",
                        "AWS_SECRET_ACCESS_KEY": "s3-secret"}
    assert fast.argv[3] == "bk@tt-fast:3301" and fast.argv[fast.argv.index("--segment-seconds") + 1] == "0.25"
    assert fast.env["WALVAULT_PASSWORD"] == "fast-secret"
    for child in (main, fast):
        assert not [w for w in child.argv if "secret" in w], child.argv
    monkeypatch.setenv("AIRFLOW_CONN_WALVAULT_REPO", _repo_connection(
        "s3://bucket/walvault", options={"client_kwargs": {"aws_secret_access_key": "nested-secret"}}))
    with pytest.raises(ConfigError, match="the storage option 'client_kwargs' would go on a command line") as e:
        children(load(config), Path("/spool"), "walvault")
    assert "nested-secret" not in str(e.value)


def test_a_dead_streamer_is_started_again_with_back_off_and_a_stop_reaches_every_live_one(tmp_path):
    """One child dies at once, every time: started again 1 s after, then 2 s. The other runs until the stop, which
    it gets as SIGTERM (then it stores its open segment), and the supervisor returns once it exited."""
    import threading

    from walvault_provider.streams import Child, Supervisor

    starts = tmp_path / "starts"
    dying = [sys.executable, "-c", f"import time; open({str(starts)!r}, 'a').write(f'{{time.time()}}\\n'); "
             "raise SystemExit(1)"]
    lasting = [sys.executable, "-c", "import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
               "time.sleep(120); sys.exit(3)"]
    said: list[str] = []
    supervisor = Supervisor([Child("dies", dying, tmp_path / "a", {}), Child("lasts", lasting, tmp_path / "b", {})],
                            said.append)

    def stop_after_three_starts():
        _wait("three starts", lambda: starts.exists() and len(starts.read_text().split()) >= 3, timeout=60)
        supervisor.stop()

    threading.Thread(target=stop_after_three_starts, daemon=True).start()
    code = supervisor.run()
    stopped = {line.split(":")[0]: line.rsplit(" ", 1)[1] for line in said if "stopped, exit" in line}
    assert stopped["lasts"] == "0", said
    assert code == (0 if set(stopped.values()) == {"0"} else 1), "0 only when every child stopped exited 0"
    first, second, third = (float(t) for t in starts.read_text().split()[:3])
    assert second - first >= 1 and third - second >= 2, "started again at once"
    assert [line.split("; ")[1] for line in said if "exited" in line][:2] == ["started again in 1 s",
                                                                              "started again in 2 s"], said
    assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir(), "each spool made before its child starts"


def _wait(what: str, ready, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (found := ready()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)
    return found


@require_tarantool
def test_the_supervisor_streams_then_sigterm_stores_every_open_segment_and_exits_0(instance, tmp_path):  # noqa: F811
    repo = new_repository(tmp_path / "repo")
    # its directory archived: the status then knows where the source is, and how far its own log reaches
    archived = run_cli("archive", instance.work_dir, "--repo", repo)
    assert archived.returncode == 0, archived.stderr
    config = tmp_path / "walvault.yaml"
    config.write_text(f"sources: [{{name: tt, family: tarantool, path: {instance.work_dir}, connection: tt_live, "
                      "stream: {segment_seconds: 0.5}}]\n")
    freshness = load(config).freshness
    env = {**os.environ, "WALVAULT_CONFIG": str(config), "AIRFLOW_HOME": str(tmp_path / "airflow"),
           "AIRFLOW_CONN_WALVAULT_REPO": _repo_connection(str(repo)),
           "AIRFLOW_CONN_TT_LIVE": f"tarantool://repl:{PASSWORD}@127.0.0.1:{instance.port}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    supervisor = subprocess.Popen([sys.executable, "-m", "walvault_provider.streams", "--spool-root",
                                   str(tmp_path / "spool")], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status_file = tmp_path / "spool" / "tt" / "status.json"
    try:
        _wait("two segments stored", lambda: status_file.exists()
              and json.loads(status_file.read_text())["segments"] >= 2 or supervisor.poll() is not None,
              timeout=90)  # Airflow's import first, on a busy machine
        assert supervisor.poll() is None, supervisor.communicate()
        # the writes stop and the stream catches up: live, lagging the source by nothing
        instance.eval("paused = true")
        written = instance.eval("return box.info.vclock[1]")[0]
        _wait("the stream caught up", lambda: (json.loads(status_file.read_text())["stored"] or {}).get(
            "end", {}).get("1", 0) >= written)
        status = json.loads(run_cli("status", "--repo", repo, "--json").stdout)
        (source,) = [s for s in status["sources"] if s["path"] == str(instance.work_dir.resolve())]
        assert source["stream"]["alive"] is True and source["stream"]["lag_seconds"] == 0.0, source["stream"]
        alerts, lines = judge("tt", instance.work_dir, status, freshness, streamed=True)
        assert "stream" not in alerts and any(line.startswith("stream live") for line in lines), (alerts, lines)
        instance.eval("paused = false")
        time.sleep(0.3)  # writes again: a segment is open when the signal comes
    finally:
        supervisor.send_signal(signal.SIGTERM)
        out, err = supervisor.communicate(timeout=90)
    assert supervisor.returncode == 0, err
    assert "Traceback" not in err and PASSWORD not in err, err
    final = json.loads(status_file.read_text())
    assert final["connected"] is False and final["stored"]["end"] == final["vclock"], final
    assert not list((tmp_path / "spool" / "tt").rglob("open.xlog")), "the open segment was left in the spool"
    status = json.loads(run_cli("status", "--repo", repo, "--json").stdout)
    (source,) = [s for s in status["sources"] if s["path"] == str(instance.work_dir.resolve())]
    assert source["stream"]["alive"] is False and source["stream"]["segments"] >= 3, source["stream"]
    alerts, _ = judge("tt", instance.work_dir, status, freshness, streamed=True)
    assert alerts["stream"].startswith("stream of tt is down: no live walvault stream renews its lease; its newest "
                                       "stored commit is of "), alerts


def test_the_archive_log_says_whether_a_streamed_sources_streamer_is_live(tmp_path):
    """The archive forces no seal on a Tarantool and still archives what it sealed (local spaces' rows, the copy
    that supersedes the segments): for a streamed source its log says whether the streamer is live."""
    from conftest import TARANTOOL_FIXTURES, copy_tree
    from walcore.repository import Repository
    from walcore.tarantool.family import Tarantool
    from walvault_provider.operators.walvault import streamed_lines

    tt = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "tt")
    config = tmp_path / "walvault.yaml"
    config.write_text(f"sources: [{{name: tt, family: tarantool, path: {tt}, connection: c, stream: {{}}}}, "
                      f"{{name: plain, family: tarantool, path: {tt}}}]\n")
    sources = load(config).sources
    repo = Repository(str(new_repository(tmp_path / "repo")))
    assert streamed_lines(repo, sources) == ["tt: streamed, but no live walvault stream renews its lease: only what "
                                             "the instance sealed is archived"]
    with repo.stream_lease("tarantool", Tarantool().source_instance(tt)):
        (line,) = streamed_lines(repo, sources)
    assert line.startswith(f"tt: streamed by {socket.gethostname()} (pid {os.getpid()}, its lease renewed ")
    assert line.endswith("): nothing forced; the sealed files archived still hold its local spaces' rows and "
                         "supersede its segments")


def test_a_streamer_inherits_no_airflow_connection_or_variable(monkeypatch):
    """Each child gets its own source's secrets (Child.env); the supervisor's other connections stay with it."""
    monkeypatch.setenv("AIRFLOW_CONN_OTHER_SOURCE", "tarantool://bk:other-secret@elsewhere:3301")
    monkeypatch.setenv("AIRFLOW_VAR_TOKEN", "var-secret")
    monkeypatch.setenv("WALVAULT_CONFIG", "/etc/walvault.yaml")
    inherited = inherited_environment()
    assert "AIRFLOW_CONN_OTHER_SOURCE" not in inherited and "AIRFLOW_VAR_TOKEN" not in inherited
    assert inherited["WALVAULT_CONFIG"] == "/etc/walvault.yaml" and inherited["PATH"] == os.environ["PATH"]

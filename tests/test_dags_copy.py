"""The backup DAG copies each verified backup into the second repository the configuration names (`copy_to`), run
by `airflow dags test` as tests/test_dags.py runs the DAGs: a real metadata database (SQLite), a real limestone
source, the Spark backup job on local[2], both repositories on local paths."""

from __future__ import annotations

import json

from conftest import airflow_sources, new_repository, require_limestone, require_tarantool, run_cli
from devenv import environment, migrate
from forked_airflow import airflow

pytestmark = [require_tarantool, require_limestone]


def _files(root) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_verified_backup_is_copied_to_the_second_repository(tmp_path):
    _tt, _ls, config = airflow_sources(tmp_path)
    config.write_text(config.read_text() + "copy_to: walvault_repo_copy\n")
    repo, second = tmp_path / "repo", new_repository(tmp_path / "second")
    env = environment(tmp_path / "home", config=config, repository=str(repo), work_dir=tmp_path / "work",
                      connections={"walvault_repo_copy": {"conn_type": "walvault_repo", "extra": {"url": str(second)}}})
    migrate(env)
    proc = airflow(env, "dags", "test", "walvault_backup", "--conf",
                   json.dumps({"source": "ls", "type": "full", "verify": True}))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in log, log[-6000:]
    assert f"--to {second} (connection walvault_repo_copy)" in log and "copied backup " in log, log[-6000:]

    (backup,) = json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
    assert [c["to"] for c in backup["copies"]] == [str(second.resolve())]
    (copied,) = json.loads(run_cli("backups", "--repo", second, "--json").stdout)["backups"]
    assert (copied["id"], copied["status"], copied["position"]) == (backup["id"], "ok", backup["position"])
    assert run_cli("verify", "--repo", second).returncode == 0
    for where, name in ((repo, "from-first"), (second, "from-second")):
        assert run_cli("restore", backup["id"], tmp_path / name, "--repo", where).returncode == 0
    assert _files(tmp_path / "from-second") == _files(tmp_path / "from-first")

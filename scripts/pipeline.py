"""The README's main job: walvault's real pipeline on its embedded defaults, on this machine.

It makes real sources (a Tarantool it starts on 127.0.0.1 under var/sources/tarantool-local, and a copy of the
bundled limestone sample under var/sources/limestone-samples), then runs `airflow dags test` of walvault_archive,
walvault_backup (each source), walvault_snapshot, walvault_retention (a dry run) and walvault_status (every
source fresh; the Prometheus textfile var/walvault.prom) with the configuration dags/walvault.yaml, a SQLite
metadata database in var/airflow, the repository var/repository and Spark on local[2], and prints what is in the
repository. Each DAG's log is kept in var/logs. Run again, it adds rows to
the Tarantool and goes on from what the repository holds (incremental backups, nothing archived twice).

Usage: .venv/bin/python scripts/pipeline.py      (scripts/setup runs it)
Exit: 0 every DAG succeeded, 1 one failed (its log's last lines are shown), 2 it could not start.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from devenv import BIN, CHECKOUT, LocalTarantool, airflow, environment, migrate

VAR = CHECKOUT / "var"
CONFIG = CHECKOUT / "dags" / "walvault.yaml"
REPOSITORY = VAR / "repository"
SAMPLE = CHECKOUT / "samples" / "limestone" / "01-clean"
_LOG_SUFFIX = re.compile(r"\s+\[[\w.]+\] loc=\S+$")  # what Airflow's log format appends to a task's last line


def say(message: str) -> None:
    print(f"pipeline: {message}", flush=True)


def walvault(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "walvault"), *args], capture_output=True, text=True)


def limestone_source(config) -> Path:
    """The bundled sample, copied once (to a temporary name, then renamed: a killed copy is never taken for the
    source); later runs keep what rotation did to the copy."""
    path = config.source("limestone-samples").path
    if not path.exists():
        partial = path.with_name(f".{path.name}.copying")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(SAMPLE, partial)
        for p in [partial, *partial.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
        partial.rename(path)
    return path


def full_backup_exists(source: Path) -> bool:
    from walcore.repository import Repository

    if not (REPOSITORY / "walvault.repo").exists():
        return False
    return any(m.type == "full" for m in Repository(str(REPOSITORY)).backups_of(source))


def dags_test(env: dict, dag_id: str, conf: dict | None = None) -> str:
    label = dag_id + (f" {json.dumps(conf)}" if conf else "")
    VAR.joinpath("logs").mkdir(parents=True, exist_ok=True)
    log = VAR / "logs" / f"{dag_id}{'-' + conf['source'] if conf else ''}.log"
    started = time.monotonic()
    proc = airflow(env, "dags", "test", dag_id, *(["--conf", json.dumps(conf)] if conf else []))
    output = proc.stdout + proc.stderr
    log.write_text(output)
    took = time.monotonic() - started
    if proc.returncode != 0 or "Traceback" in output:
        say(f"airflow dags test {label}: FAILED after {took:.0f} s; the last lines of {log}:")
        print("\n".join(output.splitlines()[-40:]), file=sys.stderr)
        raise SystemExit(1)
    say(f"airflow dags test {label}: success in {took:.0f} s (log: {log.relative_to(CHECKOUT)})")
    return output


def summary(output: str, title: str) -> list[str]:
    """The readable summary a walvault task ends its log with: its title line and the indented lines after it."""
    lines = output.splitlines()
    start = max((i for i, line in enumerate(lines) if title in line), default=None)
    if start is None:
        return []
    block = [lines[start][lines[start].index(title):]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return [_LOG_SUFFIX.sub("", line) for line in block]


def main() -> int:
    from walvault_provider.config import ConfigError, load

    for sig in (signal.SIGTERM, signal.SIGHUP):  # stopped from outside: stop the Tarantool too (finally below)
        signal.signal(sig, lambda number, _: sys.exit(128 + number))
    try:
        config = load(CONFIG)
        tarantool = LocalTarantool(config.source("tarantool-local").path)
        limestone = limestone_source(config)
    except (ConfigError, OSError) as e:
        say(f"cannot start: {e}")
        return 2
    try:
        say(f"starting tarantool on 127.0.0.1 with {tarantool.data_dir.relative_to(CHECKOUT)}")
        try:
            tarantool.start()
        except (RuntimeError, TimeoutError, OSError) as e:
            say(f"cannot start: {e}")
            return 2
        env = environment(VAR / "airflow", config=CONFIG, repository=str(REPOSITORY), work_dir=VAR / "work",
                          connections={"tarantool_local": tarantool.connection()})
        say("airflow db migrate (SQLite in var/airflow)")
        try:
            migrate(env)
        except RuntimeError as e:
            say(f"cannot start: {e}")
            return 2
        say(f"walvault init --repo {REPOSITORY.relative_to(CHECKOUT)}")
        made = walvault("init", "--repo", str(REPOSITORY))
        if made.returncode != 0:
            say(f"cannot start: {made.stderr.strip()}")
            return 2
        dags_test(env, "walvault_archive")
        for name, path in (("tarantool-local", tarantool.data_dir), ("limestone-samples", limestone)):
            kind = "incremental" if full_backup_exists(path) else "full"
            dags_test(env, "walvault_backup", {"source": name, "type": kind, "verify": True})
        dags_test(env, "walvault_snapshot")
        retention = dags_test(env, "walvault_retention")
        dags_test(env, "walvault_status")
    except subprocess.TimeoutExpired as e:
        say(f"{' '.join(e.cmd[1:])}: no end after {e.timeout:.0f} s: stopped")
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        tarantool.stop()
    say(f"the repository {REPOSITORY.relative_to(CHECKOUT)}:")
    print(walvault("backups", "--repo", str(REPOSITORY)).stdout.rstrip())
    for family in sorted(p for p in REPOSITORY.iterdir() if p.name in ("tarantool", "limestone")):
        for instance in sorted(family.iterdir()):
            stored = [p for p in (instance / "archive").rglob("*.zst") if p.is_file()]
            print(f"archive of {family.name} {instance.name}: {len(stored)} files, "
                  f"{sum(p.stat().st_size for p in stored):,} bytes stored")
    print("\n".join(summary(retention, "walvault expire:")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

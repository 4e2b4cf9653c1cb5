"""The walvault-stream service: one `walvault stream` per streamed source of the configuration (a Tarantool source
with `stream`), each a child process of this supervisor, for as long as the service runs.

    python -m walvault_provider.streams [--spool-root DIR]

- What a child needs comes from the configuration and the Airflow connections it names, as the operators read
  them: the instance's address and user (`stream.connection`, else the source's `connection`) and the repository
  (`repository.connection`). Secrets reach a child in its environment, never its command line (readable by every
  process of the host): the user's password as WALVAULT_PASSWORD, an S3 repository's keys as AWS_ACCESS_KEY_ID
  and AWS_SECRET_ACCESS_KEY.
- Each source's spool is `<spool root>/<source name>` (on a volume: a restarted service goes on from the open
  segment), its status file `status.json` in it.
- A child that exits is started again after a back-off, 1 s doubling to 60 s, back to 1 s once a child ran a
  minute: an instance unreachable at start (exit 2), or a lease another streamer still holds (exit 1), passes.
- SIGTERM or SIGINT is forwarded to every child, which seals and stores its open segment; the supervisor exits
  when every child has: 0 when each exited 0, else 1. With no streamed source it says so and waits for the
  signal (a service that exited would be started again, and again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BACKOFF_FIRST, BACKOFF_MAX = 1.0, 60.0  # seconds before a dead child is started again: doubled after each death
HEALTHY_RUN = 60.0  # a child that ran this long died of something new: its back-off starts over
DEFAULT_SPOOL_ROOT = Path("var/stream-spool")
# S3 storage options that are secrets, and the variable boto reads each from instead of a command line
_SECRET_OPTIONS = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN"}


@dataclass(frozen=True)
class Child:
    """One streamed source's `walvault stream`: its command line (no secret), its spool (made before it starts:
    the status file is in it) and the environment it adds."""
    source: str
    argv: list[str]
    spool: Path
    env: dict[str, str]


def children(config, spool_root: Path, walvault: str = "walvault") -> list[Child]:
    """The streamer of each streamed source of `config` (walvault_provider.config.Config)."""
    from walcore.tarantool.live import split_password

    from .config import ConfigError
    from .hooks.tarantool import TarantoolHook
    from .hooks.walvault import WalvaultRepoHook

    streamed = [s for s in config.sources if s.stream is not None]
    if not streamed:
        return []
    target = WalvaultRepoHook(config.repository_connection).target()
    repo_args, repo_env = ["--repo", target.url], {"WALVAULT_KEY": target.passphrase} if target.passphrase else {}
    for key, value in sorted(target.options.items()):
        if key in _SECRET_OPTIONS:
            repo_env[_SECRET_OPTIONS[key]] = str(value)
        elif _names_a_secret(key, value):
            raise ConfigError(f"connection {config.repository_connection!r}: the storage option {key!r} would go "
                              "on a command line: give it to the streamers' environment as boto reads it instead")
        else:
            repo_args += ["--repo-option", f"{key}={json.dumps(value)}"]
    found = []
    for source in streamed:
        address, password = split_password(TarantoolHook(source.stream.connection).uri())
        spool = spool_root / source.name
        argv = [walvault, "stream", "--connect", address, *repo_args, "--spool", str(spool),
                "--segment-seconds", f"{source.stream.segment_seconds:g}", "--status", str(spool / "status.json")]
        found.append(Child(source.name, argv, spool, {**repo_env, "WALVAULT_PASSWORD": password or ""}))
    return found


def _names_a_secret(key: str, value) -> bool:
    """Whether a storage option, or one nested in it, is named as a secret is."""
    nested = value.items() if isinstance(value, dict) else ()
    return any(word in key.lower() for word in ("secret", "password", "token", "key")) or any(
        _names_a_secret(k, v) for k, v in nested)


def inherited_environment() -> dict[str, str]:
    """The supervisor's environment less Airflow's connections and variables: a streamer gets its own source's
    secrets (Child.env), not every other source's."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))}


class Supervisor:
    """Runs `children`, starting a dead one again after its back-off, until `stop()`; `run()` returns the exit
    status."""

    def __init__(self, children: list[Child], say=print):
        self.children, self.say = children, say
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> int:
        procs: dict[str, subprocess.Popen] = {}
        started: dict[str, float] = {}
        backoff = {c.source: BACKOFF_FIRST for c in self.children}
        due = {c.source: 0.0 for c in self.children}  # when a child is (re)started (monotonic)
        while not self.stopping.is_set():
            now = time.monotonic()
            for child in self.children:
                proc = procs.get(child.source)
                if proc is not None and proc.poll() is not None:
                    ran = now - started[child.source]
                    if ran >= HEALTHY_RUN:
                        backoff[child.source] = BACKOFF_FIRST
                    self.say(f"{child.source}: walvault stream exited {proc.returncode} after {ran:.0f} s; started "
                             f"again in {backoff[child.source]:g} s")
                    due[child.source] = now + backoff[child.source]
                    backoff[child.source] = min(backoff[child.source] * 2, BACKOFF_MAX)
                    del procs[child.source]
                if child.source not in procs and now >= due[child.source]:
                    child.spool.mkdir(parents=True, exist_ok=True)
                    procs[child.source] = subprocess.Popen(child.argv, env={**inherited_environment(), **child.env},
                                                           stdin=subprocess.DEVNULL)
                    started[child.source] = now
                    self.say(f"{child.source}: started walvault stream (pid {procs[child.source].pid}): "
                             + " ".join(child.argv[1:]))
            self.stopping.wait(0.5)
        for proc in procs.values():  # each seals and stores its open segment
            proc.send_signal(signal.SIGTERM)
        codes = {source: proc.wait() for source, proc in procs.items()}
        for source, code in sorted(codes.items()):
            self.say(f"{source}: walvault stream stopped, exit {code}")
        return 0 if all(code == 0 for code in codes.values()) else 1


def main(argv: list[str] | None = None) -> int:
    from airflow.sdk.exceptions import AirflowException

    from .config import ConfigError, load

    parser = argparse.ArgumentParser(prog="python -m walvault_provider.streams",
                                     description="Run `walvault stream` for each streamed source of the walvault "
                                     "configuration (WALVAULT_CONFIG) until SIGTERM.")
    parser.add_argument("--spool-root", type=Path, default=DEFAULT_SPOOL_ROOT, metavar="DIR",
                        help="each source's spool is DIR/<source name> (default var/stream-spool)")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(f"walvault streams: {line}", file=sys.stderr, flush=True)

    walvault = shutil.which("walvault")
    if walvault is None:
        say("the walvault command is not on PATH")
        return 2
    try:
        found = children(load(), args.spool_root, walvault)
    except (ConfigError, AirflowException) as e:  # a connection missing or unusable
        say(str(e))
        return 2
    if not found:
        say("no source of the configuration is streamed (a Tarantool source's `stream`): nothing to run")
    supervisor = Supervisor(found, say)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: supervisor.stop())
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())

"""The Airflow UI on this machine, on walvault's embedded defaults: api-server, scheduler and dag-processor on
127.0.0.1 (not `airflow standalone`), the metadata database and the repository of the main job (var/airflow,
var/repository), and the Tarantool of dags/walvault.yaml started on 127.0.0.1. It prints the address and the
login, then runs until Ctrl-C, which stops everything it started.

Usage: .venv/bin/python scripts/ui.py [--port 8080] [--spark-master local[2]]
The processes' logs go to var/logs/ui/.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from devenv import ADMIN, CHECKOUT, UI, LocalTarantool, environment, migrate

VAR = CHECKOUT / "var"
CONFIG = CHECKOUT / "dags" / "walvault.yaml"


def main() -> int:
    from walvault_provider.config import load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080, help="the api-server's port on 127.0.0.1 (default 8080)")
    parser.add_argument("--spark-master", default="local[2]",
                        help="the spark_default connection's master (default local[2]; spark://127.0.0.1:7077)")
    args = parser.parse_args()
    tarantool = LocalTarantool(load(CONFIG).source("tarantool-local").path)
    ui = None
    for sig in (signal.SIGTERM, signal.SIGHUP):  # stopped from outside: stop everything (finally below)
        signal.signal(sig, lambda number, _: sys.exit(128 + number))
    try:
        tarantool.start(rows=1000)
        env = environment(VAR / "airflow", config=CONFIG, repository=str(VAR / "repository"), work_dir=VAR / "work",
                          spark_master=args.spark_master, connections={"tarantool_local": tarantool.connection()},
                          api_port=args.port)
        migrate(env)
        ui = UI(env, VAR / "logs" / "ui").start()
        print(f"Airflow UI: {ui.url}/  login: {ADMIN} / {ui.admin_password()}\n"
              f"  (logs: {ui.log_dir}; Ctrl-C stops the UI and the Tarantool on port {tarantool.port})", flush=True)
        while True:
            exited = [name for name, proc in ui.processes.items() if proc.poll() is not None]
            if exited:
                print(f"airflow {exited[0]} exited: see {ui.log_dir}/{exited[0]}.log", file=sys.stderr)
                return 1
            time.sleep(2)
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, TimeoutError, OSError) as e:
        print(f"ui: {e}", file=sys.stderr)
        return 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second signal must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        if ui is not None:
            ui.stop()
        tarantool.stop()


if __name__ == "__main__":
    sys.exit(main())

"""The Tarantool hook: a running Tarantool instance addressed by an Airflow connection (type `tarantool`).

A source whose instance runs is backed up and snapshotted through it (box.backup.start() pins its checkpoint):
the connection holds its `host`, `port` (3301 when empty), and the `login` and `password` of a user with
'execute' on 'universe'. The password reaches walcore in memory or in a Spark job's plan file, never a command line.
"""

from __future__ import annotations

from airflow.sdk import BaseHook

DEFAULT_PORT = 3301


class TarantoolHook(BaseHook):
    conn_name_attr = "tarantool_conn_id"
    default_conn_name = "tarantool_default"
    conn_type = "tarantool"
    hook_name = "Tarantool (running instance)"

    def __init__(self, tarantool_conn_id: str = default_conn_name, **kwargs):
        super().__init__(**kwargs)
        self.tarantool_conn_id = tarantool_conn_id

    def uri(self) -> str:
        """[user:password@]host:port of the instance, as walcore's live commands take it."""
        conn = self.get_connection(self.tarantool_conn_id)
        auth = f"{conn.login}:{conn.password or ''}@" if conn.login else ""  # no password: empty, not "None"
        return f"{auth}{conn.host}:{conn.port or DEFAULT_PORT}"

    def test_connection(self) -> tuple[bool, str]:
        """Connects over iproto as the connection's user and reads box.info.vclock, as a backup's first call does."""
        from walcore.tarantool.live import current_vclock, redact_uri

        try:
            uri = self.uri()
            vclock = current_vclock(uri, timeout=10)
        except Exception as e:  # shown in the UI's connection test, whatever went wrong
            return False, str(e)
        return True, f"Tarantool at {redact_uri(uri)} answers: vclock {vclock}"

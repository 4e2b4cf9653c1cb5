"""The repository hook: a walvault repository addressed by an Airflow connection (`walvault_repo` by default).

The connection holds what the configuration file must not: where the repository is and its credentials.
- conn_type `walvault_repo` (any type works): `extra` {"url": "/backups" | "s3://bucket/prefix", "options": {...}}
  (fsspec storage options, e.g. {"endpoint_url": "http://127.0.0.1:9000"}); without `url`, `host` is the path.
- For S3, `login` and `password` are the access key id and the secret; they go to the storage options, which
  reach a Spark job only through its plan file (mode 0600, removed by the job once read), never a command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException


class RepositoryMissing(AirflowException):
    """The connection names a location holding no repository, and the configuration does not create one."""


@dataclass
class RepoTarget:
    url: str
    options: dict = field(default_factory=dict)  # fsspec storage options, credentials included


class WalvaultRepoHook(BaseHook):
    conn_name_attr = "walvault_conn_id"
    default_conn_name = "walvault_repo"
    conn_type = "walvault_repo"
    hook_name = "walvault repository"

    def __init__(self, walvault_conn_id: str = default_conn_name, **kwargs):
        super().__init__(**kwargs)
        self.walvault_conn_id = walvault_conn_id

    def target(self) -> RepoTarget:
        conn = self.get_connection(self.walvault_conn_id)
        extra = conn.extra_dejson or {}
        url = extra.get("url") or conn.host
        if not url:
            raise AirflowException(f"connection {self.walvault_conn_id!r}: no repository (extra 'url', or host)")
        options = dict(extra.get("options") or {})
        if str(url).startswith("s3://") and conn.login:
            options.update({"key": conn.login, "secret": conn.password or ""})
        return RepoTarget(str(url), options)

    def repository(self, *, create: bool = False):
        """The walcore Repository the connection names; with `create` (the configuration's `repository.create`)
        made where there is none, else a missing one is refused, named (a mistyped path must not become a new
        empty repository)."""
        return self.opened(create=create)[1]

    def opened(self, *, create: bool = False):
        """The connection's target (what a request names the repository by: its url and options) and its
        Repository, as `repository` opens it."""
        from walcore.repository import Repository
        from walcore.repository.manifest import read_info
        from walcore.repository.storage import open_storage

        target = self.target()
        storage = open_storage(target.url, target.options)
        if not create and read_info(storage) is None:
            raise RepositoryMissing(f"{storage.display} (connection {self.walvault_conn_id!r}) holds no walvault "
                                    f"repository: create it with `walvault init --repo {storage.display}`, or set "
                                    "`repository.create: true` in the walvault configuration")
        return target, Repository(target.url, target.options, create=create)

    def test_connection(self) -> tuple[bool, str]:
        try:
            repo = self.repository()
        except Exception as e:  # shown in the UI's connection test, whatever went wrong
            return False, str(e)
        return True, f"walvault repository {repo.display} (format {repo.info.get('format')})"


def tarantool_uri(conn_id: str) -> str:
    """[user:password@]host:port of a running Tarantool, from its Airflow connection."""
    conn = BaseHook.get_connection(conn_id)
    auth = f"{conn.login}:{conn.password}@" if conn.login else ""
    return f"{auth}{conn.host}:{conn.port or 3301}"

"""The repository hook: a walvault repository addressed by an Airflow connection (`walvault_repo` by default).

The connection holds what the configuration file must not: where the repository is and its credentials.
- conn_type `walvault_repo` (any type works; this type's form in the UI asks for the url and the options):
  `extra` {"url": "/backups" | "s3://bucket/prefix", "options": {...}} (fsspec storage options, e.g.
  {"endpoint_url": "http://127.0.0.1:9000"}, or their JSON text); without `url`, `host` is the path.
- For S3, `login` and `password` are the access key id and the secret; they go to the storage options, which
  reach a Spark job only through its plan file (mode 0600, removed by the job once read), never a command line.
- An encrypted repository's key (docs/encryption.md): `extra` {"passphrase": "..."} (Airflow masks a field of
  that name); it reaches walvault as WALVAULT_KEY in the task's process, a Spark job's driver in its plan file
  (mode 0600, as the secrets above), never in options, requests or command lines.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowFailException


# The passphrase `opened` put in each environment variable, and what the variable held before (None: unset): a
# later connection without one gives the variable back its own value.
_PUT: dict[str, tuple[str, str | None]] = {}


def _held_back(env: str) -> bool:
    """Give the variable back what it held before `opened` put a connection's passphrase there (when that is still
    in it); whether it did."""
    put, held = _PUT[env]
    if os.environ.get(env) != put:
        return False
    if held is None:
        del os.environ[env]
    else:
        os.environ[env] = held
    return True


@contextlib.contextmanager
def without_connection_keys():
    """The process's environment without the passphrases `opened` put there, for a while (as it was before): a
    process started meanwhile (spark-submit) is given its key otherwise, or the deployment's."""
    given_back = [env for env in _PUT if _held_back(env)]
    try:
        yield
    finally:
        for env in given_back:
            os.environ[env] = _PUT[env][0]


class RepositoryMissing(AirflowFailException):
    """The connection names a location holding no repository, and the configuration does not create one (not
    retried: someone must create it, or mend the connection)."""


@dataclass
class RepoTarget:
    url: str
    options: dict = field(default_factory=dict)  # fsspec storage options, credentials included
    passphrase: str | None = field(default=None, repr=False)  # an encrypted repository's key


def _storage_options(conn_id: str, options) -> dict:
    """The connection's storage options: a mapping, or its JSON text (as a form's text field may keep it)."""
    import json

    if isinstance(options, str) and options.strip():
        try:
            options = json.loads(options)
        except ValueError as e:
            raise AirflowException(f"connection {conn_id!r}: extra 'options' is not JSON: {e}") from None
    if options and not isinstance(options, dict):
        raise AirflowException(f"connection {conn_id!r}: extra 'options' is not a mapping of storage options")
    return dict(options or {})


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
        options = _storage_options(self.walvault_conn_id, extra.get("options"))
        if str(url).startswith("s3://") and conn.login:
            options.update({"key": conn.login, "secret": conn.password or ""})
        return RepoTarget(str(url), options, extra.get("passphrase") or None)

    def repository(self, *, create: bool = False):
        """The walcore Repository the connection names; with `create` (the configuration's `repository.create`)
        made where there is none, else a missing one is refused, named (a mistyped path must not become a new
        empty repository)."""
        return self.opened(create=create)[1]

    def opened(self, *, create: bool = False, key_env: str | None = None):
        """The connection's target (what a request names the repository by: its url and options) and its
        Repository, as `repository` opens it. Its passphrase goes into `key_env` (default WALVAULT_KEY;
        WALVAULT_TO_KEY for a copy's destination, whose key must not stand in for the source's)."""
        from walcore.repository import Repository
        from walcore.repository.manifest import read_info
        from walcore.repository.storage import open_storage

        from walcore.repository.encrypted import KEY_ENV

        target, env = self.target(), key_env or KEY_ENV
        if target.passphrase:  # the commands this task runs, and the processes they start, take the key from there
            _PUT[env] = (target.passphrase, _PUT[env][1] if env in _PUT else os.environ.get(env))
            os.environ[env] = target.passphrase
        elif env in _PUT:
            # another connection's, put there for an earlier task of this process (`airflow dags test` runs them
            # all in one): not this repository's key; the environment's own, if it had one, comes back
            _held_back(env)
            del _PUT[env]
        storage = open_storage(target.url, target.options)
        if not create and read_info(storage) is None:
            raise RepositoryMissing(f"{storage.display} (connection {self.walvault_conn_id!r}) holds no walvault "
                                    f"repository: create it with `walvault init --repo {storage.display}`, or set "
                                    "`repository.create: true` in the walvault configuration")
        return target, Repository(target.url, target.options, create=create, key=target.passphrase, key_env=key_env)

    def test_connection(self) -> tuple[bool, str]:
        try:
            repo = self.repository()
        except Exception as e:  # shown in the UI's connection test, whatever went wrong
            return False, str(e)
        return True, f"walvault repository {repo.display} (format {repo.info.get('format')})"

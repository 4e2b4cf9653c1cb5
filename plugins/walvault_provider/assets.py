"""walvault's Airflow assets: per configured source, its backups (`walvault://REPO/SOURCE/backup`) and its covering
snapshots (`walvault://REPO/SOURCE/snapshot`), REPO the repository connection's id. walvault_backup updates a
source's backup asset (through the alias BACKUPS_ALIAS: its mapped tasks update only their own source's asset),
walvault_snapshot runs on them and updates the snapshot assets, walvault_retention runs on those: the order follows
the data. Each event's metadata says what was made: the backup or snapshot id, its position and bytes.

The provider registers the `walvault` URI scheme (get_provider_info's `asset-uris`): sanitize_uri() refuses a
walvault URI that does not name a repository, a source and a kind. Importing this module imports only Airflow's
asset definitions.
"""

from __future__ import annotations

from urllib.parse import SplitResult

from airflow.sdk import Asset, AssetAlias, AssetAny

from .config import DATA_SCHEDULES

SCHEME = "walvault"
KINDS = ("backup", "snapshot")
BACKUP_DAG = "walvault_backup"  # the DAG whose backup events a snapshot run follows
BACKUPS_ALIAS = AssetAlias(name="walvault_backups")  # what walvault_backup's mapped tasks update their source's by


def create_asset(*, repository: str, source: str, kind: str) -> Asset:
    """The asset of one source's backups or snapshots in a repository (named by its connection id)."""
    if kind not in KINDS:
        raise ValueError(f"{kind!r} is not one of {', '.join(KINDS)}")
    return Asset(uri=f"{SCHEME}://{repository}/{source}/{kind}", group="walvault")


def sanitize_uri(parts: SplitResult) -> SplitResult:
    """Airflow's check of a walvault URI: walvault://REPOSITORY/SOURCE/KIND, nothing else."""
    source, _, kind = parts.path.strip("/").partition("/")
    if not parts.netloc or not source or kind not in KINDS or parts.query:
        raise ValueError(f"a walvault asset URI is {SCHEME}://REPOSITORY/SOURCE/{'|'.join(KINDS)}: "
                         f"{parts.geturl()!r} is not")
    return parts


def source_assets(config, kind: str) -> dict[str, Asset]:
    """Each configured source's asset of `kind`, by source name."""
    return {s.name: create_asset(repository=config.repository_connection, source=s.name, kind=kind)
            for s in config.sources}


def data_schedule(config, dag: str) -> AssetAny | None:
    """The schedule of walvault_<dag> (`snapshot`, `retention`): any source's asset of what it follows (`on
    backup`, `on snapshot`) updated; None for triggered only (null in the configuration)."""
    if config.schedules[dag] is None:
        return None
    return AssetAny(*source_assets(config, DATA_SCHEDULES[dag].removeprefix("on ")).values())


def source_of(asset) -> str:
    """The source an asset (or an event's asset reference) of walvault's is about."""
    return asset.uri.removeprefix(f"{SCHEME}://").split("/")[1]


def triggering_sources(dag_run) -> set[str] | None:
    """The sources whose backups (events walvault_backup made) triggered this run; None for a run no asset
    triggered (every source)."""
    if str(getattr(dag_run.run_type, "value", dag_run.run_type)) != "asset_triggered":
        return None
    # only backups walvault_backup made: an event made by hand (the REST API, the Assets view) snapshots nothing
    return {source_of(e.asset) for e in dag_run.consumed_asset_events
            if e.asset.uri.startswith(f"{SCHEME}://") and e.source_dag_id == BACKUP_DAG}

"""The `walvault` Airflow plugin: the listener that gives each walvault DAG run its note
(walvault_provider.notes.RunNotes). A file of the plugins folder (the provider package beside it is not: see
.airflowignore); an installed deployment puts it in its plugins folder too (deploy/Dockerfile)."""

from airflow.plugins_manager import AirflowPlugin

from walvault_provider.notes import RunNotes


class WalvaultPlugin(AirflowPlugin):
    name = "walvault"
    listeners = [RunNotes()]

"""walvault's Airflow provider, laid out as Airflow's providers are: the repository and Tarantool hooks (hooks/),
the operators (operators/: walvault's commands, and its Spark jobs), the pipeline's configuration file (config.py),
the files a Spark job is given and leaves (spark.py), and the assets the DAGs update (assets.py, the `walvault` URI
scheme). get_provider_info() describes it as a provider package
does; pyproject.toml's `apache_airflow_provider` entry point names it, so that `airflow providers list` shows
walvault and the UI's connection form knows its connection types.

Importing it has no side effects: no connection is looked up and walcore is imported only when a hook is used.
"""


def get_provider_info() -> dict:
    """What Airflow's providers manager reads from a provider package (airflow/provider_info.schema.json). The
    connection forms are declared here, as Airflow 3.2+ wants them (`conn-fields`, `ui-field-behaviour`; a hook's
    get_connection_form_widgets() and get_ui_field_behaviour() are deprecated): the UI reads them without importing
    the hooks, and stores each `conn-fields` value under its name in the connection's extra."""
    return {
        "package-name": "walvault",
        "name": "walvault",
        "description": "Verify, back up and retain the write-ahead logs of Tarantool and limestone.",
        "integrations": [{"integration-name": "walvault", "tags": ["software"]}],
        "hooks": [{"integration-name": "walvault", "python-modules": ["walvault_provider.hooks.walvault",
                                                                      "walvault_provider.hooks.tarantool"]}],
        "operators": [{"integration-name": "walvault", "python-modules": ["walvault_provider.operators.walvault",
                                                                          "walvault_provider.operators.spark"]}],
        # walvault://REPOSITORY/SOURCE/backup|snapshot: the assets the DAGs update (walvault_provider.assets)
        "asset-uris": [{"schemes": ["walvault"], "handler": "walvault_provider.assets.sanitize_uri",
                        "factory": "walvault_provider.assets.create_asset"}],
        "connection-types": [
            {
                "hook-class-name": "walvault_provider.hooks.walvault.WalvaultRepoHook",
                "hook-name": "walvault repository",
                "connection-type": "walvault_repo",
                # The url and options are extra fields; S3's keys are login and password (the password masked).
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "port"],
                    "relabeling": {"login": "S3 access key id", "password": "S3 secret access key"},
                    "placeholders": {"login": "S3 only; empty for a path", "password": "S3 only; empty for a path"},
                },
                "conn-fields": {
                    "url": {"label": "Repository URL",
                            "description": "A path on the workers (/backups) or s3://bucket/prefix",
                            "schema": {"type": ["string", "null"]}},
                    "options": {"label": "Storage options",
                                "description": 'fsspec storage options as JSON, e.g. {"endpoint_url": '
                                               '"http://127.0.0.1:9000"} for an S3 service other than AWS',
                                "schema": {"type": ["object", "null"]}},
                },
            },
            {
                "hook-class-name": "walvault_provider.hooks.tarantool.TarantoolHook",
                "hook-name": "Tarantool (running instance)",
                "connection-type": "tarantool",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "extra"],
                    "relabeling": {"login": "User", "port": "Port (iproto)"},
                    "placeholders": {"host": "127.0.0.1", "port": "3301",
                                     "login": "a user with 'execute' on 'universe'"},
                },
            },
        ],
    }

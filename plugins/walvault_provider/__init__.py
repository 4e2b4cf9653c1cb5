"""walvault's Airflow provider, laid out as Airflow's providers are: the repository hook (hooks/), the operators
(operators/: walvault's commands, and its Spark jobs), the pipeline's configuration file (config.py) and the files
a Spark job is given and leaves (spark.py). get_provider_info() describes it as a provider package does.

Importing it has no side effects: no connection is looked up and walcore is imported only when a hook is used.
"""


def get_provider_info() -> dict:
    """What Airflow's providers manager reads from a provider package (airflow/provider_info.schema.json)."""
    return {
        "package-name": "walvault",
        "name": "walvault",
        "description": "Verify, back up and retain the write-ahead logs of Tarantool and limestone.",
        "integrations": [{"integration-name": "walvault"}],
        "hooks": [{"integration-name": "walvault", "python-modules": ["walvault_provider.hooks.walvault"]}],
        "operators": [{"integration-name": "walvault", "python-modules": ["walvault_provider.operators.walvault",
                                                                          "walvault_provider.operators.spark"]}],
        "connection-types": [{"hook-class-name": "walvault_provider.hooks.walvault.WalvaultRepoHook",
                              "connection-type": "walvault_repo"}],
    }

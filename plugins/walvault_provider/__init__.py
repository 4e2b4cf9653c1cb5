"""walvault's Airflow provider: the repository hook, the pipeline configuration, and (next) its operators.

Importing it has no side effects: no connection is looked up and walcore is imported only when a hook is used.
"""

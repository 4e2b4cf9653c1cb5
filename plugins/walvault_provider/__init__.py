"""walvault's Airflow provider: the pipeline configuration, the repository hook, the operators, the Spark plan
files, and Airflow on one machine (local).

Importing it has no side effects: no connection is looked up and walcore is imported only when a hook is used.
"""

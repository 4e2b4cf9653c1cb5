"""walcore: read, verify and write the write-ahead logs of Tarantool and limestone.

Pure Python; knows nothing of Airflow or Spark.
"""

__version__ = "0.1.0"

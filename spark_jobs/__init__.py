"""walvault's Spark jobs: plain PySpark applications that spread walcore's work over a cluster.

Each job takes its plan as one JSON argument (or `@file` holding it) and runs the walvault command the plan
describes with `SparkRunner` in place of this machine's cores, so that the job does exactly what the command
does, and prints (into the plan's `output`, for `walvault ... --spark`) exactly what it prints:

    spark-submit spark_jobs/verify.py '{"sources": ["/data/tt1"], "repo": "s3://bucket/walvault"}'
    spark-submit spark_jobs/backup.py '{"sources": ["/data/tt1"], "repo": "/backups", "options": {"type": "full"}}'
    spark-submit spark_jobs/limestone_state.py '{"sources": ["/data/ls1"], "parquet": "/out/state"}'

Executors read the sources and the repository through the same paths and URLs as the driver: sources on a
path every executor sees, the repository there or on object storage; walcore must be installed on every node.
"""

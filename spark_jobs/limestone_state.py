"""The `limestone_state` job: `walvault state` with the durable state built by DataFrames (spark_jobs/state.py),
written as Parquet too when the plan says where.

    spark-submit spark_jobs/limestone_state.py '{"sources": ["/data/ls1"], "parquet": "/out/ls1-state"}'
"""

if __name__ == "__main__":
    from spark_jobs.job import main

    main("limestone_state")

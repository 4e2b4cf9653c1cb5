"""The `verify` job: `walvault verify` with one Spark task per file, or per byte range of a big Tarantool file,
or per stored object of the repository.

    spark-submit spark_jobs/verify.py '{"sources": ["/data/tt1", "/data/ls1"], "repo": "s3://bucket/walvault"}'
    spark-submit spark_jobs/verify.py '{"backup": "latest", "repo": "/backups"}'

With a repository, files whose bytes this walvault version verified clean before (the ledger, by SHA-256) are
hashed, not scanned (`"options": {"full": true}` scans them all), and the report goes to
`reports/verify/<id>/` (files.parquet, summary.json).
"""

if __name__ == "__main__":
    from spark_jobs.job import main

    main("verify")

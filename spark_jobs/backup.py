"""The `backup` job: `walvault backup` with the copy, hash, compress and verify work as Spark tasks.

    spark-submit spark_jobs/backup.py '{"sources": ["/data/tt1"], "repo": "/backups", "options": {"type": "full"}}'

The driver takes the source's lease, plans the set (for an incremental: what the parent chain holds), runs the
set's checks and writes the manifest, only when every task succeeded; each executor stores the files of its
tasks under the backup's prefix. A failed or killed job leaves no manifest, so no backup, and the next backup
of the source removes what it stored.
"""

if __name__ == "__main__":
    from spark_jobs.job import main

    main("backup")

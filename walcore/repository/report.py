"""What a verification found, kept in the repository: a per-file report as Parquet and a JSON summary.

    reports/verify/<id>/files.parquet    one row per file (or stored object): status, findings, how it was checked
    reports/verify/<id>/summary.json     the verdict, counts, chains and directories; written last, checksummed

The summary is written after the Parquet file: a report directory without it is an interrupted one.
"""

from __future__ import annotations

import io
import time

from ..fsutil import host_name, random_hex
from . import Repository, RepositoryError, utc_now, walvault_version
from .manifest import encode_checked

SUMMARY = "summary.json"
FILES = "files.parquet"


def _report_dir(repo: Repository, started: float) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started))
    return f"reports/verify/{stamp}-{random_hex(4)}"


def _files_table(rows: list[dict]):
    import pyarrow as pa

    finding = pa.struct([("code", pa.string()), ("offset", pa.int64()), ("message", pa.string()),
                         ("file", pa.string())])
    schema = pa.schema([("path", pa.string()), ("family", pa.string()), ("kind", pa.string()),
                        ("status", pa.string()), ("size", pa.int64()), ("rows", pa.int64()), ("blocks", pa.int64()),
                        ("checked_by", pa.string()), ("sha256", pa.string()), ("instance", pa.string()),
                        ("findings", pa.list_(finding))])
    return pa.Table.from_pylist([{name: _text(row.get(name)) for name in schema.names} for row in rows], schema)


def _text(value):
    """A value for Parquet's UTF-8 strings: a file name that is not UTF-8 keeps its bytes as escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, list):
        return [_text(v) for v in value]
    if isinstance(value, dict):
        return {k: _text(v) for k, v in value.items()}
    return value


def _write(repo: Repository, started: float, rows: list[dict], summary: dict) -> str:
    import pyarrow.parquet as pq

    where = _report_dir(repo, started)
    buffer = io.BytesIO()
    pq.write_table(_files_table(rows), buffer, compression="zstd")
    repo.storage.write_bytes(f"{where}/{FILES}", buffer.getvalue())
    summary = {"id": where.rsplit("/", 1)[1], "walvault": walvault_version(),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "finished": utc_now(),
               "host": host_name(), "files_report": FILES, **summary}
    repo.storage.write_bytes(f"{where}/{SUMMARY}", encode_checked(summary))
    return where


def write_source_report(repo: Repository, report, sources: list[str], started: float, runner: str) -> str:
    """The report of `walvault verify PATH... --repo URL`; returns its directory in the repository."""
    rows = []
    for f in report.files:
        out = f.to_json()
        out["checked_by"] = report.checked_by.get(f.path, "scan")
        out["sha256"] = report.sha256.get(f.path)
        rows.append(out)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["checked_by"]] = counts.get(row["checked_by"], 0) + 1
    verdict = "CANNOT_CHECK" if not report.checkable else "INTACT" if report.intact else "DAMAGED"
    summary = {"what": "sources", "sources": sources, "runner": runner, "verdict": verdict,
               "files": len(rows), "bytes": sum(r["size"] or 0 for r in rows), "checked_by": counts,
               "damaged": [r["path"] for r in rows if r["status"] == "damaged"],
               "chains": [c.to_json() for c in report.chains], "dirs": [d.to_json() for d in report.dirs]}
    return _write(repo, started, rows, summary)


def write_repository_report(repo: Repository, report, backup: str | None, started: float, runner: str) -> str:
    """The report of `walvault verify --repo URL [BACKUP]`: a row per backup file and archived file."""
    rows = [{"path": name, "family": name.split("/")[0], "kind": "object", "size": size,
             "status": "damaged" if problem or found else "ok", "checked_by": checked_by,
             "instance": name.split("/")[1],
             "findings": ([{"code": "object_damaged", "offset": None, "message": problem}] if problem else [])
             + (found or [])}
            for name, (size, problem, checked_by, found) in sorted(report.checked.items())]
    # A damaged or missing redundant file (a manifest, walvault.repo, walvault.policy or a copy) is a row too.
    redundancy = [f for b in report.backups for f in b["findings"] if f.get("redundancy")] \
        + report.repository["findings"]
    rows += [{"path": f["path"], "family": f["path"].split("/")[0] if "/" in f["path"] else None,
              "kind": f["code"].split("_")[0], "status": "damaged", "checked_by": "checksum",
              "instance": f["path"].split("/")[1] if "/" in f["path"] else None,
              "findings": [{"code": f["code"], "offset": None, "message": f["message"]}]} for f in redundancy]
    summary = {"what": "repository", "backup": backup, "runner": runner,
               "verdict": "INTACT" if report.intact else "DAMAGED", "objects": report.objects, "bytes": report.bytes,
               "backups": report.backups, "archive": report.archive, "leftovers": report.leftovers,
               "repository": report.repository}
    return _write(repo, started, rows, summary)


def warn(message: str) -> None:
    import sys

    print(f"walvault: {message}", file=sys.stderr)


def keep(repo: Repository, write, *args) -> None:
    """Keep a verification's report in the repository, after the verdict is out: a repository that cannot be
    written (a read-only mount) does not stop a verification, it is said."""
    import sys

    sys.stdout.flush()
    try:
        where = write(repo, *args)
    except RepositoryError as e:
        warn(f"warning: the report was not kept: {e}")
        return
    warn(f"report written to {repo.display}/{where}")

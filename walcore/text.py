"""Human-readable reports for inspect (everything) and verify (the verdict and what is wrong)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .tarantool.meta import format_vclock


def _rel(path: str, base: Path | None) -> str:
    if base is None:
        return path
    try:
        return str(Path(path).resolve().relative_to(base))
    except ValueError:
        return path


def _lsn_text(ranges: dict) -> str:
    return ", ".join(f"{c}: {lo}..{hi}" for c, (lo, hi) in ranges.items())


def render(report, *, detailed: bool, base: Path | None) -> str:
    lines: list[str] = []
    for f in report.files:
        data = f.to_json()
        show = detailed or data["status"] not in ("ok", "open")
        if not show:
            continue
        parts = [f"{data['status'].upper():<11}", f"{data['kind'] or '?':<5}", _rel(data["path"], base)]
        if detailed and data["rows"] is not None:
            zstd = f", {data['zstd_blocks']} zstd" if data.get("zstd_blocks") else ""
            if data["family"] == "tarantool":
                parts.append(f"  {data['size']:,} B, {data['blocks']} blocks{zstd}, {data['rows']} rows")
            else:
                blocks = f", {data['blocks']} snippets" if data["blocks"] is not None else ""
                rows = "" if data["rows"] is None else f", {data['rows']} {'records' if 'epoch' in data['kind'] else 'entries'}"
                parts.append(f"  {data['size']:,} B{blocks}{rows}")
            if data["vclock"] is not None:
                parts.append(f", vclock {format_vclock({int(k): v for k, v in data['vclock'].items()})}")
            if data["lsn_ranges"] and data["kind"] == "xlog":
                parts.append(f", lsn {_lsn_text(data['lsn_ranges'])}")
            if data.get("epoch_range"):
                parts.append(f", epochs {data['epoch_range'][0]}..{data['epoch_range'][1]}")
        lines.append(" ".join(parts[:3]) + "".join(parts[3:]))
        for finding in data["findings"]:
            where = f" at byte {finding['offset']}" if finding["offset"] is not None else ""
            lines.append(f"    {finding['code']}{where}: {finding['message']}")
    for chain in report.chains:
        data = chain.to_json()
        lines.append(f"chain {_rel(data['path'], base)}: {data['status'].upper()}, {len(data['xlogs'])} xlogs, "
                     f"{len(data['snapshots'])} snapshots")
        for finding in data["findings"]:
            lines.append(f"    {finding['code']}: {finding['message']}")
        if detailed:
            for snap in data["snapshots"]:
                replay = Path(snap["replay_from"]).name if snap["replay_from"] else "nothing to replay"
                lines.append(f"    snapshot {Path(snap['path']).name}: covers {len(snap['covers'])} xlogs, "
                             f"replay from {replay}")
    for d in report.dirs:
        data = d.to_json()
        if data["persistent_format_version"] is None:
            lines.append(f"limestone {_rel(data['path'], base)}: {data['status'].upper()}")
        else:
            lines.append(f"limestone {_rel(data['path'], base)}: {data['status'].upper()}"
                         f"{' (LIVE: in use by a running limestone)' if data['live'] else ''}, format "
                         f"{data['persistent_format_version']}, durable epoch {data['durable_epoch']}, max appeared "
                         f"epoch {data['max_appeared_epoch']}, {data['count_durable_wal_entries']} durable put+remove "
                         f"entries")
        for finding in data["findings"]:
            where = f" at byte {finding['offset']}" if finding["offset"] is not None else ""
            file = f" ({_rel(finding['file'], base)})" if finding.get("file") else ""
            lines.append(f"    {finding['code']}{file}{where}: {finding['message']}")
    statuses = Counter(f.status for f in report.files)
    summary = ", ".join(f"{statuses[s]} {s.replace('_', ' ')}" for s in ("ok", "open", "in_progress", "damaged")
                        if statuses[s])
    chains = Counter(c.status for c in report.chains)
    dirs = Counter(d.status for d in report.dirs)
    lines.append(f"{len(report.files)} files ({summary or 'none'}); {len(report.chains)} chains"
                 + (f" ({', '.join(f'{n} {s}' for s, n in sorted(chains.items()))})" if chains else "")
                 + (f"; {len(report.dirs)} limestone dirs ({', '.join(f'{n} {s}' for s, n in sorted(dirs.items()))})"
                    if dirs else ""))
    if report.ignored:
        lines.append(f"{len(report.ignored)} other files ignored (not WAL files)")
    if not report.checkable:
        lines.append("verdict: CANNOT CHECK (exit 2)")
    else:
        lines.append("verdict: INTACT" if report.intact else "verdict: FINDINGS (exit 1)")
    return "\n".join(lines) + "\n"

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
            zstd = f", {data['zstd_blocks']} zstd" if data["zstd_blocks"] else ""
            parts.append(f"  {data['size']:,} B, {data['blocks']} blocks{zstd}, {data['rows']} rows")
            if f.vclock is not None:
                parts.append(f", vclock {format_vclock(f.vclock)}")
            if data["lsn_ranges"] and f.kind == "xlog":
                parts.append(f", lsn {_lsn_text(data['lsn_ranges'])}")
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
    statuses = Counter(f.status for f in report.files)
    summary = ", ".join(f"{statuses[s]} {s.replace('_', ' ')}" for s in ("ok", "open", "in_progress", "damaged")
                        if statuses[s])
    chains = Counter(c.status for c in report.chains)
    lines.append(f"{len(report.files)} files ({summary or 'none'}); {len(report.chains)} chains"
                 + (f" ({', '.join(f'{n} {s}' for s, n in sorted(chains.items()))})" if chains else ""))
    if report.ignored:
        lines.append(f"{len(report.ignored)} other files ignored (not Tarantool files)")
    lines.append("verdict: INTACT" if report.intact else "verdict: FINDINGS (exit 1)")
    return "\n".join(lines) + "\n"

"""The verdict on a limestone log directory, as `tglogutil inspect` gives it and more.

`prepare` reads what is small (manifest, epoch files, catalog) and says which pwal files to scan
and with which durable epoch; the scans (`scan.scan_pwal`, one per file, in any process) come back
to `finish`, which gives the directory and its files their verdicts. Nothing here writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import FindingList
from .catalog import CATALOG_BACKUP, CATALOG_NAME, Catalog, CatalogError, parse_catalog
from .epoch import EPOCH_NAME, scan_epoch
from .layout import DERIVED, blob_path, is_live, kind_of
from .manifest import MANIFEST_NAME, Manifest, ManifestError, parse_manifest
from .scan import BROKEN_AFTER_MARKED, DURABLE_COUNT_NAMES, OK, REPAIRED, STATUS_OF_CODE, PwalScan, scan_pwal

STATUS_ORDER = ("ok", "repairable", "unrepairable", "cannot_check")
# Epoch files are a few hundred bytes; one larger than this is not an epoch file.
MAX_EPOCH_FILE = 64 << 20


@dataclass
class LimestoneFile:
    path: str
    kind: str
    status: str  # ok | open | damaged
    size: int
    rows: int | None = None  # entries (pwal) or records (epoch)
    blocks: int | None = None  # snippets (pwal)
    instance: str | None = None
    epoch_range: list[int] | None = None
    entries: dict[str, int] | None = None  # durable entries per type (pwal)
    findings: FindingList = field(default_factory=FindingList)

    def to_json(self) -> dict:
        return {"path": self.path, "family": "limestone", "kind": self.kind, "status": self.status,
                "size": self.size, "rows": self.rows, "blocks": self.blocks, "instance": self.instance,
                "vclock": None, "prev_vclock": None, "lsn_ranges": {}, "epoch_range": self.epoch_range,
                "durable_entries": self.entries, "findings": [f.to_json() for f in self.findings]}


@dataclass
class LimestoneDir:
    path: str
    manifest: Manifest | None
    live: bool
    status: str = "ok"
    durable_epoch: int | None = None
    max_appeared_epoch: int | None = None
    durable_entries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DURABLE_COUNT_NAMES.values(), 0))
    snippets: dict[str, int] = field(default_factory=lambda: {"durable": 0, "nondurable": 0, "canceled": 0})
    findings: FindingList = field(default_factory=FindingList)

    def worsen(self, status: str) -> None:
        if STATUS_ORDER.index(status) > STATUS_ORDER.index(self.status):
            self.status = status

    @property
    def count_durable_wal_entries(self) -> int:
        """tglogutil's count: puts and removes in durable snippets."""
        return self.durable_entries["put"] + self.durable_entries["remove"]

    def to_json(self) -> dict:
        m = self.manifest
        return {"path": self.path, "family": "limestone", "format_version": m.format_version if m else None,
                "persistent_format_version": m.persistent_format_version if m else None, "live": self.live,
                "status": self.status, "durable_epoch": self.durable_epoch,
                "max_appeared_epoch": self.max_appeared_epoch, "durable_entries": self.durable_entries,
                "count_durable_wal_entries": self.count_durable_wal_entries, "snippets": self.snippets,
                "findings": [f.to_json() for f in self.findings]}


@dataclass
class DirPlan:
    root: Path
    report: LimestoneDir
    files: list[LimestoneFile]
    pwal_paths: list[Path]  # to scan with scan_pwal(path, report.durable_epoch)
    ignored: list[Path]
    catalog: Catalog | None = None  # the one limestone uses: compaction_catalog, or its backup if unreadable


def prepare(root: Path) -> DirPlan:
    """Read the manifest, the epoch files and the catalog; list what is to be scanned."""
    root = Path(root)
    names = sorted(os.listdir(root))
    report = LimestoneDir(str(root), None, is_live(root))
    files: list[LimestoneFile] = []
    pwals: list[Path] = []
    ignored: list[Path] = []
    for name in names:
        path = root / name
        if path.is_dir():
            if name == "blob":
                files += [_plain(p, "blob") for p in sorted(path.glob("dir_*/*.blob"))]
            elif name not in DERIVED:
                ignored.append(path)
            continue
        kind = kind_of(name) if path.is_file() else None  # not a FIFO or a device: they would block
        if kind is None:
            ignored.append(path)
        elif kind in ("pwal", "pwal_rotated", "compacted"):
            pwals.append(path)
        elif kind not in ("epoch", "epoch_rotated", "catalog") and name != MANIFEST_NAME:
            files.append(_plain(path, kind))
    plan = DirPlan(root, report, files, pwals, ignored)
    manifest_file = _plain(root / MANIFEST_NAME, "manifest") if MANIFEST_NAME in names else None
    try:
        report.manifest = parse_manifest((root / MANIFEST_NAME).read_bytes() if manifest_file else None)
    except ManifestError as e:
        report.findings.add("bad_manifest", 0 if manifest_file else None, str(e), str(root / MANIFEST_NAME))
        report.status = "cannot_check"
        if manifest_file:
            manifest_file.status = "damaged"
            manifest_file.findings.add("bad_manifest", 0, str(e))
    if manifest_file:
        files.append(manifest_file)
    if report.status == "cannot_check":
        plan.pwal_paths = []
        return plan
    _read_epochs(plan, names)
    _read_catalogs(plan, names)
    if report.status == "cannot_check":
        plan.pwal_paths = []
    return plan


def _plain(path: Path, kind: str) -> LimestoneFile:
    return LimestoneFile(str(path), kind, "ok", path.stat().st_size)


def _read_epochs(plan: DirPlan, names: list[str]) -> None:
    """The durable epoch: the highest record of `epoch`, or of the rotated epoch files when it has none."""
    report = plan.report
    epoch_files = [n for n in names if n == EPOCH_NAME or kind_of(n) == "epoch_rotated"]
    highest: dict[str, int | None] = {}
    for name in epoch_files:
        path = plan.root / name
        f = LimestoneFile(str(path), kind_of(name), "open" if name == EPOCH_NAME else "ok", path.stat().st_size)
        if f.size > MAX_EPOCH_FILE:
            f.findings.add("bad_epoch_file", 0, f"{f.size} bytes is far more than an epoch file holds")
            scan = None
        else:
            scan = scan_epoch(path.read_bytes())
            f.findings.extend(scan.findings)
            f.rows = scan.records
            if scan.durable_epoch is not None:
                f.epoch_range = [scan.min_epoch, scan.durable_epoch]
        if f.findings:
            f.status = "damaged"
            report.status = "cannot_check"
            report.findings.add("unreadable_epoch", f.findings[0].offset,
                                f"{name}: {f.findings[0].message}; the durable epoch cannot be known", str(path))
        highest[name] = scan.durable_epoch if scan else None
        plan.files.append(f)
    if highest.get(EPOCH_NAME) is not None:
        report.durable_epoch = highest[EPOCH_NAME]
    else:
        # limestone falls back to every epoch* file when `epoch` is missing or empty
        report.durable_epoch = max((v for v in highest.values() if v is not None), default=0)


def _read_catalogs(plan: DirPlan, names: list[str]) -> None:
    parsed: dict[str, Catalog | None] = {}
    for name in (CATALOG_NAME, CATALOG_BACKUP):
        if name not in names:
            continue
        f = _plain(plan.root / name, "catalog")
        try:
            parsed[name] = parse_catalog((plan.root / name).read_bytes())
        except CatalogError as e:
            parsed[name] = None
            f.status = "damaged"
            f.findings.add("bad_catalog", e.offset, str(e))
        plan.files.append(f)
    main, back = parsed.get(CATALOG_NAME), parsed.get(CATALOG_BACKUP)
    plan.catalog = main or back
    if CATALOG_NAME not in parsed or main is not None:
        return
    path = str(plan.root / CATALOG_NAME)
    if back is not None:
        plan.report.findings.add("bad_catalog", None, f"{CATALOG_NAME} is unreadable; limestone falls back to "
                                 f"{CATALOG_BACKUP}", path)
        plan.report.worsen("repairable")
    else:
        plan.report.findings.add("bad_catalog", None, f"{CATALOG_NAME} is unreadable and has no readable backup",
                                 path)
        plan.report.worsen("unrepairable")


def finish(plan: DirPlan, scans: dict[str, PwalScan]) -> tuple[LimestoneDir, list[LimestoneFile]]:
    """Judge the directory from its pwal scans (keyed by path)."""
    report = plan.report
    files = list(plan.files)
    code = OK
    blob_refs: dict[int, tuple[str, int]] = {}
    instance = report.manifest.instance_uuid if report.manifest else None
    max_epoch = report.durable_epoch
    for path in plan.pwal_paths:
        scan = scans[str(path)]
        kind = kind_of(path.name)
        file_code = scan.code
        if file_code == BROKEN_AFTER_MARKED and kind != "pwal":
            # damage after a canceled header of a detached file: limestone never reads it
            file_code = OK
        elif scan.canceled_tail is not None and kind == "pwal":
            scan.findings.add("broken_tail", scan.canceled_tail, "a broken tail after a canceled snippet header, "
                              "in an active file limestone would append to (repairable: repair detaches the file)")
        code = max(code, file_code)
        max_epoch = max(max_epoch, scan.max_epoch)
        for t, n in scan.durable.items():
            report.durable_entries[DURABLE_COUNT_NAMES[t]] += n
        for k, n in scan.snippets.items():
            report.snippets[k] += n
        for blob, offset in scan.blob_refs.items():
            blob_refs.setdefault(blob, (str(path), offset))
        status = "damaged" if scan.findings or file_code not in (OK, REPAIRED) else (
            "open" if kind == "pwal" else "ok")
        files.append(LimestoneFile(str(path), kind, status, scan.size, scan.entries, sum(scan.snippets.values()),
                                   instance, scan.epoch_range,
                                   {DURABLE_COUNT_NAMES[t]: n for t, n in sorted(scan.durable.items())},
                                   scan.findings))
    if report.status != "cannot_check":
        report.max_appeared_epoch = max_epoch
        report.worsen(STATUS_OF_CODE[code])
        for blob, (path, offset) in sorted(blob_refs.items()):
            where = blob_path(plan.root, blob)
            if not where.exists() and not (plan.root / where.name).exists():
                # Not part of the log's status (tglogutil never looks at blobs), but a finding all the same.
                report.findings.add("missing_blob", offset, f"blob {blob} is referred to by a durable put but "
                                    f"{where.relative_to(plan.root)} does not exist", path)
    files.sort(key=lambda f: f.path)
    return report, files


def check_dir(root: Path) -> tuple[DirPlan, LimestoneDir, dict[str, PwalScan]]:
    """The whole check of one directory in this process (verify spreads the scans over processes)."""
    plan = prepare(root)
    scans = {str(p): scan_pwal(p, plan.report.durable_epoch) for p in plan.pwal_paths}
    report, _ = finish(plan, scans)
    return plan, report, scans

"""The verdict on a limestone log directory, as `tglogutil inspect` gives it and more.

`prepare` reads what is small (manifest, epoch files, catalog) and says which pwal files to scan
and with which durable epoch; the scans (`scan.scan_pwal`, one per file, in any process) come back
to `finish`, which gives the directory and its files their verdicts. Nothing here writes.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import FindingList
from .catalog import CATALOG_BACKUP, CATALOG_NAME, Catalog, CatalogError, parse_catalog
from .epoch import EPOCH_NAME, scan_epoch
from .layout import DERIVED, ROTATED_EPOCH, blob_path, is_live, kind_of
from .manifest import MANIFEST_NAME, Manifest, ManifestError, parse_manifest
from .scan import BROKEN_AFTER_MARKED, DURABLE_COUNT_NAMES, OK, REPAIRED, STATUS_OF_CODE, PwalScan, scan_pwal

STATUS_ORDER = ("ok", "repairable", "unrepairable", "cannot_check")
PWAL_KINDS = ("pwal", "pwal_rotated", "compacted")
# Epoch files, the manifest and the catalog are a few hundred bytes; one larger than this is not one.
MAX_SMALL_FILE = 64 << 20


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
    report = LimestoneDir(str(root), None, False)
    files: list[LimestoneFile] = []
    pwals: list[Path] = []
    ignored: list[Path] = []
    entries: dict[str, LimestoneFile] = {}  # what limestone reads, by name
    for name in names:
        path = root / name
        kind = kind_of(name)
        if kind is None:
            if name == "blob" and path.is_dir():
                files += [_entry(p, "blob") for p in sorted(path.glob("dir_*/*.blob"))]
            elif not (name in DERIVED and path.is_dir()):
                ignored.append(path)
            continue
        f = _entry(path, kind)
        if kind in PWAL_KINDS:
            if f.status != "damaged":
                pwals.append(path)
            else:  # limestone opens every pwal_* file; one it cannot open stops it
                files.append(f)
                report.findings.add("not_a_file", None, f"{name}: {f.findings[0].message}; limestone cannot "
                                    f"open it", str(path))
                report.status = "cannot_check"
        elif kind in ("epoch", "epoch_rotated", "catalog") or name == MANIFEST_NAME:
            entries[name] = f  # read below
        else:
            files.append(f)
    plan = DirPlan(root, report, files, pwals, ignored)
    _read_manifest(plan, entries.get(MANIFEST_NAME))
    if report.status != "cannot_check":
        _read_epochs(plan, entries)
        _read_catalogs(plan, entries)
        _check_compacted_files(plan)
    if report.status == "cannot_check":
        plan.pwal_paths = []
    return plan


def _entry(path: Path, kind: str) -> LimestoneFile:
    """A file of the directory; damaged when it is not a regular file (reading a FIFO would block)."""
    try:
        st = os.stat(path)
    except OSError as e:
        what = "a dangling symlink" if e.errno == errno.ENOENT else f"not readable ({e.strerror})"
        f = LimestoneFile(str(path), kind, "damaged", 0)
        f.findings.add("not_a_file", None, f"it is {what}")
        return f
    f = LimestoneFile(str(path), kind, "ok", st.st_size)
    if not stat.S_ISREG(st.st_mode):
        f.status = "damaged"
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
        f.findings.add("not_a_file", None, f"it is {what}, not a regular file")
    return f


def _read(f: LimestoneFile) -> bytes | None:
    """The bytes of a small file (manifest, epoch, catalog), or None with a finding on it."""
    if f.status == "damaged":
        return None
    if f.size > MAX_SMALL_FILE:
        f.findings.add("file_too_large", 0, f"{f.size} bytes is far more than such a file holds")
    else:
        try:
            return Path(f.path).read_bytes()
        except OSError as e:
            f.findings.add("unreadable_file", None, f"it cannot be read: {e.strerror}")
    f.status = "damaged"
    return None


def _read_manifest(plan: DirPlan, f: LimestoneFile | None) -> None:
    report = plan.report
    data = None if f is None else _read(f)
    try:
        if f is not None and data is None:
            raise ManifestError(f"{MANIFEST_NAME}: {f.findings[0].message}")
        report.manifest = parse_manifest(data)
    except ManifestError as e:
        report.findings.add("bad_manifest", 0 if data is not None else None, str(e), str(plan.root / MANIFEST_NAME))
        report.status = "cannot_check"
        if data is not None:
            f.status = "damaged"
            f.findings.add("bad_manifest", 0, str(e))
    if f is not None:
        plan.files.append(f)
        # limestone's lock is on the manifest: only a regular file can hold it (opening a FIFO would block)
        report.live = data is not None and is_live(plan.root)


def _read_epochs(plan: DirPlan, entries: dict[str, LimestoneFile]) -> None:
    """The durable epoch: the highest record of `epoch`, or, when it has none, of every other `epoch*`
    file (limestone's last_durable_epoch_in_dir, which reads those only then). Rotated epoch files
    (`epoch.<ms14>.<E>`, part of a backup) are checked either way; other `epoch*` names only when read."""
    report = plan.report
    main = entries.get(EPOCH_NAME)
    # `epoch` first: whether the others are read depends on it
    epoch_files = sorted((f for f in entries.values() if f.kind in ("epoch", "epoch_rotated")),
                         key=lambda f: f is not main)
    highest: dict[str, int | None] = {}
    fallback = True
    for f in epoch_files:
        name = Path(f.path).name
        if f is not main and not fallback and not ROTATED_EPOCH.fullmatch(name):
            plan.ignored.append(Path(f.path))  # limestone never reads it (and deletes it at start)
            continue
        data = _read(f)
        if data is not None:
            scan = scan_epoch(data)
            f.findings.extend(scan.findings)
            f.rows = scan.records
            if scan.durable_epoch is not None:
                f.epoch_range = [scan.min_epoch, scan.durable_epoch]
            highest[name] = None if f.findings else scan.durable_epoch
        if f.findings:
            f.status = "damaged"
        elif f is main:
            f.status = "open"
        if f is main:  # limestone reads the others only when `epoch` is read whole and has no record
            fallback = highest.get(name) is None and not f.findings
        if f is main or fallback:
            if f.findings:
                report.findings.add("unreadable_epoch", f.findings[0].offset, f"{name}: {f.findings[0].message}; "
                                    f"the durable epoch cannot be known", f.path)
                report.status = "cannot_check"
        plan.files.append(f)
    if report.status != "cannot_check":
        read = [main] if not fallback else epoch_files
        report.durable_epoch = max((highest.get(Path(f.path).name) or 0 for f in read), default=0)


def _read_catalogs(plan: DirPlan, entries: dict[str, LimestoneFile]) -> None:
    parsed: dict[str, Catalog | None] = {}
    for name in (CATALOG_NAME, CATALOG_BACKUP):
        f = entries.get(name)
        if f is None:
            continue
        data = _read(f)
        parsed[name] = None
        if data is not None:
            try:
                parsed[name] = parse_catalog(data)
            except CatalogError as e:
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


def _check_compacted_files(plan: DirPlan) -> None:
    """The compacted files the catalog names hold every key of the rotated files it lists as covered:
    without one, those keys are lost (limestone starts all the same, without a word)."""
    catalog = plan.catalog
    if catalog is None:
        return
    present = {Path(p).name for p in plan.pwal_paths}
    wanted = list(catalog.compacted_files) + ([catalog.carry_file] if catalog.carry_file else [])
    for name in wanted:
        if name not in present:
            plan.report.findings.add("missing_compacted_file", None, f"the compaction catalog names {name}, "
                                     f"which does not exist: the keys of the files it covers are lost",
                                     str(plan.root / name))


def finish(plan: DirPlan, scans: dict[str, PwalScan]) -> tuple[LimestoneDir, list[LimestoneFile]]:
    """Judge the directory from its pwal scans (keyed by path)."""
    report = plan.report
    files = list(plan.files)
    code = OK
    missing_blobs: dict[int, tuple[str, int]] = {}
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
        for blob, offset in scan.missing_blobs.items():
            missing_blobs.setdefault(blob, (str(path), offset))
        status = "damaged" if scan.findings or file_code not in (OK, REPAIRED) else (
            "open" if kind == "pwal" else "ok")
        files.append(LimestoneFile(str(path), kind, status, scan.size, scan.entries, sum(scan.snippets.values()),
                                   instance, scan.epoch_range,
                                   {DURABLE_COUNT_NAMES[t]: n for t, n in sorted(scan.durable.items())},
                                   scan.findings))
    if report.status != "cannot_check":
        report.max_appeared_epoch = max_epoch
        report.worsen(STATUS_OF_CODE[code])
        for blob, (path, offset) in sorted(missing_blobs.items()):
            # Not part of the log's status (tglogutil never looks at blobs), but a finding all the same.
            report.findings.add("missing_blob", offset, f"blob {blob} is referred to by a durable put but "
                                f"{blob_path(plan.root, blob).relative_to(plan.root)} does not exist", path)
    files.sort(key=lambda f: f.path)
    return report, files


def check_dir(root: Path) -> tuple[DirPlan, LimestoneDir, dict[str, PwalScan]]:
    """The whole check of one directory in this process (verify spreads the scans over processes)."""
    plan = prepare(root)
    scans = {str(p): scan_pwal(p, plan.report.durable_epoch) for p in plan.pwal_paths}
    report, _ = finish(plan, scans)
    return plan, report, scans

"""The repository's info and the backup manifest (as pgBackRest's info layer).

Each is JSON carrying a SHA-256 of its own canonical form, saved twice: `<name>.copy` first, then
`<name>` (the commit point; for a backup manifest an exclusive create). A reader takes the main file when its
checksum holds, else the copy, and says which. A backup without a readable manifest does not exist, nor one whose
main manifest is missing (its writer stopped between the copy and the commit).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

from .storage import RepositoryError, Storage, check_name

REPO_FORMAT = 1
ENCRYPTED_FORMAT = 2  # walvault.repo of an encrypted repository: older walvaults refuse it
INFO_NAME = "walvault.repo"
MANIFEST_NAME = "backup.manifest"
POLICY_NAME = "walvault.policy"
COPY_SUFFIX = ".copy"
PIECES_FORMAT = 2  # a backup manifest with a file in pieces (FileEntry.pieces): older walvaults refuse it


class ManifestError(RepositoryError):
    """A manifest or info file that cannot be read or does not hold together."""


def _canonical(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode_checked(obj: dict) -> bytes:
    body = {k: v for k, v in obj.items() if k != "checksum"}
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    return json.dumps({**body, "checksum": digest}, sort_keys=True, indent=1).encode() + b"\n"


def decode_checked(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ManifestError(f"{what} is not JSON: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("checksum"), str):
        raise ManifestError(f"{what} has no checksum")
    body = {k: v for k, v in obj.items() if k != "checksum"}
    if hashlib.sha256(_canonical(body)).hexdigest() != obj["checksum"]:
        raise ManifestError(f"{what} does not match its checksum: it was changed or damaged")
    return body


def save_checked(storage: Storage, name: str, obj: dict) -> None:
    data = encode_checked(obj)
    storage.write_bytes(name + COPY_SUFFIX, data)
    storage.write_bytes(name, data)


def commit_checked(storage: Storage, name: str, obj: dict) -> bool:
    """Save a backup manifest as save_checked does, its main file by an exclusive create: False when something
    holds that name already (a fence: the backup's leftovers were taken from this writer, whose lease was lost)."""
    data = encode_checked(obj)
    storage.write_bytes(name + COPY_SUFFIX, data)
    if storage.create(name, data):
        return True
    try:  # a PUT retried after its reply was lost finds its own first attempt
        return storage.read_bytes(name) == data
    except FileNotFoundError:
        return False


@dataclass
class Loaded:
    obj: dict
    used: str  # the name read: the main file or its copy
    problem: str | None = None  # why the main file was not used


def load_checked(storage: Storage, name: str) -> Loaded:
    """The main file, else its copy (saying why); ManifestError when neither is good, FileNotFoundError when
    neither exists. Files are named from the repository root."""
    problems = []
    for candidate in (name, name + COPY_SUFFIX):
        shown = storage.repo_name(candidate)
        try:  # an encrypted repository's object that does not authenticate fails its read (Tampered)
            obj = decode_checked(storage.read_bytes(candidate), shown)
        except FileNotFoundError:
            problems.append(f"{shown} is missing")
            continue
        except ManifestError as e:
            problems.append(str(e))
            continue
        return Loaded(obj, shown, problems[0] if problems else None)
    if all(p.endswith("is missing") for p in problems):
        raise FileNotFoundError(f"{storage.repo_name(name)}: no such manifest")
    raise ManifestError("; ".join(problems))


@dataclass
class PairProblem:
    """What is wrong with one side of a checked pair, or with the two together."""

    path: str  # the file concerned: the main file or its copy (the copy when the two differ)
    side: str  # "main" | "copy"
    state: str  # "missing" | "damaged" | "differs" (both good, other contents)
    message: str


@dataclass
class PairState:
    """Both files of a checked pair, each read and checked: its body when good (None: missing or damaged)."""

    name: str
    main: dict | None
    copy: dict | None
    problems: list[PairProblem]

    @property
    def good(self) -> dict | None:
        """The body a reader uses: the main file's when it is good, else the copy's."""
        return self.main if self.main is not None else self.copy


def inspect_pair(storage: Storage, name: str) -> PairState:
    """Read both files of a checked pair (`name` and `name.copy`) and say what is wrong with their redundancy:
    either one missing, not JSON or failing its checksum, or both good with different contents. No problem
    when both are good and equal, or when both are missing (nothing was saved under this name)."""
    bodies: dict[str, dict | None] = {}
    problems = []
    for side, path in (("main", name), ("copy", name + COPY_SUFFIX)):
        bodies[side] = None
        try:  # an encrypted repository's object that does not authenticate fails its read (Tampered)
            bodies[side] = decode_checked(storage.read_bytes(path), path)
        except FileNotFoundError:
            problems.append(PairProblem(path, side, "missing", f"{path} is missing"))
        except ManifestError as e:
            problems.append(PairProblem(path, side, "damaged", str(e)))
    if len(problems) == 2 and all(p.state == "missing" for p in problems):
        problems = []
    elif bodies["main"] is not None and bodies["copy"] is not None and bodies["main"] != bodies["copy"]:
        problems.append(PairProblem(name + COPY_SUFFIX, "copy", "differs",
                                    f"{name} and {name}{COPY_SUFFIX} both pass their checksums but hold different "
                                    f"contents ({name} is the one read)"))
    return PairState(name, bodies["main"], bodies["copy"], problems)


# -- the repository info


def read_info(storage: Storage) -> dict | None:
    try:
        info = load_checked(storage, INFO_NAME).obj
    except FileNotFoundError:
        return None
    fmt = info.get("format")
    if not isinstance(fmt, int):
        raise ManifestError(f"{INFO_NAME} has no format version")
    if fmt > REPO_FORMAT and not (fmt == ENCRYPTED_FORMAT and info.get("encryption")):
        raise ManifestError(f"the repository {storage.display} has format {fmt}, newer than this walvault reads "
                            f"({REPO_FORMAT}): use a newer walvault")
    return info


def ensure_info(storage: Storage, now: str, version: str, settings: dict | None = None) -> dict:
    """The repository's info, created on first use with its `settings` ("lock": its Object Lock; "encryption": how
    it is encrypted, which gives it a format of its own, refused by a walvault that does not encrypt)."""
    info = read_info(storage)
    if info is None:
        info = {"format": REPO_FORMAT, "created": now, "created_by": f"walvault {version}", **(settings or {})}
        if info.get("encryption"):
            info["format"] = ENCRYPTED_FORMAT
        save_checked(storage, INFO_NAME, info)
    return info


# -- the backup manifest


NOTE_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
NOTE_TEXT_LIMIT = 256  # characters of a note's value, or of a pin's note
NOTES_LIMIT = 32  # notes of one backup


def check_note_text(text: str, what: str) -> str:
    """A note's text as given (ValueError naming `what` when it is empty, too long or holds a control character:
    it is printed in listings, one line each)."""
    if not text.strip():
        raise ValueError(f"{what} is empty")
    if len(text) > NOTE_TEXT_LIMIT:
        raise ValueError(f"{what} is longer than {NOTE_TEXT_LIMIT} characters")
    if any(not c.isprintable() for c in text):
        raise ValueError(f"{what} holds a control character")
    return text


def parse_notes(pairs: list[str]) -> dict[str, str]:
    """`backup --note KEY=VALUE` (repeatable) as the manifest keeps them; ValueError naming the first one wrong (no
    `=`, a key not a letter then letters, digits, `_`, `.` or `-` (64 at most), a key given twice, a value
    check_note_text refuses, more than NOTES_LIMIT notes)."""
    notes: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--note {pair!r} is not KEY=VALUE")
        if not NOTE_KEY.fullmatch(key):
            raise ValueError(f"--note {pair!r}: the key must be a letter, then letters, digits, '_', '.' or '-' "
                             "(64 at most)")
        if key in notes:
            raise ValueError(f"--note {key}: given twice")
        notes[key] = check_note_text(value, f"--note {key}")
    if len(notes) > NOTES_LIMIT:
        raise ValueError(f"--note: {len(notes)} notes, at most {NOTES_LIMIT}")
    return notes


@dataclass
class Piece:
    """One stored object of a file kept in pieces: its bytes follow the previous piece's."""

    stored: str
    stored_size: int
    stored_sha256: str
    size: int
    sha256: str

    @classmethod
    def from_json(cls, obj) -> Piece:
        try:
            piece = cls(**{k: obj[k] for k in cls.__dataclass_fields__})
        except (KeyError, TypeError) as e:
            raise ManifestError(f"a file's piece is incomplete: {e}") from None
        check_name(piece.stored)
        if not isinstance(piece.size, int) or piece.size < 0:
            raise ManifestError(f"{piece.stored}: bad size {piece.size!r}")
        return piece


@dataclass
class FileEntry:
    """One file of a backup: its source name (relative to the source directory) and where its bytes live."""

    name: str
    kind: str
    size: int
    sha256: str  # of the whole file, also when it is kept in pieces
    stored: str  # the repository object holding the bytes, zstd-compressed (in pieces: this backup's own piece)
    stored_size: int
    stored_sha256: str
    reference: str | None  # the backup (of the parent chain) whose object this is; None: this backup's own
    mutable: bool  # written to after this backup (the newest xlog, an active pwal, epoch)
    range: dict  # {"vclock": [from, to]} or {"epochs": [min, max]}; {} when the file has none
    verification: dict  # {"status", "findings", "checked_by": "scan"|"ledger"}
    mtime_ns: int | None = None  # the source file's modification time: with name and size, what says it is unchanged
    # A file that grew since the parent chain stored it (the newest xlog): the chain's pieces, then this backup's
    # object of the bytes appended (the last piece, `stored`). None: the file is one object, `stored`.
    pieces: list[Piece] | None = None
    # Of a mutable xlog: what lets the next incremental store only what is appended to it. {"sha256_state": the
    # SHA-256 state after its bytes (sha256_state.py), "last": [offset, SHA-256 of its bytes from there]: what
    # says that the file still begins with them}.
    append_state: dict | None = None

    OPTIONAL = ("mtime_ns", "pieces", "append_state")

    @classmethod
    def from_json(cls, obj: dict) -> FileEntry:
        try:
            entry = cls(**{k: obj[k] for k in cls.__dataclass_fields__ if k in obj or k not in cls.OPTIONAL})
        except (KeyError, TypeError) as e:
            raise ManifestError(f"a file entry is incomplete: {e}") from None
        check_name(entry.name)
        check_name(entry.stored)
        if entry.pieces is not None:
            if not isinstance(entry.pieces, list) or len(entry.pieces) < 2:
                raise ManifestError(f"{entry.name}: its pieces are not a list of two or more")
            entry.pieces = [Piece.from_json(p) for p in entry.pieces]
            own = entry.pieces[-1]
            if sum(p.size for p in entry.pieces) != entry.size or (own.stored, own.stored_size, own.stored_sha256) \
                    != (entry.stored, entry.stored_size, entry.stored_sha256):
                raise ManifestError(f"{entry.name}: its pieces do not add up to it")
        return entry

    def objects(self) -> list[Piece]:
        """The stored objects the file's bytes are in, in order (one, unless it is kept in pieces)."""
        if self.pieces is not None:
            return self.pieces
        return [Piece(self.stored, self.stored_size, self.stored_sha256, self.size, self.sha256)]

    def to_json(self) -> dict:
        found = asdict(self)
        for key in ("pieces", "append_state"):  # an entry without them is written as before they existed
            if found[key] is None:
                del found[key]
        return found


def source_identity(family: str, source: dict) -> tuple:
    """Which source a backup is of: the family, the instance, the host and the resolved source path. Two
    directories of one instance (a copy beside the original) are two sources; a clone at the same host and path is
    one, told apart by its bytes (an incremental of it is refused as diverged)."""
    return family, source.get("instance"), source.get("host"), source.get("path")


@dataclass
class BackupManifest:
    id: str
    type: str  # full | incremental | snapshot
    parent: str | None
    family: str  # tarantool | limestone
    source: dict  # {"instance", "path", "host", "live", "connect"}
    walvault: str
    started: str
    finished: str
    position: dict  # {"vclock": {...}} or {"epoch": n}: what a restore of this backup holds
    compression: dict
    files: list[FileEntry] = field(default_factory=list)
    checks: dict = field(default_factory=dict)  # the set's verdict: chain, snapshot, vinyl / directory status
    format: int = REPO_FORMAT
    notes: dict[str, str] = field(default_factory=dict)  # `backup --note KEY=VALUE`: what people said of it

    @property
    def instance(self) -> str:
        return self.source["instance"]

    @property
    def identity(self) -> tuple:
        return source_identity(self.family, self.source)

    def to_json(self) -> dict:
        found = asdict(self)
        found["files"] = [f.to_json() for f in self.files]
        if not found["notes"]:  # a manifest without notes is written as before they existed
            del found["notes"]
        if any(f.pieces for f in self.files):
            found["format"] = max(self.format, PIECES_FORMAT)
        return found

    @classmethod
    def from_json(cls, obj: dict) -> BackupManifest:
        if obj.get("format", 0) > PIECES_FORMAT:
            raise ManifestError(f"backup manifest format {obj.get('format')} is newer than this walvault reads")
        try:
            fields = {k: obj[k] for k in cls.__dataclass_fields__ if k != "files" and (k in obj or k != "notes")}
            files = [FileEntry.from_json(f) for f in obj["files"]]
        except (KeyError, TypeError) as e:
            raise ManifestError(f"the backup manifest is incomplete: {e}") from None
        if not isinstance(fields.get("notes", {}), dict):
            raise ManifestError(f"the backup manifest's notes are not a mapping: {fields['notes']!r}")
        for entry in files:
            if not isinstance(entry.size, int) or entry.size < 0:
                raise ManifestError(f"{entry.name}: bad size {entry.size!r}")
        return cls(files=files, **fields)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def stored_bytes(self) -> int:
        """Bytes this backup added to the repository (not those it references)."""
        return sum(f.stored_size for f in self.files if f.reference is None)

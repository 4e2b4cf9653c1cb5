"""Findings: what a check found wrong, with the file, the byte offset and the cause."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Finding:
    code: str
    offset: int | None
    message: str
    file: str | None = None  # set on findings about a set of files (a chain), where the file is not implied

    def to_json(self) -> dict:
        out = {"code": self.code, "offset": self.offset, "message": self.message}
        if self.file is not None:
            out["file"] = self.file
        return out


class Refused(RuntimeError):
    """A command (rotate, repair, state) will not act on a directory because of what checking it found.

    `status` is the directory's verdict when that is the reason: "cannot_check" means it could not be
    checked at all (the CLI exits 2), anything else that it was checked and found wanting (exit 1).
    """

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class FindingList(list):
    """Findings of one file or chain, capped so that a shredded file cannot flood a report."""

    limit = 100

    def add(self, code: str, offset: int | None, message: str, file: str | None = None) -> None:
        if len(self) < self.limit:
            self.append(Finding(code, offset, message, file))
        elif len(self) == self.limit:
            self.append(Finding("too_many_findings", offset, f"more than {self.limit} findings; the rest are not listed"))

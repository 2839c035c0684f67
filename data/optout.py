"""The opt-out registry: a versioned YAML list of excluded repositories, authors, paths.

Every build re-applies the registry at its latest version; ``add_request`` appends an
entry with its date and reason and bumps the version, so a build's manifest records
which registry version it honoured.
"""

from __future__ import annotations

import datetime as _dt
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import yaml

from data.errors import DataConfigError
from data.records import FileRecord, StageStats
from data.step import Step


@dataclass(frozen=True, kw_only=True)
class OptOutEntry:
    """One request: a repository (glob), optionally an author (repo owner) or a path glob."""

    repo: str = ""
    author: str = ""
    path: str = ""
    date: str = ""
    reason: str = ""

    def matches(self, record: FileRecord) -> bool:
        """Whether this request covers the file.

        ``author`` (a glob, case-insensitive) matches the repository's owner (``owner/name``)
        or any commit author of the file: name, email or ``Name <email>``, so it also
        reaches repositories named by folder and code an author committed elsewhere.
        """
        if self.author and not self._author_matches(record):
            return False
        if self.repo and not fnmatch.fnmatchcase(record.repo, self.repo):
            return False
        return not (self.path and not fnmatch.fnmatchcase(record.path, self.path))

    def _author_matches(self, record: FileRecord) -> bool:
        pat = self.author.lower()
        owner = record.repo.split("/", 1)[0] if "/" in record.repo else ""
        names = [owner] if owner else []
        for a in record.authors:
            name, _, email = a.partition(" <")
            names += [a, name, email.rstrip(">")]
        return any(n and fnmatch.fnmatchcase(n.lower(), pat) for n in names)


@dataclass(frozen=True, kw_only=True)
class OptOutRegistry:
    """A registry version and its entries."""

    version: int = 0
    entries: tuple[OptOutEntry, ...] = ()

    @classmethod
    def load(cls, path: str | Path) -> OptOutRegistry:
        """Read a registry file; a missing file is an empty registry at version 0."""
        p = Path(path)
        if not p.exists():
            return cls()
        raw = yaml.safe_load(p.read_text()) or {}
        entries = []
        for i, e in enumerate(raw.get("entries", [])):
            unknown = set(e) - {"repo", "author", "path", "date", "reason"}
            if unknown:
                raise DataConfigError(
                    f"optout entries[{i}]",
                    f"unknown keys {sorted(unknown)}",
                    "use repo, author, path, date, reason",
                )
            entries.append(OptOutEntry(**{k: str(v) for k, v in e.items()}))
        return cls(version=int(raw.get("version", 0)), entries=tuple(entries))

    def save(self, path: str | Path) -> None:
        """Write the registry as YAML."""
        data = {
            "version": self.version,
            "entries": [{k: v for k, v in vars(e).items() if v} for e in self.entries],
        }
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

    def match(self, record: FileRecord) -> OptOutEntry | None:
        """The first entry that covers the file, if any."""
        for e in self.entries:
            if e.matches(record):
                return e
        return None


def add_request(
    path: str | Path,
    *,
    repo: str = "",
    author: str = "",
    file_path: str = "",
    reason: str,
    date: str = "",
) -> OptOutRegistry:
    """Append an opt-out request (repo, author or path) and bump the registry version."""
    if not (repo or author or file_path):
        raise DataConfigError("optout add", "nothing to exclude", "pass --repo, --author or --path")
    if not reason:
        raise DataConfigError("optout add --reason", "empty", "say why the request was made")
    reg = OptOutRegistry.load(path)
    entry = OptOutEntry(
        repo=repo,
        author=author,
        path=file_path,
        reason=reason,
        date=date or _dt.date.today().isoformat(),
    )
    reg = OptOutRegistry(version=reg.version + 1, entries=(*reg.entries, entry))
    reg.save(path)
    return reg


class OptOutStep(Step):
    """Drop files covered by the registry; the reason names the request."""

    name = "optout"

    def __init__(self, registry: OptOutRegistry) -> None:
        self.registry = registry

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        e = self.registry.match(record)
        if e is None:
            return None
        what = "repo" if e.repo else ("author" if e.author else "path")
        return f"{what}:{e.reason}"

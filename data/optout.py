"""The opt-out registry: a versioned YAML list of excluded repositories, authors, paths.

Every build re-applies the registry at its latest version; ``add_request`` appends an
entry with its date and reason and bumps the version, so a build's manifest records
which registry version it honoured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fnmatch
import os
from dataclasses import dataclass, field
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
    existing: OptOutEntry | None = field(default=None, compare=False, repr=False)
    """Set by ``add_request`` when the rule was already there (nothing was written)."""

    @classmethod
    def load(cls, path: str | Path) -> OptOutRegistry:
        """Read a registry file; a missing file is an empty registry at version 0. A file
        that is not the registry's YAML is refused naming the file (a DataConfigError)."""
        p = Path(path)
        if not p.exists():
            return cls()

        def bad(problem: str) -> DataConfigError:
            return DataConfigError(
                f"opt-out registry {p}",
                problem,
                "restore it from a copy (e.g. version control), or repair it by hand: "
                "`version: N` and `entries:`, a list of {repo, author, path, date, reason}",
            )

        try:
            text = p.read_text()
        except UnicodeDecodeError:
            raise bad("not valid YAML (not UTF-8 text)") from None
        except OSError as e:  # a folder, no permission
            raise bad(f"cannot be read ({e.strerror})") from None
        try:
            raw = yaml.safe_load(text)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}" if where is not None else ""
            raise bad(f"not valid YAML{at}") from None
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise bad(f"not a mapping (found a {type(raw).__name__})")
        version = raw.get("version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise bad(f"version {version!r} is not a whole number >= 0")
        items = raw.get("entries") or []
        if not isinstance(items, list):
            raise bad(f"entries is a {type(items).__name__}, not a list")
        entries = []
        for i, e in enumerate(items):
            if not isinstance(e, dict):
                raise bad(f"entries[{i}] is {e!r}, not a mapping of repo/author/path/reason")
            unknown = set(e) - {"repo", "author", "path", "date", "reason"}
            if unknown:
                raise DataConfigError(
                    f"optout entries[{i}]",
                    f"unknown keys {sorted(unknown)}",
                    "use repo, author, path, date, reason",
                )
            entries.append(OptOutEntry(**{k: str(v) for k, v in e.items()}))
        return cls(version=version, entries=tuple(entries))

    def save(self, path: str | Path) -> None:
        """Write the registry as YAML."""
        data = {
            "version": self.version,
            "entries": [{k: v for k, v in vars(e).items() if v} for e in self.entries],
        }
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        # Written beside and renamed into place: a registry cut short by a full disk or a
        # kill would otherwise be unreadable, or read as fewer opt-outs.
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w") as fh:
                fh.write(yaml.safe_dump(data, sort_keys=False))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, p)
        finally:
            tmp.unlink(missing_ok=True)

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
    """Append an opt-out request (repo, author or path) and bump the registry version.

    A rule already in the registry (same repo, author and path) is not added again: the
    registry is returned unchanged, with ``existing`` set to the entry that holds it."""
    if not (repo or author or file_path):
        raise DataConfigError("optout add", "nothing to exclude", "pass --repo, --author or --path")
    if not reason:
        raise DataConfigError("optout add --reason", "empty", "say why the request was made")
    with _registry_lock(path):  # two requests at once: neither overwrites the other
        reg = OptOutRegistry.load(path)
        same = [e for e in reg.entries if (e.repo, e.author, e.path) == (repo, author, file_path)]
        if same:
            # The rule is there already (a retried command, a request filed twice): a new
            # version with the same effect would only make finished versions refuse to
            # rebuild ("different opt-out registry").
            return dataclasses.replace(reg, existing=same[0])
        entry = OptOutEntry(
            repo=repo,
            author=author,
            path=file_path,
            reason=reason,
            date=date or _dt.date.today().isoformat(),
        )
        reg = OptOutRegistry(version=reg.version + 1, entries=(*reg.entries, entry))
        try:
            reg.save(path)
        except OSError as e:
            raise DataConfigError(
                f"opt-out registry {path}",
                f"cannot be written ({e.strerror})",
                "free space or fix permissions there, then rerun; the registry is unchanged",
            ) from None
    return reg


@contextlib.contextmanager
def _registry_lock(path: str | Path):
    """An exclusive lock on ``<registry>.lock`` while a request is read, added and saved."""
    import fcntl

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_name(f".{p.name}.lock"), "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


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

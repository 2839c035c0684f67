"""Ingest: directories, git repositories and (untrusted) archives into file records.

Every entry seen (file, symlink, oversized or binary member, corrupt archive) becomes a
record; the ones that cannot be used are dropped here with a reason, so the manifest can
account for every input.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import re
import stat
import subprocess
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import charset_normalizer

from data.config import IngestConfig, SourceConfig
from data.errors import BuildError
from data.records import FileRecord, StageStats
from data.step import Step, StepRun

log = logging.getLogger(__name__)

Entry = tuple[FileRecord, bytes | None]
BUDGET_REASONS = ("archive_budget_exceeded", "compression_ratio_exceeded")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
WESTERN = ("cp1252", "latin_1", "iso8859_15", "utf_16", "shift_jis", "gb18030", "euc_kr", "big5")


@dataclass(frozen=True, order=True)
class RepoUnit:
    """One repository to ingest: the unit of work assigned to a shard."""

    name: str
    kind: str
    path: str
    stars: int = 0
    weight: int = 1


def _dir_weight(path: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != ".git"]
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return max(total, 1)


def _is_archive(p: Path) -> bool:
    return p.is_file() and p.name.lower().endswith(ARCHIVE_SUFFIXES)


def plan_units(sources: Iterable[SourceConfig]) -> list[RepoUnit]:
    """Expand sources into repository units, sorted by name (names must be unique)."""
    units: list[RepoUnit] = []
    for src in sources:
        p = Path(src.path)
        if not p.exists():
            raise BuildError(f"source path {p} does not exist (sources[].path)")
        if src.layout == "repos":
            if not p.is_dir():
                raise BuildError(f"layout 'repos' needs a directory, got {p}")
            linked = []
            for child in sorted(p.iterdir()):
                if child.is_symlink():  # it may point anywhere: not followed
                    linked.append(child)
                    continue
                if src.type == "archive" and _is_archive(child):
                    units.append(
                        RepoUnit(
                            _archive_name(child),
                            "archive",
                            str(child),
                            src.stars,
                            child.stat().st_size,
                        )
                    )
                elif src.type == "git" and child.is_dir():
                    units.append(RepoUnit(child.name, "git", str(child), src.stars, 1))
                elif src.type == "dir" and child.is_dir():
                    units.append(
                        RepoUnit(child.name, "dir", str(child), src.stars, _dir_weight(child))
                    )
            if linked:
                _warn_linked(p, linked)
        else:
            name = src.name or (_archive_name(p) if src.type == "archive" else p.name)
            weight = (
                p.stat().st_size
                if src.type == "archive"
                else (_dir_weight(p) if src.type == "dir" else 1)
            )
            units.append(RepoUnit(name, src.type, str(p), src.stars, weight))
    units.sort()
    names = [u.name for u in units]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise BuildError(
            f"repository names must be unique; duplicated: {dups[:5]} "
            "(set sources[].name to tell them apart)"
        )
    return units


def _warn_linked(folder: Path, linked: list[Path]) -> None:
    shown = ", ".join(f"{c.name} -> {os.readlink(c)}" for c in linked[:5])
    more = f" and {len(linked) - 5} more" if len(linked) > 5 else ""
    log.warning(
        "source %s (layout 'repos'): skipped %d symlinked entries (%s%s): a symlink can "
        "point outside the source, so it is not followed. To include one, list its target "
        "as a source of its own (layout 'repo').",
        folder,
        len(linked),
        shown,
        more,
    )


def _archive_name(p: Path) -> str:
    name = p.name
    for suf in ARCHIVE_SUFFIXES:
        if name.lower().endswith(suf):
            return name[: -len(suf)]
    return name


def assign_shards(units: list[RepoUnit], num_shards: int) -> list[list[RepoUnit]]:
    """Deterministic longest-processing-time assignment of units to shards."""
    shards: list[list[RepoUnit]] = [[] for _ in range(num_shards)]
    loads = [0] * num_shards
    for u in sorted(units, key=lambda u: (-u.weight, u.name)):
        i = min(range(num_shards), key=lambda k: (loads[k], k))
        shards[i].append(u)
        loads[i] += u.weight
    return [sorted(s) for s in shards]


# Bytes ``surrogateescape`` could not decode as UTF-8, and the characters it did decode
# beyond ASCII (well-formed multi-byte sequences).
_ESCAPED = re.compile("[\udc80-\udcff]")
_NON_ASCII = re.compile("[^\x00-\x7f\udc80-\udcff]")
UTF8_REPAIR_SHARE = 0.9
"""Share of well-formed sequences among a file's non-ASCII units (sequences plus broken
bytes) at or above which it is damaged UTF-8, decoded with U+FFFD for the broken bytes."""
UTF8_MIXED_SHARE = 0.5
"""Share from which (up to the repair share) a file is UTF-8 mixed with another encoding:
every single decoding garbles part of it, so it is dropped. Text in a legacy code page
shares few byte pairs with UTF-8 (measured: Shift_JIS/GBK/Big5/EUC ~0.15, Western and
Cyrillic code pages ~0.0-0.1 over whole sentences), so below this it goes to detection."""
UTF8_REPLACED = "utf-8-replaced"
"""``encoding`` of a damaged UTF-8 file kept with U+FFFD: decode the raw bytes with
``errors="replace"`` to reproduce its content."""


def utf8_damage(raw: bytes) -> tuple[int, int]:
    """(well-formed multi-byte UTF-8 sequences, bytes that are not valid UTF-8)."""
    text = raw.decode("utf-8", "surrogateescape")
    return len(_NON_ASCII.findall(text)), len(_ESCAPED.findall(text))


MAX_CHAOS = 0.1
"""charset-normalizer "chaos" (mess ratio) above which a detection is not trusted."""


# Byte-order marks of the wide Unicode encodings, UTF-32 first (its little-endian BOM
# starts with UTF-16's).
WIDE_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)


def decode_wide(raw: bytes) -> tuple[str, str] | None:
    """UTF-16/32 text that starts with its BOM (Windows tools write source this way, a NUL
    byte in every ASCII character); None when there is no BOM or the rest does not
    decode."""
    for bom, encoding in WIDE_BOMS:
        if raw.startswith(bom):
            try:
                return raw[len(bom) :].decode(encoding), encoding
            except UnicodeDecodeError:
                return None
    return None


def decode_bytes(raw: bytes) -> tuple[str, str] | None:
    """Decode text: UTF-8 first; damaged UTF-8 (>= 90% of its non-ASCII well-formed) with
    U+FFFD; text mostly in another encoding by confident charset detection; None
    otherwise (mixed encodings, no confident detection)."""
    if raw.startswith(b"\xef\xbb\xbf"):
        try:
            return raw[3:].decode("utf-8"), "utf-8-sig"
        except UnicodeDecodeError:
            pass
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # damaged UTF-8 with a BOM: the BOM is no part of the text
    good, bad = utf8_damage(raw)
    share = good / (good + bad)
    if share >= UTF8_REPAIR_SHARE:
        # A UTF-8 file with a few broken bytes (a stray Latin-1 byte in a comment): a code
        # page would garble all its good text, so the broken bytes become U+FFFD, as the
        # WHATWG Encoding Standard's UTF-8 decoder (and so browsers) do.
        return raw.decode("utf-8", "replace"), UTF8_REPLACED
    if share >= UTF8_MIXED_SHARE:
        return None  # UTF-8 mixed with another encoding: any one decoding garbles it
    matches = [m for m in charset_normalizer.from_bytes(raw) if m.chaos <= MAX_CHAOS]
    if not matches:
        return None  # no confident detection: dropped rather than kept as mojibake
    # Single-byte code pages are hard to tell apart on short files; among near-equal
    # candidates prefer the Western ones, by far the most common in source code.
    floor = min(m.chaos for m in matches) + 0.05
    close = [m for m in matches if m.chaos <= floor]
    best = next((m for pref in WESTERN for m in close if m.encoding == pref), close[0])
    return str(best), best.encoding


def _printable(name: str) -> str:
    """``name`` with undecodable (surrogate-escaped) bytes written as ``\\xNN``."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def safe_member_path(name: str) -> str | None:
    """Normalise an archive member name; None when it is absolute or escapes the root."""
    name = name.replace("\\", "/")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return posixpath.join(*parts)


class IngestStep(Step):
    """Read the repository units of a shard and yield one record per entry."""

    name = "ingest"

    def __init__(self, config: IngestConfig) -> None:
        self.config = config

    def run(self, records: Iterable[RepoUnit], rank: int = 0, world_size: int = 1) -> StepRun:
        stats = StageStats(self.name)
        index = 0
        import time

        t0, c0 = time.perf_counter(), time.thread_time()
        for unit in records:
            reader = {"dir": self._read_dir, "git": self._read_git, "archive": self._read_archive}[
                unit.kind
            ]
            for rec, raw in reader(unit, stats):
                rec.shard, rec.index, rec.stars = rank, index, unit.stars
                rec.repo = _printable(rec.repo)
                if _printable(rec.path) != rec.path:
                    # Not UTF-8 (surrogate-escaped bytes): Parquet strings cannot hold it.
                    rec.path = _printable(rec.path)
                    rec.drop(self.name, "undecodable_path")
                index += 1
                stats.files_in += 1
                stats.bytes_in += rec.size
                if not rec.drop_stage and raw is not None:
                    self._decode(rec, raw)
                if rec.drop_stage:
                    stats.dropped[rec.drop_reason] = stats.dropped.get(rec.drop_reason, 0) + 1
                else:
                    stats.files_out += 1
                    stats.bytes_out += rec.size
                stats.seconds += time.perf_counter() - t0
                stats.cpu_seconds += time.thread_time() - c0  # git subprocesses not included
                yield rec
                t0, c0 = time.perf_counter(), time.thread_time()
        stats.dropped = dict(sorted(stats.dropped.items()))
        return stats

    def _decode(self, rec: FileRecord, raw: bytes) -> None:
        decoded = decode_wide(raw)
        if decoded is not None:
            if "\x00" in decoded[0]:  # a BOM-like start on a binary file
                rec.drop(self.name, "binary")
            else:
                rec.content, rec.encoding = decoded
            return
        if b"\x00" in raw:
            rec.drop(self.name, "binary")
            return
        decoded = decode_bytes(raw)
        if decoded is None:
            rec.drop(self.name, "invalid_utf8")
            return
        rec.content, rec.encoding = decoded

    # -- directories -------------------------------------------------------------------
    def _read_dir(self, unit: RepoUnit, stats: StageStats) -> Iterator[Entry]:
        root = Path(unit.path)
        unlistable: list[OSError] = []
        for dirpath, dirs, files in os.walk(root, onerror=unlistable.append):
            yield from self._unlistable(unit, root, unlistable)
            # os.walk (not following links) lists a link to a folder among ``dirs``; it is
            # a file entry here (dropped as ``symlink``). Taken from walk's own listing:
            # listing the folder again failed when it had vanished since (a build crash).
            link_dirs = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
            dirs[:] = sorted(d for d in dirs if d != ".git" and d not in link_dirs)
            for f in sorted(files + link_dirs):
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                rec = FileRecord(repo=unit.name, path=rel)
                try:
                    st = os.lstat(full)
                except OSError:
                    rec.drop(self.name, "unreadable")
                    yield rec, None
                    continue
                rec.size = st.st_size
                if stat.S_ISLNK(st.st_mode):
                    rec.drop(self.name, "symlink")
                elif not stat.S_ISREG(st.st_mode):
                    rec.drop(self.name, "special_file")
                elif st.st_size > self.config.max_file_bytes:
                    rec.drop(self.name, "too_large")
                if rec.drop_stage:
                    yield rec, None
                    continue
                raw = self._read_regular(full, rec)
                if raw is None:
                    yield rec, None
                    continue
                if len(raw) > self.config.max_file_bytes:
                    rec.drop(self.name, "too_large")
                    yield rec, None
                    continue
                rec.size = len(raw)
                yield rec, raw
        yield from self._unlistable(unit, root, unlistable)

    def _read_regular(self, full: str, rec: FileRecord) -> bytes | None:
        """The bytes of ``full`` if it is still a regular file when opened, else None with
        ``rec`` dropped: a file swapped for a symlink after ``lstat`` is not followed (it
        may point outside the source), nor a FIFO waited on (a plain open blocks)."""
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            rec.drop(self.name, "symlink" if e.errno == errno.ELOOP else "unreadable")
            return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                rec.drop(self.name, "special_file")
                return None
            try:
                return fh.read(self.config.max_file_bytes + 1)
            except OSError:
                rec.drop(self.name, "unreadable")
                return None

    def _unlistable(self, unit: RepoUnit, root: Path, errors: list[OSError]) -> Iterator[Entry]:
        """A folder ``os.walk`` could not list becomes an ``unreadable`` drop row."""
        for err in errors:
            rel = os.path.relpath(err.filename or root, root).replace(os.sep, "/")
            rec = FileRecord(repo=unit.name, path="" if rel == "." else rel)
            rec.drop(self.name, "unreadable")
            yield rec, None
        errors.clear()

    # -- git ---------------------------------------------------------------------------
    def _read_git(self, unit: RepoUnit, stats: StageStats) -> Iterator[Entry]:
        path = unit.path
        if not os.path.isdir(path):  # gone since the plan, as a vanished folder is
            rec = FileRecord(repo=unit.name, path="")
            rec.drop(self.name, "unreadable")
            yield rec, None
            return
        commit, date = git_head(path)
        listing = subprocess.run(
            ["git", "-C", path, "ls-tree", "-r", "-z", "-l", "--full-tree", commit],
            capture_output=True,
            check=True,
        ).stdout
        entries = []
        for item in listing.split(b"\0"):
            if not item:
                continue
            meta, name = item.split(b"\t", 1)
            mode, kind, sha, size = meta.split()
            entries.append(
                (
                    name.decode("utf-8", "surrogateescape"),
                    mode.decode(),
                    kind.decode(),
                    sha.decode(),
                    size.decode(),
                )
            )
        entries.sort()
        authors = git_file_authors(path, commit)
        proc = subprocess.Popen(
            ["git", "-C", path, "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for name, mode, kind, sha, size in entries:
                rec = FileRecord(
                    repo=unit.name,
                    path=name,
                    commit=commit,
                    commit_date=date,
                    authors=authors.get(name, ()),
                )
                rec.size = int(size) if size.isdigit() else 0
                if mode == "120000":
                    rec.drop(self.name, "symlink")
                elif kind != "blob":
                    rec.drop(self.name, "submodule")
                elif rec.size > self.config.max_file_bytes:
                    rec.drop(self.name, "too_large")
                if rec.drop_stage:
                    yield rec, None
                    continue
                proc.stdin.write(sha.encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.readline().split()
                n = int(header[2])
                raw = proc.stdout.read(n)
                proc.stdout.read(1)
                yield rec, raw
        finally:
            proc.stdin.close()
            proc.wait()

    # -- archives ----------------------------------------------------------------------
    def _read_archive(self, unit: RepoUnit, stats: StageStats) -> Iterator[Entry]:
        reader = self._read_zip if unit.path.lower().endswith(".zip") else self._read_tar
        try:
            size = os.path.getsize(unit.path)
        except OSError:  # gone (or unreadable) since the plan, as a vanished folder is
            rec = FileRecord(repo=unit.name, path="")
            rec.drop(self.name, "unreadable")
            yield rec, None
            return
        # Expanded bytes allowed: the byte budget, and the ratio times the archive's size
        # (with 1 MiB of slack so tiny archives of small files pass).
        ratio_cap = int(self.config.max_compression_ratio * max(size, 1 << 20))
        self._ratio_bound = ratio_cap < self.config.max_archive_bytes

        def budget() -> list[int]:
            return [min(self.config.max_archive_bytes, ratio_cap), self.config.max_archive_members]

        try:
            # A first pass reads the archive through, within the same bounds, keeping
            # nothing: damage is found before any member is yielded, so a cut download or
            # a member failing its CRC does not publish the members before it (part of a
            # repository, perhaps without its license file). It costs a second
            # decompression of each archive.
            # It also finds each path's last entry: an archive can hold one path twice (`tar
            # -r` appends a newer copy, zip tools add a duplicate name), and extracting it
            # leaves the last, as tar and unzip do; the earlier ones are `duplicate_path`.
            last: dict[str, int] = {}
            for i, (rec, _) in enumerate(reader(unit, budget())):
                key = safe_member_path(rec.path) if rec.path else None
                if key is not None:
                    last[key] = i
            for i, (rec, raw) in enumerate(reader(unit, budget())):
                key = safe_member_path(rec.path) if rec.path else None
                if not rec.drop_stage and key is not None and last.get(key) != i:
                    rec.drop(self.name, "duplicate_path")
                    raw = None
                yield rec, raw
        except (
            tarfile.TarError,
            zipfile.BadZipFile,
            zlib.error,
            EOFError,
            OSError,
            ValueError,
            NotImplementedError,
            RuntimeError,
        ) as e:
            rec = FileRecord(repo=unit.name, path="")
            rec.drop(self.name, f"corrupt_archive:{type(e).__name__}")
            stats.count("corrupt_archives")
            yield rec, None

    def _member(
        self, unit: RepoUnit, name: str, size: int, kind: str, budget: list[int], read
    ) -> tuple[FileRecord, bytes | None] | None:
        rec = FileRecord(repo=unit.name, path=name, size=max(size, 0))
        safe = safe_member_path(name)
        if budget[1] <= 0 or budget[0] <= 0:
            rec.drop(self.name, self._budget_reason())
            return rec, None
        budget[1] -= 1
        if safe is None:
            rec.drop(self.name, "unsafe_path")
        elif kind == "link":
            rec.drop(self.name, "symlink")
        elif kind != "file":
            rec.drop(self.name, "special_file")
        elif size > self.config.max_file_bytes:
            rec.drop(self.name, "too_large")
        elif size > budget[0]:
            rec.drop(self.name, self._budget_reason())
            budget[0] = 0
        if rec.drop_stage:
            return rec, None
        rec.path = safe
        limit = min(self.config.max_file_bytes, budget[0])
        raw = read(limit + 1)
        budget[0] -= len(raw)
        if len(raw) > limit:
            # The declared size lied (a decompression bomb): stop at the bound.
            rec.drop(
                self.name,
                "too_large" if limit == self.config.max_file_bytes else self._budget_reason(),
            )
            budget[0] = min(budget[0], 0) if limit != self.config.max_file_bytes else budget[0]
            return rec, None
        rec.size = len(raw)
        return rec, raw

    def _budget_reason(self) -> str:
        return (
            "compression_ratio_exceeded"
            if getattr(self, "_ratio_bound", False)
            else "archive_budget_exceeded"
        )

    def _read_tar(self, unit: RepoUnit, budget: list[int]) -> Iterator[Entry]:
        with tarfile.open(unit.path, mode="r|*") as tf:
            for m in tf:
                kind = (
                    "link"
                    if (m.issym() or m.islnk())
                    else ("file" if m.isfile() else ("dir" if m.isdir() else "special"))
                )
                if kind == "dir":
                    continue
                fh = tf.extractfile(m) if kind == "file" else None

                def read(n: int, fh=fh, size=m.size) -> bytes:
                    raw = fh.read(n) if fh is not None else b""
                    if fh is not None and len(raw) < min(n, size):
                        # tarfile's stream mode returns a cut member's bytes short and
                        # then ends as if the archive had: a cut .tar read as complete.
                        raise tarfile.ReadError("unexpected end of data")
                    return raw

                out = self._member(unit, m.name, m.size, kind, budget, read)
                if out is not None:
                    yield out
                if out is not None and out[0].drop_reason in BUDGET_REASONS:
                    return
            # A tar ends with a zero block, which tarfile reads and stops at; at the end of
            # the stream instead it stops the same way, reading nothing: a .tar cut between
            # two members. (``offset`` is where the next header would start.)
            if tf.fileobj.tell() <= tf.offset:
                raise tarfile.ReadError("unexpected end of data (no end-of-archive block)")

    def _read_zip(self, unit: RepoUnit, budget: list[int]) -> Iterator[Entry]:
        with zipfile.ZipFile(unit.path) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if info.file_size > self.config.max_compression_ratio * max(
                    info.compress_size, 1 << 16
                ):
                    rec = FileRecord(repo=unit.name, path=info.filename, size=info.file_size)
                    rec.drop(self.name, "compression_ratio_exceeded")
                    yield rec, None
                    continue
                mode = (info.external_attr >> 16) & 0xFFFF
                fmt = stat.S_IFMT(mode)  # 0 when the archiver stored no file type
                kind = (
                    "link"
                    if stat.S_ISLNK(mode)
                    else ("file" if (fmt == 0 or stat.S_ISREG(mode)) else "special")
                )
                opened = []

                def read(n: int, info=info, opened=opened) -> bytes:
                    fh = zf.open(info)
                    opened.append(fh)
                    return fh.read(n)

                try:
                    out = self._member(unit, info.filename, info.file_size, kind, budget, read)
                finally:
                    for fh in opened:
                        fh.close()
                if out is not None:
                    yield out
                if out is not None and out[0].drop_reason in BUDGET_REASONS:
                    return


def git_file_authors(path: str, commit: str) -> dict[str, tuple[str, ...]]:
    """``Name <email>`` of every author who committed to each file, from one ``git log``."""
    out = subprocess.run(
        [
            "git",
            "-C",
            path,
            "-c",
            "core.quotePath=false",
            "log",
            "-z",  # names unquoted, NUL-terminated (git quotes "\n", '"', "\\", "\t")
            "--no-renames",
            "--format=%x01%an <%ae>",
            "--name-only",
            commit,
        ],
        capture_output=True,
        check=False,
    ).stdout.decode("utf-8", "surrogateescape")
    found: dict[str, set[str]] = {}
    for block in out.split("\x01")[1:]:
        who, _, names = block.partition("\0")
        for f in names.removeprefix("\n").split("\0"):
            if f:
                found.setdefault(f, set()).add(who)
    return {f: tuple(sorted(a)) for f, a in found.items()}


def git_head(path: str) -> tuple[str, str]:
    """The latest commit of the default branch of a local repository, and its ISO date."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", path, *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    top = git("rev-parse", "--show-toplevel")  # empty for a bare repository
    probe = subprocess.run(
        ["git", "-C", path, "rev-parse", "--git-dir"], capture_output=True, text=True, check=False
    )
    if "dubious ownership" in probe.stderr:
        # git >= 2.35.2 will not read a repository another user owns (CVE-2022-24765);
        # running git with that repository's own config is what it guards against.
        raise BuildError(
            f"git refuses to read {path}: it belongs to another user (git: detected dubious "
            "ownership). Fix: build as its owner, or, if you trust it, run `git config "
            f"--global --add safe.directory {path}` and rerun"
        )
    if top and Path(top).resolve() != Path(path).resolve():
        raise BuildError(
            f"{path} is not a git repository but lies inside {top}, whose files it would "
            "ingest. Fix: use type: dir for a plain folder, or point sources[].path at the "
            "repository's top folder"
        )
    ref = git("symbolic-ref", "-q", "refs/remotes/origin/HEAD") or "HEAD"
    commit = git("rev-parse", "--verify", "-q", ref + "^{commit}")
    if not commit:
        raise BuildError(
            f"{path} is not a git repository, or has no commit on its default branch. "
            "Fix: commit to it, use type: dir for a plain folder, or remove it from sources"
        )
    return commit, git("show", "-s", "--format=%cI", commit)

"""Parquet snapshots: schemas, writers, manifest, checksums, ``diff`` and the changelog."""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from data.errors import BuildError
from data.records import FileRecord

ROW_GROUP = 512

KEPT_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("index", pa.int64()),
        ("repo", pa.string()),
        ("path", pa.string()),
        ("commit", pa.string()),
        ("commit_date", pa.string()),
        ("stars", pa.int64()),
        ("language", pa.string()),
        ("vendored", pa.bool_()),
        ("generated", pa.bool_()),
        ("license_type", pa.string()),
        ("license_ids", pa.list_(pa.string())),
        ("license_source", pa.string()),
        ("license_score", pa.float64()),
        ("encoding", pa.string()),
        ("size", pa.int64()),
        ("content_bytes", pa.int64()),
        ("sha256", pa.string()),
        ("pii", pa.string()),
        ("content", pa.large_string()),
        ("signature", pa.binary()),
    ]
)
OUTPUT_COLUMNS = [
    f.name for f in KEPT_SCHEMA if f.name not in ("shard", "index", "signature", "stars")
]
DROP_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("index", pa.int64()),
        ("repo", pa.string()),
        ("path", pa.string()),
        ("stage", pa.string()),
        ("reason", pa.string()),
        ("size", pa.int64()),
        ("detail", pa.string()),
    ]
)
OPTOUT_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("index", pa.int64()),
        ("repo", pa.string()),
        ("path", pa.string()),
        ("sha256", pa.string()),
        ("signature", pa.binary()),
    ]
)
PII_LOG_SCHEMA = pa.schema(
    [
        ("repo", pa.string()),
        ("path", pa.string()),
        ("type", pa.string()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("value_hmac", pa.string()),
    ]
)


def kept_row(r: FileRecord) -> dict[str, Any]:
    """One stage-1 row for a kept record."""
    return {
        "shard": r.shard,
        "index": r.index,
        "repo": r.repo,
        "path": r.path,
        "commit": r.commit,
        "commit_date": r.commit_date,
        "stars": r.stars,
        "language": r.language,
        "vendored": r.vendored,
        "generated": r.generated,
        "license_type": r.license_type,
        "license_ids": list(r.license_ids),
        "license_source": r.license_source,
        "license_score": round(r.license_score, 4),
        "encoding": r.encoding,
        "size": r.size,
        "content_bytes": len(r.content.encode("utf-8", "surrogatepass")),
        "sha256": r.sha256,
        "pii": json.dumps(r.pii_counts, sort_keys=True),
        "content": r.content,
        "signature": r.signature.tobytes() if r.signature is not None else b"",
    }


def optout_row(r: FileRecord, hasher: Any) -> dict[str, Any]:
    """Hash and MinHash signature of an opted-out file (no content: it is not published)."""
    import hashlib

    sigs, has = hasher.signatures([r.content])
    return {
        "shard": r.shard,
        "index": r.index,
        "repo": r.repo,
        "path": r.path,
        "sha256": hashlib.sha256(r.content.encode("utf-8", "surrogatepass")).hexdigest(),
        "signature": sigs[0].tobytes() if has[0] else b"",
    }


def drop_row(r: FileRecord, detail: str = "") -> dict[str, Any]:
    """One drop-table row."""
    return {
        "shard": r.shard,
        "index": r.index,
        "repo": r.repo,
        "path": r.path,
        "stage": r.drop_stage,
        "reason": r.drop_reason,
        "size": r.size,
        "detail": detail,
    }


class RowWriter:
    """Write rows to a Parquet file in fixed-size row groups, atomically (tmp + rename)."""

    def __init__(self, path: Path, schema: pa.Schema, columns: list[str] | None = None) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        self.schema = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        self.rows: list[dict[str, Any]] = []
        self.count = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = pq.ParquetWriter(
            self.tmp, self.schema, compression="zstd", write_statistics=False
        )

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []

    def close(self) -> int:
        self.flush()
        self.writer.close()
        os.replace(self.tmp, self.path)
        return self.count


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version() -> dict[str, str]:
    """The package version and a hash of the data package's source files."""
    from data import __version__

    root = Path(__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return {"package": __version__, "source_sha256": h.hexdigest()}


def write_checksums(version_dir: Path, files: Iterable[str], manifest: Path | None = None) -> None:
    """``checksums.sha256`` in ``sha256sum`` format for the given relative paths (and for
    ``manifest.json``, whose bytes are in ``manifest`` until it is moved into place)."""
    sums = {f: sha256_file(version_dir / f) for f in files}
    if manifest is not None:
        sums["manifest.json"] = sha256_file(manifest)
    lines = [f"{sums[f]}  {f}" for f in sorted(sums)]
    tmp = version_dir / "checksums.sha256.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, version_dir / "checksums.sha256")


def verify_checksums(version_dir: str | Path) -> list[str]:
    """Relative paths whose checksum does not match (empty when all match)."""
    version_dir = Path(version_dir)
    bad = []
    for line in (version_dir / "checksums.sha256").read_text().splitlines():
        digest, name = line.split("  ", 1)
        p = version_dir / name
        if not p.exists() or sha256_file(p) != digest:
            bad.append(name)
    return bad


def verify_manifest(version_dir: str | Path) -> dict[str, str]:
    """Published files that do not match ``manifest.json``: relative path -> what is wrong
    (missing, or the SHA-256 differs); empty when all match. ``manifest.json`` itself is
    checked against ``checksums.sha256`` when that file lists it."""
    version_dir = Path(version_dir)
    manifest = load_manifest(version_dir)
    bad: dict[str, str] = {}
    entries = [*manifest["shards"], *manifest["drops"], *manifest["pii_logs"]]
    entries += manifest.get("tokens", [])  # present when the build tokenized
    sums = version_dir / "checksums.sha256"
    if sums.is_file():
        listed = dict(reversed(line.split("  ", 1)) for line in sums.read_text().splitlines())
        if "manifest.json" in listed:
            entries.append({"path": "manifest.json", "sha256": listed["manifest.json"]})
    for entry in entries:
        p = version_dir / entry["path"]
        if not p.is_file():
            bad[entry["path"]] = "missing"
            continue
        got = sha256_file(p)
        if got != entry["sha256"]:
            bad[entry["path"]] = f"sha256 {got[:12]}..., recorded {entry['sha256'][:12]}..."
    return bad


def load_manifest(version_dir: str | Path) -> dict[str, Any]:
    """Read a snapshot's manifest (raises BuildError when it is not a finished snapshot)."""
    p = Path(version_dir) / "manifest.json"
    if not p.is_file():
        d = Path(version_dir)
        if not d.is_dir():
            raise BuildError(
                f"{version_dir} does not exist. Fix: give a version folder, e.g. out/v1"
            )
        # An output_dir given for one of its versions (`data stats out`): name them.
        from data.versions import version_key

        inner = sorted(
            (x.name for x in d.iterdir() if (x / "manifest.json").is_file()), key=version_key
        )
        if inner:
            shown = ", ".join(str(d / v) for v in inner[:5]) + (", ..." if len(inner) > 5 else "")
            raise BuildError(
                f"{version_dir} is an output_dir, not a version. Fix: give one of its "
                f"versions: {shown}"
            )
        raise BuildError(
            f"{version_dir} has no manifest.json: not a finished build. Fix: finish it by "
            "rerunning its `data build` (finished shards are kept), or give a finished version"
        )
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise BuildError(
            f"{p} is damaged ({e}). Fix: rerun the build of this version with its config "
            "(finished shards are kept), or restore the file from a copy"
        ) from None


def file_index(version_dir: str | Path) -> dict[tuple[str, str], str]:
    """(repo, path) -> sha256 for every kept file of a snapshot."""
    version_dir = Path(version_dir)
    out: dict[tuple[str, str], str] = {}
    for shard in load_manifest(version_dir)["shards"]:
        t = pq.read_table(version_dir / shard["path"], columns=["repo", "path", "sha256"])
        for repo, path, digest in zip(
            t["repo"].to_pylist(), t["path"].to_pylist(), t["sha256"].to_pylist(), strict=True
        ):
            out[(repo, path)] = digest
    return out


def diff_versions(v1: str | Path, v2: str | Path) -> dict[str, list[tuple[str, str]]]:
    """Files added, removed and changed (content hash differs) from snapshot v1 to v2."""
    a, b = file_index(v1), file_index(v2)
    return {
        "added": sorted(set(b) - set(a)),
        "removed": sorted(set(a) - set(b)),
        "changed": sorted(k for k in set(a) & set(b) if a[k] != b[k]),
    }


def append_changelog(
    output_dir: Path, version: str, manifest: dict[str, Any], previous: str | None
) -> str:
    """Append this version's entry to ``CHANGELOG.md`` (newest last) and return it."""
    lines = [
        f"## {version} ({_dt.date.today().isoformat()})",
        "",
        f"- files: {manifest['inputs']['files']} in, {manifest['outputs']['files']} kept, "
        f"{manifest['dropped']['files']} dropped",
        f"- bytes kept: {manifest['outputs']['bytes']}",
        f"- code: {manifest['code_version']['source_sha256'][:12]}, opt-out registry "
        f"v{manifest['optout_registry_version']}",
    ]
    if previous:
        d = diff_versions(output_dir / previous, output_dir / version)
        lines.append(
            f"- since {previous}: {len(d['added'])} added, {len(d['removed'])} removed, "
            f"{len(d['changed'])} changed"
        )
    entry = "\n".join(lines) + "\n\n"
    log = output_dir / "CHANGELOG.md"
    # Versions built in parallel into one output_dir finish in any order: the lock keeps
    # one's read-modify-write from overwriting the other's entry.
    with open(output_dir / ".changelog.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = log.read_text() if log.exists() else "# Dataset changelog\n\n"
        marker = f"## {version} ("
        if marker in text:  # a rebuilt version replaces its entry
            head, _, rest = text.partition(marker)
            nxt = rest.find("\n## ")
            text = head + (rest[nxt + 1 :] if nxt >= 0 else "")
        tmp = log.with_name(f"{log.name}.{os.getpid()}.tmp")
        tmp.write_text(text + entry)
        os.replace(tmp, log)
    return entry

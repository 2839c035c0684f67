"""A per-checkpoint manifest of file sizes and CRC32s, and the checks that read it.

The manifest is written into Orbax's temporary step directory just before the rename that
finalizes the step (`jaxcore.checkpointing.atomic`), so a finalized step always carries
one: a step is either verifiable or was never finalized. What Orbax's atomicity cannot
see -- a finalized checkpoint whose files were later truncated, lost or corrupted (a full
disk, a half-copied bucket, a bad sector) -- the manifest proves, file by file.

Only the two files Orbax itself writes while finalizing (its step metadata and commit
marker, at the top of the step) are outside the manifest: they are written after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import zlib

MANIFEST = "jaxcore_manifest.json"
VERIFY_MODES = ("checksum", "size", "none")
# Written by Orbax's finalize after the manifest (atomicity.AtomicRenameTemporaryPath).
_FINALIZE_FILES = ("_CHECKPOINT_METADATA", "commit_success.txt")


@dataclasses.dataclass(frozen=True)
class Damage:
    """Proof, from a step's own manifest, that one of its files is not what was written.

    Attributes:
        path: the file (or the manifest itself) that is wrong.
        reason: what is wrong with it, in words.
    """

    path: pathlib.Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path} {self.reason}"


def crc32(path: pathlib.Path) -> int:
    """CRC32 of a file, read in 4 MiB chunks."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_table(root: pathlib.Path) -> dict[str, dict[str, int]]:
    """``relative path -> {"size", "crc32"}`` for every file of the step under ``root``."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if not path.is_file() or rel.startswith(MANIFEST) or rel in _FINALIZE_FILES:
            continue
        out[rel] = {"size": path.stat().st_size, "crc32": crc32(path)}
    return out


def write_manifest(root: pathlib.Path, step: int) -> None:
    """Record the files of the (not yet renamed) step directory ``root``, durably."""
    tmp = root / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "files": file_table(root)}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)


def has_manifest(root: pathlib.Path) -> bool:
    """Whether the step ``root`` carries a manifest (steps of jaxcore <= 0.1 may not)."""
    return (root / MANIFEST).exists()


def read_manifest(root: pathlib.Path) -> dict[str, dict[str, int]] | Damage:
    """The manifest's file table, or the `Damage` of an unreadable manifest."""
    manifest = root / MANIFEST
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return Damage(manifest, f"is unreadable ({type(e).__name__}: {e})")
    if not isinstance(files, dict):
        return Damage(manifest, "is unreadable (no file table)")
    return files


def check_file(root: pathlib.Path, rel: str, want: dict[str, int], verify: str) -> Damage | None:
    """Whether one file of the step matches its manifest entry (``None``: it does)."""
    path = root / rel
    if not path.is_file():
        return Damage(path, "is missing")
    size = path.stat().st_size
    if size != want.get("size"):
        return Damage(path, f"has {size} bytes, {want.get('size')} were written")
    if verify == "checksum" and crc32(path) != want.get("crc32"):
        return Damage(path, "fails its CRC32 check (same size, different bytes)")
    return None


def check_files(
    root: pathlib.Path, verify: str, *, shard: tuple[int, int] = (0, 1)
) -> tuple[Damage | None, int]:
    """The first damaged file among this shard of the manifest, and the files checked.

    ``shard=(i, n)`` checks every n-th file starting at i, so n processes share the reads
    of one step; `verify='none'` checks nothing.
    """
    if verify == "none":
        return None, 0
    files = read_manifest(root)
    if isinstance(files, Damage):
        return files, 0
    index, count = shard
    names = sorted(files)[index::count]
    for rel in names:
        damage = check_file(root, rel, files[rel], verify)
        if damage is not None:
            return damage, len(names)
    return None, len(names)

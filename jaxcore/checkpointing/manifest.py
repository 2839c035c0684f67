"""A per-checkpoint manifest of file sizes and CRC32s, and the check that reads it.

Orbax finalizes a step atomically, so a save killed half-way is never listed; what it
cannot see is a finalized checkpoint whose files were later truncated or lost (a full
disk, a half-copied bucket). The manifest, written once the step is final, lets a restore
name such a checkpoint instead of failing inside a tensor read.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import zlib

log = logging.getLogger(__name__)

MANIFEST = "jaxcore_manifest.json"
VERIFY_MODES = ("checksum", "size", "none")


def crc32(path: pathlib.Path) -> int:
    """CRC32 of a file, read in 4 MiB chunks."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_table(root: pathlib.Path, checksum: bool) -> dict[str, dict[str, int]]:
    """``relative path -> {"size", "crc32"?}`` for every file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.name.startswith(MANIFEST):
            continue
        entry = {"size": path.stat().st_size}
        if checksum:
            entry["crc32"] = crc32(path)
        out[str(path.relative_to(root))] = entry
    return out


def write_manifest(root: pathlib.Path, step: int) -> None:
    """Record the files of the finalized checkpoint ``root`` (atomically: tmp + rename)."""
    table = file_table(root, checksum=True)
    tmp = root / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"step": step, "files": table}, indent=1))
    os.replace(tmp, root / MANIFEST)


def check_files(root: pathlib.Path, verify: str) -> str | None:
    """Why the files of ``root`` disagree with its manifest, or ``None`` when they agree.

    A checkpoint without a manifest (its writer stopped right after Orbax finalized it)
    passes with a warning: Orbax's own finalization is then the only guarantee.
    """
    if verify == "none":
        return None
    manifest = root / MANIFEST
    if not manifest.exists():
        log.warning("%s has no manifest (the writer stopped right after saving)", root)
        return None
    try:
        files = json.loads(manifest.read_text())["files"]
    except (OSError, ValueError, KeyError) as e:
        return f"{manifest} is unreadable ({e})"
    for rel, want in files.items():
        path = root / rel
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{path} has {size} bytes, {want['size']} were written"
        if verify == "checksum" and crc32(path) != want["crc32"]:
            return f"{path} fails its CRC32 check"
    return None

"""The dashboard's adapter onto ``data build`` output directories: every read of a
snapshot's layout (``<output_dir>/<version>/manifest.json``, data.snapshot's diff) lives
here, so a change in the data package is a local fix. Only finished versions (with a
manifest) are shown; a build in progress is not a version yet.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from jaxcore.errors import ConfigError


def _manifest(version_dir: pathlib.Path) -> dict[str, Any] | None:
    p = version_dir / "manifest.json"
    if not p.is_file():
        return None  # a build in progress or not a snapshot
    return json.loads(p.read_text())


def dataset_versions(root: pathlib.Path) -> list[dict[str, Any]]:
    """Finished snapshot versions under a ``data build`` output directory, oldest first."""
    if not root.is_dir():
        return []
    out = []
    for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
        m = _manifest(vdir)
        if m is None:
            continue
        stages = [
            {
                "name": s["name"],
                "files_in": s.get("files_in"),
                "files_out": s.get("files_out"),
                "kept": s.get("files_out"),
                "dropped": sum((s.get("dropped") or {}).values()),
                "reasons": s.get("dropped") or {},
                "bytes_in": s.get("bytes_in"),
                "bytes_out": s.get("bytes_out"),
            }
            for s in m.get("stages", [])
        ]
        out.append(
            {
                "version": m.get("version", vdir.name),
                "dir": str(vdir),
                "inputs": m.get("inputs"),
                "outputs": m.get("outputs"),
                "dropped": m.get("dropped"),
                "stages": stages,
                "languages": m.get("languages") or {},
                "licenses": m.get("licenses") or {},
                "license_ids": m.get("license_ids") or {},
                "code_version": m.get("code_version"),
                "optout_registry_version": m.get("optout_registry_version"),
            }
        )
    return out


def list_datasets(roots: dict[str, pathlib.Path]) -> list[dict[str, Any]]:
    return [
        {"name": name, "root": str(root), "versions": dataset_versions(root)}
        for name, root in roots.items()
    ]


def dataset_diff(root: pathlib.Path, a: str, b: str, limit: int = 200) -> dict[str, Any]:
    """Files added, removed and changed from version ``a`` to ``b`` (data.snapshot's diff)."""
    names = {v["version"]: pathlib.Path(v["dir"]) for v in dataset_versions(root)}
    for v in (a, b):
        if v not in names:
            raise ConfigError(f"dataset {root}: no finished version {v!r} (have {sorted(names)})")
    try:
        from data.snapshot import diff_versions
    except ImportError as e:  # pyarrow lives in the data extra
        raise ConfigError(
            f"diffing snapshots needs the data extra: pip install 'jaxcore[data]' ({e})"
        ) from e
    d = diff_versions(names[a], names[b])
    return {
        "a": a,
        "b": b,
        **{k: {"count": len(v), "files": [f"{r}/{p}" for r, p in v[:limit]]} for k, v in d.items()},
    }

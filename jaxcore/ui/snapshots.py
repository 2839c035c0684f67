"""The dashboard's adapter onto ``data build`` output directories: every read of a
snapshot's layout (``<output_dir>/<version>/manifest.json``, data.snapshot's diff) lives
here, so a change in the data package is a local fix. Only finished versions (with a
manifest) are shown; a build in progress is not a version yet. A version whose manifest
cannot be read is listed apart as damaged, with what to do.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from jaxcore.errors import ConfigError

# what the pages read from a manifest: its key -> the type the build writes there
MANIFEST_KEYS: dict[str, type] = {"inputs": dict, "outputs": dict, "dropped": dict, "stages": list}


def _manifest(version_dir: pathlib.Path) -> dict[str, Any] | None:
    """The version's manifest; None for a build in progress or a folder that is no
    snapshot. ConfigError when it is there but unusable (cut off, edited, damaged)."""
    p = version_dir / "manifest.json"
    if not p.is_file():
        return None
    fix = f"rerun the build of version {version_dir.name} with its config, or restore the file"
    try:
        m = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{p} is not valid JSON ({e}); {fix}") from None
    problem = _manifest_problem(m)
    if problem:
        raise ConfigError(f"{p} is no 'data build' manifest ({problem}); {fix}")
    return m


def _manifest_problem(m: Any) -> str | None:
    """What keeps the pages from showing a decoded manifest, or None."""
    if not isinstance(m, dict):
        return f"a JSON {type(m).__name__}, not an object"
    for key, kind in MANIFEST_KEYS.items():
        if not isinstance(m.get(key), kind):
            return f"{key!r} is missing or not a {kind.__name__}"
    if not all(isinstance(s, dict) and "name" in s for s in m["stages"]):
        return "a 'stages' entry has no 'name'"
    return None


def _version(vdir: pathlib.Path, m: dict[str, Any]) -> dict[str, Any]:
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
        for s in m["stages"]
    ]
    return {
        "version": m.get("version", vdir.name),
        "dir": str(vdir),
        "inputs": m["inputs"],
        "outputs": m["outputs"],
        "dropped": m["dropped"],
        "stages": stages,
        "languages": m.get("languages") or {},
        "licenses": m.get("licenses") or {},
        "license_ids": m.get("license_ids") or {},
        "code_version": m.get("code_version"),
        "optout_registry_version": m.get("optout_registry_version"),
    }


def scan_versions(root: pathlib.Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(finished versions oldest first, damaged ones with what is wrong) under a ``data
    build`` output directory: one bad manifest no longer hides the good versions."""
    if not root.is_dir():
        return [], []
    versions, damaged = [], []
    for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
        try:
            m = _manifest(vdir)
        except ConfigError as e:
            damaged.append({"version": vdir.name, "dir": str(vdir), "error": str(e)})
            continue
        if m is not None:
            versions.append(_version(vdir, m))
    return versions, damaged


def dataset_versions(root: pathlib.Path) -> list[dict[str, Any]]:
    """Finished snapshot versions under a ``data build`` output directory, oldest first."""
    return scan_versions(root)[0]


def list_datasets(roots: dict[str, pathlib.Path]) -> list[dict[str, Any]]:
    out = []
    for name, root in roots.items():
        versions, damaged = scan_versions(root)
        out.append({"name": name, "root": str(root), "versions": versions, "damaged": damaged})
    return out


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

"""Lineage: what a checkpoint or a registered version was trained on, and by which code.

A lineage is a flat JSON mapping that trials record with every checkpoint
(``TrialContext.lineage``) and the registry copies into every version's metadata:

- ``dataset_version``, ``dataset_dir``, ``dataset_input_hash``: the curated snapshot;
- ``manifest_sha256``: SHA-256 of its ``manifest.json`` (what `data.build` wrote);
- ``tokenizer_sha256``: the BPE tokenizer's file hash (from the tokens index);
- ``code_version``: ``git:<sha>`` of the checkout when there is one, else
  ``jaxcore==<version>``.

`format_chain` renders the chain from a registered version back to the data, as
``jaxcore model describe`` and the run summary print it.
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import subprocess
from typing import Any

LINEAGE_KEYS = (
    "dataset_version",
    "dataset_dir",
    "dataset_input_hash",
    "manifest_sha256",
    "tokenizer_sha256",
    "code_version",
)


@functools.cache
def code_version() -> str:
    """``git:<sha>[+dirty]`` of the source checkout, else ``jaxcore==<version>``."""
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return f"git:{sha}{'+dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        import importlib.metadata

        try:
            return f"jaxcore=={importlib.metadata.version('jaxcore')}"
        except importlib.metadata.PackageNotFoundError:
            return "jaxcore==unknown"


def sha256_file(path: str | pathlib.Path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def dataset_lineage(
    version_dir: str | pathlib.Path, input_hash: str, tokens_index: dict[str, Any]
) -> dict[str, Any]:
    """The lineage of a model trained on ``version_dir``'s tokens (see the module doc)."""
    vdir = pathlib.Path(version_dir)
    return {
        "dataset_version": vdir.name,
        "dataset_dir": str(vdir),
        "dataset_input_hash": input_hash,
        "manifest_sha256": sha256_file(vdir / "manifest.json"),
        "tokenizer_sha256": tokens_index["tokenizer_sha256"],
        "code_version": code_version(),
    }


def format_chain(name: str, version: dict[str, Any]) -> list[str]:
    """Lines from a registered version back to its data: model -> checkpoint -> trial ->
    experiment -> tokenizer -> dataset (missing links are said to be missing)."""
    meta = version.get("meta") or {}
    lin = meta.get("lineage") or {}
    lines = [f"{name} v{version['version']}  weights {version.get('path')}"]
    lines.append(
        f"  <- checkpoint {lin.get('checkpoint_id')} (step {lin.get('step')}, "
        f"metrics {lin.get('metrics')})"
    )
    lines.append(
        f"  <- trial {lin.get('trial_id')} hparams {lin.get('hparams')} of experiment "
        f"{lin.get('experiment_id')} {lin.get('experiment_name')!r}"
    )
    if not lin.get("manifest_sha256"):
        lines.append("  <- data: not recorded (this version was trained outside `jaxcore run`)")
        return lines
    lines.append(f"  <- code {lin.get('code_version')}")
    lines.append(f"  <- tokenizer sha256 {lin.get('tokenizer_sha256')}")
    lines.append(
        f"  <- dataset {lin.get('dataset_version')} at {lin.get('dataset_dir')} "
        f"(manifest sha256 {lin.get('manifest_sha256')}, input hash "
        f"{lin.get('dataset_input_hash')})"
    )
    return lines

"""Readable summaries of a snapshot: files and bytes per stage, languages, licenses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from data.snapshot import load_manifest


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def stage_table(manifest: dict[str, Any]) -> Table:
    """Files and MB in/out per stage, with the main drop reasons."""
    t = Table(title=f"build {manifest['version']}: per stage")
    for col in ("stage", "files in", "files out", "MB in", "MB out", "dropped (top reasons)"):
        t.add_column(col, justify="left" if col in ("stage", "dropped (top reasons)") else "right")
    for s in manifest["stages"]:
        reasons = sorted(s["dropped"].items(), key=lambda kv: -kv[1])[:3]
        t.add_row(
            s["name"],
            f"{s['files_in']:,}",
            f"{s['files_out']:,}",
            _mb(s["bytes_in"]),
            _mb(s["bytes_out"]),
            ", ".join(f"{k}={v}" for k, v in reasons),
        )
    return t


def counts_table(title: str, counts: dict[str, int], top: int = 15) -> Table:
    """A two-column table of the largest counts."""
    t = Table(title=title)
    t.add_column("name")
    t.add_column("files", justify="right")
    for k, v in list(counts.items())[:top]:
        t.add_row(k, f"{v:,}")
    return t


def markdown_summary(manifest: dict[str, Any]) -> str:
    """The per-stage table as GitHub markdown (used in the README)."""
    lines = [
        "| stage | files in | files out | MB in | MB out | top drop reasons |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for s in manifest["stages"]:
        reasons = sorted(s["dropped"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(
            f"| {s['name']} | {s['files_in']:,} | {s['files_out']:,} | "
            f"{_mb(s['bytes_in'])} | {_mb(s['bytes_out'])} | "
            + ", ".join(f"{k}={v}" for k, v in reasons)
            + " |"
        )
    return "\n".join(lines)


def print_stats(version_dir: str | Path, console: Console | None = None) -> dict[str, Any]:
    """Print the summary of a finished snapshot; returns its manifest."""
    console = console or Console()
    m = load_manifest(version_dir)
    console.print(
        f"[bold]{version_dir}[/]: {m['inputs']['files']:,} files in "
        f"({_mb(m['inputs']['bytes'])} MB), {m['outputs']['files']:,} kept "
        f"({_mb(m['outputs']['bytes'])} MB), {m['dropped']['files']:,} dropped"
    )
    console.print(stage_table(m))
    console.print(counts_table("languages (kept files)", m["languages"]))
    console.print(counts_table("license types (kept files)", m["licenses"]))
    console.print(counts_table("license ids (kept files)", m["license_ids"]))
    return m

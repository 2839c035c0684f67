"""The one-screen summary of a run, built from its phase records.

`summary_sections` returns the sections as data (what tests check and ``summary.json``
holds); `print_summary` renders them with ``rich``: data kept/dropped by reason, the loss
curve (terminal chart; the PNG beside the run), tokens/s and MFU, the best trial, the
registry entry with its lineage, and the sample completions.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from jaxcore.run.chart import terminal_chart, write_loss_png

SECTIONS = ("data", "loss", "speed", "best_trial", "registry", "completions")


def summary_sections(outputs: dict[str, dict[str, Any]], run_dir: pathlib.Path) -> dict[str, Any]:
    """Every section of the summary as JSON data; writes ``loss.png`` into ``run_dir``."""
    train = outputs["train"]["trials"][0]
    search = outputs["search"]
    curves = {"train": train["loss_curve"]}
    for t in search.get("trials", []):
        curves[f"lr {t['lr']:.2g}"] = t["loss_curve"]
    png = write_loss_png(run_dir / "loss.png", curves)
    best = min(
        [t for t in [outputs["train"]["best"], search.get("best")] if t],
        key=lambda t: t["val_loss"],
    )
    return {
        "data": {
            "version": outputs["data"]["version"],
            "reused": outputs["data"]["reused"],
            "manifest_sha256": outputs["data"]["manifest_sha256"],
            **outputs["data"]["summary"],
            "tokenizer_vocab": outputs["tokenizer"]["vocab_size"],
            "tokens": outputs["tokenizer"]["tokens"],
        },
        "loss": {"train_curve": train["loss_curve"], "png": str(png)},
        "speed": {"tokens_per_s": train["tokens_per_s"], "mfu": train["mfu"]},
        "best_trial": {
            **{k: best[k] for k in ("trial_id", "lr", "val_loss", "steps")},
            "search_trials": [
                {k: t[k] for k in ("trial_id", "lr", "steps", "val_loss", "state")}
                for t in search.get("trials", [])
            ],
        },
        "registry": {k: outputs["register"][k] for k in ("model", "version", "weights", "lineage")},
        "completions": outputs["serve"].get("completions", []),
        "served_model": outputs["serve"].get("model"),
    }


def _dropped_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    for stage, reasons in data["dropped_by_stage"].items():
        text = ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        lines.append(f"    {stage:<9} {text}")
    return lines or ["    (nothing dropped)"]


def render(sections: dict[str, Any], skipped: list[str]) -> str:
    """The summary as plain text (the README's first section explains each block)."""
    d, sp, b, r = sections["data"], sections["speed"], sections["best_trial"], sections["registry"]
    out = [
        "== data "
        + f"{d['version']}{' (reused)' if d['reused'] else ''}: {d['files_in']} files in, "
        f"{d['files_kept']} kept ({d['bytes_kept'] / 1e6:.2f} MB), {d['files_dropped']} dropped"
    ]
    out += _dropped_lines(d)
    out.append(
        f"    BPE vocab {d['tokenizer_vocab']}, {d['tokens']:,} tokens; manifest sha256 "
        f"{d['manifest_sha256'][:16]}..."
    )
    out.append(f"== loss (train trial; PNG: {sections['loss']['png']})")
    out.append(terminal_chart([tuple(p) for p in sections["loss"]["train_curve"]]))
    tps = f"{sp['tokens_per_s']:,.0f}" if sp["tokens_per_s"] else "n/a"
    mfu = f"{100 * sp['mfu']:.2f}%" if sp["mfu"] is not None else "n/a (no peak known)"
    out.append(f"== speed: {tps} tokens/s, MFU {mfu}")
    out.append(
        f"== best trial {b['trial_id']}: lr {b['lr']:.3g}, val_loss {b['val_loss']:.4f} "
        f"after {b['steps']} steps"
    )
    for t in b["search_trials"]:
        v = f"{t['val_loss']:.4f}" if t["val_loss"] is not None else "-"
        out.append(f"    ASHA trial {t['trial_id']}: lr {t['lr']:.3g} steps {t['steps']} val {v}")
    lin = r["lineage"]
    out.append(
        f"== registry: {r['model']} v{r['version']} <- checkpoint {lin.get('checkpoint_id')} "
        f"<- dataset {lin.get('dataset_version')} "
        f"(manifest {str(lin.get('manifest_sha256'))[:12]}, "
        f"tokenizer {str(lin.get('tokenizer_sha256'))[:12]}, code {lin.get('code_version')})"
    )
    out.append("== completions (OpenAI API, greedy)")
    for c in sections["completions"]:
        out.append(f"    {c['prompt']!r} -> {c['text']!r}")
    if not sections["completions"]:
        out.append("    (serve disabled)")
    if skipped:
        out.append(f"phases reused from an earlier run: {', '.join(skipped)}")
    return "\n".join(out)


def write_summary(run_dir: pathlib.Path, sections: dict[str, Any]) -> pathlib.Path:
    path = run_dir / "summary.json"
    path.write_text(json.dumps(sections, indent=1, default=str) + "\n")
    return path

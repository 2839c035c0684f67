"""End-to-end build throughput over the installed packages' source, at two corpus sizes.

Each size runs in a fresh process (so peak RSS is per build): a full build (ingest ->
language -> license -> filters -> PII -> decontam -> signatures -> dedup -> Parquet) with
the local executor on every core. Reports MB/s per core, CPU seconds per stage and peak
RSS (max of the driver and any worker). Writes benchmarks/results/pipeline_throughput.json.

MB/s per core is input MB / (wall seconds x workers), the issue's figure; on a shared
machine it falls with the load average (printed). The CPU figures do not: CPU seconds per
stage (``time.thread_time`` inside each step) and the whole build's CPU seconds (user +
system of the build process and every worker, from ``getrusage``), hence ``MB per CPU s``.
Usage: python benchmarks/pipeline_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pick_packages(target_mb: float) -> list[Path]:
    """Package folders of site-packages in name order until ``target_mb`` of files."""
    site = Path(sysconfig.get_paths()["purelib"])
    chosen, total = [], 0
    for d in sorted(site.iterdir()):
        if (
            not d.is_dir()
            or d.name.endswith((".dist-info", "__pycache__"))
            or d.name.startswith(("_", "."))
        ):
            continue
        size = sum(
            f.stat().st_size
            for f in d.rglob("*")
            if f.is_file() and not f.is_symlink() and "__pycache__" not in f.parts
        )
        if size > 40e6 or size < 50e3:  # skip binary-heavy giants (torch, jaxlib) and stubs
            continue
        chosen.append(d)
        total += size
        if total >= target_mb * 1e6:
            break
    return chosen


def build_cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants so far (Linux).

    Workers are children of multiprocessing's forkserver, which reaps them: their time is
    in the forkserver's cutime/cstime (``/proc/PID/stat``), not in our RUSAGE_CHILDREN.
    """
    me = os.getpid()
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            rest = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[1]) == me:  # a live child: its own time plus its reaped children's
            total += sum(int(x) for x in rest[11:15]) / tick
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def child(target_mb: float, workers: int) -> None:
    sys.path.insert(0, str(ROOT))
    from data import BuildConfig, SourceConfig, build

    with tempfile.TemporaryDirectory() as tmp:
        sources = tuple(
            SourceConfig(type="dir", path=str(p), name=p.name) for p in pick_packages(target_mb)
        )
        cfg = BuildConfig(
            sources=sources, output_dir=tmp, num_shards=4 * workers, workers=workers, progress=False
        )
        t = time.perf_counter()
        m = build(cfg)
        wall = time.perf_counter() - t
        cpu = build_cpu_seconds()
        report = json.loads((cfg.version_dir / "report.json").read_text())
    rss = (
        max(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        )
        / 1024
    )
    mb = m["inputs"]["bytes"] / 1e6
    print(
        json.dumps(
            {
                "packages": len(sources),
                "mb_in": round(mb, 2),
                "files_in": m["inputs"]["files"],
                "files_out": m["outputs"]["files"],
                "wall_s": round(wall, 2),
                "workers": workers,
                "cpu_total_s": round(cpu, 2),
                "mb_per_cpu_s": round(mb / cpu, 3),
                "mb_per_s_per_core": round(mb / wall / workers, 3),
                "per_stage_s": report["per_stage_s"],
                "per_stage_cpu_s": report["per_stage_cpu_s"],
                "phase_s": report["timings_s"],
                "peak_rss_mb": round(rss, 1),
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="two small corpora (< 1 minute)")
    ap.add_argument("--child", type=float, default=None)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.workers)
        return
    sizes = (8.0, 24.0) if args.quick else (40.0, 120.0)
    runs = []
    for size in sizes:
        load0 = os.getloadavg()[0]
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(size), "--workers", str(args.workers)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["load_avg"] = [round(load0, 1), round(os.getloadavg()[0], 1)]
        runs.append(r)
    print(
        f"{'corpus MB':>10}{'files':>8}{'kept':>8}{'wall s':>8}{'MB/s/core':>11}"
        f"{'CPU s':>8}{'MB/CPU s':>10}{'peak RSS MB':>13}{'load':>11}"
    )
    for r in runs:
        print(
            f"{r['mb_in']:>10.1f}{r['files_in']:>8}{r['files_out']:>8}{r['wall_s']:>8.1f}"
            f"{r['mb_per_s_per_core']:>11.2f}{r['cpu_total_s']:>8.1f}{r['mb_per_cpu_s']:>10.2f}"
            f"{r['peak_rss_mb']:>13.0f}{r['load_avg'][0]:>6.1f}-{r['load_avg'][1]:<4.1f}"
        )
    for key, label in (("per_stage_cpu_s", "CPU"), ("per_stage_s", "wall")):
        print(
            f"{label} seconds per stage (larger corpus):",
            ", ".join(f"{k}={v:.1f}" for k, v in runs[-1][key].items()),
        )
    for r in runs:  # the PII stage's share of the stages' CPU time and of the whole build's
        stage_cpu = sum(r["per_stage_cpu_s"].values())
        r["pii_share_of_stage_cpu"] = round(r["per_stage_cpu_s"]["pii"] / stage_cpu, 3)
        r["pii_share_of_build_cpu"] = round(r["per_stage_cpu_s"]["pii"] / r["cpu_total_s"], 3)
    print(
        "PII share of stage CPU time: "
        + ", ".join(
            f"{r['mb_in']:.0f} MB: {r['pii_share_of_stage_cpu']:.1%} (of the whole build's CPU: "
            f"{r['pii_share_of_build_cpu']:.1%})"
            for r in runs
        )
    )
    result = {
        "mb_per_s_per_core": runs[-1]["mb_per_s_per_core"],
        "mb_per_cpu_s": runs[-1]["mb_per_cpu_s"],
        "per_stage_s": runs[-1]["per_stage_s"],
        "per_stage_cpu_s": runs[-1]["per_stage_cpu_s"],
        "peak_rss_mb": runs[-1]["peak_rss_mb"],
        "pii_share_of_stage_cpu": runs[-1]["pii_share_of_stage_cpu"],
        "target_mb_per_s_per_core": 2.0,
        "runs": runs,
    }
    out = Path(__file__).parent / "results" / "pipeline_throughput.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

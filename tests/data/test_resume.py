"""Kill a multi-process build mid-way; the rerun skips finished shards, output identical."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_build import write_config

from data import build, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
# Files whose bytes define a snapshot (report.json holds timings; _work holds markers).
PUBLISHED = ("shards", "drops", "pii_log", "manifest.json", "checksums.sha256")


def published_bytes(version_dir: Path) -> dict[str, bytes]:
    out = {}
    for name in PUBLISHED:
        p = version_dir / name
        for f in sorted(p.rglob("*") if p.is_dir() else [p]):
            if f.is_file():
                out[f.relative_to(version_dir).as_posix()] = f.read_bytes()
    return out


def run_build(cfg: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "data", "build", str(cfg), "--workers", "2", "--no-progress"],
        cwd=REPO_ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.multiprocess
def test_kill_and_resume_is_byte_identical(small_corpus: dict[str, Path]) -> None:
    root = small_corpus["root"]
    ref_cfg = write_config(root, small_corpus, out="ref", num_shards=4)
    cfg = write_config(root, small_corpus, out="resumed", num_shards=4)
    # The uninterrupted reference builds in this process (one worker; the output does not
    # depend on the worker count): a third `data build` process tree would cost its start-up.
    build(load_config(ref_cfg))
    # Slow each shard down so the kill lands after some shards finished and before all.
    env = dict(os.environ, DATA_TEST_SHARD_DELAY_S="1.0")
    proc = run_build(cfg, env)
    markers = load_config(cfg).version_dir / "_work" / "stage1"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(markers.glob("*.done"))) < 2:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(markers.glob("*.done")))
    assert 2 <= done_before < 4, done_before
    assert not (load_config(cfg).version_dir / "manifest.json").exists()
    proc = run_build(cfg)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    import json

    report = json.loads((load_config(cfg).version_dir / "report.json").read_text())
    assert report["skipped_shards"]["stage1"] == done_before
    a = published_bytes(load_config(ref_cfg).version_dir)
    b = published_bytes(load_config(cfg).version_dir)
    assert a.keys() == b.keys() and len(a) >= 13
    assert a == b

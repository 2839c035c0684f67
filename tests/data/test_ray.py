"""The same build on a local Ray cluster (ray.data) is byte-identical to the local one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_build import write_config
from test_resume import published_bytes

from data import build, load_config

ray = pytest.importorskip("ray", reason="the data-ray extra (ray[data]) is not installed")


def test_ray_build_matches_local(small_corpus: dict[str, Path]) -> None:
    root = small_corpus["root"]
    local_cfg = load_config(write_config(root, small_corpus, out="local", num_shards=3))
    build(local_cfg)
    ray_cfg = dataclasses.replace(
        load_config(write_config(root, small_corpus, out="ray", num_shards=3)), executor="ray"
    )
    repo_root = Path(__file__).resolve().parents[2]
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(repo_root)}},
    )
    try:
        build(ray_cfg)
    finally:
        ray.shutdown()
    a = published_bytes(local_cfg.version_dir)
    b = published_bytes(ray_cfg.version_dir)
    assert len(a) >= 10 and a == b

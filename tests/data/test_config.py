"""Config validation names the field and the fix; YAML loads into the same dataclasses."""

from __future__ import annotations

import pytest

from data import DataConfigError, DedupConfig, LicenseConfig, config_from_dict, load_config


def test_errors_name_field_and_fix() -> None:
    with pytest.raises(DataConfigError, match=r"dedup.bands.*Fix: raise dedup.num_perm"):
        DedupConfig(num_perm=128, bands=25, rows=10)
    with pytest.raises(DataConfigError, match=r"license.keep.*unknown license types"):
        LicenseConfig(keep=("permissive", "gpl"))
    with pytest.raises(DataConfigError, match=r"filters.nope: unknown key"):
        config_from_dict(
            {"sources": [{"type": "dir", "path": "."}], "output_dir": "o", "filters": {"nope": 1}}
        )
    with pytest.raises(DataConfigError, match=r"num_shards: expected int"):
        config_from_dict(
            {"sources": [{"type": "dir", "path": "."}], "output_dir": "o", "num_shards": "four"}
        )
    with pytest.raises(DataConfigError, match=r"sources\[\].type"):
        config_from_dict({"sources": [{"type": "svn", "path": "."}], "output_dir": "o"})


def test_yaml_roundtrip(tmp_path) -> None:
    (tmp_path / "c.yaml").write_text(
        "sources:\n  - {type: git, path: repo, stars: 3}\noutput_dir: out\nnum_shards: 2\n"
        "dedup: {threshold: 0.8, priority: [recency]}\ndecontam: {strings: [abc]}\n"
    )
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.sources[0].path == str(tmp_path / "repo")
    assert cfg.output_dir == str(tmp_path / "out")
    assert cfg.dedup.threshold == 0.8 and cfg.dedup.priority == ("recency",)
    assert cfg.dedup.bands == 25 and cfg.dedup.rows == 10 and cfg.dedup.num_perm == 256
    assert config_from_dict(cfg.to_dict()) == cfg


def test_config_shapes_that_are_not_mappings_name_the_fix(tmp_path) -> None:
    """A YAML list at the top level, or a scalar for `sources`, used to escape as
    ValueError / TypeError tracebacks from the dict handling."""
    top = tmp_path / "list.yaml"
    top.write_text("- a\n- b\n")
    with pytest.raises(DataConfigError, match=r"top level is a list, not a mapping\. Fix:"):
        load_config(top)
    with pytest.raises(DataConfigError, match=r"sources: expected a list, got 3\. Fix:"):
        config_from_dict({"output_dir": "out", "sources": 3}, base_dir=tmp_path)

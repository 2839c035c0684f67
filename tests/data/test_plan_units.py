"""How `layout: repos` folders expand into repositories, and what is left out loudly."""

from __future__ import annotations

import logging

from data.config import SourceConfig
from data.ingest import plan_units


def test_symlinked_repositories_are_skipped_with_a_warning_naming_them(tmp_path, caplog):
    """A symlinked child may point anywhere, so it is not followed; it was skipped silently,
    and a folder of symlinked checkouts built an empty dataset with no word why."""
    outside = tmp_path / "elsewhere" / "lib"
    outside.mkdir(parents=True)
    (outside / "a.py").write_text("x = 1\n")
    repos = tmp_path / "repos"
    (repos / "real").mkdir(parents=True)
    (repos / "real" / "b.py").write_text("y = 2\n")
    (repos / "linked").symlink_to(outside, target_is_directory=True)
    with caplog.at_level(logging.WARNING, logger="data.ingest"):
        units = plan_units([SourceConfig(type="dir", path=str(repos), layout="repos")])
    assert [u.name for u in units] == ["real"]
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "linked" in message and "symlink" in message
    assert str(outside) in message and "layout" in message  # where it points, and the fix


def test_no_warning_when_nothing_is_skipped(tmp_path, caplog):
    repos = tmp_path / "repos"
    (repos / "one").mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="data.ingest"):
        units = plan_units([SourceConfig(type="dir", path=str(repos), layout="repos")])
    assert [u.name for u in units] == ["one"] and not caplog.records

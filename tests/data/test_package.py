"""The package's public names resolve (lazily) and the renames hold."""

from __future__ import annotations

import data


def test_every_exported_name_resolves() -> None:
    for name in data.__all__:
        assert getattr(data, name) is not None, name


def test_one_name_for_one_thing() -> None:
    from data.executor import LocalPipelineExecutor, RayPipelineExecutor

    assert data.StageStats.__name__ == "StageStats"
    assert not hasattr(data, "StepStats")
    assert LocalPipelineExecutor.__name__ != RayPipelineExecutor.__name__

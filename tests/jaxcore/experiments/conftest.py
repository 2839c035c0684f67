"""Helpers shared by the experiment tests."""

from __future__ import annotations

import pathlib

import pytest

OBJECTIVES = str(pathlib.Path(__file__).with_name("objectives.py"))


def entry(fn: str) -> str:
    return f"{OBJECTIVES}:{fn}"


@pytest.fixture
def raw_config(tmp_path):
    """A function building a raw config dict in ``tmp_path`` (override any section)."""

    def make(fn: str, searcher: dict, hparams: dict | None = None, **extra):
        return {
            "name": fn,
            "entrypoint": entry(fn),
            "workdir": str(tmp_path / "work"),
            "hyperparameters": hparams or {},
            "searcher": searcher,
            **extra,
        }

    return make

"""Typed errors raised by the data pipeline."""

from __future__ import annotations


class DataError(Exception):
    """Base class for every error the data pipeline raises on purpose."""


class DataConfigError(DataError, ValueError):
    """A configuration value is wrong; the message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}. Fix: {fix}")


class BuildError(DataError, RuntimeError):
    """A build could not proceed (missing input, inconsistent work directory, ...)."""

"""Errors the bridge raises (typed like jaxcore's: the message says what to change)."""

from __future__ import annotations

import jaxcore as jc


class UntraceableError(jc.JaxcoreError):
    """A torch module did something XLA cannot trace (a shape or branch that depends on data).

    Attributes:
        module: qualified name of the innermost module that was running ("" = the root).
        op: the torch/aten op that failed.
    """

    def __init__(self, message: str, *, module: str, op: str):
        super().__init__(message)
        self.module = module
        self.op = op


class UnsupportedError(jc.ConfigError):
    """A torch optimizer, scheduler, option or model feature the bridge does not map."""

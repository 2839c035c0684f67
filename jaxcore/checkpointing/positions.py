"""Loader positions in a step: saved once (``input``) or once per process (``input_stream``).

Any `jaxcore.ResumableLoader` works. A position that is a function of the step
(``loader.step_indexed``) is the same on every process: it is saved once, as JSON, and
restores with any process count. Any other position (a Grain iterator's state, a
``TorchLoader``'s) belongs to one process: each process saves its own through Grain's
Orbax handler (``process_<i>-of-<n>.json``), and a restore needs the same process count.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxcore.errors import ConfigError

SHARED, PER_PROCESS = "input", "input_stream"


class _Position:
    """A position in the form Grain's Orbax handler saves (bytes in, bytes out)."""

    def __init__(self, state: Any = None):
        self.state = state
        self.raw: Any = None  # the file's JSON as written (format 1: the Grain state)

    def get_state(self) -> bytes:
        if isinstance(self.state, bytes):
            return json.dumps({"b64": base64.b64encode(self.state).decode()}).encode()
        return json.dumps({"json": self.state}).encode()

    def set_state(self, raw: bytes) -> None:
        self.raw = data = json.loads(raw)
        if isinstance(data, dict) and "b64" in data:
            self.state = base64.b64decode(data["b64"])
        elif isinstance(data, dict) and "json" in data:
            self.state = data["json"]

    def start_prefetch(self) -> None:
        """Grain's handler calls it after a restore; a position has nothing to prefetch."""


def step_indexed(loader: Any) -> bool:
    """Whether ``loader``'s position is the same on every process (see module docstring)."""
    return bool(getattr(loader, "step_indexed", False))


def _check_json(loader: Any, state: Any) -> None:
    """Raise `ConfigError` unless ``state`` is JSON: checked here, at the save that got it,
    because the write happens later, in Orbax's thread, where a failure loses the step
    and surfaces at another save as a bare TypeError."""
    try:
        json.dumps(state)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{type(loader).__name__}.get_state() returned a position that is not JSON ({e}); "
            "checkpoints store it as JSON. Return dicts, lists, str, int, float, bool or None "
            "(int(x) for a NumPy number), or bytes for a position saved per process."
        ) from e


def save_items(loader: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Orbax items that hold ``loader``'s position, and what the record says of it."""
    import grain

    state = loader.get_state()
    info = {"step_indexed": step_indexed(loader), "type": type(loader).__qualname__}
    if info["step_indexed"] or not isinstance(state, bytes):
        _check_json(loader, state)
    if info["step_indexed"]:
        return {SHARED: ocp.args.JsonSave(state)}, info
    return {PER_PROCESS: grain.checkpoint.CheckpointSave(_Position(state))}, info


def restore_items(record: dict[str, Any], where: str) -> dict[str, Any]:
    """The Orbax restore arguments for the position recorded in ``record`` (may be none)."""
    import grain

    info = record.get("input")
    kind = record.get("input_kind")  # format 1
    if info is None and kind is None:
        return {}
    per_process = (not info["step_indexed"]) if info is not None else kind == "stream"
    if per_process and record["processes"] != jax.process_count():
        raise ConfigError(
            f"checkpoint {where} holds one input position per process for "
            f"{record['processes']} processes; this run has {jax.process_count()}. Resume "
            "with the same process count, or use a loader whose position is a function of "
            "the step (jaxcore.Loader over a random-access source), which resumes on any."
        )
    items: dict[str, Any] = {}
    if info is None or not per_process:
        items[SHARED] = ocp.args.JsonRestore()
    if per_process:
        items[PER_PROCESS] = grain.checkpoint.CheckpointRestore(_Position())
    return items


def apply(out: Any, record: dict[str, Any], loader: Any) -> None:
    """Position ``loader`` from the restored items ``out``."""
    if record.get("input") is None:  # format 1: jaxcore.Loader.state_dict, split for streams
        position = dict(out[SHARED])
        if record["input_kind"] == "stream":
            position["grain_state"] = out[PER_PROCESS].raw
        loader.set_state(position)
        return
    loader.set_state(out[SHARED] if SHARED in out else out[PER_PROCESS].state)

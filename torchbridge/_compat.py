"""Lazy, compatible import of torchax (pinned 0.0.13) on torch 2.13.

Why this exists: torchax 0.0.13 lists torch's named-tensor overloads
(``aten.prod.dim_Dimname``, ``aten.norm.names_out``, ``aten.unbind.Dimname`` and about
twenty more) in its op tables when its modules are imported. torch 2.13 removed those
overloads, so ``import torchax`` raises ``AttributeError`` (upstream fixed it after the
0.0.13 release). While torchax loads, we let ``OpOverloadPacket.__getattr__`` answer a
missing *named-tensor* overload with an inert placeholder: it is hashable, matches no real
op, so the table entry is dead, exactly as if the line were absent. Every other missing
attribute still raises. The patch is removed as soon as torchax and its lazily imported
op tables are loaded, and the overloads that were stood in for are recorded in
`PATCHED_OVERLOADS` (the tests check the layer was exercised).

Why lazily: importing torchax changes global torch state (it renames the PrivateUse1
backend to ``jax``, registers a device module and turns off the fused MHA fast path);
plain ``import torchbridge`` must not do that, so only `load_torchax` imports it, the
first time a bridge is built. The MHA fast-path flag is restored afterwards; the bridge
turns it off only while it traces.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Iterator
from types import ModuleType

log = logging.getLogger(__name__)

TORCHAX_VERSION = "0.0.13"
# Named-tensor overload names: ``Dimname``, ``dim_Dimname``, ``dimname_out``, ``names_dim``...
_NAMED_OVERLOAD = re.compile(r"(?i)dimname|(^|_)names(_|$)")

PATCHED_OVERLOADS: list[str] = []
_lock = threading.Lock()
_torchax: ModuleType | None = None


class MissingOverload:
    """Stands in for a named-tensor overload that this torch no longer has."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<overload {self.name} removed from torch>"


@contextlib.contextmanager
def _named_overloads_tolerated() -> Iterator[None]:
    from torch import _ops

    original = _ops.OpOverloadPacket.__getattr__

    def getattr_(self, key: str):
        try:
            return original(self, key)
        except AttributeError:
            if not _NAMED_OVERLOAD.search(key):
                raise
            name = f"{self}.{key}"
            PATCHED_OVERLOADS.append(name)
            return MissingOverload(name)

    _ops.OpOverloadPacket.__getattr__ = getattr_
    try:
        yield
    finally:
        _ops.OpOverloadPacket.__getattr__ = original


def load_torchax() -> ModuleType:
    """Import torchax once (with the compatibility layer) and return the module."""
    global _torchax
    with _lock:
        if _torchax is not None:
            return _torchax
        import torch

        fastpath = torch.backends.mha.get_fastpath_enabled()
        with _named_overloads_tolerated():
            import torchax

            # Op tables torchax imports lazily (on the first Environment): load them here,
            # while missing overloads are tolerated.
            import torchax.decompositions
            import torchax.ops.jaten
            import torchax.ops.jtorch
        torch.backends.mha.set_fastpath_enabled(fastpath)
        if torchax.__version__ != TORCHAX_VERSION:
            log.warning(
                "torchbridge was tested with torchax %s, found %s",
                TORCHAX_VERSION,
                torchax.__version__,
            )
        if PATCHED_OVERLOADS:
            log.debug("torchax: %d removed named-tensor overloads ignored", len(PATCHED_OVERLOADS))
        _torchax = torchax
        return torchax

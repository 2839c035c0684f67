"""One verdict on a step's files, agreed by every process.

Each process checks every n-th file of the manifest (so n processes share the reads of a
large checkpoint) and the results are gathered, so all processes see the same `Damage`
(and quarantine or raise together) without one process reading everything.
"""

from __future__ import annotations

import logging
import pathlib

import jax
import numpy as np

from jaxcore.checkpointing.manifest import Damage, check_file, check_files, read_manifest

log = logging.getLogger(__name__)

_OK, _BAD_MANIFEST, _UNREADABLE = -1, -2, -3  # else: index of the damaged file


class Unreadable(Exception):
    """A process could not read a file (permissions, I/O): no proof of damage."""

    def __init__(self, process: int, error: OSError | None):
        super().__init__(f"process {process} could not read its files ({error or 'see it'})")
        self.process, self.error = process, error


def agree_on_damage(root: pathlib.Path, verify: str) -> Damage | None:
    """The first damaged file of step ``root`` as every process sees it, or ``None``.

    Raises `Unreadable` (on every process) when any process hit an ``OSError``.
    """
    count, index = jax.process_count(), jax.process_index()
    code, checked, error = _OK, 0, None
    try:
        damage, checked = check_files(root, verify, shard=(index, count))
    except OSError as e:
        damage, code, error = None, _UNREADABLE, e
    if damage is not None:
        files = read_manifest(root)
        code = (
            _BAD_MANIFEST
            if isinstance(files, Damage)
            else sorted(files).index(str(damage.path.relative_to(root)))
        )
    codes, totals = [code], [checked]
    if count > 1:
        from jax.experimental import multihost_utils

        gathered = multihost_utils.process_allgather(np.array([code, checked], np.int64))
        codes, totals = gathered[:, 0].tolist(), gathered[:, 1].tolist()
    if _UNREADABLE in codes:
        raise Unreadable(codes.index(_UNREADABLE), error)
    bad = [c for c in codes if c != _OK]
    if not bad:
        log.info("verified %s: %d files match the manifest", root, sum(totals))
        return None
    files = read_manifest(root)
    if isinstance(files, Damage):
        return files
    if bad[0] == _BAD_MANIFEST:  # unreadable elsewhere, readable here: still no trust
        return Damage(root, f"has a manifest process {codes.index(bad[0])} could not read")
    rel = sorted(files)[bad[0]]
    found = check_file(root, rel, files[rel], verify)
    return found or Damage(root / rel, f"failed its check on process {codes.index(bad[0])}")

"""Orbax's atomic rename, with the manifest written inside the step before the rename.

Orbax saves a step into ``<step>.orbax-checkpoint-tmp-*`` and finalizes it (on the primary
process, after every process has finished writing) by renaming the directory. Writing the
manifest from the outside after that rename -- what jaxcore 0.1 did, in a separate thread
-- leaves a window in which a SIGKILL produces a finalized step without one. Here the
manifest is written by the finalize itself, into the temporary directory, before the
rename: a step directory either has its manifest or does not exist.

The hook is the ``temporary_path_class`` of `CheckpointManagerOptions` (Orbax 0.12.8
``_src/path/atomicity.py``): a subclass of `AtomicRenameTemporaryPath` whose
``finalize`` first records the step's files. Item directories (``state``, ``meta``, ...)
use the same class; only the step directory (a child of the checkpoint root) gets a
manifest.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Callable

from orbax.checkpoint._src.path import atomicity

from jaxcore.checkpointing.manifest import write_manifest

# Tests replace this to stop a process at an exact point of a save (fault injection).
before_rename: Callable[[pathlib.Path, int], None] | None = None


def manifested_rename(root: pathlib.Path) -> type[atomicity.AtomicRenameTemporaryPath]:
    """A `TemporaryPath` class that writes the manifest of each step of ``root`` first."""
    root = pathlib.Path(root).absolute()

    class ManifestedRename(atomicity.AtomicRenameTemporaryPath):
        async def finalize(self) -> None:
            final = pathlib.Path(str(self.get_final()))
            if final.parent == root and final.name.isdigit():
                tmp = pathlib.Path(str(self.get()))
                await asyncio.to_thread(write_manifest, tmp, int(final.name))
                if before_rename is not None:
                    before_rename(tmp, int(final.name))
            await super().finalize()

    return ManifestedRename

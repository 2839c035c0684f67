"""One run writes a checkpoint directory at a time.

Two runs started on the same ``CheckpointConfig.directory`` (the same command launched
twice, a requeue while the old job still runs) would interleave their steps: each step
is whole, but "the latest step" would alternate between the runs. The first save takes an
exclusive ``flock`` on ``<directory>/.jaxcore-writer.lock`` (process 0 only: the other
processes of the same run write their shards beside it) and keeps it until the
`Checkpointer` closes; the kernel drops it when the process dies, so a killed run never
leaves a stale lock. Readers (restores, exports) never take it. Checkpointers of one
process share the claim, so a second one on the same directory in the same process (a
restarted trial) is not refused.

The temporary directories of saves killed mid-write are removed by the run that takes the
lock from no one, just before its first save: only then is none of them a live run's save
in flight (Orbax's ``cleanup_tmp_directories`` removes them whenever a manager is built,
a reader's included, and so deleted the save a running job was writing).
"""

from __future__ import annotations

import logging
import os
import pathlib
import socket
import threading

log = logging.getLogger(__name__)

LOCK_FILE = ".jaxcore-writer.lock"
_held: dict[str, list[int]] = {}  # lock path -> [fd, claims] in this process
_guard = threading.Lock()


class BusyDirectory(Exception):
    """Another process holds the directory's writer lock; ``owner`` is what it recorded."""

    def __init__(self, owner: str):
        super().__init__(owner)
        self.owner = owner


class WriterLock:
    """The claim of one `Checkpointer` on its directory (idempotent; see the module)."""

    def __init__(self, directory: pathlib.Path):
        self.path = str(directory / LOCK_FILE)
        self.claimed = False

    def claim(self) -> bool:
        """Take the lock, or raise `BusyDirectory` naming the process that holds it.

        Returns whether this call took it from no one: no save of any live run can then be
        in flight in the directory (one of this process's other Checkpointers may have one
        when it shares the claim).
        """
        import fcntl

        if self.claimed:
            return False
        with _guard:
            if self.path in _held:
                _held[self.path][1] += 1
                self.claimed = True
                return False
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.pread(fd, 256, 0).decode(errors="replace").strip()
                os.close(fd)
                raise BusyDirectory(owner or "unknown process") from None
            except OSError as e:  # a filesystem without flock: warn and go on unlocked
                os.close(fd)
                log.warning("cannot lock %s (%s); not guarding against a second run", self.path, e)
                self.claimed = True
                return True  # no lock to tell by: leftovers are removed, a live save or not
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
            _held[self.path] = [fd, 1]
        self.claimed = True
        return True

    def release(self) -> None:
        if not self.claimed:
            return
        self.claimed = False
        with _guard:
            held = _held.get(self.path)
            if held is None:
                return
            held[1] -= 1
            if held[1] == 0:
                os.close(held[0])  # drops the flock
                del _held[self.path]

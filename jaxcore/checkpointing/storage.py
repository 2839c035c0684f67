"""Recognise a save that failed because of the storage (a full disk, a quota, a read-only
mount) in the errors Orbax and TensorStore raise, so the `Checkpointer` can say so plainly.

TensorStore reports a full local disk as ``ValueError: RESOURCE_EXHAUSTED: ... No space
left on device [os_error_code='28']``, Python file writes as ``OSError(ENOSPC)``; both
can arrive wrapped (the async save's thread re-raises them at the next save or wait).
"""

from __future__ import annotations

import errno
import re

# errno -> what to tell the user (the fix goes in the Checkpointer's message).
_STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the filesystem or the process's file-size limit",
    errno.EROFS: "the filesystem is read-only",
}
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_TMP_STEP = re.compile(r"/(\d+)\.orbax-checkpoint-tmp")


def _chain(error: BaseException):
    seen: BaseException | None = error
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


def storage_failure(error: BaseException) -> str | None:
    """What about the storage made ``error`` happen, in words; ``None`` if it was not the
    storage (a bug, a bad state) and the error should propagate unchanged."""
    for e in _chain(error):
        code = e.errno if isinstance(e, OSError) else None
        if code is None:
            found = _OS_ERROR_CODE.search(str(e))
            code = int(found.group(1)) if found else None
        if code in _STORAGE_ERRNOS:
            return _STORAGE_ERRNOS[code]
    return None


def failed_step(error: BaseException) -> int | None:
    """The step whose temporary directory ``error`` names (an async save reports a
    step's failure while a later step is being saved), or ``None``."""
    for e in _chain(error):
        found = _TMP_STEP.search(str(e))
        if found:
            return int(found.group(1))
    return None

"""Helper for the runtime tests: re-exec with the malloc tunables, then print them."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.runtime import ensure_malloc_tuning

print("before", os.getpid(), flush=True)
ensure_malloc_tuning()
print("tunables", os.environ.get("GLIBC_TUNABLES"), "args", sys.argv[1:], flush=True)

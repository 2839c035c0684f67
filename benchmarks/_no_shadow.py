"""Import first in a benchmark script that imports jax: this folder's ``compression.py``.

A script's folder is ``sys.path[0]``, so ``benchmarks/compression.py`` shadows the stdlib
package ``compression`` that jax probes for zstd at import (a circular import crash).
Marking the name missing makes jax's probe take its no-zstd path.
"""

import sys

sys.modules.setdefault("compression", None)

"""Semantic ordering of snapshot version labels: ``v9 < v10 < v11``, ``v1.2 < v1.10``.

Labels are split into runs of digits and of other characters; digit runs compare as
numbers (the "natural sort" of version strings), so alphabetical order's ``v11 < v9``
never picks the wrong previous version.
"""

from __future__ import annotations

import re

_RUNS = re.compile(r"(\d+)")


def version_key(label: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key: numbers by value, text by itself; numbers sort before text."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in _RUNS.split(label) if p)

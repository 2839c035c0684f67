"""A loss curve as a terminal chart and as a PNG, with no plotting dependency.

The PNG is written by a small encoder over ``zlib`` (the format's own compression): an
RGB image, one filter byte per row, chunks with their CRC (PNG spec, ISO/IEC 15948),
so ``make demo`` needs no matplotlib in a fresh environment.
"""

from __future__ import annotations

import pathlib
import struct
import zlib
from collections.abc import Sequence

BLOCKS = " ▁▂▃▄▅▆▇█"


def _scale(values: Sequence[float], lo: float, hi: float, levels: int) -> list[int]:
    """Each value as 1..levels eighth-blocks (the minimum still shows as one)."""
    span = (hi - lo) or 1.0
    return [1 + round((v - lo) / span * (levels - 1)) for v in values]


def _resample(points: Sequence[tuple[int, float]], width: int) -> list[float]:
    """``width`` values: each the mean of the points that fall in its column."""
    if len(points) <= width:
        return [v for _, v in points]
    cols: list[list[float]] = [[] for _ in range(width)]
    first, last = points[0][0], points[-1][0]
    for s, v in points:
        cols[min(width - 1, int((s - first) / max(1, last - first) * width))].append(v)
    out, prev = [], points[0][1]
    for c in cols:
        prev = sum(c) / len(c) if c else prev
        out.append(prev)
    return out


def terminal_chart(points: Sequence[tuple[int, float]], *, width: int = 60, height: int = 8) -> str:
    """A block-character chart of ``(step, value)`` points, the y range labelled."""
    if not points:
        return "(no points)"
    values = _resample(points, width)
    lo, hi = min(values), max(values)
    levels = height * 8
    cells = _scale(values, lo, hi, levels)
    rows = []
    for r in range(height - 1, -1, -1):
        line = "".join(BLOCKS[max(0, min(8, c - r * 8))] for c in cells)
        label = f"{hi:7.3f} " if r == height - 1 else f"{lo:7.3f} " if r == 0 else " " * 8
        rows.append(label + "│" + line)
    rows.append(" " * 8 + "└" + "─" * len(values))
    left, right = f"step {points[0][0]}", f"{points[-1][0]}"
    rows.append(" " * 9 + left + " " * max(1, len(values) - len(left) - len(right)) + right)
    return "\n".join(rows)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """PNG bytes of an RGB image given as rows of ``(r, g, b)`` tuples."""
    h, w = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


def write_loss_png(
    path: str | pathlib.Path,
    curves: dict[str, Sequence[tuple[int, float]]],
    *,
    width: int = 480,
    height: int = 240,
) -> pathlib.Path:
    """Draw each named curve (its own colour) on shared axes with a light grid."""
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
    img = [[(255, 255, 255)] * width for _ in range(height)]
    pad = 12
    pts = [p for c in curves.values() for p in c]
    if pts:
        x0, x1 = min(s for s, _ in pts), max(s for s, _ in pts)
        y0, y1 = min(v for _, v in pts), max(v for _, v in pts)
        for k in range(5):  # grid lines
            y = pad + k * (height - 2 * pad) // 4
            img[y] = [(225, 225, 225)] * width
        for i, c in enumerate(curves.values()):
            colour = colours[i % len(colours)]
            prev = None
            for s, v in c:
                x = pad + round((s - x0) / ((x1 - x0) or 1) * (width - 2 * pad - 1))
                y = height - pad - 1 - round((v - y0) / ((y1 - y0) or 1) * (height - 2 * pad - 1))
                if prev is not None:  # a line from the previous point
                    n = max(abs(x - prev[0]), abs(y - prev[1]), 1)
                    for t in range(n + 1):
                        px = prev[0] + (x - prev[0]) * t // n
                        py = prev[1] + (y - prev[1]) * t // n
                        for dy in (0, 1):
                            img[min(height - 1, py + dy)][px] = colour
                prev = (x, y)
    path = pathlib.Path(path)
    path.write_bytes(encode_png(img))
    return path

"""TensorBoard scalar event files, written without TensorFlow, tensorboardX or torch.

A trial process writes only scalars, and ``tensorboardX`` imports torch when it is
installed (its writer checks for ``torch.Tensor``): ~2.5 CPU-seconds at the start of
every trial process that reports a metric. The format is small enough to write here:
TFRecord framing (length, masked CRC-32C of the length, payload, masked CRC-32C of
the payload) around ``Event`` protocol buffers, as TensorFlow's ``record_writer.cc``
and ``event.proto`` / ``summary.proto`` define them; the encoding below covers only
the fields a scalar event uses.
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import socket
import struct
import time

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected (RFC 3720 appendix B.4)


def _table() -> tuple[int, ...]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
        out.append(c)
    return tuple(out)


_TABLE = _table()
_FILES = itertools.count()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, the checksum TFRecord framing uses."""
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated and offset so a CRC of CRCs is not trivially 0."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 fields: negatives as two's complement, 10 bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _float32(value: float) -> bytes:
    """``value`` as a little-endian float32; beyond its range it is +-inf (as protobuf
    stores it), where ``struct`` would raise."""
    try:
        return struct.pack("<f", value)
    except OverflowError:
        return struct.pack("<f", math.copysign(math.inf, value))


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float,
    step: int = 0,
    *,
    file_version: str | None = None,
    scalars: dict[str, float] | None = None,
) -> bytes:
    """An ``Event`` message: wall_time (1, double), step (2, int64), file_version (3,
    string) or summary (5) with one ``Summary.Value`` {tag (1), simple_value (2, float)}
    per scalar."""
    out = bytearray()
    if wall_time:  # proto3 leaves zero scalars out
        out += _varint(1 << 3 | 1) + struct.pack("<d", wall_time)
    if step:
        out += _varint(2 << 3) + _varint(int(step))
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + _float32(value))
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, summary)
    return bytes(out)


def frame(record: bytes) -> bytes:
    """One TFRecord: the record with its length and both checksums."""
    header = struct.pack("<Q", len(record))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + record
        + struct.pack("<I", masked_crc32c(record))
    )


class ScalarEventWriter:
    """Appends scalar events to a new ``events.out.tfevents.*`` file in ``logdir``.

    Every `add` is flushed to the OS (a trial that is SIGKILLed keeps what it reported).
    """

    def __init__(self, logdir: str | os.PathLike[str]):
        self.logdir = pathlib.Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        # tensorboardX's name, plus the pid and a counter: two processes of one trial, or
        # two inline launches of it in one process, in the same second get two files.
        stamp = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        name = f"events.out.tfevents.{stamp}"
        self.path = self.logdir / name
        self._file = open(self.path, "ab")  # noqa: SIM115 (held open until close)
        self._file.write(frame(encode_event(time.time(), file_version="brain.Event:2")))
        self._file.flush()

    def add(self, step: int, scalars: dict[str, float]) -> None:
        """One event per scalar (as ``SummaryWriter.add_scalar`` writes them)."""
        now = time.time()
        self._file.write(
            b"".join(frame(encode_event(now, step, scalars={k: v})) for k, v in scalars.items())
        )
        self._file.flush()

    def close(self) -> None:
        self._file.close()

"""The scalar event writer against tensorboardX's own protos and checksum (the oracle)."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.record_writer import masked_crc32c as reference_masked_crc32c

from jaxcore.experiments.tb_events import ScalarEventWriter, encode_event, masked_crc32c

TAGS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=20)
STEPS = st.integers(-(2**63), 2**63 - 1)
VALUES = st.floats(allow_nan=False, width=64)


def _reference_event(wall: float, step: int, tag: str, value: float) -> bytes:
    """What tensorboardX's ``add_scalar`` serializes (its writer sets wall_time, step)."""
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return event_pb2.Event(wall_time=wall, step=step, summary=summary).SerializeToString()


def _records(data: bytes) -> list[bytes]:
    """Split a TFRecord file, checking every checksum with tensorboardX's."""
    out, pos = [], 0
    while pos < len(data):
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (crc_len,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        assert crc_len == reference_masked_crc32c(header)
        record = data[pos + 12 : pos + 12 + length]
        (crc_data,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        assert crc_data == reference_masked_crc32c(record)
        out.append(record)
        pos += 16 + length
    return out


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=300))
def test_masked_crc_matches_tensorboardx(data):
    assert masked_crc32c(data) == reference_masked_crc32c(data)


@settings(max_examples=100, deadline=None)
@given(st.floats(1, 4e9), STEPS, TAGS, VALUES)
def test_scalar_event_bytes_match_tensorboardx(wall, step, tag, value):
    # Values past float32's range go to +-inf in both (protobuf's float field).
    with np.errstate(over="ignore"):
        expected = _reference_event(wall, step, tag, float(np.float32(value)))
    assert encode_event(wall, step, scalars={tag: value}) == expected


def test_writer_file_reads_back_as_tensorboard_events(tmp_path):
    writer = ScalarEventWriter(tmp_path / "tb")
    writer.add(3, {"validation/loss": 0.25, "validation/acc": 0.5})
    writer.add(4, {"training/loss": float("inf")})
    writer.close()
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    events = [event_pb2.Event.FromString(r) for r in _records(path.read_bytes())]
    assert events[0].file_version == "brain.Event:2"
    got = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
    assert got == [
        (3, "validation/loss", 0.25),
        (3, "validation/acc", 0.5),
        (4, "training/loss", float("inf")),
    ]
    assert all(e.wall_time > 0 for e in events)


def test_two_writers_on_one_folder_write_two_files(tmp_path):
    """An inline relaunch of a trial (same process, same second) starts its own file."""
    first, second = ScalarEventWriter(tmp_path), ScalarEventWriter(tmp_path)
    first.add(1, {"a": 1.0})
    second.add(2, {"a": 2.0})
    first.close()
    second.close()
    files = sorted(tmp_path.glob("events.out.tfevents.*"))
    assert len(files) == 2
    for path in files:
        events = [event_pb2.Event.FromString(r) for r in _records(path.read_bytes())]
        assert [e.file_version for e in events[:1]] == ["brain.Event:2"] and len(events) == 2

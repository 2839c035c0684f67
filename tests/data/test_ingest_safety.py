"""Ingest safety: decompression bombs stopped within a memory bound, broken UTF-8 dropped."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zipfile
import zlib
from pathlib import Path

from data.config import IngestConfig
from data.ingest import IngestStep, RepoUnit, decode_bytes

GIB = 1 << 30
MEMORY_BOUND_MB = 256  # peak RSS of the ingesting process, interpreter included

# ru_maxrss survives fork+exec on Linux (the child starts at the parent's peak), so the
# child first resets its high-water mark (clear_refs "5") and reads VmHWM at the end.
BOMB_CHILD = """
import json, resource, sys
open("/proc/self/clear_refs", "w").write("5")
from data.config import IngestConfig
from data.ingest import IngestStep, RepoUnit
unit = RepoUnit("bomb", "archive", sys.argv[1])
step = IngestStep(IngestConfig())
reasons, expanded = {}, 0
gen = step.run(iter([unit]))
for rec in gen:
    reasons[rec.drop_reason or "kept"] = reasons.get(rec.drop_reason or "kept", 0) + 1
    expanded += len(rec.content)
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")][0]
print(json.dumps({"reasons": reasons, "expanded": expanded, "peak_mb": hwm / 1024,
                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _gzip_bomb(path: Path, total: int, member: int = 8 << 20) -> None:
    """A .tar.gz of text members whose expanded size is ``total`` bytes (written streaming)."""
    chunk = b"a" * member
    with tarfile.open(path, "w:gz", compresslevel=9) as tf:
        for i in range(total // member):
            ti = tarfile.TarInfo(f"f{i:04d}.txt")
            ti.size = member
            import io

            tf.addfile(ti, io.BytesIO(chunk))


def test_gigabyte_bomb_stopped_within_memory_bound(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    _gzip_bomb(bomb, GIB)
    assert bomb.stat().st_size < 8 << 20  # a few MB on disk, 1 GiB expanded
    out = subprocess.run(
        [sys.executable, "-c", BOMB_CHILD, str(bomb)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    res = json.loads(out.stdout)
    print(res)
    assert res["reasons"].get("compression_ratio_exceeded") == 1
    assert res["expanded"] <= 200 * (1 << 20) + (8 << 20)  # ratio 200 x 1 MiB floor
    assert res["peak_mb"] < MEMORY_BOUND_MB


def test_zip_member_over_ratio_is_dropped_unread(tmp_path: Path) -> None:
    z = tmp_path / "z.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("ok.py", "print('hello')\n")
        zf.writestr("bomb.txt", b"a" * (64 << 20))
    recs = list(IngestStep(IngestConfig()).run(iter([RepoUnit("z", "archive", str(z))])))
    by = {r.path: r for r in recs}
    assert by["bomb.txt"].drop_reason == "compression_ratio_exceeded"
    assert by["ok.py"].content == "print('hello')\n"
    assert zlib  # deflate is what makes the ratio; stored members are bounded by size


def test_invalid_utf8_dropped_with_reason_unless_detection_confident() -> None:
    broken = "caf\u00e9 na\u00efve r\u00e9sum\u00e9\n".encode() * 20 + b"\xff\xfe bad \x80\n"
    # Stop 41: >= 90% of its non-ASCII well-formed, so damaged UTF-8 kept with U+FFFD.
    assert decode_bytes(broken) == (broken.decode("utf-8", "replace"), "utf-8-replaced")
    mixed = "caf\u00e9 na\u00efve\n".encode() * 2 + "r\u00e9sum\u00e9\n".encode("cp1252")
    assert decode_bytes(mixed) is None  # half UTF-8, half cp1252: dropped
    latin = (
        "Gr\u00fc\u00dfe aus K\u00f6ln, sch\u00f6ne Gr\u00fc\u00dfe und viele "
        "\u00c4pfel f\u00fcr die Stra\u00dfe.\n" * 20
    ).encode("cp1252")
    text, enc = decode_bytes(latin)
    assert "Stra\u00dfe" in text and enc != "utf-8"


def test_invalid_utf8_reason_in_the_drop_table(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "bad.py").write_bytes("x = '\u00e9'\n".encode() * 10 + b"y = '\xff\xfe'\n")
    recs = list(IngestStep(IngestConfig()).run(iter([RepoUnit("r", "dir", str(repo))])))
    assert [(r.path, r.drop_reason) for r in recs] == [("bad.py", "invalid_utf8")]

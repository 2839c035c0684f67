"""StarCoder2 filters, opt-out registry and decontamination."""

from __future__ import annotations

from pathlib import Path

import pytest

from data.cli import main
from data.config import DecontamConfig, FilterConfig
from data.decontam import DecontamStep
from data.errors import DataConfigError
from data.filters import FilterStep
from data.optout import OptOutRegistry, OptOutStep, add_request
from data.records import FileRecord


def _reason(step, rec: FileRecord) -> str | None:
    out = list(step.run([rec]))
    return out[0].drop_reason or None


@pytest.mark.parametrize(
    ("content", "language", "generated", "reason"),
    [
        ("total = compute(value)\n" * 10, "Python", False, None),
        ("x\n" * 100_001, "Python", False, "too_many_lines"),
        ("y" * 150 + "\n", "Python", False, "long_average_line"),
        ("a = 1\n" * 50 + "b" * 1500 + "\n" + "c = 2\n" * 400, "Python", False, "long_line"),
        ("1, 2, 3, 4, 5, 6, 7, 8, 9\n" * 20, "Python", False, "low_alphabetic"),
        ("total = compute(value)\n" * 10, "Python", True, "generated"),
        (
            'data = """\n'
            + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3QUJDREVGR0hJSktMTU5PUFFS\n" * 30
            + '"""\n'
            + "total = compute(value)\n" * 300,
            "Python",
            False,
            "encoded_data",
        ),
        ('{"name": "value"}\n' * 600, "JSON", False, "data_format_too_long"),
        ("prose " * 50 + "\n", "Markdown", False, None),
    ],
)
def test_filters(content: str, language: str, generated: bool, reason: str | None) -> None:
    rec = FileRecord(
        repo="r",
        path="f",
        content=content,
        language=language,
        generated=generated,
        size=len(content),
    )
    assert _reason(FilterStep(FilterConfig()), rec) == reason


def test_filters_are_configurable() -> None:
    rec = FileRecord(repo="r", path="f", content="x = 1\n" * 600, language="Python")
    assert _reason(FilterStep(FilterConfig(max_lines=500)), rec) == "too_many_lines"


def test_optout_registry_versioned_and_cli(tmp_path: Path) -> None:
    reg_path = tmp_path / "optout.yaml"
    assert (
        main(
            [
                "optout",
                "add",
                "--registry",
                str(reg_path),
                "--repo",
                "acme/*",
                "--reason",
                "owner request #12",
                "--date",
                "2024-02-01",
            ]
        )
        == 0
    )
    add_request(reg_path, file_path="*/secrets/*", reason="path request")
    reg = OptOutRegistry.load(reg_path)
    assert reg.version == 2 and reg.entries[0].date == "2024-02-01"
    step = OptOutStep(reg)
    assert _reason(step, FileRecord(repo="acme/tool", path="a.py")) == "repo:owner request #12"
    assert _reason(step, FileRecord(repo="x/y", path="pkg/secrets/k.py")) == "path:path request"
    assert _reason(step, FileRecord(repo="x/y", path="a.py")) is None
    with pytest.raises(DataConfigError, match="nothing to exclude"):
        add_request(reg_path, reason="r")


def test_decontamination(tmp_path: Path) -> None:
    bench = tmp_path / "humaneval.jsonl"
    bench.write_text(
        '{"prompt": "def has_close_elements(numbers: List[float], threshold: float) -> bool:"}\n'
    )
    step = DecontamStep(DecontamConfig(files=(str(bench),), strings=("short",)))
    leaked = (
        "from typing import List\n\ndef  has_close_elements(numbers:List[float],\n"
        "        threshold: float) ->bool:\n    return False\n"
    )
    assert (
        _reason(step, FileRecord(repo="r", path="a.py", content=leaked.upper()))
        == "benchmark_match"
    )
    assert _reason(step, FileRecord(repo="r", path="b.py", content="def other(): short\n")) is None

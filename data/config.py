"""Frozen, validated configuration for every stage, and the YAML loader for the CLI.

Defaults are StarCoder2's (Lozhkov et al. 2024, "StarCoder 2 and The Stack v2", section 3)
unless a comment says otherwise.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from data.errors import DataConfigError

MiB = 1 << 20

LICENSE_TYPES = ("permissive", "no_license", "non_permissive", "unidentified_license")
PII_TYPES = ("email", "ip", "key", "password", "credit_card", "phone", "name")


def _require(cond: bool, field_name: str, problem: str, fix: str) -> None:
    if not cond:
        raise DataConfigError(field_name, problem, fix)


def _did_you_mean(name: str, choices: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice (any case), else empty."""
    import difflib

    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def _require_languages(field_name: str, names: tuple[str, ...]) -> None:
    """Language names must be the detector's (linguist spellings): a typo such as
    ``Yaml`` would match no file and silently switch its filter off."""
    from data.language import supported_languages

    known = supported_languages()
    bad = [n for n in names if n not in set(known)]
    if bad:
        raise DataConfigError(
            field_name,
            f"unknown language {bad[0]!r}{_did_you_mean(bad[0], known)}",
            "use linguist's spelling (`python -c 'import data; "
            "print(data.supported_languages())'` lists them)",
        )


@dataclass(frozen=True, kw_only=True)
class SourceConfig:
    """One input: a directory, a git repository or an archive (or a folder of archives)."""

    type: str
    """``dir``, ``git`` or ``archive``."""
    path: str
    """Where the input lives on disk."""
    name: str = ""
    """Repository name; defaults to the basename of ``path``."""
    layout: str = "repo"
    """For ``dir`` and ``archive`` folders: ``repo`` (one repository) or ``repos`` (each
    immediate child is a repository)."""
    stars: int = 0
    """Priority used to choose the survivor among near duplicates (higher wins)."""

    def __post_init__(self) -> None:
        _require(
            self.type in ("dir", "git", "archive"),
            "sources[].type",
            f"unknown source type {self.type!r}",
            "use one of dir, git, archive",
        )
        _require(bool(self.path), "sources[].path", "empty path", "give the input's path")
        _require(
            self.layout in ("repo", "repos"),
            "sources[].layout",
            f"unknown layout {self.layout!r}",
            "use repo or repos",
        )
        _require(self.stars >= 0, "sources[].stars", "negative", "use a count >= 0")


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """Limits for reading inputs (archives are untrusted)."""

    max_file_bytes: int = 10 * MiB
    """Files larger than this are dropped (The Stack v2 uses 10 MiB)."""
    max_archive_bytes: int = 2048 * MiB
    """Total decompressed bytes read from one archive before the rest is dropped."""
    max_archive_members: int = 200_000
    """Members read from one archive before the rest is dropped."""
    max_compression_ratio: float = 200.0
    """Expanded bytes per compressed byte of an archive (and of a zip member) before the
    rest is dropped as a decompression bomb; source code compresses 3-20x."""

    def __post_init__(self) -> None:
        for f in (
            "max_file_bytes",
            "max_archive_bytes",
            "max_archive_members",
            "max_compression_ratio",
        ):
            _require(getattr(self, f) > 0, f"ingest.{f}", "must be positive", "use a value > 0")


@dataclass(frozen=True, kw_only=True)
class LanguageConfig:
    """Language detection options."""

    drop_vendored: bool = False
    """Drop files linguist would call vendored (node_modules/, vendor/, *.min.js, ...)."""
    drop_unknown: bool = False
    """Drop files whose language is not detected."""


@dataclass(frozen=True, kw_only=True)
class LicenseConfig:
    """License detection and the allow-list policy."""

    keep: tuple[str, ...] = ("permissive", "no_license")
    """License types kept (The Stack v2 keeps permissive and unlicensed files)."""
    min_score: float = 0.8
    """Minimum askalono match score for a license file to count."""
    extra_permissive: tuple[str, ...] = ()
    """SPDX ids to treat as permissive in addition to Blue Oak and ScanCode's lists."""
    max_buffer_bytes: int = 64 * MiB
    """File contents of one repository held in memory while its license files are found;
    the rest wait in a temporary file (the step streams whatever the repository's size)."""

    def __post_init__(self) -> None:
        bad = [k for k in self.keep if k not in LICENSE_TYPES]
        _require(
            not bad,
            "license.keep",
            f"unknown license types {bad}",
            f"use values from {list(LICENSE_TYPES)}",
        )
        _require(
            0.0 < self.min_score <= 1.0,
            "license.min_score",
            f"{self.min_score} is outside (0, 1]",
            "use e.g. 0.8",
        )


@dataclass(frozen=True, kw_only=True)
class OptOutConfig:
    """The opt-out registry re-applied on every build."""

    registry: str = ""
    """Path of the registry YAML file; empty means no opt-outs."""


@dataclass(frozen=True, kw_only=True)
class FilterConfig:
    """StarCoder2's file filters (paper section 3.2); every threshold is configurable."""

    max_lines: int = 100_000
    max_avg_line_length: float = 100.0
    max_line_length: int = 1000
    min_alpha_fraction: float = 0.25
    drop_generated: bool = True
    max_encoded_length: int = 1024
    """Longest allowed base64 / hex / ``\\u`` escape run."""
    max_encoded_fraction: float = 0.5
    data_max_lines: int = 512
    data_languages: tuple[str, ...] = ("JSON", "JSON with Comments", "YAML", "Text")
    exempt_languages: tuple[str, ...] = ("Markdown", "reStructuredText", "HTML", "Text", "SVG")
    """Languages exempt from the line-length and alphabetic filters (prose, markup)."""

    def __post_init__(self) -> None:
        for f in ("max_lines", "max_line_length", "max_encoded_length", "data_max_lines"):
            _require(getattr(self, f) > 0, f"filters.{f}", "must be positive", "use a value > 0")
        _require(
            self.max_avg_line_length > 0,
            "filters.max_avg_line_length",
            "must be positive",
            "use e.g. 100",
        )
        for f in ("min_alpha_fraction", "max_encoded_fraction"):
            v = getattr(self, f)
            _require(0.0 <= v <= 1.0, f"filters.{f}", f"{v} is outside [0, 1]", "use a fraction")
        _require_languages("filters.data_languages", self.data_languages)
        _require_languages("filters.exempt_languages", self.exempt_languages)


@dataclass(frozen=True, kw_only=True)
class PIIConfig:
    """PII redaction."""

    enabled: bool = True
    types: tuple[str, ...] = tuple(t for t in PII_TYPES if t != "phone")
    """Which kinds of PII to redact. Phones are off by default: StarCoder2 did not redact
    them, and in code nearly all phone-shaped numbers are constants tables."""
    entropy_base64: float = 4.0
    """Shannon-entropy threshold (bits/char) for base64-like secrets in key contexts."""
    entropy_hex: float = 3.0
    """Shannon-entropy threshold for hex-like secrets in key contexts (detect-secrets' 3.0)."""

    def __post_init__(self) -> None:
        bad = [t for t in self.types if t not in PII_TYPES]
        _require(not bad, "pii.types", f"unknown PII types {bad}", f"use values from {PII_TYPES}")


LSH_SLACK = 0.05
"""How far set bands/rows' candidate curve may sit from ``dedup.threshold``."""


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    """Exact and MinHash/LSH near deduplication (StarCoder2: 5-grams, 25x10 bands, 0.7)."""

    exact: bool = True
    near: bool = True
    num_perm: int = 256
    bands: int | None = None
    rows: int | None = None
    """LSH bands x rows. A pair becomes a candidate from about ``(1/bands)**(1/rows)``, so
    set ones must agree with ``threshold``; unset, they are StarCoder2's 25 x 10 when that
    serves the threshold, else what datasketch's ``MinHashLSH`` picks for it."""
    threshold: float = 0.7
    shingle_size: int = 5
    seed: int = 42
    verify: bool = True
    """Check LSH candidate pairs against the estimated Jaccard before merging them."""
    priority: tuple[str, ...] = ("stars", "recency")
    """Tie-breakers after license when choosing a cluster's survivor."""
    lsh_storage: dict[str, Any] = field(default_factory=dict)
    """datasketch ``storage_config`` (e.g. ``{type: redis, redis: {...}}``) for a shared index."""

    def __post_init__(self) -> None:
        _require(
            self.num_perm >= 16,
            "dedup.num_perm",
            f"{self.num_perm} is too small",
            "use 256 (StarCoder2)",
        )
        _require(
            0.0 < self.threshold < 1.0,
            "dedup.threshold",
            f"{self.threshold} not in (0,1)",
            "use e.g. 0.7",
        )
        self._check_lsh_params()
        _require(self.shingle_size >= 1, "dedup.shingle_size", "must be >= 1", "use 5")
        bad = [p for p in self.priority if p not in ("stars", "recency")]
        _require(not bad, "dedup.priority", f"unknown keys {bad}", "use stars and/or recency")

    def _check_lsh_params(self) -> None:
        """Fill unset bands/rows; refuse set ones that contradict the threshold.

        LSH finds pairs from about ``(1/bands)**(1/rows)`` on: 25 x 10 (0.72) with
        ``threshold: 0.5`` would silently miss the pairs between 0.5 and 0.72, and
        without ``verify`` a curve below the threshold merges pairs under it. Unset,
        they are StarCoder2's 25 x 10 where that serves the threshold, else what
        datasketch's ``MinHashLSH`` picks for it.
        """
        from data.minhash import lsh_params

        best = lsh_params(self.threshold, self.num_perm)
        given = [v for v in (self.bands, self.rows) if v is not None]
        _require(
            all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given),
            "dedup.bands/rows",
            f"must be positive integers, got bands={self.bands!r} rows={self.rows!r}",
            f"use bands={best[0]} rows={best[1]} or leave both unset",
        )
        if not given:
            fits = self.num_perm >= 25 * 10 and self._lsh_problem(25, 10) is None
            object.__setattr__(self, "bands", 25 if fits else best[0])
            object.__setattr__(self, "rows", 10 if fits else best[1])
            return
        _require(
            len(given) == 2,
            "dedup.bands/rows",
            "only one of them is set",
            f"set both (bands={best[0]} rows={best[1]} for threshold {self.threshold}) or neither",
        )
        _require(
            self.bands * self.rows <= self.num_perm,
            "dedup.bands",
            f"bands*rows={self.bands * self.rows} exceeds num_perm={self.num_perm}",
            "raise dedup.num_perm or lower bands/rows",
        )
        problem = self._lsh_problem(self.bands, self.rows)
        _require(
            problem is None,
            "dedup.bands/rows",
            str(problem),
            f"use bands={best[0]} rows={best[1]} (what datasketch picks for "
            f"{self.threshold}) or leave both unset",
        )

    def _lsh_problem(self, bands: int, rows: int) -> str | None:
        """Why ``bands`` x ``rows`` would not give ``threshold``'s pairs (None: they do)."""
        from data.minhash import lsh_curve_threshold

        curve = lsh_curve_threshold(bands, rows)
        where = f"{bands} bands x {rows} rows find pairs from Jaccard ~{curve:.2f}, so "
        if curve > self.threshold + LSH_SLACK:
            return where + f"threshold {self.threshold} would miss the pairs in between"
        if not self.verify and curve < self.threshold - LSH_SLACK:
            return where + f"threshold {self.threshold} would merge pairs below it (verify off)"
        return None


@dataclass(frozen=True, kw_only=True)
class DecontamConfig:
    """Benchmark decontamination: drop files containing any of these strings."""

    strings: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    """Text files with one string per line (or JSONL with a ``text`` field)."""
    min_length: int = 20
    """Shorter needles are ignored: they would match ordinary code."""


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    """Tokenizer training/loading and tokenized ArrayRecord shards."""

    enabled: bool = False
    tokenizer: str = ""
    """Path of a ``tokenizer.json`` to load; empty means train one on the build's output."""
    vocab_size: int = 8192
    min_frequency: int = 2
    num_shards: int = 2
    eos_token: str = "<|endoftext|>"

    def __post_init__(self) -> None:
        _require(
            self.vocab_size >= 300,
            "tokenize.vocab_size",
            f"{self.vocab_size} < 300",
            "use at least 300 (256 bytes + specials + merges)",
        )
        _require(self.num_shards >= 1, "tokenize.num_shards", "must be >= 1", "use 1 or more")


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """A whole build: inputs, output, stage configs and execution."""

    sources: tuple[SourceConfig, ...]
    output_dir: str
    version: str = "v1"
    num_shards: int = 4
    workers: int = 0
    """Parallel processes for the local executor; 0 means one per CPU."""
    executor: str = "local"
    """``local`` or ``ray``."""
    progress: bool = True
    ingest: IngestConfig = field(default_factory=IngestConfig)
    language: LanguageConfig = field(default_factory=LanguageConfig)
    license: LicenseConfig = field(default_factory=LicenseConfig)
    optout: OptOutConfig = field(default_factory=OptOutConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    pii: PIIConfig = field(default_factory=PIIConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)

    def __post_init__(self) -> None:
        _require(len(self.sources) > 0, "sources", "no inputs", "list at least one source")
        _require(bool(self.output_dir), "output_dir", "empty", "give an output directory")
        _require(self.num_shards >= 1, "num_shards", f"{self.num_shards} < 1", "use 1 or more")
        _require(self.workers >= 0, "workers", "negative", "use 0 (auto) or a count")
        _require(
            self.executor in ("local", "ray"),
            "executor",
            f"unknown {self.executor!r}",
            "use local or ray",
        )
        _require(
            bool(self.version) and "/" not in self.version,
            "version",
            f"bad version label {self.version!r}",
            "use a name such as v1",
        )

    @property
    def version_dir(self) -> Path:
        """Where this version's snapshot is written."""
        return Path(self.output_dir) / self.version

    def to_dict(self) -> dict[str, Any]:
        """A JSON/YAML-ready dict (round-trips through :func:`config_from_dict`)."""
        return dataclasses.asdict(self)


def _build(cls: type, raw: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping, naming unknown keys and bad types."""
    if isinstance(raw, cls):
        return raw
    if not isinstance(raw, dict):
        raise DataConfigError(
            where or cls.__name__,
            f"expected a mapping, got {type(raw).__name__}",
            "write it as key: value pairs",
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise DataConfigError(
            f"{where}.{unknown[0]}" if where else unknown[0],
            f"unknown key{_did_you_mean(str(unknown[0]), list(fields))}",
            f"use one of {sorted(fields)}",
        )
    kwargs = {}
    for name, value in raw.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise DataConfigError(where or cls.__name__, str(e), "add the missing keys") from None


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise DataConfigError(where, f"expected a list, got {value!r}", "write a YAML list")
        (inner, _ellipsis) = typing.get_args(tp)
        return tuple(_coerce(inner, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (types.UnionType, typing.Union):
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise DataConfigError(
            where, f"expected {tp.__name__}, got {value!r}", f"write a {tp.__name__}"
        )
    if tp is int and isinstance(value, bool):
        raise DataConfigError(where, f"expected int, got {value!r}", "write a number")
    return value


def config_from_dict(raw: dict[str, Any], base_dir: str | Path | None = None) -> BuildConfig:
    """Build a :class:`BuildConfig` from a plain dict; relative paths resolve against base_dir."""
    if not isinstance(raw, dict):
        raise DataConfigError(
            "CONFIG",
            f"the top level is a {type(raw).__name__}, not a mapping",
            "write keys such as output_dir: and sources: (see data/README.md)",
        )
    if not isinstance(raw.get("sources", []), list | tuple):
        raise DataConfigError(
            "sources", f"expected a list, got {raw['sources']!r}", "write one entry per source"
        )
    raw = dict(raw)
    if base_dir is not None:
        base = Path(base_dir)

        def rel(p: str) -> str:
            return p if not p or Path(p).is_absolute() else str((base / p).resolve())

        raw["sources"] = [
            dict(s, path=rel(s.get("path", ""))) if isinstance(s, dict) else s
            for s in raw.get("sources", [])
        ]
        if "output_dir" in raw:
            raw["output_dir"] = rel(raw["output_dir"])
        for sect, key in (("optout", "registry"), ("tokenize", "tokenizer")):
            if isinstance(raw.get(sect), dict) and raw[sect].get(key):
                raw[sect] = dict(raw[sect], **{key: rel(raw[sect][key])})
        if isinstance(raw.get("decontam"), dict) and raw["decontam"].get("files"):
            files = [rel(f) for f in raw["decontam"]["files"]]
            raw["decontam"] = dict(raw["decontam"], files=files)
    return _build(BuildConfig, raw, "")


def load_config(path: str | Path) -> BuildConfig:
    """Load a YAML build config; relative paths are relative to the file."""
    path = Path(path)
    if not path.is_file():
        raise DataConfigError("CONFIG", f"{path} does not exist", "pass the path of a YAML file")
    raw = yaml.safe_load(path.read_text()) or {}
    return config_from_dict(raw, base_dir=path.parent)

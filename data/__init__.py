"""data: a code-dataset curation pipeline in the manner of The Stack v2.

Raw repositories -> language, license, opt-out, StarCoder2 filters, PII redaction,
exact + near dedup, decontamination -> versioned Parquet snapshots -> tokenized
ArrayRecord shards that Grain reads. Stands alone: it does not import ``jaxcore``.

Names are resolved lazily (PEP 562) so that ``import data.pii`` or ``python -m data
redact`` load only the modules they use, not the whole pipeline (Parquet, tokenizers).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "data.config": (
        "BuildConfig",
        "DecontamConfig",
        "DedupConfig",
        "FilterConfig",
        "IngestConfig",
        "LanguageConfig",
        "LicenseConfig",
        "OptOutConfig",
        "PIIConfig",
        "SourceConfig",
        "TokenizeConfig",
        "config_from_dict",
        "load_config",
    ),
    "data.errors": ("BuildError", "DataConfigError", "DataError"),
    "data.language": ("detect_language", "supported_languages"),
    "data.license": ("classify_expression", "identify_text", "package_license_agreement"),
    "data.minhash": ("MinHasher",),
    "data.optout": ("OptOutRegistry", "add_request"),
    "data.pii": ("PIIDetector", "redact_text"),
    "data.pipeline": ("build",),
    "data.records": ("FileRecord", "StageStats"),
    "data.snapshot": ("diff_versions", "load_manifest", "verify_checksums", "verify_manifest"),
    "data.step": ("Step", "chain"),
    "data.tokens": ("open_dataset", "tokenize_snapshot", "train_tokenizer"),
    "data.versions": ("version_key",),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}

__all__ = sorted(["__version__", *_WHERE])


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'data' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return __all__

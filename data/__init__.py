"""data: a code-dataset curation pipeline in the manner of The Stack v2.

Raw repositories -> language, license, opt-out, StarCoder2 filters, PII redaction,
exact + near dedup, decontamination -> versioned Parquet snapshots -> tokenized
ArrayRecord shards that Grain reads. Stands alone: it does not import ``jaxcore``.
"""

__version__ = "0.1.0"

from data.config import (
    BuildConfig,
    DecontamConfig,
    DedupConfig,
    FilterConfig,
    IngestConfig,
    LanguageConfig,
    LicenseConfig,
    OptOutConfig,
    PIIConfig,
    SourceConfig,
    TokenizeConfig,
    config_from_dict,
    load_config,
)
from data.errors import BuildError, DataConfigError, DataError
from data.language import detect_language, supported_languages
from data.license import classify_expression, identify_text, package_license_agreement
from data.minhash import MinHasher
from data.optout import OptOutRegistry, add_request
from data.pii import PIIDetector
from data.pipeline import build
from data.records import FileRecord, StepStats
from data.snapshot import diff_versions, load_manifest, verify_checksums
from data.step import Step, chain
from data.tokens import open_dataset, tokenize_snapshot, train_tokenizer

__all__ = [
    "BuildConfig", "BuildError", "DataConfigError", "DataError", "DecontamConfig",
    "DedupConfig", "FileRecord", "FilterConfig", "IngestConfig", "LanguageConfig",
    "LicenseConfig", "MinHasher", "OptOutConfig", "OptOutRegistry", "PIIConfig", "PIIDetector",
    "SourceConfig", "Step", "StepStats", "TokenizeConfig", "__version__", "add_request", "build",
    "chain", "classify_expression", "config_from_dict", "detect_language", "diff_versions",
    "identify_text", "load_config", "load_manifest", "open_dataset",
    "package_license_agreement", "supported_languages", "tokenize_snapshot", "train_tokenizer",
    "verify_checksums",
]

"""The `jaxcore run` config: one YAML file, six sections, validated into frozen dataclasses.

Every key is a field of one of the dataclasses below (the same objects the Python API
takes), so a typo or a bad value is a `ConfigError` naming the key and the fix before any
phase starts. ``--set section.key=value`` overrides (values parsed as YAML) are applied to
the raw mapping first, so they are validated the same way.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

import yaml

from jaxcore.errors import ConfigError
from jaxcore.remat import POLICY_NAMES


def _require(cond: bool, key: str, problem: str) -> None:
    if not cond:
        raise ConfigError(f"run config: {key}: {problem}")


@dataclass(frozen=True, kw_only=True)
class DataSection:
    """Which installed packages become the corpus, and where dataset versions live.

    ``packages`` are import names found in this environment (their source folders are
    read as repositories); ``sources`` are extra `data.SourceConfig` mappings. Dataset
    versions go to ``output_dir`` (relative paths: from the working directory), one per
    input hash, so
    every run with the same inputs reuses the same version.
    """

    packages: tuple[str, ...] = ("idna", "click", "jinja2", "markupsafe", "certifi", "h11")
    sources: tuple[dict, ...] = ()
    output_dir: str = "datasets"
    num_shards: int = 2
    workers: int = 1
    optout_registry: str = ""

    def __post_init__(self) -> None:
        _require(
            bool(self.packages or self.sources),
            "data.packages",
            "no inputs; list installed packages (e.g. [idna, click]) or data.sources",
        )
        _require(self.num_shards >= 1, "data.num_shards", f"{self.num_shards} < 1; use 1 or more")
        _require(self.workers >= 0, "data.workers", f"{self.workers} < 0; use 0 (auto) or more")


@dataclass(frozen=True, kw_only=True)
class TokenizerSection:
    """Byte-level BPE trained with ``tokenizers`` on the kept files."""

    vocab_size: int = 2048
    min_frequency: int = 2
    num_shards: int = 2

    def __post_init__(self) -> None:
        _require(
            self.vocab_size >= 260,
            "tokenizer.vocab_size",
            f"{self.vocab_size} is below the 256 byte tokens + specials; use >= 260",
        )
        _require(self.min_frequency >= 1, "tokenizer.min_frequency", "use 1 or more")
        _require(self.num_shards >= 1, "tokenizer.num_shards", "use 1 or more")


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The reference decoder's shape (`jaxcore.models.TransformerConfig` fields)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 384
    seq_len: int = 128

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "seq_len"):
            _require(getattr(self, name) >= 1, f"model.{name}", "must be >= 1")
        _require(
            self.d_model % self.n_heads == 0,
            "model.n_heads",
            f"{self.n_heads} does not divide model.d_model={self.d_model}",
        )
        _require(
            self.n_heads % self.n_kv_heads == 0,
            "model.n_kv_heads",
            f"{self.n_kv_heads} does not divide model.n_heads={self.n_heads}",
        )


@dataclass(frozen=True, kw_only=True)
class TrainSection:
    """The main training run: FSDP (ZeRO-``zero``) over every device."""

    steps: int = 300
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.1
    zero: int = 3
    checkpoint_every: int = 50
    seed: int = 0
    devices: int = 8
    """Fake CPU devices when there is no accelerator (set before JAX starts)."""
    remat: str = "none"
    """Activation checkpointing per block (``jaxcore.remat`` policy names)."""
    precision: str = "fp32"
    """``fp32``, or ``bf16`` (float32 master weights, bfloat16 compute) on accelerators."""
    grad_accum: int = 1
    """Microbatches accumulated inside one step (``batch`` must divide by it)."""
    unroll_layers: bool | None = None
    """The layers as an unrolled loop (``true``) or a scan (``false``); unset: unrolled on
    CPU without remat (`jaxcore.EngineConfig.unroll_layers`). ``false`` for deep models
    on CPU, whose compile time grows with the depth when unrolled."""

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "train.steps", f"{self.steps} < 1; train at least 1 step")
        _require(self.batch >= 1, "train.batch", "must be >= 1")
        _require(self.lr > 0, "train.lr", f"{self.lr} is not positive")
        _require(self.warmup >= 0, "train.warmup", "must be >= 0")
        _require(self.zero in (0, 1, 2, 3), "train.zero", f"{self.zero}; use 0, 1, 2 or 3")
        _require(self.checkpoint_every >= 1, "train.checkpoint_every", "must be >= 1")
        _require(self.devices >= 1, "train.devices", "must be >= 1")
        _require(
            self.remat in POLICY_NAMES, "train.remat", f"{self.remat!r}; use one of {POLICY_NAMES}"
        )
        _require(
            self.unroll_layers is None or isinstance(self.unroll_layers, bool),
            "train.unroll_layers",
            f"{self.unroll_layers!r}; use true, false, or leave it unset (automatic)",
        )
        _require(
            self.precision in ("fp32", "bf16", "fp16"),
            "train.precision",
            f"{self.precision!r}; use fp32, bf16 or fp16",
        )
        _require(
            self.grad_accum >= 1 and self.batch % self.grad_accum == 0,
            "train.grad_accum",
            f"{self.grad_accum}; use a positive divisor of train.batch ({self.batch})",
        )


@dataclass(frozen=True, kw_only=True)
class SearchSection:
    """A small adaptive ASHA search over the learning rate (log-uniform range)."""

    enabled: bool = True
    lr_min: float = 3e-4
    lr_max: float = 1e-2
    max_trials: int = 4
    max_length: int = 64
    """Steps of a trial that reaches the top rung."""
    divisor: int = 2
    max_rungs: int = 2

    def __post_init__(self) -> None:
        _require(
            0 < self.lr_min < self.lr_max,
            "search.lr_min",
            f"need 0 < lr_min < lr_max, got {self.lr_min} and {self.lr_max}",
        )
        _require(self.max_trials >= 1, "search.max_trials", "must be >= 1")
        _require(self.max_length >= 1, "search.max_length", "must be >= 1")
        _require(self.divisor >= 2, "search.divisor", "must be >= 2")
        _require(self.max_rungs >= 1, "search.max_rungs", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class ServeSection:
    """Serve the registered model in-process and complete ``prompts`` over the OpenAI API."""

    enabled: bool = True
    prompts: tuple[str, ...] = ("def fibonacci(n):", "import os\n", "class Parser:")
    max_tokens: int = 24
    slots: int = 4

    def __post_init__(self) -> None:
        _require(self.max_tokens >= 1, "serve.max_tokens", "must be >= 1")
        _require(self.slots >= 1, "serve.slots", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A whole `jaxcore run`: name, run directory and the six sections.

    ``run_dir`` (relative paths: from the working directory) holds the store, phase records, the
    checkpoints and the loss PNG; ``model_name`` is the registry name of the result.
    """

    name: str
    run_dir: str
    model_name: str = ""
    data: DataSection = field(default_factory=DataSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    search: SearchSection = field(default_factory=SearchSection)
    serve: ServeSection = field(default_factory=ServeSection)

    def __post_init__(self) -> None:
        _require(bool(self.name), "name", "empty; give the run a name")
        _require(bool(self.run_dir), "run_dir", "empty; give a directory for the run")
        if not self.model_name:
            object.__setattr__(self, "model_name", self.name)

    @property
    def path(self) -> pathlib.Path:
        return pathlib.Path(self.run_dir)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """``value`` as type ``tp`` (ints are floats; lists are tuples); else a ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return value
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            raise ConfigError(f"run config: {key}: expected a list, got {value!r}")
        (inner, _) = typing.get_args(tp)
        return tuple(_coerce(inner, v, f"{key}[]") for v in value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        # PyYAML follows YAML 1.1, where ``1e-3`` (no dot) is a string; YAML 1.2, JSON
        # and Python read it as a number, and so does a user writing a learning rate.
        return float(value)
    if tp is dict and isinstance(value, dict):
        return value
    if tp in (int, float, str, bool) and type(value) is not tp:
        raise ConfigError(
            f"run config: {key}: expected {tp.__name__}, got {value!r} ({type(value).__name__})"
        )
    return value


def _build(cls: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"run config: {where or 'top level'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(
            f"run config: unknown key {where + '.' if where else ''}{unknown[0]}; "
            f"{where or 'the top level'} takes {sorted(names)}"
        )
    kwargs = {}
    for name, value in raw.items():
        key = f"{where}.{name}" if where else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value or {}, key)
        else:
            kwargs[name] = _coerce(tp, value, key)
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"run config: {where or 'top level'}: {e}") from e


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``["train.steps=4", "serve.enabled=false"]`` applied to a raw config mapping."""
    out = dict(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: write SECTION.KEY=VALUE, e.g. train.steps=4")
        parts = key.split(".")
        node = out
        for i, p in enumerate(parts[:-1]):
            inner = node.get(p) or {}
            if not isinstance(inner, dict):
                raise ConfigError(
                    f"--set {item!r}: {'.'.join(parts[: i + 1])} is {inner!r}, not a section; "
                    "set it directly (e.g. --set train.steps=4)"
                )
            node[p] = dict(inner)
            node = node[p]
        try:
            node[parts[-1]] = yaml.load(text, Loader=_StrictLoader)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({e})") from None
    return out


def parse_run_config(
    raw: dict[str, Any], base_dir: str | pathlib.Path = ".", overrides: list[str] = ()
) -> RunConfig:
    """Validate a mapping; paths (``run_dir``, ``data.output_dir``) become absolute from
    ``base_dir`` (the working directory by default, where ``make demo`` runs)."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"run config: the top level must be a mapping (name:, run_dir:, data:, ...), "
            f"got a {type(raw).__name__}; see configs/demo.yaml"
        )
    raw = apply_overrides(raw, list(overrides))
    cfg = _build(RunConfig, raw, "")
    base = pathlib.Path(base_dir).absolute()
    data = dataclasses.replace(cfg.data, output_dir=str(base / cfg.data.output_dir))
    return dataclasses.replace(cfg, run_dir=str(base / cfg.run_dir), data=data)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key written twice in one mapping (PyYAML keeps the
    last silently, so ``lr:`` twice would train with whichever came last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"run config: key {key!r} appears twice in one mapping (lines {seen[key]} "
                    f"and {line}); keep one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_run_config(path: str | pathlib.Path, overrides: list[str] = ()) -> RunConfig:
    """Read and validate a run YAML file (see `parse_run_config`)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"run config {path} does not exist; try configs/demo.yaml")
    try:
        raw = yaml.load(path.read_text(), Loader=_StrictLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"run config {path}: not valid YAML ({e})") from e
    except ConfigError as e:
        raise ConfigError(f"{e} ({path})") from None
    if raw is None:
        raise ConfigError(
            f"run config {path} is empty; write at least name: and run_dir: (every other "
            "key has a default), e.g. copy configs/demo.yaml"
        )
    return parse_run_config(raw, ".", overrides)

"""Where a served model's weights come from: a params pytree, a `TrainState`, a portable
safetensors file, or a registry name.

Every path ends in ``(TransformerConfig, params)`` with ``params`` the nested dict of
arrays that ``TrainState.params`` holds. The safetensors format is flat: keys are the
``.``-joined parameter paths (jaxcore's portable format, `jc.save_params`) and the model
config travels in the file's metadata, so one file is a complete model; files from
`jc.export_checkpoint` load too when the config is given.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

import jaxcore as jc
from jaxcore.errors import hub_name_hint
from jaxcore.models import Transformer, TransformerConfig

log = logging.getLogger(__name__)

# Registry names -> config factories. A name serves a freshly initialised model (seeded):
# for smoke tests and demos; real weights come from a file.
REGISTRY: dict[str, Callable[[], TransformerConfig]] = {
    "tiny": TransformerConfig.tiny,
    "small": TransformerConfig.small,
    "base": TransformerConfig.base,
}


def init_params(cfg: TransformerConfig, seed: int = 0) -> dict[str, Any]:
    """Freshly initialised parameters of the reference model (host NumPy arrays)."""

    @jax.jit
    def init():
        _, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.Param, ...)[:2]
        return nnx.to_pure_dict(params)

    return jax.tree.map(np.asarray, init())


def check_params_fit(
    cfg: TransformerConfig, params: dict[str, Any], source: str, hint: str
) -> None:
    """A `ConfigError` naming the first parameter whose shape (or presence) is not what
    ``cfg`` builds: a config of another size was taken, and failed later in pjit's
    shardings or in the first request's prefill, or served a d_ff it did not say."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    want = {
        _key(path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(
            nnx.to_pure_dict(nnx.split(abstract, nnx.Param, ...)[1])
        )[0]
    }
    got = {
        _key(path): tuple(np.shape(leaf))
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    fields = ", ".join(
        f"{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if f.name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff")
    )
    problem = None
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        problem = f"parameters {missing} are missing and {extra} unexpected"
    else:
        for key, shape in want.items():
            if got[key] != shape:
                problem = f"{key!r} has shape {got[key]} but the config needs {shape}"
                break
    if problem:
        raise jc.ConfigError(
            f"model: the weights ({source}) do not fit TransformerConfig({fields}, ...): "
            f"{problem}. {hint}"
        )


def _key(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def build_model(cfg: TransformerConfig, params: dict[str, Any]) -> Transformer:
    """A `Transformer` holding ``params`` (no initialisation is run)."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest)


def save_safetensors(path: str | Path, cfg: TransformerConfig, params: dict[str, Any]) -> Path:
    """Write ``params`` with ``cfg`` in jaxcore's portable format (`jc.save_params`)."""
    return jc.save_params(params, path, model_config=dataclasses.asdict(cfg))


def load_safetensors(
    path: str | Path, config: TransformerConfig | None = None
) -> tuple[TransformerConfig, dict[str, Any]]:
    """Read a jaxcore portable file (`save_safetensors`, `jc.save_params`,
    `jc.export_checkpoint`), or a folder with ``model.safetensors``.

    The model's config comes from ``config``, else the file's metadata, else a
    ``config.json`` of `TransformerConfig` fields beside the file.
    """
    given, path = path, Path(path)
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = path / "model.safetensors"
    no_config = not (folder / "config.json").is_file()
    if no_config and not path.is_file() and (folder / "model.safetensors.index.json").is_file():
        _refuse_hf_without_config(folder)
    if not path.is_file():
        raise jc.ConfigError(
            f"model: {path} does not exist. Pass a .safetensors file written by "
            "inference.save_safetensors or jc.export_checkpoint, a Hugging Face "
            f"save_pretrained folder, or one of the registry names {sorted(REGISTRY)}."
            f"{hub_name_hint(given)}"
        )
    params, info = jc.read_params(path)
    if not info.get("model_config") and _is_hf_dir(folder):
        # a weights file of a save_pretrained folder: its names and config are HF's
        raise jc.ConfigError(
            f"model: {path} is a weights file of the Hugging Face folder {folder} (its "
            f"config.json names a model_type); pass the folder ({folder}) so its "
            "config.json, tokenizer and generation config are read."
        )
    if no_config and not info.get("model_config") and _hf_names(params):
        _refuse_hf_without_config(folder)
    if config is not None:
        hint = (
            "The file carries its own config: drop config= (--config)."
            if info.get("model_config")
            else "Pass the config the weights were exported with (config= or --config)."
        )
        check_params_fit(config, params, str(path), hint)
        return config, params
    if info.get("model_config"):
        cfg = TransformerConfig(**info["model_config"])
        check_params_fit(cfg, params, str(path), "The config in its metadata is not theirs.")
        return cfg, params
    if (folder / "config.json").is_file():
        cfg = config_from_json(folder / "config.json")
        hint = f"Correct {folder / 'config.json'} (or pass config=, --config)."
        check_params_fit(cfg, params, str(path), hint)
        return cfg, params
    raise jc.ConfigError(
        f"model: {path} does not say its model config (jc.export_checkpoint files do not); "
        "pass config=TransformerConfig(...) (or --config for the server), or put a "
        "config.json of TransformerConfig fields beside it."
    )


def _hf_names(params: dict[str, Any]) -> bool:
    """Tensors named as ``save_pretrained`` names them (``model.embed_tokens.weight``)."""
    model = params.get("model")
    return isinstance(model, dict) and "embed_tokens" in model


def _refuse_hf_without_config(folder: Path) -> None:
    """A ``save_pretrained`` folder whose ``config.json`` is gone: restoring that file is
    the fix (a config.json of TransformerConfig fields, which the error used to ask for,
    does not fit Hugging Face tensor names)."""
    raise jc.ConfigError(
        f"model: {folder} holds Hugging Face weights (model.embed_tokens.weight, ...) but "
        "no config.json; put back the config.json that save_pretrained wrote (a "
        "jaxcore.hf.save or `jaxcore export --hf` that failed midway leaves none: run it "
        "again) and pass the folder."
    )


def config_from_json(source: Path) -> TransformerConfig:
    """The `TransformerConfig` of a JSON file (a ``config.json`` beside a weights file, the
    server's ``--config``); a key that is not one of its fields is a `ConfigError` naming
    it (not a ``TypeError``)."""
    if not source.is_file():
        raise jc.ConfigError(
            f"model config: {source} does not exist; pass a JSON file of TransformerConfig fields."
        )
    try:
        fields = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise jc.ConfigError(f"model: {source} is not readable JSON ({e}).") from e
    if not isinstance(fields, dict):
        raise jc.ConfigError(
            f"model: {source} must hold a JSON object of TransformerConfig fields."
        )
    allowed = [f.name for f in dataclasses.fields(TransformerConfig)]
    unknown = sorted(set(fields) - set(allowed))
    if unknown:
        raise jc.ConfigError(
            f"model: {source} has keys {unknown} that are not TransformerConfig fields; "
            f"allowed keys: {allowed}."
        )
    return TransformerConfig(**fields)


def _is_hf_dir(path: Path) -> bool:
    """A Hugging Face checkpoint folder: a config.json that names a model_type."""
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    try:  # unreadable JSON: not HF's; config_from_json then says what is wrong with it
        fields = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(fields, dict) and "model_type" in fields


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """What a model source resolves to: its config, params, (maybe) its tokenizer, and
    the end-of-sequence ids its generation config names (a Hugging Face folder's)."""

    config: TransformerConfig
    params: dict[str, Any]
    tokenizer_path: str | None = None
    eos_token_ids: tuple[int, ...] = ()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def hf_eos_token_ids(folder: Path) -> tuple[int, ...]:
    """The ids ``transformers``' ``generate`` stops at for the checkpoint in ``folder``:
    ``eos_token_id`` (one id or a list: Llama-3-Instruct lists two) of
    ``generation_config.json``, or of ``config.json`` when that file is absent
    (transformers derives the generation config from it then)."""
    source = folder / "generation_config.json"
    if not source.is_file():
        source = folder / "config.json"
    try:
        value = json.loads(source.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as e:
        raise jc.ConfigError(f"model: {source} is not a readable JSON object ({e}).") from e
    ids = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise jc.ConfigError(
            f"model: {source} has eos_token_id={value!r}; it must be a token id or a list "
            "of token ids (non-negative integers). Correct or remove it."
        )
    return tuple(ids)


def _from_registry(spec: str, config: TransformerConfig | None) -> ResolvedModel:
    """``registry:NAME@alias``: the experiments registry says where the weights are."""
    try:
        from jaxcore import registry
    except ImportError as e:  # the experiments extra (optuna, sqlalchemy) is missing
        raise jc.ConfigError(
            f"model {spec!r}: the model registry needs the experiments extra "
            f"(pip install 'jaxcore[experiments]'): {e}"
        ) from e
    if not hasattr(registry, "resolve"):
        raise jc.ConfigError(
            f"model {spec!r}: this jaxcore's registry has no resolve(); it cannot map "
            "'registry:NAME@alias' to weights yet. Pass the weights file instead."
        )
    entry = registry.resolve(spec.removeprefix("registry:"))
    cfg = config
    if cfg is None and getattr(entry, "config", None):
        cfg = TransformerConfig(**entry.config)
    cfg, params = load_safetensors(entry.weights_path, cfg)
    tokenizer = getattr(entry, "tokenizer_path", None)
    return ResolvedModel(cfg, params, None if tokenizer is None else str(tokenizer))


def resolve_model(
    source: Any, *, config: TransformerConfig | None = None, seed: int = 0
) -> ResolvedModel:
    """The one place a served model's source is interpreted.

    ``source`` is a params dict (with ``config=``), a `TrainState`, a ``.safetensors``
    file or its folder, ``registry:NAME@alias`` (the experiments registry), or a
    demo name from `REGISTRY` (a freshly initialised model).
    """
    if isinstance(source, jc.TrainState):
        source = source.params
    if isinstance(source, dict):
        if config is None:
            raise jc.ConfigError(
                "model: params were passed without config=TransformerConfig(...); the shapes "
                "alone do not say the rotary base or norm epsilon."
            )
        check_params_fit(
            config, source, "params", "Pass the TransformerConfig they were trained with."
        )
        return ResolvedModel(config, source)
    if isinstance(source, str | Path):
        text = str(source)
        if text.startswith("registry:"):
            return _from_registry(text, config)
        if text in REGISTRY:
            cfg = config or REGISTRY[text]()
            log.info("serving a freshly initialised %r model (seed %d)", text, seed)
            return ResolvedModel(cfg, init_params(cfg, seed))
        path = Path(source)
        if _is_hf_dir(path):  # config.json with a model_type: a Hugging Face checkpoint
            from jaxcore import hf

            cfg, params = hf.load(path)
            if config is not None and config != cfg:  # it was silently dropped
                raise jc.ConfigError(
                    f"model: {path} is a Hugging Face folder; its config.json sets the model "
                    "config, so config= (--config) cannot replace it. Drop it (to serve a "
                    "shorter context, use ServingConfig(max_len=...) or --max-len)."
                )
            # tokenizer.json, or a SentencePiece tokenizer.model that load_tokenizer converts
            has_tokenizer = any((path / name).is_file() for name in TOKENIZER_FILES)
            return ResolvedModel(
                cfg,
                params,
                str(path) if has_tokenizer else None,
                eos_token_ids=hf_eos_token_ids(path),
            )
        cfg, params = load_safetensors(path, config)
        return ResolvedModel(cfg, params)
    raise jc.ConfigError(
        f"model: got {type(source).__name__}; pass a registry name {sorted(REGISTRY)}, "
        "'registry:NAME@alias', a .safetensors path, a jaxcore TrainState, or a params dict "
        "with config=."
    )


def resolve(
    source: Any, *, config: TransformerConfig | None = None, seed: int = 0
) -> tuple[TransformerConfig, dict[str, Any]]:
    """``(config, params)`` of `resolve_model`."""
    model = resolve_model(source, config=config, seed=seed)
    return model.config, model.params

"""Where a served model's weights come from: a params pytree, a `TrainState`, a portable
safetensors file, or a registry name.

Every path ends in ``(TransformerConfig, params)`` with ``params`` the nested dict of
arrays that ``TrainState.params`` holds. The safetensors format is flat: keys are the
``/``-joined parameter paths and the config travels as JSON in the file's metadata
(``jaxcore_config``), so one file is a complete model. Loading stays small on purpose so
it can call ``jaxcore.checkpoint``'s portable export once that lands.
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
from jaxcore.models import Transformer, TransformerConfig

log = logging.getLogger(__name__)

CONFIG_KEY = "jaxcore_config"

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


def build_model(cfg: TransformerConfig, params: dict[str, Any]) -> Transformer:
    """A `Transformer` holding ``params`` (no initialisation is run)."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "/"))
        else:
            out[name] = np.ascontiguousarray(np.asarray(jax.device_get(value)))
    return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in flat.items():
        node = out
        *parents, leaf = name.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def save_safetensors(path: str | Path, cfg: TransformerConfig, params: dict[str, Any]) -> Path:
    """Write ``params`` and ``cfg`` to one portable safetensors file."""
    from safetensors.numpy import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        _flatten(params), str(path), metadata={CONFIG_KEY: json.dumps(dataclasses.asdict(cfg))}
    )
    return path


def load_safetensors(path: str | Path) -> tuple[TransformerConfig, dict[str, Any]]:
    """Read a file written by `save_safetensors` (or a folder with ``model.safetensors``
    and, when the file has no config metadata, ``config.json``)."""
    from safetensors import safe_open

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise jc.ConfigError(
            f"model: {path} does not exist. Pass a .safetensors file written by "
            f"inference.save_safetensors, or one of the registry names {sorted(REGISTRY)}."
        )
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata() or {}
        flat = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no iter)
    if CONFIG_KEY in meta:
        fields = json.loads(meta[CONFIG_KEY])
    elif (folder / "config.json").is_file():
        fields = json.loads((folder / "config.json").read_text())
    else:
        raise jc.ConfigError(
            f"model: {path} carries no '{CONFIG_KEY}' metadata and no config.json sits beside "
            "it; save with inference.save_safetensors or add a config.json of "
            "TransformerConfig fields."
        )
    return TransformerConfig(**fields), _unflatten(flat)


def resolve(
    source: Any, *, config: TransformerConfig | None = None, seed: int = 0
) -> tuple[TransformerConfig, dict[str, Any]]:
    """``(config, params)`` from a registry name, a file path, a `TrainState` or params."""
    if isinstance(source, jc.TrainState):
        source = source.params
    if isinstance(source, dict):
        if config is None:
            raise jc.ConfigError(
                "model: params were passed without config=TransformerConfig(...); the shapes "
                "alone do not say the rotary base or norm epsilon."
            )
        return config, source
    if isinstance(source, str | Path):
        if str(source) in REGISTRY:
            cfg = config or REGISTRY[str(source)]()
            log.info("serving a freshly initialised %r model (seed %d)", str(source), seed)
            return cfg, init_params(cfg, seed)
        return load_safetensors(source)
    raise jc.ConfigError(
        f"model: got {type(source).__name__}; pass a registry name {sorted(REGISTRY)}, a "
        ".safetensors path, a jaxcore TrainState, or a params dict with config=."
    )

"""Weights back to PyTorch (state dicts, safetensors) and torch weights into a train state.

`state_dict(state)` gathers a bridged model's parameters and buffers from a
`jaxcore.TrainState` and returns a torch ``state_dict`` with the module's own names,
shapes and dtypes; tied parameters come back as one tensor under every name (so
``load_state_dict`` keeps them tied). Safetensors files hold each tied tensor once and list
the ties in the header metadata (safetensors refuses shared storage, like
``safetensors.torch.save_model``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

import jaxcore as jc
from torchbridge.module import ModuleSpec, flatten, nest, spec_for, to_numpy

_TIES_KEY = "torchbridge.ties"


def _host(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _spec(params: Any, module: Any | None) -> ModuleSpec:
    if module is not None:
        return ModuleSpec.of(module)
    spec = spec_for(params)
    if spec is None:
        raise jc.ConfigError(
            "state_dict(state): these parameters do not come from a module bridged in this "
            "process; pass the torch module: state_dict(state, module)."
        )
    return spec


def _to_torch(a: np.ndarray, dtype: Any) -> Any:
    import torch

    if a.dtype.name == "bfloat16":
        a = a.astype(np.float32)
    # np.array, not np.ascontiguousarray: the latter turns 0-d arrays into shape (1,).
    return torch.from_numpy(np.array(a, order="C", copy=True)).to(dtype)


def state_dict(state: jc.TrainState | Any, module: Any | None = None) -> dict[str, Any]:
    """The torch ``state_dict`` of a bridged model in ``state`` (a TrainState).

    ``module`` (the torch module that was prepared) is needed only when the model was
    bridged in another process; otherwise the bridge remembers its names, dtypes and ties.
    """
    params, model_state = state.params, state.model_state
    spec = _spec(params, module)
    flat = {k: _host(v) for k, v in {**flatten(params), **flatten(model_state)}.items()}
    tensors: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for key in spec.state_dict_keys:
        name = spec.aliases.get(key, key)
        if name not in tensors:
            if name not in flat:
                raise jc.ConfigError(
                    f"state_dict: {name!r} is not in the train state; was it prepared from "
                    "this module?"
                )
            tensors[name] = _to_torch(flat[name], spec.dtypes[name])
        out[key] = tensors[name]
    return out


def save_safetensors(state_or_dict: Any, path: str | Path, module: Any | None = None) -> None:
    """Write a train state (or a torch state dict) to a safetensors file, ties kept once."""
    from safetensors.torch import save_file

    from jaxcore.checkpointing.portable import open_file_mode

    sd = state_or_dict if isinstance(state_or_dict, dict) else state_dict(state_or_dict, module)
    first: dict[tuple, str] = {}
    ties: dict[str, str] = {}
    unique: dict[str, Any] = {}
    for key, t in sd.items():
        # ``module.state_dict()`` returns tied parameters as distinct tensors on one storage.
        where = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and where in first:
            ties[key] = first[where]
            continue
        first[where] = key
        unique[key] = t.detach().contiguous()
    save_file(unique, str(path), metadata={_TIES_KEY: json.dumps(ties)})
    open_file_mode(path)


def load_safetensors(path: str | Path) -> dict[str, Any]:
    """A torch state dict from a safetensors file (tied names share one tensor again)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    sd = load_file(str(path))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    for key, target in json.loads(meta.get(_TIES_KEY, "{}")).items():
        sd[key] = sd[target]
    return dict(sd)


def load_state_dict(
    engine: jc.Engine, state: jc.TrainState, source: dict[str, Any] | str | Path
) -> jc.TrainState:
    """``state`` with parameters and buffers from a torch state dict or safetensors file.

    The arrays are placed with the engine's shardings; the optimizer state is kept.
    Names must match the bridged module's (tied names may be missing).
    """
    sd = load_safetensors(source) if isinstance(source, str | Path) else source
    flat_p, flat_s = flatten(state.params), flatten(state.model_state)

    def pick(flat: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for name, old in flat.items():
            if name not in sd:
                raise jc.ConfigError(f"load_state_dict: the weights have no {name!r}.")
            new = to_numpy(sd[name])
            if tuple(new.shape) != tuple(old.shape):
                raise jc.ConfigError(
                    f"load_state_dict: {name!r} has shape {tuple(new.shape)}, the model "
                    f"expects {tuple(old.shape)}."
                )
            out[name] = new.astype(old.dtype)
        return nest(out)

    shardings = engine.state_shardings
    params = jax.device_put(pick(flat_p), shardings.params)
    model_state = jax.device_put(pick(flat_s), shardings.model_state)
    return state.replace(params=params, model_state=model_state)

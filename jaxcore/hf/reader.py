"""Load a Hugging Face Llama / Mistral / Qwen2 directory into native parameters, sharded.

Each native parameter becomes a global ``jax.Array`` through
`jax.make_array_from_callback`: the callback runs only for this process's devices and
reads only that device's slice of each HF tensor through safetensors' lazy
``get_slice`` (a memory-mapped range read), transposed into the native layout. No
process reads, and no host or device holds, more than its shards (plus replicated
parameters such as norms). A sharded checkpoint (``model.safetensors.index.json``) opens
only the files holding the tensors a process needs. Levanter's ``HFCheckpointConverter``
and MaxText's conversion scripts convert whole checkpoints on one host first; this reads
straight into the training layout instead.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from safetensors import SafetensorError, safe_open

from jaxcore import sharding as shd
from jaxcore.adapters import from_nnx_factory
from jaxcore.errors import ConfigError
from jaxcore.hf import layout
from jaxcore.hf.config import config_from_hf, read_config
from jaxcore.models.transformer import Transformer, TransformerConfig

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def _framework() -> str:
    # bfloat16 has no NumPy dtype in safetensors' numpy backend; torch reads it, and
    # `_to_numpy` reinterprets the bits as ml_dtypes' bfloat16 without a float copy.
    try:
        import torch  # noqa: F401
    except ImportError:
        return "numpy"
    return "pt"


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    import ml_dtypes
    import torch

    if x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.contiguous().numpy()


class CheckpointFiles:
    """The safetensors files of a HF directory, opened lazily, by tensor name."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = pathlib.Path(directory)
        index = self.directory / INDEX_FILE
        # transformers' order: model.safetensors wins over an index next to it.
        if (self.directory / SINGLE_FILE).is_file():
            weight_map = None
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        else:
            raise ConfigError(
                f"{self.directory}: neither {SINGLE_FILE} nor {INDEX_FILE}. jaxcore.hf reads "
                "safetensors checkpoints (save_pretrained(..., safe_serialization=True)); "
                "convert .bin files with transformers first."
            )
        self._framework = _framework()
        self._open: dict[str, Any] = {}
        if weight_map is None:
            with self._safe_open(SINGLE_FILE) as f:
                weight_map = dict.fromkeys(f.keys(), SINGLE_FILE)
        missing = sorted({f for f in weight_map.values() if not (self.directory / f).is_file()})
        if missing:
            raise ConfigError(
                f"{self.directory}: {INDEX_FILE} lists files that are missing: {missing}. "
                "The download or copy is incomplete: download the checkpoint again (or copy "
                "the missing shards into the directory)."
            )
        self.weight_map: dict[str, str] = weight_map

    def _safe_open(self, file: str, **kwargs: Any) -> Any:
        try:
            return safe_open(str(self.directory / file), framework=self._framework, **kwargs)
        except (SafetensorError, OSError) as e:  # truncated, or not safetensors at all
            raise ConfigError(
                f"{self.directory / file}: not a readable safetensors file ({e}). It is "
                "probably truncated (an interrupted download or copy): download the "
                "checkpoint again."
            ) from e

    def _file(self, name: str) -> Any:
        file = self.weight_map[name]
        if file not in self._open:
            # pread, not mmap: a strided slice (columns of a row-major tensor) would touch
            # every page of the tensor and keep it resident until the file is closed.
            handle = self._safe_open(file, backend="pread")
            self._open[file] = handle.__enter__()
        return self._open[file]

    def get_slice(self, name: str) -> Any:
        try:
            return self._file(name).get_slice(name)
        except SafetensorError as e:  # the index names a file that lacks the tensor
            raise ConfigError(
                f"{self.directory / self.weight_map[name]}: has no tensor {name}, but "
                f"{INDEX_FILE} says it does ({e}). The index and the shards come from "
                "different checkpoints: download the checkpoint again."
            ) from e

    def close(self) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()


def _check_tensors(cfg: TransformerConfig, files: CheckpointFiles) -> None:
    """Every tensor the config needs is there with its shape (else a `ConfigError`); the
    ones it does not use are named in a warning, as transformers does, since a bias or
    layer the config does not declare is dropped from the model."""
    size = layout.sizes(cfg)
    wrong, missing, used = [], [], set()
    for m in layout.tensor_maps(cfg):
        names = [m.hf_name(i) for i in range(cfg.n_layers)] if m.stacked else [m.hf_name()]
        used.update(names)
        for name in names:
            if name not in files.weight_map:
                missing.append(name)
                continue
            shape = tuple(files.get_slice(name).get_shape())
            if shape != layout.hf_shape(m, size):
                wrong.append(f"{name} {shape} (expected {layout.hf_shape(m, size)})")
    if missing or wrong:
        raise ConfigError(
            f"{files.directory}: the checkpoint does not match its config.json: missing "
            f"{missing[:4]}{' ...' if len(missing) > 4 else ''}, wrong shapes {wrong[:4]}."
        )
    unused = sorted(n for n in files.weight_map if n not in used and not _skipped(n, cfg))
    if unused:
        log.warning(
            "%s: %d tensors in the checkpoint are not used by this config (%s%s); they are "
            "not loaded. If the model needs them, its config.json is missing the setting "
            "that declares them (e.g. attention_bias).",
            files.directory,
            len(unused),
            ", ".join(unused[:4]),
            " ..." if len(unused) > 4 else "",
        )


def _skipped(name: str, cfg: TransformerConfig) -> bool:
    """Tensors every loader skips: rotary tables older exports saved, and the output
    projection of a tied model (some exports write it beside the embedding)."""
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


def read_slice(
    m: layout.TensorMap,
    files: CheckpointFiles,
    index: layout.Index,
    size: dict[str, int],
    dtype: Any,
) -> np.ndarray:
    """The native slice ``index`` of parameter ``m`` (layer axis first when stacked)."""

    def one(name: str, sub: layout.Index) -> np.ndarray:
        read, view, rest = layout.hf_read_plan(m, sub, size)
        block = _to_numpy(files.get_slice(name)[read])
        out = layout.to_native(m, block, view, rest)
        return out if dtype is None else out.astype(dtype, copy=False)

    if not m.stacked:
        return np.ascontiguousarray(one(m.hf_name(), index))
    layers = range(*index[0].indices(size["l"]))
    out = None
    for j, layer in enumerate(layers):  # filled in place: one layer's slice extra, not 2x
        part = one(m.hf_name(layer), index[1:])
        if out is None:
            out = np.empty((len(layers), *part.shape), part.dtype)
        out[j] = part
    return out


def _place(
    m: layout.TensorMap, files: CheckpointFiles, size: dict[str, int], dtype: Any, sharding: Any
) -> jax.Array:
    """One parameter as a global array: this process's devices, each slice read once.

    Like `jax.make_array_from_callback`, but devices holding the same slice (replicas)
    share one read, and each host slice is dropped as soon as it is on its devices, so
    host memory holds one slice at a time beyond what the devices hold.
    """
    shape = tuple(size[c] for c in ("l" * m.stacked) + m.native_dims)
    placement = sharding.addressable_devices_indices_map(shape)
    by_index: dict[tuple, list[Any]] = {}
    for device, index in placement.items():
        key = tuple(s.indices(n) for s, n in zip(index, shape, strict=True))
        by_index.setdefault(key, [index]).append(device)
    on_device = {}
    for index, *devices in by_index.values():
        host = read_slice(m, files, index, size, dtype)
        on_device |= {d: jax.device_put(host, d) for d in devices}
        del host
    arrays = [on_device[d] for d in placement]
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _abstract(cfg: TransformerConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    adapter = from_nnx_factory(lambda rngs: Transformer(cfg, rngs=rngs))
    return adapter.abstract[0], adapter.logical_axes


def param_shardings(cfg: TransformerConfig, target: Any) -> dict[str, Any]:
    """Where each native parameter goes: for a jaxcore ``Mesh`` (``DEFAULT_RULES``,
    parameters sharded as ZeRO-3 does), an `Engine` (its rules, ``param_rules`` and ZeRO
    stage), or a plan object with a ``params`` tree of shardings."""
    from jaxcore.engine import Engine

    abstract, logical = _abstract(cfg)
    if isinstance(target, Engine):
        if target.state_shardings is not None and set(target.state_shardings.params) == set(
            abstract
        ):
            return target.state_shardings.params
        names = shd.name_params(abstract, logical, target.config.param_rules)
        return shd.plan(abstract, names, target.mesh, target.rules, target.config.zero).params
    if isinstance(target, Mesh):
        rules = shd.validate_rules(shd.DEFAULT_RULES, target.axis_names)
        names = shd.name_params(abstract, logical)
        return shd.plan(abstract, names, target, rules, zero=3).params
    # A TrainPlan (its .shardings) or a ShardingPlan (.params) for this model.
    params = getattr(getattr(target, "shardings", target), "params", None)
    if isinstance(params, dict) and set(params) == set(abstract):
        return params
    raise ConfigError(
        f"jaxcore.hf.load(plan_or_mesh=...): got {type(target).__name__}; pass None (host "
        "arrays), a jaxcore mesh (jc.build_mesh), a jc.Engine, or a plan whose .params are "
        "the model's shardings."
    )


# The float dtypes a safetensors checkpoint holds that a Transformer computes in.
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_dtype(value: Any, where: str) -> Any:
    """``value`` as a NumPy float dtype (``None`` for ``None`` or ``"auto"``: keep each
    tensor's own); anything else (``"bf16"``, ``"int8"``, a typo) is a `ConfigError`."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return None
    import jax.numpy as jnp

    try:
        d = np.dtype(jnp.dtype(value))
    except TypeError:
        d = None
    if d is None or d.name not in FLOAT_DTYPES:
        raise ConfigError(
            f"{where}(dtype={value!r}): not a float dtype a checkpoint holds; use 'auto' "
            f"(the checkpoint's own) or one of {list(FLOAT_DTYPES)}, e.g. dtype='bfloat16'."
        )
    return d


def _dtype(value: Any) -> Any:
    return check_dtype(value, "jaxcore.hf.load")


def load(
    path_or_dir: str | os.PathLike,
    plan_or_mesh: Any = None,
    *,
    dtype: Any = "float32",
) -> tuple[TransformerConfig, dict[str, Any]]:
    """Read a HF Llama / Mistral / Qwen2 directory: ``(config, params)``.

    ``plan_or_mesh``: ``None`` gives host NumPy arrays (the whole model, for one host);
    a jaxcore mesh, a `jc.Engine` or a plan gives global ``jax.Array``s in that layout,
    each process reading only its own slices. ``dtype`` converts on load (``"auto"``
    keeps the checkpoint's). ``params`` has the keys of ``Transformer``'s parameters.
    """
    directory = pathlib.Path(path_or_dir)
    if directory.is_file():
        directory = directory.parent
    cfg = config_from_hf(read_config(directory))
    files = CheckpointFiles(directory)
    size = layout.sizes(cfg)
    want = _dtype(dtype)
    try:
        _check_tensors(cfg, files)
        maps = layout.tensor_maps(cfg)
        if plan_or_mesh is None:
            full = {
                m.native: tuple(slice(None) for _ in range(m.stacked + len(m.native_dims)))
                for m in maps
            }
            params = {m.native: read_slice(m, files, full[m.native], size, want) for m in maps}
            return cfg, params
        shardings = param_shardings(cfg, plan_or_mesh)
        params = {m.native: _place(m, files, size, want, shardings[m.native]) for m in maps}
        return cfg, params
    finally:
        files.close()

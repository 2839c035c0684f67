"""Write native parameters as a Hugging Face checkpoint: safetensors + ``config.json``.

The output is what ``save_pretrained`` writes for the same model (tensor names, the
``(out, in)`` layouts, ``{"format": "pt"}`` metadata, shards over ``max_shard_bytes`` with
``model.safetensors.index.json``), so ``transformers.AutoModelForCausalLM.from_pretrained``
loads it. Files are streamed: the header is computed from the shapes first, then each
parameter is gathered to the host (every process joins the gather of a sharded array;
process 0 writes) and its layers written one by one, so host memory peaks at one
parameter, never the model.
"""

from __future__ import annotations

import errno
import json
import math
import os
import pathlib
import shutil
import struct
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from jaxcore.errors import ConfigError
from jaxcore.hf import layout
from jaxcore.hf.config import config_to_hf
from jaxcore.hf.reader import INDEX_FILE, SINGLE_FILE, check_dtype
from jaxcore.models.transformer import TransformerConfig

# safetensors' dtype codes for what native parameters hold.
_CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64"}
DEFAULT_SHARD_BYTES = 5 * 2**30  # save_pretrained's default max_shard_size ("5GB")
CONFIG_FILE = "config.json"
_SHARD_GLOB = "model-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].safetensors"


def _host(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def _entries(cfg: TransformerConfig) -> list[tuple[str, layout.TensorMap | None, int | None]]:
    out = []
    for m in layout.tensor_maps(cfg):
        layers = range(cfg.n_layers) if m.stacked else [None]
        out += [(m.hf_name(i), m, i) for i in layers]
    return out


def _header(names: list[str], shapes: dict, dtypes: dict) -> tuple[bytes, dict[str, tuple]]:
    table: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, spans = 0, {}
    for name in names:
        n = math.prod(shapes[name]) * np.dtype(dtypes[name]).itemsize
        table[name] = {
            "dtype": _CODES[np.dtype(dtypes[name]).name],
            "shape": list(shapes[name]),
            "data_offsets": [offset, offset + n],
        }
        spans[name] = (offset, offset + n)
        offset += n
    raw = json.dumps(table, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw, spans


def save(
    params: dict[str, Any],
    config: TransformerConfig,
    directory: str | os.PathLike,
    *,
    dtype: Any = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    extra_tensors: dict[str, Any] | None = None,
    config_updates: dict[str, Any] | None = None,
    tokenizer: str | os.PathLike | None = None,
) -> pathlib.Path:
    """Write ``params`` (a `Transformer`'s, host or sharded) as a HF model directory.

    ``dtype`` converts every tensor (e.g. ``"bfloat16"``); by default each keeps its own.
    Returns the directory. Every process must call it (sharded arrays are gathered).
    Weight files of an earlier save into ``directory`` (``model.safetensors``, the index,
    ``model-*-of-*.safetensors``) are removed, so that no stale weights shadow these; its
    ``config.json`` goes first and the new one is written last, so a save that fails
    midway leaves a directory that does not load (never old and new weights mixed).

    ``extra_tensors`` (HF name -> array) are written after the model's own, and
    ``config_updates`` override keys of the written ``config.json``: a model with another
    head (``rlhf.export_reward_model``: ``score.weight`` and ``*ForSequenceClassification``).

    ``tokenizer`` (a model folder, or a ``tokenizer.json`` / ``tokenizer.model`` path)
    copies its tokenizer files along, as ``tokenizer.save_pretrained`` would write them,
    so ``AutoTokenizer.from_pretrained(directory)`` loads it (without them transformers
    5 builds an empty tokenizer for a Qwen2 folder, silently).
    """
    directory = pathlib.Path(directory)
    dtype = check_dtype(dtype, "jaxcore.hf.save")
    tokenizer_files = _tokenizer_files(tokenizer)
    if (
        isinstance(max_shard_bytes, bool)
        or not isinstance(max_shard_bytes, int | np.integer)
        or max_shard_bytes < 1
    ):
        raise ConfigError(
            f"jaxcore.hf.save(max_shard_bytes={max_shard_bytes!r}): give the largest file "
            "size as a number of bytes >= 1, e.g. 5 * 2**30 (save_pretrained's '5GB')."
        )
    size = layout.sizes(config)
    maps = {m.native: m for m in layout.tensor_maps(config)}
    unknown, missing = sorted(set(params) - set(maps)), sorted(set(maps) - set(params))
    if unknown or missing:
        raise ConfigError(
            f"jaxcore.hf.save: params do not match the config: missing {missing}, unknown "
            f"{unknown}. Pass TrainState.params of a Transformer built with this config"
            + (
                " (LoRA adapters: fold them in first with rlhf.lora.merged_params(params, "
                "lora_config))."
                if "lora" in unknown
                else "."
            )
        )
    # Before anything is written: a config of another size would otherwise stop midway in
    # a reshape, or (fewer layers) write a model that silently drops the rest.
    wrong = [
        f"{k} {tuple(params[k].shape)} (the config needs {layout.native_shape(m, size)})"
        for k, m in maps.items()
        if tuple(params[k].shape) != layout.native_shape(m, size)
    ]
    if wrong:
        raise ConfigError(
            f"jaxcore.hf.save: params do not fit the config: {', '.join(wrong[:4])}"
            f"{' ...' if len(wrong) > 4 else ''}. Give the config of the model these params "
            "were trained with (jaxcore export: its --config)."
        )
    out_dtype = {
        k: np.dtype(jnp.dtype(dtype if dtype is not None else v.dtype)) for k, v in params.items()
    }
    extra = {k: _host(v) for k, v in (extra_tensors or {}).items()}
    entries = _entries(config)
    shapes = {name: layout.hf_shape(m, size) for name, m, _ in entries}
    dtypes = {name: out_dtype[m.native] for name, m, _ in entries}
    for name, value in extra.items():
        shapes[name] = value.shape
        dtypes[name] = np.dtype(jnp.dtype(dtype if dtype is not None else value.dtype))
    entries += [(name, None, None) for name in extra]
    for name, d in dtypes.items():
        if d.name not in _CODES:
            raise ConfigError(f"jaxcore.hf.save: {name} has dtype {d}; use one of {list(_CODES)}.")

    # Split into files of at most max_shard_bytes (a tensor never straddles two).
    files: list[list[str]] = [[]]
    used = 0
    for name, _, _ in entries:
        n = math.prod(shapes[name]) * dtypes[name].itemsize
        if files[-1] and used + n > max_shard_bytes:
            files.append([])
            used = 0
        files[-1].append(name)
        used += n
    if len(files) == 1:
        file_names = [SINGLE_FILE]
    else:
        file_names = [
            f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))
        ]
    where = {name: file_names[i] for i, names in enumerate(files) for name in names}
    by_name = {name: (m, layer) for name, m, layer in entries}

    writer = jax.process_index() == 0
    if writer:
        _begin(directory)
    cached: tuple[str, np.ndarray] | None = None
    for file_name, names in zip(file_names, files, strict=True):
        header, _ = _header(names, shapes, dtypes)
        handle = open(directory / file_name, "wb") if writer else None  # noqa: SIM115
        try:
            if handle:
                handle.write(header)
            for name in names:
                m, layer = by_name[name]
                if m is None:  # an extra tensor, already on the host
                    if handle:
                        handle.write(np.ascontiguousarray(extra[name], dtypes[name]).tobytes())
                    continue
                if cached is None or cached[0] != m.native:
                    cached = (m.native, _host(params[m.native]))  # one parameter at a time
                native = cached[1] if layer is None else cached[1][layer]
                if handle:
                    handle.write(layout.to_hf(m, native.astype(dtypes[name]), size).tobytes())
        finally:
            if handle:
                handle.close()
    if writer:
        # Weights of an earlier save in another file layout would shadow these: transformers
        # reads a model.safetensors before an index, and an index names its own shards.
        stale = [SINGLE_FILE, INDEX_FILE, *(p.name for p in directory.glob(_SHARD_GLOB))]
        for name in sorted(set(stale) - set(file_names)):
            (directory / name).unlink(missing_ok=True)
        if len(file_names) > 1:
            total = sum(math.prod(shapes[n]) * dtypes[n].itemsize for n in shapes)
            index = {"metadata": {"total_size": total}, "weight_map": where}
            _write_atomic(directory / INDEX_FILE, json.dumps(index, indent=2))
        kinds = {d.name for d in dtypes.values()}
        hf_config = config_to_hf(config, dtype=kinds.pop() if len(kinds) == 1 else "float32")
        hf_config.update(config_updates or {})
        for source in tokenizer_files:  # before config.json, which marks a complete save
            target = directory / source.name
            if not (target.exists() and target.samefile(source)):
                partial = target.with_name(target.name + ".partial")
                shutil.copyfile(source, partial)
                os.replace(partial, target)
        _write_atomic(directory / CONFIG_FILE, json.dumps(hf_config, indent=2) + "\n")
    return directory


# What tokenizer.save_pretrained writes (fast and slow tokenizers, chat template).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def _tokenizer_files(tokenizer: str | os.PathLike | None) -> list[pathlib.Path]:
    """The tokenizer files to copy for ``tokenizer=`` (a folder or a file in one)."""
    if tokenizer is None:
        return []
    path = pathlib.Path(tokenizer)
    folder = path if path.is_dir() else path.parent
    found = [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    if not path.exists() or not found or (path.is_file() and path.name not in TOKENIZER_FILES):
        raise ConfigError(
            f"jaxcore.hf.save(tokenizer={str(tokenizer)!r}): not a tokenizer folder or file "
            f"(none of {', '.join(TOKENIZER_FILES[:2])}, ... there); give the folder of the "
            "model you fine-tuned, e.g. tokenizer='Qwen2-0.5B/'."
        )
    return found


def _begin(directory: pathlib.Path) -> None:
    """Create ``directory`` and remove its ``config.json`` before any weight is written.

    The new config is written last (`_write_atomic`), so it marks a complete save: a save
    that fails or is killed midway (disk full, preempted) leaves a directory that neither
    transformers nor `jaxcore.hf.load` loads, instead of new shards mixed with the earlier
    save's, which the old index and config would load together.
    """
    if directory.exists() and not directory.is_dir():  # mkdir's bare "File exists" misled
        raise NotADirectoryError(
            errno.ENOTDIR,
            "a file is there, not a folder: give hf.save a folder path",
            str(directory),
        )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).unlink(missing_ok=True)


def _write_atomic(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a sibling file, then a rename)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)

"""Portable weights: parameters to and from one safetensors file.

This is how users leave the framework or bring weights in. Names are the flattened
parameter paths joined with dots (``layers.wq``); the file's metadata holds, under the
key ``jaxcore``, a JSON map from each name to its logical axes and dtype, plus the step
it came from. Loading places each tensor straight into the current mesh's shards with
`jax.make_array_from_callback` reading slices through ``safe_open`` (so no device, and
with several hosts no host, holds more than its part of a sharded parameter).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from jaxcore import sharding as shd
from jaxcore.errors import ConfigError

SEP = "."


def open_file_mode(path: str | os.PathLike) -> None:
    """Give ``path`` the mode `open` gives a new file (0o666 less the umask).

    safetensors writes its files 0600, so a file exported for a server or a colleague
    running as another user could not be read. The umask is read back the way pip's
    ``current_umask`` does (set, then restore at once).
    """
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _flat(tree: Any) -> dict[str, Any]:
    return {
        shd.path_str(p).replace("/", SEP): x
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def save_params(
    params: Any,
    path: str | os.PathLike,
    *,
    logical_axes: dict[str, Any] | None = None,
    step: int | None = None,
    model_config: dict[str, Any] | None = None,
) -> pathlib.Path:
    """Write a parameter tree (arrays or NumPy) to one safetensors file (process 0 writes).

    ``logical_axes`` maps ``a/b`` paths (as in a checkpoint record) to axis-name lists;
    ``model_config`` (JSON-able fields of the model's config) makes the file a complete
    model that a server can load without being told its shape.
    """
    path = _path(path)
    tensors = {k: np.ascontiguousarray(jax.device_get(v)) for k, v in _flat(params).items()}
    axes = {(k or "").replace("/", SEP): v for k, v in (logical_axes or {}).items()}
    info = {
        "step": step,
        "model_config": model_config,
        "tensors": {
            k: {"dtype": str(v.dtype), "shape": list(v.shape), "logical_axes": axes.get(k)}
            for k, v in tensors.items()
        },
    }
    if jax.process_index() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(tmp), metadata={"format": "np", "jaxcore": json.dumps(info)})
        open_file_mode(tmp)
        os.replace(tmp, path)
    return path


def export_checkpoint(step_dir: str | os.PathLike, path: str | os.PathLike) -> pathlib.Path:
    """Export the parameters of the checkpoint in ``step_dir`` (a ``<dir>/<step>``).

    Needs no model or engine: shapes and logical axes come from the step's record, and
    only the ``params`` subtree is read (Orbax partial restore into NumPy arrays).
    """
    # Absolute: Orbax restores only from an absolute path (a relative one was its
    # ValueError, e.g. from `jaxcore export --hf runs/x/100 ...` or a registry register).
    step_dir = _path(step_dir).absolute()
    if not (step_dir / "meta" / "metadata").is_file():
        raise ConfigError(_not_a_step(step_dir))
    record = json.loads((step_dir / "meta" / "metadata").read_text())
    leaves = {k: v for k, v in record["leaves"].items() if k.startswith("params/")}
    if not leaves:
        raise ConfigError(f"{step_dir} records no parameters; is it a jaxcore checkpoint?")
    target: dict[str, Any] = {}
    for key, (shape, dtype) in leaves.items():
        node = target
        parts = key.split("/")[1:]
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    # This process alone reads (a registry export is host-local: under several processes
    # only process 0 runs it); the default options would wait at Orbax's barriers for all.
    me = jax.process_index()
    mp = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    handler = ocp.PyTreeCheckpointHandler(multiprocessing_options=mp)
    with ocp.Checkpointer(handler, multiprocessing_options=mp) as ckptr:
        out = ckptr.restore(
            step_dir / "state",
            args=ocp.args.PyTreeRestore(
                item={"params": target},
                restore_args={"params": restore_args},
                partial_restore=True,
            ),
        )
    axes = {k.removeprefix("params/"): v for k, v in (record.get("logical_axes") or {}).items()}
    return save_params(out["params"], path, logical_axes=axes, step=record.get("step"))


def _path(path: str | os.PathLike) -> pathlib.Path:
    """``path`` with ``~`` expanded (a shell does that for a command line, not for Python)."""
    return pathlib.Path(path).expanduser()


@contextlib.contextmanager
def _open(path: str | os.PathLike) -> Iterator[Any]:
    """``safe_open`` of ``path``; a file that is not safetensors is a `ConfigError`."""
    path = _path(path)
    try:
        f = safe_open(str(path), framework="numpy")
    except SafetensorError as e:
        raise ConfigError(
            f"{path} is not a safetensors file ({e}); pass a file written by "
            "jaxcore.export_checkpoint or jaxcore.save_params, or any *.safetensors."
        ) from None
    with f:
        yield f


def _steps(directory: pathlib.Path) -> list[int]:
    """The finalized steps (``<directory>/<int>/``) of a checkpoint directory."""
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit() and p.is_dir())
    except OSError:
        return []


def _not_a_step(step_dir: pathlib.Path) -> str:
    """Why ``step_dir`` cannot be exported, and which paths can (a run directory given
    instead of one of its steps, a step that retention removed, a typo)."""
    if steps := _steps(step_dir):
        return (
            f"{step_dir} is a checkpoint directory, not one of its steps: pass a step, "
            f"e.g. {step_dir / str(steps[-1])} (its steps: {steps})."
        )
    parent = step_dir.parent
    if not step_dir.exists():
        if steps := _steps(parent):
            return (
                f"{step_dir} does not exist (deleted by keep_last/keep_best, or a typo); "
                f"the steps in {parent} are {steps}: pass one, e.g. {parent / str(steps[-1])}."
            )
        return f"{step_dir} does not exist; pass a checkpoint step directory (<directory>/<step>)."
    return (
        f"{step_dir} is not a finalized jaxcore checkpoint step (it has no meta/metadata); "
        "pass a <directory>/<step> folder that a Checkpointer wrote."
    )


def read_info(path: str | os.PathLike) -> dict[str, Any]:
    """The ``jaxcore`` metadata of a file written by `save_params` (``{}`` if foreign)."""
    with _open(path) as f:
        meta = f.metadata() or {}
    return json.loads(meta["jaxcore"]) if "jaxcore" in meta else {}


def read_params(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every tensor of a safetensors file as a nested dict of NumPy arrays, and its info.

    For tools without an engine (a server, a converter); `load_params` is the sharded way.
    """
    params: dict[str, Any] = {}
    with _open(path) as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
            node = params
            *parents, leaf = name.split(SEP)
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = f.get_tensor(name)
    return params, read_info(path)


def load_params(path: str | os.PathLike, engine: Any) -> Any:
    """Read a safetensors file into ``engine``'s parameter tree, sharded on its mesh.

    ``engine`` must be prepared (``engine.prepare`` or ``Checkpointer.abstract_state``).
    Names, shapes and dtypes must match the model's; mismatches raise `ConfigError`
    naming every offending tensor.
    """
    if engine.state_shardings is None:
        raise ConfigError("load_params: call engine.prepare(model, optimizer) first.")
    shardings = engine.state_shardings.params
    abstract = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(
            s.shape, engine.policy.param_dtype if np.issubdtype(s.dtype, np.floating) else s.dtype
        ),
        engine.model.abstract[0],
        shardings,
    )
    flat_abs = _flat(abstract)
    flat_sh = _flat(shardings)
    with _open(path) as f:
        names = set(f.keys())
        missing = sorted(set(flat_abs) - names)
        extra = sorted(names - set(flat_abs))
        if missing or extra:
            raise ConfigError(
                f"{path}: tensors {missing[:5]} are missing and {extra[:5]} are unknown "
                f"to this model (expected names like {sorted(flat_abs)[:3]})."
            )
        slices = {name: f.get_slice(name) for name in flat_abs}
        wrong = [
            f"{name} {tuple(sl.get_shape())} (the model: {tuple(flat_abs[name].shape)})"
            for name, sl in slices.items()
            if tuple(sl.get_shape()) != tuple(flat_abs[name].shape)
        ]
        if wrong:
            raise ConfigError(
                f"{path}: {len(wrong)} tensors have another shape than this model's: "
                f"{', '.join(wrong[:5])}{', ...' if len(wrong) > 5 else ''}. Load it into "
                "the model configuration it was saved from."
            )
        out = {}
        for name, want in flat_abs.items():
            sl = slices[name]
            dtype = np.dtype(want.dtype)
            out[name] = jax.make_array_from_callback(
                want.shape, flat_sh[name], lambda idx, sl=sl, dt=dtype: np.asarray(sl[idx], dt)
            )
    leaves = [out[k] for k in flat_abs]
    return jax.tree.unflatten(jax.tree.structure(abstract), leaves)

"""Model registry: named models, numbered versions, aliases, `load` and `resolve`.

Registering a checkpoint as a version exports its parameters to
``<registry_dir>/<name>/v<N>/model.safetensors`` (`jaxcore.export_checkpoint`), so the
version outlives checkpoint retention and loads without the training code. Versions
are numbered 1, 2, ... per model; aliases (``production``, ``staging``) point at one
version each and move when set again (MLflow's aliases, Determined's model registry).
A version's files appear all at once (written aside, then renamed into ``v<N>``); a
registration killed midway keeps its number but is never resolved.

A version is self-describing: its metadata holds the model config (recorded with the
checkpoint by the trial, ``ctx.model_config``, or given to `Registry.register`), the
tokenizer (copied next to the weights) where there is one, and its lineage (store,
experiment, trial, step, hyperparameters, metrics), so `resolve` gives everything an
inference engine needs from a name alone::

    reg = Registry("sqlite:///runs/jaxcore.db")
    reg.create_model("tiny-lm", description="byte-level LM")
    v = reg.register("tiny-lm", checkpoint=ckpt_id, aliases=["staging"])
    params = jaxcore.registry.load("tiny-lm", "staging", db="sqlite:///runs/jaxcore.db")
    m = jaxcore.registry.resolve("registry:tiny-lm@staging", db="sqlite:///runs/jaxcore.db")
    llm = inference.LLM(m.weights_path, config=TransformerConfig(**m.config))
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
import uuid
from typing import Any

import sqlalchemy as sa

from jaxcore.errors import ConfigError
from jaxcore.experiments.store import MAX_ROW_ID, Store

DEFAULT_DB = "sqlite:///experiments/jaxcore.db"
PREFIX = "registry:"


# A model name is a folder under the registry directory: one path component the
# filesystem takes (255 bytes, less room for the store's 200-character column).
MAX_NAME_BYTES = 200
MAX_ALIAS_CHARS = 100


def _name_problem(name: str) -> str | None:
    """What makes ``name`` unusable as a model's folder and ``NAME@REF``, or ``None``."""
    if not name.strip():
        return "is empty or blank"
    if name != name.strip():
        return "has leading or trailing spaces"
    bad = [c for c in ("/", "\\", "@", "\0") if c in name]
    if bad:
        return f"contains {bad[0]!r}"
    if name in (".", ".."):
        return "is a relative path"
    if len(name.encode()) > MAX_NAME_BYTES:
        return f"is over {MAX_NAME_BYTES} bytes of UTF-8"
    return None


def check_model_name(name: str) -> None:
    """Refuse a name that is not one folder name or that ``NAME@REF`` cannot spell.

    ``a/b`` or ``../x`` would put the version's files outside its own folder (``../x``
    outside the registry), a name over ``MAX_NAME_BYTES`` fails on disk after the version
    row is written, and ``@`` splits ``registry:NAME@REF`` in the wrong place.
    """
    problem = _name_problem(name)
    if problem:
        raise ConfigError(
            f"model name {name[:60]!r} {problem}; use one folder name without '/', '\\' or "
            f"'@', at most {MAX_NAME_BYTES} bytes (e.g. tiny-lm or 小模型-v2)."
        )


def check_alias(alias: str) -> None:
    """Refuse an alias that a version reference would read as something else.

    ``registry:NAME@3`` and ``@latest`` mean version 3 and the newest version, so an
    alias spelled ``3`` or ``latest`` could be set but never resolved.
    """
    if not alias.strip() or alias.isdigit() or alias == "latest" or "@" in alias:
        raise ConfigError(
            f"alias {alias!r} cannot be told apart from a version number, 'latest' or the "
            "NAME@REF separator; use a word such as production or staging."
        )
    if len(alias) > MAX_ALIAS_CHARS:
        raise ConfigError(f"alias {alias[:40]!r}... is over {MAX_ALIAS_CHARS} characters.")


def default_url() -> str:
    """``$JAXCORE_DB``, else ``$JAXCORE_DB_URL``, else ``experiments/jaxcore.db`` here."""
    return os.environ.get("JAXCORE_DB") or os.environ.get("JAXCORE_DB_URL") or DEFAULT_DB


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A registered version, ready to load.

    Attributes:
        weights_path: the version's ``model.safetensors`` (absolute).
        config: the model config's fields (``TransformerConfig(**config)``).
        tokenizer_path: the tokenizer file stored with the version, or ``None`` (bytes).
        lineage: where it came from: store, experiment, trial, step, hparams, metrics.
    """

    weights_path: str
    config: dict[str, Any]
    tokenizer_path: str | None
    lineage: dict[str, Any]


def metric_rank(value: Any, smaller_is_better: bool) -> tuple[int, float]:
    """Sort key of a metric, best first: finite values in the metric's direction, then the
    infinities, then NaN, then a missing value. NaN compares false with everything, so a
    plain sort would leave it anywhere; the searchers rank a diverged trial last too
    (`jaxcore.experiments.searchers.base.SearchMethod.value`)."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return (3, 0.0)
    if math.isnan(value):
        return (2, 0.0)
    return (0 if math.isfinite(value) else 1, value if smaller_is_better else -value)


class Registry:
    """Registry operations on one store; files go to ``directory`` (default: next to
    the SQLite file, or ``./registry`` for a server database)."""

    def __init__(self, db: str | Store | None = None, *, directory: str | None = None):
        self.store = db if isinstance(db, Store) else Store(db or default_url())
        if directory is None:
            url = self.store.url
            base = os.path.dirname(url.removeprefix("sqlite:///")) if self.store.is_sqlite else "."
            directory = os.path.join(base or ".", "registry")
        self.directory = pathlib.Path(directory).absolute()

    def _model(self, name: str) -> dict[str, Any]:
        model = self.store.model(name)
        if model is None:
            raise ConfigError(
                f"model {name!r} is not registered; create it with 'jaxcore model create {name}'."
            )
        return model

    def create_model(
        self,
        name: str,
        *,
        description: str = "",
        metadata: dict | None = None,
        tags: list[str] | None = None,
    ) -> int:
        check_model_name(name)
        exists = ConfigError(f"model {name!r} already exists; register a version instead.")
        if self.store.model(name) is not None:
            raise exists
        try:
            return self.store.create_model(name, description, metadata, tags)
        except sa.exc.IntegrityError:
            # Another command created the name between the check and this insert.
            if self.store.model(name) is not None:
                raise exists from None
            raise

    def register(
        self,
        name: str,
        *,
        checkpoint: int | str,
        description: str = "",
        metadata: dict | None = None,
        tags: list[str] | None = None,
        aliases: list[str] | tuple[str, ...] = (),
        model_config: dict[str, Any] | None = None,
        tokenizer: str | None = None,
    ) -> int:
        """Add ``checkpoint`` (a store checkpoint id, or a checkpoint step directory) as the
        next version of ``name``; returns the version number.

        ``model_config`` / ``tokenizer`` default to what the trial recorded with the
        checkpoint; either way they are stored with the version (see the module doc).
        """
        model = self._model(name)
        check_model_name(name)  # a model created before names were checked
        for alias in aliases:
            check_alias(alias)
        ckpt_row = None
        if isinstance(checkpoint, int) or str(checkpoint).isdigit():
            in_range = 0 <= int(checkpoint) <= MAX_ROW_ID
            ckpt_row = self.store.checkpoint(int(checkpoint)) if in_range else None
            if ckpt_row is None or ckpt_row["state"] != "COMPLETED":
                raise ConfigError(
                    f"checkpoint {checkpoint} does not exist (or was deleted by "
                    "retention); list them with 'jaxcore experiment describe'."
                )
            src = pathlib.Path(ckpt_row["path"])
        else:
            # Absolute: Orbax refuses a relative path (a ValueError traceback from the
            # CLI's `model register NAME runs/x/100`), and the lineage records where it was.
            src = pathlib.Path(checkpoint).absolute()
        if not src.is_dir():
            raise ConfigError(
                f"checkpoint directory {src} does not exist"
                + (f" (the store's checkpoint {ckpt_row['id']} points at it)." if ckpt_row else ".")
            )
        if not (src / "state.json").is_file() and not (src / "meta" / "metadata").is_file():
            raise ConfigError(
                f"{src} is not a checkpoint step directory (it has neither state.json nor "
                "meta/metadata); pass one step's folder, e.g. runs/demo/1000 as written by "
                "jaxcore.Checkpointer, or a checkpoint id from 'jaxcore experiment describe'."
            )
        recorded = (ckpt_row or {}).get("meta") or {}
        model_config = model_config if model_config is not None else recorded.get("model_config")
        tokenizer = tokenizer if tokenizer is not None else recorded.get("tokenizer")
        if tokenizer is not None and not pathlib.Path(tokenizer).is_file():
            raise ConfigError(f"tokenizer {tokenizer} does not exist.")
        meta = {
            **_absolute_dataset(metadata or {}),
            "model_config": model_config,
            # The data lineage the trial recorded (dataset version, manifest and
            # tokenizer hashes, code version) travels with the version.
            "lineage": {**self._lineage(ckpt_row, src), **(recorded.get("lineage") or {})},
        }
        # The number is assigned by the store (atomically); the files follow.
        version = self.store.add_version(
            model["id"],
            checkpoint_id=ckpt_row["id"] if ckpt_row else None,
            path="",
            description=description,
            meta=meta,
            tags=tags or [],
            metrics=(ckpt_row or {}).get("metrics"),
        )
        try:
            path = self._write_files(name, version, src, meta, model_config, tokenizer)
        except BaseException:
            # No version without its files: a row with no weights would resolve and fail.
            self.store.delete_version(model["id"], version)
            raise
        from jaxcore.experiments import store as st

        self.store._run(
            lambda c: c.execute(
                st.model_versions.update()
                .where(
                    st.model_versions.c.model_id == model["id"],
                    st.model_versions.c.version == version,
                )
                .values(path=str(path), meta=meta)
            )
        )
        for alias in aliases:
            self.set_alias(name, alias, version)
        return version

    def _write_files(
        self,
        name: str,
        version: int,
        src: pathlib.Path,
        meta: dict[str, Any],
        model_config: dict[str, Any] | None,
        tokenizer: str | None,
    ) -> pathlib.Path:
        """Export version ``version``'s weights, config and tokenizer; the weights' path.

        The files are written into a staging folder that is renamed to ``v<N>`` once
        complete, so a failed or killed registration leaves no half-written ``v<N>`` for
        a later version with the same number to inherit files from.
        """
        final = self.directory / name / f"v{version}"
        staging = final.with_name(f".{final.name}.partial-{uuid.uuid4().hex[:8]}")
        staging.mkdir(parents=True)
        try:
            if model_config is not None:  # what inference.LLM(<dir or file>) reads beside it
                (staging / "config.json").write_text(json.dumps(model_config))
            if tokenizer is not None:
                shutil.copy(tokenizer, staging / pathlib.Path(tokenizer).name)
                meta["tokenizer"] = str(final / pathlib.Path(tokenizer).name)
            if (src / "state.json").exists():
                shutil.copy(src / "state.json", staging / "state.json")
                weights = "state.json"
            else:
                from jaxcore.checkpointing.portable import export_checkpoint

                weights = export_checkpoint(src, staging / "model.safetensors").name
            # The store gave this number to this registration alone: an existing v<N> is
            # what a failed registration of the same number left behind.
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return final / weights

    def _lineage(self, ckpt_row: dict[str, Any] | None, src: pathlib.Path) -> dict[str, Any]:
        out: dict[str, Any] = {"store": self.store.uuid, "source_path": str(src)}
        if ckpt_row is None:
            return out
        trial = self.store.trial(ckpt_row["trial_id"]) or {}
        exp = self.store.experiment(trial.get("experiment_id", -1)) or {}
        out.update(
            checkpoint_id=ckpt_row["id"],
            step=ckpt_row["step"],
            metrics=ckpt_row.get("metrics"),
            trial_id=ckpt_row["trial_id"],
            hparams=trial.get("hparams"),
            parent_trial=trial.get("parent_trial"),
            experiment_id=exp.get("id"),
            experiment_uuid=exp.get("uuid"),
            experiment_name=exp.get("name"),
        )
        return out

    def set_alias(self, name: str, alias: str, version: int) -> None:
        check_alias(alias)
        model = self._model(name)
        if version not in {v["version"] for v in self.store.versions(model["id"])}:
            raise ConfigError(f"model {name!r} has no version {version}.")
        self.store.set_alias(model["id"], alias, version)

    def list(self) -> list[dict[str, Any]]:
        out = []
        for m in self.store.models():
            versions = self.store.versions(m["id"])
            out.append({**m, "versions": len(versions), "aliases": self.store.aliases(m["id"])})
        return out

    def describe(self, name: str) -> dict[str, Any]:
        model = self._model(name)
        return {
            **model,
            "versions": self.store.versions(model["id"]),
            "aliases": self.store.aliases(model["id"]),
        }

    def compare(self, name: str, metric: str, *, smaller_is_better: bool = True) -> list[dict]:
        """Versions ordered best-first by ``metric`` (versions without it come last)."""

        def key(v: dict) -> tuple[int, float]:
            return metric_rank((v.get("metrics") or {}).get(metric), smaller_is_better)

        return sorted(self.describe(name)["versions"], key=key)

    def version(self, name: str, ref: int | str = "latest") -> dict[str, Any]:
        """The version row for a number, ``"latest"``, or an alias."""
        info = self.describe(name)
        # A row without a path is a registration that never finished (killed while
        # writing its files): it keeps its number but is never resolved.
        unfinished = {v["version"] for v in info["versions"] if not v["path"]}
        versions = {v["version"]: v for v in info["versions"] if v["path"]}
        number = int(ref) if isinstance(ref, int) or str(ref).isdigit() else None
        if info["aliases"].get(ref) in unfinished:
            number = info["aliases"][ref]
        if number in unfinished:
            raise ConfigError(
                f"model {name!r}: version {number} did not finish registering (stopped while "
                "its files were written); register the checkpoint again as a new version."
            )
        if not versions:
            raise ConfigError(f"model {name!r} has no versions yet.")
        if ref == "latest":
            return versions[max(versions)]
        if number is not None:
            if number not in versions:
                raise ConfigError(f"model {name!r} has versions {sorted(versions)}, not {ref}.")
            return versions[number]
        if ref not in info["aliases"]:
            raise ConfigError(
                f"model {name!r} has no alias {ref!r} (aliases: {sorted(info['aliases'])})."
            )
        return versions[info["aliases"][ref]]

    def load(self, name: str, ref: int | str = "latest", *, engine: Any = None) -> Any:
        """Parameters of a version: a nested dict of NumPy arrays, or, with a prepared
        ``engine``, arrays sharded on its mesh (`jaxcore.load_params`)."""
        row = self.version(name, ref)
        path = pathlib.Path(row["path"])
        if not path.exists():
            raise ConfigError(
                f"model {name!r} version {row['version']}: its files are gone (no {path}; "
                "deleted by hand?). Register its checkpoint again as a new version with "
                f"'jaxcore model register {name} CHECKPOINT'."
            )
        if path.name == "state.json":
            return json.loads(path.read_text())["state"]
        if engine is not None:
            from jaxcore.checkpointing.portable import load_params

            return load_params(path, engine)
        from jaxcore.checkpointing.portable import read_params

        return read_params(path)[0]


def _absolute_dataset(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata["dataset"]`` (a ``data build`` version folder, as a path or a dict with
    ``path``) made absolute where it names an existing folder from the current one: the
    dashboard links a version's lineage to the dataset whose root the path starts with, so
    a relative ``"out/v2"`` stayed unlinked text."""
    ref = metadata.get("dataset")
    key = None
    if isinstance(ref, dict):
        key = "path" if ref.get("path") else "dir" if ref.get("dir") else None
        path = ref.get(key) if key else None
    else:
        path = ref
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        return metadata
    p = pathlib.Path(path)
    if p.is_absolute() or not p.is_dir():
        return metadata
    absolute = str(p.absolute())
    return {**metadata, "dataset": {**ref, key: absolute} if key else absolute}


def load(name: str, ref: int | str = "latest", *, db: str | None = None, engine: Any = None) -> Any:
    """``jaxcore.registry.load("tiny-lm", "production")``: a registered version's params."""
    reg = Registry(db)
    try:
        return reg.load(name, ref, engine=engine)
    finally:
        reg.store.close()


def parse_spec(spec: str) -> tuple[str, str]:
    """``"registry:NAME@REF"`` / ``"NAME@REF"`` / ``"NAME"`` -> ``(NAME, REF)`` (REF: a
    version number, an alias, or ``latest``)."""
    body = spec.removeprefix(PREFIX)
    name, _, ref = body.rpartition("@") if "@" in body else (body, "", "latest")
    if not name or not ref:
        raise ConfigError(
            f"model {spec!r}: write registry:NAME@ALIAS or registry:NAME@VERSION "
            "(e.g. registry:tiny-lm@production, registry:tiny-lm@3)."
        )
    return name, ref


def resolve(spec: str, *, db: str | None = None) -> ResolvedModel:
    """Weights, model config, tokenizer and lineage of a registered version.

    ``spec``: ``"registry:NAME@ALIAS"``, ``"registry:NAME@3"`` or ``"NAME@ALIAS"``.
    ``db``: the store (default `default_url`). What ``LLM("registry:...")`` and
    ``jaxcore serve --model registry:...`` load.
    """
    name, ref = parse_spec(spec)
    reg = Registry(db)
    try:
        row = reg.version(name, ref)
    finally:
        reg.store.close()
    meta = row.get("meta") or {}
    config = meta.get("model_config")
    if not config:
        raise ConfigError(
            f"model {spec!r}: version {row['version']} was registered without a model "
            "config; register it again with model_config= (or set ctx.model_config in the "
            "trial so its checkpoints carry it)."
        )
    path = pathlib.Path(row["path"])
    if path.suffix != ".safetensors" or not path.is_file():
        raise ConfigError(f"model {spec!r}: version {row['version']} has no weights at {path}.")
    return ResolvedModel(
        weights_path=str(path.absolute()),
        config=dict(config),
        tokenizer_path=meta.get("tokenizer"),
        lineage=dict(meta.get("lineage") or {}),
    )

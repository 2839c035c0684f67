"""The phases of `jaxcore run`: data -> tokenizer -> train -> search -> register -> serve.

Each phase is a function ``(ctx) -> dict`` (its output, JSON). A finished phase writes
``<run_dir>/phases/<name>.json`` with its output and a fingerprint of what it depended on
(its config sections and the outputs of the phases before it); a later run with the same
fingerprint skips it and reuses the output, unless the files it names changed since
(`stale_reason`). A phase interrupted before its record is written runs again: the data
build resumes from its shard markers, and the train and search experiments are
reattached in the store when their settings are unchanged, so their trials restart from
their latest checkpoints (the experiments package's resume); one that finished is reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import pathlib
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

from jaxcore.errors import ConfigError
from jaxcore.run.config import RunConfig

PHASES = ("data", "tokenizer", "train", "search", "register", "serve")
TRIAL_ENTRYPOINT = "jaxcore.run.trial:train"


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


@dataclasses.dataclass
class RunContext:
    """What the phases share: the config, the console, earlier outputs, the store URL."""

    config: RunConfig
    console: Any
    outputs: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def run_dir(self) -> pathlib.Path:
        return self.config.path

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.run_dir / 'jaxcore.db'}"


# ----------------------------------------------------------------------------- records
def record_path(run_dir: pathlib.Path, phase: str) -> pathlib.Path:
    return run_dir / "phases" / f"{phase}.json"


def read_record(run_dir: pathlib.Path, phase: str) -> dict[str, Any] | None:
    p = record_path(run_dir, phase)
    return json.loads(p.read_text()) if p.is_file() else None


def write_record(run_dir: pathlib.Path, phase: str, record: dict[str, Any]) -> None:
    p = record_path(run_dir, phase)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, p)  # a record is there whole or not at all


def fingerprint(config: RunConfig, phase: str, outputs: dict[str, dict]) -> str:
    """What ``phase``'s result depends on: its sections and the earlier phases' outputs."""
    sections = {
        "data": ("data",),
        "tokenizer": ("tokenizer",),
        "train": ("model", "train"),
        "search": ("model", "train", "search"),
        "register": ("model_name",),
        "serve": ("serve",),
    }[phase]
    raw = config.to_dict()
    before = PHASES[: PHASES.index(phase)]
    return _hash(
        {
            "sections": {s: raw[s] for s in sections},
            "upstream": {p: _result(outputs.get(p)) for p in before},
        }
    )


def stale_reason(config: RunConfig, phase: str, output: dict[str, Any]) -> str | None:
    """Why a finished phase's recorded ``output`` no longer describes the files it names,
    or ``None`` when it still does.

    The fingerprint covers the config; the files live on: a dataset version is keyed by
    its sources' sizes and mtimes (edited sources are another version), and a version's
    tokens of one tokenizer setting are shared by every run using that setting (deleted,
    or written by an older jaxcore into the shared ``tokens/``, they may have changed). A
    stale record is run again, never reused.
    """
    if phase == "data":
        d = config.data
        sources = package_sources(d.packages) + [dict(s) for s in d.sources]
        key = input_hash(sources, config)
        if key != output.get("input_hash"):
            return "the source files changed since (another input hash)"
        manifest = pathlib.Path(output["version_dir"]) / "manifest.json"
        if not manifest.is_file():
            return f"dataset {manifest.parent} is gone"
        from jaxcore.run.lineage import sha256_file

        if sha256_file(manifest) != output.get("manifest_sha256"):
            return f"dataset {manifest.parent} was rebuilt (another manifest)"
    elif phase == "tokenizer":
        tok, index = pathlib.Path(output["tokenizer"]), pathlib.Path(output["tokens_index"])
        if not (tok.is_file() and index.is_file()):
            return f"its tokenizer or token index under {index.parent} is gone"
        if hashlib.sha256(tok.read_bytes()).hexdigest() != output.get("tokenizer_sha256"):
            return f"{tok} was rewritten since (by another run's tokenizer settings?)"
        written = json.loads(index.read_text())
        if written.get("tokenizer_sha256") != output.get("tokenizer_sha256") or written.get(
            "tokens"
        ) != output.get("tokens"):
            return f"the token shards under {index.parent} were rewritten since"
    elif phase == "register" and not pathlib.Path(output.get("weights") or "").exists():
        return f"the registered weights {output.get('weights')} are gone"
    return None


def _result(output: dict[str, Any] | None) -> dict[str, Any] | None:
    """An output without how it was reached (``reused``: the dataset version was found by
    its input hash; ``resumed``: the experiment restarted from a checkpoint), which says
    nothing about what later phases read."""
    if output is None:
        return None
    return {k: v for k, v in output.items() if k not in ("reused", "resumed")}


# ----------------------------------------------------------------------------- data
def package_sources(packages: tuple[str, ...]) -> list[dict[str, Any]]:
    """Source folders of installed packages as `data` ``dir`` sources (one repo each)."""
    out = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None:
            raise ConfigError(
                f"run config: data.packages: {name!r} is not installed in this environment; "
                "list packages `pip list` shows (import names, e.g. idna, click)."
            )
        if spec.submodule_search_locations:
            path = next(iter(spec.submodule_search_locations))
        elif spec.origin:
            path = str(pathlib.Path(spec.origin).parent)  # a single-module package
        else:
            raise ConfigError(f"run config: data.packages: {name!r} has no source folder.")
        out.append({"type": "dir", "path": path, "name": name})
    return out


def check_sources(sources: list[dict[str, Any]], output_dir: str) -> int:
    """Validate the sources as the data phase will read them (types, paths, layouts,
    unique names) without reading any file; returns the number of repositories.

    Raises `data.DataError` (a usage error: exit 2 from `jaxcore run`), so `--dry-run`
    finds a wrong path before a long job is launched, not an hour into it."""
    from data import config_from_dict
    from data.ingest import plan_units

    return len(plan_units(config_from_dict({"sources": sources, "output_dir": output_dir}).sources))


def input_hash(sources: list[dict[str, Any]], config: RunConfig) -> str:
    """Hash of every input file's path, size and mtime plus the curation settings: the
    key a dataset version is found by.

    Bytecode (``__pycache__``, ``*.pyc``) is left out: Python writes it into a source
    package whenever the package is imported (``h11`` by the serve phase's client), and
    the curation drops it as binary, so it would only make a new version of the same
    data (and retrain every later phase)."""
    h = hashlib.sha256()
    d = config.data
    h.update(json.dumps([sources, d.num_shards, d.optout_registry], sort_keys=True).encode())
    for s in sources:
        root = pathlib.Path(s["path"])
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        files = [p for p in files if not _bytecode(p)]
        for p in files:
            st = p.stat()
            h.update(f"{p.relative_to(root.parent)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if d.optout_registry and pathlib.Path(d.optout_registry).is_file():
        h.update(pathlib.Path(d.optout_registry).read_bytes())
    return h.hexdigest()


def _bytecode(path: pathlib.Path) -> bool:
    return path.suffix in (".pyc", ".pyo") or "__pycache__" in path.parts


def data_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """Kept and dropped files, by stage and reason, from a snapshot manifest."""
    return {
        "files_in": manifest["inputs"]["files"],
        "bytes_in": manifest["inputs"]["bytes"],
        "files_kept": manifest["outputs"]["files"],
        "bytes_kept": manifest["outputs"]["bytes"],
        "files_dropped": manifest["dropped"]["files"],
        "dropped_by_stage": manifest["dropped"]["by_stage"],
        "languages": manifest.get("languages", {}),
        "licenses": manifest.get("licenses", {}),
    }


def phase_data(ctx: RunContext) -> dict[str, Any]:
    """Curate the corpus (license, opt-out, PII, dedup) into a version keyed by input hash."""
    from data import build as build_dataset
    from data import config_from_dict, load_manifest

    d = ctx.config.data
    sources = package_sources(d.packages) + [dict(s) for s in d.sources]
    key = input_hash(sources, ctx.config)
    version = f"v-{key[:12]}"
    vdir = pathlib.Path(d.output_dir) / version
    # Runs sharing data.output_dir build a version once: another run building it now is
    # waited for (the data package itself refuses a second concurrent build).
    with waiting_lock(pathlib.Path(d.output_dir) / f".{version}.run.lock", ctx.console, "build"):
        reused = (vdir / "manifest.json").is_file()
        if reused:
            ctx.console.print(f"  dataset {version} found by its input hash: reused ({vdir})")
        else:
            raw = {
                "sources": sources,
                "output_dir": d.output_dir,
                "version": version,
                "num_shards": d.num_shards,
                "workers": d.workers,
                "progress": True,
            }
            if d.optout_registry:
                raw["optout"] = {"registry": d.optout_registry}
            build_dataset(config_from_dict(raw))
    manifest = load_manifest(vdir)
    from jaxcore.run.lineage import sha256_file

    return {
        "version": version,
        "version_dir": str(vdir),
        "input_hash": key,
        "reused": reused,
        "manifest_sha256": sha256_file(vdir / "manifest.json"),
        "summary": data_summary(manifest),
    }


@contextlib.contextmanager
def waiting_lock(path: pathlib.Path, console: Any, what: str) -> Iterator[None]:
    """Hold an advisory ``flock`` on ``path``; while another `jaxcore run` holds it (it is
    doing ``what`` on files this run shares), say so and wait. The kernel frees the lock
    when its holder dies, kill -9 included, so a crashed run never blocks the next."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            console.print(f"  waiting for another `jaxcore run` {what} ({path.parent})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- tokenizer
def phase_tokenizer(ctx: RunContext) -> dict[str, Any]:
    """Train byte-level BPE on the kept files and write the token shards Grain reads."""
    from data import TokenizeConfig, tokenize_snapshot
    from jaxcore.run.lineage import dataset_lineage

    t = ctx.config.tokenizer
    vdir = pathlib.Path(ctx.outputs["data"]["version_dir"])
    tcfg = TokenizeConfig(
        enabled=True,
        vocab_size=t.vocab_size,
        min_frequency=t.min_frequency,
        num_shards=t.num_shards,
    )
    # Shards live in the dataset version, one folder per tokenizer setting: runs with
    # other settings never rewrite the shards another run trains on, and runs with the
    # same settings share them (the first writes, the others wait for it and reuse them).
    # The marker is written last, so a run killed mid-way leaves nothing to trust.
    wanted = dataclasses.asdict(tcfg)
    name = "tokens-" + hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:12]
    tdir = vdir / name
    marker, index_path = tdir / "jaxcore_run.json", tdir / "index.json"
    with waiting_lock(vdir / f".{name}.lock", ctx.console, "tokenizing"):
        if index_path.is_file() and marker.is_file() and json.loads(marker.read_text()) == wanted:
            index = json.loads(index_path.read_text())
            ctx.console.print("  tokenizer and shards of these settings found: reused")
        else:
            marker.unlink(missing_ok=True)
            with ctx.console.status(f"training BPE (vocab {t.vocab_size}) and writing shards"):
                index = tokenize_snapshot(vdir, tcfg, out_dir=name)
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps(wanted))
            os.replace(tmp, marker)
    lineage = dataset_lineage(vdir, ctx.outputs["data"]["input_hash"], index)
    lineage_file = ctx.run_dir / "lineage.json"
    lineage_file.write_text(json.dumps(lineage, indent=1) + "\n")
    return {
        "tokens_index": str(index_path),
        "tokenizer": str(tdir / "tokenizer.json"),
        "tokenizer_sha256": index["tokenizer_sha256"],
        "vocab_size": index["vocab_size"],
        "records": index["records"],
        "tokens": index["tokens"],
        "lineage_file": str(lineage_file),
    }


# ----------------------------------------------------------------------------- train/search
def run_hparams(config: RunConfig, vocab_size: int) -> dict[str, Any]:
    """The model and training settings of a run, as `jaxcore.run.trial` reads them."""
    m, tr = config.model, config.train
    return {
        "vocab_size": vocab_size,
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "n_heads": m.n_heads,
        "n_kv_heads": m.n_kv_heads,
        "d_ff": m.d_ff,
        "seq": m.seq_len,
        "batch": tr.batch,
        "warmup": tr.warmup,
        "weight_decay": tr.weight_decay,
        "zero": tr.zero,
        "remat": tr.remat,
        "precision": tr.precision,
        "grad_accum": tr.grad_accum,
        "unroll_layers": tr.unroll_layers,
        "seed": tr.seed,
        "checkpoint_every": tr.checkpoint_every,
    }


def trial_constants(ctx: RunContext, peak_flops: float | None) -> dict[str, Any]:
    """The constant hyperparameters every trial of this run gets (see `jaxcore.run.trial`)."""
    tok, steps = ctx.outputs["tokenizer"], ctx.config.train.steps
    return {
        "tokens": tok["tokens_index"],
        # The index's path is one per tokenizer setting (older runs shared one for every
        # setting); its hash (tokenizer hash, shards, counts) tells an experiment trained
        # on other tokens from this one (see changed_settings).
        "tokens_sha256": hashlib.sha256(pathlib.Path(tok["tokens_index"]).read_bytes()).hexdigest(),
        "lineage": tok["lineage_file"],
        **run_hparams(ctx.config, tok["vocab_size"]),
        "log_every": max(1, min(10, steps // 20 or 1)),
        "peak_flops": peak_flops or 0.0,
    }


def _cpu_peak_flops() -> float | None:
    """The datasheet peak, or on CPU a short matmul measurement (the machine's cores)."""
    import jax

    from jaxcore.profiling import measure_matmul_peak, peak_flops

    peak = peak_flops()
    if peak is not None:
        return peak * jax.device_count()
    if jax.devices()[0].platform == "cpu":
        return measure_matmul_peak(size=512, repeats=3)  # fake devices share the cores
    return None


def run_experiment_phase(ctx: RunContext, raw: dict[str, Any]) -> dict[str, Any]:
    """Run (or reattach and resume) the experiment named ``raw['name']`` inline."""
    from jaxcore.experiments import ExperimentLoop, Store, parse_config
    from jaxcore.experiments.store import EXPERIMENT_DONE
    from jaxcore.experiments.trial_executors import InlineTrialExecutor

    config = parse_config(raw)
    store = Store(ctx.db_url)
    try:
        previous = [e for e in store.experiments() if e["name"] == raw["name"]]
        unfinished = [e for e in previous if e["state"] not in EXPERIMENT_DONE]
        # Only an experiment started with these very settings resumes: its trials keep the
        # hyperparameters (lr, model shape, vocabulary, tokens) they were created with.
        same = [e for e in unfinished if not changed_settings(e["config"], raw)]
        exp_id = same[-1]["id"] if same else None
        done = [
            e
            for e in previous
            if e["state"] == "COMPLETED" and not changed_settings(e["config"], raw)
        ]
        if exp_id is None and done:
            # Finished before its phase record was written (a kill between the two):
            # what it trained is this phase's result, as an uninterrupted run returns it.
            e = done[-1]
            run = types.SimpleNamespace(experiment_id=e["id"], trials=store.trials(e["id"]))
            out = _experiment_output(store, run, resumed=False)
            if out["best"] is not None:
                ctx.console.print(f"  experiment {e['id']} finished with these settings: reused")
                return out
        if exp_id is not None:
            ctx.console.print(f"  resuming experiment {exp_id} (interrupted) from its checkpoints")
        elif unfinished:
            e = unfinished[-1]
            ctx.console.print(
                f"  experiment {e['id']} (interrupted) was started with other settings ("
                + "; ".join(changed_settings(e["config"], raw)[:4])
                + "): not resumed; starting a new one"
            )
        # SIGTERM (docker stop, a Slurm preemption) stops the run after the trial's save.
        executor = InlineTrialExecutor(stop_on_sigterm=True)
        loop = ExperimentLoop(config, executor=executor, store=store, experiment_id=exp_id)
        summary = loop.run()
        if summary.state != "COMPLETED":
            raise ConfigError(
                f"experiment {summary.experiment_id} ({raw['name']}) ended {summary.state}; "
                f"see 'jaxcore trial logs ID --db {ctx.db_url}'."
            )
        return _experiment_output(store, summary, resumed=exp_id is not None)
    finally:
        store.close()


# Not settings of the trial: measured each run, or display only.
_VOLATILE = ("peak_flops", "progress")


def changed_settings(stored: dict[str, Any], raw: dict[str, Any]) -> list[str]:
    """``"key: old -> new"`` for each hyperparameter or searcher setting of ``raw`` that
    differs from an experiment's stored config (an empty list: the same experiment)."""

    from jaxcore.experiments import parse_config
    from jaxcore.experiments.config import to_dict

    def view(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
        c = to_dict(parse_config(c))  # defaults filled in, as the store keeps it
        hyper = {k: v for k, v in c["hyperparameters"].items() if k not in _VOLATILE}
        return {"hyperparameters": hyper, "searcher": c["searcher"]}

    try:
        old = view(stored)
    except Exception as e:  # written by another version of the experiments package
        return [f"stored config unreadable ({type(e).__name__})"]
    new = view(raw)
    return [
        f"{k}: {old[part].get(k)!r} -> {new[part].get(k)!r}"
        for part in ("hyperparameters", "searcher")
        for k in sorted(set(old[part]) | set(new[part]))
        if old[part].get(k) != new[part].get(k)
    ]


def _experiment_output(store: Any, summary: Any, *, resumed: bool) -> dict[str, Any]:
    trials = []
    for t in summary.trials:
        rows = store.metrics(t["id"])
        val = [(r["step"], r["values"]["val_loss"]) for r in rows if "val_loss" in r["values"]]
        loss = [
            (r["step"], r["values"]["loss"])
            for r in rows
            if r["kind"] == "training" and "loss" in r["values"]
        ]
        speed = [r["values"] for r in rows if "tokens_per_s" in r["values"]]
        starts = [
            r["values"]["resumed_from_step"] for r in rows if "resumed_from_step" in r["values"]
        ]
        ckpts = [c for c in store.checkpoints(trial_id=t["id"], state="COMPLETED")]
        trials.append(
            {
                "trial_id": t["id"],
                "lr": t["hparams"]["lr"],
                "state": t["state"],
                "steps": max([s for s, _ in loss], default=0),
                "val_loss": val[-1][1] if val else None,
                "loss_curve": loss,
                "tokens_per_s": speed[-1].get("tokens_per_s") if speed else None,
                "mfu": speed[-1].get("mfu") if speed else None,
                "resumed_from_step": starts[-1] if starts else None,
                "checkpoint_id": ckpts[-1]["id"] if ckpts else None,
            }
        )
    finished = [t for t in trials if t["val_loss"] is not None and t["checkpoint_id"] is not None]
    best = min(finished, key=lambda t: t["val_loss"]) if finished else None
    return {
        "experiment_id": summary.experiment_id,
        "resumed": resumed,
        "trials": trials,
        "best": best,
    }


def experiment_raw(ctx: RunContext, name: str, hyper: dict, searcher: dict) -> dict[str, Any]:
    return {
        "name": name,
        "entrypoint": TRIAL_ENTRYPOINT,
        "workdir": str(ctx.run_dir / "experiments"),
        "database": ctx.db_url,
        "hyperparameters": hyper,
        "searcher": {"metric": "val_loss", "smaller_is_better": True, **searcher},
        "max_restarts": 0,
    }


def phase_train(ctx: RunContext) -> dict[str, Any]:
    """The main run: one trial at ``train.lr`` for ``train.steps`` steps."""
    tr = ctx.config.train
    hyper = {**trial_constants(ctx, _cpu_peak_flops()), "lr": tr.lr, "progress": True}
    raw = experiment_raw(
        ctx, f"{ctx.config.name}-train", hyper, {"name": "single", "max_length": tr.steps}
    )
    return run_experiment_phase(ctx, raw)


def phase_search(ctx: RunContext) -> dict[str, Any]:
    """Adaptive ASHA over the learning rate (log-uniform), trials one after another."""
    s = ctx.config.search
    if not s.enabled:
        return {"skipped": "search.enabled is false", "best": None, "trials": []}
    hyper = {
        **trial_constants(ctx, None),
        "lr": {"type": "double", "minval": s.lr_min, "maxval": s.lr_max, "log": True},
        "warmup": min(ctx.config.train.warmup, s.max_length // 4),
        "checkpoint_every": s.max_length,
        "progress": True,
    }
    searcher = {
        "name": "adaptive_asha",
        "max_length": s.max_length,
        "max_trials": s.max_trials,
        "divisor": s.divisor,
        "max_rungs": s.max_rungs,
        "max_concurrent_trials": 1,
    }
    return run_experiment_phase(
        ctx, experiment_raw(ctx, f"{ctx.config.name}-search", hyper, searcher)
    )


# ----------------------------------------------------------------------------- register
def phase_register(ctx: RunContext) -> dict[str, Any]:
    """Register the best checkpoint of the train and search phases (lowest val_loss)."""
    from jaxcore.experiments import Registry

    candidates = [
        (p, ctx.outputs[p]["best"]) for p in ("train", "search") if ctx.outputs[p].get("best")
    ]
    if not candidates:
        raise ConfigError("register: no trial finished with a checkpoint; nothing to register.")
    phase, best = min(candidates, key=lambda c: c[1]["val_loss"])
    name = ctx.config.model_name
    reg = Registry(ctx.db_url)
    try:
        if reg.store.model(name) is None:
            reg.create_model(name, description=f"jaxcore run {ctx.config.name}")
        version = _registered_version(reg, name, best["checkpoint_id"])
        if version is None:
            version = reg.register(
                name,
                checkpoint=best["checkpoint_id"],
                description=f"best of the {phase} phase (trial {best['trial_id']})",
                aliases=["latest-run"],
            )
        else:
            ctx.console.print(f"  {name} v{version} holds this checkpoint already: reused")
            reg.set_alias(name, "latest-run", version)
        row = reg.version(name, version)
    finally:
        reg.store.close()
    return {
        "model": name,
        "version": version,
        "from_phase": phase,
        "trial_id": best["trial_id"],
        "val_loss": best["val_loss"],
        "weights": row["path"],
        "lineage": (row.get("meta") or {}).get("lineage", {}),
    }


def _registered_version(reg: Any, name: str, checkpoint_id: int) -> int | None:
    """The version of ``name`` already exported from ``checkpoint_id``, if any.

    A run killed after the registry committed but before the phase record was written
    registers again on the rerun; reusing the version keeps one version per checkpoint,
    as an uninterrupted run leaves it.
    """
    for v in reversed(reg.store.versions(reg.store.model(name)["id"])):
        if v["checkpoint_id"] == checkpoint_id and v["path"] and pathlib.Path(v["path"]).exists():
            return int(v["version"])
    return None


# ----------------------------------------------------------------------------- serve
def phase_serve(ctx: RunContext) -> dict[str, Any]:
    """Serve the registered version in-process; complete the prompts with the OpenAI client."""
    sv = ctx.config.serve
    if not sv.enabled:
        return {"skipped": "serve.enabled is false", "completions": []}
    import openai

    from inference import LLM, ServingConfig
    from inference.server import BackgroundServer, create_app
    from jaxcore.experiments import registry
    from jaxcore.models import TransformerConfig

    reg = ctx.outputs["register"]
    spec = f"registry:{reg['model']}@{reg['version']}"
    m = registry.resolve(spec, db=ctx.db_url)
    cfg = TransformerConfig(**m.config)
    max_len = cfg.max_seq_len
    with ctx.console.status(f"serving {spec} and completing {len(sv.prompts)} prompts"):
        llm = LLM(
            m.weights_path,
            config=cfg,
            tokenizer=m.tokenizer_path,
            engine=ServingConfig(slots=sv.slots, max_len=max_len, prefill_buckets=(max_len,)),
        )
        app = create_app(llm, model_name=reg["model"], lineage=m.lineage)
        server = BackgroundServer(app)
        try:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="local", max_retries=0)
            served = client.models.list().data[0].model_dump()
            completions = []
            for prompt in sv.prompts:
                t0 = time.perf_counter()
                out = client.completions.create(
                    model=reg["model"], prompt=prompt, max_tokens=sv.max_tokens, temperature=0.0
                )
                completions.append(
                    {
                        "prompt": prompt,
                        "text": out.choices[0].text,
                        "seconds": round(time.perf_counter() - t0, 3),
                    }
                )
        finally:
            server.stop()
            llm.close()
    return {"url": server.url, "model": served, "completions": completions}


RUNNERS: dict[str, Callable[[RunContext], dict[str, Any]]] = {
    "data": phase_data,
    "tokenizer": phase_tokenizer,
    "train": phase_train,
    "search": phase_search,
    "register": phase_register,
    "serve": phase_serve,
}

"""Experiment configuration: hyperparameter space, searcher, retention, resources.

An experiment is one YAML file (or dict), loaded into frozen dataclasses and validated
before any trial starts; every error names the field (``searcher.max_trials``) and the
fix. The vocabulary follows Determined's experiment config (``hyperparameters`` with
``const``/``int``/``double``/``log``/``categorical``, ``searcher.name``,
``checkpoint_storage.save_trial_latest``...) so its users feel at home; ``double`` with
``log: true`` is our spelling of Determined's ``log`` type (which also accepts ``type: log``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import re
from typing import Any

import yaml

from jaxcore.errors import ConfigError

SEARCHERS = ("single", "grid", "random", "bayesian", "adaptive_asha", "pbt")
ASHA_MODES = ("aggressive", "standard", "conservative")
PARAM_TYPES = ("const", "int", "double", "log", "categorical")
SAMPLERS = ("tpe", "gp")
PRUNERS = ("none", "median", "successive_halving", "hyperband")


def _err(field: str, msg: str) -> ConfigError:
    return ConfigError(f"experiment config: {field}: {msg}")


def _is_int(value: Any) -> bool:
    """An integer that is not a bool (``True`` is an ``int`` to Python, not to a config)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    """A real number that is not a bool or a string (``"1e-4"`` is a typo, not 0.0001)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_num(field: str, value: Any) -> None:
    if value is not None and not _is_num(value):
        hint = " (quote-free, e.g. 1.0e-4)" if isinstance(value, str) else ""
        raise _err(field, f"{value!r} is a {type(value).__name__}; write a number{hint}.")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 floats: ``1e-4`` is a float, not a string.

    PyYAML follows YAML 1.1, whose float pattern needs a dot (``1.0e-4``), so ``1e-4``
    and ``5E3`` silently load as strings; the resolver below is the usual fix (the YAML
    1.2 core schema's float regex, plus ``.inf``/``.nan``).
    """


_Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def yaml_load(text: str) -> Any:
    """Parse YAML text as the experiment config reader does (``1e-4`` -> float)."""
    return yaml.load(text, Loader=_Loader)


# --------------------------------------------------------------------- hyperparameters
@dataclasses.dataclass(frozen=True, kw_only=True)
class Param:
    """One hyperparameter.

    Attributes:
        name: its key in ``ctx.hparams``.
        type: ``const``, ``int``, ``double`` or ``categorical``.
        val: the value of a ``const``.
        minval, maxval: inclusive bounds of ``int`` and ``double``.
        log: sample ``double``/``int`` uniformly in log space (bounds must be > 0).
        vals: the choices of a ``categorical``.
        count: grid points for ``int``/``double`` under the grid searcher.
    """

    name: str
    type: str
    val: Any = None
    minval: float | None = None
    maxval: float | None = None
    log: bool = False
    vals: tuple = ()
    count: int | None = None

    def __post_init__(self) -> None:
        f = f"hyperparameters.{self.name}"
        if self.type not in PARAM_TYPES:
            raise _err(f"{f}.type", f"{self.type!r} is not one of {PARAM_TYPES}.")
        if self.type == "categorical" and not self.vals:
            raise _err(f"{f}.vals", "a categorical needs a non-empty list of values.")
        for bound in ("minval", "maxval"):
            _check_num(f"{f}.{bound}", getattr(self, bound))
        if not isinstance(self.log, bool):
            raise _err(f"{f}.log", f"{self.log!r}: write true or false.")
        if self.type in ("int", "double"):
            if self.minval is None or self.maxval is None:
                raise _err(f"{f}.minval/maxval", f"an {self.type} needs both bounds.")
            for bound in ("minval", "maxval"):
                if not math.isfinite(getattr(self, bound)):
                    raise _err(f"{f}.{bound}", f"{getattr(self, bound)} is not a finite number.")
            if not self.minval <= self.maxval:
                raise _err(f"{f}.minval", f"minval {self.minval} exceeds maxval {self.maxval}.")
            if self.log and self.minval <= 0:
                raise _err(
                    f"{f}.minval",
                    f"a log range needs positive bounds (got minval={self.minval}); use a "
                    "linear range or a positive lower bound such as 1e-6.",
                )
        if self.type == "int" and not (_is_int(self.minval) and _is_int(self.maxval)):
            raise _err(
                f"{f}.minval/maxval",
                f"an int range needs integer bounds (got minval={self.minval!r}, "
                f"maxval={self.maxval!r}); write whole numbers without a decimal point "
                "(e.g. 1, not 1.0), or use type: double.",
            )
        if self.count is not None and (not _is_int(self.count) or self.count < 1):
            raise _err(f"{f}.count", f"{self.count!r}: must be an integer >= 1.")

    def grid(self) -> list[Any]:
        """The values the grid searcher visits (Determined: ``count`` points per range)."""
        if self.type == "const":
            return [self.val]
        if self.type == "categorical":
            return list(self.vals)
        if self.count is None:
            raise _err(f"hyperparameters.{self.name}.count", "the grid searcher needs a count.")
        n = self.count
        lo, hi = float(self.minval), float(self.maxval)
        if n == 1:
            pts = [math.sqrt(lo * hi) if self.log else (lo + hi) / 2]
        elif self.log:
            a, b = math.log(lo), math.log(hi)
            pts = [math.exp(a + (b - a) * i / (n - 1)) for i in range(n)]
        else:
            pts = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
        if self.type == "int":
            return sorted({round(p) for p in pts})
        return pts

    def sample(self, rng: Any) -> Any:
        """One random value (``rng``: a `random.Random`)."""
        if self.type == "const":
            return self.val
        if self.type == "categorical":
            return self.vals[rng.randrange(len(self.vals))]
        lo, hi = float(self.minval), float(self.maxval)
        if self.type == "int":
            if self.log:
                v = math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))
                return min(max(int(v), int(self.minval)), int(self.maxval))
            return rng.randint(int(self.minval), int(self.maxval))
        if self.log:
            return math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return rng.uniform(lo, hi)

    def clip(self, value: Any) -> Any:
        """``value`` moved inside the bounds (PBT's perturbations stay in the space)."""
        if self.type in ("int", "double"):
            value = min(max(value, self.minval), self.maxval)
            return round(value) if self.type == "int" else float(value)
        return value


def _log_bounds(field: str, base: float, lo: float, hi: float) -> tuple[float, float]:
    """Determined's ``type: log`` bounds ``base ** minval``, ``base ** maxval`` as a range.

    A base that is not positive gives a complex or undefined power, and a huge exponent
    overflows; both are the config's fault, so they are reported as its errors.
    """
    if not (math.isfinite(base) and base > 0 and base != 1):
        raise _err(f"{field}.base", f"{base!r}: a log base must be a positive number other than 1.")
    if lo > hi:  # said in the exponents the user wrote, not as base ** exponent
        raise _err(
            f"{field}.minval", f"minval {lo} exceeds maxval {hi} (exponents of base {base})."
        )
    try:
        return float(base) ** lo, float(base) ** hi
    except OverflowError:
        raise _err(
            f"{field}.minval/maxval",
            f"{base} ** [{lo}, {hi}] overflows a float; minval/maxval are exponents of base.",
        ) from None


def _categorical_vals(field: str, vals: Any) -> tuple:
    """A categorical's choices: a YAML list (a bare string would become its letters)."""
    if vals is None:
        return ()
    if not isinstance(vals, list | tuple):
        raise _err(field, f"{vals!r} is a {type(vals).__name__}; write a list, e.g. [{vals!r}].")
    # Choices Python compares equal (1, 1.0 and true; 0 and false; a list twice) are one
    # choice to a searcher: Optuna records a choice by its index (``list.index``), so a
    # trial that ran with `true` is recorded, and modelled, as having run with 1.
    for i, a in enumerate(vals):
        for b in vals[:i]:
            if a == b:
                raise _err(
                    field,
                    f"{b!r} and {a!r} are the same choice (Python compares them equal), so "
                    "a search cannot tell them apart; list each value once (quote one, "
                    "e.g. 'true', to keep both).",
                )
    return tuple(vals)


def parse_hparams(raw: Any) -> tuple[Param, ...]:
    """``hyperparameters:`` mapping -> `Param`s (plain values become ``const``)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise _err("hyperparameters", "must be a mapping of name -> value or {type: ...}.")
    out = []
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            out.append(Param(name=str(name), type="const", val=spec))
            continue
        spec = dict(spec)
        kind = spec.pop("type", None)
        if kind is None:
            raise _err(f"hyperparameters.{name}.type", f"missing; one of {PARAM_TYPES}.")
        if kind == "log":  # Determined's spelling: base ** [minval, maxval]
            base = spec.pop("base", 10.0)
            lo, hi = spec.pop("minval", None), spec.pop("maxval", None)
            if lo is None or hi is None:
                raise _err(f"hyperparameters.{name}.minval/maxval", "a log needs both bounds.")
            for field, v in (("base", base), ("minval", lo), ("maxval", hi)):
                _check_num(f"hyperparameters.{name}.{field}", v)
            spec["minval"], spec["maxval"] = _log_bounds(f"hyperparameters.{name}", base, lo, hi)
            kind, spec["log"] = "double", True
        known = {"val", "minval", "maxval", "log", "vals", "count"}
        extra = set(spec) - known
        if extra:
            raise _err(f"hyperparameters.{name}", f"unknown keys {sorted(extra)}; use {known}.")
        if "vals" in spec:
            spec["vals"] = _categorical_vals(f"hyperparameters.{name}.vals", spec["vals"])
        out.append(Param(name=str(name), type=kind, **spec))
    return tuple(out)


# --------------------------------------------------------------------- searcher
@dataclasses.dataclass(frozen=True, kw_only=True)
class SearcherConfig:
    """How trials are chosen and stopped.

    Attributes:
        name: ``single``, ``grid``, ``random``, ``bayesian``, ``adaptive_asha`` or ``pbt``.
        metric: the reported metric the searcher ranks trials by (required).
        smaller_is_better: rank ascending (loss) or descending (accuracy).
        max_length: steps a trial trains at most (ASHA's top rung; PBT: unused).
        max_trials: trials to run (random, bayesian, adaptive_asha).
        max_concurrent_trials: trials running at once (0: as many as slots allow).
        time_metric: ASHA's notion of time: ``steps`` (the reported step) or the name of
            a reported metric (``tokens``, ``epochs``); ``max_time`` then replaces
            ``max_length``.
        max_time: top-rung time in ``time_metric`` units.
        divisor, max_rungs, mode, bracket_rungs: adaptive ASHA (Determined's meaning).
        sampler: Bayesian sampler, ``tpe`` or ``gp`` (Optuna).
        pruner: Optuna pruner for ``bayesian``: ``none``, ``median``,
            ``successive_halving``, ``hyperband``.
        n_startup_trials: random trials before the Bayesian model is used.
        optuna_storage: an Optuna RDB URL to keep the study in (``None``: in memory).
        population_size, num_rounds, length_per_round, truncate_fraction,
            perturb_factor, resample_probability: PBT.
        seed: seed of every random choice the searcher makes.
    """

    name: str
    metric: str | None = None
    smaller_is_better: bool = True
    max_length: int | None = None
    max_trials: int | None = None
    max_concurrent_trials: int = 0
    time_metric: str = "steps"
    max_time: int | None = None
    divisor: float = 4.0
    max_rungs: int = 5
    mode: str = "standard"
    bracket_rungs: tuple[int, ...] = ()
    sampler: str = "tpe"
    pruner: str = "none"
    n_startup_trials: int = 10
    optuna_storage: str | None = None
    population_size: int = 8
    num_rounds: int = 4
    length_per_round: int = 100
    truncate_fraction: float = 0.25
    perturb_factor: float = 0.2
    resample_probability: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        s = "searcher"
        if self.name not in SEARCHERS:
            raise _err(f"{s}.name", f"unknown searcher {self.name!r}; use one of {SEARCHERS}.")
        if not self.metric or not isinstance(self.metric, str):
            raise _err(f"{s}.metric", "missing: name the reported metric to rank trials by.")
        if self.name != "pbt" and self.length is None:
            raise _err(f"{s}.max_length", "missing: how many steps a trial trains (>= 1).")
        if self.length is not None and (not _is_int(self.length) or self.length < 1):
            raise _err(f"{s}.max_length", f"{self.length!r}: must be an integer >= 1.")
        if self.name in ("random", "bayesian", "adaptive_asha") and (
            not _is_int(self.max_trials) or self.max_trials < 1
        ):
            raise _err(f"{s}.max_trials", f"{self.max_trials!r}: must be an integer >= 1.")
        if not _is_int(self.max_concurrent_trials) or self.max_concurrent_trials < 0:
            raise _err(f"{s}.max_concurrent_trials", "must be an integer >= 0 (0: no limit).")
        if self.mode not in ASHA_MODES:
            raise _err(f"{s}.mode", f"{self.mode!r}; use one of {ASHA_MODES}.")
        for f in ("divisor", "truncate_fraction", "perturb_factor", "resample_probability"):
            _check_num(f"{s}.{f}", getattr(self, f))
        if not isinstance(self.smaller_is_better, bool):
            raise _err(f"{s}.smaller_is_better", f"{self.smaller_is_better!r}: true or false.")
        if not _is_int(self.seed):
            raise _err(f"{s}.seed", f"{self.seed!r}: must be an integer.")
        if not self.divisor > 1:
            raise _err(f"{s}.divisor", f"{self.divisor!r}: must be > 1 (Determined uses 4).")
        if not _is_int(self.max_rungs) or self.max_rungs < 1:
            raise _err(f"{s}.max_rungs", f"{self.max_rungs!r}: must be an integer >= 1.")
        if any(not _is_int(r) or r < 1 for r in self.bracket_rungs):
            raise _err(f"{s}.bracket_rungs", "every entry must be an integer >= 1.")
        if self.sampler not in SAMPLERS:
            raise _err(f"{s}.sampler", f"{self.sampler!r}; use one of {SAMPLERS}.")
        if self.pruner not in PRUNERS:
            raise _err(f"{s}.pruner", f"{self.pruner!r}; use one of {PRUNERS}.")
        if self.name == "pbt":
            for f in ("population_size", "num_rounds", "length_per_round"):
                v = getattr(self, f)
                if not _is_int(v) or v < 1:
                    raise _err(f"{s}.{f}", f"{v!r}: must be an integer >= 1.")
            if not 0 < self.truncate_fraction <= 0.5:
                raise _err(f"{s}.truncate_fraction", "must be in (0, 0.5].")
            if not 0 <= self.resample_probability <= 1:
                raise _err(f"{s}.resample_probability", "must be in [0, 1].")
            if not 0 < self.perturb_factor < 1:
                raise _err(f"{s}.perturb_factor", "must be in (0, 1) (0.2: x0.8 or x1.2).")

    @property
    def length(self) -> int | None:
        """Top-rung length in time units (``max_time`` when set, else ``max_length``)."""
        return self.max_time if self.max_time is not None else self.max_length


# --------------------------------------------------------------------- the rest
@dataclasses.dataclass(frozen=True, kw_only=True)
class RetentionConfig:
    """Which checkpoints survive (Determined's ``checkpoint_storage`` policy).

    A checkpoint is kept when it is among its trial's newest ``save_trial_latest``, its
    trial's best ``save_trial_best``, or the experiment's best ``save_experiment_best``
    (ranked by the searcher metric reported at or before its step).
    """

    save_trial_latest: int = 1
    save_trial_best: int = 1
    save_experiment_best: int = 0

    def __post_init__(self) -> None:
        for f in ("save_trial_latest", "save_trial_best", "save_experiment_best"):
            v = getattr(self, f)
            if not _is_int(v) or v < 0:
                raise _err(f"checkpoint_storage.{f}", f"{v!r}: must be an integer >= 0.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourcesConfig:
    """What one trial gets.

    Attributes:
        devices: accelerator devices per trial (CPU: fake XLA devices), from the slots.
        slots: devices the scheduler splits among trials (``None``: GPUs found by
            ``nvidia-smi``, else the CPU count).
        processes: processes per trial (only 1 is supported by the local scheduler).
    """

    devices: int = 1
    slots: int | None = None
    processes: int = 1

    def __post_init__(self) -> None:
        if not _is_int(self.devices) or self.devices < 1:
            raise _err("resources.devices", f"{self.devices!r}: must be an integer >= 1.")
        if self.slots is not None and (not _is_int(self.slots) or self.slots < 1):
            raise _err("resources.slots", f"{self.slots!r}: must be an integer >= 1.")
        if self.slots is not None and self.slots < self.devices:
            raise _err("resources.slots", f"{self.slots} slots cannot hold {self.devices} devices.")
        if self.processes != 1:
            raise _err(
                "resources.processes",
                f"{self.processes}: the local and Ray schedulers run one process per trial; "
                "give a trial more devices instead (resources.devices).",
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlyStoppingConfig:
    """Patience / threshold policy on any reported metric (besides the searcher's own).

    Attributes:
        metric: the metric watched (``None``: off).
        smaller_is_better: direction of improvement.
        patience: stop after this many reports without an improvement of ``min_delta``.
        min_delta: how much better counts as an improvement.
        threshold: stop once the metric is this good (reached the goal).
    """

    metric: str | None = None
    smaller_is_better: bool = True
    patience: int | None = None
    min_delta: float = 0.0
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.patience is not None and (not _is_int(self.patience) or self.patience < 1):
            raise _err("early_stopping.patience", f"{self.patience!r}: an integer >= 1.")
        _check_num("early_stopping.min_delta", self.min_delta)
        _check_num("early_stopping.threshold", self.threshold)
        if self.min_delta < 0:
            raise _err("early_stopping.min_delta", f"{self.min_delta!r}: must be >= 0.")
        if self.metric is None and (self.patience is not None or self.threshold is not None):
            raise _err("early_stopping.metric", "missing: name the metric to watch.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """One experiment.

    Attributes:
        name: shown in ``experiment list``.
        entrypoint: ``module:function`` or ``path/file.py:function`` taking a
            `TrialContext` (or a `Trial` subclass: its ``run(self)`` is called, with the
            context as ``self.ctx``).
        hyperparameters: the space (`Param`s).
        searcher: `SearcherConfig`.
        max_restarts: how often a failing trial is restarted from its latest checkpoint
            before it is marked errored.
        trial_timeout: seconds a trial's process may run (from its launch; each restart
            gets the full time again) before the loop stops it: SIGTERM (the trial's
            preemption save), SIGKILL if it has not exited after a grace period. A
            stopped trial counts as failed (restarted up to ``max_restarts``). ``None``:
            no limit. For hung trials (a stuck collective, a deadlocked loader).
        checkpoint_storage: `RetentionConfig`.
        resources: `ResourcesConfig`.
        early_stopping: `EarlyStoppingConfig`.
        workdir: where the store (``jaxcore.db``), checkpoints, logs and TensorBoard
            files go.
        database: SQLAlchemy URL (``None``: ``sqlite:///<workdir>/jaxcore.db``).
        environment: extra environment variables for trial processes.
        description: free text.
    """

    name: str
    entrypoint: str
    searcher: SearcherConfig
    hyperparameters: tuple[Param, ...] = ()
    max_restarts: int = 5
    trial_timeout: float | None = None
    checkpoint_storage: RetentionConfig = dataclasses.field(default_factory=RetentionConfig)
    resources: ResourcesConfig = dataclasses.field(default_factory=ResourcesConfig)
    early_stopping: EarlyStoppingConfig = dataclasses.field(default_factory=EarlyStoppingConfig)
    workdir: str = "experiments"
    database: str | None = None
    environment: dict = dataclasses.field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise _err("name", "missing: give the experiment a name.")
        if not isinstance(self.entrypoint, str) or ":" not in self.entrypoint:
            raise _err(
                "entrypoint", f"{self.entrypoint!r}: write 'module:function' or 'file.py:function'."
            )
        if not _is_int(self.max_restarts) or self.max_restarts < 0:
            raise _err("max_restarts", f"{self.max_restarts!r}: must be an integer >= 0.")
        _check_num("trial_timeout", self.trial_timeout)
        if self.trial_timeout is not None and not 0 < self.trial_timeout < math.inf:
            raise _err(
                "trial_timeout",
                f"{self.trial_timeout!r}: seconds > 0 (leave it out for no limit).",
            )
        if self.searcher.name == "grid":
            for p in self.hyperparameters:
                if p.type in ("int", "double") and p.count is None:
                    raise _err(f"hyperparameters.{p.name}.count", "the grid searcher needs it.")
        if self.searcher.name == "pbt" and not any(
            p.type in ("int", "double", "categorical") for p in self.hyperparameters
        ):
            raise _err("hyperparameters", "PBT needs at least one non-const hyperparameter.")

    @property
    def database_url(self) -> str:
        if self.database:
            return self.database
        return f"sqlite:///{os.path.abspath(os.path.join(self.workdir, 'jaxcore.db'))}"

    def param(self, name: str) -> Param:
        return next(p for p in self.hyperparameters if p.name == name)


def _section(cls: type, raw: Any, field: str, **extra: Any) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _err(field, f"must be a mapping, got {type(raw).__name__}.")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise _err(f"{field}.{unknown[0]}", f"unknown key; known keys: {sorted(names)}.")
    kw = dict(raw)
    if "bracket_rungs" in kw:
        kw["bracket_rungs"] = tuple(kw["bracket_rungs"] or ())
    return cls(**kw, **extra)


def _parse_environment(raw: Any) -> dict[str, str]:
    """``environment:`` -> ``{NAME: value}``: strings and numbers (as written); a null
    (``FOO:``) was the string "None" and a boolean "True", so they are refused, as Docker
    Compose refuses them, saying how to quote the value."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _err(
            "environment",
            f"a mapping of variable names to values, not {type(raw).__name__} {raw!r}; "
            "write e.g. environment: {XLA_FLAGS: '--xla_dump_to=/tmp/dump', SEED: 3}.",
        )
    out = {}
    for name, value in raw.items():
        if value is None:
            raise _err(
                f"environment.{name}",
                "null (nothing after the colon); write the value, or '' for an empty one.",
            )
        if isinstance(value, bool):
            raise _err(
                f"environment.{name}",
                f"{value!r} is a YAML boolean; quote the string the process should see, "
                f"e.g. '{str(value).lower()}' or '1'.",
            )
        if not isinstance(value, (str, int, float)):
            raise _err(
                f"environment.{name}",
                f"{value!r}: a value is a string or a number; quote it as one string.",
            )
        out[str(name)] = str(value)
    return out


def _sqlite_file_url(url: Any, *, absolute: bool = False) -> Any:
    """A ``sqlite:///PATH`` URL with ``~`` in PATH expanded (and, with ``absolute``, PATH
    made absolute from the CWD); any other value as it is."""
    if not isinstance(url, str) or not url.startswith("sqlite:///"):
        return url
    path = url.removeprefix("sqlite:///")
    if not path or path.startswith(":memory:"):
        return url
    path = os.path.expanduser(path)
    return "sqlite:///" + (os.path.abspath(path) if absolute else path)


def _expand_entrypoint(entry: str, *, absolute: bool = False) -> str:
    """A ``file.py:function`` entrypoint with ``~`` expanded (and, with ``absolute``, its
    file made absolute from the CWD); a ``module:function`` one as it is."""
    path, sep, fn = entry.rpartition(":")
    if not sep or not path.endswith(".py"):
        return entry
    path = os.path.expanduser(path)
    return f"{os.path.abspath(path) if absolute else path}:{fn}"


def parse_config(raw: dict[str, Any], *, base_dir: str | None = None) -> ExperimentConfig:
    """A dict (as read from YAML) -> validated `ExperimentConfig`."""
    if not isinstance(raw, dict):
        raise _err("<file>", "the top level must be a mapping.")
    known = {f.name for f in dataclasses.fields(ExperimentConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise _err(unknown[0], f"unknown top-level key; known keys: {sorted(known)}.")
    for key in ("name", "entrypoint", "searcher"):
        if key not in raw:
            raise _err(key, "missing.")
    if not isinstance(raw["searcher"], dict) or "name" not in raw["searcher"]:
        raise _err("searcher.name", f"missing; use one of {SEARCHERS}.")
    workdir = raw.get("workdir", "experiments")
    if workdir is None or not str(workdir).strip():
        # YAML reads `workdir:` and `workdir: ~` as null, which str() made a folder "None".
        raise _err(
            "workdir",
            "empty (YAML reads `workdir:` and a bare `workdir: ~` as null); write a folder, "
            "e.g. experiments, or ~/experiments for one under your home folder.",
        )
    # `~` is the home folder, as a shell reads it (not a folder named "~" in the CWD).
    workdir = os.path.expanduser(str(workdir))
    entry = _expand_entrypoint(str(raw["entrypoint"]))
    searcher = raw["searcher"]
    if "optuna_storage" in searcher:
        # A SQLite study file absolute from the CWD (`~` the home folder), as the store's
        # URL is: the searcher snapshot pickles the study with this URL, and a resume may
        # run in another folder.
        url = _sqlite_file_url(searcher["optuna_storage"], absolute=True)
        searcher = {**searcher, "optuna_storage": url}
    if base_dir is not None:
        if not os.path.isabs(workdir):
            workdir = os.path.join(base_dir, workdir)
        path, _, fn = entry.rpartition(":")
        if path.endswith(".py") and not os.path.isabs(path):
            entry = f"{os.path.join(base_dir, path)}:{fn}"
    return ExperimentConfig(
        name=raw["name"],
        entrypoint=entry,
        description=str(raw.get("description") or ""),
        hyperparameters=parse_hparams(raw.get("hyperparameters")),
        searcher=_section(SearcherConfig, searcher, "searcher"),
        max_restarts=raw.get("max_restarts", 5),
        trial_timeout=raw.get("trial_timeout"),
        checkpoint_storage=_section(
            RetentionConfig, raw.get("checkpoint_storage"), "checkpoint_storage"
        ),
        resources=_section(ResourcesConfig, raw.get("resources"), "resources"),
        early_stopping=_section(EarlyStoppingConfig, raw.get("early_stopping"), "early_stopping"),
        workdir=workdir,
        database=raw.get("database"),
        environment=_parse_environment(raw.get("environment")),
    )


def load_config(path: str | os.PathLike, overrides: dict | None = None) -> ExperimentConfig:
    """Read and validate a YAML experiment file (relative paths are from the CWD)."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml_load(f.read())
    except FileNotFoundError:
        raise ConfigError(f"experiment config {path}: no such file.") from None
    except IsADirectoryError:
        raise ConfigError(
            f"experiment config {path}: is a folder; give the YAML file in it (e.g. "
            f"{pathlib.Path(path) / 'experiment.yaml'})."
        ) from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"experiment config {path}: not UTF-8 text (byte {e.start}); give the YAML "
            "file, saved as UTF-8."
        ) from None
    except yaml.YAMLError as e:
        # One line: PyYAML's message spans several (problem, context, a caret line).
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"experiment config {path}: not valid YAML{where}: {problem}; fix the file there."
        ) from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(
            f"experiment config {path}: the top level is a {type(raw).__name__}, not a "
            "mapping; write name:, entrypoint:, hyperparameters:, searcher: (see "
            "configs/experiments/)."
        )
    if raw is None:  # nothing but comments, or nothing at all
        raise ConfigError(
            f"experiment config {path}: the file is empty; write name:, entrypoint:, "
            "hyperparameters:, searcher: (see configs/experiments/)."
        )
    raw = dict(raw)
    raw.update(overrides or {})
    config = parse_config(raw)
    _check_max_trials_applies(config, raw.get("searcher") or {})
    return config


def _check_max_trials_applies(config: ExperimentConfig, raw_searcher: dict) -> None:
    """Refuse ``max_trials`` written for a searcher whose trial count is set otherwise (a
    grid of 9 points with ``max_trials: 2`` ran 9 trials without a word); Determined's
    grid, single and PBT searchers have no such field either. Only for the YAML a user
    writes: a config already in a store (its resume) reads as it did."""
    name = config.searcher.name
    if "max_trials" not in raw_searcher or name not in ("grid", "single", "pbt"):
        return
    if name == "grid":
        points = math.prod(len(p.grid()) for p in config.hyperparameters)
        what = (
            f"the grid searcher runs one trial per grid point ({points} here: the product "
            "of the ranges' `count`s and the categoricals' choices); remove max_trials, or "
            "change the counts"
        )
    elif name == "single":
        what = "the single searcher runs one trial; remove it (random runs max_trials)"
    else:
        what = (
            "PBT runs population_size trials, and replaces the worst of them each of its "
            "num_rounds rounds; remove max_trials and set population_size"
        )
    raise _err("searcher.max_trials", f"{what}.")


def to_dict(config: ExperimentConfig) -> dict[str, Any]:
    """The validated config as a plain dict that `parse_config` reads back (the store's copy)."""
    hparams: dict[str, Any] = {}
    for p in config.hyperparameters:
        if p.type == "const":
            hparams[p.name] = p.val
            continue
        spec: dict[str, Any] = {"type": p.type}
        if p.type == "categorical":
            spec["vals"] = list(p.vals)
        else:
            spec.update(minval=p.minval, maxval=p.maxval, log=p.log)
        if p.count is not None:
            spec["count"] = p.count
        hparams[p.name] = spec
    searcher = dataclasses.asdict(config.searcher)
    searcher["bracket_rungs"] = list(config.searcher.bracket_rungs)
    # The study's SQLite file absolute too, for the same reason as the entrypoint's.
    searcher["optuna_storage"] = _sqlite_file_url(searcher["optuna_storage"], absolute=True)
    return {
        "name": config.name,
        # Absolute, as the workdir: a relative file is read from the CWD of the command
        # that created the experiment, and `experiment resume ID --db URL` (what Ctrl-C
        # prints) may run anywhere.
        "entrypoint": _expand_entrypoint(config.entrypoint, absolute=True),
        "description": config.description,
        "hyperparameters": hparams,
        "searcher": searcher,
        "max_restarts": config.max_restarts,
        "trial_timeout": config.trial_timeout,
        "checkpoint_storage": dataclasses.asdict(config.checkpoint_storage),
        "resources": dataclasses.asdict(config.resources),
        "early_stopping": dataclasses.asdict(config.early_stopping),
        "workdir": os.path.abspath(config.workdir),
        "database": config.database,
        "environment": dict(config.environment),
    }

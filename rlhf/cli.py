"""``jaxcore rlhf sft|reward|ppo|grpo|dpo CONFIG.yaml``: one stage from a YAML config.

Every stage writes ``<train.out>/metrics.jsonl`` (one line per step or iteration, with
its index) and checkpoints under ``<train.out>/checkpoints``. PPO and GRPO save every role
and optimizer state each ``checkpoint_every`` iterations (`rlhf.save_trainer`) and, when
started again on the same ``out``, resume from the newest complete checkpoint: metrics
lines past it are dropped and recomputed, so the file ends as an uninterrupted run's.

SIGTERM (a scheduler's preemption notice) stops a run cleanly: the step in progress
finishes, a checkpoint of it is saved (SFT, reward and DPO save theirs under
``<train.out>/resume``; it is removed once the run completes), metrics are flushed, and
the process exits with `jaxcore.PREEMPTION_EXIT_CODE` (75); running the same command again
resumes there and ends as an uninterrupted run. Further SIGTERMs change nothing (a save
in progress is never cut short); a SIGTERM after the last step lets the run finish (0).

SFT, reward and DPO also run as several processes (``jaxcore launch -n 2
--devices-per-process 4 -m jaxcore.cli rlhf sft ...``, srun, a TPU pod): each joins the
run (`jaxcore.initialize`) and feeds its block of every batch, so the result is the one
process's within float tolerance; process 0 writes the metrics. A SIGTERM to any of them
(or to the launcher, which forwards it) stops all at the same step (JAX's preemption
sync point), one checkpoint is saved and each exits 75. PPO and GRPO sample rollouts on
one process's devices: started as several processes they stop at once with an error.

``JAXCORE_RLHF_KILL_AT`` / ``JAXCORE_RLHF_TERM_AT`` send SIGKILL / SIGTERM at named
points (`rlhf.faults`): deterministic fault injection for the resume tests.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import pathlib
import shutil
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxcore import PREEMPTION_EXIT_CODE, ConfigError, JaxcoreError
from rlhf.checkpoint import write_atomic
from rlhf.config import STAGES, RunConfig, load_config
from rlhf.faults import KILL_ENV, TERM_ENV, fault_point

if TYPE_CHECKING:
    from rlhf.checkpoint import TrainerCheckpoints

__all__ = ["KILL_ENV", "TERM_ENV", "main", "run_rl", "run_supervised", "sigterm_stop"]
RESUME_DIR = "resume"  # SFT/reward/DPO preemption checkpoints, apart from the final one


@contextlib.contextmanager
def sigterm_stop() -> Iterator[Callable[[int], bool]]:
    """While entered, SIGTERM only records a request to stop; the run loops call the
    yielded ``stop(step)`` at every step boundary, save and raise `jaxcore.Preempted`, so
    no step or save is cut short however many SIGTERMs arrive.

    One process: `jaxcore.PreemptionWatch`'s flag. Several: JAX's preemption notice
    (which a Python handler would replace) and its sync point, true at the same step on
    every process -- each must call ``stop`` at every step, none may decide alone."""
    from jaxcore import PreemptionWatch

    watch = PreemptionWatch(install=True)
    try:
        yield watch.stop_at
    finally:
        watch.close()


def _never(step: int) -> bool:
    return False


def join_processes(stage: str) -> None:
    """Join the other processes of a multi-process start (`jaxcore launch`, srun, a TPU
    pod; a no-op for one). Without it each process would train alone on its own devices
    and all would write the same ``train.out``."""
    import jax

    import jaxcore as jc
    from jaxcore.distributed import detect

    settings = detect()
    if not settings.multi_process:
        return
    if (settings.num_processes or 1) > 1:  # known before joining: stop before anything
        _one_process_only(stage, settings.num_processes, settings.source)
    jc.initialize()
    if jax.process_count() > 1:  # a cluster JAX detected (a TPU pod) counts once joined
        _one_process_only(stage, jax.process_count(), settings.source)


def _one_process_only(stage: str, processes: int, source: str) -> None:
    """Refuse PPO and GRPO with several processes: their rollouts are sampled and scored
    on one process's devices (each would sample alone and write the same files)."""
    if stage in ("ppo", "grpo"):
        raise ConfigError(
            f"{stage} runs in one process ({processes} were started, from {source}): its "
            "rollouts are sampled and scored on that process's devices. Start it as one "
            "process holding every device (e.g. jaxcore launch -n 1 --devices-per-process "
            "8 ..., or without jaxcore launch); sft, reward and dpo run on several processes."
        )


def _is_primary() -> bool:
    """Whether this process writes the run's files (process 0; the only one alone)."""
    import jax

    return jax.process_index() == 0


class MetricsLog:
    """``metrics.jsonl`` kept to the lines before ``start`` (a resume recomputes the
    rest); each line is flushed and fsynced. The trimmed file replaces the old one
    atomically, so a kill during a resume's rewrite loses no line, and a line torn by a
    kill in the middle of its write is dropped (its step is recomputed)."""

    def __init__(self, path: pathlib.Path, start: int, *, primary: bool = True):
        self._file = None  # another process than 0 of several: process 0 writes the lines
        if not primary:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = path.read_text().splitlines() if path.exists() else []
        kept = [ln for ln in lines if (_step_of(ln) if ln.strip() else start) < start]
        write_atomic(path, "".join(ln + "\n" for ln in kept))
        self._file = path.open("a")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        print(" ".join(f"{k}={v:.4g}" for k, v in line.items()), flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _step_of(line: str) -> float:
    """The step a metrics line records; infinity for a line torn by a kill (dropped)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


def load_reward(spec: Any) -> Any:
    """The callable ``module:name`` names (called with ``kwargs`` first when given)."""
    module, _, name = spec.fn.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(
            f"rewards: cannot load {spec.fn!r} ({e}); write 'module:function'."
        ) from None
    if spec.kwargs:
        try:
            fn = fn(**spec.kwargs)
        except (TypeError, ValueError) as e:  # a misspelt or missing parameter, a bad value
            raise ConfigError(
                f"rewards: {spec.fn}(**{spec.kwargs}) failed ({type(e).__name__}: {e}); "
                "kwargs must be the parameters of that factory."
            ) from None
    if not callable(fn):
        got = "returned" if spec.kwargs else "is"
        raise ConfigError(
            f"rewards: {spec.fn!r} {got} a {type(fn).__name__}, not a function "
            "fn(prompt_ids, completion_ids) -> float."
        )
    return fn


RUN_RECORD = "run.json"  # the settings a ``train.out`` folder's run was started with
# Settings that leave the result as it was: more steps extend the run, and checkpoint
# cadence, device layout and the sampler's slots do not change the arithmetic.
_FREE = {"train.steps", "train.out", "train.checkpoint_every", "parallel", "serving", "split"}


def _settings(cfg: RunConfig) -> dict[str, Any]:
    """``cfg`` as flat ``section.key -> value`` JSON, without the settings in `_FREE`."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if prefix in _FREE:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = value

    walk("", json.loads(json.dumps(dataclasses.asdict(cfg), default=str)))
    for key, off in _RECORDED_WHEN_SET.items():
        if flat.get(key) == off:
            del flat[key]
    for key in _READ_FILES:
        if flat.get(key) and pathlib.Path(flat[key]).is_file():
            flat[key + _CONTENTS] = _sha256(pathlib.Path(flat[key]))
    return flat


# The record files a run reads by position: a resume continues at the same record
# index, so another file under the same path (edited, regenerated, shuffled) would train
# the rest of the run on other records. Their SHA-256 is recorded beside the path.
_READ_FILES = ("data.path", "prompts.path")
_CONTENTS = " contents (sha256)"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# Settings added after runs already recorded theirs: left out at their default, so the
# run.json of a run started before they existed still matches its rerun.
_RECORDED_WHEN_SET = {"model_hf": None, "loss.reference_free": False}


def check_out(cfg: RunConfig) -> None:
    """Refuse a ``train.out`` folder that holds a run started with other settings:
    resuming it (or keeping its final checkpoint) would leave a model of the old
    settings, or one trained partly under each. Reads only (see `_record_settings`).
    A ``train.out`` that is a file, or lies below one, is refused before anything
    compiles (its first write failed with a FileExistsError traceback)."""
    out = pathlib.Path(cfg.train.out)
    if blocker := next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None):
        raise ConfigError(
            f"train.out {out}: {blocker} is a file, not a folder; pass another --out (or "
            "train.out)."
        )
    record = out / RUN_RECORD
    if not record.is_file():
        return
    mine, theirs = _settings(cfg), json.loads(record.read_text())
    for key in [k for k in mine.keys() | theirs.keys() if k.endswith(_CONTENTS)]:
        if key not in mine or key not in theirs:  # a run recorded before, or no file now
            mine.pop(key, None)
            theirs.pop(key, None)
    changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if changed and all(k.endswith(_CONTENTS) for k in changed):
        path = changed[0].removesuffix(_CONTENTS)
        raise ConfigError(
            f"train.out {cfg.train.out} holds a run started on another {path} file: "
            f"{mine[path]} changed since (sha256 {theirs[changed[0]][:12]}... -> "
            f"{mine[changed[0]][:12]}...), and a resume reads on at the same record "
            "position. Put the file back as it was, or pass another --out (or train.out) "
            "for the new data."
        )
    if changed:
        shown = "; ".join(f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in changed[:5])
        raise ConfigError(
            f"train.out {cfg.train.out} holds a run started with other settings ({shown}). "
            "Resuming it would mix the two. Pass another --out (or train.out) for the new "
            "settings, or delete the folder to start over."
        )


def _record_settings(cfg: RunConfig, out: pathlib.Path) -> None:
    """Write ``out``'s `RUN_RECORD` when the run starts training (kept on reruns)."""
    record = out / RUN_RECORD
    if _is_primary() and not record.is_file():
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(record, json.dumps(_settings(cfg), indent=1, sort_keys=True) + "\n")


def _engine(cfg: RunConfig) -> Any:
    import jaxcore as jc

    return jc.Engine(parallel=cfg.parallel, seed=cfg.train.seed)


def _optimizer(lr: float) -> Any:
    import optax

    return optax.adam(lr)


def run_rl(
    cfg: RunConfig,
    report: Callable[[int, dict[str, float]], bool] | None = None,
    checkpoints: TrainerCheckpoints | None = None,
    stop_requested: Callable[[int], bool] = _never,
) -> dict[str, float]:
    """PPO or GRPO for ``train.steps`` iterations, resuming from ``checkpoints`` (default:
    `DirectoryCheckpoints` on ``out/checkpoints``).

    ``report(iterations_done, metrics)`` (e.g. a `jaxcore experiment` trial's) is called
    after each iteration; returning True checkpoints and stops the run there.
    ``stop_requested(iterations_done)`` (from `sigterm_stop`) true after an iteration
    checkpoints it and raises `jaxcore.Preempted`; true before the first, raises it at
    once (nothing new).
    """
    from jaxcore import Preempted
    from rlhf.checkpoint import DirectoryCheckpoints, latest_iteration
    from rlhf.grpo import GRPOTrainer
    from rlhf.layout import build_roles
    from rlhf.ppo import PPOTrainer
    from rlhf.rewards import load_reward_model
    from rlhf.tasks import prompt_batch, random_prompts, read_jsonl

    t, p = cfg.train, cfg.prompts
    # First, so a bad prompts file, reward or reward.model path fails before anything
    # compiles. A run holding more iterations than asked is refused, as SFT's is (it
    # printed "nothing to do: ... already holds all N steps" for a smaller N).
    saved = latest_iteration(pathlib.Path(t.out) / "checkpoints") if checkpoints is None else None
    if saved is not None and saved > t.steps:
        raise ConfigError(
            f"train.out {t.out} holds a run trained for {saved} steps, more than "
            f"train.steps={t.steps}; pass --steps {saved} or more, or another --out."
        )
    fixed = None
    if p.path:
        records = read_jsonl(p.path, ("prompt",), where="prompts.path", tokenizer=p.tokenizer)
        if not records:
            raise ConfigError(
                f'prompts.path {p.path} holds no prompts; write one {{"prompt": [ids]}} '
                "a line, or drop path to sample random prompts."
            )
        where = f"prompts.path {p.path}"
        _check_records(records, ("prompt",), cfg.model, where)
        if empty := next((i for i, r in enumerate(records, 1) if not r["prompt"]), None):
            raise ConfigError(
                f"{where}: record {empty}: the prompt is empty; a rollout starts from at "
                "least one prompt token."
            )
        _check_prompt_room(records, cfg, where)
        fixed = [r["prompt"] for r in records]
    else:  # random prompts of prompts.length ids: the same room check, naming the setting
        _check_prompt_room([{"prompt": [0] * p.length}], cfg, "prompts.length")
    _check_rollout_rows(cfg)
    rewards = [(load_reward(s), s.weight) for s in cfg.rewards]
    reward_model = None
    if cfg.reward is not None:
        longest = max(map(len, fixed)) if fixed is not None else p.length
        reward_model = load_reward_model(
            cfg.reward.model,
            _engine(cfg),
            cfg.model,
            rollout_len=longest + getattr(cfg, cfg.stage).max_tokens,
        )
    roles = build_roles(cfg, _optimizer)  # colocated or split, LoRA or full actor
    sampler = roles.sampler
    if reward_model is not None:
        rewards.append((reward_model, cfg.reward.weight))
    if cfg.stage == "ppo":
        trainer: Any = PPOTrainer(
            roles.actor, roles.critic, sampler, rewards, cfg.ppo, **roles.reference
        )
    else:
        trainer = GRPOTrainer(*roles.actor, sampler, rewards, cfg.grpo)

    def prompts(i: int) -> list[list[int]]:
        if fixed is not None:
            return prompt_batch(fixed, i, p.count)
        return random_prompts(i, p.count, p.length, p.low, cfg.model.vocab_size, p.seed)

    out = pathlib.Path(t.out)
    if checkpoints is None:
        checkpoints = DirectoryCheckpoints(out / "checkpoints")
    start = checkpoints.restore(trainer, roles.actor[0])
    if stop_requested(start):  # SIGTERM while building or restoring: nothing new to save
        raise Preempted(start)
    _record_settings(cfg, out)
    log = MetricsLog(out / "metrics.jsonl", start)
    metrics: dict[str, float] = {}
    try:
        for i in range(start, t.steps):
            fault_point(i, "step")
            metrics = trainer.step(prompts(i))
            if reward_model is not None:  # the reward model's own (unweighted) mean score
                metrics["reward_model_mean"] = float(reward_model.last_scores.mean())
            log.write(i, metrics)
            done = i + 1
            stop = report(done, metrics) if report is not None else False
            fault_point(done, "before_save")
            scheduled = done == t.steps or (t.checkpoint_every and done % t.checkpoint_every == 0)
            saved = bool(stop or stop_requested(done) or scheduled)
            if saved:
                checkpoints.save(trainer)
                fault_point(done, "saved")
            if stop_requested(done) and done < t.steps:
                if not saved:  # the SIGTERM came after the decision to skip this save
                    checkpoints.save(trainer)
                raise Preempted(done)
            if stop:
                break
    finally:
        log.close()
    return metrics


def _records(cfg: RunConfig, keys: tuple[str, ...]) -> tuple[list[dict], list[dict]]:
    from rlhf.tasks import read_jsonl, synthetic_records

    d = cfg.data
    if d.path:
        records = read_jsonl(d.path, keys, tokenizer=d.tokenizer)
        if not records:
            raise ConfigError(
                f"data.path {d.path} holds no records; write one JSON object a line (see "
                "configs/rlhf/ and the RLHF section of README.md)."
            )
    else:
        records = synthetic_records(
            d.n + d.held_out,
            seed=d.seed,
            prompt_len=d.prompt_len,
            completion_len=d.completion_len,
            token=d.token,
            low=d.low,
            vocab=cfg.model.vocab_size,
        )
    _check_records(
        records,
        keys,
        cfg.model,
        f"data.path {d.path}" if d.path else "data (synthetic)",
        row=cfg.loss.length + 1 if cfg.stage == "sft" else None,
    )
    if len(records) <= d.held_out:
        raise ConfigError(
            f"data: {len(records)} records but held_out={d.held_out}; add records or lower it."
        )
    return records[: -d.held_out or None], records[len(records) - d.held_out :]


def _check_records(
    records: list[dict], keys: tuple[str, ...], model: Any, where: str, row: int | None = None
) -> None:
    """Every id in ``[0, vocab_size)`` and prompt + answer within ``max_seq_len`` (an id
    outside the vocabulary embeds as NaN; a longer row is past the model's context), and
    for SFT within ``row`` (``loss.length + 1``, one packed row). ``where`` names the
    records' source in errors."""
    vocab, limit = model.vocab_size, model.max_seq_len
    for i, rec in enumerate(records, 1):
        for k in keys:
            bad = [t for t in rec[k] if not 0 <= t < vocab]
            if bad:
                raise ConfigError(
                    f"{where}: record {i}: {k} holds id {bad[0]}, outside [0, {vocab}) "
                    "(model.vocab_size); tokenize with the model's tokenizer."
                )
        for k in keys[1:]:  # each answer follows the prompt in one row
            n = len(rec[keys[0]]) + len(rec[k])
            if n > limit:
                raise ConfigError(
                    f"{where}: record {i}: {keys[0]} + {k} is {n} tokens; model.max_seq_len "
                    f"is {limit}. Shorten or drop the record, or raise max_seq_len."
                )
            if row is not None and n > row:
                raise ConfigError(
                    f"{where}: record {i}: {keys[0]} + {k} is {n} tokens; an SFT row holds "
                    f"loss.length + 1 = {row}. Raise loss.length, or shorten or drop the record."
                )


def _pad(seqs: list[list[int]], length: int) -> np.ndarray:
    out = np.zeros((len(seqs), length), np.int32)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def _batches(arrays: dict[str, np.ndarray], size: int, where: str) -> list[dict]:
    n = len(next(iter(arrays.values())))
    if n < size:
        raise ConfigError(
            f"{where}: {n} rows, fewer than train.batch_size={size}; add data or lower it."
        )
    return [{k: v[i : i + size] for k, v in arrays.items()} for i in range(0, n - size + 1, size)]


def _local_rows(engine: Any, batches: list[dict]) -> list[dict]:
    """This process's rows of each batch (`jaxcore.Engine.local_rows`): every process
    reads all the data and feeds its block of each global batch (all of it when alone)."""
    import jax

    if jax.process_count() == 1 or not batches:
        return batches
    lo, hi = engine.local_rows(len(next(iter(batches[0].values()))))
    return [{k: v[lo:hi] for k, v in b.items()} for b in batches]


def _pair_arrays(records: list[dict], stage: str) -> dict[str, np.ndarray]:
    chosen = [r["prompt"] + r["chosen"] for r in records]
    rejected = [r["prompt"] + r["rejected"] for r in records]
    length = max(map(len, chosen + rejected))
    out = {"chosen": _pad(chosen, length), "rejected": _pad(rejected, length)}
    if stage == "reward":
        out["chosen_len"] = np.array([len(s) for s in chosen], np.int32)
        out["rejected_len"] = np.array([len(s) for s in rejected], np.int32)
    else:  # DPO: only completion tokens count
        for key, seqs in (("chosen", chosen), ("rejected", rejected)):
            mask = np.zeros((len(records), length), np.float32)
            for i, r in enumerate(records):
                mask[i, len(r["prompt"]) : len(seqs[i])] = 1.0
            out[key + "_mask"] = mask
    return out


def _save_state(
    engine: Any, cfg: RunConfig, directory: pathlib.Path, state: Any, step: int
) -> None:
    """``state`` as step ``step`` in ``directory``, recording the stage and model shape
    (Ctrl-C during the save takes effect once it is complete)."""
    import jaxcore as jc
    from jaxcore.checkpointing.preemption import sigint_deferred
    from rlhf.rewards import stage_record

    with (
        sigint_deferred(),
        jc.Checkpointer(
            # SIGTERM stays with the run's own handler (`sigterm_stop`): see role_checkpointer.
            jc.CheckpointConfig(directory=directory, async_save=False, save_on_sigterm=False),
            engine=engine,
            # what reward.model: checks (an HF-started reward model has no head bias)
            run_config=stage_record(
                cfg.stage, cfg.model, head_bias=not (cfg.stage == "reward" and cfg.model_hf)
            ),
        ) as ckpt,
    ):
        fault_point(step, "saving")
        ckpt.save(state, force=True, step=step)


def _resume_state(
    engine: Any, directories: tuple[pathlib.Path, ...], state: Any
) -> tuple[Any, int]:
    """The newest step saved in any of ``directories`` (a preemption checkpoint, or the
    final one of a finished run) restored, and that step; else ``(state, 0)``."""
    import jaxcore as jc
    from rlhf.checkpoint import abstract_like

    newest: tuple[int, pathlib.Path] | None = None
    for directory in directories:
        if not directory.is_dir():
            continue
        config = jc.CheckpointConfig(directory=directory, async_save=False, save_on_sigterm=False)
        with jc.Checkpointer(config, engine=engine) as ckpt:
            step = ckpt.latest_step()
        if step is not None and (newest is None or step > newest[0]):
            newest = (step, directory)
    if newest is None:
        return state, 0
    step, directory = newest
    config = jc.CheckpointConfig(directory=directory, async_save=False, save_on_sigterm=False)
    with jc.Checkpointer(config, engine=engine) as ckpt:
        return ckpt.restore(step, abstract_like(state)), step


def run_supervised(
    cfg: RunConfig, stop_requested: Callable[[int], bool] = _never
) -> dict[str, float]:
    """SFT, reward model or DPO for ``train.steps`` batches; held-out metrics at the end.

    ``stop_requested(batches_done)`` (from `sigterm_stop`) true after a batch saves the
    state under ``<train.out>/resume`` and raises `jaxcore.Preempted`; a rerun resumes
    from there. With several processes (`join_processes`) each feeds its rows of every
    batch and process 0 writes the metrics and the run record.
    """
    import jaxcore as jc
    from jaxcore import Preempted
    from rlhf.dpo import dpo_objective, with_reference
    from rlhf.layout import copy_role
    from rlhf.models import hf_scalar_head_factory, scalar_head_factory
    from rlhf.reward import reward_loss
    from rlhf.sft import pack, sft_loss

    t, loss = cfg.train, cfg.loss
    engine = _engine(cfg)
    if cfg.stage == "sft":
        train, held = _records(cfg, ("prompt", "completion"))

        def rows(recs: list[dict]) -> dict[str, np.ndarray]:
            return pack(
                [(r["prompt"], r["completion"]) for r in recs], loss.length, packing=loss.packing
            )

        factory, loss_fn = _policy_factory(cfg, engine), sft_loss()
        train_b = _batches(rows(train), t.batch_size, "data (train rows)")
        held_b = _batches(rows(held), t.batch_size, "data.held_out (rows)")
    else:
        train, held = _records(cfg, ("prompt", "chosen", "rejected"))
        train_b = _batches(_pair_arrays(train, cfg.stage), t.batch_size, "data (train pairs)")
        held_b = _batches(_pair_arrays(held, cfg.stage), t.batch_size, "data.held_out (pairs)")
        if cfg.stage == "reward":
            factory = (
                scalar_head_factory(cfg.model)
                if cfg.model_hf is None
                else hf_scalar_head_factory(cfg.model_hf, engine, seed=t.seed)
            )
            loss_fn = reward_loss(center_coef=loss.center_coef)
        else:
            factory = _policy_factory(cfg, engine)
            loss_fn = dpo_objective(
                beta=loss.beta,
                label_smoothing=loss.label_smoothing,
                reference_free=loss.reference_free,
            )
    train_b, held_b = _local_rows(engine, train_b), _local_rows(engine, held_b)
    state = engine.prepare(factory, _optimizer(t.lr), seed=t.seed)
    # DPO: reference log-probs once, from a copy (steps donate state); none reference-free.
    if cfg.stage == "dpo" and not loss.reference_free:
        reference = copy_role(state)
        train_b = with_reference(engine, reference, train_b)
        held_b = with_reference(engine, reference, held_b)
        del reference
    step, evaluate = engine.train_step(loss_fn), engine.eval_step(loss_fn)
    out = pathlib.Path(t.out)
    # After DPO's reference. The final checkpoint counts too: a rerun of a finished run used
    # to train it all again from step 0, and --steps N (more) did not go on from it.
    state, start = _resume_state(engine, (out / RESUME_DIR, out / "checkpoints"), state)
    if start > t.steps:
        raise ConfigError(
            f"train.out {out} holds a run trained for {start} steps, more than "
            f"train.steps={t.steps}; pass --steps {start} or more, or another --out."
        )
    if start == t.steps:
        return {}  # finished: nothing to train, nothing new to evaluate
    if stop_requested(start):  # SIGTERM while building or restoring: nothing new to save
        raise Preempted(start)
    _record_settings(cfg, out)
    log = MetricsLog(out / "metrics.jsonl", start, primary=_is_primary())
    try:
        for i in range(start, t.steps):
            fault_point(i, "step")
            state, metrics = step(state, train_b[i % len(train_b)])
            log.write(i, {k: v for k, v in metrics.items() if np.ndim(v) == 0})
            if stop_requested(i + 1) and i + 1 < t.steps:
                _save_state(engine, cfg, out / RESUME_DIR, state, i + 1)
                raise Preempted(i + 1)
        mean = jc.MeanMetrics()
        for b in held_b:
            mean.update({k: v for k, v in evaluate(state, b).items() if np.ndim(v) == 0})
        held_metrics = {"held_out_" + k: float(v) for k, v in mean.compute().items()}
        log.write(t.steps, held_metrics)
    finally:
        log.close()
    _save_state(engine, cfg, out / "checkpoints", state, t.steps)
    if _is_primary():  # the final checkpoint (saved by every process) supersedes it
        shutil.rmtree(out / RESUME_DIR, ignore_errors=True)
    return held_metrics


def _policy_factory(cfg: RunConfig, engine: Any) -> Any:
    """The SFT / DPO policy: ``model.hf``'s checkpoint read onto ``engine``'s mesh (each
    process its slices, `jaxcore.hf.model_factory`), else a fresh `lm_factory` model."""
    from rlhf.models import lm_factory

    if cfg.model_hf is None:
        return lm_factory(cfg.model)
    from jaxcore import hf

    return hf.model_factory(cfg.model_hf, engine)


def _joined() -> bool:
    """Whether this process joined others (`join_processes`)."""
    import jax

    return bool(jax.distributed.is_initialized())


def _shards(engine: Any) -> int:
    """How many data-parallel shards ``engine`` cuts a batch into: the smallest batch
    `jaxcore.Engine.local_rows` accepts (every accepted size is a multiple of it)."""
    import jax

    from jaxcore import BatchError

    for rows in range(1, jax.device_count() + 1):
        try:
            engine.local_rows(rows)
        except BatchError:
            continue
        return rows
    return 1


def _check_rollout_rows(cfg: RunConfig) -> None:
    """Each iteration's rollouts split into the batches the roles train and score on,
    checked before anything compiles: a batch that is no multiple of an engine's
    data-parallel shards stopped the first iteration after its rollout ("batch[tokens]
    has leading size 4, which does not divide into 8 data-parallel shards")."""
    import jaxcore as jc
    from rlhf.split import SplitLayout

    count = cfg.prompts.count
    layout = SplitLayout(cfg.split, seed=cfg.train.seed) if cfg.split is not None else None
    if cfg.stage == "grpo":
        g = cfg.grpo.num_generations
        rows, what = count * g, f"batches of prompts.count x grpo.num_generations = {count} x {g}"
        per, unit = 1, "prompts.count x grpo.num_generations"
    else:
        k = cfg.ppo.num_minibatches
        rows, what = (
            count / k,
            f"minibatches of prompts.count / ppo.num_minibatches = {count} / {k}",
        )
        per, unit = k, "prompts.count"
    roles = ("actor", "critic") if cfg.stage == "ppo" else ("actor",)
    for role in roles:
        engine = layout.engine(role) if layout else jc.Engine(parallel=cfg.parallel)
        ways = _shards(engine)
        if rows != int(rows) or int(rows) % ways:
            raise ConfigError(
                f"{cfg.stage} trains the {role} on {what} rollouts, which its {ways} "
                f"data-parallel shards cannot split evenly; use a {unit} that is a multiple "
                f"of {ways * per}."
            )
        if layout is None:
            return  # one mesh: every role shards as the actor does


def _check_prompt_room(records: list[dict], cfg: RunConfig, where: str) -> None:
    """Every prompt leaves ``max_tokens`` of room in the sampler's context (``serving.
    max_len``, else ``model.max_seq_len``), checked at start: the sampler would refuse it
    only at the iteration that first draws it (TRL truncates prompts to a
    ``max_prompt_length`` the user sets; here the user shortens or drops them)."""
    limit = cfg.serving.max_len or cfg.model.max_seq_len
    max_tokens = getattr(cfg, cfg.stage).max_tokens
    for i, r in enumerate(records, 1):
        n = len(r["prompt"])
        if n + max_tokens > limit:
            which = f"{where}: record {i}: the prompt" if where != "prompts.length" else where
            fix = "shorten or drop the prompt" if where != "prompts.length" else "lower it"
            raise ConfigError(
                f"{which} has {n} tokens and {cfg.stage}.max_tokens "
                f"is {max_tokens} ({n + max_tokens} in all), over the sampler's context of "
                f"{limit} tokens (serving.max_len); {fix}, lower "
                f"{cfg.stage}.max_tokens, or raise serving.max_len (up to model.max_seq_len)."
            )


def _fail(code: int, message: str) -> int:
    """Print ``message``; when joined to other processes, leave at once with ``code``.

    A normal exit would wait in jax.distributed's shutdown barrier for the others, which
    wait in their next collective for this one (for gloo's timeout, or for good): leaving
    closes this process's connections, so `jaxcore launch` (or srun) stops them now.
    """
    print(message, file=sys.stderr, flush=True)
    if _joined():
        sys.stdout.flush()
        os._exit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jaxcore rlhf", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=STAGES)
    parser.add_argument("config", help="YAML file (see configs/rlhf/)")
    parser.add_argument("--out", help="override train.out")
    parser.add_argument("--steps", type=int, help="override train.steps")
    args = parser.parse_args(argv)
    from jaxcore import Preempted

    out = "train.out"  # until the config is read
    try:
        cfg = load_config(args.stage, args.config)
        overrides = {k: v for k, v in (("out", args.out), ("steps", args.steps)) if v is not None}
        if overrides:
            cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **overrides))
        out = cfg.train.out
        check_out(cfg)
        join_processes(cfg.stage)
        with sigterm_stop() as stop:
            if cfg.stage in ("ppo", "grpo"):
                final = run_rl(cfg, stop_requested=stop)
            else:
                final = run_supervised(cfg, stop_requested=stop)
    except JaxcoreError as e:
        return _fail(2, f"jaxcore rlhf {args.stage}: {e}")
    except KeyboardInterrupt:  # Ctrl-C: one line (a traceback said nothing of resuming)
        return _fail(
            130,
            f"jaxcore rlhf {args.stage}: interrupted (Ctrl-C); run the same command again to "
            f"resume from the last checkpoint in {out} (every "
            f"train.checkpoint_every steps; SIGTERM saves the current step before it stops).",
        )
    except Preempted as e:  # SIGTERM: the step's checkpoint is saved
        print(
            f"jaxcore rlhf {args.stage}: SIGTERM: stopped after {e.step} of "
            f"{cfg.train.steps} steps, metrics in {cfg.train.out}/metrics.jsonl; run the "
            f"same command again to resume at step {e.step}. Exit code "
            f"{PREEMPTION_EXIT_CODE}.",
            file=sys.stderr,
        )
        return PREEMPTION_EXIT_CODE
    except Exception:
        if not _joined():
            raise
        import jax

        traceback.print_exc()
        return _fail(
            1, f"jaxcore rlhf {args.stage}: process {jax.process_index()} failed (traceback above)"
        )
    if not final:  # a rerun of a finished run trains nothing (PPO/GRPO printed "done, {}")
        print(
            f"jaxcore rlhf {args.stage}: nothing to do: {cfg.train.out} already holds all "
            f"{cfg.train.steps} steps; pass --steps N (more) to train on, or another --out "
            "for a new run."
        )
        return 0
    summary = {k: round(v, 4) for k, v in final.items()}
    print(f"jaxcore rlhf {args.stage}: done, {summary}; metrics in {cfg.train.out}/metrics.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())

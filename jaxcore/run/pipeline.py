"""`run_pipeline(config)`: the phases in order, skipping the finished ones, then the summary.

`dry_run(config)` says what a run would do without doing it: the phases (run or reuse),
the data inputs, the mesh and XLA's ahead-of-time memory estimate per device for the
train step (``compiled.memory_analysis()``, through `jaxcore.compile_estimate`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import pathlib
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console

from jaxcore.errors import ConfigError
from jaxcore.run import phases as ph
from jaxcore.run.config import RunConfig
from jaxcore.run.follower import follow
from jaxcore.run.hosts import Hosts, Solo, close_hosts, open_hosts, write_probe
from jaxcore.run.summary import render, summary_sections, write_summary


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run did: each phase's output, which phases were reused, the summary."""

    outputs: dict[str, dict[str, Any]]
    skipped: tuple[str, ...]
    seconds: dict[str, float]
    summary: dict[str, Any]
    text: str


# Test seam: called with each phase's name before process 0 runs it (fault-injection
# tests pause a phase here to kill another process at a known moment).
before_phase: Any = None


def run_pipeline(config: RunConfig, *, console: Console | None = None) -> RunResult:
    """Run every phase of ``config`` (reusing finished ones) and print the summary.

    Under several processes (`jaxcore.initialize` first) process 0 runs the host-local
    phases and the others follow it (`jaxcore.run.hosts`); all of them train.
    """
    console = console or Console()
    hosts = open_hosts(say=lambda text: console.print(text, markup=False, highlight=False))
    try:
        if not hosts.is_leader:
            try:
                done = follow(config.path, hosts)
            except Exception as e:  # process 0 learns it at its next wait
                hosts.report_failure(f"{type(e).__name__}: {e}")
                raise
            return RunResult({}, (), {}, {"process": done}, "")
        try:
            if isinstance(hosts, Hosts):
                folders = [config.path, pathlib.Path(config.data.output_dir)]
                token = write_probe(folders)
                hosts.publish("hello", folders=[str(f) for f in folders], token=token)
                hosts.wait_followers("checking that run_dir and data.output_dir are shared")
            return _lead(config, console, hosts)
        except BaseException as e:
            hosts.publish("error", message=f"{type(e).__name__}: {e}")  # followers stop too
            raise
    finally:
        close_hosts()


@contextlib.contextmanager
def run_dir_lock(run_dir: pathlib.Path) -> Iterator[None]:
    """Hold ``<run_dir>/run.lock`` for the run: a second `jaxcore run` on the same
    directory would write the same phase records, dataset shards and store at once.

    An advisory ``flock``: the kernel drops it when the holder dies (``kill -9``), so a
    rerun after a crash is never refused.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "run.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise ConfigError(
                f"run_dir {run_dir} is in use by another `jaxcore run` (pid {holder}); wait "
                "for it to end, or give this run another run_dir (--set run_dir=...)."
            ) from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_batch_fits(config: RunConfig) -> None:
    """Raise `ConfigError` unless ``train.batch`` splits over this run's devices (FSDP over
    every device, each shard cut into ``train.grad_accum`` microbatches): before any phase
    runs, rather than in XLA's sharding check once the data phase is done."""
    import jax
    import numpy as np

    from jaxcore.errors import BatchError
    from jaxcore.run import trial
    from jaxcore.sharding import batch_ways

    tr = config.train
    engine = trial.build_engine(ph.run_hparams(config, config.tokenizer.vocab_size))
    tokens = np.broadcast_to(np.int32(0), (tr.batch, config.model.seq_len + 1))  # no copy
    try:
        engine.check_batch({"tokens": tokens})
    except BatchError:
        need = batch_ways(engine.mesh, engine.rules) * tr.grad_accum
        raise ConfigError(
            f"train.batch={tr.batch} does not split over this run's {jax.device_count()} "
            f"devices x train.grad_accum={tr.grad_accum}: use a multiple of {need}, e.g. "
            f"--set train.batch={max(need, tr.batch // need * need)}."
        ) from None


def _lead(config: RunConfig, console: Console, hosts: Solo | Hosts) -> RunResult:
    check_batch_fits(config)
    with run_dir_lock(config.path):
        return _run_phases(config, console, hosts)


def _run_phases(config: RunConfig, console: Console, hosts: Solo | Hosts) -> RunResult:
    run_dir = config.path
    ctx = ph.RunContext(config=config, console=console)
    skipped, seconds = [], {}
    for i, phase in enumerate(ph.PHASES, 1):
        fp = ph.fingerprint(config, phase, ctx.outputs)
        record = ph.read_record(run_dir, phase)
        title = f"[bold cyan]phase {i}/{len(ph.PHASES)}: {phase}[/]"
        reuse = record is not None and record["fingerprint"] == fp
        stale = ph.stale_reason(config, phase, record["output"]) if reuse else None
        if stale:
            console.print(f"{title}: the earlier run's result is stale ({stale}): run again")
            reuse = False
        # Process 0 decides what is reused; the others do as it says.
        hosts.publish("phase", phase=phase, action="skip" if reuse else "run")
        hosts.wait_followers(f"at the start of the {phase} phase")
        if reuse:
            console.print(f"{title} finished in an earlier run: skipped")
            ctx.outputs[phase] = record["output"]
            skipped.append(phase)
            continue
        console.print(title)
        if before_phase is not None:
            before_phase(phase)
        t0 = time.perf_counter()
        ctx.outputs[phase] = ph.RUNNERS[phase](ctx)
        seconds[phase] = round(time.perf_counter() - t0, 2)
        ph.write_record(
            run_dir,
            phase,
            {
                "phase": phase,
                "fingerprint": fp,
                "seconds": seconds[phase],
                "output": ctx.outputs[phase],
            },
        )
        hosts.publish("phase_done", phase=phase)
        hosts.wait_followers(f"after the {phase} phase")
        console.print(f"  {phase} done in {seconds[phase]:.1f} s")
    sections = summary_sections(ctx.outputs, run_dir)
    write_summary(run_dir, sections)
    text = render(sections, skipped)
    console.rule(f"[bold]jaxcore run {config.name}: summary")
    console.print(text, markup=False, highlight=False)
    hosts.publish("end")
    hosts.wait_followers("at the end of the run")
    return RunResult(ctx.outputs, tuple(skipped), seconds, sections, text)


def dry_run(config: RunConfig, *, console: Console | None = None) -> dict[str, Any]:
    """Print (and return) the plan: phases, inputs, mesh, per-device AOT memory estimate."""
    import jax
    import jax.numpy as jnp

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, count_params, lm_loss
    from jaxcore.run import trial

    console = console or Console()
    check_batch_fits(config)
    run_dir = config.path
    sources = ph.package_sources(config.data.packages) + [dict(s) for s in config.data.sources]
    key = ph.input_hash(sources, config)
    version_dir = pathlib.Path(config.data.output_dir) / f"v-{key[:12]}"
    dataset_exists = (version_dir / "manifest.json").is_file()
    # A dataset found by its input hash is reused without reading the sources again.
    repositories = None if dataset_exists else ph.check_sources(sources, config.data.output_dir)
    outputs: dict[str, dict] = {}
    plan_phases = []
    for phase in ph.PHASES:
        record = ph.read_record(run_dir, phase)
        reuse = (
            record is not None
            and record["fingerprint"] == ph.fingerprint(config, phase, outputs)
            and ph.stale_reason(config, phase, record["output"]) is None
        )
        if reuse:
            outputs[phase] = record["output"]
        plan_phases.append({"phase": phase, "action": "reuse" if reuse else "run"})
    vocab = outputs.get("tokenizer", {}).get("vocab_size", config.tokenizer.vocab_size)
    m, tr = config.model, config.train
    hp = {**ph.run_hparams(config, vocab), "lr": tr.lr}
    cfg: TransformerConfig = trial.model_config(hp)
    engine = trial.build_engine(hp)
    est = jc.compile_estimate(
        engine,
        lambda rngs: Transformer(cfg, rngs=rngs),
        trial.optimizer(hp),
        lm_loss,
        {"tokens": ((tr.batch, m.seq_len + 1), jnp.int32)},
    )
    plan = {
        "run_dir": str(run_dir),
        "phases": plan_phases,
        "data": {
            "sources": [s["path"] for s in sources],
            "input_hash": key,
            "dataset_version": version_dir.name,
            "dataset_exists": dataset_exists,
            "repositories": repositories,
        },
        "model": {**dataclasses.asdict(cfg), "parameters": count_params(cfg)},
        "mesh": {k: int(v) for k, v in engine.mesh.shape.items()},
        "devices": f"{jax.device_count()} x {jax.devices()[0].platform}",
        "zero": tr.zero,
        "remat": tr.remat,
        "layer_loop": "unrolled" if engine.last_plan.trace_context().unroll_layers else "scan",
        "precision": tr.precision,
        "grad_accum": tr.grad_accum,
        "global_batch": tr.batch,
        "memory_per_device_bytes": {
            "arguments": est.argument_bytes,
            "outputs": est.output_bytes,
            "temporaries": est.temp_bytes,
            "aliased": est.alias_bytes,
            "peak": est.per_device_bytes,
        },
        "flops_per_device_step": est.flops,
    }
    console.rule(f"[bold]jaxcore run {config.name} --dry-run")
    for p in plan_phases:
        console.print(f"  phase {p['phase']:<10} {p['action']}")
    d = plan["data"]
    console.print(
        f"  data: {len(d['sources'])} sources, input hash {key[:12]} -> {d['dataset_version']} "
        f"({'exists: reused' if dataset_exists else f'to build from {repositories} repositories'})"
    )
    console.print(
        f"  model: {plan['model']['parameters'] / 1e6:.2f}M parameters, vocab {vocab}, "
        f"seq {m.seq_len}; devices {plan['devices']}; mesh {plan['mesh']}; ZeRO-{tr.zero}"
    )
    mem = plan["memory_per_device_bytes"]
    console.print(
        f"  AOT memory per device (XLA memory_analysis): peak {mem['peak'] / 2**20:.1f} MiB = "
        f"arguments {mem['arguments'] / 2**20:.1f} + outputs {mem['outputs'] / 2**20:.1f} + "
        f"temporaries {mem['temporaries'] / 2**20:.1f} - donated {mem['aliased'] / 2**20:.1f}"
    )
    return plan

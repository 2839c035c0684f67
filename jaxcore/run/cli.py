"""``jaxcore run CONFIG.yaml [--set KEY=VALUE ...] [--dry-run]``.

Runs data -> tokenizer -> train -> search -> register -> serve -> summary from one
config; a second run reuses what is finished. ``--dry-run`` prints the plan, the mesh
and the per-device memory estimate without running a phase.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback


def add_run_options(p: argparse.ArgumentParser) -> None:
    """``--set``, ``--dry-run`` and ``--json``: `jaxcore run`'s options, which ``jaxcore demo``
    passes on (named there too, so its --help lists them)."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key, e.g. --set train.steps=4 (repeatable; values are YAML)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--json", action="store_true", help="also print the plan/summary as JSON")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="jaxcore run", description=__doc__.splitlines()[0])
    p.add_argument("config", help="the run YAML (e.g. configs/demo.yaml)")
    add_run_options(p)
    return p.parse_args(argv)


def _env_overrides() -> list[str]:
    """``JAXCORE_RUN_SET="train.steps=4;search.enabled=false"`` (for make demo users)."""
    text = os.environ.get("JAXCORE_RUN_SET", "")
    return [s.strip() for s in text.split(";") if s.strip()]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from jaxcore.errors import ConfigError
    from jaxcore.run.config import load_run_config

    try:
        config = load_run_config(args.config, [*_env_overrides(), *args.overrides])
    except ConfigError as e:
        print(f"jaxcore run: {e}", file=sys.stderr)
        return 2
    # Fake CPU devices must be asked for before JAX starts its backend.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flag = f"--xla_force_host_platform_device_count={config.train.devices}"
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    import jax

    import jaxcore
    from data.errors import DataError
    from jaxcore.experiments.trial_executors import TrialTerminated
    from jaxcore.run.hosts import LeaderFailedError, PeerLostError
    from jaxcore.run.pipeline import dry_run, run_pipeline

    # Several processes (jaxcore launch, srun, a TPU pod's workers): join them first; a
    # no-op for one process.
    jaxcore.initialize()

    if jax.config.jax_compilation_cache_dir is None:
        # Trials of one shape differ only in values held in the optimizer state, so the
        # search's trials (and a second run) load the train phase's compiled programs.
        jax.config.update("jax_compilation_cache_dir", str(config.path / "xla_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

    try:
        if args.dry_run:
            if jax.process_index() != 0:
                return 0  # process 0 prints the plan
            plan = dry_run(config)
            if args.json:
                print(json.dumps(plan, indent=1, default=str))
            return 0
        result = run_pipeline(config)
    except ConfigError as e:
        return _fail(2, f"jaxcore run: {e}")
    except DataError as e:  # the data phase's own checks (a source path that is missing)
        return _fail(2, f"jaxcore run: data phase: {e}")
    except (LeaderFailedError, PeerLostError) as e:
        return _fail(1, f"jaxcore run: process {jax.process_index()}: {e}")
    except TrialTerminated as e:
        return _fail(  # jaxcore's "preempted, saved: rerun to resume" code (requeued)
            jaxcore.PREEMPTION_EXIT_CODE,
            f"jaxcore run: terminated ({e}). Run the same command again: finished phases "
            "are reused and the interrupted one resumes from its last checkpoint.",
        )
    except KeyboardInterrupt:
        return _fail(
            130,
            "jaxcore run: interrupted. Run the same command again: finished phases are "
            "reused and the interrupted one resumes from its last checkpoint.",
        )
    except Exception:
        traceback.print_exc()
        return _fail(1, f"jaxcore run: process {jax.process_index()} failed (traceback above)")
    if args.json:
        print(json.dumps(result.summary, indent=1, default=str))
    return 0


def _fail(code: int, message: str) -> int:
    """Print ``message``; with several processes, leave at once with ``code``.

    A normal exit would enter jax.distributed's shutdown barrier, which waits for every
    process: for a lost one until JAX's heartbeat timeout, for one blocked in a collective
    with this one for the shutdown timeout (5 min). Leaving at once closes this process's
    connections, so the others fail now too (a collective loses its peer, or the
    coordination service in process 0 goes away and JAX terminates them).
    """
    import jax

    print(message, file=sys.stderr, flush=True)
    if jax.process_count() > 1:
        sys.stdout.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

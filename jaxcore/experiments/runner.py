"""Run one trial: the body of a trial process (``python -m jaxcore.experiments.runner``).

The scheduler starts it with ``JAXCORE_DB_URL`` and ``JAXCORE_TRIAL_ID`` in the
environment (and the trial's device slot in ``XLA_FLAGS`` / ``CUDA_VISIBLE_DEVICES``);
it loads the experiment's entrypoint and calls it with a `TrialContext`. Exit status:
0 done, `jaxcore.PREEMPTION_EXIT_CODE` preempted (requeue), anything else failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import pathlib
import sys
from typing import Any

from jaxcore.errors import ConfigError

log = logging.getLogger(__name__)


def load_entrypoint(spec: str) -> Any:
    """``module:attr`` or ``path/to/file.py:attr`` -> the function or `Trial` class."""
    target, _, attr = spec.rpartition(":")
    if target.endswith(".py"):
        path = pathlib.Path(target)
        if not path.exists():
            where = "" if path.is_absolute() else f" in {os.getcwd()}"
            raise ConfigError(
                f"entrypoint {spec!r}: {path} does not exist{where} (a relative path is "
                "read from the folder the command runs in, like workdir); run from the "
                "folder that holds it or give an absolute path."
            )
        name = f"_jaxcore_trial_{abs(hash(str(path.resolve())))}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            mod_spec.loader.exec_module(module)
        except Exception as e:
            raise ConfigError(
                f"entrypoint {spec!r}: running {path} raised {type(e).__name__}: {e}"
            ) from e
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ConfigError(f"entrypoint {spec!r}: cannot import {target} ({e}).") from None
        except Exception as e:  # the module itself raised while importing
            raise ConfigError(
                f"entrypoint {spec!r}: importing {target} raised {type(e).__name__}: {e}"
            ) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"entrypoint {spec!r}: {target} has no {attr!r}.") from None


def check_entrypoint(spec: str) -> Any:
    """Import ``spec`` and check it can be called with a context, before any launch.

    A typo in the entrypoint then costs one clear `ConfigError`, not a launch, a crash and
    ``max_restarts`` relaunches of every trial.
    """
    from jaxcore.experiments.trial_context import Trial

    fn = load_entrypoint(spec)
    if inspect.isclass(fn):
        if not issubclass(fn, Trial):
            raise ConfigError(
                f"entrypoint {spec!r}: {fn.__name__} is a class but not a "
                "jaxcore.experiments.Trial subclass; subclass Trial or give a function."
            )
        return fn
    if not callable(fn):
        raise ConfigError(f"entrypoint {spec!r}: {type(fn).__name__} is not callable.")
    try:
        inspect.signature(fn).bind(object())
    except TypeError:
        raise ConfigError(
            f"entrypoint {spec!r}: {getattr(fn, '__name__', fn)} must take one argument, the "
            "TrialContext (def train(ctx): ...)."
        ) from None
    except ValueError:  # no signature (a builtin): let the call decide
        pass
    return fn


def call_entrypoint(fn: Any, ctx: Any) -> Any:
    """Run the trial and mark it finished when it returns (or exits with status 0); a
    value it returns is logged, since the search never sees it.

    A trial that returns while preempted (SIGTERM, the experiment paused) broke out of
    its loop to stop, as ``if ctx.should_stop() or ctx.preempted(): break`` does: it
    exits with `PREEMPTED` instead, so the loop pauses or requeues it rather than
    recording it as ended (it was marked COMPLETED, or ERRORED before its first report).
    """
    from jaxcore.experiments.trial_context import PREEMPTED, Trial

    try:
        result = fn(ctx).run() if inspect.isclass(fn) and issubclass(fn, Trial) else fn(ctx)
    except SystemExit as e:
        if e.code in (0, None):
            _finished_or_preempted(ctx, PREEMPTED)
        raise
    _finished_or_preempted(ctx, PREEMPTED)
    if result is not None:
        log.warning(
            "trial %d: the trial function returned %r, which the search ignores; report "
            "the objective with ctx.report(step, {%r: value})",
            ctx.trial_id,
            result,
            ctx.searcher_metric,
        )
    return result


def _finished_or_preempted(ctx: Any, preempted_code: int) -> None:
    if ctx.preempted():
        log.info(
            "trial %d: returned while preempted (SIGTERM or paused): exit %d, to be resumed",
            ctx.trial_id,
            preempted_code,
        )
        raise SystemExit(preempted_code)
    ctx.mark_finished()


def run_trial(db_url: str, trial_id: int) -> None:
    """Build the context through the store and run the experiment's entrypoint."""
    from jaxcore.experiments.store import Store
    from jaxcore.experiments.trial_context import StoreChannel, TrialContext

    store = Store(db_url, create=False)
    row = store.trial(trial_id)
    exp = store.experiment(row["experiment_id"])
    ctx = TrialContext(store=store, trial_id=trial_id, channel=StoreChannel(store, exp["id"]))
    try:
        call_entrypoint(load_entrypoint(exp["config"]["entrypoint"]), ctx)
    finally:
        ctx.close()
        store.close()


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("JAXCORE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run_trial(os.environ["JAXCORE_DB_URL"], int(os.environ["JAXCORE_TRIAL_ID"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

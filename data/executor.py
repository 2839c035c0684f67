"""Executors: run per-shard tasks in local processes (with progress) or on Ray.

A task is ``fn(config_dict, shard) -> dict``; the task itself skips work whose completion
marker exists, so an executor only has to run tasks and collect their results in order.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

Task = Callable[[dict[str, Any], int], dict[str, Any]]


class LocalPipelineExecutor:
    """Run shards in ``workers`` processes (inline when 1) with a rich progress bar."""

    def __init__(self, workers: int = 0, progress: bool = True) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.progress = progress

    def map(
        self, fn: Task, config: dict[str, Any], shards: list[int], desc: str
    ) -> list[dict[str, Any]]:
        """Results of ``fn(config, shard)`` for each shard, in shard order."""
        results: dict[int, dict[str, Any]] = {}
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            disable=not self.progress,
            transient=False,
        ) as bar:
            task = bar.add_task(desc, total=len(shards))
            if self.workers == 1 or len(shards) == 1:
                for s in shards:
                    results[s] = fn(config, s)
                    bar.advance(task)
            else:
                ctx = mp.get_context("forkserver")
                ctx.set_forkserver_preload(["data.pipeline"])
                with ProcessPoolExecutor(min(self.workers, len(shards)), mp_context=ctx) as pool:
                    futures = {pool.submit(fn, config, s): s for s in shards}
                    try:
                        for fut in as_completed(futures):
                            results[futures[fut]] = fut.result()
                            bar.advance(task)
                    except BrokenProcessPool as e:
                        _stop(pool)
                        from data.errors import BuildError

                        raise BuildError(
                            f"a worker process of {desc!r} died ({e}). If a script calls "
                            "data.build() at its top level, put the call under `if __name__ "
                            '== "__main__":` (the workers import the script); otherwise it '
                            "was killed (out of memory?): rerun to resume, or set workers: 1"
                        ) from e
                    except BaseException:
                        _stop(pool)
                        raise
        return [results[s] for s in shards]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued shards and end the running ones now (Ctrl-C, SIGTERM, a failed
    shard): otherwise leaving the ``with`` block waits for every queued shard, and workers
    outlive a killed parent. A shard's files and marker are written atomically, so a
    shard stopped half-way is simply redone by the next run. ``_processes`` is the only
    handle on the workers before Python 3.14's ``terminate_workers``."""
    for proc in list((pool._processes or {}).values()):
        proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


class RayPipelineExecutor:
    """Run shards as a ``ray.data`` dataset of shard ids mapped through the task.

    Connects to a running cluster when one is initialised (or ``RAY_ADDRESS`` is set);
    otherwise starts a local one. Results are sorted by shard, so the output does not
    depend on scheduling.
    """

    def __init__(self, workers: int = 0, progress: bool = True) -> None:
        self.workers = workers
        self.progress = progress

    def map(
        self, fn: Task, config: dict[str, Any], shards: list[int], desc: str
    ) -> list[dict[str, Any]]:
        import json

        import ray

        if not ray.is_initialized():
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            ray.init(
                runtime_env={"env_vars": {"PYTHONPATH": root}},
                num_cpus=self.workers or None,
                include_dashboard=False,
                log_to_driver=False,
            )
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = self.progress

        def run(row: dict[str, Any]) -> dict[str, Any]:
            return {"shard": row["shard"], "result": json.dumps(fn(config, int(row["shard"])))}

        ds = ray.data.from_items([{"shard": s} for s in shards], override_num_blocks=len(shards))
        rows = ds.map(run, num_cpus=1).take_all()
        by_shard = {int(r["shard"]): json.loads(r["result"]) for r in rows}
        return [by_shard[s] for s in shards]


def make_executor(
    kind: str, workers: int, progress: bool
) -> LocalPipelineExecutor | RayPipelineExecutor:
    """The executor a config names."""
    if kind == "ray":
        return RayPipelineExecutor(workers, progress)
    return LocalPipelineExecutor(workers, progress)

"""The step protocol: ``run(records, rank, world_size)`` yields records, returns statistics.

In the manner of datatrove's ``PipelineStep``, but a step owns no mutable statistics:
each call of ``run`` builds its own :class:`StageStats` and returns it as the generator's
return value, so per-rank numbers can never leak into each other.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Iterator

from data.records import FileRecord, StageStats

StepRun = Generator[FileRecord, None, StageStats]


class Step:
    """A pipeline step. Subclasses implement :meth:`process` (or override :meth:`run`).

    Dropped records pass through untouched so that the end of the chain sees every
    input file exactly once, kept or dropped, with the stage and reason of its drop.
    """

    name: str = "step"

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        """Handle one live record in place; return a drop reason, or None to keep it."""
        raise NotImplementedError

    def run(self, records: Iterable[FileRecord], rank: int = 0, world_size: int = 1) -> StepRun:
        """Process ``records`` (this shard's share), yielding each one; return stats."""
        stats = StageStats(self.name)
        clock, cpu = time.perf_counter, time.thread_time
        for rec in records:
            if rec.drop_stage:
                yield rec
                continue
            stats.files_in += 1
            stats.bytes_in += rec.size
            t0, c0 = clock(), cpu()
            reason = self.process(rec, stats)
            stats.seconds += clock() - t0
            stats.cpu_seconds += cpu() - c0
            if reason:
                rec.drop(self.name, reason)
                stats.dropped[reason] = stats.dropped.get(reason, 0) + 1
            else:
                stats.files_out += 1
                stats.bytes_out += rec.size
            yield rec
        stats.dropped = dict(sorted(stats.dropped.items()))
        return stats


class BatchStep(Step):
    """A step that handles records in batches (for vectorised work such as MinHash)."""

    batch_size: int = 512

    def process_batch(self, records: list[FileRecord], stats: StageStats) -> None:
        """Handle a batch of live records in place; drop with ``record.drop``."""
        raise NotImplementedError

    def run(self, records: Iterable[FileRecord], rank: int = 0, world_size: int = 1) -> StepRun:
        stats = StageStats(self.name)
        buf: list[FileRecord] = []

        def flush() -> Iterator[FileRecord]:
            live = [r for r in buf if not r.drop_stage]
            for r in live:
                stats.files_in += 1
                stats.bytes_in += r.size
            t0, c0 = time.perf_counter(), time.thread_time()
            if live:
                self.process_batch(live, stats)
            stats.seconds += time.perf_counter() - t0
            stats.cpu_seconds += time.thread_time() - c0
            for r in live:
                if r.drop_stage == self.name:
                    stats.dropped[r.drop_reason] = stats.dropped.get(r.drop_reason, 0) + 1
                else:
                    stats.files_out += 1
                    stats.bytes_out += r.size
            yield from buf
            buf.clear()

        for rec in records:
            buf.append(rec)
            if len(buf) >= self.batch_size:
                yield from flush()
        yield from flush()
        stats.dropped = dict(sorted(stats.dropped.items()))
        return stats


def chain(
    steps: list[Step],
    records: Iterable[FileRecord],
    sink: list[StageStats],
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[FileRecord]:
    """Compose steps into one iterator; each step's statistics land in ``sink`` in order."""

    def capture(gen: StepRun) -> Iterator[FileRecord]:
        stats = yield from gen
        sink.append(stats)

    it: Iterable[FileRecord] = records
    for step in steps:
        it = capture(step.run(it, rank, world_size))
    return iter(it)

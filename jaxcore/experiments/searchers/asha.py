"""Adaptive ASHA with Determined's semantics (stopping-based asynchronous halving).

Read from Determined's ``master/pkg/searcher/adaptive_asha.go`` and ``asha_stopping.go``:

- ``max_rungs`` is capped at ``int(log(max_length)/log(divisor)) + 1`` and at
  ``int(log(max_trials)/log(divisor)) + 1``;
- modes pick the brackets (rungs per bracket): ``aggressive`` ``[R]``, ``standard``
  ``[(R-1)//2+1 .. R]``, ``conservative`` ``[1 .. R]``, run most-rungs first;
- bracket ``b`` with ``n_b`` rungs gets ``int(w_b / sum(w) * max_trials)`` trials (at
  least 1), ``w_b = divisor**(n_b-1) / n_b`` (roughly equal step budget per bracket),
  the remainder going to the first bracket;
- max concurrent trials per bracket: ``max_concurrent_trials`` split evenly (remainder
  to the first brackets), or, when it is 0, ``max(max_trials[last], int(divisor))``;
- rung ``i`` of ``n`` needs ``max(int(max_length / divisor**(n-i-1)), 1)`` units;
- a trial reaching a rung is inserted in the rung's sorted metrics; it continues when
  its index is below ``max(int(len(rung)/divisor), 1)``, else it is stopped; at the top
  rung it is done. Each stop creates a new trial while the bracket has trials left.
"""

from __future__ import annotations

import bisect
import math

from jaxcore.experiments.config import ExperimentConfig
from jaxcore.experiments.searchers.base import Action, Create, SearchMethod, Stop

EXITED = math.inf  # Determined's ashaExitedMetricValue: a failed trial ranks last


def max_rungs(max_rungs_: int, max_length: int, max_trials: int, divisor: float) -> int:
    r = min(max_rungs_, int(math.log(max_length) / math.log(divisor)) + 1)
    return min(r, int(math.log(max_trials) / math.log(divisor)) + 1)


def mode_brackets(mode: str, rungs: int) -> list[int]:
    if mode == "aggressive":
        return [rungs]
    if mode == "standard":
        return list(range((rungs - 1) // 2 + 1, rungs + 1))
    return list(range(1, rungs + 1))


def bracket_max_trials(max_trials: int, divisor: float, brackets: list[int]) -> list[int]:
    weights = [divisor ** (n - 1) / n for n in brackets]
    total = sum(weights)
    out = [max(int(w / total * max_trials), 1) for w in weights]
    out[0] += max(max_trials - sum(out), 0)
    return out


def bracket_max_concurrent(max_concurrent: int, divisor: float, trials: list[int]) -> list[int]:
    n = len(trials)
    if max_concurrent == 0:
        return [max(trials[-1], int(divisor))] * n
    max_concurrent = max(max_concurrent, n)
    out = [max_concurrent // n] * n
    for i in range(max_concurrent % n):
        out[i] += 1
    return out


def rung_units(num_rungs: int, divisor: float, max_length: int) -> list[int]:
    return [max(int(max_length / divisor ** (num_rungs - i - 1)), 1) for i in range(num_rungs)]


def plan(config: ExperimentConfig) -> list[dict]:
    """The brackets: ``[{"rungs", "units", "max_trials", "max_concurrent"}]``."""
    s = config.searcher
    brackets = list(s.bracket_rungs)
    if not brackets:
        brackets = mode_brackets(s.mode, max_rungs(s.max_rungs, s.length, s.max_trials, s.divisor))
    brackets.sort(reverse=True)
    trials = bracket_max_trials(s.max_trials, s.divisor, brackets)
    conc = bracket_max_concurrent(s.max_concurrent_trials, s.divisor, trials)
    return [
        {
            "rungs": n,
            "units": rung_units(n, s.divisor, s.length),
            "max_trials": t,
            "max_concurrent": c,
        }
        for n, t, c in zip(brackets, trials, conc, strict=True)
    ]


class _Bracket:
    """One asynchronous successive-halving bracket (stopping variant)."""

    def __init__(self, index: int, spec: dict, divisor: float):
        self.index = index
        self.units: list[int] = spec["units"]
        self.max_trials: int = spec["max_trials"]
        self.max_concurrent: int = spec["max_concurrent"]
        self.divisor = divisor
        self.rungs: list[list[tuple[float, int]]] = [[] for _ in self.units]
        self.trial_rung: dict[int, int] = {}
        self.requested = 0

    def initial_count(self) -> int:
        if self.max_concurrent > 0:
            return min(self.max_concurrent, self.max_trials)
        return max(1, min(int(self.divisor ** (len(self.units) - 1)), self.max_trials))

    def can_create(self) -> bool:
        return self.requested < self.max_trials

    def stop_run(self, trial_id: int, time_step: float, metric: float) -> bool:
        """Record the report; True when the trial should stop (done or cut)."""
        start = self.trial_rung.get(trial_id, 0)
        for r in range(start, len(self.units)):
            self.trial_rung[trial_id] = r
            if time_step < self.units[r]:
                return False
            if any(t == trial_id for _, t in self.rungs[r]):
                continue  # already counted at this rung (a repeated report)
            keys = [m for m, _ in self.rungs[r]]
            index = bisect.bisect_left(keys, metric)
            self.rungs[r].insert(index, (metric, trial_id))
            if r == len(self.units) - 1:
                return True
            keep = max(int(len(self.rungs[r]) / self.divisor), 1)
            if index >= keep:
                return True
        return False


class AdaptiveASHASearch(SearchMethod):
    """Brackets of stopping-based ASHA run side by side (Determined's tournament)."""

    def __init__(self, config: ExperimentConfig):
        super().__init__(config)
        self.plan = plan(config)
        self.brackets = [_Bracket(i, b, config.searcher.divisor) for i, b in enumerate(self.plan)]
        self.trial_bracket: dict[int, _Bracket] = {}
        self.finished: set[int] = set()

    def _create(self, bracket: _Bracket) -> Create:
        bracket.requested += 1
        return Create(
            hparams=self.sample(),
            max_length=self.searcher.length,
            milestones=tuple(bracket.units),
            tag=bracket.index,
        )

    def initial(self) -> list[Action]:
        out: list[Action] = []
        for b in self.brackets:
            out += [self._create(b) for _ in range(b.initial_count())]
        return out

    def created(self, trial_id: int, action: Create) -> list[Action]:
        bracket = self.brackets[action.tag]
        self.trial_bracket[trial_id] = bracket
        bracket.trial_rung[trial_id] = 0
        return []

    def validation(self, trial_id: int, step: int, metric: float) -> list[Action]:
        bracket = self.trial_bracket[trial_id]
        if trial_id in self.finished:
            return []
        if not bracket.stop_run(trial_id, step, self.value(metric)):
            return []
        self.finished.add(trial_id)
        out: list[Action] = [Stop(trial_id)]
        if bracket.can_create():
            out.append(self._create(bracket))
        return out

    def exited(self, trial_id: int) -> list[Action]:
        # A trial that ended without reaching its top rung (it stopped itself) frees its
        # place like a failed one would, so the bracket still runs all its trials.
        if trial_id in self.finished:
            return []
        return self.errored(trial_id)

    def errored(self, trial_id: int) -> list[Action]:
        bracket = self.trial_bracket[trial_id]
        if trial_id in self.finished:
            return []
        self.finished.add(trial_id)
        bracket.rungs[bracket.trial_rung.get(trial_id, 0)].append((EXITED, trial_id))
        return [self._create(bracket)] if bracket.can_create() else []

    def progress(self) -> float:
        total = sum(b.max_trials for b in self.brackets)
        return len(self.finished) / max(total, 1)

"""The benchmarks' process-per-program harness (`benchmarks/_common.py`): workers that
reply, workers that die, and the rotated order of turns."""

import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.append(str(BENCHMARKS))  # after site-packages: no name of theirs shadows one
from _common import StepWorker, run_in_turns, time_alternating, time_in_turns  # noqa: E402


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "worker.py"
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(BENCHMARKS)!r})\n" + textwrap.dedent(body)
    )
    return str(path)


def test_worker_warms_up_then_times_one_call_per_request(tmp_path):
    # The worker prints noise on stdout too (as JAX and torch do): only protocol lines count.
    calls = tmp_path / "calls"
    script = _script(
        tmp_path,
        f"""
        from _common import serve_steps
        def run():
            with open({str(calls)!r}, "a") as f:
                f.write("call\\n")
            print("noise", flush=True)
        serve_steps(run, {{"params": 7}}, warmup=3)
        """,
    )
    worker = StepWorker("w", [script])
    assert worker.info["params"] == 7 and worker.info["first_call_s"] >= 0
    assert calls.read_text().count("call") == 3  # warmed up before it replied
    for _ in range(2):
        wall, cpu = worker.step()
        assert wall >= 0 and cpu >= 0
    worker.close()
    assert worker.proc.returncode == 0
    assert calls.read_text().count("call") == 5


def test_a_worker_that_dies_before_replying_says_so(tmp_path):
    script = _script(tmp_path, "raise SystemExit(3)\n")
    with pytest.raises(RuntimeError, match="exited with code 3 before replying"):
        StepWorker("dead", [script])


def test_a_failing_program_ends_the_workers_already_started(tmp_path, monkeypatch):
    ok = _script(tmp_path, "from _common import serve_steps\nserve_steps(lambda: None)\n")
    dead = str(tmp_path / "dead.py")
    Path(dead).write_text("raise SystemExit(4)\n")
    started = []
    real_init = StepWorker.__init__

    def record(self, name, argv, env=None):
        started.append(self)
        real_init(self, name, argv, env)

    monkeypatch.setattr(StepWorker, "__init__", record)
    with pytest.raises(RuntimeError, match="dead: the worker exited with code 4"):
        run_in_turns([("ok", [ok]), ("dead", [dead])], rounds=1)
    assert [w.name for w in started] == ["ok", "dead"]
    assert started[0].proc.returncode == 0  # closed, not left running


def test_run_in_turns_returns_samples_and_each_warm_up_reply(tmp_path):
    ok = _script(tmp_path, "from _common import serve_steps\nserve_steps(lambda: None, {'k': 1})\n")
    turns = run_in_turns([("a", [ok]), ("b", [ok])], rounds=2, steps=2)
    assert {n: len(v["wall"]) for n, v in turns.samples.items()} == {"a": 4, "b": 4}
    assert turns.info["b"]["k"] == 1 and len(turns.load_start) == 3


def test_each_program_can_run_in_several_processes_pooled(tmp_path):
    # The second process of the program is slower for its whole life (what one process
    # drawing a slow mode looks like): both processes' samples are pooled under the
    # program's name, and each one's median is kept.
    started = tmp_path / "started"
    slow = _script(
        tmp_path,
        f"""
        import time
        from _common import serve_steps
        with open({str(started)!r}, "a") as f:
            f.write("x")
        nth = len(open({str(started)!r}).read())
        serve_steps(lambda: time.sleep(0.05 if nth == 2 else 0.0), {{"nth": nth}})
        """,
    )
    with pytest.raises(ValueError, match="at least 1 process"):
        run_in_turns([("a", [slow])], rounds=1, processes=0)
    turns = run_in_turns([("a", [slow])], rounds=2, steps=2, processes=2)
    assert len(turns.samples["a"]["wall"]) == len(turns.samples["a"]["cpu"]) == 8
    fast, slower = turns.process_medians["a"]
    assert slower >= 0.05 > fast
    assert turns.info == {"a": {"nth": 1, "first_call_s": turns.info["a"]["first_call_s"]}}


class _FakeWorker:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def step(self):
        self.log.append(self.name)
        return 1.0, 0.5


def test_turns_rotate_so_no_program_always_follows_another():
    log = []
    workers = [_FakeWorker(n, log) for n in "abc"]
    samples = time_in_turns(workers, rounds=3, steps=2, untimed=0)
    assert log == list("aabbcc" + "bbccaa" + "ccaabb")
    assert samples["a"] == {"wall": [1.0] * 6, "cpu": [0.5] * 6}


class _ColdFirstWorker(_FakeWorker):
    """A worker whose first step after another worker's is slow (a cold cache and heap)."""

    def step(self):
        cold = not self.log or self.log[-1] != self.name
        self.log.append(self.name)
        return (3.0 if cold else 1.0), 0.5


def test_each_turn_starts_with_an_untimed_step():
    # By default the first step of every turn is run but not recorded: what the previous
    # program left behind is a cost of neither program.
    log = []
    samples = time_in_turns([_ColdFirstWorker(n, log) for n in "ab"], rounds=2, steps=2)
    assert log == list("aaabbb" + "bbbaaa")
    assert samples["a"]["wall"] == samples["b"]["wall"] == [1.0] * 4
    # Without it, the cold step of every turn is what gets timed.
    cold = time_in_turns([_ColdFirstWorker(n, []) for n in "ab"], rounds=1, steps=2, untimed=0)
    assert cold["a"]["wall"] == [3.0, 1.0]


def test_in_process_turns_rotate_and_start_with_an_untimed_call():
    log = []
    fns = {n: (lambda n=n: log.append(n)) for n in "ab"}
    medians = time_alternating(fns, rounds=2, steps=2)
    assert log == list("aaabbb" + "bbbaaa")
    assert set(medians) == {"a", "b"}

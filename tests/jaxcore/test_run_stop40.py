"""`jaxcore run` stop 40: runs in other run dirs that share ``data.output_dir`` at the same
time. A dataset version is built once (the second run waits for the first, instead of
failing on the data package's build lock), and each tokenizer setting has its own token
folder, so a run never rewrites the shards another run is training on."""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import threading
import time

import pytest
from rich.console import Console

import data as data_pkg
from jaxcore.run import run_pipeline
from tests.jaxcore.test_run_stop39 import Killed, _config, _stop_before

DEADLINE_S = 120.0


class _Watched(Console):
    """A console that sets ``waiting`` once the run says it waits for another run."""

    def __init__(self) -> None:
        super().__init__(file=io.StringIO(), width=200)
        self.waiting = threading.Event()

    def print(self, *objects, **kwargs) -> None:
        if any("waiting for another `jaxcore run`" in str(o) for o in objects):
            self.waiting.set()
        super().print(*objects, **kwargs)


def _held(monkeypatch, name: str) -> tuple[threading.Event, threading.Event, list[str]]:
    """Replace ``data.<name>`` by a wrapper whose first call stops until ``release`` is
    set (after setting ``entered``); every call's version dir is recorded."""
    real = getattr(data_pkg, name)
    entered, release, calls = threading.Event(), threading.Event(), []

    def wrapper(*args, **kwargs):
        calls.append(str(args[0]))
        if len(calls) == 1:
            entered.set()
            assert release.wait(DEADLINE_S), "the test never released the first run"
        return real(*args, **kwargs)

    monkeypatch.setattr(data_pkg, name, wrapper)
    return entered, release, calls


def _in_thread(config, console: Console) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_pipeline(config, console=console)
        except BaseException as e:  # Killed (the stop before train), or a bug
            errors.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, errors


def _sha(path: str | pathlib.Path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def _tokenizer_output(config) -> dict:
    return json.loads((config.path / "phases" / "tokenizer.json").read_text())["output"]


def test_a_run_with_other_tokenizer_settings_leaves_the_first_runs_shards_alone(
    tmp_path, monkeypatch
):
    # Before: both wrote <version>/tokens/, so run b rewrote the shards run a trains on.
    a = _config(tmp_path, "run_dir=a", "tokenizer.vocab_size=512")
    b = _config(tmp_path, "run_dir=b", "tokenizer.vocab_size=300")
    _stop_before(monkeypatch, "train")
    with pytest.raises(Killed):
        run_pipeline(a)
    first = _tokenizer_output(a)
    shards_before = {
        s["path"]: _sha(pathlib.Path(first["tokens_index"]).parent.parent / s["path"])
        for s in json.loads(pathlib.Path(first["tokens_index"]).read_text())["shards"]
    }
    with pytest.raises(Killed):
        run_pipeline(b)

    assert _tokenizer_output(b)["tokens_index"] != first["tokens_index"]
    assert _sha(first["tokenizer"]) == first["tokenizer_sha256"]
    root = pathlib.Path(first["tokens_index"]).parent.parent
    assert {p: _sha(root / p) for p in shards_before} == shards_before
    # ... so run a's next run finds its tokenizer phase unchanged and skips it.
    console = _Watched()
    with pytest.raises(Killed):
        run_pipeline(a, console=console)
    assert "phase 2/6: tokenizer finished in an earlier run: skipped" in console.file.getvalue()


@pytest.mark.parametrize("held", ["tokenize_snapshot", "build"])
def test_a_second_run_waits_for_the_first_to_write_what_both_need_then_reuses_it(
    tmp_path, monkeypatch, held
):
    # Two run dirs, one data.output_dir, the same settings, started together. Before: the
    # second run's data phase failed ("another build is writing"), or both tokenized
    # into the same shards at once.
    a = _config(tmp_path, "run_dir=a")
    b = _config(tmp_path, "run_dir=b")
    _stop_before(monkeypatch, "train")
    entered, release, calls = _held(monkeypatch, held)
    console_a, console_b = _Watched(), _Watched()
    thread_a, errors_a = _in_thread(a, console_a)
    try:
        assert entered.wait(DEADLINE_S), "run a never reached the held call"
        thread_b, errors_b = _in_thread(b, console_b)
        # Run b reaches the shared folder while run a is inside the held call.
        deadline = time.monotonic() + DEADLINE_S
        while not console_b.waiting.is_set() and thread_b.is_alive():
            assert time.monotonic() < deadline, "run b neither waited nor ended"
            time.sleep(0.01)
        assert console_b.waiting.is_set(), (
            f"run b did not wait for run a: {errors_b} {console_b.file.getvalue()[-600:]}"
        )
        assert len(calls) == 1
    finally:
        release.set()
        thread_a.join(DEADLINE_S)
    thread_b.join(DEADLINE_S)
    assert not thread_a.is_alive() and not thread_b.is_alive()
    assert [type(e) for e in errors_a] == [Killed], errors_a
    assert [type(e) for e in errors_b] == [Killed], errors_b
    assert len(calls) == 1, calls  # run b reused what run a wrote
    assert "reused" in console_b.file.getvalue()
    out_a, out_b = _tokenizer_output(a), _tokenizer_output(b)
    assert out_a["tokens_index"] == out_b["tokens_index"]
    assert out_a["tokenizer_sha256"] == out_b["tokenizer_sha256"] == _sha(out_b["tokenizer"])

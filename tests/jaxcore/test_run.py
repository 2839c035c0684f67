"""`jaxcore run`: the demo config end to end at a tiny budget, reuse, lineage, dry run.

One module-scoped run (data -> tokenizer -> train -> search -> register -> serve) feeds
the tests; JAX's persistent compilation cache (a temporary folder) lets the search trials
and the resumed run load the train phase's programs instead of compiling again.
"""

from __future__ import annotations

import compileall
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time
import zlib

import jax
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxcore.errors import ConfigError
from jaxcore.run import PHASES, parse_run_config, run_pipeline
from jaxcore.run.chart import encode_png, terminal_chart
from jaxcore.run.config import apply_overrides
from jaxcore.run.summary import SECTIONS

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO = ROOT / "configs" / "demo.yaml"
TINY = [
    "data.packages=[idna]",
    "tokenizer.vocab_size=512",
    "model.d_model=32",
    "model.n_layers=1",
    "model.d_ff=64",
    "model.seq_len=32",
    "train.steps=4",
    "train.batch=8",
    "train.warmup=0",
    "train.checkpoint_every=2",
    "search.max_trials=2",
    "search.max_length=4",
    "serve.max_tokens=4",
    "serve.prompts=['def f(x):', 'import os']",
]


def tiny_config(root: pathlib.Path, *extra: str):
    raw = yaml.safe_load(DEMO.read_text())
    return parse_run_config(raw, root, [*TINY, "run_dir=run", "data.output_dir=datasets", *extra])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, compile_cache):
    # `make test` installs with `pip install --no-compile`, so the demo's input package
    # may hold no bytecode; compile it as a default pip install would, so the ingest
    # stage has binary files to drop (asserted below). Into the package's own
    # __pycache__, as pip would: tests/conftest.py may point sys.pycache_prefix elsewhere.
    import idna

    prefix, sys.pycache_prefix = sys.pycache_prefix, None
    try:
        compileall.compile_dir(pathlib.Path(idna.__file__).parent, quiet=1)
    finally:
        sys.pycache_prefix = prefix
    root = tmp_path_factory.mktemp("run")
    config = tiny_config(root)
    return root, config, run_pipeline(config)


@pytest.mark.slow
def test_demo_config_runs_end_to_end_and_summary_has_every_section(first_run):
    _, config, result = first_run
    assert result.skipped == ()
    assert set(result.outputs) == set(PHASES)
    for section in SECTIONS:
        assert result.summary[section], section
    data = result.summary["data"]
    assert data["files_in"] == data["files_kept"] + data["files_dropped"]
    assert data["dropped_by_stage"]["ingest"]["binary"] > 0  # __pycache__ files
    assert len(result.summary["loss"]["train_curve"]) == config.train.steps
    png = pathlib.Path(result.summary["loss"]["png"])
    assert png.parent == config.path and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.summary["speed"]["tokens_per_s"] > 0
    assert result.summary["speed"]["mfu"] > 0
    assert len(result.summary["best_trial"]["search_trials"]) == 2
    completions = result.summary["completions"]
    assert [c["prompt"] for c in completions] == list(config.serve.prompts)
    assert all(isinstance(c["text"], str) for c in completions)
    for heading in ("== data", "== loss", "== speed", "== best trial", "== registry"):
        assert heading in result.text
    assert json.loads((config.path / "summary.json").read_text())["registry"]["version"] == 1


@pytest.mark.slow
def test_second_run_skips_finished_phases(first_run):
    _, config, first = first_run
    again = run_pipeline(config)
    assert again.skipped == PHASES  # data and training included: nothing ran again
    assert again.seconds == {}
    assert again.summary["registry"] == first.summary["registry"]


@pytest.mark.slow
def test_registry_lineage_matches_the_data_phase(first_run, capsys):
    from jaxcore.experiments import Store, registry
    from jaxcore.experiments.cli import main as experiments_cli

    _, config, result = first_run
    data = result.outputs["data"]
    manifest = pathlib.Path(data["version_dir"]) / "manifest.json"
    written = hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert data["manifest_sha256"] == written
    db = f"sqlite:///{config.path / 'jaxcore.db'}"
    m = registry.resolve(f"registry:{config.model_name}@latest", db=db)
    assert m.lineage["manifest_sha256"] == written
    assert m.lineage["dataset_version"] == data["version"]
    assert m.lineage["tokenizer_sha256"] == result.outputs["tokenizer"]["tokenizer_sha256"]
    assert m.lineage["code_version"].startswith(("git:", "jaxcore=="))
    store = Store(db)  # every checkpoint row carries the lineage, not only the registered one
    try:
        rows = store.checkpoints(state="COMPLETED")
        assert rows and all(r["meta"]["lineage"]["manifest_sha256"] == written for r in rows)
    finally:
        store.close()
    assert result.outputs["serve"]["model"]["lineage"]["manifest_sha256"] == written
    assert experiments_cli(["model", "describe", config.model_name, "--db", db]) == 0
    out = capsys.readouterr().out
    assert f"manifest sha256 {written}" in out and data["version"] in out


@pytest.mark.slow
def test_interrupted_train_phase_resumes_and_dataset_is_found_by_input_hash(first_run, monkeypatch):
    from jaxcore.run import trial

    root, _, _ = first_run
    config = tiny_config(root, "run_dir=resumed", "search.enabled=false", "serve.enabled=false")

    def interrupt(ctx, step):
        if step == 3:  # after the step-2 checkpoint, before the step-4 one
            raise KeyboardInterrupt

    monkeypatch.setattr(trial, "after_step", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(config)
    assert not (config.path / "phases" / "train.json").exists()
    monkeypatch.setattr(trial, "after_step", None)
    result = run_pipeline(config)
    assert result.skipped == ("data", "tokenizer")  # their records were written
    assert result.outputs["train"]["resumed"] is True
    assert result.outputs["train"]["trials"][0]["resumed_from_step"] == 2
    # The first run's dataset version, found by the input hash (another run directory).
    first_data = json.loads((root / "run" / "phases" / "data.json").read_text())["output"]
    assert result.outputs["data"]["version_dir"] == first_data["version_dir"]


@pytest.mark.slow
def test_dry_run_prints_plan_mesh_and_memory(first_run, tmp_path, capsys):
    from jaxcore.run.cli import main

    root, config, _ = first_run
    raw = apply_overrides(yaml.safe_load(DEMO.read_text()), TINY)
    raw.update(run_dir=str(config.path), data={**raw["data"], "output_dir": str(root / "datasets")})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main([str(path), "--dry-run", "--json"]) == 0
    out = capsys.readouterr().out
    plan = json.loads(out[out.index("\n{") :])
    assert [p["action"] for p in plan["phases"]] == ["reuse"] * len(PHASES)
    assert plan["mesh"]["fsdp"] == jax.device_count()
    assert plan["memory_per_device_bytes"]["peak"] > 0
    assert plan["layer_loop"] == "unrolled"  # CPU without remat (train.unroll_layers unset)
    assert plan["data"]["dataset_exists"] is True
    assert "AOT memory per device" in out


def test_config_errors_name_the_key(tmp_path, capsys):
    from jaxcore.run.cli import main

    raw = yaml.safe_load(DEMO.read_text())
    with pytest.raises(ConfigError, match=r"unknown key train\.stpes"):
        parse_run_config(raw, tmp_path, ["train.stpes=3"])
    with pytest.raises(ConfigError, match=r"train.steps: expected int, got '4'"):
        parse_run_config(raw, tmp_path, ["train.steps='4'"])
    with pytest.raises(ConfigError, match=r"model\.n_heads: 3 does not divide"):
        parse_run_config(raw, tmp_path, ["model.n_heads=3"])
    with pytest.raises(ConfigError, match=r"train\.remat: 'ful'; use one of"):
        parse_run_config(raw, tmp_path, ["train.remat=ful"])
    with pytest.raises(ConfigError, match=r"train\.grad_accum: 5; use a positive divisor"):
        parse_run_config(raw, tmp_path, ["train.grad_accum=5"])
    ok = parse_run_config(raw, tmp_path, ["train.remat=full", "train.grad_accum=2"])
    assert (ok.train.remat, ok.train.grad_accum) == ("full", 2)
    with pytest.raises(ConfigError, match=r"train\.unroll_layers: 'yes'; use true, false"):
        parse_run_config(raw, tmp_path, ["train.unroll_layers='yes'"])
    from jaxcore.run.phases import run_hparams
    from jaxcore.run.trial import build_engine

    for text, value in (("false", False), ("true", True), ("null", None)):
        cfg = parse_run_config(raw, tmp_path, [f"train.unroll_layers={text}"])
        assert build_engine(run_hparams(cfg, 256)).config.unroll_layers is value
    with pytest.raises(ConfigError, match="'no_such_pkg' is not installed"):
        from jaxcore.run.phases import package_sources

        package_sources(("no_such_pkg",))
    assert main([str(DEMO), "--set", "search.lr_min=1.0"]) == 2
    assert "search.lr_min: need 0 < lr_min < lr_max" in capsys.readouterr().err
    # Shapes that used to escape as TypeError / ValueError tracebacks.
    with pytest.raises(ConfigError, match="the top level must be a mapping"):
        parse_run_config(["name", "run_dir"], tmp_path)
    with pytest.raises(ConfigError, match=r"train\.steps is \d+, not a section"):
        parse_run_config(raw, tmp_path, ["train.steps.x=3"])


# The machine the suite runs on is shared: generation may be slow, never the property.
@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(["steps", "batch", "seed"]), st.integers(1, 10**6)))
def test_overrides_set_exactly_the_given_keys(values):
    raw = {"train": {"lr": 0.1}, "name": "x"}
    out = apply_overrides(raw, [f"train.{k}={v}" for k, v in values.items()])
    assert out["train"] == {"lr": 0.1, **values} and out["name"] == "x"
    assert raw == {"train": {"lr": 0.1}, "name": "x"}  # the input is not mutated


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(*[st.integers(0, 255)] * 3), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    )
)
def test_png_encoder_round_trips_through_zlib(rows):
    png = encode_png(rows)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w = int.from_bytes(png[16:20], "big")
    h = int.from_bytes(png[20:24], "big")
    assert (w, h) == (3, len(rows))
    idat_len = int.from_bytes(png[33:37], "big")
    assert png[37:41] == b"IDAT"
    raw = zlib.decompress(png[41 : 41 + idat_len])
    stride = 1 + 3 * w
    decoded = [
        [tuple(raw[r * stride + 1 + 3 * i : r * stride + 4 + 3 * i]) for i in range(w)]
        for r in range(h)
    ]
    assert decoded == rows
    assert zlib.crc32(png[37 : 41 + idat_len]) == int.from_bytes(
        png[41 + idat_len : 45 + idat_len], "big"
    )


def test_terminal_chart_spans_the_range():
    chart = terminal_chart([(i, 10.0 - i) for i in range(1, 11)], width=10, height=4)
    lines = chart.splitlines()
    assert lines[0].startswith("  9.000") and lines[3].startswith("  0.000")
    top, bottom = lines[0].split("│")[1], lines[3].split("│")[1]
    assert top[0] == "█" and top[-1] == " "  # the first point is the highest
    assert bottom[0] == "█" and bottom[-1] == "▁"  # the last is the lowest: one eighth
    assert lines[-1].strip().startswith("step 1") and lines[-1].strip().endswith("10")


# ----------------------------------------------------------------------------- 2 processes
def _two_process_env(**extra: str) -> dict[str, str]:
    """This environment without the test's 8-device flag (each rank gets its own 4)."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def _cli_args(root: pathlib.Path, *extra: str) -> list[str]:
    sets = [*TINY, f"run_dir={root / 'run'}", f"data.output_dir={root / 'datasets'}", *extra]
    return [str(DEMO), *[a for s in sets for a in ("--set", s)]]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_run_host_phases_once_and_train_like_one_process(first_run, tmp_path):
    from jaxcore.experiments import Store

    _, _, one = first_run
    cmd = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--devices-per-process", "4"]
    # Search and serve left out for time: the search's trials follow the same protocol
    # as the train phase's, and serving runs on process 0 like register.
    args = _cli_args(tmp_path, "search.enabled=false", "serve.enabled=false")
    proc = subprocess.run(
        [*cmd, "-m", "jaxcore.cli", "run", *args],
        env=_two_process_env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    lines = out.splitlines()
    # The host-local phases ran once, on process 0; process 1 waited for them.
    assert [ln for ln in lines if "phase 1/6: data" in ln] == ["[rank 0] phase 1/6: data"]
    assert any(ln.startswith("[rank 1] process 1: waiting for process 0") for ln in lines)
    assert not [ln for ln in lines if ln.startswith("[rank 1]") and "phase " in ln[9:16]]
    assert sum("jaxcore run demo: summary" in ln for ln in lines) == 1
    assert len(list((tmp_path / "datasets").glob("v-*/manifest.json"))) == 1
    assert [p.name for p in tmp_path.rglob("*.db")] == ["jaxcore.db"]  # one store, one writer
    run = tmp_path / "run"
    store = Store(f"sqlite:///{run / 'jaxcore.db'}")
    try:
        models = store.models()
        assert [m["name"] for m in models] == ["demo-code-lm"]
        assert len(store.versions(models[0]["id"])) == 1
    finally:
        store.close()
    # Both processes trained the same steps with the same losses, those of 1 x 8 devices.
    leader = json.loads((run / "summary.json").read_text())["loss"]["train_curve"]
    follower = json.loads((run / "processes" / "process-1.json").read_text())["trials"]
    assert [t["phase"] for t in follower] == ["train"]
    assert follower[0]["losses"] == leader
    reference = one.outputs["train"]["trials"][0]["loss_curve"]
    assert [s for s, _ in leader] == [s for s, _ in reference] == [1, 2, 3, 4]
    np.testing.assert_allclose([v for _, v in leader], [v for _, v in reference], rtol=1e-5)


# Process 0 stops before its data phase until the test says go (a pause at the racy line).
_PAUSED_RANK = """
import os, pathlib, sys, time
from jaxcore.run import cli, pipeline

def pause(phase):
    if phase == "data" and os.environ["JAXCORE_PROCESS_ID"] == "0":
        pathlib.Path(os.environ["REACHED"]).touch()
        deadline = time.monotonic() + 120
        while not pathlib.Path(os.environ["GO"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)

pipeline.before_phase = pause
sys.exit(cli.main(sys.argv[1:]))
"""


def _paused_pair(tmp_path: pathlib.Path) -> list[subprocess.Popen]:
    """Two ranks, no supervisor (as on a pod: nothing stops a rank but itself), with
    process 0 paused at its data phase once it has written ``tmp_path / 'reached'``."""
    from jaxcore.launch import free_port, rank_envs

    envs = rank_envs(2, f"127.0.0.1:{free_port()}", devices_per_process=4)
    extra = {
        "REACHED": str(tmp_path / "reached"),
        "GO": str(tmp_path / "go"),
        "JAXCORE_RUN_PEER_TIMEOUT": "3",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PAUSED_RANK, *_cli_args(tmp_path)],
            env={**env, **_two_process_env(**extra)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for env in envs
    ]
    deadline = time.monotonic() + 240
    while not (tmp_path / "reached").exists():
        if time.monotonic() > deadline or procs[0].poll() is not None:
            for p in procs:
                p.kill()
            pytest.fail("process 0 never reached its data phase")
        time.sleep(0.1)
    return procs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killing_process_0_during_the_data_phase_ends_process_1_at_once(tmp_path):
    procs = _paused_pair(tmp_path)
    try:
        procs[0].kill()
        procs[0].wait()
        out, _ = procs[1].communicate(timeout=120)  # bounded: a hang fails here
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[1].returncode != 0
    # What it waited for, then JAX's verdict when the coordination service went away.
    assert "process 1: waiting for process 0 to finish the data phase" in out, out[-3000:]
    assert "another task died" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killing_process_1_during_the_data_phase_fails_process_0_clearly(tmp_path):
    procs = _paused_pair(tmp_path)
    try:
        procs[1].kill()
        procs[1].wait()
        (tmp_path / "go").touch()
        out, _ = procs[0].communicate(timeout=120)  # bounded: a hang fails here
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 1, out[-3000:]
    assert "process 1 of 2 stopped answering after the data phase" in out, out[-3000:]
    assert "see its log" in out
    assert not (tmp_path / "run" / "phases" / "train.json").exists()
    # The data phase itself finished and is recorded: a restart reuses it.
    assert (tmp_path / "run" / "phases" / "data.json").exists()


# Process 0 publishes a token it wrote on no disk: what the others see with local disks.
_LOCAL_DISKS = """
import sys
from jaxcore.run import cli, pipeline

pipeline.write_probe = lambda folders: "a-token-on-no-shared-disk"
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
@pytest.mark.multiprocess
def test_run_dir_not_shared_between_processes_is_a_clear_error(tmp_path):
    from jaxcore.launch import free_port, rank_envs

    envs = rank_envs(2, f"127.0.0.1:{free_port()}", devices_per_process=4)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _LOCAL_DISKS, *_cli_args(tmp_path)],
            env={**env, **_two_process_env()},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        for env in envs
    ]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [1, 2], outs  # 2: the config error
    assert "process 1 of 2 failed" in outs[0] and "is not shared with process 0" in outs[0]
    assert "needs run_dir and data.output_dir on storage every host mounts" in outs[1]
    assert not (tmp_path / "run" / "phases").exists()  # no phase ran


# ----------------------------------------------------------------------------- hosts protocol
class _FakeKV:
    """jax.distributed's key-value client, in memory (the calls `Hosts` makes)."""

    def __init__(self):
        self.data: dict[str, str] = {}

    def key_value_set(self, key, value, allow_overwrite=False):
        if key in self.data and not allow_overwrite:
            raise RuntimeError(f"ALREADY_EXISTS: {key}")
        self.data[key] = value

    def key_value_try_get(self, key):
        if key not in self.data:
            raise RuntimeError(f"NOT_FOUND: Config key {key} not found.")
        return self.data[key]

    def blocking_key_value_get(self, key, timeout_in_ms):
        if key not in self.data:
            time.sleep(0.001)
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.data[key]


def test_hosts_protocol_acks_failures_and_lost_heartbeats():
    from jaxcore.run.hosts import Hosts, LeaderFailedError, PeerLostError

    kv = _FakeKV()
    leader = Hosts(kv, 0, 2, 1, peer_timeout_s=0.3)
    follower = Hosts(kv, 1, 2, 1, say=lambda text: None)
    try:
        leader.publish("phase", phase="data", action="run")
        assert follower.receive("the next phase") == {
            "kind": "phase",
            "phase": "data",
            "action": "run",
        }
        leader.wait_followers("at the start of the data phase")  # acked: returns
        assert leader.agree(lambda: True, "stop") is True
        assert follower.agree(lambda: pytest.fail("a follower never decides"), "stop") is True
        follower.close()  # its heartbeat stops, as when the process is killed
        leader.publish("phase_done", phase="data")
        t0 = time.monotonic()
        with pytest.raises(PeerLostError, match="process 1 of 2 stopped answering after the"):
            leader.wait_followers("after the data phase")
        assert 0.3 <= time.monotonic() - t0 < 5
        kv.key_value_set("jaxcore-run/1/failed/1", "ConfigError: boom", True)
        with pytest.raises(PeerLostError, match="process 1 of 2 failed at x: ConfigError: boom"):
            leader.wait_followers("at x")
        leader.publish("error", message="OSError: disk full")
        follower.receive("the tokenizer phase")  # phase_done
        with pytest.raises(LeaderFailedError, match=r"process 0 failed .* OSError: disk full"):
            follower.receive("the next phase")
    finally:
        follower.close()
        leader.close()

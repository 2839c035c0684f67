"""Stop 43: README "Checkpoints and resuming" and "Run the same script anywhere", driven
from the docs, and their first off-path steps.

- ``TrainProgress`` writing to a log, a pipe or a rank of ``jaxcore launch`` (not a
  terminal): rich printed its last frame once, cut to 80 columns, which dropped the step
  count and the times (``[rank 0] t… loss 5.5596 | ... (max in use/peak…``).
- ``jc.export_checkpoint("runs/demo", ...)`` (the run directory instead of a step) or a
  step that retention removed: a bare ``FileNotFoundError`` on ``meta/metadata``.
- ``jaxcore launch --port P`` with P taken: rank 0 died in ``jax.distributed.initialize``
  with gRPC's bare "Failed to start RPC server" traceback; the same from a coordinator
  address set by hand (``JAXCORE_COORDINATOR``, torchrun's ``MASTER_PORT``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from rich.console import Console

import jaxcore as jc
from jaxcore import launch
from jaxcore.checkpointing.portable import export_checkpoint
from jaxcore.profiling import MemoryReport, StepStats, TraceWindow
from jaxcore.progress import TrainProgress

GIB = 1 << 30


@pytest.mark.parametrize("force_color", [None, "1"])
def test_train_progress_in_a_log_writes_whole_lines_with_the_step_count(monkeypatch, force_color):
    # FORCE_COLOR=1: what a Jupyter kernel passes on to `notebook_launcher`'s processes
    # (rich then took their pipe for a terminal, and every redraw was a line in the cell).
    if force_color:
        monkeypatch.setenv("FORCE_COLOR", force_color)
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    out = io.StringIO()  # what a log file, a pipe or `jaxcore launch` gives rich
    stats = StepStats(step=1, step_time_s=0.1, tokens_per_s=50909.0, flops_per_s=1e9, mfu=0.306)
    memory = MemoryReport(GIB, 2 * GIB, GIB, 8, GIB, GIB, "test")
    with TrainProgress(20, console=Console(file=out, width=80)) as progress:
        for i in range(20):
            progress.update(i + 1, loss=5.5 + i, stats=stats, memory=memory)
    lines = out.getvalue().splitlines()
    # The first update and the last step, whole: count, every metric, the elapsed time.
    assert len(lines) == 2, lines
    assert lines[0].startswith("train 1/20 | loss 5.5000 | 50,909 tok/s | MFU 30.6% | dev 1.00/")
    assert lines[1].startswith("train 20/20 | loss 24.5000 |")
    assert lines[1].rstrip().endswith(("host 1.00 GiB | 0:00:00", "host 1.00 GiB | 0:00:01"))
    assert "…" not in out.getvalue()


def test_train_progress_logs_again_after_log_every_s():
    out = io.StringIO()
    with TrainProgress(None, console=Console(file=out), log_every_s=0) as progress:
        for i in range(3):
            progress.update(i + 1, loss=1.0)
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == [
        "train 1",
        "train 2",
        "train 3",
    ]


def test_export_of_a_run_directory_or_a_removed_step_names_the_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for step in (6, 8, 10):
        (tmp_path / "runs" / "demo" / str(step) / "meta").mkdir(parents=True)
    (tmp_path / "runs" / "demo" / "12.orbax-checkpoint-tmp-1").mkdir()  # a killed save
    with pytest.raises(jc.ConfigError, match=r"runs/demo is a checkpoint directory.*e\.g\. "):
        export_checkpoint("runs/demo", "model.safetensors")
    with pytest.raises(jc.ConfigError, match=r"runs/demo/10 \(its steps: \[6, 8, 10\]\)"):
        export_checkpoint("runs/demo", "model.safetensors")
    with pytest.raises(jc.ConfigError, match=r"demo/4 does not exist.*are \[6, 8, 10\]"):
        export_checkpoint("runs/demo/4", "model.safetensors")
    with pytest.raises(jc.ConfigError, match=r"demo/8 is not a finalized jaxcore checkpoint"):
        export_checkpoint("runs/demo/8", "model.safetensors")  # no meta/metadata in it
    with pytest.raises(jc.ConfigError, match=r"nowhere/3 does not exist; pass a checkpoint"):
        export_checkpoint("nowhere/3", "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists()


@pytest.fixture
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_launch_on_a_taken_port_is_one_line_before_any_rank_starts(taken_port, tmp_path, capsys):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    argv = ["-n", "2", "--devices-per-process", "1", "--port", str(taken_port), str(script)]
    assert launch.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"jaxcore launch: --port {taken_port}: the coordinator cannot listen")
    assert "Pick another --port, or leave it out" in err
    assert "\n" not in err and not marker.exists()


def test_initialize_on_a_taken_coordinator_port_is_a_config_error(taken_port):
    # A coordinator set by hand (torchrun's variables here): process 0 starts the service.
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(taken_port),
        "WORLD_SIZE": "2",
        "RANK": "0",
        "JAX_PLATFORMS": "cpu",
    }
    for key in ("JAXCORE_COORDINATOR", "JAXCORE_NUM_PROCESSES", "JAXCORE_PROCESS_ID"):
        env.pop(key, None)
    code = (
        "import jaxcore as jc\n"
        "try:\n    jc.initialize(timeout_s=20)\n"
        "except jc.ConfigError as e:\n    print('CONFIG', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]  # no SIGSEGV from gRPC
    said = proc.stdout + proc.stderr[-2000:]
    assert "CONFIG jaxcore.initialize: process 0 cannot start the coordinator at " in said
    assert f"127.0.0.1:{taken_port} (torchrun): port {taken_port} is in use" in said


def test_a_loader_batch_that_does_not_divide_over_the_devices_is_a_config_error():
    # The README's checkpoint loop with another size: 4 rows over fsdp=8 CPU devices was
    # JAX's IndivisibleError from inside the Loader.
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8))
    source = [[1] * 40] * 8
    config = jc.InputConfig(global_batch_size=4, seq_len=16, seed=0)
    with pytest.raises(jc.ConfigError, match=r"4 rows does not divide over the 8 shards.*of 8\."):
        jc.Loader(source, config, engine.batch_sharding)


def test_launch_platform_gpu_without_a_driver_refuses_instead_of_training_on_cpu(
    tmp_path, monkeypatch, capsys
):
    # On a machine without GPUs, `--platform gpu` ran every rank on one CPU device and
    # exited 0. PATH holds only a stand-in nvidia-smi, so this holds anywhere.
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexit 9\n")  # a driver that lists no GPU
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    assert launch.main(["-n", "2", "--platform", "gpu", str(script)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxcore launch: platform 'gpu': this machine shows no NVIDIA GPU")
    assert "--platform cpu" in err and "\n" not in err and not marker.exists()
    with pytest.raises(jc.ConfigError, match="platform 'gpu': this machine shows no NVIDIA"):
        jc.notebook_launcher(print, num_processes=1, platform="gpu")
    smi.unlink()  # no nvidia-smi at all: refused too
    with pytest.raises(jc.ConfigError, match="no NVIDIA GPU"):
        launch.check_platform("gpu")
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    launch.check_platform("gpu")  # one GPU listed: the ranks start (JAX counts the GPUs)


def test_a_trace_window_without_after_stops_when_the_window_is_over(tmp_path):
    # The README's `TraceWindow(dir, start=10, num_steps=3)` with only `with
    # trace.step(i):` in the loop traced every later step, until the process exited.
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((16, 16))
    trace = TraceWindow(tmp_path, start=1, num_steps=2)
    for step in range(5):
        with trace.step(step):
            f(x).block_until_ready()
        if step == 3:
            assert trace.done and not trace.active, "still tracing after the window"
    annotated = []
    for path in tmp_path.rglob("*.trace.json.gz"):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        annotated += [e["args"]["step_num"] for e in events if e.get("name") == "train"]
    assert sorted(int(s) for s in annotated) == [1, 2]


@pytest.mark.parametrize("where", ["runs/demo", "runs/demo/more"])
def test_a_checkpoint_directory_that_is_a_file_is_a_config_error(tmp_path, monkeypatch, where):
    # "a file that already exists": was NotADirectoryError at the first save, after the
    # loop's first steps.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo").write_text("notes")
    with pytest.raises(jc.ConfigError, match=r"runs/demo is a file, not a folder"):
        jc.Checkpointer(jc.CheckpointConfig(directory=where, save_every_steps=1))
    assert (tmp_path / "runs" / "demo").read_text() == "notes"

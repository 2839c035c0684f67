"""`jaxcore launch`: a 2 x 4-device run equals 1 x 8 devices; failures stop the run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.launch import main as launch_main
from jaxcore.models import lm_loss
from jaxcore.runtime import MALLOC_TUNABLES

from .helpers import factory, make_batch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "scripts"


def launch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "jaxcore.launch", *args]


def clean_env() -> dict[str, str]:
    """The test process's environment without its 8-device flag or tunables; the ranks
    compile at -O0 as this process does (tests/conftest.py): half their CPU time (measured
    2 x 4 `train_tiny.py train`: 54.8 -> 27.5 user s), and the same code as the reference."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    env.update(PYTHONPATH=str(ROOT), XLA_FLAGS="--xla_backend_optimization_level=0")
    return env


def start_two_ranks(script: Path, *args: str) -> subprocess.Popen:
    """``jaxcore launch -n 2 --devices-per-process 4 SCRIPT ARGS``, output piped."""
    return subprocess.Popen(
        launch_cmd("-n", "2", "--devices-per-process", "4", str(script), *args),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def run_two_ranks(script: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``jaxcore launch -n 2 --devices-per-process 4 SCRIPT ARGS`` to its end, output kept."""
    return subprocess.run(
        launch_cmd("-n", "2", "--devices-per-process", "4", str(script), *args),
        env=clean_env(),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_of_four_devices_match_one_process_of_eight(tmp_path):
    proc = start_two_ranks(SCRIPTS / "train_tiny.py", "train", str(tmp_path))
    # Meanwhile, the reference: one process, 8 devices, the same global batches.
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3)
    state = engine.prepare(factory, optax.sgd(0.1, momentum=0.9))
    step = engine.train_step(lm_loss)
    reference = []
    for seed in range(3):
        state, metrics = step(state, make_batch(16, seed))
        reference.append(float(metrics["loss"]))

    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r, res in enumerate(results):
        assert res["process_count"] == 2 and res["local_devices"] == 4 and res["devices"] == 8
        assert res["source"] == "JAXCORE_*"
        assert res["glibc_tunables"] == MALLOC_TUNABLES
        np.testing.assert_allclose(res["losses"], reference, rtol=1e-5)
        # The uneven eval set comes back whole, in order, padding dropped, on every rank.
        assert res["gathered"]["id"] == list(range(13)), r
        assert res["gathered"]["sq"] == [i * i for i in range(13)]
        assert res["ranks"] == [0, 1]
    assert "[rank 0] rank 0 losses" in out and "[rank 1] rank 1 losses" in out
    assert len(set(reference)) == 3  # the loss moves, so equality is informative


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_pipeline_across_processes_feeds_every_process_the_whole_batch(tmp_path):
    """pipeline=2 over 2 processes: each process holds a stage and every row. Before
    `Engine.local_rows`, the README's "each process passes its own rows" pattern trained
    on mixed-up rows without an error (the two ranks even reported different losses), and
    at ZeRO-3 the check rejected a right-sized batch."""
    from tests.jaxcore.scripts.pipeline_ranks import BATCH, LAYOUTS, engine_for, train

    proc = start_two_ranks(SCRIPTS / "pipeline_ranks.py", str(tmp_path))
    # Meanwhile, the reference: one process, 8 devices, the same global batches.
    reference = {name: train(engine_for(name), lambda b: b) for name in LAYOUTS}
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    for rank in range(2):
        assert f"[rank {rank}] rank {rank} done" in out
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in LAYOUTS:
            assert res["rows"][name] == [0, BATCH], (rank, name)
            assert res["block"][name] == [0, 1], (rank, name)
            np.testing.assert_allclose(res["losses"][name], reference[name], rtol=1e-5)
        assert "passed different data to shard_batch" in res["halves"], res["halves"]
        assert "engine.local_rows" in res["halves"]
        assert res["global_passes_through"] is True
        # Both ranks passed all 16 rows: gathered with the engine, each row counts once.
        assert res["gathered"] == list(range(BATCH))
        assert res["gathered_valid"] == list(range(BATCH - 3))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_killing_one_rank_stops_the_launch_and_names_it(tmp_path):
    proc = subprocess.Popen(
        launch_cmd(
            "-n", "2", "--grace", "3", str(SCRIPTS / "train_tiny.py"), "hang", str(tmp_path)
        ),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "ranks never started"
            time.sleep(0.2)
        time.sleep(0.5)
        os.kill(int((tmp_path / "pid1").read_text()), signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert elapsed < 60
    assert "rank 1 was killed by SIGKILL" in err, err[-2000:]
    # Rank 0 is gone too (its process group was stopped).
    pid0 = int((tmp_path / "pid0").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid0, 0)


def test_failing_rank_exit_code_and_output(capsys):
    t0 = time.monotonic()
    rc = launch_main(["-n", "3", "--grace", "2", str(SCRIPTS / "fail_rank.py")])
    assert time.monotonic() - t0 < 30  # ranks 0 and 2 were sleeping for 120 s
    captured = capsys.readouterr()
    assert rc == 3
    assert "rank 1 exited with code 3" in captured.err
    assert "boom: rank 1 cannot go on" in captured.err  # the failing rank's last output
    # Output is streamed with the rank (ranks 0 and 2 may be stopped before they print).
    assert "[rank 1] started rank 1 of 3" in captured.out


def test_print_slurm_script(capsys):
    rc = launch_main(
        [
            "--print-slurm",
            "--nodes",
            "4",
            "-n",
            "8",
            "--devices-per-process",
            "1",
            "train.py",
            "--steps",
            "100",
        ]
    )
    script = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --nodes=4" in script and "#SBATCH --ntasks-per-node=8" in script
    assert "#SBATCH --gpus-per-task=1" in script
    assert "srun --kill-on-bad-exit=1 python -u train.py --steps 100" in script
    assert '[ "$rc" -eq 75 ]' in script and "scontrol requeue" in script
    assert "GLIBC_TUNABLES" in script
    check = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


def test_print_tpu_pod_command(capsys):
    rc = launch_main(
        [
            "--print-tpu-pod",
            "--tpu-name",
            "pod-a",
            "--zone",
            "us-east5-a",
            "--project",
            "proj",
            "train.py",
            "--steps",
            "10",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    ssh = next(line for line in text.splitlines() if "tpu-vm ssh" in line)
    assert ssh.startswith("gcloud compute tpus tpu-vm ssh pod-a --worker=all")
    assert "--zone=us-east5-a --project=proj" in ssh
    assert "python3 -u train.py --steps 10" in ssh
    check = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("name", ["tpu_pod_launch.sh", "slurm_train.sbatch"])
def test_cluster_scripts_parse(name):
    path = ROOT / "scripts" / name
    assert path.exists()
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_missing_script_is_a_usage_error():
    with pytest.raises(SystemExit) as e:
        launch_main(["-n", "2"])
    assert e.value.code == 2


def test_launch_uses_jax_cpu_devices_not_the_parents():
    # The launcher replaces an inherited device count instead of adding a second flag.
    from jaxcore.launch import process_env

    env = process_env(
        1,
        2,
        "127.0.0.1:1234",
        devices_per_process=4,
        base={"XLA_FLAGS": "--foo --xla_force_host_platform_device_count=8"},
    )
    assert env["XLA_FLAGS"].split() == ["--foo", "--xla_force_host_platform_device_count=4"]
    assert env["JAXCORE_PROCESS_ID"] == "1" and env["JAXCORE_NUM_PROCESSES"] == "2"
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo"
    assert jax.device_count() == 8  # this process is untouched


def _launch_and_sigterm(tmp_path, script, *script_args, launcher_args=()):
    proc = subprocess.Popen(
        launch_cmd("-n", "2", "--grace", "2", *launcher_args, str(SCRIPTS / script), *script_args),
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"pid{r}").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for r in range(2):
        with pytest.raises(ProcessLookupError):
            os.kill(int((tmp_path / f"pid{r}").read_text()), 0)
    return proc.returncode, out, err, time.monotonic() - t0


def test_sigterm_to_the_launcher_reaches_ranks_that_cannot_save(tmp_path):
    # Ranks without a checkpointer die of the forwarded SIGTERM: 143, not "preempted".
    code, _, err, _ = _launch_and_sigterm(tmp_path, "fail_rank.py", "--sleep", str(tmp_path))
    assert code == 128 + signal.SIGTERM, err
    assert "was killed by SIGTERM" in err


def test_sigterm_to_the_launcher_exits_75_when_every_rank_saved(tmp_path):
    code, out, err, _ = _launch_and_sigterm(tmp_path, "preempt_rank.py", str(tmp_path))
    assert code == jc.PREEMPTION_EXIT_CODE, err
    assert "[rank 0] rank 0 saved" in out and "[rank 1] rank 1 saved" in out
    assert "preempted: every rank saved" in err


def test_a_rank_that_outlives_the_sigterm_grace_is_killed(tmp_path):
    code, out, err, elapsed = _launch_and_sigterm(
        tmp_path,
        "preempt_rank.py",
        str(tmp_path),
        "--stubborn",
        launcher_args=["--sigterm-grace", "3"],
    )
    assert code == 128 + signal.SIGTERM, err
    assert "rank 1 did not exit within --sigterm-grace=3.0 s" in err, err
    assert "[rank 1] rank 1 ignores SIGTERM" in out
    assert 3 <= elapsed < 30


def _fake_commands(tmp_path, **scripts):
    """A PATH directory whose commands are the given bash bodies (they log their argv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\necho "{name} $*" >> {tmp_path}/calls\n{body}\n')
        path.chmod(0o755)
    return {**clean_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("code, requeued", [(75, True), (0, False), (3, False)])
def test_slurm_script_requeues_on_75(tmp_path, code, requeued):
    env = _fake_commands(tmp_path, srun=f"exit {code}", scontrol="exit 0")
    env["SLURM_JOB_ID"] = "4242"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "slurm_train.sbatch"), "train.py"], env=env
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == "srun --kill-on-bad-exit=1 python -u train.py"
    assert ("scontrol requeue 4242" in calls) == requeued
    assert run.returncode == (0 if requeued else code)


def test_tpu_pod_script_restarts_after_75(tmp_path):
    # The third ssh (the run) says "preempted" once, then finishes.
    body = f"""
if [[ "$*" == *"python3 -u train.py"* ]]; then
  n=$(grep -c 'python3 -u train.py' {tmp_path}/calls)
  [ "$n" -eq 1 ] && exit 75
fi
exit 0"""
    env = _fake_commands(tmp_path, gcloud=body)
    env.update(TPU_NAME="pod", ZONE="z", RESTART_DELAY="0")
    run = subprocess.run(["bash", str(ROOT / "scripts" / "tpu_pod_launch.sh"), "train.py"], env=env)
    runs = [c for c in (tmp_path / "calls").read_text().splitlines() if "python3 -u train.py" in c]
    assert run.returncode == 0 and len(runs) == 2

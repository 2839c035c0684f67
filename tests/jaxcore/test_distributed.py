"""Cluster detection (resolved settings only, no cluster) and timeouts that never hang."""

import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

import jaxcore as jc
from jaxcore.distributed import CoordinatorTimeoutError, detect, initialize, wait_for_coordinator
from jaxcore.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_VARS = (
    "JAXCORE_COORDINATOR",
    "JAXCORE_NUM_PROCESSES",
    "JAXCORE_PROCESS_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "OMPI_MCA_orte_hnp_uri",
    "PMIX_RANK",
    "JAX_COORDINATOR_ADDRESS",
)


@pytest.fixture
def no_cluster(monkeypatch):
    for var in CLUSTER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_torchrun_variables(no_cluster):
    env = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "2"}
    s = detect(environ=env)
    assert (s.coordinator_address, s.num_processes, s.process_id) == ("10.1.2.3:29500", 4, 2)
    assert s.source == "torchrun" and s.multi_process


def test_jaxcore_variables_win_over_torchrun_and_arguments_win_over_both(no_cluster):
    env = {
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "2",
        "JAXCORE_COORDINATOR": "127.0.0.1:7000",
        "JAXCORE_NUM_PROCESSES": "2",
        "JAXCORE_PROCESS_ID": "1",
    }
    s = detect(environ=env)
    assert (s.coordinator_address, s.num_processes, s.process_id) == ("127.0.0.1:7000", 2, 1)
    assert s.source == "JAXCORE_*"
    s = detect(process_id=0, environ=env)
    assert (s.coordinator_address, s.num_processes, s.process_id) == ("127.0.0.1:7000", 2, 0)
    assert s.source == "arguments+JAXCORE_*"


def test_slurm_is_detected_through_jax(no_cluster):
    for k, v in {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_NODELIST": "node[003-004]",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
    }.items():
        no_cluster.setenv(k, v)
    s = detect(environ={})
    assert s.source == "jax:slurm"
    assert (s.num_processes, s.process_id) == (8, 5)
    assert s.coordinator_address is None  # JAX derives node003:<port> itself
    assert s.multi_process


def test_single_process_is_a_no_op(no_cluster):
    s = initialize()
    assert s.source == "single process" and not s.multi_process
    assert not jax.distributed.is_initialized()
    assert jax.process_count() == 1


@pytest.mark.parametrize(
    "env, field",
    [
        ({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "process_id"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "coordinator_address"),
        ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "process_id=5"),
        ({"JAXCORE_NUM_PROCESSES": "two"}, "JAXCORE_NUM_PROCESSES"),
        (
            {
                "JAXCORE_COORDINATOR": "nohost",
                "JAXCORE_NUM_PROCESSES": "2",
                "JAXCORE_PROCESS_ID": "0",
            },
            "host:port",
        ),
    ],
)
def test_incomplete_settings_name_the_field(no_cluster, env, field):
    with pytest.raises(jc.ConfigError, match=field):
        detect(environ=env)


def test_wait_for_coordinator_times_out_with_the_address():
    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(CoordinatorTimeoutError, match=address.replace(".", r"\.")):
        wait_for_coordinator(address, 1.0)
    assert time.monotonic() - t0 < 5


@pytest.mark.multiprocess
@pytest.mark.parametrize("rank", [1, 0])
def test_coordinator_that_never_comes_up_fails_clearly(rank):
    """Rank 1 finds no coordinator; rank 0 is the coordinator but nobody joins it."""
    address = f"127.0.0.1:{free_port()}"
    code = (
        "import jaxcore.distributed as d\n"
        f"d.initialize({address!r}, num_processes=2, process_id={rank}, timeout_s=4)\n"
        "print('should not get here')\n"
    )
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=20, cwd=ROOT
    )
    assert time.monotonic() - t0 < 20
    assert result.returncode == 1  # a clean error exit, not SIGABRT
    assert address in result.stderr
    assert ("never came up" if rank else "timed out after 4 s") in result.stderr
    assert "should not get here" not in result.stdout

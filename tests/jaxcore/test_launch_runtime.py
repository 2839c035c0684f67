"""Process environments: malloc tunables, fake CPU devices, the re-exec helper."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxcore.launch import process_env
from jaxcore.runtime import MALLOC_TUNABLES, with_cpu_devices

SCRIPT = Path(__file__).parent / "scripts" / "print_tunables.py"


def test_children_get_malloc_tunables_unless_the_user_set_them():
    env = process_env(0, 2, "127.0.0.1:1", base={})
    assert env["GLIBC_TUNABLES"] == MALLOC_TUNABLES
    mine = "glibc.malloc.arena_max=2"
    assert process_env(0, 2, "127.0.0.1:1", base={"GLIBC_TUNABLES": mine})["GLIBC_TUNABLES"] == mine


def test_gpu_processes_get_their_own_gpus():
    env = process_env(1, 2, "127.0.0.1:1", devices_per_process=2, platform="gpu", base={})
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "XLA_FLAGS" not in env


def test_with_cpu_devices_sets_exactly_one_count():
    env = with_cpu_devices({}, 3)
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"


def run_script(env):
    return subprocess.run(
        [sys.executable, str(SCRIPT), "a", "b c"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_ensure_malloc_tuning_reexecs_with_the_tunables():
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    result = run_script(env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The script ran twice (before the re-exec and after), the second time tuned,
    # with its arguments intact.
    assert sum(line.startswith("before") for line in lines) == 2
    assert lines[-1] == f"tunables {MALLOC_TUNABLES} args ['a', 'b c']"


def test_ensure_malloc_tuning_keeps_the_users_choice():
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    result = run_script(env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sum(line.startswith("before") for line in lines) == 1
    assert lines[-1] == "tunables glibc.malloc.arena_max=2 args ['a', 'b c']"


# The two ways a user starts the CLI: the installed `jaxcore` script, and `python -m`.
CLI_COMMANDS = {
    "script": [str(Path(sys.executable).parent / "jaxcore")],
    "module": [sys.executable, "-m", "jaxcore.cli"],
}


def _run_untuned(tmp_path: Path, command: list[str]) -> subprocess.CompletedProcess:
    """Run ``command`` without GLIBC_TUNABLES, printing the tunables at each interpreter start.

    A ``sitecustomize`` on the path prints them whenever an interpreter starts, so a
    re-exec shows up as a second ``start`` line.
    """
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nprint('start', os.environ.get('GLIBC_TUNABLES'), flush=True)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(repo)])
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def _starts(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("start ")]


@pytest.mark.parametrize("how", sorted(CLI_COMMANDS))
def test_training_subcommands_reexec_with_the_tunables(tmp_path, how):
    # `jaxcore run` trains in its own process: it comes back once, tuned, and its
    # arguments reach the subcommand (its --help runs once, after the re-exec).
    result = _run_untuned(tmp_path, [*CLI_COMMANDS[how], "run", "--help"])
    assert _starts(result) == ["start None", f"start {MALLOC_TUNABLES}"]
    lines = result.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("usage: jaxcore run")] == [lines[2]]


def test_other_subcommands_start_once(tmp_path):
    # `jaxcore data` never trains (and never imports JAX): no re-exec.
    result = _run_untuned(tmp_path, [*CLI_COMMANDS["script"], "data", "--help"])
    assert _starts(result) == ["start None"]

"""`notebook_launcher` driven cell by cell in a real Jupyter kernel, as a Colab user would.

One kernel serves the module (it has JAX imported and its backend started, as a notebook
would); each test runs cells in it and reads the cell's stream output and error.
"""

from __future__ import annotations

import os
import queue
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[2]


class Kernel:
    def __init__(self, cwd: Path) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager()
        # This interpreter, not whatever `python3` kernelspec the machine has.
        self.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path[1:]])}
        env.pop("XLA_FLAGS", None)  # the kernel's own JAX: one CPU device
        self.km.start_kernel(env=env, cwd=str(cwd))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 40) -> dict:
        """Run one cell; its stream chunks (with their arrival time), text and error."""
        msg_id = self.kc.execute(textwrap.dedent(code))
        start = time.monotonic()
        chunks: list[tuple[float, str]] = []
        error = None
        while True:
            left = timeout - (time.monotonic() - start)
            try:
                msg = self.kc.get_iopub_msg(timeout=max(0.1, left))
            except queue.Empty:
                code = self.km.provisioner.process.poll()
                state = f"kernel exit code {code}" if code is not None else self.ranks_left()
                self.km.interrupt_kernel()  # leave the kernel usable for the next test
                text = "".join(t for _, t in chunks)
                raise AssertionError(
                    f"cell still running after {timeout} s ({state}):\n{text[-3000:]}"
                ) from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                chunks.append((time.monotonic() - start, content["text"]))
            elif kind == "error":
                error = content
            elif kind == "status" and content["execution_state"] == "idle":
                break
        return {
            "chunks": chunks,
            "text": "".join(t for _, t in chunks),
            "error": error,
            "elapsed": time.monotonic() - start,
        }

    def ok(self, code: str, timeout: float = 40) -> str:
        cell = self.run(code, timeout)
        assert cell["error"] is None, (cell["error"], cell["text"][-3000:])
        return cell["text"]

    def ranks_left(self) -> list[str]:
        """The kernel's child processes that are ranks of a launched run."""
        left = []
        try:
            children = psutil.Process(self.km.provisioner.process.pid).children(recursive=True)
        except psutil.Error:
            return ["(the kernel is gone)"]
        for child in children:
            try:
                if "jaxcore.notebook" in " ".join(child.cmdline()) and child.is_running():
                    if child.status() != psutil.STATUS_ZOMBIE:
                        left.append(f"{child.pid} {child.status()}")
                    else:
                        left.append(f"{child.pid} zombie")
            except psutil.Error:  # it ended meanwhile
                pass
        return left

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("nb39"))
    try:
        out = k.ok(
            """
            import jax, jaxcore as jc
            from jaxcore.launch import LaunchError
            from jaxcore.errors import ConfigError
            print(jax.devices(), jc.__file__)
            """,
            timeout=90,
        )
        # The package under test, not an installed copy.
        assert str(ROOT / "jaxcore") in out, out
        yield k
    finally:
        k.close()


def test_a_rank_that_raises_fails_the_cell_promptly_and_the_cell_reruns(kernel):
    """Rank 1 raises while rank 0 waits for it in a collective: the cell must fail with
    rank 1's traceback (not hang in JAX's shutdown barrier), leave no rank behind, and
    work when run again."""
    kernel.ok(
        """
        def step(fail):
            import jax, jax.numpy as jnp
            from jax.experimental import multihost_utils
            if fail and jax.process_index() == 1:
                raise RuntimeError("rank one broke")
            return float(multihost_utils.process_allgather(jnp.float32(1.0)).sum())
        """
    )
    cell = kernel.run("jc.notebook_launcher(step, (True,), num_processes=2)", timeout=35)
    assert cell["error"] is not None and cell["error"]["ename"] == "LaunchError", cell
    assert "rank 1 exited with code 1" in cell["error"]["evalue"]
    assert "RuntimeError: rank one broke" in cell["error"]["evalue"]
    assert "[rank 1] RuntimeError: rank one broke" in cell["text"]
    assert not kernel.ranks_left()
    # Run again: a fresh coordinator, no stale port.
    assert "2.0" in kernel.ok("print(jc.notebook_launcher(step, (False,), num_processes=2))")
    assert not kernel.ranks_left()


def test_a_module_on_a_path_the_notebook_added_reaches_the_ranks(kernel, tmp_path):
    """`sys.path.append(...)` then `import mymod` (a Drive folder on Colab): the ranks must
    import it too, as a forked process would."""
    (tmp_path / "nb39_helpers.py").write_text("def helper(x):\n    return x * 10\n")
    out = kernel.ok(
        f"""
        import sys
        sys.path.append({str(tmp_path)!r})
        import nb39_helpers
        print("got", jc.notebook_launcher(lambda: nb39_helpers.helper(2), num_processes=2))
        """
    )
    assert "got 20" in out


def test_what_cannot_be_sent_is_named_with_the_fix(kernel):
    """A function using a lock (an open file, a client) made in another cell."""
    cell = kernel.run(
        """
        import threading
        lock = threading.Lock()
        def uses_lock():
            with lock:
                return 1
        jc.notebook_launcher(uses_lock, num_processes=2)
        """
    )
    assert cell["error"]["ename"] == "ConfigError", cell
    message = cell["error"]["evalue"]
    assert "global 'lock'" in message and "_thread.lock" in message, message
    assert "inside the function" in message, message
    cell = kernel.run("jc.notebook_launcher(len, (lock,), num_processes=2)")
    assert "argument 0" in cell["error"]["evalue"], cell["error"]
    assert not kernel.ranks_left()


def test_a_result_that_cannot_be_returned_is_a_clear_error(kernel):
    """Rank 0's result holds a generator: one line naming it, not a pickling traceback
    from a child; a bad result on another rank does not matter unless `return_all`."""
    cell = kernel.run(
        """
        class Holder:
            def __init__(self):
                self.gen = (i for i in range(3))
        jc.notebook_launcher(Holder, num_processes=2)
        """
    )
    assert cell["error"]["ename"] == "LaunchError", cell
    message = cell["error"]["evalue"]
    assert "result of process 0" in message and "generator" in message, message
    assert "cloudpickle.py" not in message, message
    out = kernel.ok(
        """
        def only_zero_is_plain():
            import jax
            return 5 if jax.process_index() == 0 else (i for i in range(3))
        print("got", jc.notebook_launcher(only_zero_is_plain, num_processes=2))
        """
    )
    assert "got 5" in out


def test_notebook_functions_results_and_output(kernel):
    """What works: closures over notebook variables, a lambda, a class from an earlier cell,
    imports inside; a pytree of jax arrays and a class instance come back; output streams
    while the ranks run; 10k lines do not block; 1 and 3 processes after 2."""
    kernel.ok(
        """
        import numpy as np
        scale = 3
        class Acc:
            def __init__(self, v):
                self.v = v
        def train(n):
            import time
            import jax, jax.numpy as jnp
            rank = jax.process_index()
            for i in range(3):
                print(f"tick {i}", flush=True)
                time.sleep(1.0)
            for i in range(10_000):
                print(f"line {i}")
            big = np.ones((1000, 1000))
            return {"acc": Acc(n * scale), "arr": jnp.arange(3.0) + rank, "big": big}
        """
    )
    cell = kernel.run(
        """
        r = jc.notebook_launcher(train, (2,), num_processes=2)
        print("RESULT", r["acc"].v, isinstance(r["acc"], Acc), type(r["arr"]).__name__,
              r["arr"].tolist(), r["big"].sum())
        """
    )
    assert cell["error"] is None, cell
    text = cell["text"]
    assert "RESULT 6 True ndarray [0.0, 1.0, 2.0] 1000000.0" in text
    for rank in (0, 1):
        assert f"[rank {rank}] tick 2" in text and f"[rank {rank}] line 9999" in text
    # "tick 0" was shown while the ranks still ran (>= 2 s before the cell ended).
    first_tick = next(t for t, chunk in cell["chunks"] if "tick 0" in chunk)
    assert cell["elapsed"] - first_tick > 1.5, (first_tick, cell["elapsed"])
    out = kernel.ok(
        """
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # the kernel's
        f = lambda: (jax.process_count(), jax.device_count(), scale)
        print("one", jc.notebook_launcher(f, num_processes=1))
        print("three", jc.notebook_launcher(f, num_processes=3, return_all=True))
        """
    )
    assert "one (1, 1, 3)" in out
    assert "three [(3, 3, 3), (3, 3, 3), (3, 3, 3)]" in out
    assert not kernel.ranks_left()


def test_the_launcher_closes_each_lifeline_end_once():
    """`run_group` closed the read end twice; by the second close the number belonged to
    another file (in a kernel: a ZeroMQ socket, and the kernel died of SIGABRT)."""
    from jaxcore.lifeline import Lifeline

    lifeline = Lifeline(1.0)
    lifeline.started()
    with open(os.devnull) as other:  # takes the lowest free number: the read end's
        assert other.fileno() == lifeline.read_fd
        lifeline.close()
        os.fstat(other.fileno())  # still open

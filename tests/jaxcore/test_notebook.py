"""`notebook_launcher` from a process that imported and initialised JAX first."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

KERNEL = textwrap.dedent(
    """
    import json
    import jax
    jax.devices()                      # the "notebook" has started its JAX backend
    from jaxcore.notebook import notebook_launcher
    from jaxcore.launch import LaunchError

    def fn(offset):
        import jax, jax.numpy as jnp
        from jax.experimental import multihost_utils
        rank = jax.process_index()
        print(f"hello from process {rank} with {jax.local_device_count()} devices")
        values = multihost_utils.process_allgather(jnp.float32(rank + offset))
        return {"rank": rank, "values": values.tolist(), "devices": jax.device_count()}

    def broken():
        import jax
        if jax.process_index() == 1:
            raise ValueError("rank one is broken")
        return 0

    def global_values():
        import jax, jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec as P
        mesh = jax.make_mesh((jax.device_count(),), ("d",))
        sharded = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("d")))
        replicated = jax.device_put(jnp.float32(7), NamedSharding(mesh, P()))
        return {"sharded": sharded, "replicated": replicated, "rank": jax.process_index()}

    result = notebook_launcher(fn, (10,), num_processes=2, devices_per_process=2)
    arrays = notebook_launcher(
        global_values, num_processes=2, devices_per_process=2, return_all=True
    )
    arrays = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in a.items()} for a in arrays]
    try:
        notebook_launcher(broken, num_processes=2)
        error = None
    except LaunchError as e:
        error = str(e)
    print("RESULT " + json.dumps({"result": result, "error": error, "arrays": arrays}))
    """
)


@pytest.mark.multiprocess
def test_notebook_launcher_returns_process_zero_result():
    env = {"PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", KERNEL], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    data = json.loads(line[len("RESULT ") :])
    assert data["result"] == {"rank": 0, "values": [10.0, 11.0], "devices": 4}
    # Each process's output is shown, prefixed by its rank.
    assert "[rank 0] hello from process 0 with 2 devices" in out.stdout
    assert "[rank 1] hello from process 1 with 2 devices" in out.stdout
    # Global arrays (a train step's metrics are) come back as NumPy: sharded ones whole.
    assert data["arrays"] == [
        {"sharded": [0.0, 1.0, 2.0, 3.0], "replicated": 7.0, "rank": r} for r in range(2)
    ]
    assert "rank 1 exited with code 1" in data["error"]
    assert "ValueError: rank one is broken" in data["error"]

"""Helper for test_launch_stop39: rank 1 raises while rank 0 waits for it in a collective."""

from jax.experimental import multihost_utils

import jaxcore as jc

jc.initialize()
import jax  # noqa: E402  (after initialize, as a user script does)

if jax.process_index() == 1:
    raise RuntimeError("rank 1 broke before the barrier")
print("rank 0 waiting in a collective", flush=True)
multihost_utils.sync_global_devices("never reached by rank 1")

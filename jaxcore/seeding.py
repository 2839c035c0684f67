"""One seed for every source of randomness a training script touches.

Python's ``random``, NumPy's global generator (and torch's, when it is already imported)
are seeded in place; JAX has no global state, so the key is returned. Multi-process runs
that want a different stream per process (data augmentation on each host, say) ask for
``per_process=True``, which folds in ``jax.process_index()``; randomness inside the train
step comes from the train state's own key (`TrainState.rng`), which the checkpoint saves,
so dropout after a restart continues exactly where it stopped.
"""

from __future__ import annotations

import logging
import os
import random
import sys

import jax
import numpy as np

from jaxcore.errors import ConfigError

log = logging.getLogger(__name__)


def process_key(key: jax.Array) -> jax.Array:
    """``key`` folded with this process's index: a distinct stream per process."""
    return jax.random.fold_in(key, jax.process_index())


def seed_everything(seed: int, *, per_process: bool = False) -> jax.Array:
    """Seed Python, NumPy (and torch if imported); return a JAX key for ``seed``.

    With ``per_process`` the Python/NumPy seeds and the key differ per process
    (``seed + process_index`` and ``fold_in(key, process_index)``); without it every
    process draws the same numbers, which is what identical data order needs.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed_everything(seed={seed!r}): the seed must be an integer >= 0.")
    seed = int(seed)
    host_seed = seed + jax.process_index() if per_process else seed
    random.seed(host_seed)
    np.random.seed(host_seed % 2**32)
    # Only affects child processes (hash randomisation is fixed at interpreter start).
    os.environ["PYTHONHASHSEED"] = str(host_seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(host_seed)
    key = jax.random.key(seed)
    if per_process:
        key = process_key(key)
    log.info("seeded everything with %d%s", seed, " (per process)" if per_process else "")
    return key

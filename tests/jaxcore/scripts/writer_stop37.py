"""A run that saves steps 1, 2, 3 asynchronously into ``argv[1]`` and stops inside the
finalize of steps 2 and 3, before their rename: it prints ``BLOCKED <step>`` and waits
for a line on stdin (then finishes that step) or for its kill."""

import sys

import jax.numpy as jnp
import optax

import jaxcore as jc
from jaxcore.checkpointing import atomic
from tests.jaxcore.helpers import factory


def _hold(tmp, step: int) -> None:
    if step >= 2:
        print(f"BLOCKED {step}", flush=True)
        sys.stdin.readline()


def main() -> None:
    atomic.before_rename = _hold
    engine = jc.Engine()
    state = engine.prepare(factory, optax.sgd(0.1))
    with jc.Checkpointer(jc.CheckpointConfig(directory=sys.argv[1]), engine=engine) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(state.replace(step=jnp.int32(step)), force=True)
            ckpt.wait()


if __name__ == "__main__":
    main()

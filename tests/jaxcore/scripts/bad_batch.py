"""Helper for test_batch_checks: run one user mistake; the process must end in a clean error.

    python bad_batch.py CASE     (CASE: see CASES below)

The error is not caught: the test checks the exit status (1, a Python exception, never a
signal) and the message on stderr.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import jax
import numpy as np
import optax

import jaxcore as jc
from jaxcore.models import lm_loss
from tests.jaxcore.helpers import CFG, factory, make_batch

engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
plan = engine.plan(factory, optax.sgd(0.1))
tokens = make_batch(4, 0)["tokens"]


def train(batch, loss_fn=lm_loss):
    state = plan.init()
    return plan.train_step(loss_fn)(state, batch)


def donated_train():
    state = plan.init()
    step = plan.train_step(lm_loss)
    step(state, {"tokens": tokens})
    step(state, {"tokens": tokens})  # the first call donated `state`


def donated_eval():
    state = plan.init()
    plan.train_step(lm_loss)(state, {"tokens": tokens})
    plan.eval_step(lm_loss)(state, {"tokens": tokens})


CASES = {
    "float_tokens": lambda: train({"tokens": tokens.astype(np.float32)}),
    "3d_tokens": lambda: train({"tokens": tokens[:, :, None]}),
    "bare_array": lambda: train(tokens),
    "id_past_vocab": lambda: train(
        {"tokens": np.where(tokens == tokens[0, 0], CFG.vocab_size, tokens)}
    ),
    "negative_id": lambda: train({"tokens": np.where(tokens == tokens[0, 0], -1, tokens)}),
    "too_long": lambda: train({"tokens": np.zeros((4, CFG.max_seq_len + 2), np.int32)}),
    "id_past_vocab_on_device": lambda: train(
        {"tokens": jax.device_put(np.full_like(tokens, CFG.vocab_size), plan.batch_sharding)}
    ),
    "loss_bare_scalar": lambda: train({"tokens": tokens}, lambda m, b, r: lm_loss(m, b, r)[0]),
    "loss_not_scalar": lambda: train(
        {"tokens": tokens}, lambda m, b, r: (m(b["tokens"][:, :-1]).mean(-1), {})
    ),
    "loss_aux_not_dict": lambda: train(
        {"tokens": tokens}, lambda m, b, r: (lm_loss(m, b, r)[0], 1.0)
    ),
    "donated_train": donated_train,
    "donated_eval": donated_eval,
}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    print("no error")

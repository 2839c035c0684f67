"""DPO raises the held-out chosen-minus-rejected margin; SFT trains on completions only."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxcore as jc
from rlhf.dpo import dpo_objective, with_reference
from rlhf.models import lm_factory
from rlhf.sft import chat_example, pack, sft_loss

from .helpers import CFG, VOCAB, adam, dpo_pairs, engine


def test_dpo_raises_held_out_margin():
    eng = engine()
    state = eng.prepare(lm_factory(CFG), adam(3e-3), seed=0)
    reference = jax.tree.map(jnp.copy, state)  # frozen: train steps donate `state`
    train = with_reference(eng, reference, [dpo_pairs(16, seed=i) for i in range(15)])
    (held_out,) = with_reference(eng, reference, [dpo_pairs(32, seed=999)])
    evaluate = eng.eval_step(dpo_objective(beta=0.1))
    before = float(evaluate(state, held_out)["reward_margin"])
    step = eng.train_step(dpo_objective(beta=0.1))
    for batch in train:
        state, _ = step(state, batch)
    after = evaluate(state, held_out)
    print(f"held-out margin {before:.4f} -> {float(after['reward_margin']):.4f}")
    assert abs(before) < 1e-4  # the policy starts as the reference
    assert float(after["reward_margin"]) > before + 0.2
    assert float(after["reward_accuracy"]) > 0.9


def test_dpo_without_reference_says_how_to_get_it():
    batch = {k: jnp.zeros((2, 3), jnp.int32) for k in ("chosen", "rejected")}
    batch |= {"chosen_mask": jnp.ones((2, 3)), "rejected_mask": jnp.ones((2, 3))}
    with pytest.raises(jc.BatchError, match="with_reference"):
        dpo_objective()(None, batch, None)


def test_pack_masks_prompts_and_restarts_positions():
    rows = pack([([5, 6, 7], [8, 9]), ([10], [11, 12]), ([4, 4, 4, 4], [5])], 7, eos_id=1)
    # Example 1 fills 6 of 8; example 2 (4 tokens) does not fit, starts row 2; example 3
    # (6 tokens) does not fit after it: row 3.
    assert rows["tokens"].shape == (3, 8)
    np.testing.assert_array_equal(rows["tokens"][0], [5, 6, 7, 8, 9, 1, 0, 0])
    np.testing.assert_array_equal(rows["loss_mask"][0], [0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(rows["positions"][1], [0, 1, 2, 3, 0, 0, 0, 0])
    both = pack([([5], [6]), ([7, 7], [8])], 7)
    np.testing.assert_array_equal(both["tokens"], [[5, 6, 7, 7, 8, 0, 0, 0]])
    np.testing.assert_array_equal(both["loss_mask"], [[0, 1, 0, 0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(both["positions"], [[0, 1, 0, 1, 2, 0, 0, 0]])
    with pytest.raises(jc.ConfigError, match="raise length"):
        pack([([1] * 9, [2])], 7)


def test_prompt_tokens_carry_zero_loss_weight():
    """The loss equals CE over completion targets only, whatever the prompt targets' logits."""
    rows = pack([([5, 6, 7], [8, 9]), ([10, 4], [11])], 7)
    logits = jax.random.normal(jax.random.key(0), (1, 7, VOCAB))

    def model(tokens, positions, segments=None):
        return jnp.broadcast_to(logits, (tokens.shape[0], *logits.shape[1:]))

    loss, aux = sft_loss()(model, rows, None)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits[0], rows["tokens"][0, 1:])
    m = rows["loss_mask"][0, 1:]
    np.testing.assert_allclose(loss, (ce * m).sum() / m.sum(), rtol=1e-6)
    assert float(aux["weight"]) == 3.0
    # Gradient w.r.t. the logits vanishes at prompt-target positions.
    grad = jax.grad(lambda lg: sft_loss()(lambda t, p, s=None: lg, rows, None)[0])(logits)
    assert float(jnp.abs(grad[0, m == 0]).max()) == 0.0


def test_chat_example_needs_an_assistant_answer():
    class Tok:
        def apply_chat_template(self, messages, add_generation_prompt=True):
            text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
            return text + ("<assistant>" if add_generation_prompt else "")

        def encode(self, text):
            return [ord(c) % VOCAB for c in text]

    prompt, completion = chat_example(
        Tok(), [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )
    assert completion == Tok().encode("yo") and prompt == Tok().encode("<user>hi<assistant>")
    with pytest.raises(jc.ConfigError, match="assistant"):
        chat_example(Tok(), [{"role": "user", "content": "hi"}])


def test_sft_completion_loss_falls():
    rng = np.random.default_rng(0)
    # Completion = the prompt reversed: learnable, and only completions are scored.
    examples = []
    for _ in range(64):
        p = rng.integers(4, VOCAB, size=3).tolist()
        examples.append((p, p[::-1]))
    rows = pack(examples, 15)  # 6 tokens each: two examples per row of 16
    eng = engine()
    state = eng.prepare(lm_factory(CFG), adam(1e-2), seed=0)
    step = eng.train_step(sft_loss())
    first = None
    for i in range(20):
        batch = {k: v[(i % 4) * 8 : (i % 4) * 8 + 8] for k, v in rows.items()}
        state, metrics = step(state, batch)
        first = float(metrics["loss"]) if first is None else first
    last = float(metrics["loss"])
    print(f"completion loss {first:.3f} -> {last:.3f}")
    assert last < 0.8 * first

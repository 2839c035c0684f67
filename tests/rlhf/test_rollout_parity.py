"""Sampler vs trainer log-probs on the same weights and tokens, on different layouts."""

import jax
import numpy as np

import jaxcore as jc
from inference import ServingConfig
from rlhf.models import lm_factory
from rlhf.rollout import Sampler
from rlhf.scoring import logprob_scorer, parity
from rlhf.sft import pack, sft_loss

from .helpers import CFG, VOCAB, adam, engine


def test_sampler_and_trainer_logprobs_agree_across_layouts_and_weight_updates():
    trainer = engine(jc.ParallelConfig(fsdp=4, tensor=2))
    state = trainer.prepare(lm_factory(CFG), adam(3e-2), seed=0)
    serving = ServingConfig(
        slots=8, max_len=16, parallel=jc.ParallelConfig(data=4, fsdp=1, tensor=2)
    )
    sampler = Sampler(CFG, state.params, serving, eos_id=1)
    assert sampler.llm.engine.mesh.shape["data"] == 4  # not the trainer's layout
    score = logprob_scorer(trainer)
    prompts = np.random.default_rng(0).integers(2, VOCAB, size=(8, 4)).tolist()

    r0 = sampler.generate(prompts, max_tokens=8, seed=0)
    assert r0.tokens.shape == (8, 12) and r0.mask.sum() > 0
    p0 = parity(r0.sampler_logp, score(state, r0.tokens), r0.mask)
    assert p0["logprob_diff_max"] < 1e-4, p0
    compiles = sampler.llm.engine.compile_count()

    # Train a few steps, hand the new weights over in memory, sample again.
    rows = pack([(p[:2], p[2:]) for p in prompts], 7)
    step = trainer.train_step(sft_loss())
    for _ in range(3):
        state, _ = step(state, rows)
    sampler.load(trainer.bind(state))
    sharding = jax.tree.leaves(sampler.llm.engine.weights)[1].sharding
    assert sharding.mesh.shape["data"] == 4  # resharded onto the sampler's mesh
    r1 = sampler.generate(prompts, max_tokens=8, seed=0)
    new = score(state, r1.tokens)
    p1 = parity(r1.sampler_logp, new, r1.mask)
    print("parity before/after update:", p0, p1)
    assert p1["logprob_diff_max"] < 1e-4, p1
    # The sampler really serves the new weights: the old ones score these tokens apart.
    assert np.abs((new - r1.sampler_logp) * r1.mask).max() < 1e-4
    assert parity(r0.sampler_logp, score(state, r0.tokens), r0.mask)["logprob_diff_max"] > 1e-2
    assert sampler.llm.engine.compile_count() == compiles  # no recompile on hand-off


def test_eos_truncates_completions_and_keeps_its_logprob():
    trainer = engine()
    state = trainer.prepare(lm_factory(CFG), adam(), seed=1)
    sampler = Sampler(CFG, state.params, ServingConfig(slots=8, max_len=32), eos_id=5)
    prompts = [[7, 8, 9]] * 8
    r = sampler.generate(prompts, max_tokens=20, seed=3)
    score = logprob_scorer(trainer)
    for i, c in enumerate(r.completions):
        assert 5 not in c[:-1]  # cut right after the first EOS
        assert r.has_eos[i] == (bool(c) and c[-1] == 5)
        assert r.mask[i].sum() == len(c)
    assert r.has_eos.any() and (r.mask.sum(1) < 20).any()  # 20 draws from 16 tokens
    assert parity(r.sampler_logp, score(state, r.tokens), r.mask)["logprob_diff_max"] < 1e-4

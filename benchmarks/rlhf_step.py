"""One PPO iteration (rollout + 4 epochs) of a small model on CPU.

Reports rollout tokens/s through the continuous-batching engine (`rlhf.Sampler` over
`inference`) against a naive per-sequence loop (one full forward per new token, no KV
cache, one sequence at a time: how a hand-written sampler starts out), the share of the
iteration's wall time spent generating. TRL side by side is not written yet:
``pip install --dry-run trl==1.16.0`` resolves without changing torch 2.13.0 (it would add
accelerate 1.15.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19, xxhash 4.1.0), but
``trl`` is not installed and ``ours_over_trl`` stays null. Targets: ``rollout_speedup``
>= 4, ``ours_over_trl`` >= 1.

    python benchmarks/rlhf_step.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 prompts x 16 tokens (< 3 min)")
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"
    )
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from _common import print_table, write_results

    import jaxcore as jc
    from inference import ServingConfig
    from jaxcore.models import TransformerConfig
    from rlhf import PPOConfig, PPOTrainer, Sampler, lm_factory, scalar_head_factory

    n, new = (8, 16) if args.quick else (32, 32)
    prompt_len = 8
    cfg = TransformerConfig(
        vocab_size=64,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        max_seq_len=prompt_len + new,
    )
    one = dict(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    actor, critic = jc.Engine(**one), jc.Engine(**one)
    state = actor.prepare(lm_factory(cfg), optax.adam(1e-3))
    values = critic.prepare(scalar_head_factory(cfg), optax.adam(1e-3), seed=1)
    sampler = Sampler(cfg, state.params, ServingConfig(slots=n, max_len=prompt_len + new))
    reward = lambda prompt, completion: completion.count(3) / new
    trainer = PPOTrainer(
        (actor, state), (critic, values), sampler, reward, PPOConfig(max_tokens=new, ppo_epochs=4)
    )
    prompts = np.random.default_rng(0).integers(4, 64, size=(n, prompt_len)).tolist()
    trainer.step(prompts)  # compiles everything once
    start = time.perf_counter()
    metrics = trainer.step(prompts)
    iteration_s = time.perf_counter() - start
    ours_tps = metrics["rollout_tokens_per_s"]

    # Naive baseline: per sequence, per token, one full forward of the padded sequence.
    model = actor.bind(trainer.actor)
    forward = jax.jit(lambda toks: model(toks))
    key = jax.random.key(0)
    toks = np.zeros((1, prompt_len + new), np.int32)
    forward(jnp.asarray(toks)).block_until_ready()
    start = time.perf_counter()
    for p in prompts:
        toks[0, :prompt_len] = p
        for t in range(prompt_len, prompt_len + new):
            logits = forward(jnp.asarray(toks))[0, t - 1]
            key, sub = jax.random.split(key)
            toks[0, t] = int(jax.random.categorical(sub, logits))
    naive_tps = n * new / (time.perf_counter() - start)

    has_trl = importlib.util.find_spec("trl") is not None
    load = os.getloadavg()[0]
    rows = [
        ["rollout tokens/s (continuous batching)", f"{ours_tps:.0f}"],
        ["rollout tokens/s (naive per-sequence loop)", f"{naive_tps:.0f}"],
        ["rollout_speedup", f"{ours_tps / naive_tps:.2f}"],
        ["PPO iteration s (rollout + 4 epochs)", f"{iteration_s:.2f}"],
        ["generation share of wall time", f"{metrics['generate_s'] / iteration_s:.2f}"],
        ["TRL PPOTrainer", "not installed" if not has_trl else "not measured"],
        ["load average (1 min)", f"{load:.1f}"],
    ]
    print_table(f"PPO iteration, {n} prompts x {new} tokens, 1 CPU device", ["", "value"], rows)
    write_results(
        "rlhf_step",
        {
            "prompts": n,
            "new_tokens": new,
            "rollout_tokens_per_s": ours_tps,
            "naive_tokens_per_s": naive_tps,
            "rollout_speedup": ours_tps / naive_tps,
            "iteration_s": iteration_s,
            "generate_share": metrics["generate_s"] / iteration_s,
            "ours_over_trl": None,
            "trl": "not installed in this environment" if not has_trl else "not measured",
            "load_average_1m": load,
            "note": "2-core machine shared with six other engineers: ratios only",
        },
    )


if __name__ == "__main__":
    main()

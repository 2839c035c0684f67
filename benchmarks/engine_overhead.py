"""The engine's train step against a hand-written jax.jit + optax step, same model and mesh.

Both steps train the reference decoder on the same batch, with the same shardings (the
hand-written one reuses the engine's placement), run in turns in one process. The ratios
are engine steps/s over hand-written steps/s, with the non-finite guard off
(``nonfinite="ignore"``: ``ratio``) and on (the default ``"skip"``: ``guard_on_ratio``);
target >= 0.97 for both. Each step's loss is read back every step (as a training loop that
logs does), which is also when the guard's lazy host check has its counters ready.

    python benchmarks/engine_overhead.py [--quick] [--devices 1|8]
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small model, few rounds (< 1 min)")
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="CPU devices (1 measures the step itself; 8 fake ones add ~8%%)",
    )
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args.devices}"
    )
    from jaxcore.runtime import ensure_malloc_tuning

    ensure_malloc_tuning()

    import jax
    import optax
    from _common import print_table, stdlib_batch, time_alternating, write_results
    from flax import nnx

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, lm_loss

    if args.quick:
        cfg, batch, seq, rounds, steps = TransformerConfig.tiny(), 8, 64, 5, 5
    else:
        cfg = TransformerConfig(
            d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, d_ff=704, max_seq_len=256
        )
        batch, seq, rounds, steps = 8, 256, 7, 5
    tx = optax.adamw(1e-4)
    factory = lambda rngs: Transformer(cfg, rngs=rngs)
    guarded = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3).plan(factory, tx)
    plain = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), zero=3, nonfinite="ignore").plan(
        factory, tx
    )
    steps_of = {"engine": plain.train_step(lm_loss), "engine_guard": guarded.train_step(lm_loss)}
    data = stdlib_batch(batch, seq)
    global_batch = guarded.shard_batch(data)

    # The hand-written step: nnx split/merge, value_and_grad, optax; same shardings.
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: factory(nnx.Rngs(0))))

    def loss_fn(params, batch):
        st = jax.tree.map(lambda x: x, abstract)
        nnx.replace_by_pure_dict(st, params)
        return lm_loss(nnx.merge(graphdef, st), batch, None)[0]

    def hand_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    sh = guarded.state_shardings
    hand = jax.jit(
        hand_step,
        in_shardings=(sh.params, sh.opt_state, guarded.batch_sharding),
        out_shardings=(sh.params, sh.opt_state, None),
        donate_argnums=(0, 1),
    )
    hand_state = guarded.init()
    holder = {
        "engine": plain.init(),
        "engine_guard": guarded.init(),
        "hp": hand_state.params,
        "ho": hand_state.opt_state,
    }

    def engine_runner(name):
        def run():
            holder[name], m = steps_of[name](holder[name], global_batch)
            m["loss"].block_until_ready()

        return run

    run_engine, run_guard = engine_runner("engine"), engine_runner("engine_guard")

    def run_hand():
        holder["hp"], holder["ho"], loss = hand(holder["hp"], holder["ho"], global_batch)
        loss.block_until_ready()

    run_engine(), run_guard(), run_hand()  # compile all three
    secs = time_alternating(
        {"engine": run_engine, "engine_guard": run_guard, "handwritten": run_hand},
        rounds=rounds,
        steps=steps,
    )
    ratio = secs["handwritten"] / secs["engine"]
    guard_ratio = secs["handwritten"] / secs["engine_guard"]
    load = os.getloadavg()
    tokens = batch * seq
    rows = [[name, f"{s * 1e3:.1f}", f"{tokens / s:,.0f}"] for name, s in secs.items()]
    print_table(
        f"train step, {jc.models.count_params(cfg) / 1e6:.1f}M params, batch {batch}"
        f"x{seq}, {jax.device_count()} device(s)",
        ["step", "ms/step", "tokens/s"],
        rows,
    )
    print(
        f"ratio engine/handwritten steps/s, guard off: {ratio:.3f}, guard on: "
        f"{guard_ratio:.3f} (target >= 0.97); load average {load[0]:.1f} (shared machine)"
    )
    write_results(
        "engine_overhead",
        {
            "ratio": ratio,
            "guard_on_ratio": guard_ratio,
            "target": 0.97,
            "engine_s_per_step": secs["engine"],
            "engine_guard_s_per_step": secs["engine_guard"],
            "handwritten_s_per_step": secs["handwritten"],
            "devices": jax.device_count(),
            "params": jc.models.count_params(cfg),
            "batch": batch,
            "seq": seq,
            "quick": args.quick,
            "load_average_1m": load[0],
        },
    )


if __name__ == "__main__":
    main()

"""Pipeline efficiency against the bubble theory: pipeline=4 vs no pipeline, 8 CPU devices.

The same model and global batch train with ``pipeline=4, fsdp=2`` at M = 4, 8, 16, 32
microbatches (GPipe) and with ``fsdp=8`` and no pipeline; all in turns in one process.
The measured efficiency is ``t_ideal / t_measured`` with ``t_ideal`` the unpipelined step
time (the same work with no bubble); the theory is ``1 - (S-1)/(M+S-1)``. Target: within
15% of the theory at M=16.

    python benchmarks/pipeline_bubble.py [--quick]
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="M = 4 and 16 only, fewer rounds")
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    from jaxcore.runtime import ensure_malloc_tuning

    ensure_malloc_tuning()
    import numpy as np
    import optax
    from _common import print_table, stdlib_batch, time_alternating, write_results

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig, lm_loss

    stages, batch, seq = 4, 64, 128
    cfg = TransformerConfig(
        d_model=128, n_layers=8, n_heads=4, n_kv_heads=4, d_ff=384, max_seq_len=seq
    )
    micro_counts = [4, 16] if args.quick else [4, 8, 16, 32]
    data = stdlib_batch(batch, seq)
    factory = lambda rngs: Transformer(cfg, rngs=rngs)

    def runner(engine: jc.Engine):
        holder = {"state": engine.prepare(factory, optax.sgd(1e-3))}
        step = engine.train_step(lm_loss)
        b = engine.shard_batch(data)

        def run():
            holder["state"], m = step(holder["state"], b)
            m["loss"].block_until_ready()

        run()
        return run

    fns = {"no pipeline": runner(jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=0))}
    for m in micro_counts:
        fns[f"M={m}"] = runner(
            jc.Engine(parallel=jc.ParallelConfig(pipeline=stages, fsdp=2), zero=0, microbatches=m)
        )
    secs = time_alternating(fns, rounds=3 if args.quick else 5, steps=2)
    ideal = secs["no pipeline"]
    rows, per_m = [["no pipeline", f"{ideal * 1e3:.0f}", "1.000", "1.000", ""]], {}
    for m in micro_counts:
        measured = ideal / secs[f"M={m}"]
        theory = 1 - (stages - 1) / (m + stages - 1)
        gap = abs(measured - theory) / theory
        per_m[m] = {"step_s": secs[f"M={m}"], "measured": measured, "theory": theory, "gap": gap}
        rows.append(
            [
                f"pipeline={stages}, M={m}",
                f"{secs[f'M={m}'] * 1e3:.0f}",
                f"{measured:.3f}",
                f"{theory:.3f}",
                f"{gap:.1%}",
            ]
        )
    print_table(
        f"GPipe efficiency, {jc.models.count_params(cfg) / 1e6:.1f}M params, batch "
        f"{batch}x{seq}, 8 CPU devices",
        ["layout", "ms/step", "measured", "theory", "gap"],
        rows,
    )
    gap16 = per_m[16]["gap"]
    print(f"gap at M=16: {gap16:.1%} (target <= 15%)")
    write_results(
        "pipeline_bubble",
        {
            "gap_at_16": gap16,
            "target": 0.15,
            "stages": stages,
            "t_ideal_s": ideal,
            "per_microbatches": {str(k): v for k, v in per_m.items()},
            "quick": args.quick,
            "batch": batch,
            "seq": seq,
            "params": jc.models.count_params(cfg),
            "note": "on fake CPU devices every stage's work shares the same 2 cores",
            "numpy": np.__version__,
        },
    )


if __name__ == "__main__":
    main()

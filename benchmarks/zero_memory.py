"""Per-device bytes of parameters plus optimizer state for ZeRO stages 0-3 on 8 devices.

Bytes come from the arrays' shardings after `Engine.prepare` (what each device really
holds). ZeRO paper (Rajbhandari et al. 2020): stage 3 divides all the model state by the
device count (here float32 weights and Adam's two moments, 12 bytes per parameter; the
paper's mixed-precision count is 16), so zero3/zero0 should approach 1/8; target <= 0.13.

    python benchmarks/zero_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smaller model (< 1 min)")
    args = p.parse_args()
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    )
    import optax
    from _common import print_table, write_results

    import jaxcore as jc
    from jaxcore.models import Transformer, TransformerConfig

    cfg = TransformerConfig.tiny() if args.quick else TransformerConfig.small()
    rows, per_stage = [], {}
    for zero in range(4):
        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=zero)
        state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(1e-4))
        params = max(jc.per_device_bytes(state.params).values())
        total = max(jc.per_device_bytes((state.params, state.opt_state)).values())
        per_stage[zero] = total
        rows.append(
            [
                zero,
                f"{params / 2**20:.2f}",
                f"{(total - params) / 2**20:.2f}",
                f"{total / 2**20:.2f}",
                f"{total / per_stage[0]:.3f}",
            ]
        )
        del state
    ratio = per_stage[3] / per_stage[0]
    print_table(
        f"per-device state, {jc.models.count_params(cfg) / 1e6:.1f}M params, AdamW, fsdp=8",
        ["zero", "params MiB", "optimizer MiB", "total MiB", "vs zero 0"],
        rows,
    )
    print(f"zero3/zero0: {ratio:.4f} (target <= 0.13; ideal 1/8 = 0.125)")
    write_results(
        "zero_memory",
        {
            "zero3_over_zero0": ratio,
            "target": 0.13,
            "bytes_per_device": {str(k): v for k, v in per_stage.items()},
            "params": jc.models.count_params(cfg),
            "quick": args.quick,
        },
    )


if __name__ == "__main__":
    main()

"""Two-layout parity on the machine's devices: the same training steps, two layouts.

With 2 or more devices: 1 device (``fsdp=1``) against all devices (``fsdp=N``, ZeRO 3).
With one device: the whole batch against the same batch in 2 accumulated microbatches
(``grad_accum=2``), the only second layout one device has. Both run the backend's default
attention kernel (cuDNN flash attention on NVIDIA GPUs in bf16) and the precision
`jaxcore.precision.default_precision` picks. Losses must agree within the dtype's
tolerance; writes ``--out`` (JSON) and exits 1 when they do not.

    python benchmarks/gpu_parity.py --out benchmarks/results/gpu_parity.json [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np
import optax

import jaxcore as jc
from jaxcore.models import Transformer, TransformerConfig, lm_loss
from jaxcore.models.transformer import attention_implementation
from jaxcore.precision import default_precision

TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}  # relative, on the losses of 3 steps


def layouts(devices: list) -> dict[str, dict]:
    """The two engine settings to compare on ``devices``."""
    if len(devices) >= 2:
        n = len(devices)
        return {
            "fsdp=1": dict(parallel=jc.ParallelConfig(fsdp=1), devices=devices[:1], zero=0),
            f"fsdp={n} zero3": dict(parallel=jc.ParallelConfig(fsdp=n), devices=devices, zero=3),
        }
    return {
        "batch": dict(parallel=jc.ParallelConfig(fsdp=1), devices=devices, zero=0),
        "grad_accum=2": dict(
            parallel=jc.ParallelConfig(fsdp=1), devices=devices, zero=0, grad_accum=2
        ),
    }


def run(layout: dict, cfg: TransformerConfig, precision: str, batches: list) -> list[float]:
    engine = jc.Engine(precision=precision, **layout)
    state = engine.prepare(lambda rngs: Transformer(cfg, rngs=rngs), optax.adamw(1e-3))
    step = engine.train_step(lm_loss)
    losses = []
    for b in batches:
        state, m = step(state, b)
        losses.append(float(m["loss"]))
    return losses


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu_parity.json"))
    p.add_argument("--dry-run", action="store_true", help="print the plan, compile nothing")
    args = p.parse_args()
    devices = jax.devices()
    precision = default_precision(devices[0].platform)
    compute = jc.precision.get_policy(precision).compute_dtype
    cfg = TransformerConfig.tiny(n_layers=4, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512)
    plan = {
        "devices": [d.device_kind for d in devices],
        "platform": devices[0].platform,
        "precision": precision,
        "attention": attention_implementation(devices[0], compute),
        "layouts": list(layouts(devices)),
    }
    print(json.dumps(plan))
    if args.dry_run:
        return 0
    rng = np.random.default_rng(0)
    batches = [{"tokens": rng.integers(0, 256, (8, 129)).astype(np.int32)} for _ in range(3)]
    losses = {name: run(lay, cfg, precision, batches) for name, lay in layouts(devices).items()}
    (a, la), (b, lb) = losses.items()
    rel = float(np.max(np.abs(np.array(la) - np.array(lb)) / np.abs(np.array(la))))
    ok = rel <= TOLERANCE[precision]
    result = {**plan, "losses": losses, "max_rel_diff": rel, "tolerance": TOLERANCE[precision]}
    result["parity"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{a} vs {b}: max relative loss difference {rel:.2e} ({'ok' if ok else 'MISMATCH'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""jaxcore against PyTorch eager and torch.compile: the same decoder on this CPU, float32.

Same architecture (benchmarks/torch_llama.py mirrors jaxcore.models.Transformer), same
dims, batch and AdamW; jaxcore runs on 1 CPU device. Each framework runs in its own
process and the processes take turns (`_common.StepWorker`: two programs in one process
disturb each other); tokens/s, the ratios, and MFU against this machine's measured f32
matmul peak. Target (issue 20): jaxcore >= 0.9x torch eager at both sizes (the goal is 1.0).

    python benchmarks/vs_torch_cpu.py [--quick] [--sizes a,b]
"""

from __future__ import annotations

import argparse
import os

SIZES = {
    # name: (d_model, n_layers, n_heads, seq, batch) -- sizes a and b of PERF-NOTES.md
    "q": (128, 2, 4, 128, 8),
    "a": (256, 4, 4, 256, 8),
    "b": (512, 8, 8, 512, 8),
}


def model_config(name: str):
    """The reference decoder of size ``name`` (SwiGLU width ~8/3 d, rounded to 64)."""
    from jaxcore.models import TransformerConfig

    d, layers, heads, seq, _ = SIZES[name]
    return TransformerConfig(
        d_model=d,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=heads,
        d_ff=int(d * 8 / 3 + 63) // 64 * 64,
        max_seq_len=seq,
    )


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Measured f32 matmul throughput of XLA on this machine (the MFU denominator)."""
    import time

    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda a, b: a @ b)
    f(x, x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        f(x, x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


FRAMEWORKS = ("jaxcore", "torch eager", "torch.compile")


def serve_framework(size: str, framework: str) -> None:
    """The worker: one framework's training step at ``size``, one step per request."""
    import numpy as np
    from _common import serve_steps, stdlib_batch

    import jaxcore as jc
    from jaxcore.models import training_flops_per_token

    _, _, _, seq, batch = SIZES[size]
    cfg = model_config(size)
    data = stdlib_batch(batch, seq)
    if framework == "jaxcore":
        import jax
        import optax

        from jaxcore.models import Transformer, lm_loss

        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
        state = engine.prepare(lambda r: Transformer(cfg, rngs=r), optax.adamw(1e-4))
        step = engine.train_step(lm_loss)
        jbatch = engine.shard_batch(data)

        def run():
            nonlocal state
            state, m = step(state, jbatch)
            m["loss"].block_until_ready()

    else:
        import torch
        from torch_llama import TorchLlama
        from torch_llama import lm_loss as torch_loss

        torch.set_num_threads(os.cpu_count() or 1)
        torch.manual_seed(0)
        tokens = torch.from_numpy(np.asarray(data["tokens"], np.int64))
        model = TorchLlama(cfg)
        if framework == "torch.compile":
            model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def run():
            opt.zero_grad(set_to_none=True)
            torch_loss(model, tokens).backward()
            opt.step()

    serve_steps(
        run,
        {
            "config": {
                "d_model": cfg.d_model,
                "n_layers": cfg.n_layers,
                "n_heads": cfg.n_heads,
                "seq": seq,
                "batch": batch,
                "d_ff": cfg.d_ff,
                "params": jc.models.count_params(cfg),
            },
            "flops_per_token": training_flops_per_token(cfg, seq),
        },
    )


def bench_size(name: str, rounds: int, steps: int, compile_torch: bool) -> dict:
    """tokens/s of each framework at size ``name``, a worker process each, in turns."""
    import statistics

    from _common import run_in_turns

    frameworks = FRAMEWORKS if compile_torch else FRAMEWORKS[:2]
    programs = [(fw, [__file__, "--worker", name, fw]) for fw in frameworks]
    turns = run_in_turns(programs, rounds, steps)
    info = turns.info[frameworks[0]]
    _, _, _, seq, batch = SIZES[name]
    wall = {k: statistics.median(v["wall"]) for k, v in turns.samples.items()}
    return {
        "config": info["config"],
        "tokens_per_s": {k: batch * seq / t for k, t in wall.items()},
        "cpu_s_per_step": {k: statistics.median(v["cpu"]) for k, v in turns.samples.items()},
        "flops_per_token": info["flops_per_token"],
        "first_call_s": {k: v["first_call_s"] for k, v in turns.info.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one small size, few rounds (< 1 min)")
    p.add_argument("--sizes", default="a,b", help="comma-separated sizes from: a, b")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    p.add_argument("--worker", nargs=2, metavar=("SIZE", "FRAMEWORK"), help=argparse.SUPPRESS)
    args = p.parse_args()
    from jaxcore.runtime import ensure_malloc_tuning

    ensure_malloc_tuning()  # the workers inherit it
    os.environ.pop("XLA_FLAGS", None)  # 1 real CPU device, no fake ones
    if args.worker:
        serve_framework(*args.worker)
        return
    from _common import print_table, write_results

    sizes = ["q"] if args.quick else args.sizes.split(",")
    rounds, steps = (3, 3) if args.quick else (5, 3)
    peak = matmul_peak_gflops()
    results, rows = {}, []
    for name in sizes:
        r = bench_size(name, rounds, steps, compile_torch=not args.no_compile)
        tps = r["tokens_per_s"]
        r["ratio_vs_eager"] = tps["jaxcore"] / tps["torch eager"]
        if "torch.compile" in tps:
            r["ratio_vs_compile"] = tps["jaxcore"] / tps["torch.compile"]
        r["mfu"] = {k: v * r["flops_per_token"] / (peak * 1e9) for k, v in tps.items()}
        results[name] = r
        for k, v in tps.items():
            rows.append(
                [
                    name,
                    f"{r['config']['params'] / 1e6:.1f}M",
                    k,
                    f"{v:,.0f}",
                    f"{v / tps['torch eager']:.2f}",
                    f"{r['mfu'][k]:.2f}",
                ]
            )
    print_table(
        f"training tokens/s, float32, AdamW (matmul peak {peak:.0f} GFLOP/s)",
        ["size", "params", "framework", "tokens/s", "vs eager", "MFU"],
        rows,
    )
    main_size = results[sizes[-1]]
    write_results(
        "vs_torch_cpu_quick" if args.quick else "vs_torch_cpu",
        {
            "ratio_vs_eager": main_size["ratio_vs_eager"],
            "ratio_vs_compile": main_size.get("ratio_vs_compile"),
            "target_ratio_vs_eager": 0.9,
            "ratio_vs_eager_by_size": {k: v["ratio_vs_eager"] for k, v in results.items()},
            "load_average": os.getloadavg(),
            "matmul_peak_gflops": peak,
            "sizes": results,
            "quick": args.quick,
            "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        },
    )


if __name__ == "__main__":
    main()

"""Where a CPU training step's time goes: jaxcore's step (jax.profiler) next to torch eager's
(torch.profiler), the same decoder and AdamW, grouped into matmul / attention softmax /
layout copies / optimizer / other. Writes ``benchmarks/results/profile_step_cpu.json``.

    python benchmarks/profile_step_cpu.py [--size b]
"""

from __future__ import annotations

import argparse

UNNAMED = "executor self time"
UNTRACED = "untraced CPU time (Eigen dot contractions, host)"
GROUPS = (  # first match wins; names are XLA HLO op names or torch aten op names
    ("untraced (Eigen dots, host)", ("untraced",)),
    ("optimizer", ("adamw", "optimizer", "_foreach", "lerp", "addcdiv", "addcmul")),
    ("layout copies / transposes", ("copy", "transpose", "contiguous", "clone", "permute")),
    # torch's fused attention kernels (their names hold "dot", so ahead of matmul).
    ("attention kernels", ("scaled_dot_product", "flash_attention")),
    # XLA CPU dots: YNNPACK calls (`ynn_fusion`) or Eigen contractions (executor self time).
    ("matmul", ("ynn", "dot", "gemm", "matmul", "aten::mm", "aten::bmm", "addmm")),
    ("softmax / reductions", ("softmax", "reduce", "logsumexp", "sum", "mean")),
    ("slices / scan traffic", ("dynamic", "slice", "gather", "scatter", "concatenate", "while")),
    ("elementwise fusions", ("fusion", "aten::mul", "aten::add", "silu", "aten::where")),
)


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def shares(durations: dict[str, float]) -> dict[str, float]:
    total = sum(durations.values()) or 1.0
    out: dict[str, float] = {}
    for name, d in durations.items():
        out[group_of(name)] = out.get(group_of(name), 0.0) + d / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def jax_profile(run, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    import glob
    import gzip
    import json
    import tempfile
    import time

    import jax

    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            cpu = time.process_time()
            for _ in range(steps):
                run()
            cpu = (time.process_time() - cpu) / steps
        (path,) = glob.glob(f"{d}/**/perfetto_trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            events = json.loads(f.read())
    events = events["traceEvents"] if isinstance(events, dict) else events
    per_op = self_times(events, steps)
    # Eigen runs a dot's contraction as thread-pool tasks that emit no trace events, so
    # the process CPU time the named ops do not cover is reported as its own line.
    per_op[UNTRACED] = max(cpu - sum(per_op.values()), 0.0)
    return per_op, shares(per_op)


def op_key(name: str) -> str | None:
    """The op an XLA trace span is counted under; None for Python and client wrappers."""
    if name.startswith(("$", "PjitFunction", "ThunkExecutor::Execute (wait")):
        return None
    if name == "ThunkExecutor::Execute":
        return UNNAMED
    return name.split(".")[0].split(":")[0]


def self_times(events: list[dict], steps: int) -> dict[str, float]:
    """Seconds per step of each XLA op's own time (its span less its nested spans).

    Summing raw spans double-counts: every op nests inside a ``ThunkExecutor::Execute``
    span on the same thread (whose own remainder is counted as ``UNNAMED``).
    """
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    per_op: dict[str, float] = {}

    def close(span: dict) -> None:
        key = op_key(span["name"])
        if key is not None:
            per_op[key] = per_op.get(key, 0.0) + (span["dur"] - span["child"]) / 1e6 / steps

    for evs in by_thread.values():
        open_spans: list[dict] = []  # the enclosing spans of the current one, innermost last
        for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
            while open_spans and open_spans[-1]["end"] <= e["ts"]:
                close(open_spans.pop())
            if open_spans:
                open_spans[-1]["child"] += e["dur"]
            span = {"name": e.get("name", ""), "dur": e["dur"], "end": e["ts"] + e["dur"]}
            open_spans.append({**span, "child": 0.0})
        for span in reversed(open_spans):
            close(span)
    return per_op


def torch_profile(run, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    # Self time: each op's own time, so nested ops are not counted twice.
    per_op = {
        e.key: e.self_cpu_time_total / 1e6 / steps
        for e in prof.key_averages()
        if e.self_cpu_time_total > 0
    }
    return per_op, shares(per_op)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="b", choices=("q", "a", "b"))
    p.add_argument("--steps", type=int, default=2)
    args = p.parse_args()
    from jaxcore.runtime import ensure_malloc_tuning

    ensure_malloc_tuning()
    import os
    import time

    os.environ.pop("XLA_FLAGS", None)
    import jax
    import numpy as np
    import optax
    import torch
    from _common import print_table, stdlib_batch, write_results
    from torch_llama import TorchLlama
    from torch_llama import lm_loss as torch_loss
    from vs_torch_cpu import SIZES, model_config

    import jaxcore as jc
    from jaxcore.models import Transformer, lm_loss

    torch.set_num_threads(os.cpu_count() or 1)
    *_, seq, batch = SIZES[args.size]
    cfg = model_config(args.size)
    data = stdlib_batch(batch, seq)
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    holder = {"state": engine.prepare(lambda r: Transformer(cfg, rngs=r), optax.adamw(1e-4))}
    step = engine.train_step(lm_loss)
    jbatch = engine.shard_batch(data)

    def run_jax():
        holder["state"], m = step(holder["state"], jbatch)
        m["loss"].block_until_ready()

    model = TorchLlama(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.from_numpy(np.asarray(data["tokens"], np.int64))

    def run_torch():
        opt.zero_grad(set_to_none=True)
        torch_loss(model, tokens).backward()
        opt.step()

    # The optimizer alone: one jitted optax AdamW update over the model's parameters.
    params = jax.tree.map(lambda x: x.copy(), holder["state"].params)  # the step donates its own
    tx = optax.adamw(1e-4)
    opt_state = tx.init(params)
    update = jax.jit(lambda g, s, p: optax.apply_updates(p, tx.update(g, s, p)[0]))
    for fn in (run_jax, run_jax, run_torch, run_torch):
        fn()
    jax.block_until_ready(update(params, opt_state, params))
    t = time.perf_counter()
    for _ in range(3):
        jax.block_until_ready(update(params, opt_state, params))
    adamw_s = (time.perf_counter() - t) / 3
    t = time.perf_counter()
    run_jax()
    jax_step_s = time.perf_counter() - t
    jax_ops, jax_shares = jax_profile(run_jax, args.steps)
    torch_ops, torch_shares = torch_profile(run_torch, args.steps)
    groups = sorted(set(jax_shares) | set(torch_shares))
    rows = [[g, f"{jax_shares.get(g, 0):.1%}", f"{torch_shares.get(g, 0):.1%}"] for g in groups]
    print_table(
        f"share of op time per step, size {args.size} ({jc.models.count_params(cfg) / 1e6:.1f}M)",
        ["group", "jaxcore (XLA ops)", "torch eager (aten self time)"],
        rows,
    )
    top = lambda ops: dict(sorted(ops.items(), key=lambda kv: -kv[1])[:25])
    print("jaxcore top ops (s/step):", {k: round(v, 4) for k, v in top(jax_ops).items()})
    print("torch top ops (s/step):", {k: round(v, 4) for k, v in top(torch_ops).items()})
    print(f"jaxcore step {jax_step_s:.2f} s; optax AdamW update alone {adamw_s * 1e3:.0f} ms")
    write_results(
        "profile_step_cpu",
        {
            "size": args.size,
            "jaxcore_shares": jax_shares,
            "torch_shares": torch_shares,
            "jaxcore_top_ops_s": top(jax_ops),
            "torch_top_ops_s": top(torch_ops),
            "jaxcore_step_s": jax_step_s,
            "adamw_update_alone_s": adamw_s,
            "load_average": os.getloadavg(),
        },
    )


if __name__ == "__main__":
    main()

"""Compression benchmark: perplexity and served tokens/s of compressed models.

A Llama-style base model (4 layers, d=128, 8 query / 4 kv heads, vocab 256) trained on
byte-level text of the stdlib demo corpus (files 0-199), then, each with the same
fine-tuning budget from the base (``--ft`` steps):

- ``base + ft (float)``: the base trained ``--ft`` more steps: what the budget alone buys;
- ``magnitude 50%``: gradual cubic schedule (Zhu & Gupta) to 50% zeros per layer of every
  block matmul, masks in the optimizer state;
- ``structured 50%``: half the query heads (one of two per kv group) and half the MLP
  neurons removed (first-order Taylor scores on 4 batches), then fine-tuned;
- ``distilled 1/2 depth``: a 2-layer student from every other teacher layer, trained on
  the base's logits (T=2, alpha=0.5);
- ``int8 PTQ``: the base in the inference int8 format; ``int8 QAT``: fine-tuned with
  fake-quant (straight-through) first, then the same int8 format.

Perplexity is per byte on held-out files (200-239), int8 rows through the inference
package's quantized weights and matmul. Tokens/s: ``inference.LLM(...).generate`` of 8
prompts x 64 new tokens, greedy, 8 slots, after a warm-up round, median of 3.

    python benchmarks/compression_quality.py [--steps 300 --ft 100]  # results/compression.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import optax

import inference
import jaxcore as jc
from benchmarks._common import write_results
from inference import quantize as iq
from jaxcore import compression as cz
from jaxcore.models import Transformer, TransformerConfig, lm_loss

SEQ, BATCH = 64, 16
CFG = TransformerConfig.tiny(
    d_model=128, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=384, max_seq_len=128
)
ServingConfig = getattr(inference, "ServingConfig", None) or inference.EngineConfig


def engine() -> jc.Engine:
    return jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), devices=jax.devices()[:1], zero=0)


def train(cfg, batches, *, params=None, loss=lm_loss, tx=None, seed=0, pair=None):
    """Train ``cfg`` (or a distillation ``pair``, teacher frozen) on ``batches``."""
    model = pair or (lambda r: Transformer(cfg, rngs=r))
    trainable = cz.student_only if pair else None
    plan = engine().plan(model, tx or optax.adamw(3e-3), trainable=trainable)
    state = plan.init(seed)
    if params is not None:
        state = state.replace(params=jax.device_put(params, plan.state_shardings.params))
    step = plan.train_step(loss)
    for b in batches:
        state, _ = step(state, {"tokens": b})
    return jax.device_get(state.params)


def served_tokens_per_s(cfg, params, *, quantize=None, prompts=8, new=64) -> float:
    llm = inference.LLM(params, config=cfg, engine=ServingConfig(slots=8, quantize=quantize))
    texts = [f"def function_{i}(x):\n    " for i in range(prompts)]
    llm.generate(texts, max_tokens=new, temperature=0.0)  # compile
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = llm.generate(texts, max_tokens=new, temperature=0.0)
        times.append(time.perf_counter() - start)
    llm.close()
    return sum(len(o.tokens) for o in out) / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300, help="base training steps")
    parser.add_argument("--ft", type=int, default=100, help="fine-tuning steps per method")
    args = parser.parse_args()
    load_start = os.getloadavg()
    source = jc.stdlib_source(max_files=240)
    train_docs, held_docs = range(200), range(200, 240)
    held = cz.text_batches(source, held_docs, batch=32, seq_len=SEQ, count=8, seed=99)

    def batches(count, seed):
        return cz.text_batches(source, train_docs, batch=BATCH, seq_len=SEQ, count=count, seed=seed)

    def ppl(cfg, params, int8=False):
        if int8:
            return cz.perplexity(
                cfg, params, held, transform=iq.quantize_weights, matmul=iq.quantized_matmul
            )
        return cz.perplexity(cfg, params, held)

    t0 = time.perf_counter()
    base = train(CFG, batches(args.steps, 0))
    base_ppl = ppl(CFG, base)
    ft = batches(args.ft, 1)
    rows = []

    def row(method, cfg, params, after, *, int8=False, before=base_ppl):
        tps = served_tokens_per_s(cfg, params, quantize="int8" if int8 else None)
        r = cz.method_report(
            method,
            cfg,
            params,
            seq_len=SEQ,
            ppl_before=before,
            ppl_after=after,
            int8=int8,
            tokens_per_s=tps,
        )
        rows.append(r)
        print(f"  {method}: ppl {after:.3f}, {tps:.1f} tok/s", flush=True)

    row("base", CFG, base, base_ppl)
    tuned = train(CFG, ft, params=base)
    row("base + ft (float)", CFG, tuned, ppl(CFG, tuned))

    schedule = cz.SparsitySchedule(
        final=0.5, initial=0.1, begin_step=0, num_updates=4, frequency=max(1, args.ft // 8)
    )
    sparse = train(CFG, ft, params=base, tx=cz.magnitude_pruning(optax.adamw(3e-3), schedule))
    sparsity = cz.sparsity_report(sparse)
    row("magnitude 50%", CFG, sparse, ppl(CFG, sparse))

    def loss_of(p, tokens):
        return lm_loss(lambda x: _forward(CFG, p, x), {"tokens": tokens}, None)[0]

    grads = [jax.grad(loss_of)(base, b) for b in batches(4, 2)]
    structure = cz.select(
        CFG, cz.unit_scores(base, method="taylor", grads=grads), heads=0.5, neurons=0.5
    )
    small_cfg, small = cz.shrink(base, CFG, structure)
    pruned_ppl = ppl(small_cfg, small)
    small = train(small_cfg, ft, params=small)
    row("structured 50%", small_cfg, small, ppl(small_cfg, small))

    student_cfg = dataclasses.replace(CFG, n_layers=CFG.n_layers // 2)
    pair = cz.distill_pair(
        lambda r: Transformer(student_cfg, rngs=r), lambda r: Transformer(CFG, rngs=r)
    )
    start = cz.student_from_teacher(base, layers=range(0, CFG.n_layers, 2))
    distilled = train(
        None,
        ft,
        pair=pair,
        params={"student": start, "teacher": base},
        loss=cz.distill_loss(temperature=2.0, alpha=0.5),
    )["student"]
    row("distilled 1/2 depth", student_cfg, distilled, ppl(student_cfg, distilled))

    row("int8 PTQ", CFG, base, ppl(CFG, base, int8=True), int8=True)
    qat = train(CFG, ft, params=base, loss=cz.qat_loss(lm_loss))
    row("int8 QAT", CFG, qat, ppl(CFG, qat, int8=True), int8=True)

    elapsed = time.perf_counter() - t0
    load_end = os.getloadavg()
    print()
    print(cz.format_table(rows))
    print(f"\nstructured 50% before fine-tuning: ppl {pruned_ppl:.3f}")
    print(
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end "
        f"(2 shared cores, other engineers' jobs running); {elapsed:.0f} s"
    )
    write_results(
        "compression",
        {
            "config": {
                "model": CFG.__dict__,
                "seq_len": SEQ,
                "batch": BATCH,
                "base_steps": args.steps,
                "ft_steps": args.ft,
            },
            "rows": [r.as_dict() for r in rows],
            "tokens_per_s_over_base": {
                r.method: r.tokens_per_s / rows[0].tokens_per_s for r in rows
            },
            "magnitude_sparsity_per_layer": sparsity,
            "structured_ppl_before_finetune": pruned_ppl,
            "load_average": {"start": load_start, "end": load_end},
            "note": "2 shared CPU cores loaded by other engineers' jobs; one device, float32.",
        },
    )


def _forward(cfg, params, tokens):
    from flax import nnx

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)(tokens)


if __name__ == "__main__":
    main()

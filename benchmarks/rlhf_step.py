"""One PPO iteration of a small model on CPU, and GRPO iterations side by side with TRL.

1. PPO (rollout + 4 epochs) through `rlhf.PPOTrainer`: rollout tokens/s through the
   continuous-batching engine (`rlhf.Sampler` over `inference`) against a naive
   per-sequence loop (one full forward per new token, no KV cache, one sequence at a
   time: how a hand-written sampler starts out), and the share of wall time generating.
2. GRPO, ours (`rlhf.GRPOTrainer`) against TRL's ``GRPOTrainer`` (``pip install -e
   .[bench]``: trl 1.16.0, which has no ``PPOTrainer`` any more, so GRPO is the RL
   trainer both sides have). Same shape (a random-init transformers ``LlamaConfig`` with
   our layers, width, heads, vocabulary), same prompts per step, generations per prompt,
   completion length (no early EOS on either side), one optimizer step per generation
   batch (TRL's defaults ``num_iterations=1``, ``beta=0``: no reference model, ``dapo``
   loss), Adam at the same learning rate, float32, the same programmatic reward function.
   The steps alternate (ours runs inside a TRL ``on_step_end`` callback) so the shared
   machine's load drifts over both alike; the median step time after one warm-up step.

Targets: ``rollout_speedup`` >= 4, ``ours_over_trl`` >= 1.

    python benchmarks/rlhf_step.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from typing import Any

PROMPT_LEN = 8
VOCAB = 64
GOOD = 3  # the token the reward counts


def model_config(max_seq_len: int) -> Any:
    from jaxcore.models import TransformerConfig

    return TransformerConfig(
        vocab_size=VOCAB,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        d_ff=128,
        max_seq_len=max_seq_len,
    )


def ppo_rollout(n: int, new: int) -> dict[str, float]:
    """Part 1: one timed PPO iteration and the naive per-sequence rollout baseline."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import jaxcore as jc
    from inference import ServingConfig
    from rlhf import PPOConfig, PPOTrainer, Sampler, lm_factory, scalar_head_factory

    cfg = model_config(PROMPT_LEN + new)
    one = dict(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
    actor, critic = jc.Engine(**one), jc.Engine(**one)
    state = actor.prepare(lm_factory(cfg), optax.adam(1e-3))
    values = critic.prepare(scalar_head_factory(cfg), optax.adam(1e-3), seed=1)
    sampler = Sampler(cfg, state.params, ServingConfig(slots=n, max_len=PROMPT_LEN + new))
    trainer = PPOTrainer(
        (actor, state),
        (critic, values),
        sampler,
        lambda prompt, completion: completion.count(GOOD) / new,
        PPOConfig(max_tokens=new, ppo_epochs=4),
    )
    prompts = np.random.default_rng(0).integers(4, VOCAB, size=(n, PROMPT_LEN)).tolist()
    trainer.step(prompts)  # compiles everything once
    start = time.perf_counter()
    metrics = trainer.step(prompts)
    iteration_s = time.perf_counter() - start

    # Naive baseline: per sequence, per token, one full forward of the padded sequence.
    model = actor.bind(trainer.actor)
    forward = jax.jit(lambda toks: model(toks))
    key = jax.random.key(0)
    toks = np.zeros((1, PROMPT_LEN + new), np.int32)
    forward(jnp.asarray(toks)).block_until_ready()
    start = time.perf_counter()
    for p in prompts:
        toks[0, :PROMPT_LEN] = p
        for t in range(PROMPT_LEN, PROMPT_LEN + new):
            logits = forward(jnp.asarray(toks))[0, t - 1]
            key, sub = jax.random.split(key)
            toks[0, t] = int(jax.random.categorical(sub, logits))
    naive_tps = n * new / (time.perf_counter() - start)
    return {
        "rollout_tokens_per_s": metrics["rollout_tokens_per_s"],
        "naive_tokens_per_s": naive_tps,
        "iteration_s": iteration_s,
        "generate_share": metrics["generate_s"] / iteration_s,
    }


class OursGRPO:
    """Our GRPO on one CPU device: ``step()`` is one iteration on fresh prompts."""

    def __init__(self, prompts: int, generations: int, new: int, lr: float):
        import jax
        import numpy as np
        import optax

        import jaxcore as jc
        from inference import ServingConfig
        from rlhf import GRPOConfig, GRPOTrainer, Sampler, lm_factory

        cfg = model_config(PROMPT_LEN + new)
        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=1), devices=jax.devices()[:1])
        state = engine.prepare(lm_factory(cfg), optax.adam(lr))
        serving = ServingConfig(slots=prompts * generations, max_len=PROMPT_LEN + new)
        self.trainer = GRPOTrainer(
            engine,
            state,
            Sampler(cfg, state.params, serving),
            lambda prompt, completion: completion.count(GOOD) / new,
            GRPOConfig(num_generations=generations, max_tokens=new),
        )
        self.rng = np.random.default_rng(1)
        self.prompts = prompts
        self.seconds: list[float] = []

    def step(self) -> None:
        batch = self.rng.integers(4, VOCAB, size=(self.prompts, PROMPT_LEN)).tolist()
        start = time.perf_counter()
        self.trainer.step(batch)
        self.seconds.append(time.perf_counter() - start)


def _tokenizer() -> Any:
    """A word-level tokenizer over ``t0 .. t63``: token ``ti`` is id ``i`` (as ours)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="t0", eos_token="t1", unk_token="t2"
    )


def grpo_side_by_side(prompts: int, generations: int, new: int, steps: int) -> dict[str, Any]:
    """Part 2: TRL's GRPOTrainer steps alternating with ours; median seconds per step."""
    import numpy as np
    import torch
    import trl
    from datasets import Dataset
    from transformers import LlamaForCausalLM, TrainerCallback

    from inference.hf import hf_llama_config

    lr = 1e-3
    ours = OursGRPO(prompts, generations, new, lr)
    cfg = model_config(PROMPT_LEN + new)
    torch.manual_seed(0)
    model = LlamaForCausalLM(hf_llama_config(cfg, pad_token_id=0, eos_token_id=1))
    rng = np.random.default_rng(2)
    ids = rng.integers(4, VOCAB, size=(prompts * (steps + 1), PROMPT_LEN))
    dataset = Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in ids]})

    def reward(completions: list[str], **_: Any) -> list[float]:
        return [c.split().count(f"t{GOOD}") / new for c in completions]

    args = trl.GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "rlhf_step_trl"),
        per_device_train_batch_size=prompts * generations,
        num_generations=generations,
        max_completion_length=new,
        # No early stop at EOS: every completion has ``new`` tokens, as ours (eos_id=None).
        generation_kwargs={"min_new_tokens": new},
        max_steps=steps + 1,
        learning_rate=lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        warmup_steps=0,
        max_grad_norm=1e9,  # ours clips nothing either
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        temperature=1.0,
        top_k=0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )

    class Alternate(TrainerCallback):
        """Times each TRL step, then runs one of ours outside TRL's timed window."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self._start)
            ours.step()

    timer = Alternate()
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=_tokenizer(),
        callbacks=[timer],
    )
    trainer.train()
    trl_s = statistics.median(timer.seconds[1:])  # the first step of each warms up
    ours_s = statistics.median(ours.seconds[1:])
    return {
        "grpo_prompts_per_step": prompts,
        "grpo_num_generations": generations,
        "grpo_completion_tokens": new,
        "grpo_timed_steps": steps,
        "ours_grpo_iterations_per_s": 1.0 / ours_s,
        "trl_grpo_iterations_per_s": 1.0 / trl_s,
        "ours_over_trl": trl_s / ours_s,
        "trl_version": trl.__version__,
        "torch_threads": torch.get_num_threads(),
        "trl_has_ppo_trainer": hasattr(trl, "PPOTrainer"),
    }


COMPARISON = {
    "ours": (
        "rlhf.GRPOTrainer on 1 CPU device: rollout through the continuous-batching engine "
        "(KV cache, per-token log-probs), a parity rescoring forward every iteration "
        "(parity_interval=1, work TRL skips), one Adam step; reward: a Python function"
    ),
    "trl": (
        "trl.GRPOTrainer (transformers generate with KV cache, do_sample, min_new_tokens=new; "
        "num_iterations=1 so no old-log-prob forward; beta=0 so no reference model; dapo "
        "loss; AdamW with weight_decay 0, constant lr; no grad clipping); reward: the same "
        "Python function on decoded text (no reward model)"
    ),
    "model": "random-init, 2 layers, d_model 64, 4 heads (2 kv), d_ff 128, vocab 64, float32",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, 3 timed GRPO steps (target < 2 min quiet; 12 min at load 20)",
    )
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads for TRL's side")
    args = p.parse_args()
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=1"
    )
    from _common import print_table, write_results

    n, new = (8, 16) if args.quick else (32, 32)
    g_prompts, g_gens, g_new, g_steps = (4, 4, 16, 3) if args.quick else (8, 4, 32, 6)
    load_start = os.getloadavg()[0]
    ppo = ppo_rollout(n, new)
    has_trl = importlib.util.find_spec("trl") is not None
    grpo = grpo_side_by_side(g_prompts, g_gens, g_new, g_steps) if has_trl else {}
    load = (load_start + os.getloadavg()[0]) / 2
    speedup = ppo["rollout_tokens_per_s"] / ppo["naive_tokens_per_s"]
    rows = [
        ["rollout tokens/s (continuous batching)", f"{ppo['rollout_tokens_per_s']:.0f}"],
        ["rollout tokens/s (naive per-sequence loop)", f"{ppo['naive_tokens_per_s']:.0f}"],
        ["rollout_speedup", f"{speedup:.2f}"],
        ["PPO iteration s (rollout + 4 epochs)", f"{ppo['iteration_s']:.2f}"],
        ["generation share of wall time", f"{ppo['generate_share']:.2f}"],
    ]
    if grpo:
        rows += [
            ["GRPO iterations/s, ours", f"{grpo['ours_grpo_iterations_per_s']:.2f}"],
            ["GRPO iterations/s, TRL GRPOTrainer", f"{grpo['trl_grpo_iterations_per_s']:.2f}"],
            ["ours_over_trl", f"{grpo['ours_over_trl']:.2f}"],
        ]
    else:
        rows.append(["TRL", "not installed (pip install -e .[bench])"])
    rows.append(["load average (1 min, mean of start and end)", f"{load:.1f}"])
    title = (
        f"PPO {n} prompts x {new} tokens; GRPO {g_prompts} prompts x {g_gens} generations x "
        f"{g_new} tokens; CPU"
    )
    print_table(title, ["", "value"], rows)
    write_results(
        "rlhf_step",
        {
            "quick": args.quick,
            "prompts": n,
            "new_tokens": new,
            **ppo,
            "rollout_speedup": speedup,
            **(grpo or {"ours_over_trl": None, "trl": "not installed"}),
            "comparison": COMPARISON,
            "load_average_1m": load,
            "note": "2-core machine shared with six other engineers: ratios only",
        },
    )


if __name__ == "__main__":
    main()

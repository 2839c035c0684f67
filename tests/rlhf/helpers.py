"""Tiny models and synthetic data shared by the RLHF tests (kept small: CPU is scarce)."""

import json
import pathlib

import numpy as np
import optax
import yaml

import jaxcore as jc
from jaxcore.models import TransformerConfig

VOCAB = 16
GOOD = 3  # the token preference data and programmatic rewards ask for
CFG = TransformerConfig(
    vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=32
)
FSDP8 = jc.ParallelConfig(fsdp=8)


def engine(parallel=FSDP8, **fields):
    return jc.Engine(parallel=parallel, **fields)


def adam(lr=3e-3):
    return optax.adam(lr)


def preference_pairs(n: int, length: int, seed: int) -> dict[str, np.ndarray]:
    """Pairs where the chosen sequence holds strictly more GOOD tokens than the rejected."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in ("chosen", "rejected", "chosen_len", "rejected_len")}
    while len(out["chosen"]) < n:
        lens = rng.integers(length // 2, length + 1, size=2)
        seqs = []
        for i, p in enumerate((0.45, 0.1)):
            s = np.zeros(length, np.int32)
            body = rng.integers(4, VOCAB, size=lens[i])
            body[rng.random(lens[i]) < p] = GOOD
            s[: lens[i]] = body
            seqs.append(s)
        if (seqs[0] == GOOD).sum() <= (seqs[1] == GOOD).sum():
            continue
        out["chosen"].append(seqs[0])
        out["rejected"].append(seqs[1])
        out["chosen_len"].append(lens[0])
        out["rejected_len"].append(lens[1])
    return {k: np.asarray(v, np.int32) for k, v in out.items()}


def dpo_pairs(n: int, seed: int, prompt_len: int = 4, comp_len: int = 8) -> dict:
    """Prompt + completion pairs: chosen completions are rich in GOOD, rejected hold none."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(4, VOCAB, size=(n, prompt_len))
    chosen = rng.integers(4, VOCAB, size=(n, comp_len))
    chosen[rng.random((n, comp_len)) < 0.5] = GOOD
    rejected = rng.integers(4, VOCAB, size=(n, comp_len))
    mask = np.concatenate([np.zeros((n, prompt_len)), np.ones((n, comp_len))], 1)
    return {
        "chosen": np.concatenate([prompts, chosen], 1).astype(np.int32),
        "rejected": np.concatenate([prompts, rejected], 1).astype(np.int32),
        "chosen_mask": mask.astype(np.float32),
        "rejected_mask": mask.astype(np.float32),
    }


def count_good(prompt, completion) -> float:
    """Programmatic reward: the share of GOOD tokens in the completion (length-limited)."""
    return sum(t == GOOD for t in completion) / 8.0


def prompts(iteration: int, n: int = 4) -> list[list[int]]:
    rng = np.random.default_rng(1000 + iteration)
    return rng.integers(4, VOCAB, size=(n, 3)).tolist()


def write_config(folder: pathlib.Path, name: str, raw: dict) -> pathlib.Path:
    """A CLI config file (``train.out`` is a placeholder: the tests pass ``--out``)."""
    path = folder / name
    path.write_text(yaml.safe_dump({**raw, "train": {**raw["train"], "out": "unused"}}))
    return path


def read_metrics(out: pathlib.Path) -> list[dict]:
    """``<out>/metrics.jsonl``, one dict per line."""
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]

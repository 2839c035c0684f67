"""Small built-in tasks for the CLI's example configs: a programmatic reward, prompts and
synthetic records, so a recipe runs end to end without any downloaded data."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable

import numpy as np

from jaxcore import ConfigError


def token_share(token: int = 3, length: int = 8) -> Callable[[list[int], list[int]], float]:
    """Reward factory: the share of ``token`` in a completion of at most ``length`` tokens."""

    def reward(prompt: list[int], completion: list[int]) -> float:
        return sum(t == token for t in completion) / float(length)

    return reward


def random_prompts(iteration: int, count: int, length: int, low: int, vocab: int, seed: int):
    """``count`` prompts of ``length`` ids in ``[low, vocab)``, fixed by ``seed + iteration``."""
    rng = np.random.default_rng(seed + iteration)
    return rng.integers(low, vocab, size=(count, length)).tolist()


def synthetic_records(
    n: int, *, seed: int, prompt_len: int, completion_len: int, token: int, low: int, vocab: int
) -> list[dict[str, list[int]]]:
    """Records ``{"prompt", "completion", "chosen", "rejected"}``: chosen (= completion)
    holds ``token`` about half the time, rejected never does."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(low, vocab, size=prompt_len)
        chosen = rng.integers(low, vocab, size=completion_len)
        chosen[rng.random(completion_len) < 0.5] = token
        rejected = rng.integers(low, vocab, size=completion_len)
        rejected[rejected == token] = low if token != low else low + 1
        out.append(
            {
                "prompt": prompt.tolist(),
                "completion": chosen.tolist(),
                "chosen": chosen.tolist(),
                "rejected": rejected.tolist(),
            }
        )
    return out


def read_jsonl(
    path: str | pathlib.Path, keys: tuple[str, ...], *, where: str = "data.path"
) -> list[dict[str, list[int]]]:
    """Records from a JSONL file; each line must hold ``keys`` as lists of token ids
    (other keys are ignored). ``where`` names the config field in errors."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{where} {path}: no such file.")
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{path}:{i}: not valid JSON ({e}); write one object a line."
            ) from None
        if not isinstance(rec, dict):
            raise ConfigError(f"{path}:{i}: expected a JSON object with {keys}, got {rec!r}.")
        missing = [k for k in keys if k not in rec]
        if missing:
            raise ConfigError(f"{path}:{i}: record lacks {missing}; each line needs {keys}.")
        for k in keys:
            ids = rec[k]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in ids
            ):
                got = type(ids).__name__ if not isinstance(ids, list) else repr(ids)
                raise ConfigError(
                    f"{path}:{i}: {k} must be a list of token ids, got {got}; tokenize text "
                    "first and write the integer ids."
                )
        out.append({k: list(rec[k]) for k in keys})
    return out

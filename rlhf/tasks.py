"""Small built-in tasks for the CLI's example configs: a programmatic reward, prompts and
synthetic records, so a recipe runs end to end without any downloaded data."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

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


def prompt_batch(prompts: list[list[int]], iteration: int, count: int) -> list[list[int]]:
    """Iteration ``iteration``'s prompts from a file's: the next ``count`` of them in
    order, wrapping to the start (all of them when the file holds ``count`` or fewer).

    A function of the iteration alone, so a resumed run sees the prompts the
    uninterrupted one would have."""
    k = min(count, len(prompts))
    start = iteration * k
    return [prompts[(start + j) % len(prompts)] for j in range(k)]


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
    path: str | pathlib.Path,
    keys: tuple[str, ...],
    *,
    where: str = "data.path",
    tokenizer: str | None = None,
) -> list[dict[str, list[int]]]:
    """Records from a JSONL file; each line must hold ``keys`` as lists of token ids
    (other keys are ignored). ``where`` names the config field in errors.

    With ``tokenizer`` (``data.tokenizer``: a ``tokenizer.json`` file or its folder) a
    field may also be text, and TRL's conversational records are read: an SFT line
    ``{"messages": [...]}`` (`rlhf.sft.chat_example`), a prompt given as messages
    (rendered by the chat template with the generation prompt) and an answer as
    assistant messages (their content)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{where} {path}: no such file.")
    encode = _Encoder(tokenizer, where)
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
        if keys == ("prompt", "completion") and "messages" in rec and "prompt" not in rec:
            rec = encode.chat(rec["messages"], f"{path}:{i}")
        missing = [k for k in keys if k not in rec]
        if missing:
            raise ConfigError(f"{path}:{i}: record lacks {missing}; each line needs {keys}.")
        out.append({k: encode(rec[k], prompt=k == keys[0], at=f"{path}:{i}: {k}") for k in keys})
    return out


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


class _Encoder:
    """A record field as token ids: ids as they are; text and chat messages through the
    tokenizer, loaded on first use (a file of ids never needs one)."""

    def __init__(self, spec: str | None, where: str):
        self._spec, self._tokenizer = spec, None
        # data.path and prompts.path each have a tokenizer setting to point to.
        setting = {"data.path": "data.tokenizer", "prompts.path": "prompts.tokenizer"}
        self._hint = (
            f", or set {setting[where]} to a tokenizer.json file or its folder (with the "
            "chat template in tokenizer_config.json) to read text and chat messages"
            if where in setting and spec is None
            else ""
        )

    def _load(self) -> Any:
        if self._tokenizer is None:
            from jaxcore import load_tokenizer

            self._tokenizer = load_tokenizer(self._spec)
        return self._tokenizer

    def chat(self, messages: Any, at: str) -> dict[str, list[int]]:
        """``{"prompt", "completion"}`` from an SFT line's chat ``messages``."""
        from rlhf.sft import chat_example

        if self._spec is None:
            raise ConfigError(
                f"{at}: the record holds chat 'messages'; write prompt and completion token "
                f"ids{self._hint}."
            )
        if not _messages(messages):
            raise ConfigError(f"{at}: messages must be a list of {{role, content}} objects.")
        prompt, completion = chat_example(self._load(), messages)
        return {"prompt": prompt, "completion": completion}

    def __call__(self, value: Any, *, prompt: bool, at: str) -> list[int]:
        if _token_ids(value):
            return list(value)
        if self._spec is not None and isinstance(value, str):
            return self._load().encode(value)
        if self._spec is not None and _messages(value):
            return self._conversation(value, prompt, at)
        got = type(value).__name__ if not isinstance(value, list) else repr(value)[:80]
        kinds = "token ids, text or chat messages" if self._spec else "token ids"
        raise ConfigError(
            f"{at} must be a list of {kinds}, got {got}; tokenize text first and write the "
            f"integer ids{self._hint}."
        )

    def _conversation(self, messages: list[dict], prompt: bool, at: str) -> list[int]:
        """A prompt's messages rendered by the chat template (with the generation prompt);
        an answer's assistant messages as their content."""
        tokenizer = self._load()
        if prompt:
            return tokenizer.encode(tokenizer.apply_chat_template(messages))
        roles = [m.get("role") for m in messages]
        if any(r != "assistant" for r in roles):
            raise ConfigError(
                f"{at}: an answer's messages must all be the assistant's (got roles "
                f"{roles}); the conversation before it belongs in the prompt."
            )
        return tokenizer.encode("".join(str(m.get("content", "")) for m in messages))

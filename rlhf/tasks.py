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
    """Records from a JSONL file (or a Parquet file, ``*.parquet``, as ``datasets``'
    ``to_parquet`` writes); each record must hold ``keys`` as lists of token ids (other
    keys are ignored). ``where`` names the config field in errors; an answer (every key
    after the first) must hold at least one token.

    With ``tokenizer`` (``data.tokenizer``: a ``tokenizer.json`` file or its folder) a
    field may also be text, and TRL's conversational records are read: an SFT line
    ``{"messages": [...]}`` (`rlhf.sft.chat_example`), a prompt given as messages
    (rendered by the chat template with the generation prompt) and an answer as
    assistant messages: what the template renders after the prompt (so the template's
    end-of-turn tokens are trained, as TRL does). Preference records may leave the prompt
    implicit: ``chosen`` and ``rejected`` as whole conversations, the messages they share
    being the prompt (TRL's ``maybe_extract_prompt``)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"{where} {path}: no such file.")
    encode = _Encoder(tokenizer, where)
    out = []
    for at, rec in _raw_records(path):
        if not isinstance(rec, dict):
            raise ConfigError(f"{at}: expected a JSON object with {keys}, got {rec!r}.")
        if keys == ("prompt", "completion") and "messages" in rec and "prompt" not in rec:
            rec = encode.chat(rec["messages"], at)
        elif len(keys) == 3 and keys[0] not in rec:
            rec = _implicit_prompt(rec, keys)
        missing = [k for k in keys if k not in rec]
        if missing:
            raise ConfigError(f"{at}: record lacks {missing}; each line needs {keys}.")
        _check_one_format(rec, keys, at)
        prompt = rec[keys[0]]
        row = {keys[0]: encode(prompt, prompt=True, at=f"{at}: {keys[0]}")}
        for k in keys[1:]:
            ids = encode(rec[k], prompt=False, at=f"{at}: {k}", after=prompt)
            if not ids:
                raise ConfigError(
                    f"{at}: {k} is empty; an answer needs at least one token to train on. "
                    "Drop the record or write its answer."
                )
            row[k] = ids
        out.append(row)
    return out


def _raw_records(path: pathlib.Path) -> Any:
    """``(where, record)`` for each record of a JSONL or Parquet file; ``where`` is
    ``file:line`` (JSONL, blank lines skipped) or ``file: row N`` (Parquet)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # ArrowInvalid and friends: a torn or foreign file
            raise ConfigError(
                f"{path}: not a readable Parquet file ({type(e).__name__}: {e}); write it "
                "with datasets' to_parquet or pyarrow, or use JSONL (one object a line)."
            ) from None
        for i, rec in enumerate(rows, 1):
            yield f"{path}: row {i}", rec
        return
    with path.open("rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"{path}:{i}: not UTF-8 text ({e.reason} at byte {e.start}); a JSONL "
                    "file holds one JSON object a line (Parquet files end in .parquet)."
                ) from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(
                    f"{path}:{i}: not valid JSON ({e}); write one object a line."
                ) from None
            yield f"{path}:{i}", rec


def _check_one_format(rec: dict, keys: tuple[str, ...], at: str) -> None:
    """A record's fields are all chat messages or all text (token ids go with either):
    TRL reads a record as conversational or not, and a text answer to a chat prompt
    would lose the template's end-of-turn tokens."""
    kinds = {k: "chat messages" if _messages(rec[k]) else "text" for k in keys if _kind(rec[k])}
    if len(set(kinds.values())) > 1:
        a = next(iter(kinds))
        b = next(k for k in kinds if kinds[k] != kinds[a])
        ka, kb = kinds[a], kinds[b]
        raise ConfigError(
            f"{at}: {a} is {ka} but {b} is {kb}; write every field of a record as chat "
            "messages (answers as assistant messages) or every one as text, as TRL reads them."
        )


def _kind(value: Any) -> bool:
    return isinstance(value, str) or _messages(value)


def _implicit_prompt(rec: dict, keys: tuple[str, ...]) -> dict:
    """TRL's implicit-prompt preference record: ``chosen`` and ``rejected`` whole
    conversations whose shared leading messages are the prompt (as TRL's
    ``maybe_extract_prompt``). Anything else is returned as it is, to be refused."""
    _, a, b = keys
    chosen, rejected = rec.get(a), rec.get(b)
    if not (_messages(chosen) and _messages(rejected)):
        return rec
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        return rec
    return {**rec, keys[0]: chosen[:n], a: chosen[n:], b: rejected[n:]}


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
        from rlhf.sft import split_chat

        if self._spec is None:
            raise ConfigError(
                f"{at}: the record holds chat 'messages'; write prompt and completion token "
                f"ids{self._hint}."
            )
        if not _messages(messages):
            raise ConfigError(f"{at}: messages must be a list of {{role, content}} objects.")
        prompt, completion = split_chat(self._load(), messages, at)
        return {"prompt": prompt, "completion": completion}

    def __call__(self, value: Any, *, prompt: bool, at: str, after: Any = None) -> list[int]:
        if _token_ids(value):
            return list(value)
        if self._spec is not None and isinstance(value, str):
            return self._load().encode(value)
        if self._spec is not None and _messages(value):
            return self._conversation(value, prompt, at, after)
        got = type(value).__name__ if not isinstance(value, list) else repr(value)[:80]
        kinds = "token ids, text or chat messages" if self._spec else "token ids"
        raise ConfigError(
            f"{at} must be a list of {kinds}, got {got}; tokenize text first and write the "
            f"integer ids{self._hint}."
        )

    def _conversation(self, messages: list[dict], prompt: bool, at: str, after: Any) -> list[int]:
        """A prompt's messages rendered by the chat template (with the generation prompt);
        an answer's assistant messages as the template renders them after the prompt
        (``after``, when that is messages too), else as their content."""
        from rlhf.sft import answer_ids, check_messages

        check_messages(messages, at)
        tokenizer = self._load()
        if prompt:
            return tokenizer.encode(tokenizer.apply_chat_template(messages))
        roles = [m.get("role") for m in messages]
        if any(r != "assistant" for r in roles):
            raise ConfigError(
                f"{at}: an answer's messages must all be the assistant's (got roles "
                f"{roles}); the conversation before it belongs in the prompt."
            )
        return answer_ids(tokenizer, after if _messages(after) else [], messages)

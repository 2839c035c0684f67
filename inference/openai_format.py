"""OpenAI / vLLM response pieces built from finished or running `Request`s: completion and
chat log-probs, vLLM's ``prompt_logprobs``, usage, finish reasons.

Log-prob entries are built over a token range, so a stream sends exactly the slices of
what the non-streamed response holds (joined chunks == the whole). Offsets and bytes
come from the tokenizer's exact token bytes: ``text_offset`` counts characters (not
bytes) of the choice text before each token, and chat ``bytes`` are the token's own
bytes, not the UTF-8 of a replacement character.
"""

from __future__ import annotations

import codecs
import dataclasses
from collections.abc import Sequence
from typing import Any

from inference.request import Request
from inference.tokenizer import Tokenizer, piece


@dataclasses.dataclass(frozen=True)
class Entry:
    """One token of a choice: its id, log-prob (``None`` for the first prompt token) and
    the top alternatives (``None`` when there are none to report)."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] | None


def entries(r: Request, *, echo: bool) -> list[Entry]:
    """The choice's tokens in order: the prompt (when echoed), then the output."""
    out: list[Entry] = []
    if echo:
        for j, t in enumerate(r.prompt):
            if j == 0 or not r.prompt_logprobs:
                out.append(Entry(t, None, None))
            else:
                top = r.prompt_top_logprobs[j - 1] if r.prompt_top_logprobs else []
                out.append(Entry(t, r.prompt_logprobs[j - 1], top))
    for j, t in enumerate(r.output):
        top = r.top_logprobs[j] if j < len(r.top_logprobs) else []
        out.append(Entry(t, r.logprobs[j], top))
    return out


def char_offsets(tok: Tokenizer, ids: Sequence[int]) -> list[int]:
    """Characters of the decoded text before each token (a token that starts inside a
    multi-byte character gets the offset of that character)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, chars = [], 0
    for t in ids:
        offsets.append(chars)
        chars += len(decoder.decode(tok.token_bytes(t)))
    return offsets


def completion_logprobs(
    tok: Tokenizer, all_entries: list[Entry], start: int, stop: int
) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/completions`` for ``all_entries[start:stop]``."""
    offsets = char_offsets(tok, [e.token for e in all_entries[:stop]])
    part = all_entries[start:stop]
    return {
        "tokens": [piece(tok.token_bytes(e.token)) for e in part],
        "token_logprobs": [e.logprob for e in part],
        "top_logprobs": [_top_with_chosen(tok, e) for e in part],
        "text_offset": offsets[start:stop],
    }


def _top_with_chosen(tok: Tokenizer, e: Entry) -> dict[str, float] | None:
    """One position's ``top_logprobs``: the chosen token, then the top alternatives. OpenAI's
    legacy API "always returns the logprob of the sampled token, so there may be up to
    logprobs+1 elements", as vLLM does: ``logprobs=0`` gave ``{}`` and a sampled token
    outside the top ``logprobs`` was missing from its own position."""
    if e.top is None:
        return None
    top = {piece(tok.token_bytes(e.token)): e.logprob}
    for i, lp in e.top:
        top.setdefault(piece(tok.token_bytes(i)), lp)
    return top


def _chat_token(tok: Tokenizer, t: int, lp: float) -> dict[str, Any]:
    raw = tok.token_bytes(t)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw)}


def chat_logprobs(tok: Tokenizer, r: Request, start: int, stop: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/chat/completions`` for output tokens start:stop."""
    content = []
    for j in range(start, stop):
        alts = r.top_logprobs[j] if j < len(r.top_logprobs) else []
        entry = _chat_token(tok, r.output[j], r.logprobs[j])
        content.append({**entry, "top_logprobs": [_chat_token(tok, a, b) for a, b in alts]})
    return {"content": content}


def prompt_logprobs(tok: Tokenizer, r: Request) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs``: ``None`` for the first token, then per position the
    prompt token and the top alternatives as ``{id: {logprob, rank, decoded_token}}``."""
    out: list[dict[str, Any] | None] = [None]
    for j, t in enumerate(r.prompt[1:]):
        entry: dict[str, Any] = {}
        for rank, (i, lp) in enumerate(r.prompt_top_logprobs[j], start=1):
            entry[str(i)] = {"logprob": lp, "rank": rank, "decoded_token": tok.decode([i])}
        entry[str(t)] = {
            "logprob": r.prompt_logprobs[j],
            "rank": r.prompt_ranks[j],
            "decoded_token": tok.decode([t]),
        }
        out.append(entry)
    return out


def stable_tokens(tok: Tokenizer, r: Request) -> int:
    """Output tokens whose bytes lie wholly inside the text that can no longer change
    (all of them once the request is done)."""
    if r.done:
        return len(r.output)
    stable = len(r.text[: r.stable_len].encode("utf-8"))
    count, end = 0, 0
    for t in r.output:
        end += len(tok.token_bytes(t))
        if end > stable:
            break
        count += 1
    return count


def finish_reason(r: Request) -> str:
    return "length" if r.finish_reason == "length" else "stop"


def usage(prompts: Sequence[Sequence[int]], requests: Sequence[Request]) -> dict[str, int]:
    """Prompt tokens once per prompt (not per sample of ``n``), completion tokens over
    every sample (``best_of`` ones included, as OpenAI bills them)."""
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(r.output) for r in requests)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }

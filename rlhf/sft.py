"""Supervised fine-tuning on prompt/completion pairs: completion-only loss and packing.

`pack` lays examples end to end in rows of ``length + 1`` tokens with ``loss_mask`` = 1
only on completion tokens (prompt tokens carry zero weight, TRL's
``completion_only_loss``) and ``positions`` restarting at each example, so rotary
positions are those of an unpacked example. The decoder has no segment mask, so a packed
example still attends to the ones before it in its row (TRL's original "wrapped"
packing); pack with ``pack=False`` to keep one example per row.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from jaxcore import BatchError, ConfigError, load_tokenizer

SFT_KEYS = ("tokens", "loss_mask", "positions")


def chat_example(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]]
) -> tuple[list[int], list[int]]:
    """``(prompt_ids, completion_ids)`` from chat messages: every message but the last,
    rendered by the tokenizer's chat template with the generation prompt, and the last
    (assistant) message as the template renders it after them (`answer_ids`: its content
    and the template's end-of-turn tokens, as TRL trains them).

    ``tokenizer``: an object with ``apply_chat_template`` (returning text) and ``encode``,
    or anything `jaxcore.load_tokenizer` takes (a ``tokenizer.json`` path or its folder, a
    ``tokenizers`` or ``transformers`` fast tokenizer): those are loaded with it, so the
    template renders to text and no special token is added to the completion.
    """
    if (
        isinstance(tokenizer, str | os.PathLike)
        or not hasattr(tokenizer, "apply_chat_template")
        or hasattr(tokenizer, "backend_tokenizer")
    ):
        tokenizer = load_tokenizer(tokenizer)
    if not messages or messages[-1].get("role") != "assistant":
        raise ConfigError(
            "chat_example: the last message must be the assistant's answer to train on "
            f"(got roles {[m.get('role') for m in messages]})."
        )
    prompt = tokenizer.apply_chat_template(list(messages[:-1]), add_generation_prompt=True)
    return tokenizer.encode(prompt), answer_ids(tokenizer, messages[:-1], messages[-1:])


def answer_ids(
    tokenizer: Any, prompt: Sequence[Mapping[str, Any]], answer: Sequence[Mapping[str, Any]]
) -> list[int]:
    """The ids of ``answer`` (assistant messages) as the chat template renders them after
    ``prompt``: the text of ``prompt + answer`` past ``prompt`` rendered with the
    generation prompt, so the template's end-of-turn tokens (ChatML's ``<|im_end|>``) are
    part of the answer, as TRL's prompt-completion tokenization makes them. Where the
    template does not render the prompt as a prefix (one that rewrites earlier turns), or
    there is no prompt, the answer is its content. An answer with no content is ``[]``."""
    content = "".join(str(m.get("content") or "") for m in answer)
    if not content:
        return []
    if prompt:
        head = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True)
        full = tokenizer.apply_chat_template([*prompt, *answer], add_generation_prompt=False)
        if full.startswith(head) and len(full) > len(head):
            return tokenizer.encode(full[len(head) :])
    return tokenizer.encode(content)


def pack(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    length: int,
    *,
    pad_id: int = 0,
    eos_id: int | None = None,
    packing: bool = True,
) -> dict[str, np.ndarray]:
    """Rows of ``length + 1`` tokens holding ``(prompt, completion)`` examples.

    Greedy first-fit in the given order; ``eos_id`` (if any) ends each completion and is
    trained on. An example longer than a row raises `ConfigError` (truncating it would
    silently train on a cut answer). Positions restart per example but the model's
    attention is causal over the whole row, so a packed example also attends to the
    examples before it (TRL's ``packing_strategy="wrapped"``); ``packing=False`` puts one
    example in each row.
    """
    rows: list[tuple[list[int], list[float], list[int]]] = []
    for prompt, completion in examples:
        comp = list(completion) + ([eos_id] if eos_id is not None else [])
        toks = list(prompt) + comp
        if len(toks) > length + 1:
            raise ConfigError(
                f"pack: an example has {len(toks)} tokens but rows hold {length + 1}; raise "
                "length or filter long examples first."
            )
        weights = [0.0] * len(prompt) + [1.0] * len(comp)
        pos = list(range(len(toks)))
        if packing and rows and len(rows[-1][0]) + len(toks) <= length + 1:
            row = rows[-1]
            row[0].extend(toks), row[1].extend(weights), row[2].extend(pos)
        else:
            rows.append((toks, weights, pos))
    out = {k: np.zeros((len(rows), length + 1), np.int32) for k in ("tokens", "positions")}
    out["tokens"][:] = pad_id
    out["loss_mask"] = np.zeros((len(rows), length + 1), np.float32)
    for i, (toks, weights, pos) in enumerate(rows):
        out["tokens"][i, : len(toks)] = toks
        out["loss_mask"][i, : len(toks)] = weights
        out["positions"][i, : len(toks)] = pos
    return out


def sft_loss() -> Callable:
    """A jaxcore ``loss_fn``: cross-entropy on completion tokens only (``loss_mask``), the
    exact mean over them (``weight`` = their count, so accumulation stays exact)."""

    def loss_fn(model, batch, rng):
        del rng
        missing = [k for k in SFT_KEYS if k not in batch]
        if missing:
            raise BatchError(f"SFT batch lacks {missing}: build batches with rlhf.sft.pack.")
        tokens, mask = batch["tokens"], batch["loss_mask"][:, 1:].astype(jnp.float32)
        logits = model(tokens[:, :-1], batch["positions"][:, :-1]).astype(jnp.float32)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        weight = jnp.sum(mask)
        return jnp.sum(losses * mask) / jnp.maximum(weight, 1.0), {"weight": weight}

    return loss_fn

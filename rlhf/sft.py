"""Supervised fine-tuning on prompt/completion pairs: completion-only loss and packing.

`pack` lays examples end to end in rows of ``length + 1`` tokens with ``loss_mask`` = 1
only on completion tokens (prompt tokens carry zero weight, TRL's
``completion_only_loss``), ``positions`` restarting at each example and ``segments``, an
id per example (1, 2, ... in each row; 0 for padding). `sft_loss` hands both to the
model, which then attends within each example only, and scores no target across an
example boundary: a packed row trains exactly as its examples would one per row (TRL's
``padding_free`` packing, where per-example ``position_ids`` tell the flash-attention
kernel where each sequence starts, here a segment mask). ``packing=False`` keeps one
example per row.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from jaxcore import BatchError, ConfigError, load_tokenizer

SFT_KEYS = ("tokens", "loss_mask", "positions")  # and "segments", from `pack`


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
    prompt, completion = split_chat(tokenizer, messages, "chat_example")
    if not completion:  # as `jaxcore rlhf sft` refuses the record: it would train nothing
        raise ConfigError(
            "chat_example: the assistant's answer (the last message) has no content; an "
            "answer needs at least one token to train on."
        )
    return prompt, completion


def check_messages(messages: Sequence[Any], where: str) -> None:
    """Every message a ``{role, content}`` mapping with a role: a chat template renders
    a missing role as an empty one (ChatML's ``<|im_start|>`` then the content at once),
    a conversation no model was tuned on, so it is refused naming the message rather
    than trained on (transformers' templates do not check roles)."""
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ConfigError(
                f"{where}: message {i} is a {type(m).__name__}, not a {{role, content}} object."
            )
        if not isinstance(m.get("role"), str) or not m["role"]:
            raise ConfigError(
                f"{where}: message {i} has no role ({str(dict(m))[:80]}); give each message "
                "a role (system, user, assistant, ...) and its content."
            )


def split_chat(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], where: str
) -> tuple[list[int], list[int]]:
    """`chat_example` with errors that start with ``where`` (a record's file:line)."""
    if (
        isinstance(tokenizer, str | os.PathLike)
        or not hasattr(tokenizer, "apply_chat_template")
        or hasattr(tokenizer, "backend_tokenizer")
    ):
        tokenizer = load_tokenizer(tokenizer)
    check_messages(messages, where)
    if not messages or messages[-1].get("role") != "assistant":
        raise ConfigError(
            f"{where}: the last message must be the assistant's answer to train on "
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
    silently train on a cut answer). Returns ``tokens``, ``loss_mask``, ``positions``
    (each example's own, from 0) and ``segments`` (``k`` for the row's ``k``-th example,
    0 for padding), all ``(rows, length + 1)``: with them `sft_loss` keeps each example's
    attention and targets to itself, as TRL's ``padding_free=True`` does with
    ``position_ids``. An example's first token has zero weight even when it is a
    completion token (no prompt): alone it is never a target. ``packing=False`` puts one
    example in each row.
    """
    rows: list[tuple[list[int], list[float], list[int], list[int]]] = []
    for prompt, completion in examples:
        comp = list(completion) + ([eos_id] if eos_id is not None else [])
        toks = list(prompt) + comp
        if len(toks) > length + 1:
            raise ConfigError(
                f"pack: an example has {len(toks)} tokens but rows hold {length + 1}; raise "
                "length or filter long examples first."
            )
        weights = [0.0] * len(prompt) + [1.0] * len(comp)
        if weights:
            weights[0] = 0.0  # nothing in its example predicts its first token
        pos = list(range(len(toks)))
        if packing and rows and len(rows[-1][0]) + len(toks) <= length + 1:
            row = rows[-1]
            seg = [row[3][-1] + 1] * len(toks)
            row[0].extend(toks), row[1].extend(weights), row[2].extend(pos), row[3].extend(seg)
        else:
            rows.append((toks, weights, pos, [1] * len(toks)))
    keys = ("tokens", "positions", "segments")
    out = {k: np.zeros((len(rows), length + 1), np.int32) for k in keys}
    out["tokens"][:] = pad_id
    out["loss_mask"] = np.zeros((len(rows), length + 1), np.float32)
    for i, (toks, weights, pos, seg) in enumerate(rows):
        out["tokens"][i, : len(toks)] = toks
        out["loss_mask"][i, : len(toks)] = weights
        out["positions"][i, : len(toks)] = pos
        out["segments"][i, : len(toks)] = seg
    return out


def sft_loss() -> Callable:
    """A jaxcore ``loss_fn``: cross-entropy on completion tokens only (``loss_mask``), the
    exact mean over them (``weight`` = their count, so accumulation stays exact).

    With ``segments`` in the batch (`pack` adds them) the model is called as
    ``model(tokens, positions, segments)`` and a target counts only when it is in the same
    (non-padding) segment as its input, as `jaxcore.models.lm_loss` does; a batch without
    them calls ``model(tokens, positions)`` as before (attention then spans the row)."""

    def loss_fn(model, batch, rng):
        del rng
        missing = [k for k in SFT_KEYS if k not in batch]
        if missing:
            raise BatchError(f"SFT batch lacks {missing}: build batches with rlhf.sft.pack.")
        tokens, mask = batch["tokens"], batch["loss_mask"][:, 1:].astype(jnp.float32)
        positions, segments = batch["positions"], batch.get("segments")
        if segments is None:
            logits = model(tokens[:, :-1], positions[:, :-1])
        else:
            _check_takes_segments(model)
            same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
            mask = mask * same.astype(jnp.float32)
            logits = model(tokens[:, :-1], positions[:, :-1], segments[:, :-1])
        logits = logits.astype(jnp.float32)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:])
        weight = jnp.sum(mask)
        return jnp.sum(losses * mask) / jnp.maximum(weight, 1.0), {"weight": weight}

    return loss_fn


def _check_takes_segments(model: Any) -> None:
    """`BatchError` when ``model`` cannot be called as ``model(tokens, positions,
    segments)`` (a custom model written for batches without segment ids)."""
    try:
        inspect.signature(model).bind(None, None, None)
    except TypeError:
        raise BatchError(
            "sft_loss: the batch has 'segments' (rlhf.sft.pack's packed-example ids) but the "
            "model takes no third argument; give its __call__ a `segments=None` argument as "
            "jaxcore.models.Transformer's, or delete batch['segments'] (packing=False rows "
            "lose nothing; packed examples then attend to the ones before them)."
        ) from None
    except ValueError:  # no signature to read: the call itself decides
        pass

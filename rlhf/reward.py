"""Reward-model training: Bradley-Terry on preference pairs through the jaxcore engine.

A batch is ``{"chosen", "rejected": int (batch, length), "chosen_len", "rejected_len":
int (batch,)}`` and optionally ``{"margin": float (batch,)}`` (Llama 2's graded margin).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxcore import BatchError
from rlhf.losses import bradley_terry_loss

PAIR_KEYS = ("chosen", "rejected", "chosen_len", "rejected_len")


def pair_scores(model: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """Scores of the chosen and rejected sequences, in one forward pass over both."""
    missing = [k for k in PAIR_KEYS if k not in batch]
    if missing:
        raise BatchError(
            f"reward batch lacks {missing}: it needs int arrays 'chosen', 'rejected' "
            "(batch, length) and their lengths 'chosen_len', 'rejected_len' (batch,)."
        )
    tokens = jnp.concatenate([batch["chosen"], batch["rejected"]], axis=0)
    lengths = jnp.concatenate([batch["chosen_len"], batch["rejected_len"]], axis=0)
    scores = model.score(tokens, lengths)
    n = batch["chosen"].shape[0]
    return scores[:n], scores[n:]


def reward_loss(*, center_coef: float | None = None) -> Callable:
    """A jaxcore ``loss_fn`` for a `ScalarHeadModel`: Bradley-Terry with the batch's
    ``margin`` (if any) and optional reward centering; reports pair ``accuracy``."""

    def loss_fn(model, batch, rng):
        del rng
        chosen, rejected = pair_scores(model, batch)
        margin = batch.get("margin", 0.0)
        loss = bradley_terry_loss(chosen, rejected, margin=margin, center_coef=center_coef)
        accuracy = jnp.mean((chosen > rejected).astype(jnp.float32))
        return loss, {
            "accuracy": accuracy,
            "reward_mean": jnp.mean(jnp.concatenate([chosen, rejected])),
        }

    return loss_fn


def export_reward_model(
    train_out: str | os.PathLike, directory: str | os.PathLike, *, pad_token_id: int | None = None
) -> pathlib.Path:
    """The final reward model of a ``jaxcore rlhf reward`` run started from ``model: {hf:
    DIR}`` as a Hugging Face ``AutoModelForSequenceClassification`` in ``directory``.

    The format TRL's RewardTrainer saves: the trunk's tensors, ``score.weight`` ``(1,
    d_model)`` (a Linear without bias), ``num_labels=1`` and ``pad_token_id`` set, so that
    transformers scores each sequence at its last non-pad token (left or right padding).
    ``pad_token_id`` defaults to the starting checkpoint's ``pad_token_id``, else its
    ``eos_token_id`` (TRL pads with EOS when the tokenizer has no pad token). A sequence
    that ends in the pad id itself is scored by transformers at the token before it.
    """
    from jaxcore import CheckpointConfig, Checkpointer, ConfigError
    from jaxcore.checkpointing.portable import export_checkpoint, read_params
    from jaxcore.hf import save
    from jaxcore.hf.config import config_to_hf
    from jaxcore.models import TransformerConfig

    train_out, directory = pathlib.Path(train_out), pathlib.Path(directory)
    where = f"export_reward_model: {train_out}"
    ckpt_dir = train_out / "checkpoints"
    if not ckpt_dir.is_dir():
        raise ConfigError(f"{where} holds no checkpoints/; pass a finished reward run's train.out.")
    config = CheckpointConfig(directory=ckpt_dir, async_save=False, save_on_sigterm=False)
    with Checkpointer(config) as ckpt:
        step = ckpt.latest_step()
        run = (ckpt.read_record(step).get("run") or {}) if step is not None else {}
    if run.get("stage") != "reward":
        found = f"a '{run['stage']}' run" if run.get("stage") else "no finished reward step"
        raise ConfigError(f"{where}: found {found}; pass a `jaxcore rlhf reward` run's train.out.")
    settings = json.loads((train_out / "run.json").read_text())
    source = settings.get("model_hf")
    if source is None or run.get("head_bias", True):
        raise ConfigError(
            f"{where} trained a reward model from scratch (its head has a bias, which "
            "transformers' score layer lacks); start it from `model: {hf: DIR}` to export it."
        )
    if pad_token_id is None:
        src = json.loads((pathlib.Path(source) / "config.json").read_text())
        pad_token_id = src.get("pad_token_id")
        if pad_token_id is None:
            pad_token_id = src.get("eos_token_id")
        if isinstance(pad_token_id, list):
            pad_token_id = pad_token_id[0]
        if pad_token_id is None:
            raise ConfigError(
                f"{where}: {source}/config.json sets neither pad_token_id nor eos_token_id; "
                "pass pad_token_id= (the id your batches pad with)."
            )
    cfg = TransformerConfig(**run["model"])
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        flat = export_checkpoint(ckpt_dir / str(step), pathlib.Path(tmp) / "params.safetensors")
        params, _ = read_params(flat)
    architectures = config_to_hf(cfg, dtype="float32")["architectures"]
    return save(
        params["trunk"],
        cfg,
        directory,
        extra_tensors={"score.weight": np.asarray(params["head"], np.float32)[None, :]},
        config_updates={
            "architectures": [
                a.replace("ForCausalLM", "ForSequenceClassification") for a in architectures
            ],
            "id2label": {"0": "LABEL_0"},
            "label2id": {"LABEL_0": 0},
            "pad_token_id": int(pad_token_id),
        },
    )

"""``jaxcore export --hf CHECKPOINT DIR``: a training checkpoint as a Hugging Face model.

Reads the parameters of a jaxcore checkpoint step (``runs/x/1000``; no engine or model
code needed, as `jc.export_checkpoint`) and writes ``DIR`` with `jaxcore.hf.save`, which
``transformers.AutoModelForCausalLM.from_pretrained`` loads. Checkpoints do not record
the model's config, so ``--config`` names it: a JSON of `TransformerConfig` fields or a
Hugging Face ``config.json`` (e.g. that of the model the run was fine-tuned from).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
from collections.abc import Sequence

from jaxcore.checkpointing.portable import export_checkpoint, read_params
from jaxcore.errors import ConfigError
from jaxcore.hf.config import config_from_hf
from jaxcore.hf.writer import TOKENIZER_FILES, save
from jaxcore.models.transformer import TransformerConfig


def read_model_config(path: str | pathlib.Path) -> TransformerConfig:
    """A `TransformerConfig` from a JSON of its fields or from a HF ``config.json``."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        fields = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--config {path}: cannot read a JSON config ({e}).") from e
    if "model_type" in fields:
        return config_from_hf(fields)
    try:
        return TransformerConfig(**fields)
    except TypeError as e:
        raise ConfigError(
            f"--config {path}: neither a Hugging Face config.json (no model_type) nor "
            f"TransformerConfig fields ({e})."
        ) from e


def export_hf(
    checkpoint: str | pathlib.Path,
    directory: str | pathlib.Path,
    config: TransformerConfig,
    *,
    dtype: str | None = None,
    tokenizer: str | pathlib.Path | None = None,
) -> pathlib.Path:
    """Write the parameters of checkpoint step ``checkpoint`` as a HF model in ``directory``
    (with ``tokenizer``'s files, as `jaxcore.hf.save`)."""
    pathlib.Path(directory).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=pathlib.Path(directory).parent) as tmp:
        flat = export_checkpoint(checkpoint, pathlib.Path(tmp) / "params.safetensors")
        params, _ = read_params(flat)
    return save(params, config, directory, dtype=dtype, tokenizer=tokenizer)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="jaxcore export", description="Export a training checkpoint's weights."
    )
    p.add_argument(
        "--hf",
        nargs=2,
        metavar=("CHECKPOINT", "DIR"),
        required=True,
        help="write checkpoint step CHECKPOINT (e.g. runs/x/1000) as a Hugging Face model DIR",
    )
    p.add_argument(
        "--config",
        required=True,
        help="the model's config: a JSON of TransformerConfig fields or a HF config.json",
    )
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--tokenizer",
        default=None,
        help="copy this folder's (or tokenizer.json's) tokenizer files into DIR "
        "(default: the --config folder's, when it has them)",
    )
    args = p.parse_args(argv)
    tokenizer = args.tokenizer
    if tokenizer is None and any(
        (pathlib.Path(args.config) / n).is_file() for n in TOKENIZER_FILES
    ):
        tokenizer = args.config  # the folder of the model the run was fine-tuned from
    checkpoint, directory = (pathlib.Path(x) for x in args.hf)
    if not checkpoint.exists():  # a step that keep_last removed, or a typo
        parent = checkpoint.parent
        steps = sorted(
            int(p.name) for p in parent.glob("*") if p.name.isdigit() and (p / "state").is_dir()
        )
        there = f"steps in {parent}: {steps}" if steps else "no steps next to it"
        print(
            f"jaxcore export: {checkpoint} does not exist ({there}; keep_last removes older "
            "steps); pass one that is there, e.g. the latest.",
            file=sys.stderr,
        )
        return 2
    if not (checkpoint / "state").is_dir():
        print(
            f"jaxcore export: {checkpoint} is not a checkpoint step directory (no state/); "
            "pass one step, e.g. runs/demo/1000.",
            file=sys.stderr,
        )
        return 2
    try:
        out = export_hf(
            checkpoint,
            directory,
            read_model_config(args.config),
            dtype=args.dtype,
            tokenizer=tokenizer,
        )
    except ConfigError as e:
        print(f"jaxcore export: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only, DIR under a file
        print(
            f"jaxcore export: {e}. Free space or pick a DIR you can write, then run it "
            "again (a failed export leaves DIR without config.json: it never loads half-written).",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {out} (transformers.AutoModelForCausalLM.from_pretrained loads it)")
    return 0

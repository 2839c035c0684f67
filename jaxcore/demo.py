"""`make demo`: ``jaxcore run configs/demo.yaml``, the whole system on real code.

Curates the source of a few installed packages (license filter, opt-out, PII redaction,
dedup), trains a BPE tokenizer and the reference decoder with ZeRO-3 FSDP over 8 (fake
CPU) devices, searches the learning rate with ASHA, registers the best checkpoint, serves
it and completes code prompts through the OpenAI API, then prints one screen of summary.
Run it again and the finished phases are reused.

    python -m jaxcore.demo [--steps 300] [--set KEY=VALUE ...] [--dry-run]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="jaxcore demo", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help="training steps (default: the config's, 300)")
    p.add_argument("--config", default=str(CONFIG), help="the run config (configs/demo.yaml)")
    args, rest = p.parse_known_args(argv)
    if not pathlib.Path(args.config).is_file():
        print(
            f"jaxcore demo: {args.config} not found; run from a source checkout, or pass "
            "--config PATH to a run YAML (see configs/demo.yaml in the repository).",
            file=sys.stderr,
        )
        return 2
    from jaxcore.run.cli import main as run_main

    extra = ["--set", f"train.steps={args.steps}"] if args.steps is not None else []
    return run_main([args.config, *extra, *rest])


if __name__ == "__main__":
    sys.exit(main())

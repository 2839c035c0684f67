"""`make demo`: ``jaxcore run configs/demo.yaml``, the whole system on real code.

Curates the source of a few installed packages (license filter, opt-out, PII redaction,
dedup), trains a BPE tokenizer and the reference decoder with ZeRO-3 FSDP over 8 (fake
CPU) devices, searches the learning rate with ASHA, registers the best checkpoint, serves
it and completes code prompts through the OpenAI API, then prints one screen of summary.
Run it again and the finished phases are reused.

    python -m jaxcore.demo [CONFIG] [--steps 300] [--set KEY=VALUE ...] [--dry-run]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def main(argv: list[str] | None = None) -> int:
    from jaxcore.run.cli import add_run_options
    from jaxcore.run.cli import main as run_main

    p = argparse.ArgumentParser(prog="jaxcore demo", description=__doc__.splitlines()[0])
    # The run config as `jaxcore run` takes it (a path), or --config; default the demo's.
    p.add_argument("config", nargs="?", help="the run config (default: configs/demo.yaml)")
    p.add_argument("--config", dest="config_option", metavar="CONFIG", help="the same")
    p.add_argument("--steps", type=int, help="training steps (default: the config's, 300)")
    # `jaxcore run`'s options, named here so that --help lists them and a --set value is
    # never taken for the config path.
    add_run_options(p)
    args = p.parse_args(argv)
    if args.config and args.config_option and args.config != args.config_option:
        print(
            f"jaxcore demo: two configs ({args.config} and --config {args.config_option}); "
            "give one.",
            file=sys.stderr,
        )
        return 2
    config = args.config or args.config_option or str(CONFIG)
    if not pathlib.Path(config).is_file():
        print(
            f"jaxcore demo: {config} not found; run from a source checkout, or pass "
            "the path to a run YAML (see configs/demo.yaml in the repository).",
            file=sys.stderr,
        )
        return 2
    rest = [a for kv in args.overrides for a in ("--set", kv)]
    if args.steps is not None:
        rest += ["--set", f"train.steps={args.steps}"]
    rest += ["--dry-run"] * args.dry_run + ["--json"] * args.json
    return run_main([config, *rest])


if __name__ == "__main__":
    sys.exit(main())

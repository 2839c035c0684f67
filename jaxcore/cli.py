"""The ``jaxcore`` command line: one entry point that reaches every package.

Each subcommand imports its package lazily, so ``jaxcore data ...`` never pays for JAX
and a missing optional extra only affects the subcommand that needs it.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with main(argv) -> int, what it does)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("jaxcore.demo", "make demo: jaxcore run configs/demo.yaml, data to serving"),
    "run": ("jaxcore.run.cli", "one config: curate, tokenize, train, search, register, serve"),
    "launch": ("jaxcore.launch", "start N local processes wired together, or print Slurm/TPU"),
    "data": ("data.cli", "build, diff and inspect curated code datasets"),
    "export": ("jaxcore.hf.export", "write a training checkpoint as a Hugging Face model (--hf)"),
    "serve": ("inference.server", "serve a model over an OpenAI-compatible HTTP API"),
    "train": ("jaxcore.experiments.cli", "run one trial of an experiment config"),
    "experiment": ("jaxcore.experiments.cli", "create, list, describe, pause, resume, kill"),
    "trial": ("jaxcore.experiments.cli", "inspect trials (describe --metrics, logs)"),
    "model": ("jaxcore.experiments.cli", "the model registry: create, register, list"),
    "rlhf": ("rlhf.cli", "post-train: sft, reward, ppo, grpo, dpo from a YAML config"),
    "ui": ("jaxcore.ui.cli", "web dashboard: experiments, trials, models, datasets"),
}
# Subcommands that train in this process: they re-exec with glibc's malloc tunables when
# the user has not set GLIBC_TUNABLES (XLA:CPU steps 1.36x faster, jaxcore/runtime.py).
# `make demo` and `jaxcore launch` set them already; a plain `jaxcore run` did not.
TRAINING_SUBCOMMANDS = frozenset({"demo", "run", "train", "rlhf"})
# subcommand -> the pyproject extras its optional imports come from (for the hint when
# one is missing); the others need only the core dependencies.
EXTRAS: dict[str, str] = {
    "demo": "data,experiments,serve,run",
    "run": "data,experiments,serve,run",
    "data": "data",
    "serve": "serve",
    "train": "experiments",
    "experiment": "experiments",
    "trial": "experiments",
    "model": "experiments",
    "ui": "ui,experiments",
}


def _usage() -> str:
    lines = ["usage: jaxcore COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12}{help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run 'jaxcore COMMAND --help' for a command's options; --version for versions."]
    return "\n".join(lines)


def _versions() -> str:
    """jaxcore's version and the stack's (what a bug report needs), without importing JAX:
    the installed distributions' metadata."""
    from importlib import metadata

    from jaxcore import __version__

    parts = [f"jaxcore {__version__}"]
    for dist in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "torch"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} (not installed)")
    return ", ".join(parts) + f"; python {sys.version.split()[0]}"


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its subcommand's ``main``."""
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(_versions())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"jaxcore: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if from_command_line and name in TRAINING_SUBCOMMANDS:
        from jaxcore.runtime import ensure_malloc_tuning

        ensure_malloc_tuning()  # re-execs this command line; returns when already tuned
    module_name, _ = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        extra = EXTRAS.get(name)
        fix = (
            f"pip install 'jaxcore[{extra}]'"
            if extra
            else f"pip install {e.name or 'the missing package'}"
        )
        print(
            f"jaxcore {name}: cannot import {module_name} ({e}). Install it: {fix}.",
            file=sys.stderr,
        )
        return 2
    # The experiments CLI serves several groups and takes the group name first.
    args = [name, *rest] if module_name == "jaxcore.experiments.cli" else rest
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

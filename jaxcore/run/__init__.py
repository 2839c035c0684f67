"""`jaxcore run`: curate a code corpus, train, search, register and serve from one config.

    from jaxcore.run import load_run_config, run_pipeline, dry_run
    cfg = load_run_config("configs/demo.yaml", ["train.steps=50"])
    result = run_pipeline(cfg)   # phases data -> tokenizer -> train -> search -> register -> serve
    result.summary["registry"]["lineage"]["manifest_sha256"]

Built on the existing packages only: ``data`` (curation, snapshots, BPE and token shards),
the Engine and reference model, ``jaxcore.experiments`` (store, ASHA, registry) and
``inference`` (LLM, OpenAI-compatible server). See docs/architecture.md.

Under several processes (``jaxcore launch -n 2 -m jaxcore.cli run ...``, srun, a TPU pod)
process 0 runs the host-local phases and the others follow it; all train
(`jaxcore.run.hosts`). A lost process is a `PeerLostError`, a failed process 0 a
`LeaderFailedError` on the others.
"""

from jaxcore.run.config import (
    DataSection,
    ModelSection,
    RunConfig,
    SearchSection,
    ServeSection,
    TokenizerSection,
    TrainSection,
    load_run_config,
    parse_run_config,
)
from jaxcore.run.hosts import LeaderFailedError, PeerLostError
from jaxcore.run.lineage import code_version, format_chain
from jaxcore.run.phases import PHASES


def run_pipeline(config: RunConfig, **kwargs):
    """Run every phase (see `jaxcore.run.pipeline.run_pipeline`)."""
    from jaxcore.run.pipeline import run_pipeline as run

    return run(config, **kwargs)


def dry_run(config: RunConfig, **kwargs):
    """Print the plan without running it (see `jaxcore.run.pipeline.dry_run`)."""
    from jaxcore.run.pipeline import dry_run as plan

    return plan(config, **kwargs)


__all__ = [
    "PHASES",
    "DataSection",
    "LeaderFailedError",
    "ModelSection",
    "PeerLostError",
    "RunConfig",
    "SearchSection",
    "ServeSection",
    "TokenizerSection",
    "TrainSection",
    "code_version",
    "dry_run",
    "format_chain",
    "load_run_config",
    "parse_run_config",
    "run_pipeline",
]

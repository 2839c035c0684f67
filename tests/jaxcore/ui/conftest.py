"""A store filled by real searches and a real two-version dataset build, shared per session.

The searches run through `jaxcore.experiments` (inline executor) with the cheap pure-Python
objectives of the experiment tests: an adaptive ASHA search, a small PBT search (for the
lineage), and a grid search that checkpoints, whose best checkpoint is registered as a
model version recording the dataset version it was trained on.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sysconfig
from dataclasses import dataclass

import pytest

from jaxcore.experiments import Registry, Store, run_experiment
from tests.jaxcore.experiments.objectives import __file__ as OBJECTIVES

ASHA_TRIALS, ASHA_LENGTH = 8, 16
PBT_POP, PBT_ROUNDS, PBT_LEN = 4, 2, 5
SITE = pathlib.Path(sysconfig.get_paths()["purelib"])
MIT = (
    "MIT License\n\nCopyright (c) 2024 Example Authors\n\n"
    "Permission is hereby granted, free of charge, to any person obtaining a copy\n"
    'of this software and associated documentation files (the "Software"), to deal\n'
    "in the Software without restriction, including without limitation the rights\n"
    "to use, copy, modify, merge, publish, distribute, sublicense, and/or sell\n"
    "copies of the Software, and to permit persons to whom the Software is\n"
    "furnished to do so, subject to the following conditions:\n\n"
    "The above copyright notice and this permission notice shall be included in all\n"
    "copies or substantial portions of the Software.\n\n"
    'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR\n'
    "IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,\n"
    "FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE\n"
    "AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER\n"
    "LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,\n"
    "OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE\n"
    "SOFTWARE.\n"
)


@dataclass
class Filled:
    db_url: str
    workdir: pathlib.Path
    asha_id: int
    pbt_id: int
    grid_id: int
    fails_id: int
    dataset_dir: pathlib.Path  # the data build's output_dir (versions v1, v2)
    model: str


def _git(repo: pathlib.Path, *args: str) -> None:
    date = "2024-01-02T03:04:05+00:00"
    env = dict(
        os.environ,
        GIT_AUTHOR_DATE=date,
        GIT_COMMITTER_DATE=date,
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def _build_datasets(root: pathlib.Path) -> pathlib.Path:
    """v1 from one MIT repo of real source files, v2 after adding and changing a file."""
    from data import config_from_dict
    from data.pipeline import build

    repo = root / "repos" / "alpha"
    repo.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "LICENSE").write_text(MIT)
    (repo / "src").mkdir()
    (repo / "src" / "constructor.py").write_text((SITE / "yaml" / "constructor.py").read_text())
    (repo / "src" / "core.py").write_text((SITE / "idna" / "core.py").read_text())
    (repo / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v1")
    out = root / "datasets"

    def run(version: str) -> None:
        cfg = config_from_dict(
            {
                "sources": [{"type": "git", "path": str(repo), "stars": 10}],
                "output_dir": str(out),
                "version": version,
                "num_shards": 1,
                "workers": 1,
                "progress": False,
            }
        )
        build(cfg)

    run("v1")
    (repo / "src" / "added.py").write_text("def added():\n    return 'new'\n" * 3)
    (repo / "src" / "core.py").write_text((repo / "src" / "core.py").read_text() + "\n# changed\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "v2")
    run("v2")
    return out


def _searches(workdir: pathlib.Path) -> tuple[int, int, int, int]:
    common = {
        "workdir": str(workdir),
        "checkpoint_storage": {"save_trial_latest": 0, "save_trial_best": 0},
    }
    asha = run_experiment(
        {
            "name": "asha-quad",
            "entrypoint": f"{OBJECTIVES}:asha_quad",
            "hyperparameters": {"x": {"type": "double", "minval": 0.0, "maxval": 1.0}},
            "searcher": {
                "name": "adaptive_asha",
                "metric": "loss",
                "max_length": ASHA_LENGTH,
                "max_trials": ASHA_TRIALS,
                "mode": "standard",
                "seed": 3,
            },
            **common,
        },
        executor="inline",
    )
    assert asha.state == "COMPLETED" and len(asha.trials) == ASHA_TRIALS
    pbt = run_experiment(
        {
            "name": "pbt-sgd",
            "entrypoint": f"{OBJECTIVES}:noisy_sgd",
            "hyperparameters": {"lr": {"type": "log", "base": 10, "minval": -3, "maxval": -0.5}},
            "searcher": {
                "name": "pbt",
                "metric": "loss",
                "population_size": PBT_POP,
                "num_rounds": PBT_ROUNDS,
                "length_per_round": PBT_LEN,
                "truncate_fraction": 0.25,
                "perturb_factor": 0.2,
                "resample_probability": 0.0,
                "seed": 1,
            },
            "workdir": str(workdir),
        },
        executor="inline",
    )
    assert pbt.state == "COMPLETED"
    grid = run_experiment(
        {
            "name": "ckpt-grid",
            "entrypoint": f"{OBJECTIVES}:ckpt_curve",
            "hyperparameters": {"x": {"type": "categorical", "vals": [0.2, 0.5]}},
            "searcher": {"name": "grid", "metric": "loss", "max_length": 4},
            "workdir": str(workdir),
        },
        executor="inline",
    )
    assert grid.state == "COMPLETED"
    # One trial raises every time: it is restarted once, then errored, with its traceback logged.
    fails = run_experiment(
        {
            "name": "fails",
            "entrypoint": f"{OBJECTIVES}:always_fail",
            "hyperparameters": {"fail": {"type": "categorical", "vals": [True, False]}},
            "searcher": {"name": "grid", "metric": "loss", "max_length": 1},
            "max_restarts": 1,
            "workdir": str(workdir),
        },
        executor="inline",
    )
    return asha.experiment_id, pbt.experiment_id, grid.experiment_id, fails.experiment_id


@pytest.fixture(scope="session")
def filled(tmp_path_factory) -> Filled:
    root = tmp_path_factory.mktemp("ui-store")
    workdir = root / "experiments"
    asha_id, pbt_id, grid_id, fails_id = _searches(workdir)
    datasets = _build_datasets(root)
    db_url = f"sqlite:///{workdir / 'jaxcore.db'}"
    store = Store(db_url)
    reg = Registry(store, directory=str(root / "registry"))
    reg.create_model("quad", description="the checkpointing grid's best trial")
    ckpts = [c for c in store.checkpoints(exp_id=grid_id) if c["state"] == "COMPLETED"]
    assert ckpts, "the grid search left no checkpoints to register"
    best = min(ckpts, key=lambda c: c["metrics"]["loss"])
    reg.register(
        "quad",
        checkpoint=best["id"],
        aliases=["production"],
        metadata={"dataset": str(datasets / "v2")},
    )
    store.close()
    return Filled(
        db_url=db_url,
        workdir=workdir,
        asha_id=asha_id,
        pbt_id=pbt_id,
        grid_id=grid_id,
        fails_id=fails_id,
        dataset_dir=datasets,
        model="quad",
    )

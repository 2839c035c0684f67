"""The example notebooks: committed clean, and every cell runs under nbclient.

Each notebook runs in a fresh kernel started from this interpreter (a kernelspec written
to a temporary folder, so a system-wide ``python3`` kernel can never be picked instead),
with its working directory in ``tmp_path``: what the notebook writes (datasets,
checkpoints, the experiment store, ``lm_trial.py``) stays out of the repository. The
kernel inherits this process's environment, so it sees the 8 CPU devices of
tests/conftest.py and this checkout on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
NOTEBOOKS = ("quickstart.ipynb", "finetune_hf.ipynb")
CELL_TIMEOUT_S = 600  # a hang guard: the longest cell took 140 s at load average 18 on 2 cores

# What each notebook must print: proof that each part did its job, not only that no
# cell raised.
EXPECTED = {
    "quickstart.ipynb": [
        "nothing to install",  # the install cell is skipped where jaxcore imports
        "non_permissive=",  # the license filter dropped the GPL repository
        "owner request",  # the opt-out registry dropped bigco/private
        "exact_duplicate=",  # dedup dropped the fork's copies
        "near_duplicate=",
        'DB_PASSWORD = "<PASSWORD>"',  # PII redaction in the kept file
        "tokenizer sha256",
        "tokens/s  MFU",
        "experiment 1: COMPLETED",
        "registered version 1",
        "dataset_manifest_sha256",
        "[rank 1] process 1/2: 4 local of 8 devices",  # notebook_launcher's second process
        "losses from process 0",
    ],
    "finetune_hf.ipynb": [
        "nothing to install",
        "model.safetensors",
        "max |logit difference|",
        "models: ['llama-finetuned']",
        "server:",
    ],
}


def _read(name: str):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(EXAMPLES / name, as_version=4)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_clean_and_explained(name):
    nb = _read(name)
    import nbformat

    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), (
        f"{name} is committed with outputs; strip them (clear all outputs, then save)."
    )
    kinds = [c.cell_type for c in nb.cells]
    assert kinds[0] == "markdown" and kinds.count("markdown") >= len(code) // 2 + 2, kinds
    # The install cell comes first and is skipped where jaxcore already imports.
    assert 'find_spec("jaxcore") is not None' in code[0].source and "pip" in code[0].source
    # XLA_FLAGS is set before the first cell that imports JAX (or jaxcore, which imports it).
    first_jax = next(
        i for i, c in enumerate(code) if "import jax" in c.source or "import jaxcore" in c.source
    )
    flags = next(
        i for i, c in enumerate(code) if "xla_force_host_platform_device_count" in c.source
    )
    assert flags <= first_jax
    assert code[flags].source.index("XLA_FLAGS") < code[flags].source.index("import jax")


def _kernel_manager(tmp_path: pathlib.Path):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec_dir = tmp_path / "kernels" / "jaxcore-test"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "jaxcore tests", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    return KernelManager(kernel_name="jaxcore-test", kernel_spec_manager=specs)


def _text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from nbclient import NotebookClient

    nb = _read(name)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    client = NotebookClient(
        nb,
        km=_kernel_manager(tmp_path),
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    text = _text(nb)
    missing = [s for s in EXPECTED[name] if s not in text]
    assert not missing, f"{name}: outputs lack {missing}; they were:\n{text[-4000:]}"
    run_dir = name.replace(".ipynb", "_run").replace("finetune_hf", "finetune")
    assert (workdir / run_dir).is_dir(), f"{name} did not write its files under its cwd"
    assert not list(EXAMPLES.glob("*_run")), f"{name} wrote into examples/"

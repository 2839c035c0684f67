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
import os
import pathlib
import re
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


# ----------------------------------------------------------------------------- install cell
# A stand-in for pip (``python -m pip``): records each command, and "installs" jaxcore
# for ``--no-deps`` by writing its metadata (the real Requires-Dist of pyproject.toml).
_PIP_SHIM = """
import json, os, pathlib, sys
argv = sys.argv[1:]
record = {"argv": argv}
if "-c" in argv:
    record["constraints"] = pathlib.Path(argv[argv.index("-c") + 1]).read_text()
with open(os.environ["PIP_LOG"], "a") as f:
    f.write(json.dumps(record) + "\\n")
if "--no-deps" in argv:
    info = pathlib.Path(__file__).parents[1] / "jaxcore-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(os.environ["JAXCORE_METADATA"])
sys.exit(int(os.environ.get("PIP_EXIT", "0")) if "-c" in argv else 0)
"""


def _metadata() -> str:
    import tomllib

    project = tomllib.loads((EXAMPLES.parent / "pyproject.toml").read_text())["project"]
    lines = ["Metadata-Version: 2.1", "Name: jaxcore", f"Version: {project['version']}"]
    lines += [f"Requires-Dist: {r}" for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        lines += [f"Provides-Extra: {extra}"]
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> pathlib.Path:
    """A Python where jaxcore is NOT importable and which has no pip of its own."""
    import subprocess

    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv / "bin" / "python"


def _run_install_cell(
    name: str, python: pathlib.Path, tmp_path: pathlib.Path, *, cwd: pathlib.Path, **env: str
):
    """Run ``name``'s first code cell with ``python``; returns (the process, pip's calls)."""
    import subprocess

    site = tmp_path / "site"
    (site / "pip").mkdir(parents=True)
    (site / "pip" / "__init__.py").write_text("")
    (site / "pip" / "__main__.py").write_text(_PIP_SHIM)
    for dist, version in (env.pop("runtime", None) or {}).items():  # Colab's own packages
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    code = next(c for c in _read(name).cells if c.cell_type == "code")
    log = tmp_path / "pip.log"
    proc = subprocess.run(
        [str(python), "-c", code.source],
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(site),  # not this checkout: jaxcore must not import
            "PIP_LOG": str(log),
            "JAXCORE_METADATA": _metadata(),
            **env,
        },
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


GIT = "git+https://github.com/example/jaxcore"


@pytest.mark.parametrize(
    ("name", "extras"),
    [("quickstart.ipynb", "data,experiments,serve"), ("finetune_hf.ipynb", "serve,inference-test")],
)
def test_install_cell_on_colab_keeps_the_runtime_jax(name, extras, bare_python, tmp_path):
    runtime = {"jax": "0.4.38", "jaxlib": "0.4.38", "torch": "2.6.0+cu124"}
    proc, calls = _run_install_cell(
        name, bare_python, tmp_path, cwd=tmp_path, JAXCORE_SOURCE=GIT, runtime=runtime
    )
    assert proc.returncode == 0, proc.stderr
    assert calls[0]["argv"] == ["install", "-q", "--no-deps", GIT]
    second = calls[1]["argv"]
    assert second[:4] == ["install", "-q", "-c", second[3]] and len(calls) == 2
    assert calls[1]["constraints"] == "jax==0.4.38\njaxlib==0.4.38\ntorch==2.6.0+cu124\n"
    wanted = second[4:]
    names = {re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower() for r in wanted}
    assert not names & {"jax", "jaxlib", "torch"}, wanted  # never replaced
    assert "flax==0.12.8" in wanted and "cloudpickle==3.1.3" in wanted  # the base ones
    pyproject = _metadata()
    for extra in extras.split(","):  # every requirement of the chosen extras, no other
        for line in pyproject.splitlines():
            if line.endswith(f'extra == "{extra}"'):
                req = line.removeprefix("Requires-Dist: ").split(";")[0]
                assert req in wanted or req.startswith(("torch==", "jax")), req
    assert "ray[data]==2.60.0" not in wanted and "playwright==1.65.2" not in wanted
    assert "kept this runtime's jax 0.4.38 (jaxcore is tested with jax==0.10.2)" in proc.stdout
    assert f"installed jaxcore from {GIT}" in proc.stdout


def test_install_cell_names_the_jax_to_install_when_pip_cannot_keep_colabs(bare_python, tmp_path):
    proc, calls = _run_install_cell(
        "quickstart.ipynb",
        bare_python,
        tmp_path,
        cwd=tmp_path,
        JAXCORE_SOURCE=GIT,
        PIP_EXIT="1",
        runtime={"jax": "0.4.38"},
    )
    assert proc.returncode != 0 and len(calls) == 2
    assert "pip could not keep this runtime's jax 0.4.38" in proc.stderr
    assert "pip install -U 'jax[tpu]==0.10.2' on a TPU, 'jax[cuda12]==0.10.2' on a GPU" in (
        proc.stderr
    )


def test_install_cell_in_a_fresh_environment_and_in_a_checkout(bare_python, tmp_path):
    proc, calls = _run_install_cell(
        "quickstart.ipynb", bare_python, tmp_path / "a", cwd=tmp_path, JAXCORE_SOURCE=GIT
    )
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"] for c in calls] == [
        ["install", "-q", f"jaxcore[data,experiments,serve] @ {GIT}"]
    ]
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text("[project]\nname = 'jaxcore'\n")
    proc, calls = _run_install_cell(
        "quickstart.ipynb", bare_python, tmp_path / "b", cwd=checkout / "examples"
    )
    assert proc.returncode == 0, proc.stderr
    assert [c["argv"] for c in calls] == [
        ["install", "-q", "-e", f"{checkout.resolve()}[data,experiments,serve]"]
    ]
    proc, calls = _run_install_cell("quickstart.ipynb", bare_python, tmp_path / "c", cwd=tmp_path)
    assert proc.returncode != 0 and not calls
    assert "set JAXCORE_SOURCE to a git URL" in proc.stderr

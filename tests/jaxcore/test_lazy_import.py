"""`import jaxcore` is lazy (PEP 562): no JAX until a name needs it, every public name
still resolves, and importing the modules has no side effect that laziness could lose."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

import jaxcore

HEAVY = ("jax", "flax", "optax", "orbax.checkpoint", "grain", "torch", "optuna")


def _loaded_after(code: str) -> list[str]:
    """The HEAVY modules a fresh interpreter holds after running ``code``."""
    probe = f"import sys\n{code}\nprint(__import__('json').dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    return [m for m in HEAVY if m in json.loads(out.splitlines()[-1])]


@pytest.mark.parametrize(
    "code",
    [
        "import jaxcore",
        "import jaxcore; jaxcore.ConfigError; jaxcore.PREEMPTION_EXIT_CODE",
        "import jaxcore.cli",
        "import jaxcore.launch",  # the launcher parent: its ranks import JAX, it need not
        "import jaxcore.experiments.runner",  # a pure-Python trial's process
        "import jaxcore.experiments.cli",
    ],
)
def test_light_entry_points_import_no_jax(code):
    assert _loaded_after(code) == []


def test_a_name_that_needs_jax_imports_it_on_first_use():
    assert "jax" in _loaded_after("import jaxcore; jaxcore.Engine")
    assert "jax" in _loaded_after("import jaxcore; jaxcore.models.TransformerConfig")


def test_every_public_name_resolves_to_its_module_object():
    for name in jaxcore.__all__:
        value = getattr(jaxcore, name)
        if name in jaxcore._WHERE:
            module = sys.modules[jaxcore._WHERE[name]]
            assert value is getattr(module, name), name
    for name, module in jaxcore._SUBMODULES.items():
        assert getattr(jaxcore, name) is sys.modules[module]
    assert jaxcore.costs is sys.modules["jaxcore.costs"]  # any submodule, as before
    assert callable(jaxcore.gather)  # the function, not its module `jaxcore.gather`
    assert set(jaxcore.__all__) <= set(dir(jaxcore))
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        jaxcore.not_a_name  # noqa: B018


def test_exports_all_and_type_checking_imports_agree():
    tree = ast.parse(pathlib.Path(jaxcore.__file__).read_text())
    checked = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    typed: dict[str, str] = {}
    for node in checked.body:
        for alias in node.names:
            where = f"jaxcore.{alias.name}" if node.module == "jaxcore" else node.module
            typed[alias.name] = where
    lazy = {**jaxcore._WHERE, **{n: m for n, m in jaxcore._SUBMODULES.items() if n in typed}}
    assert typed == lazy
    assert sorted(jaxcore.__all__) == sorted([*jaxcore._WHERE, "axes", "models", "profiling"])


def test_importing_every_module_changes_no_jax_setting_or_environment():
    """Laziness moves imports later; that is only safe if no import sets anything."""
    code = """
import json, os, jax
before = (dict(os.environ), {k: repr(v) for k, v in jax.config.values.items()})
import jaxcore
for name in [*jaxcore.__all__, "experiments", "compression", "registry"]:
    getattr(jaxcore, name)
after = (dict(os.environ), {k: repr(v) for k, v in jax.config.values.items()})
print(json.dumps(before == after))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    ).stdout
    assert json.loads(out.splitlines()[-1]) is True


def test_importing_a_submodule_keeps_the_public_name_of_the_same_name():
    code = "import jaxcore.gather\nassert callable(jaxcore.gather), jaxcore.gather"
    subprocess.run([sys.executable, "-c", code], check=True, env=os.environ)

"""``jaxcore --version``: the versions a bug report needs, without importing JAX (it was
an unknown command, exit 2)."""

import subprocess
import sys

import jaxcore


def test_version_names_jaxcore_and_its_stack_without_importing_jax():
    code = "import sys; from jaxcore.cli import main; rc = main(['--version']); "
    code += "print('jax imported' if 'jax' in sys.modules else 'light'); sys.exit(rc)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"jaxcore {jaxcore.__version__}, jax "), out.stdout
    assert "jaxlib " in out.stdout and "python 3." in out.stdout
    assert out.stdout.rstrip().endswith("light"), out.stdout

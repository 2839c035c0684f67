"""The torchax compatibility layer is exercised, and torchax is imported lazily."""

import subprocess
import sys

import pytest
import torch

from torchbridge import _compat


def test_import_torchbridge_does_not_import_torchax():
    code = (
        "import sys, torchbridge, jaxcore; "
        "assert 'torchax' not in sys.modules, 'torchax imported eagerly'; "
        "import torch; assert torch.backends.mha.get_fastpath_enabled()"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_compat_layer_stands_in_for_removed_named_overloads():
    torchax = _compat.load_torchax()
    assert torchax.__version__ == _compat.TORCHAX_VERSION
    # torch 2.13 removed these; without the layer `import torchax` raises AttributeError.
    assert not hasattr(torch.ops.aten.prod, "dim_Dimname")
    assert "aten.prod.dim_Dimname" in _compat.PATCHED_OVERLOADS
    assert "aten.unbind.Dimname" in _compat.PATCHED_OVERLOADS
    assert len(set(_compat.PATCHED_OVERLOADS)) >= 10
    # Only named-tensor overloads are stood in for, and the patch is gone afterwards.
    assert all(_compat._NAMED_OVERLOAD.search(n.split(".")[-1]) for n in _compat.PATCHED_OVERLOADS)
    with pytest.raises(AttributeError):  # the patch must not leak past the torchax import
        torch.ops.aten.prod.dim_Dimname  # noqa: B018
    # Importing torchax turned the MHA fast path off globally; the layer restores it.
    assert torch.backends.mha.get_fastpath_enabled()

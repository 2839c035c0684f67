"""torchbridge.xla: jaxcore's ParallelConfig drives torch_xla SPMD for a PyTorch loop.

Runs in .venv-xla (torch 2.9 + torch_xla 2.9 on the XLA CPU device, 8 devices), through
``bash scripts/test-xla.sh``.
"""

from __future__ import annotations

import copy
import os

import torch
import torch_xla
import torch_xla.runtime as xr
from torch import nn
from torch.nn import functional as F

import jaxcore as jc
from torchbridge import xla
from torchbridge.sharding import TENSOR_PARALLEL_RULES

assert os.environ.get("PJRT_DEVICE") == "CPU", "run through scripts/test-xla.sh"
xr.use_spmd()


class Block(nn.Module):
    def __init__(self, d: int = 16, ff: int = 32):
        super().__init__()
        self.up_proj = nn.Linear(d, ff)
        self.down_proj = nn.Linear(ff, d)
        self.classifier = nn.Linear(d, 4)

    def forward(self, x):
        return self.classifier(x + self.down_proj(F.gelu(self.up_proj(x))))


def _train(module, x, y, steps=3):
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        torch_xla.sync()
        losses.append(float(loss.detach().cpu()))
    return losses


def test_parallel_config_drives_mark_sharding_and_training_matches_eager():
    assert xr.global_runtime_device_count() == 8
    torch.manual_seed(0)
    ref = Block()
    x, y = torch.randn(16, 16), torch.randint(0, 4, (16,))
    model = copy.deepcopy(ref)
    ref_losses = _train(ref, x, y)

    mesh = xla.xla_mesh(jc.ParallelConfig(fsdp=4, tensor=2))
    assert tuple(mesh.mesh_shape) == (1, 1, 4, 2)
    device = torch_xla.device()
    model = model.to(device)
    specs = xla.shard_module(model, mesh, param_rules=TENSOR_PARALLEL_RULES)
    # Megatron: up_proj column-parallel (out features on tensor), down_proj row-parallel.
    assert specs["up_proj.weight"] == ("tensor", "fsdp")
    assert specs["down_proj.weight"] == ("fsdp", "tensor")
    assert specs["classifier.weight"] == (None, "fsdp")  # unnamed: the automatic FSDP rule
    spec_text = torch_xla._XLAC._get_xla_sharding_spec(model.up_proj.weight)
    assert "devices=[2,4]" in spec_text, spec_text
    xd, yd = xla.shard_batch(x.to(device), mesh), y.to(device)
    losses = _train(model, xd, yd)
    for a, b in zip(losses, ref_losses, strict=True):
        assert abs(a - b) < 1e-4, (losses, ref_losses)
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.allclose(p.detach().cpu(), q.detach(), atol=1e-4), n

"""`jc.Engine(precision="bf16"/"fp16")` with a bridged torch module computes in 16 bits.

The policy casts the weights to the compute dtype; a float32 input then promoted every
matmul back to float32, so a bf16 run silently computed in float32. The bridge now casts
floating inputs to the weights' compute dtype (what torch requires of `model.to(bf16)`)
and floating outputs back to float32 for the loss."""

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import jaxcore as jc
import torchbridge


def _step(precision: str, module: torch.nn.Module, x, y):
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1), precision=precision)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    state = torchbridge.prepare(engine, module, opt)
    seen = []

    def loss_fn(model, batch, rng):
        def forward(mod, xb, yb):
            out = mod(xb)
            seen.append(out.dtype)
            return F.cross_entropy(out.float(), yb)

        return model.call(forward, batch["x"], batch["y"], rng=rng), {}

    step = engine.train_step(loss_fn)
    _, metrics = step(state, {"x": x, "y": y})
    return float(metrics["loss"]), seen


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp16", torch.float16)]
)
def test_a_bridged_module_computes_in_the_policys_dtype(precision, dtype):
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        reference = F.cross_entropy(
            torch.nn.Sequential(*[m for m in module]).to(dtype)(x.to(dtype)).float(), y
        )
    module = module.float()
    loss, seen = _step(precision, module, x, y)
    assert seen == [dtype]
    np.testing.assert_allclose(loss, float(reference), rtol=1e-3)


def test_float32_policy_leaves_inputs_alone_and_batchnorm_runs_in_bf16():
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    module = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4)
    )
    _, seen = _step("fp32", module, x, y)
    assert seen == [torch.float32]
    _, seen = _step("bf16", module, x, y)
    assert seen == [torch.bfloat16]

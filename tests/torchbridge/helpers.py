"""Shared helpers for the bridge tests: host copies and a plain torch training loop."""

from __future__ import annotations

import jax
import numpy as np
import torch

from torchbridge.module import flatten


def host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def max_abs_diff_to_torch(params, module: torch.nn.Module) -> float:
    """max |jax - torch| over the module's (deduplicated) parameters."""
    flat = flatten(host(params))
    worst = 0.0
    for name, p in module.named_parameters():
        worst = max(worst, float(np.max(np.abs(flat[name] - p.detach().numpy()))))
    return worst


def torch_train(module, optimizer, loss_fn, batches, scheduler=None):
    """Run ``len(batches)`` plain torch steps; return the losses."""
    losses = []
    for b in batches:
        optimizer.zero_grad()
        loss = loss_fn(module, b)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss.detach()))
    return np.array(losses)

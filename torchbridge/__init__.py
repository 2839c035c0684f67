"""torchbridge: train PyTorch modules, optimizers and DataLoaders with jaxcore's engine.

A ``torch.nn.Module`` runs on JAX through torchax (imported lazily, with a small
compatibility layer for torch 2.13, see ``torchbridge._compat``), so the same jitted,
sharded step trains it under data, FSDP/ZeRO and tensor parallelism; the trained weights
go back to torch as a ``state_dict`` or a safetensors file.

    import jaxcore as jc, torch, torchbridge
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), 1e-3))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    for batch in torchbridge.TorchLoader(dataloader, engine):
        state, metrics = step(state, batch)
    model.load_state_dict(torchbridge.state_dict(state))
"""

from torchbridge.api import loss, prepare
from torchbridge.data import DatasetSource, TorchLoader
from torchbridge.errors import UnsupportedError, UntraceableError
from torchbridge.module import BoundModule, ModuleSpec, from_torch
from torchbridge.optim import to_optax
from torchbridge.sharding import TENSOR_PARALLEL_RULES, is_conv1d, tensor_parallel_rules
from torchbridge.weights import load_safetensors, load_state_dict, save_safetensors, state_dict

__all__ = [
    "TENSOR_PARALLEL_RULES",
    "BoundModule",
    "DatasetSource",
    "ModuleSpec",
    "TorchLoader",
    "UnsupportedError",
    "UntraceableError",
    "from_torch",
    "is_conv1d",
    "load_safetensors",
    "load_state_dict",
    "loss",
    "prepare",
    "save_safetensors",
    "state_dict",
    "tensor_parallel_rules",
    "to_optax",
]

"""Helper for the torchbridge multi-process test: run under `jaxcore launch -n 2`.

Trains a small torch MLP one epoch through `torchbridge.TorchLoader` with a per-process
``batch_size`` of ARGV[2] and writes OUT/rank{i}.json with the losses and ``len(loader)``.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from jaxcore.distributed import initialize

initialize()

import jax  # noqa: E402
import torch  # noqa: E402

import jaxcore as jc  # noqa: E402
import torchbridge  # noqa: E402


def train(batch_size: int) -> dict:
    """One epoch of 64 examples; the same model, data and shuffle order in every process."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    dataloader = torch.utils.data.DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=-1))
    state = torchbridge.prepare(engine, model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    step = engine.train_step(torchbridge.loss(torch.nn.CrossEntropyLoss()))
    loader = torchbridge.TorchLoader(dataloader, engine, num_epochs=1)
    losses = []
    for batch in loader:
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return {"losses": losses, "len": len(loader)}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    result = train(int(sys.argv[2]))
    (out / f"rank{jax.process_index()}.json").write_text(json.dumps(result))
    print("done")

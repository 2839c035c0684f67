"""jaxcore.hf across 2 processes: each reads only its half of a sharded checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import transformers

from tests.jaxcore import hf_models as H

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "hf_load_sharded.py"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_each_read_only_their_slices_of_a_sharded_checkpoint(tmp_path):
    model, directory = H.save_model("qwen2", tmp_path / "hf", max_shard_size="40KB")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "GLIBC_TUNABLES")}
    # -O0 as in tests/conftest.py: compiling is most of the ranks' time (the launcher adds
    # the device count).
    env.update(PYTHONPATH=str(ROOT), XLA_FLAGS="--xla_backend_optimization_level=0")
    cmd = [sys.executable, "-m", "jaxcore.launch", "-n", "2", "--devices-per-process", "4"]
    proc = subprocess.run(
        [*cmd, str(SCRIPT), str(directory), str(tmp_path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    total, replicated = results[0]["total_bytes"], results[0]["replicated_bytes"]
    assert 0 < replicated < total / 20  # Qwen2's q/k/v biases (no embed axis to shard)
    for res in results:
        # fsdp=8 over 2 x 4 devices splits every tensor with an embed axis in half between
        # the processes: each reads exactly its half of those, and nothing twice.
        assert res["bytes_read"] == (total - replicated) // 2 + replicated, res
        assert res["shards_checked"] > 0
        assert set(res["files_opened"]) == set(index["weight_map"].values())
    # The sharded params gathered back and written by process 0 load in transformers.
    back = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "saved", attn_implementation="eager"
    )
    tokens = H.tokens(2, 10)
    np.testing.assert_allclose(H.torch_logits(back, tokens), H.torch_logits(model, tokens), atol=0)

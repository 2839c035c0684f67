"""torchbridge over 2 processes x 4 CPU devices equals 1 process x 8 with twice the batch."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.jaxcore.test_launch import start_two_ranks
from tests.torchbridge.scripts.two_process_loader import train

SCRIPT = Path(__file__).parent / "scripts" / "two_process_loader.py"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_load_alternate_torch_batches_like_one_with_twice_the_batch(tmp_path):
    # Process p loads torch batch 2k + p of each step k (batch_size per process), so the
    # global batch is the 1-process loader's batch k at twice the batch size: same order.
    proc = start_two_ranks(SCRIPT, str(tmp_path), "4")
    reference = train(8)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert reference["len"] == 8 and len(set(reference["losses"])) == 8
    for rank in range(2):
        res = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert res["len"] == reference["len"], rank
        np.testing.assert_allclose(res["losses"], reference["losses"], rtol=1e-5)

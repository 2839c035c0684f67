"""`gather` / `EvalGatherer` in one process (the 2-process case runs in test_launch)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import jaxcore as jc
from jaxcore.gather import EvalGatherer, gather


def global_rows(values):
    mesh = jax.make_mesh((8,), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    return jax.make_array_from_process_local_data(sharding, values)


def test_uneven_last_batch_drops_padding():
    total = 21  # batches of 8: 8 + 8 + 5 real rows, the last padded with copies of row 20
    ids = np.arange(total)
    padded = np.concatenate([ids, np.full(3, ids[-1])])
    gatherer = EvalGatherer(total=total)
    got = []
    for start in range(0, 24, 8):
        rows = padded[start : start + 8]
        out = gatherer({"id": global_rows(rows), "score": global_rows(rows * 0.5)})
        got.append(out)
    ids_out = np.concatenate([g["id"] for g in got])
    np.testing.assert_array_equal(ids_out, ids)
    np.testing.assert_allclose(np.concatenate([g["score"] for g in got]), ids * 0.5)
    assert [len(g["id"]) for g in got] == [8, 8, 5]
    assert gatherer.seen == 24


def test_gather_host_values_and_scalars():
    out = gather({"x": np.arange(6).reshape(3, 2), "n": np.int32(4)}, valid=2)
    np.testing.assert_array_equal(out["x"], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(out["n"], [4])  # one entry per process


def test_leaves_with_different_row_counts_are_rejected():
    with pytest.raises(jc.ConfigError, match="rows"):
        EvalGatherer(total=5)({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(jc.ConfigError, match="valid"):
        gather(np.zeros(3), valid=-1)


def test_gather_with_an_engine_in_one_process_is_plain_gather():
    engine = jc.Engine(parallel=jc.ParallelConfig(pipeline=2, fsdp=4), microbatches=2)
    assert engine.process_batch_block == (0, 1)
    ids = np.arange(5)
    np.testing.assert_array_equal(gather({"id": ids}, engine=engine)["id"], ids)
    np.testing.assert_array_equal(EvalGatherer(total=3, engine=engine)(ids), ids[:3])

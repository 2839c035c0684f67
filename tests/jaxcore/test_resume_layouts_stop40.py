"""Resume one run across layouts and process counts with `jaxcore.Loader` positioned by the
checkpoint: 1 x 8 devices (data=8) -> 1 x 4 (fsdp=4); 1 x 8 -> 2 x 4 -> 1 x 8. Each
resumed step must see the batch the uninterrupted run saw at that step (checked exactly,
by a checksum of the global token batch) and reach its loss to rtol 1e-5: the layouts sum
gradients and activations in a different order (data-parallel all-reduce vs FSDP
reduce-scatter over 4 or 8 shards), so float32 results agree to rounding, not bit for
bit. A changed global batch size is refused in one line; a changed ``worker_count`` of a
random-access loader resumes the same batches (its position is the step)."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import optax
import pytest

import jaxcore as jc
from jaxcore.models import Transformer

from .procs.corpus import CFG, corpus
from .test_launch import clean_env, launch_cmd, run_two_ranks

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from jaxcore.distributed import initialize
    initialize()
    import jax, jax.numpy as jnp, optax
    import jaxcore as jc
    from jaxcore.models import Transformer, lm_loss
    from tests.jaxcore.procs.corpus import CFG, corpus

    directory, out, layout, steps = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    parallel = jc.ParallelConfig(**{k: int(v) for k, v in
                                    (kv.split("=") for kv in layout.split(","))})
    engine = jc.Engine(parallel=parallel, seed=0)
    loader = jc.Loader(corpus(), jc.InputConfig(global_batch_size=8, seq_len=16, seed=1),
                       engine.batch_sharding)
    config = jc.CheckpointConfig(directory=directory, save_every_steps=3, keep_last=10)
    weights = jnp.arange(1, 8 * 17 + 1, dtype=jnp.int32).reshape(8, 17)
    checksum = jax.jit(lambda t: jnp.sum(t * weights))
    rows = []
    with jc.Checkpointer(config, engine=engine, loader=loader) as ckpt:
        state, _ = ckpt.restore_or_init(
            engine, lambda rngs: Transformer(CFG, rngs=rngs), optax.adamw(1e-3))
        step_fn = engine.train_step(lm_loss)
        step = int(state.step)
        while step < steps:
            batch = next(loader)
            state, metrics = step_fn(state, batch)
            step += 1
            rows.append({"step": step, "loss": float(metrics["loss"]),
                         "batch": int(checksum(batch["tokens"]))})
            ckpt.save(state, step=step)
        ckpt.wait()
    loader.close()
    if jax.process_index() == 0:
        Path(out).write_text(json.dumps({"devices": jax.device_count(),
                                         "processes": jax.process_count(), "rows": rows}))
    """
)


def run(
    tmp_path: Path,
    directory: Path,
    name: str,
    layout: str,
    steps: int,
    *,
    devices: int,
    processes: int = 1,
) -> dict:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{name}.json"
    env = clean_env()
    args = [str(script), str(ROOT), str(directory), str(out), layout, str(steps)]
    if processes == 1:
        env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
        cmd = [sys.executable, *args]
    else:
        cmd = launch_cmd("-n", str(processes), "--devices-per-process", str(devices), *args)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert result["devices"] == devices * processes and result["processes"] == processes
    return result


def only_step(src: Path, dst: Path, step: int) -> Path:
    """A copy of checkpoint directory ``src`` holding step ``step`` alone."""
    shutil.copytree(src, dst)
    for child in dst.iterdir():
        if child.is_dir() and child.name.isdigit() and int(child.name) != step:
            shutil.rmtree(child)
    return dst


def check_continues(reference: dict, resumed: dict, first: int) -> None:
    ref = {r["step"]: r for r in reference["rows"]}
    got = resumed["rows"]
    assert [r["step"] for r in got] == list(range(first + 1, first + 1 + len(got)))
    assert got, "the resumed run trained no step"
    for r in got:  # the same batch (no batch skipped or repeated), the same loss to rounding
        assert r["batch"] == ref[r["step"]]["batch"], r["step"]
        np.testing.assert_allclose(r["loss"], ref[r["step"]]["loss"], rtol=1e-5, err_msg=r)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_resume_across_layouts_and_process_counts_continues_the_run(tmp_path):
    ref_dir = tmp_path / "ref"
    reference = run(tmp_path, ref_dir, "ref", "data=8,fsdp=1", 9, devices=8)
    assert len({r["batch"] for r in reference["rows"]}) == 9  # the check can see an order
    assert sorted(int(p.name) for p in ref_dir.iterdir() if p.name.isdigit()) == [3, 6, 9]

    # 1 x 8 data=8 -> 1 x 4 fsdp=4
    four = run(tmp_path, only_step(ref_dir, tmp_path / "b", 3), "four", "fsdp=4", 6, devices=4)
    check_continues(reference, four, 3)

    # 1 x 8 -> 2 x 4 (fsdp over all 8) -> back to 1 x 8 data=8
    mp_dir = only_step(ref_dir, tmp_path / "c", 3)
    two = run(tmp_path, mp_dir, "two", "fsdp=-1", 6, devices=4, processes=2)
    check_continues(reference, two, 3)
    shutil.rmtree(mp_dir / "3")
    back = run(tmp_path, mp_dir, "back", "data=8,fsdp=1", 9, devices=8)
    check_continues(reference, back, 6)


def saved_run(tmp_path: Path, batch: int = 8, worker_count: int = 0):
    """A Checkpointer over a fresh loader, and the loader, in this 8-device process."""
    engine = jc.Engine(parallel=jc.ParallelConfig(data=8, fsdp=1), seed=0)
    loader = jc.Loader(
        corpus(),
        jc.InputConfig(global_batch_size=batch, seq_len=16, seed=1, worker_count=worker_count),
        engine.batch_sharding,
    )
    config = jc.CheckpointConfig(directory=tmp_path / "ckpt", save_every_steps=1, announce=False)
    return engine, loader, jc.Checkpointer(config, engine=engine, loader=loader)


def factory(rngs):
    return Transformer(CFG, rngs=rngs)


@pytest.fixture(scope="module")
def saved_at_3(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("saved")
    engine, loader, ckpt = saved_run(tmp_path)
    with ckpt:
        state, _ = ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
        batches = [np.asarray(next(loader)["tokens"]) for _ in range(6)]
        loader.seek(3)
        ckpt.save(state, step=3, force=True)
        ckpt.wait()
    loader.close()
    return tmp_path, batches


def test_a_changed_global_batch_size_is_refused_in_one_line(saved_at_3):
    tmp_path, _ = saved_at_3
    engine, _loader, ckpt = saved_run(tmp_path, batch=16)
    with ckpt, pytest.raises(jc.ConfigError) as info:
        ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
    msg = str(info.value)
    assert "global_batch_size=16" in msg and "Resume with global_batch_size=8" in msg, msg
    assert "\n" not in msg


def test_a_changed_worker_count_resumes_the_same_batches(saved_at_3):
    tmp_path, batches = saved_at_3
    engine, loader, ckpt = saved_run(tmp_path, worker_count=2)
    with ckpt:
        ckpt.restore_or_init(engine, factory, optax.sgd(0.1))
        assert ckpt.resumed_step == 3 and loader.step == 3
        got = [np.asarray(next(loader)["tokens"]) for _ in range(3)]
    loader.close()
    for a, b in zip(got, batches[3:], strict=True):
        np.testing.assert_array_equal(a, b)


STREAM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from jaxcore.distributed import initialize
    initialize()
    import grain, jax, numpy as np
    import jaxcore as jc
    parallel = jc.ParallelConfig(**{k: int(v) for k, v in
                                    (kv.split("=") for kv in sys.argv[3].split(","))})
    engine = jc.Engine(parallel=parallel, seed=0)
    docs = [np.full(17, i, np.int32) for i in range(64)]  # document i: tokens all i
    ds = grain.MapDataset.source(docs).to_iter_dataset()
    loader = jc.Loader(ds, jc.InputConfig(global_batch_size=8, seq_len=16, mode="pad"),
                       engine.batch_sharding)
    steps = []
    for _ in range(2):
        rows = {}
        for s in next(loader)["tokens"].addressable_shards:
            for r, doc in zip(range(*s.index[0].indices(8)), np.asarray(s.data)[:, 0]):
                rows[r] = int(doc)
        steps.append(rows)
    loader.close()
    Path(f"{sys.argv[2]}.{jax.process_index()}").write_text(json.dumps(steps))
    """
)


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["pipeline=2,fsdp=4", "fsdp=-1"])
def test_processes_holding_the_same_rows_read_the_same_stream(tmp_path, layout):
    """A streaming source under 2 x 4 devices. With ``pipeline=2`` across the processes
    each holds every row: both must pass the same documents for them (was: process 0 the
    even documents, process 1 the odd ones, so the stages trained on different batches).
    With fsdp over both, each holds its half and the halves are disjoint."""
    script = tmp_path / "stream.py"
    script.write_text(STREAM_SCRIPT)
    out = tmp_path / "rows"
    proc = run_two_ranks(script, str(ROOT), str(out), layout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    for step in range(2):
        rows = [{int(k): v for k, v in seen[r][step].items()} for r in range(2)]
        for r in set(rows[0]) & set(rows[1]):  # a row two processes hold: one document
            assert rows[0][r] == rows[1][r], (layout, step, rows)
        batch = {**rows[0], **rows[1]}
        assert sorted(batch) == list(range(8))
        assert len(set(batch.values())) == 8, batch  # no document twice in a batch
    if layout.startswith("pipeline"):  # each process reads the whole stream, in order
        assert [sorted(s.values()) for s in seen[0]] == [list(range(8)), list(range(8, 16))]


def test_a_stream_position_dealt_over_other_blocks_is_refused():
    """A stream position saved where the batch was dealt over 2 blocks of rows (2 x 4
    devices, fsdp over both processes), resumed where every process holds every row
    (``pipeline=2`` across them): this process's Grain state is for half of the stream, so
    it cannot continue the other layout's order (was: accepted, and read from the wrong
    place). The position here is this 1-process loader's own, with the count the 2-process
    run records."""
    import grain

    docs = [np.full(17, i, np.int32) for i in range(32)]
    config = jc.InputConfig(global_batch_size=8, seq_len=16, mode="pad")
    loader = jc.Loader(grain.MapDataset.source(docs).to_iter_dataset(), config)
    next(loader)
    state = loader.state_dict()
    assert state["stream_blocks"] == 1
    again = jc.Loader(grain.MapDataset.source(docs).to_iter_dataset(), config)
    again.load_state_dict(state)  # the same deal resumes
    assert next(again)["tokens"][0, 0] == 8
    with pytest.raises(jc.ConfigError, match=r"dealt over 2 blocks .* over 1") as info:
        again.load_state_dict({**state, "stream_blocks": 2})
    assert "\n" not in str(info.value)
    loader.close()
    again.close()

"""FLOP counts, MFU, memory, traces and ahead-of-time estimates against hand numbers."""

import gc
import io
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from rich.console import Console

import jaxcore as jc
from jaxcore import profiling as prof
from jaxcore.models import Transformer, TransformerConfig, lm_loss, training_flops_per_token
from jaxcore.progress import TrainProgress, format_info

from .helpers import CFG, SEQ, factory

B, D, F = 32, 64, 256


class MLP(nnx.Module):
    """y = relu(x @ w1) @ w2: 2*B*D*F + 2*B*F*D forward FLOPs, by hand."""

    def __init__(self, rngs: nnx.Rngs):
        self.w1 = nnx.Param(jax.random.normal(rngs.params(), (D, F)) * 0.1)
        self.w2 = nnx.Param(jax.random.normal(rngs.params(), (F, D)) * 0.1)

    def __call__(self, x):
        return jax.nn.relu(x @ self.w1[...]) @ self.w2[...]


HAND_FORWARD = {"w1": 2 * B * D * F, "w2": 2 * B * F * D}


def test_module_table_matches_hand_count():
    table = prof.module_table(MLP(nnx.Rngs(0)), jax.ShapeDtypeStruct((B, D), jnp.float32))
    rows = {r.name: r for r in table.rows}
    assert {k: rows[k].forward_flops for k in HAND_FORWARD} == HAND_FORWARD
    assert rows["w1"].params == D * F and rows["w2"].params == F * D
    assert table.train_flops == 3 * sum(HAND_FORWARD.values())
    assert "w1" in table.render() and "total" in table.render()


def test_module_table_of_the_transformer_matches_its_flop_formula():
    cfg = TransformerConfig.tiny(n_layers=3)
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))  # never allocated
    table = prof.module_table(model, jax.ShapeDtypeStruct((2, SEQ), jnp.int32))
    # Scanned layers count 3 times; attention's own matmuls land in "(activations)".
    assert table.train_flops == training_flops_per_token(cfg, SEQ) * 2 * SEQ
    assert table.total_params == jc.models.count_params(cfg)
    rows = {r.name: r for r in table.rows}
    assert rows["wq"].forward_flops == 3 * 2 * (2 * SEQ) * cfg.d_model * cfg.n_heads * cfg.head_size
    assert rows["(activations)"].forward_flops == 3 * 4 * 2 * cfg.n_heads * SEQ**2 * cfg.head_size


def test_mfu_of_an_mlp_train_step_with_known_flops():
    model = MLP(nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    @jax.jit
    def train(params, x):
        def loss(p):
            return jnp.mean(nnx.merge(graphdef, p)(x) ** 2)

        g = jax.grad(loss)(params)
        return jax.tree.map(lambda a, b: a - 0.1 * b, params, g)

    x = jnp.ones((B, D))
    hand = 6.0 * (B * D * F + B * F * D)
    xla = prof.compiled_flops(train.lower(params, x).compile())
    # The program runs 5 matmuls, not 6: nobody needs the gradient of the input x. The
    # 6N model-FLOP convention counts it anyway; XLA adds elementwise work (a few %).
    executed = 5 * 2 * B * D * F
    assert executed <= xla < 1.05 * executed

    ticks = iter([0.0, 0.5, 0.75, 1.0, 1.25])  # first step (compile) 0.5 s, then 0.25 s each
    meter = prof.StepMeter(
        tokens_per_step=B, flops_per_step=hand, peak_flops=1e9, clock=lambda: next(ticks)
    )
    for _ in range(4):
        stats = meter.update(train(params, x))
    assert stats.step_time_s == pytest.approx(0.25)
    assert stats.tokens_per_s == pytest.approx(B / 0.25)
    assert stats.mfu == pytest.approx(hand / 0.25 / 1e9)
    assert prof.mfu(hand, 0.25, 1e9) == stats.mfu
    with pytest.raises(jc.ConfigError, match="positive"):
        prof.mfu(hand, 0.0, 1e9)


def test_peak_table_and_measured_peak():
    h100 = SimpleNamespace(device_kind="NVIDIA H100 80GB HBM3")
    assert prof.peak_flops(h100, jnp.bfloat16) == 989e12
    assert prof.peak_flops(SimpleNamespace(device_kind="NVIDIA H100 PCIe"), "bf16") == 756e12
    assert prof.peak_flops(SimpleNamespace(device_kind="TPU v5 lite"), "bf16") == 197e12
    assert prof.peak_flops(jax.devices()[0]) is None  # CPUs are measured, not looked up
    measured = prof.measure_matmul_peak(256, repeats=2)
    assert 1e8 < measured < 1e13


def test_device_memory_falls_back_to_array_accounting():
    device = jax.devices()[3]
    # The count covers every live array on the device, and another test's leftovers in
    # this process (pending async work, garbage) can appear between two snapshots: one
    # fresh-clone run saw 48 stray bytes. Each attempt places a new 1 MiB array; a wrong
    # count fails every attempt, a stray array only the one it lands in.
    deltas = []
    for _ in range(3):
        gc.collect()
        before = {m.device: m for m in prof.device_memory([device])}[str(device)]
        assert before.source == "arrays"  # CPU devices have no allocator statistics
        x = jax.device_put(np.ones((256, 1024), np.float32), device)  # 1 MiB
        after = prof.device_memory([device])[0]
        deltas.append(after.in_use - before.in_use)
        if deltas[-1] == x.nbytes:
            break
        del x  # freed before the next attempt's baseline
    assert deltas[-1] == 1 << 20, deltas
    assert after.peak >= after.in_use
    report = prof.memory_report()
    assert report.num_devices == 8 and report.max_in_use >= 1 << 20
    assert report.max_host_rss > 0 and report.max_host_rss_peak >= report.max_host_rss


def test_trace_window_writes_a_trace(tmp_path):
    f = jax.jit(lambda x: x @ x)
    x = jnp.ones((64, 64))
    trace = prof.TraceWindow(tmp_path, start=1, num_steps=2)
    for step in range(5):
        with trace.step(step):
            y = f(x)
        trace.after(step, y)
    assert trace.done and not trace.active
    assert list(tmp_path.rglob("*.xplane.pb")), list(tmp_path.rglob("*"))


@pytest.fixture(scope="module")
def estimates():
    batch = {"tokens": ((16, SEQ + 1), jnp.int32)}
    out = {}
    for zero in (0, 3):
        engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=zero)
        out[zero] = (
            prof.compile_estimate(engine, factory, optax.adamw(1e-3), lm_loss, batch),
            prof.abstract_state(engine, factory, optax.adamw(1e-3)),
        )
    return out


def test_aot_memory_estimate_zero3_below_zero0(estimates):
    (e0, s0), (e3, s3) = estimates[0], estimates[3]
    assert e3.per_device_bytes < e0.per_device_bytes
    # The state is an argument: its per-device share shrinks ~8x with ZeRO 3 (ZeRO 0 keeps
    # a full copy of parameters and Adam moments on every device).
    state0, state3 = jc.costs.sharded_bytes(s0), jc.costs.sharded_bytes(s3)
    assert state3 < state0 / 4
    assert e0.argument_bytes >= state0 and e3.argument_bytes >= state3
    assert e0.flops and e3.flops


def test_aot_estimate_allocates_nothing():
    before = len(jax.live_arrays())
    engine = jc.Engine(parallel=jc.ParallelConfig(fsdp=8), zero=3)
    state = prof.abstract_state(engine, factory, optax.adamw(1e-3))
    assert len(jax.live_arrays()) == before
    leaf = state.params["wq"]
    assert isinstance(leaf, jax.ShapeDtypeStruct)
    assert leaf.sharding.shard_shape(leaf.shape)[1] == CFG.d_model // 8


def test_progress_line_on_process_zero_only():
    stats = prof.StepStats(step=5, step_time_s=0.5, tokens_per_s=2048.0, flops_per_s=1e9, mfu=0.42)
    report = prof.MemoryReport(
        max_in_use=2**30,
        max_peak=2 * 2**30,
        total_in_use=8 * 2**30,
        num_devices=8,
        max_host_rss=3 * 2**30,
        max_host_rss_peak=3 * 2**30,
        source="arrays",
    )
    info = format_info(loss=np.float32(2.5), stats=stats, memory=report)
    assert info == (
        "loss 2.5000 | 2,048 tok/s | MFU 42.0% | dev 1.00/2.00 GiB (max in use/peak), host 3.00 GiB"
    )
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=False)
    with TrainProgress(10, console=console) as progress:
        progress.update(5, loss=2.5, stats=stats, memory=report)
    assert "MFU 42.0%" in buf.getvalue() and "5/10" in buf.getvalue()
    quiet = io.StringIO()
    with TrainProgress(10, console=Console(file=quiet), enabled=False) as progress:
        progress.update(5, loss=2.5)
    assert quiet.getvalue() == ""


def test_a_step_that_raises_inside_the_window_ends_the_trace(tmp_path):
    """The trace so far is written and the profiler freed: the next window starts (was
    "Profile has already been started" until the user called close())."""
    trace = prof.TraceWindow(tmp_path / "a", start=0, num_steps=3)
    with pytest.raises(ZeroDivisionError), trace.step(0):
        jnp.ones(3).block_until_ready()
        1 / 0  # noqa: B018
    assert trace.done and not trace.active
    assert list((tmp_path / "a").rglob("*.xplane.pb"))
    again = prof.TraceWindow(tmp_path / "b", start=0, num_steps=1)
    with again.step(0):
        y = jnp.ones(3) * 2
    again.after(0, y)
    assert list((tmp_path / "b").rglob("*.xplane.pb"))


def test_a_trace_directory_that_cannot_be_made_is_refused_when_built(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(jc.ConfigError, match=r"TraceWindow: cannot create .*file/trace"):
        prof.TraceWindow(tmp_path / "file" / "trace")

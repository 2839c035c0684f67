"""The training-speed paths: attention kernel selection, the GPU flags and check script,
the default precision per backend, and the pipeline's per-iteration work."""

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import jaxcore as jc
from jaxcore import trace_context
from jaxcore.models.transformer import (
    _heads_first_attention,
    attention_implementation,
    query_blocks,
)
from jaxcore.pipeline import PipelineConfig, scan_layers
from jaxcore.precision import default_precision
from jaxcore.remat import checkpoint_block
from jaxcore.sharding import DEFAULT_RULES
from jaxcore.xla_flags import GPU_FLAGS, compiler_options, flag_names, with_gpu_flags

from .helpers import factory

ROOT = Path(__file__).resolve().parents[2]


def fake_device(platform: str, kind: str):
    return types.SimpleNamespace(platform=platform, device_kind=kind)


@pytest.mark.parametrize(
    "platform, kind, dtype, expected",
    [
        ("cpu", "cpu", jnp.float32, "heads_first"),
        ("cpu", "cpu", jnp.bfloat16, "heads_first"),
        ("gpu", "NVIDIA H100 80GB HBM3", jnp.bfloat16, "cudnn"),
        ("gpu", "NVIDIA A100-SXM4-40GB", jnp.float16, "cudnn"),
        ("gpu", "NVIDIA H100 80GB HBM3", jnp.float32, "xla"),  # cuDNN takes 16-bit only
        ("gpu", "AMD Instinct MI300X", jnp.bfloat16, "xla"),
        ("tpu", "TPU v5 lite", jnp.bfloat16, "xla"),
    ],
)
def test_attention_kernel_by_backend_and_dtype(platform, kind, dtype, expected):
    assert attention_implementation(fake_device(platform, kind), dtype) == expected


def _qkv(seq, seed):
    """GQA inputs (2 queries per kv head) drawn on the host: no programs to compile."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, seq, 4, 8)).astype(np.float32)
    k, v = (rng.normal(size=(2, seq, 2, 8)).astype(np.float32) for _ in range(2))
    return q, k, v


def _reference(q, k, v, window):
    local = None if window is None else (window - 1, 0)
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=True, local_window_size=local, implementation="xla"
    )


@pytest.mark.parametrize("window", [None, 5])
def test_xla_fallback_matches_heads_first(window):
    # The accelerator fallback (xla) and the CPU path compute the same causal GQA; both in
    # one program (op-by-op dispatch would compile each of their ~20 primitives).
    both = jax.jit(
        lambda q, k, v: (_heads_first_attention(q, k, v, window), _reference(q, k, v, window))
    )
    got, ref = both(*_qkv(12, 0))
    np.testing.assert_allclose(got, ref, atol=2e-6)


@pytest.mark.parametrize("window", [None, 1, 40, 64, 65, 200])
def test_query_blocked_attention_matches_the_full_square(window):
    # 256 tokens: four query blocks of 64, each multiplying only the keys it can see; the
    # windows cross block edges (40 < 64 < 65 < 200), GQA with 2 queries per kv head.
    assert query_blocks(256) == 4 and query_blocks(128) == 1 and query_blocks(258) == 1

    def values_and_grads(q, k, v):
        def grad(f):
            return jax.grad(lambda q: jnp.sum(f(q, k, v, window) ** 2))(q)

        out, ref = _heads_first_attention(q, k, v, window), _reference(q, k, v, window)
        return out, ref, grad(_heads_first_attention), grad(_reference)

    out, ref, grad, ref_grad = jax.jit(values_and_grads)(*_qkv(256, 1))
    np.testing.assert_allclose(out, ref, atol=2e-6)
    np.testing.assert_allclose(grad, ref_grad, atol=2e-5)


def test_cpu_steps_compile_with_eigen_dots():
    # The CPU compiler options reach XLA: no YNNPACK fusion is left in the compiled dot.
    assert compiler_options("gpu") is None
    user = "--xla_cpu_experimental_ynn_fusion_type=individual_dot"
    assert compiler_options("cpu", user) is None  # the user's XLA_FLAGS value wins
    f = jax.jit(lambda a, b: a @ b, compiler_options=compiler_options("cpu", ""))
    x = jnp.ones((64, 64))
    assert "__ynn_fusion" not in f.lower(x, x).compile().as_text()
    assert "__ynn_fusion" in jax.jit(lambda a, b: a @ b).lower(x, x).compile().as_text()


def _layer_stack(ctx: trace_context.TraceContext, layers: int = 24):
    """The compiled gradient of a stack of remat-able layers under ``ctx``."""

    def block(h, w):
        return checkpoint_block(lambda h, w: jnp.tanh(jnp.tanh(h @ w) @ w))(h, w)

    def loss(p, x):
        with trace_context.tracing(ctx):
            return scan_layers(block, x, p).sum()

    args = jnp.full((layers, 128, 128), 0.01), jnp.ones((64, 128))
    return jax.jit(jax.grad(loss)).lower(*args).compile(), args


def test_unrolled_layers_leave_no_loop_and_the_same_gradients():
    unrolled, args = _layer_stack(trace_context.TraceContext(unroll_layers=True))
    scanned, _ = _layer_stack(trace_context.TraceContext(unroll_layers=False))
    assert " while(" not in unrolled.as_text()
    assert " while(" in scanned.as_text()
    np.testing.assert_allclose(unrolled(*args), scanned(*args), rtol=1e-6)


def test_cpu_plans_unroll_layers_unless_a_remat_policy_needs_the_scan():
    def context(**config):
        return jc.Engine(**config).plan(factory, optax.sgd(0.1)).trace_context()

    assert context().unroll_layers  # this suite runs on CPU
    assert not context(unroll_layers=False).unroll_layers
    full = context(remat="full")
    assert not full.unroll_layers and context(remat="full", unroll_layers=True).unroll_layers

    # Why remat keeps the scan: it must save memory, which it does only inside a loop.
    def temp_bytes(ctx):
        return _layer_stack(ctx)[0].memory_analysis().temp_size_in_bytes

    saved = temp_bytes(full)
    assert saved < 0.5 * temp_bytes(context()), "remat on CPU must still save memory"
    assert saved < 0.5 * temp_bytes(dataclasses.replace(full, unroll_layers=True))


def test_default_precision():
    assert default_precision("cpu") == "fp32"
    assert default_precision("gpu") == "bf16"
    assert default_precision("tpu") == "bf16"


def test_gpu_flags_keep_the_users_values():
    env = {"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false --xla_dump_to=/tmp/x"}
    flags = with_gpu_flags(env)["XLA_FLAGS"].split()
    assert "--xla_gpu_enable_latency_hiding_scheduler=false" in flags
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert flags[1] == "--xla_dump_to=/tmp/x"
    assert flag_names(" ".join(flags)) == set(GPU_FLAGS) | {"xla_dump_to"}
    assert with_gpu_flags({})["XLA_FLAGS"].count("--") == len(GPU_FLAGS)


def _gpu_check_dry_run(env: dict[str, str]) -> subprocess.CompletedProcess:
    """``bash benchmarks/gpu_check.sh --dry-run`` with ``env``, as a user types it."""
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_gpu_check_dry_run_on_cpu():
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    out = _gpu_check_dry_run(env)
    assert out.returncode == 0, out.stderr[-2000:]
    for words in ("mfu_cpu.py --device gpu --model base", "serving.py", "gpu_parity.py"):
        assert words in out.stdout
    assert '"attention": "heads_first"' in out.stdout
    assert "XLA accepted the flags" in out.stdout and "dry run ok" in out.stdout


def test_gpu_check_names_the_fix_when_python_has_no_jax(tmp_path):
    # Given a python that lacks jax: one line saying how to fix it, exit 2.
    (tmp_path / "jax.py").write_text("raise ImportError('no jax in this interpreter')\n")
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path)}
    out = _gpu_check_dry_run(env)
    assert out.returncode == 2
    assert "cannot import jax" in out.stderr and "PYTHON" in out.stderr


def test_gpu_check_uses_the_project_venv_from_a_plain_shell(tmp_path):
    # As the docs say it: `bash benchmarks/gpu_check.sh --dry-run` from a shell where the
    # venv is not activated (the system python has no jax). The project is laid out in
    # tmp_path with a .venv whose python records that it ran, so the test needs no venv
    # of its own and fails if the script takes any other interpreter.
    for part in ("benchmarks", "jaxcore"):
        (tmp_path / part).symlink_to(ROOT / part)
    ran = tmp_path / "venv_python_ran"
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\ntouch {ran}\nexec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "XLA_FLAGS", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(
        ["bash", str(tmp_path / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dry run ok" in out.stdout and ran.exists()


def _scan_bodies(jaxpr, inside=False):
    """Every variable shape in the bodies of the scans of ``jaxpr`` (nested included)."""
    shapes = []
    for eqn in jaxpr.eqns:
        if inside:
            shapes += [
                tuple(v.aval.shape) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")
            ]
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            shapes += _scan_bodies(sub, inside or eqn.primitive.name == "scan")
    return shapes


@pytest.mark.parametrize("wrt", ["params", "inputs"])
def test_pipeline_iterations_touch_one_microbatch_per_stage(wrt):
    # GPipe's loop (forward and backward) must not hold or index a buffer of the whole
    # batch: such a buffer costs each iteration time in proportion to M at a fixed batch.
    S, M, batch, feat, rows = 4, 8, 16, 6, 3
    mesh = Mesh(np.array(jax.devices()[:S]), ("pipeline",))
    ctx = trace_context.TraceContext(
        mesh=mesh, rules=DEFAULT_RULES, pipeline=PipelineConfig(stages=S, microbatches=M)
    )
    params = jnp.ones((S, feat, feat)) * 0.1
    x = jnp.ones((batch, rows, feat))
    extra = jnp.ones((batch, rows, 1))  # per-example arrays (rotary tables) ride along

    def loss(p, x):
        with trace_context.tracing(ctx):
            return scan_layers(lambda h, w, e: jnp.tanh(h @ w) * e, x, p, (extra,)).sum()

    argnum = 0 if wrt == "params" else 1
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=argnum))(params, x).jaxpr
    mb = batch // M
    whole = {(M, mb, rows, feat), (batch, rows, feat), (M, mb, rows, 1), (batch, rows, 1)}
    shapes = _scan_bodies(jaxpr)
    assert (S, mb, rows, feat) in shapes  # the stage buffer is in there
    assert not whole & set(shapes)
    with trace_context.tracing(ctx):
        got = jax.jit(jax.grad(loss, argnums=argnum))(params, x)
    ref = jax.jit(
        jax.grad(
            lambda p, x: jax.lax.scan(lambda h, w: (jnp.tanh(h @ w) * extra, None), x, p)[0].sum(),
            argnums=argnum,
        )
    )(params, x)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _profile_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import profile_step_cpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return profile_step_cpu


def test_profile_self_times_subtract_nested_spans_and_skip_wrappers():
    """An op's time is its own: the executor span around it keeps only its remainder."""
    prof = _profile_module()
    span = lambda name, ts, dur, tid=1: {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid}
    events = [
        span("$python_frame", 0, 100),
        span("ThunkExecutor::Execute (wait for completion)", 0, 100, tid=2),
        span("ThunkExecutor::Execute", 0, 90, tid=3),
        span("dot.3", 10, 30, tid=3),
        span("add_fusion", 40, 20, tid=3),
        span("copy", 45, 5, tid=3),  # nested in add_fusion
        span("dot.7", 0, 10, tid=4),  # another thread, same op name
    ]
    per_op = prof.self_times(events, steps=2)
    us = 1e-6 / 2
    assert per_op == pytest.approx(
        {"dot": 40 * us, "add_fusion": 15 * us, "copy": 5 * us, prof.UNNAMED: 40 * us}
    )

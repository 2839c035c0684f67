"""XLA flags: the accelerator set (latency-hiding scheduler, collectives) and CPU options.

XLA reads ``XLA_FLAGS`` once, when its backend starts, so these go into the environment of
a process before it imports JAX (``gpu_check.sh`` and launchers do that). The set is the
GPU subset MaxText runs its Llama-2 7B A3+ configs with
(``MaxText/configs/a3_plus/llama_2/7b/16vm.sh``): the latency-hiding scheduler overlaps
FSDP's all-gathers and reduce-scatters with compute, large combine thresholds merge
per-layer collectives into few big ones, and the pipelined collectives prefetch the next
scanned layer's weights while the current one computes.
"""

from __future__ import annotations

from collections.abc import MutableMapping

GPU_FLAGS: dict[str, str] = {
    "xla_gpu_enable_latency_hiding_scheduler": "true",
    "xla_gpu_enable_highest_priority_async_stream": "true",
    "xla_gpu_all_reduce_combine_threshold_bytes": str(128 * 2**20),
    "xla_gpu_all_gather_combine_threshold_bytes": str(128 * 2**20),
    "xla_gpu_reduce_scatter_combine_threshold_bytes": str(64 * 2**20),
    "xla_gpu_enable_pipelined_all_gather": "true",
    "xla_gpu_enable_pipelined_reduce_scatter": "true",
    "xla_gpu_enable_pipelined_all_reduce": "true",
    "xla_gpu_enable_while_loop_double_buffering": "true",
}


# Per-compilation options for CPU programs (passed to ``jax.jit(compiler_options=...)``, so
# no process restart is needed). An empty YNNPACK fusion list sends XLA:CPU's dots to its
# Eigen kernels instead of YNNPACK's (the jaxlib 0.10 default, ``individual_dot``): the
# train steps of the d=256 and d=512 reference decoders ran faster with Eigen's, same
# losses (benchmarks/training_speed.md, "XLA CPU options").
CPU_COMPILER_OPTIONS: dict[str, str] = {"xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(platform: str, xla_flags: str | None = None) -> dict[str, str] | None:
    """The ``compiler_options`` jaxcore's jitted steps use on ``platform`` (None: XLA's).

    An option the user set in ``XLA_FLAGS`` (default: the environment's) is left out, so
    the user's value applies, e.g. ``--xla_cpu_experimental_ynn_fusion_type=individual_dot``
    brings YNNPACK's dots back.
    """
    if platform != "cpu":
        return None
    import os

    mine = flag_names(os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags)
    return {k: v for k, v in CPU_COMPILER_OPTIONS.items() if k not in mine} or None


def flag_names(xla_flags: str) -> set[str]:
    """Names of the flags set in an ``XLA_FLAGS`` string (``--name=value`` or ``--name``)."""
    return {f.lstrip("-").split("=", 1)[0] for f in xla_flags.split() if f.startswith("--")}


def with_gpu_flags(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add `GPU_FLAGS` to ``env["XLA_FLAGS"]``; a flag the user set keeps the user's value."""
    current = env.get("XLA_FLAGS", "")
    mine = flag_names(current)
    extra = [f"--{k}={v}" for k, v in GPU_FLAGS.items() if k not in mine]
    env["XLA_FLAGS"] = " ".join([*current.split(), *extra])
    return env


if __name__ == "__main__":  # `python jaxcore/xla_flags.py`: print them without importing jax
    import os

    print(with_gpu_flags(dict(os.environ))["XLA_FLAGS"])

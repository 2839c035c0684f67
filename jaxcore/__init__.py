"""jaxcore: one engine for data, FSDP (ZeRO 1-3), tensor and pipeline parallelism.

A `jax.sharding.Mesh` plus a table of logical-axis rules expresses the layout; the same
jitted train step runs on 1 CPU, 8 fake CPU devices, a GPU node or a TPU pod.

Names are resolved lazily (PEP 562): ``import jaxcore`` imports neither JAX nor any
submodule, so a process that needs one part (a pure-Python experiment trial, ``jaxcore
data``, the dashboard) does not pay ~3 CPU-seconds for all of them. ``jaxcore.Engine``
imports `jaxcore.engine` on first use. Nothing here has import side effects to lose: JAX
settings are applied by the functions that need them (`jaxcore.distributed.initialize`,
`jaxcore.run`), never by importing a module (tests/jaxcore/test_lazy_import.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# module -> the public names it defines. Also listed under TYPE_CHECKING below, for type
# checkers and IDEs; tests/jaxcore/test_lazy_import.py checks that the two agree.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "jaxcore.adapters": ("ModelAdapter",),
    "jaxcore.checkpoint": ("CheckpointConfig", "Checkpointer", "CheckpointError", "Preempted"),
    "jaxcore.checkpointing.preemption": ("PreemptionWatch",),
    "jaxcore.checkpointing.portable": (
        "export_checkpoint",
        "load_params",
        "read_params",
        "save_params",
    ),
    "jaxcore.distributed": ("ClusterSettings", "CoordinatorTimeoutError", "detect", "initialize"),
    "jaxcore.engine": ("Engine", "EngineConfig"),
    "jaxcore.errors": (
        "BatchError",
        "ConfigError",
        "JaxcoreError",
        "StateError",
        "TrainingDivergedError",
    ),
    "jaxcore.gather": ("EvalGatherer", "gather"),
    "jaxcore.input": ("InputConfig", "Loader", "ResumableLoader", "StdlibSource", "stdlib_source"),
    "jaxcore.launch": ("LaunchError",),
    "jaxcore.mesh": ("MESH_AXES", "ParallelConfig", "build_mesh"),
    "jaxcore.metrics": ("MeanMetrics",),
    "jaxcore.nonfinite": ("NonFiniteState",),
    "jaxcore.notebook": ("notebook_launcher",),
    "jaxcore.pipeline": ("PipelineConfig", "scan_layers"),
    "jaxcore.plan": ("TrainPlan",),
    "jaxcore.precision": ("LossScaleConfig", "PrecisionPolicy", "default_precision"),
    "jaxcore.profiling": (
        "StepMeter",
        "compile_estimate",
        "measure_matmul_peak",
        "memory_report",
        "module_table",
    ),
    "jaxcore.progress": ("TrainProgress",),
    "jaxcore.remat": ("checkpoint_block",),
    "jaxcore.runtime": ("PREEMPTION_EXIT_CODE", "ensure_malloc_tuning"),
    "jaxcore.seeding": ("process_key", "seed_everything"),
    "jaxcore.sharding": (
        "DEFAULT_RULES",
        "ShardingPlan",
        "batch_spec",
        "constrain",
        "logical_sharding",
        "per_device_bytes",
    ),
    "jaxcore.state": ("TrainState",),
    "jaxcore.step": ("EvalStep", "TrainStep"),
    "jaxcore.text_input": ("TextSource",),
    "jaxcore.tokenization": ("load_tokenizer",),
}
# Public submodules, reachable as attributes (``jaxcore.models.Transformer``). The
# experiment layer needs the `experiments` extra (Optuna, SQLAlchemy) only when used.
_SUBMODULES = {
    "axes": "jaxcore.axes",
    "models": "jaxcore.models",
    "profiling": "jaxcore.profiling",
    "experiments": "jaxcore.experiments",
    "registry": "jaxcore.experiments.registry",
    "compression": "jaxcore.compression",  # pruning, distillation, QAT
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

# Literal, so that linters and `from jaxcore import *` see it without importing anything.
__all__ = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "PREEMPTION_EXIT_CODE",
    "BatchError",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "ClusterSettings",
    "ConfigError",
    "CoordinatorTimeoutError",
    "Engine",
    "EngineConfig",
    "EvalGatherer",
    "EvalStep",
    "InputConfig",
    "JaxcoreError",
    "LaunchError",
    "Loader",
    "LossScaleConfig",
    "MeanMetrics",
    "ModelAdapter",
    "NonFiniteState",
    "ParallelConfig",
    "PipelineConfig",
    "PrecisionPolicy",
    "Preempted",
    "PreemptionWatch",
    "ResumableLoader",
    "ShardingPlan",
    "StateError",
    "StdlibSource",
    "StepMeter",
    "TextSource",
    "TrainPlan",
    "TrainProgress",
    "TrainState",
    "TrainStep",
    "TrainingDivergedError",
    "axes",
    "batch_spec",
    "build_mesh",
    "checkpoint_block",
    "compile_estimate",
    "constrain",
    "default_precision",
    "detect",
    "ensure_malloc_tuning",
    "export_checkpoint",
    "gather",
    "initialize",
    "load_params",
    "load_tokenizer",
    "logical_sharding",
    "measure_matmul_peak",
    "memory_report",
    "models",
    "module_table",
    "notebook_launcher",
    "per_device_bytes",
    "process_key",
    "profiling",
    "read_params",
    "save_params",
    "scan_layers",
    "seed_everything",
    "stdlib_source",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    elif not name.startswith("__") and importlib.util.find_spec(f"jaxcore.{name}"):
        # Any other submodule as an attribute (``jc.costs``), as eager imports allowed.
        value = importlib.import_module(f"jaxcore.{name}")
    else:
        raise AttributeError(f"module 'jaxcore' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})


class _Package(types.ModuleType):
    """Keeps a public name that shares its module's name (`jaxcore.gather`, the function)
    from being replaced by that module when something imports it (`import jaxcore.gather`
    binds the attribute ``gather`` of this package), as the eager imports did."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _WHERE.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:
    from jaxcore import axes, models, profiling
    from jaxcore.adapters import ModelAdapter
    from jaxcore.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, Preempted
    from jaxcore.checkpointing.portable import (
        export_checkpoint,
        load_params,
        read_params,
        save_params,
    )
    from jaxcore.checkpointing.preemption import PreemptionWatch
    from jaxcore.distributed import ClusterSettings, CoordinatorTimeoutError, detect, initialize
    from jaxcore.engine import Engine, EngineConfig
    from jaxcore.errors import (
        BatchError,
        ConfigError,
        JaxcoreError,
        StateError,
        TrainingDivergedError,
    )
    from jaxcore.gather import EvalGatherer, gather
    from jaxcore.input import InputConfig, Loader, ResumableLoader, StdlibSource, stdlib_source
    from jaxcore.launch import LaunchError
    from jaxcore.mesh import MESH_AXES, ParallelConfig, build_mesh
    from jaxcore.metrics import MeanMetrics
    from jaxcore.nonfinite import NonFiniteState
    from jaxcore.notebook import notebook_launcher
    from jaxcore.pipeline import PipelineConfig, scan_layers
    from jaxcore.plan import TrainPlan
    from jaxcore.precision import LossScaleConfig, PrecisionPolicy, default_precision
    from jaxcore.profiling import (
        StepMeter,
        compile_estimate,
        measure_matmul_peak,
        memory_report,
        module_table,
    )
    from jaxcore.progress import TrainProgress
    from jaxcore.remat import checkpoint_block
    from jaxcore.runtime import PREEMPTION_EXIT_CODE, ensure_malloc_tuning
    from jaxcore.seeding import process_key, seed_everything
    from jaxcore.sharding import (
        DEFAULT_RULES,
        ShardingPlan,
        batch_spec,
        constrain,
        logical_sharding,
        per_device_bytes,
    )
    from jaxcore.state import TrainState
    from jaxcore.step import EvalStep, TrainStep
    from jaxcore.text_input import TextSource
    from jaxcore.tokenization import load_tokenizer

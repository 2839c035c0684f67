"""jaxcore: one engine for data, FSDP (ZeRO 1-3), tensor and pipeline parallelism.

A `jax.sharding.Mesh` plus a table of logical-axis rules expresses the layout; the same
jitted train step runs on 1 CPU, 8 fake CPU devices, a GPU node or a TPU pod.
"""

from jaxcore import axes, models, profiling
from jaxcore.adapters import ModelAdapter
from jaxcore.checkpoint import (
    PREEMPTION_EXIT_CODE,
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    Preempted,
)
from jaxcore.checkpointing.portable import (
    export_checkpoint,
    load_params,
    read_params,
    save_params,
)
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
from jaxcore.runtime import ensure_malloc_tuning
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

__version__ = "0.1.0"

# The experiment layer needs the `experiments` extra (Optuna, SQLAlchemy): loaded on first
# use so that `import jaxcore` works without it.
_LAZY = {"experiments": "jaxcore.experiments", "registry": "jaxcore.experiments.registry"}
_LAZY["compression"] = "jaxcore.compression"  # pruning, distillation, QAT


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(_LAZY[name])
    raise AttributeError(f"module 'jaxcore' has no attribute {name!r}")


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

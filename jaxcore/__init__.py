"""jaxcore: one engine for data, FSDP (ZeRO 1-3), tensor and pipeline parallelism.

A `jax.sharding.Mesh` plus a table of logical-axis rules expresses the layout; the same
jitted train step runs on 1 CPU, 8 fake CPU devices, a GPU node or a TPU pod.
"""

from jaxcore import axes, models
from jaxcore.adapters import ModelAdapter
from jaxcore.checkpoint import (
    PREEMPTION_EXIT_CODE,
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    Preempted,
)
from jaxcore.checkpointing.portable import export_checkpoint, load_params, save_params
from jaxcore.engine import Engine, EngineConfig
from jaxcore.errors import BatchError, ConfigError, JaxcoreError
from jaxcore.input import InputConfig, Loader, StdlibSource, stdlib_source
from jaxcore.mesh import MESH_AXES, ParallelConfig, build_mesh
from jaxcore.metrics import MeanMetrics
from jaxcore.pipeline import PipelineConfig, scan_layers
from jaxcore.precision import LossScaleConfig, PrecisionPolicy
from jaxcore.remat import checkpoint_block
from jaxcore.sharding import DEFAULT_RULES, constrain, per_device_bytes
from jaxcore.state import TrainState

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "PREEMPTION_EXIT_CODE",
    "BatchError",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "InputConfig",
    "JaxcoreError",
    "Loader",
    "LossScaleConfig",
    "MeanMetrics",
    "ModelAdapter",
    "ParallelConfig",
    "PipelineConfig",
    "PrecisionPolicy",
    "Preempted",
    "StdlibSource",
    "TrainState",
    "axes",
    "build_mesh",
    "checkpoint_block",
    "constrain",
    "export_checkpoint",
    "load_params",
    "models",
    "per_device_bytes",
    "save_params",
    "scan_layers",
    "stdlib_source",
]

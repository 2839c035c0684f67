"""Compression: magnitude and structured pruning, distillation and int8 QAT.

Every method runs through the engine (sharding, ZeRO, checkpoints): pruning masks live
in the optimizer state, the distillation teacher is a second model in the prepared pair,
QAT wraps the loss. See the README section "Compression".
"""

from jaxcore.compression.distill import (
    DistillPair,
    distill_loss,
    distill_pair,
    kd_loss,
    load_teacher,
    student_from_teacher,
    student_only,
)
from jaxcore.compression.evaluate import decoding_weights_of, perplexity, text_batches
from jaxcore.compression.int8 import CONTRACTED_AXES, fake_quant, int8_quantize, int8_scale
from jaxcore.compression.magnitude import SparsitySchedule, magnitude_mask
from jaxcore.compression.masks import (
    DEFAULT_TARGETS,
    PruningState,
    find_masks,
    magnitude_pruning,
    sparsity_report,
)
from jaxcore.compression.qat import fake_quantize_params, qat_loss
from jaxcore.compression.report import MethodReport, format_table, method_report, weight_bytes
from jaxcore.compression.structured import (
    Structure,
    mask_structure,
    select,
    shrink,
    unit_scores,
)

__all__ = [
    "CONTRACTED_AXES",
    "DEFAULT_TARGETS",
    "DistillPair",
    "MethodReport",
    "PruningState",
    "SparsitySchedule",
    "Structure",
    "decoding_weights_of",
    "distill_loss",
    "distill_pair",
    "fake_quant",
    "fake_quantize_params",
    "find_masks",
    "format_table",
    "int8_quantize",
    "int8_scale",
    "kd_loss",
    "load_teacher",
    "magnitude_mask",
    "magnitude_pruning",
    "mask_structure",
    "method_report",
    "perplexity",
    "qat_loss",
    "select",
    "shrink",
    "sparsity_report",
    "student_from_teacher",
    "student_only",
    "text_batches",
    "unit_scores",
    "weight_bytes",
]

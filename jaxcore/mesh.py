"""The parallel layout: four named mesh axes and the validated object that builds the mesh.

Axes, outermost to innermost (inner axes get the fastest links):

- ``data``: pure data parallelism (the default rules split the batch over it). Each group
  holds a full copy of whatever is not sharded over ``fsdp``; gradients are all-reduced
  over it. Across slices or hosts this is
  the axis that goes over the data-centre network (DCN).
- ``pipeline``: pipeline stages. Stacked layers (logical axis ``layers``) are split
  over it; a schedule moves activations between stages (``jaxcore.pipeline``).
- ``fsdp``: the batch is split over it like ``data`` (by the default rules table, which
  alone decides the batch's axes: ``jaxcore.sharding``); in addition the ZeRO stage decides
  whether optimizer state (1), gradients (2) and parameters (3) are sharded over it.
- ``tensor``: tensor (Megatron) parallelism: heads, MLP hidden units and the vocabulary
  are split over it. It is the innermost axis because it communicates every layer.

The idea of one validated object that owns the layout comes from torchtitan's
``ParallelDims``; the hybrid ICI x DCN construction follows MaxText's ``create_device_mesh``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from jaxcore.errors import ConfigError, check_keywords

log = logging.getLogger(__name__)

MESH_AXES = ("data", "pipeline", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """How many ways each mesh axis splits the devices.

    Attributes:
        data: data-parallel replicas.
        fsdp: fully-sharded data parallel ways (what is sharded depends on the ZeRO stage).
        tensor: tensor-parallel ways (heads, MLP, vocabulary).
        pipeline: pipeline stages.

    One field may be ``-1``: it takes the devices the others leave. The product of the
    sizes must equal the number of devices.
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    pipeline: int = 1

    def __new__(cls, *args: object, **kwargs: object) -> ParallelConfig:
        # A mistyped axis is a ConfigError naming the one meant, not a TypeError.
        check_keywords("ParallelConfig", [f.name for f in dataclasses.fields(cls)], kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        sizes = self.sizes()
        fills = [name for name, size in sizes.items() if size == -1]
        if len(fills) > 1:
            raise ConfigError(
                f"ParallelConfig: {', '.join(fills)} are all -1; at most one axis may take "
                "'the rest' of the devices. Give the others explicit sizes."
            )
        for name, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or (size < 1 and size != -1):
                raise ConfigError(
                    f"ParallelConfig.{name}={size!r}: axis sizes must be positive integers "
                    "(or -1 for 'the rest of the devices')."
                )

    def sizes(self) -> dict[str, int]:
        """Axis sizes keyed by mesh axis name, in mesh order."""
        return {name: getattr(self, name) for name in MESH_AXES}

    def resolve(self, num_devices: int) -> ParallelConfig:
        """Return a copy with ``-1`` filled in, checked against ``num_devices``."""
        sizes = self.sizes()
        known = math.prod(s for s in sizes.values() if s != -1)
        fill = [name for name, size in sizes.items() if size == -1]
        if fill:
            if num_devices % known:
                raise ConfigError(
                    f"ParallelConfig({self._describe()}): the fixed axes multiply to {known}, "
                    f"which does not divide the {num_devices} devices, so '{fill[0]}=-1' "
                    f"cannot be filled. Choose sizes whose product divides {num_devices}."
                )
            sizes[fill[0]] = num_devices // known
        elif known != num_devices:
            raise ConfigError(
                f"ParallelConfig({self._describe()}): the axes multiply to {known} but there "
                f"are {num_devices} devices. Make the product equal {num_devices}, or set one "
                "axis to -1 to take the rest."
            )
        return ParallelConfig(**sizes)

    def _describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.sizes().items() if v != 1)


def _num_granules(devices: Sequence[jax.Device]) -> tuple[int, bool]:
    """Number of slices (TPU multislice) or processes, and whether processes are the unit."""
    slices = {getattr(d, "slice_index", None) for d in devices}
    if len(slices) > 1 and None not in slices:
        return len(slices), False
    return len({d.process_index for d in devices}), True


def _dcn_shape(sizes: dict[str, int], granules: int) -> list[int]:
    """Put the slow (cross-host) split on the outermost axis that can take it."""
    for name in ("data", "pipeline", "fsdp"):
        if sizes[name] % granules == 0:
            dcn = [1] * len(MESH_AXES)
            dcn[MESH_AXES.index(name)] = granules
            return dcn
    raise ConfigError(
        f"ParallelConfig: {granules} hosts/slices must divide one of data, pipeline or fsdp "
        f"(got {sizes}); tensor parallelism should stay inside a host. Make data or fsdp a "
        f"multiple of {granules}."
    )


def build_mesh(parallel: ParallelConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build the 4-axis mesh for ``parallel`` over ``devices`` (all devices by default).

    With several hosts or slices the mesh is hybrid: the cross-host split goes on the
    outermost axis that divides (data, then pipeline, then fsdp) so that tensor and fsdp
    collectives stay on the fast in-host links.
    """
    devices = list(jax.devices() if devices is None else devices)
    resolved = parallel.resolve(len(devices))
    sizes = resolved.sizes()
    shape = [sizes[name] for name in MESH_AXES]
    granules, by_process = _num_granules(devices)
    if granules > 1:
        dcn = _dcn_shape(sizes, granules)
        ici = [s // d for s, d in zip(shape, dcn, strict=True)]
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, process_is_granule=by_process, allow_split_physical_axes=True
        )
    elif devices[0].platform == "tpu":
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    else:
        grid = np.asarray(devices).reshape(shape)
    log.info("mesh %s over %d devices", dict(zip(MESH_AXES, shape, strict=True)), len(devices))
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))

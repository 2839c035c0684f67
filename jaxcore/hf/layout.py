"""How each native parameter is laid out in a Hugging Face Llama-family checkpoint.

Native weights put the contracted dimension first and stack layers (``wq: (layers,
d_model, heads, head_dim)``); Hugging Face stores one ``nn.Linear`` weight per layer,
``(out_features, in_features)`` with heads and head_dim merged (``q_proj.weight:
(heads * head_dim, d_model)``). A `TensorMap` names the dimensions of both sides with
letters, so one description serves reading a slice (load) and writing (save):

    wq:  native "l" + "dhk"   <-  hf ("hk", "d") per layer  (h heads, k head_dim, d model)

Both layouts use the rotate-half RoPE convention, so q/k need no permutation (unlike
Meta's original checkpoints, which the HF conversion script already permuted).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxcore.models.transformer import TransformerConfig

Index = tuple[slice, ...]


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One native parameter and the HF tensor(s) it comes from.

    Attributes:
        native: key in the native parameter dict.
        hf: HF tensor name; ``{i}`` is the layer index when ``stacked``.
        hf_dims: the HF tensor's dimensions, each a string of letters (merged dims,
            outermost first).
        native_dims: letters of the native dims (without the layer dim).
        stacked: the native parameter stacks one HF tensor per layer on a leading axis.
    """

    native: str
    hf: str
    hf_dims: tuple[str, ...]
    native_dims: str
    stacked: bool = True

    def hf_name(self, layer: int | None = None) -> str:
        return self.hf.format(i=layer)

    @property
    def letters(self) -> str:
        """The HF side's letters in order (the view before the transpose)."""
        return "".join(self.hf_dims)


def sizes(cfg: TransformerConfig) -> dict[str, int]:
    """Size of each dimension letter."""
    L, D, H, K, Dh, F, V = cfg.dims
    return {"l": L, "d": D, "h": H, "g": K, "k": Dh, "f": F, "v": V}


def tensor_maps(cfg: TransformerConfig) -> list[TensorMap]:
    """Every native parameter of a `Transformer` with ``cfg``, in HF's terms."""
    layer = "model.layers.{i}."
    maps = [
        TensorMap("embed", "model.embed_tokens.weight", ("v", "d"), "vd", stacked=False),
        TensorMap("attn_norm", layer + "input_layernorm.weight", ("d",), "d"),
        TensorMap("wq", layer + "self_attn.q_proj.weight", ("hk", "d"), "dhk"),
        TensorMap("wk", layer + "self_attn.k_proj.weight", ("gk", "d"), "dgk"),
        TensorMap("wv", layer + "self_attn.v_proj.weight", ("gk", "d"), "dgk"),
        TensorMap("wo", layer + "self_attn.o_proj.weight", ("d", "hk"), "hkd"),
        TensorMap("mlp_norm", layer + "post_attention_layernorm.weight", ("d",), "d"),
        TensorMap("w_gate", layer + "mlp.gate_proj.weight", ("f", "d"), "df"),
        TensorMap("w_up", layer + "mlp.up_proj.weight", ("f", "d"), "df"),
        TensorMap("w_down", layer + "mlp.down_proj.weight", ("d", "f"), "fd"),
        TensorMap("final_norm", "model.norm.weight", ("d",), "d", stacked=False),
    ]
    if cfg.qkv_bias:
        maps += [
            TensorMap("bq", layer + "self_attn.q_proj.bias", ("hk",), "hk"),
            TensorMap("bk", layer + "self_attn.k_proj.bias", ("gk",), "gk"),
            TensorMap("bv", layer + "self_attn.v_proj.bias", ("gk",), "gk"),
        ]
    if not cfg.tie_embeddings:
        maps.append(TensorMap("lm_head", "lm_head.weight", ("v", "d"), "dv", stacked=False))
    return maps


def native_shape(m: TensorMap, size: dict[str, int]) -> tuple[int, ...]:
    """The native parameter's shape (layers first when stacked)."""
    return tuple(size[c] for c in ("l" * m.stacked) + m.native_dims)


def hf_shape(m: TensorMap, size: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(size[c] for c in group) for group in m.hf_dims)


def hf_read_plan(
    m: TensorMap, index: Index, size: dict[str, int]
) -> tuple[Index, tuple[int, ...], Index]:
    """What to read for the native slice ``index`` (without the layer dim) of one layer.

    Returns the HF slice to read, the letter-wise shape it reshapes to, and the slice
    still to apply on that view. A merged HF dim is read as one contiguous range of its
    outer letter; inner letters (head_dim) are read whole, then cut (the rules never
    shard them, so this reads nothing extra in practice).
    """
    by_letter = {c: index[i].indices(size[c]) for i, c in enumerate(m.native_dims)}
    read, view, rest = [], [], []
    for group in m.hf_dims:
        outer, inner = group[0], group[1:]
        start, stop, _ = by_letter[outer]
        stride = math.prod(size[c] for c in inner)
        read.append(slice(start * stride, stop * stride))
        view.append(stop - start)
        rest.append(slice(None))
        for c in inner:
            view.append(size[c])
            lo, hi, _ = by_letter[c]
            rest.append(slice(lo, hi))
    return tuple(read), tuple(view), tuple(rest)


def to_native(m: TensorMap, block: np.ndarray, view: tuple[int, ...], rest: Index) -> np.ndarray:
    """An HF slice (as read) in native order."""
    arr = block.reshape(view)[rest]
    return arr.transpose([m.letters.index(c) for c in m.native_dims])


def to_hf(m: TensorMap, native: np.ndarray, size: dict[str, int]) -> np.ndarray:
    """One layer's (or an unstacked) native array in HF layout."""
    arr = native.transpose([m.native_dims.index(c) for c in m.letters])
    return np.ascontiguousarray(arr.reshape(hf_shape(m, size)))

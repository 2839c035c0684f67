"""A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention.

The layers' weights are stacked along a leading ``layers`` axis and applied with
``lax.scan``: one compiled block instead of L (faster compiles; on the 2-core CPU
machines the scanned step also ran 1.15-1.35x faster, see PERF-NOTES.md), and the
``layers`` axis is what pipeline parallelism splits into stages. Every parameter carries
logical axis names (``logical_axes`` metadata) that the sharding rules map to the mesh.

Weight layouts put the contracted dimension first (``x @ W`` with ``W: (in, out)``),
so neither the forward nor the weight-gradient matmuls need transposed copies.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcore import axes
from jaxcore.errors import ConfigError
from jaxcore.pipeline import scan_layers
from jaxcore.remat import checkpoint_block
from jaxcore.sharding import constrain

ACT = (axes.BATCH, axes.LENGTH, axes.EMBED)
ROPE_KINDS = ("linear", "llama3")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Rotary frequency scaling for long contexts, as Hugging Face's ``rope_parameters``.

    ``kind="linear"`` divides every frequency by ``factor`` (position interpolation);
    ``kind="llama3"`` divides only the low frequencies (wavelengths above
    ``original_max_position_embeddings / low_freq_factor``) and blends the band between
    the two cut-offs (Llama 3.1's ``rope_type: llama3``).
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ROPE_KINDS:
            raise ConfigError(
                f"RopeScaling.kind={self.kind!r} is not supported; use one of {ROPE_KINDS} "
                "(or rope_scaling=None for plain RoPE)."
            )
        if self.factor <= 0:
            raise ConfigError(f"RopeScaling.factor={self.factor} must be > 0.")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ConfigError(
                f"RopeScaling: high_freq_factor={self.high_freq_factor} must be greater than "
                f"low_freq_factor={self.low_freq_factor} (llama3 scaling)."
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Shape of the decoder.

    Attributes:
        vocab_size: number of token ids (256 = raw bytes).
        d_model: width of the residual stream.
        n_layers: number of decoder blocks.
        n_heads: query heads.
        n_kv_heads: key/value heads (grouped-query attention; must divide n_heads).
        head_dim: width of each head (defaults to d_model // n_heads).
        d_ff: hidden width of the SwiGLU MLP.
        max_seq_len: longest sequence the rotary tables cover.
        rope_theta: rotary base frequency.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: reuse the token embedding as the output projection.
        init_std: standard deviation of the normal weight init.
        qkv_bias: add learned biases to the query/key/value projections (Qwen2).
        rope_scaling: long-context frequency scaling (`RopeScaling`, or its fields as a
            dict), ``None`` for plain RoPE.
        sliding_window: each position attends to at most this many positions, itself
            included (Mistral); ``None`` attends to the whole prefix.
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None
    d_ff: int = 128
    max_seq_len: int = 256
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    qkv_bias: bool = False
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # from JSON (dataclasses.asdict round trip)
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ConfigError(
                f"TransformerConfig.sliding_window={self.sliding_window} must be >= 1 "
                "(or None for full causal attention)."
            )
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_ff",
            "max_seq_len",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"TransformerConfig.{name}={getattr(self, name)} must be >= 1.")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"TransformerConfig: n_kv_heads={self.n_kv_heads} must divide "
                f"n_heads={self.n_heads} (grouped-query attention)."
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"TransformerConfig: d_model={self.d_model} is not divisible by "
                f"n_heads={self.n_heads}; set head_dim explicitly."
            )
        if self.head_size % 2:
            raise ConfigError(f"TransformerConfig: head_dim={self.head_size} must be even (RoPE).")

    @property
    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """``(layers, d_model, heads, kv_heads, head_dim, d_ff, vocab)``."""
        return (
            self.n_layers,
            self.d_model,
            self.n_heads,
            self.n_kv_heads,
            self.head_size,
            self.d_ff,
            self.vocab_size,
        )

    @property
    def head_size(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @classmethod
    def tiny(cls, **overrides) -> TransformerConfig:
        """~0.1M parameters: for tests (compiles in seconds)."""
        return cls(
            **{
                **dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=256),
                **overrides,
            }
        )

    @classmethod
    def small(cls, **overrides) -> TransformerConfig:
        """~25M parameters (d=512, 8 layers, seq 512): CPU benchmarks and demos."""
        return cls(
            **{
                **dict(
                    d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, d_ff=1408, max_seq_len=512
                ),
                **overrides,
            }
        )

    @classmethod
    def base(cls, **overrides) -> TransformerConfig:
        """~1.3B parameters (d=2048, 24 layers, seq 2048, 32k vocab): accelerators."""
        return cls(
            **{
                **dict(
                    vocab_size=32_000,
                    d_model=2048,
                    n_layers=24,
                    n_heads=16,
                    n_kv_heads=8,
                    d_ff=5632,
                    max_seq_len=2048,
                ),
                **overrides,
            }
        )


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple, std: float) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32), logical_axes=names)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32, returned in the input's dtype."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Inverse rotary frequencies ``(head_dim // 2,)`` in float32, scaled as ``scaling`` says.

    The llama3 branch follows the formula of Hugging Face's ``_compute_llama3_parameters``
    (Llama 3.1's reference code) so converted checkpoints see the same angles.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, blended, scaled)


def rope_tables(
    positions: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """cos/sin tables of shape ``positions.shape + (head_dim // 2,)``."""
    inv_freq = rope_frequencies(head_dim, theta, scaling)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq.reshape(
        (1,) * positions.ndim + (-1,)
    )
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate ``x: (batch, length, heads, head_dim)`` by position (rotate-half form)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def query_blocks(t: int) -> int:
    """How many query blocks the CPU attention splits a length-``t`` sequence into.

    Four blocks from 256 tokens on (when ``t`` divides): block ``i`` only multiplies the
    keys up to its own end, so the score and value matmuls and the softmax cover 10/16 of
    the ``t x t`` square instead of all of it; shorter sequences gain less than the extra
    ops cost.
    """
    return 4 if t >= 256 and t % 4 == 0 else 1


def causal_heads_first(
    qh: jax.Array,
    kh: jax.Array,
    vh: jax.Array,
    window: int | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal attention on heads-first arrays, computed block by block over the queries.

    ``qh: (batch, kv_heads, group, length, dim)``, ``kh, vh: (batch, kv_heads, length,
    dim)``; returns ``qh``'s shape. Each query block attends to the keys from the first
    one its rows can see (``window``) to its own last row: the blocks above the diagonal
    are never computed, as in flash attention's causal block skipping (Dao et al. 2022),
    here with static slices XLA compiles into plain batched matmuls. Softmax in float32.
    ``segments: (batch, length)`` ids keep each query to keys of its own segment (packed
    rows: one id per example).
    """
    t, d = qh.shape[-2], qh.shape[-1]
    n = query_blocks(t)
    size = t // n
    outs = []
    for i in range(n):
        lo, hi = i * size, (i + 1) * size
        start = 0 if window is None else max(0, lo - window + 1)
        k_i, v_i = kh[:, :, start:hi], vh[:, :, start:hi]
        scores = jnp.einsum("bkgtd,bksd->bkgts", qh[:, :, :, lo:hi], k_i).astype(jnp.float32)
        scores = scores / jnp.sqrt(jnp.float32(d))
        rows = jnp.arange(lo, hi)[:, None]
        cols = jnp.arange(start, hi)[None, :]
        seen = cols <= rows
        if window is not None:
            seen = seen & (cols > rows - window)
        if segments is not None:
            same = segments[:, lo:hi, None] == segments[:, None, start:hi]
            seen = seen[None] & same
            seen = seen[:, None, None]  # (batch, 1, 1, queries, keys)
        weights = jax.nn.softmax(jnp.where(seen, scores, -jnp.inf), axis=-1).astype(vh.dtype)
        outs.append(jnp.einsum("bkgts,bksd->bkgtd", weights, v_i))
    return outs[0] if n == 1 else jnp.concatenate(outs, axis=3)


def _heads_first_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    window: int | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal GQA with heads-first batched matmuls (`causal_heads_first`).

    XLA's CPU backend runs ``dot_product_attention``'s ``(batch, length, heads, dim)``
    einsums with transposed copies; one transpose to ``(batch, kv_heads, group, length,
    dim)`` up front made the whole training step 1.13x faster on the 2-core machines
    (d=256, 4 layers, seq 256; same losses).
    """
    b, t, n, d = q.shape
    kv = k.shape[2]
    qh = q.reshape(b, t, kv, n // kv, d).transpose(0, 2, 3, 1, 4)
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    out = causal_heads_first(qh, kh, vh, window, segments)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, d)


def attention_implementation(device: jax.Device, dtype) -> str:
    """Which attention kernel `attention` runs: ``heads_first``, ``cudnn`` or ``xla``.

    ``cudnn`` (cuDNN's fused flash attention) on NVIDIA GPUs for 16-bit inputs, the only
    dtypes it takes; XLA's CPU backend runs the heads-first formulation faster than
    ``dot_product_attention``'s einsums; ``xla`` (the generic lowering) everywhere else,
    TPUs and AMD GPUs included. MaxText selects ``cudnn_flash_te`` for its GPU configs
    the same way (``attention=cudnn_flash_te`` in ``configs/a3_plus/llama_2/7b/16vm.sh``).
    """
    if device.platform == "cpu":
        return "heads_first"
    nvidia = device.platform in ("gpu", "cuda") and "nvidia" in device.device_kind.lower()
    if nvidia and jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return "cudnn"
    return "xla"


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    window: int | None = None,
    segments: jax.Array | None = None,
) -> jax.Array:
    """Causal grouped-query attention on ``(batch, length, heads, head_dim)`` arrays.

    ``window`` limits each query to the last ``window`` keys, itself included (Mistral's
    sliding window, Hugging Face's ``kv_idx > q_idx - sliding_window``). ``segments``
    (``(batch, length)`` ids) keeps each query to its own segment's keys: examples
    packed into one row then attend as if each had the row alone (MaxText's
    ``decoder_segment_ids``). The kernel is chosen by backend and dtype
    (`attention_implementation`); with ``segments`` the GPU path takes XLA's lowering,
    whose boolean ``mask`` every dtype supports.
    """
    kind = attention_implementation(jax.devices()[0], q.dtype)
    if kind == "heads_first":
        return _heads_first_attention(q, k, v, window, segments)
    local = None if window is None else (window - 1, 0)
    if segments is None:
        return jax.nn.dot_product_attention(
            q, k, v, is_causal=True, local_window_size=local, implementation=kind
        )
    mask = segments[:, None, :, None] == segments[:, None, None, :]
    return jax.nn.dot_product_attention(
        q, k, v, mask=mask, is_causal=True, local_window_size=local, implementation="xla"
    )


_BIAS_AXES = {
    axes.HEADS: (axes.LAYERS, axes.HEADS, axes.HEAD_DIM),
    axes.KV_HEADS: (axes.LAYERS, axes.KV_HEADS, axes.HEAD_DIM),
}


class Transformer(nnx.Module):
    """The decoder. ``model(tokens) -> logits`` (float32, ``(batch, length, vocab)``)."""

    def __init__(self, cfg: TransformerConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        L, D, H, K, Dh, F, V = cfg.dims
        std = cfg.init_std
        out_std = std / math.sqrt(2 * L)  # GPT-2's scaled init of residual projections
        self.embed = _param(rngs, (V, D), (axes.VOCAB, axes.EMBED), std)
        self.attn_norm = nnx.Param(jnp.ones((L, D)), logical_axes=(axes.LAYERS, axes.EMBED))
        self.wq = _param(
            rngs, (L, D, H, Dh), (axes.LAYERS, axes.EMBED, axes.HEADS, axes.HEAD_DIM), std
        )
        self.wk = _param(
            rngs, (L, D, K, Dh), (axes.LAYERS, axes.EMBED, axes.KV_HEADS, axes.HEAD_DIM), std
        )
        self.wv = _param(
            rngs, (L, D, K, Dh), (axes.LAYERS, axes.EMBED, axes.KV_HEADS, axes.HEAD_DIM), std
        )
        self.wo = _param(
            rngs, (L, H, Dh, D), (axes.LAYERS, axes.HEADS, axes.HEAD_DIM, axes.EMBED), out_std
        )
        if cfg.qkv_bias:
            self.bq = nnx.Param(jnp.zeros((L, H, Dh)), logical_axes=_BIAS_AXES[axes.HEADS])
            self.bk = nnx.Param(jnp.zeros((L, K, Dh)), logical_axes=_BIAS_AXES[axes.KV_HEADS])
            self.bv = nnx.Param(jnp.zeros((L, K, Dh)), logical_axes=_BIAS_AXES[axes.KV_HEADS])
        self.mlp_norm = nnx.Param(jnp.ones((L, D)), logical_axes=(axes.LAYERS, axes.EMBED))
        self.w_gate = _param(rngs, (L, D, F), (axes.LAYERS, axes.EMBED, axes.MLP), std)
        self.w_up = _param(rngs, (L, D, F), (axes.LAYERS, axes.EMBED, axes.MLP), std)
        self.w_down = _param(rngs, (L, F, D), (axes.LAYERS, axes.MLP, axes.EMBED), out_std)
        self.final_norm = nnx.Param(jnp.ones((D,)), logical_axes=(axes.EMBED,))
        if not cfg.tie_embeddings:
            self.lm_head = _param(rngs, (D, V), (axes.EMBED, axes.VOCAB), std)

    def block_params(self) -> dict[str, jax.Array]:
        """The stacked per-layer weights (each with a leading ``layers`` axis)."""
        names = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
        if self.cfg.qkv_bias:
            names += ("bq", "bk", "bv")
        return {n: getattr(self, n)[...] for n in names}

    def block(
        self,
        x: jax.Array,
        p: dict[str, jax.Array],
        cos: jax.Array,
        sin: jax.Array,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        """One decoder block on ``x: (batch, length, d_model)`` with layer weights ``p``
        (``segments``: see `attention`).

        Projections are plain 2-D matmuls on ``(batch * length, features)``: their weight
        gradients then contract one dimension, which XLA's CPU backend does without the
        transposed copies that 3-D/4-D einsums cost (1.33x faster steps on the 2-core
        machines, PERF-NOTES.md "Transposed copies"). The reshapes merge or split
        leading dimensions only, so shardings carry through unchanged.
        """
        cfg = self.cfg
        b, t, d = x.shape
        n, kv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
        rows = (axes.BATCH, axes.EMBED)
        x = constrain(x, ACT)
        h = rms_norm(x, p["attn_norm"], cfg.norm_eps).reshape(b * t, d)
        q = (h @ p["wq"].reshape(d, n * hd)).reshape(b, t, n, hd)
        k = (h @ p["wk"].reshape(d, kv * hd)).reshape(b, t, kv, hd)
        v = (h @ p["wv"].reshape(d, kv * hd)).reshape(b, t, kv, hd)
        if cfg.qkv_bias:
            q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
        q = constrain(apply_rope(q, cos, sin), (axes.BATCH, axes.LENGTH, axes.HEADS, None))
        k = apply_rope(k, cos, sin)
        attn = attention(q, k, v, cfg.sliding_window, segments).reshape(b * t, n * hd)
        x = x + (attn @ p["wo"].reshape(n * hd, d)).reshape(b, t, d)
        x = constrain(x, ACT)
        h = constrain(rms_norm(x, p["mlp_norm"], cfg.norm_eps).reshape(b * t, d), rows)
        hidden = jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])
        hidden = constrain(hidden, (axes.BATCH, axes.MLP))
        return x + (hidden @ p["w_down"]).reshape(b, t, d)

    def hidden_states(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        """Final-normed hidden states ``(batch, length, d_model)`` for ``tokens``.

        Packed rows pass each example's own ``positions`` and a ``segments`` id per
        example; without ``segments`` the program is the unpacked one, unchanged."""
        cfg = self.cfg
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        cos, sin = rope_tables(positions, cfg.head_size, cfg.rope_theta, cfg.rope_scaling)
        # Gather the table's embed dimension first (the ZeRO-3 all-gather): a lookup from a
        # table sharded on embed would come out sharded on embed, not on the batch.
        embed = constrain(self.embed[...], (axes.VOCAB, None))
        x = constrain(jnp.take(embed, tokens, axis=0), ACT)

        # scan_layers is lax.scan over the stacked layers, or the pipeline schedule when
        # the engine runs one; rotary tables (and segment ids) travel with each microbatch.
        per_example = (cos, sin) if segments is None else (cos, sin, segments)
        x = scan_layers(checkpoint_block(self.block), x, self.block_params(), per_example)
        return rms_norm(x, self.final_norm[...], cfg.norm_eps)

    def __call__(
        self,
        tokens: jax.Array,
        positions: jax.Array | None = None,
        segments: jax.Array | None = None,
    ) -> jax.Array:
        x = self.hidden_states(tokens, positions, segments)
        head = self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]
        b, t, d = x.shape
        logits = (x.reshape(b * t, d) @ head).reshape(b, t, -1)
        return logits.astype(jnp.float32)


def count_params(cfg: TransformerConfig) -> int:
    """Number of parameters of a `Transformer` with config ``cfg``."""
    L, D, H, K, Dh, F, V = cfg.dims
    per_layer = 2 * D + D * H * Dh + 2 * D * K * Dh + H * Dh * D + 3 * D * F
    if cfg.qkv_bias:
        per_layer += (H + 2 * K) * Dh
    return V * D + L * per_layer + D + (0 if cfg.tie_embeddings else D * V)


def training_flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """Model FLOPs to train on one token (forward + backward), for MFU.

    6 FLOPs per matmul weight per token (2 forward, 4 backward), counting the output
    projection but not the embedding lookup, plus attention's score and value matmuls,
    ``12 * L * H * Dh * T`` (PaLM, Chowdhery et al. 2022, appendix B). Causal masking is
    not subtracted, as in PaLM's definition.
    """
    L, D, H, K, Dh, F, V = cfg.dims
    matmul_weights = L * (D * H * Dh + 2 * D * K * Dh + H * Dh * D + 3 * D * F) + D * V
    return 6.0 * matmul_weights + 12.0 * L * H * Dh * seq_len

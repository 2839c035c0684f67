"""Grain input: deterministic, per-process token batches as global `jax.Array`s.

`Loader` wraps any Grain source and yields ``{"tokens", "mask"}`` batches shaped
``(global_batch, seq_len + 1)`` for `jaxcore.models.lm_loss`:

- **Random-access sources** (a `grain.MapDataset`, a `grain.sources` data source, or
  anything with ``__len__`` and ``__getitem__``): row ``k`` of the infinite training stream
  is a pure function of ``(seed, k)``: epoch ``k // rows_per_epoch`` is a fresh Grain
  shuffle of the documents (`MapDataset.shuffle` reseeds per epoch). Global batch ``s``
  is rows ``[s * B, (s + 1) * B)``; each process builds only the rows its devices hold.
  The position is therefore just the step, and a run resumes on any number of processes.
- **Streaming sources** (a `grain.IterDataset`): elements are dealt round-robin to
  processes, padded or packed, batched and prefetched inside Grain, and the Grain iterator
  state is the position (saved per process; resume needs the same process count).

Sequences are padded (one document per row, ``mask`` marks real tokens) or packed
(documents concatenated, separated by ``eos_id`` when given, and cut into rows, as in
GPT-2/MaxText pre-training; every token of an epoch is seen once, the epoch's last
partial row is dropped). The seeded, random-access design follows Grain's
``dataset.py`` ("the position is a function of the index"); the packing of a shuffled
epoch into rows follows Grain's ``ConcatThenSplitIterDataset`` idea, made random-access
here by prefix sums over the document lengths.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import sysconfig
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import grain
import jax
import numpy as np
from jax.sharding import Sharding

from jaxcore.errors import ConfigError
from jaxcore.sharding import local_rows

log = logging.getLogger(__name__)

MODES = ("pack", "pad")


@runtime_checkable
class ResumableLoader(Protocol):
    """What `jaxcore.Checkpointer` needs from a loader: its position out, and back in.

    ``get_state()`` returns the position (JSON-able data, or bytes as Grain's
    ``DataLoader`` iterators give); ``set_state(state)`` makes the next batch the one
    after it. `jaxcore.Loader`, Grain iterators (``iter(dataset)``) and
    ``torchbridge.TorchLoader`` implement it.

    An optional attribute ``step_indexed`` (default ``False``) says whether the position
    is a function of the step alone, the same on every process: such a position is saved
    once and a run may resume with another process count. Otherwise each process saves
    its own, and resuming needs the same process count.
    """

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


def check_loader(loader: Any, where: str) -> None:
    """Raise `ConfigError` unless ``loader`` implements `ResumableLoader`."""
    if loader is None or isinstance(loader, ResumableLoader):
        return
    missing = [m for m in ("get_state", "set_state") if not callable(getattr(loader, m, None))]
    raise ConfigError(
        f"{where}: a {type(loader).__name__} cannot be checkpointed, it lacks "
        f"{' and '.join(missing)}. Pass a jaxcore.Loader, a Grain iterator, a "
        "torchbridge.TorchLoader, or give it get_state() -> position and "
        "set_state(position) (jaxcore.ResumableLoader)."
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputConfig:
    """How documents become batches.

    Attributes:
        global_batch_size: rows per step over all processes (including grad-accum rows).
        seq_len: the model's sequence length; rows hold ``seq_len + 1`` tokens (inputs
            plus the shifted targets).
        mode: ``pack`` (concatenate documents and cut into full rows) or ``pad`` (one
            document per row, truncated or padded with ``pad_id``).
        seed: shuffle seed; with the step it fixes the whole order.
        shuffle: shuffle documents (a new order every epoch); ``False`` keeps source order.
        pad_id: token id used for padding (masked out).
        eos_id: token appended to each document when packing (``None``: none).
        prefetch: batches Grain prepares ahead of the training loop.
        num_threads: Grain reader threads that build batches.
        worker_count: Grain worker processes (``0``: threads in this process). The source
            must be picklable. A streaming source is read in shares, one per worker, so
            the count is part of its order: its position resumes only with the same count.
        shard_stream: for streaming sources, deal elements round-robin to the blocks of
            batch rows the processes hold (processes holding the same rows read the same).
            Set ``False`` when each process already reads its own part of the stream.
    """

    global_batch_size: int
    seq_len: int
    mode: str = "pack"
    seed: int = 0
    shuffle: bool = True
    pad_id: int = 0
    eos_id: int | None = None
    prefetch: int = 4
    num_threads: int = 2
    worker_count: int = 0
    shard_stream: bool = True

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "seq_len", "prefetch", "num_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"InputConfig.{name}={value!r}: must be an integer >= 1.")
        if self.mode not in MODES:
            raise ConfigError(f"InputConfig.mode={self.mode!r}: use one of {MODES}.")
        if not isinstance(self.worker_count, int) or self.worker_count < 0:
            raise ConfigError(
                f"InputConfig.worker_count={self.worker_count!r}: must be an integer >= 0 "
                "(0 = no worker processes)."
            )
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"InputConfig.seed={self.seed!r}: must be in [0, 2**32).")
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            if value is None and name == "eos_id":
                continue
            # A negative id would go into the rows as-is and index the embedding from its end.
            if (
                isinstance(value, bool)
                or not isinstance(value, int | np.integer)
                or not 0 <= value < 2**31
            ):
                raise ConfigError(
                    f"InputConfig.{name}={value!r}: must be a token id >= 0 (and below the "
                    "vocabulary size), e.g. tok.eos_id / tok.pad_id."
                )


def _tokens_of(element: Any) -> np.ndarray:
    """A document's tokens: the element itself, or its ``"tokens"`` entry."""
    if isinstance(element, dict):
        if "tokens" not in element:
            raise ConfigError(
                f"input element has keys {sorted(element)}; a dict element needs 'tokens'."
            )
        element = element["tokens"]
    if isinstance(element, bytes | bytearray | memoryview):
        # An ArrayRecord shard's raw record (grain.sources.ArrayRecordDataSource): was
        # "shape () and dtype |S3736", with no way out.
        raise ConfigError(
            f"input element is {len(element)} raw bytes (an ArrayRecord record?), not token "
            "ids: decode the records first, e.g. data.open_dataset('out/v1/tokens/index.json') "
            "for `data build` shards, or grain.MapDataset.source(src).map(lambda b: "
            "np.frombuffer(b, '<u4'))."
        )
    tokens = np.asarray(element)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ConfigError(
            f"input element of shape {tokens.shape} and dtype {tokens.dtype}: each document "
            "must be a 1-d integer array of token ids (or a dict with 'tokens')."
        )
    return tokens


_INT32 = np.iinfo(np.int32)


def _as_int32(tokens: np.ndarray) -> np.ndarray:
    """``tokens`` as the rows' int32; a wider id would wrap to another (even a valid) id
    silently, so it is refused. Called on what goes into a row, not on whole documents:
    a long document packed into many rows is checked once per row's slice."""
    if tokens.size and np.iinfo(tokens.dtype).max > _INT32.max:
        low, high = int(tokens.min()), int(tokens.max())
        if high > _INT32.max or low < _INT32.min:
            bad = high if high > _INT32.max else low
            raise ConfigError(
                f"input element holds token id {bad}, outside int32 (the rows' dtype, where "
                "it would wrap to another id); token ids must lie in [0, vocab_size)."
            )
    return tokens.astype(np.int32)


def _pad_row(tokens: np.ndarray, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    row = np.full((width,), pad_id, np.int32)
    mask = np.zeros((width,), np.int32)
    n = min(len(tokens), width)
    row[:n] = _as_int32(tokens[:n])
    mask[:n] = 1
    return row, mask


class _Rows:
    """Row ``k`` of the infinite stream of a random-access source: a pure function of k.

    Picklable (Grain worker processes receive it), stateless apart from a cache.
    """

    def __init__(self, source: Any, cfg: InputConfig, lengths: np.ndarray | None):
        base = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
        self.base = base
        self.n = len(base)
        if self.n == 0:
            raise ConfigError("the input source is empty; it needs at least one document.")
        self.cfg = cfg
        self.width = cfg.seq_len + 1
        order = grain.MapDataset.range(self.n)
        # Grain's shuffle reseeds every epoch: index e*n + j is document j of epoch e's order.
        self.order = order.shuffle(cfg.seed) if cfg.shuffle else order
        self.docs = base.shuffle(cfg.seed) if cfg.shuffle else base
        self.lengths = None
        self.rows_per_epoch = self.n
        if cfg.mode == "pack":
            self.lengths = np.asarray(lengths if lengths is not None else _measure(base), np.int64)
            if len(self.lengths) != self.n:
                raise ConfigError(
                    f"source.lengths has {len(self.lengths)} entries for {self.n} documents."
                )
            extra = 0 if cfg.eos_id is None else 1
            total = int(self.lengths.sum()) + extra * self.n
            self.rows_per_epoch = total // self.width
            if self.rows_per_epoch < 1:
                raise ConfigError(
                    f"the source holds {total} tokens, fewer than one row of seq_len+1="
                    f"{self.width}; use a shorter seq_len or more data."
                )
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_epochs"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Document order of ``epoch`` and the token offset where each starts."""
        with self._lock:
            if epoch not in self._epochs:
                first = epoch * self.n
                order = np.fromiter(
                    (self.order[first + j] % self.n for j in range(self.n)), np.int64, self.n
                )
                extra = 0 if self.cfg.eos_id is None else 1
                sizes = self.lengths[order] + extra
                starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
                if len(self._epochs) >= 2:
                    self._epochs.pop(min(self._epochs))
                self._epochs[epoch] = (order, starts)
            return self._epochs[epoch]

    def row(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        if cfg.mode == "pad":
            return _pad_row(_tokens_of(self.docs[k]), self.width, cfg.pad_id)
        epoch, r = divmod(k, self.rows_per_epoch)
        order, starts = self._epoch(epoch)
        begin, end = r * self.width, (r + 1) * self.width
        j = int(np.searchsorted(starts, begin, side="right")) - 1
        parts = []
        pos = begin
        while pos < end:
            doc = self._document(int(order[j]))
            if cfg.eos_id is not None:
                doc = np.append(doc, cfg.eos_id)
            offset = pos - int(starts[j])
            take = doc[offset : offset + (end - pos)]
            parts.append(take)
            pos += len(take)
            j += 1
        row = _as_int32(np.concatenate(parts))
        return row, np.ones((self.width,), np.int32)

    def _document(self, index: int) -> np.ndarray:
        """Document ``index``'s tokens, checked against ``lengths[index]``: the row offsets
        come from ``lengths``, so a wrong entry would silently repeat or drop tokens (or
        run past the epoch's last document)."""
        tokens = _tokens_of(self.base[index])
        if len(tokens) != self.lengths[index]:
            raise ConfigError(
                f"source.lengths[{index}] = {int(self.lengths[index])} but document {index} "
                f"holds {len(tokens)} tokens; lengths must count each document's tokens (drop "
                "the source's lengths attribute to have the Loader measure them)."
            )
        return tokens

    def batch(self, first: int, count: int) -> dict[str, np.ndarray]:
        rows = [self.row(first + i) for i in range(count)]
        return {
            "tokens": np.stack([r[0] for r in rows]),
            "mask": np.stack([r[1] for r in rows]),
        }


class _LocalBatch:
    """``step -> this process's rows of global batch step`` (a picklable Grain map)."""

    def __init__(self, rows: _Rows, global_batch: int, lo: int, hi: int):
        self.rows, self.global_batch, self.lo, self.hi = rows, global_batch, lo, hi

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        return self.rows.batch(int(step) * self.global_batch + self.lo, self.hi - self.lo)


def _measure(base: grain.MapDataset) -> np.ndarray:
    """Token count of every document (one pass; give the source a ``lengths`` to skip it)."""
    from rich.progress import track

    n = len(base)
    show = jax.process_index() == 0 and n > 10_000
    it = track(range(n), description="measuring documents") if show else range(n)
    return np.fromiter((len(_tokens_of(base[i])) for i in it), np.int64, n)


def _worker_options(count: int) -> grain.MultiprocessingOptions:
    """Grain's options for ``count`` worker processes, with absl's flags usable.

    Grain's ``mp_prefetch`` reads its ``--grain_*`` absl flags when the workers start,
    which raises ``UnparsedFlagAccessError`` unless the program parsed absl's flags (only
    ``absl.app.run`` does): a plain script, a notebook or pytest could not use workers.
    Unparsed flags are marked parsed with their defaults (``grain.config.update`` still
    sets them); flags a program already parsed are left as they are.
    """
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return grain.MultiprocessingOptions(num_workers=count)


class _PadMap(grain.transforms.Map):
    def __init__(self, width: int, pad_id: int):
        self.width, self.pad_id = width, pad_id

    def map(self, element: Any) -> dict[str, np.ndarray]:
        row, mask = _pad_row(_tokens_of(element), self.width, self.pad_id)
        return {"tokens": row, "mask": mask}


class _AsTokens(grain.transforms.Map):
    def __init__(self, eos_id: int | None):
        self.eos_id = eos_id

    def map(self, element: Any) -> dict[str, np.ndarray]:
        tokens = _as_int32(_tokens_of(element))
        if self.eos_id is not None:
            tokens = np.append(tokens, np.int32(self.eos_id))
        return {"tokens": tokens}


class _Unsegment(grain.transforms.Map):
    def map(self, element: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tokens = element["tokens"].astype(np.int32)
        mask = element.get("tokens_segment_ids")
        mask = np.ones_like(tokens) if mask is None else (mask > 0).astype(np.int32)
        return {"tokens": tokens, "mask": mask}


def _check_special_ids(source: Any, cfg: InputConfig) -> None:
    """Refuse an ``eos_id`` (packing) or ``pad_id`` outside the source's tokenizer's
    vocabulary (a `TextSource` knows it): the id would be an out-of-range embedding row."""
    vocab = getattr(getattr(source, "tokenizer", None), "vocab_size", None)
    if not isinstance(vocab, int):
        return
    used = [("pad_id", cfg.pad_id)]
    if cfg.mode == "pack" and cfg.eos_id is not None:
        used.append(("eos_id", cfg.eos_id))
    for name, value in used:
        if value >= vocab:
            raise ConfigError(
                f"InputConfig.{name}={value} is outside the tokenizer's vocabulary "
                f"(vocab_size={vocab}); use the tokenizer's own id (tok.eos_id, tok.pad_id)."
            )


class Loader:
    """Batches from a Grain source, positioned by step, as global `jax.Array`s.

    Args:
        source: a `grain.MapDataset`, a Grain data source (``__len__``/``__getitem__``),
            or a `grain.IterDataset` (streaming). Elements are 1-d token arrays or dicts
            with ``"tokens"``. A random-access source may carry a ``lengths`` array
            (tokens per document) so packing need not measure every document first;
            an entry that disagrees with its document raises `ConfigError` when read.
        config: an `InputConfig`.
        sharding: the batch sharding (``engine.batch_sharding``). ``None`` yields the
            whole batch as NumPy arrays in this process (tests, single host tools).

    Iterate it for batches; ``loader.step`` is the index of the next one. `state_dict`
    / `load_state_dict` carry the position through a checkpoint (`jaxcore.Checkpointer`
    does this for you).
    """

    def __init__(self, source: Any, config: InputConfig, sharding: Sharding | None = None):
        if not isinstance(config, InputConfig):
            raise ConfigError(f"Loader(config={config!r}): pass a jaxcore.InputConfig.")
        self.config = config
        self.sharding = sharding
        width = config.seq_len + 1
        self.lo, self.hi = local_rows(sharding, config.global_batch_size, width)
        if self.hi <= self.lo:
            raise ConfigError(
                f"InputConfig.global_batch_size={config.global_batch_size} leaves process "
                f"{jax.process_index()} no rows; use a multiple of the data-parallel ways."
            )
        self.streaming = isinstance(source, grain.IterDataset)
        if not self.streaming and not (
            hasattr(source, "__len__") and hasattr(source, "__getitem__")
        ):
            raise ConfigError(
                f"Loader(source={type(source).__name__}): pass a grain.MapDataset, a Grain "
                "data source (with __len__ and __getitem__) or a grain.IterDataset."
            )
        _check_special_ids(source, config)
        self.step = 0
        self._source = source
        self._rows = (
            None if self.streaming else _Rows(source, config, getattr(source, "lengths", None))
        )
        # The Grain iterator lives in a box a finalizer closes: when the Loader is collected,
        # and at interpreter exit, before module teardown. Was: a loader left open (as the
        # README's `zip(range(n), loader)` leaves it) printed "Exception ignored in
        # DatasetIterator.__del__ ... AttributeError" at exit, Grain's prefetch closing after
        # its modules were torn down.
        self._box: list[Any] = [None]
        weakref.finalize(self, _close_box, self._box)
        self._stream_state: Any = None

    @property
    def _iter(self) -> Any:
        return self._box[0]

    @_iter.setter
    def _iter(self, it: Any) -> None:
        self._box[0] = it

    # ----------------------------------------------------------------- position
    @property
    def rows_per_epoch(self) -> int | None:
        """Rows in one epoch (random-access sources), ``None`` for streams."""
        return None if self._rows is None else self._rows.rows_per_epoch

    @property
    def step_indexed(self) -> bool:
        """Whether the position is the step alone (random access), not per-process state."""
        return not self.streaming

    def get_state(self) -> dict[str, Any]:
        """The position (`ResumableLoader`); the same as `state_dict`."""
        return self.state_dict()

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a `get_state` position (`ResumableLoader`)."""
        self.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        """The position as JSON-able data (for streams, this process's Grain state)."""
        cfg = self.config
        out: dict[str, Any] = {
            "kind": "stream" if self.streaming else "random_access",
            "step": self.step,
            "seed": cfg.seed,
            "global_batch_size": cfg.global_batch_size,
            "seq_len": cfg.seq_len,
            "mode": cfg.mode,
            "shuffle": cfg.shuffle,
            "eos_id": cfg.eos_id,
        }
        if self.streaming:
            self._ensure_iter()
            out["grain_state"] = self._iter.get_state()
            out["worker_count"] = cfg.worker_count
            out["stream_blocks"] = self._stream_blocks()[0]
        else:
            out["num_documents"] = self._rows.n
            if self._rows.lengths is not None:
                out["num_tokens"] = int(self._rows.lengths.sum())
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (the next batch is the one after it)."""
        cfg = self.config
        kind = "stream" if self.streaming else "random_access"
        if not isinstance(state, dict) or state.get("kind") not in ("stream", "random_access"):
            # Was: an AttributeError for bytes/None, or "a None source" for the dict of a
            # Grain iterator or a TorchLoader (a checkpoint written with another loader).
            got = (
                f"a dict with keys {sorted(map(str, state))[:8]}"
                if isinstance(state, dict)
                else f"a {type(state).__name__}"
            )
            raise ConfigError(
                f"Loader.set_state: the saved input position is {got}, not a jaxcore.Loader "
                "position (a dict with 'kind' and 'step', from Loader.get_state): it was saved "
                "by another loader (a Grain iterator, a torchbridge.TorchLoader?). Resume with "
                "the kind of loader that saved it, or start the input from step 0."
            )
        if state.get("kind") != kind:
            raise ConfigError(
                f"the saved input position is for a {state.get('kind')} source but this "
                f"loader reads a {kind} source; resume with the same kind of source."
            )
        for key in ("seed", "global_batch_size", "seq_len", "mode"):
            if state.get(key) != getattr(cfg, key):
                raise ConfigError(
                    f"InputConfig.{key}={getattr(cfg, key)!r} differs from the checkpoint's "
                    f"{state.get(key)!r}: the saved position would point at different data. "
                    f"Resume with {key}={state.get(key)!r}."
                )
        for key in ("shuffle", "eos_id"):  # older positions do not record these
            if key in state and state[key] != getattr(cfg, key):
                raise ConfigError(
                    f"InputConfig.{key}={getattr(cfg, key)!r} differs from the checkpoint's "
                    f"{state[key]!r}: the saved position would point at different data. "
                    f"Resume with {key}={state[key]!r}."
                )
        if self.streaming and state.get("worker_count", cfg.worker_count) != cfg.worker_count:
            raise ConfigError(
                f"InputConfig.worker_count={cfg.worker_count} differs from the checkpoint's "
                f"{state['worker_count']}: a stream's position is Grain's state per worker "
                "(each worker reads its own share of the stream), so it continues only with "
                f"the same workers. Resume with worker_count={state['worker_count']}."
            )
        blocks = self._stream_blocks()[0] if self.streaming else None
        if self.streaming and state.get("stream_blocks", blocks) != blocks:
            raise ConfigError(
                f"the checkpoint's stream was dealt over {state['stream_blocks']} blocks of "
                f"batch rows, this layout deals it over {blocks} (processes holding "
                "different rows read different shares of a stream): its position does not "
                "carry over. Resume with the layout's split of the batch over processes it "
                "was saved with, or use a random-access source, which resumes on any."
            )
        if not self.streaming and state.get("num_documents") != self._rows.n:
            raise ConfigError(
                f"the source has {self._rows.n} documents but the checkpoint was written "
                f"with {state.get('num_documents')}; resume with the same source."
            )
        saved_tokens = state.get("num_tokens")  # pack mode; older positions lack it
        if not self.streaming and saved_tokens is not None and self._rows.lengths is not None:
            tokens = int(self._rows.lengths.sum())
            if tokens != saved_tokens:
                raise ConfigError(
                    f"the source holds {tokens} tokens but the checkpoint was written with "
                    f"{saved_tokens} (same {self._rows.n} documents): packed rows would start "
                    "elsewhere, so the saved step points at other data. Resume with the same "
                    "source and tokenizer."
                )
        self.close()
        self.step = int(state["step"])
        if self.streaming:
            self._stream_state = state["grain_state"]

    def seek(self, step: int) -> None:
        """Position a random-access loader at ``step`` (the next batch yielded)."""
        if self.streaming:
            raise ConfigError("Loader.seek: a streaming source can only resume from its state.")
        self.close()
        self.step = int(step)

    # ----------------------------------------------------------------- batches
    def local_batch(self, step: int) -> dict[str, np.ndarray]:
        """This process's rows of global batch ``step`` (random-access sources)."""
        if self._rows is None:
            raise ConfigError("Loader.local_batch needs a random-access source.")
        return _LocalBatch(self._rows, self.config.global_batch_size, self.lo, self.hi)(step)

    def _ensure_iter(self) -> None:
        if self._iter is not None:
            return
        cfg = self.config
        if self.streaming:
            self._iter = iter(self._stream_dataset())
            if self._stream_state is not None:
                self._iter.set_state(self._stream_state)
                self._stream_state = None
            return
        fn = _LocalBatch(self._rows, cfg.global_batch_size, self.lo, self.hi)
        ds = grain.MapDataset.range(self.step, 2**62).map(fn)
        it_ds = ds.to_iter_dataset(
            grain.ReadOptions(num_threads=cfg.num_threads, prefetch_buffer_size=cfg.prefetch)
        )
        if cfg.worker_count:
            it_ds = it_ds.mp_prefetch(_worker_options(cfg.worker_count))
        self._iter = iter(it_ds)

    def _stream_blocks(self) -> tuple[int, int]:
        """``(count, index)``: the shares a stream is dealt in, and this process's."""
        rows = self.hi - self.lo
        if not self.config.shard_stream:
            return 1, 0
        return self.config.global_batch_size // rows, self.lo // rows

    def _stream_dataset(self) -> grain.IterDataset:
        cfg = self.config
        ds: grain.IterDataset = self._source
        # Deal the stream over the blocks of rows the processes hold, not over processes:
        # processes holding the same rows (a pipeline axis across hosts: every process
        # holds every row) must read the same elements, or the copies of one global batch
        # differ (was: process 0 read the even elements, process 1 the odd ones, for the
        # same rows). With one block per process (data/fsdp across hosts) it is the same.
        count, index = self._stream_blocks()
        if count > 1:
            ds = ds.map_with_index(lambda i, x: (i, x))
            ds = ds.filter(lambda t: t[0] % count == index).map(lambda t: t[1])
        width = cfg.seq_len + 1
        if cfg.mode == "pad":
            ds = ds.map(_PadMap(width, cfg.pad_id))
        else:
            ds = ds.map(_AsTokens(cfg.eos_id))
            ds = grain.experimental.ConcatThenSplitIterDataset(ds, length_struct={"tokens": width})
            ds = ds.map(_Unsegment())
        ds = ds.batch(self.hi - self.lo, drop_remainder=True)
        if cfg.worker_count:
            ds = ds.mp_prefetch(_worker_options(cfg.worker_count))
        else:
            ds = grain.experimental.ThreadPrefetchIterDataset(ds, prefetch_buffer_size=cfg.prefetch)
        return ds

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        self._ensure_iter()
        try:
            local = next(self._iter)
        except StopIteration:
            if self.step == 0:
                cfg = self.config
                raise ConfigError(
                    f"the streaming source yielded no complete batch of {self.hi - self.lo} "
                    f"rows x seq_len+1={cfg.seq_len + 1} tokens (mode={cfg.mode!r}) for "
                    f"process {jax.process_index()}: it is empty or too short. Use more "
                    "data, a smaller global_batch_size or seq_len, or a repeating stream "
                    "(dataset.repeat())."
                ) from None
            raise
        if self.config.worker_count:
            # Grain's workers hand batches over in shared memory (SharedMemoryArray): copy
            # them into plain arrays so the block is released now, not when the caller drops
            # the batch (was: one still held at exit printed "Exception ignored in
            # SharedMemoryArray.__del__ ... AttributeError" after module teardown).
            local = {k: np.array(v) for k, v in local.items()}
        self.step += 1
        return self.to_global(local)

    def to_global(self, local: dict[str, np.ndarray]) -> Any:
        """This process's rows -> global arrays on ``sharding`` (NumPy when it is None)."""
        if self.sharding is None:
            return local
        shape = (self.config.global_batch_size, self.config.seq_len + 1)
        return {
            k: jax.make_array_from_process_local_data(self.sharding, v, shape)
            for k, v in local.items()
        }

    def close(self) -> None:
        """Stop the prefetch threads or workers (a new iterator starts on next use)."""
        _close_box(self._box)


def _close_box(box: list[Any]) -> None:
    it, box[0] = box[0], None
    if it is not None and hasattr(it, "close"):
        it.close()


# --------------------------------------------------------------------- demo source
class StdlibSource(grain.sources.RandomAccessDataSource):
    """Byte-level documents: the Python standard library's own ``.py`` files.

    A demo corpus every machine has: ~1,800 files, ~30 MB on CPython 3.11, in sorted
    path order (deterministic), each document the file's bytes as int32 token ids
    (vocabulary 256). ``lengths`` comes from file sizes, so packing needs no pass.
    """

    def __init__(self, root: str | None = None, *, max_files: int | None = None):
        self.root = str(root or sysconfig.get_paths()["stdlib"])
        base = pathlib.Path(self.root)
        skip = {"site-packages", "dist-packages", "__pycache__"}
        files = sorted(
            str(p.relative_to(base))
            for p in base.rglob("*.py")
            if p.is_file() and not skip.intersection(p.relative_to(base).parts)
        )
        if max_files is not None:
            files = files[:max_files]
        if not files:
            raise ConfigError(f"StdlibSource: no .py files under {self.root}.")
        self.files: Sequence[str] = tuple(files)
        self.lengths = np.array([(base / f).stat().st_size for f in self.files], np.int64)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> np.ndarray:
        data = (pathlib.Path(self.root) / self.files[index]).read_bytes()
        return np.frombuffer(data, np.uint8).astype(np.int32)

    def __repr__(self) -> str:
        return f"StdlibSource({self.root!r}, files={len(self.files)})"


def stdlib_source(*, max_files: int | None = None) -> StdlibSource:
    """The standard library's ``.py`` files as a byte-level random-access Grain source."""
    return StdlibSource(max_files=max_files)

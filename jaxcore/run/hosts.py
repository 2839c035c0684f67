"""Who does what when `jaxcore run` spans several processes (hosts of a pod, Slurm tasks).

Process 0 is the *leader*: it alone runs the host-local phases (data curation, tokenizer
and Grain shards, registry entry, serving, summary), decides which phases are reused, and
is the one writer of the run's store. Every process trains: in the train and search
phases the leader announces each trial (its hyperparameters, length and checkpoint
folder) and, at each validation, whether the searcher stops it; the other processes
(*followers*) run the same trial function with those decisions, so the collectives of
every step line up. The run folder and ``data.output_dir`` must be on a filesystem every
host sees (NFS, Filestore, a GCS mount): the followers read the token shards the leader
wrote and save their shards of each checkpoint next to the leader's (Orbax).

The messages go through jax.distributed's key-value store (the coordination service in
process 0, reachable by every process that joined the run), not files in the run
folder: no polling of a network filesystem's attribute cache, and the same channel JAX's
own barriers use. An ordered log of events ``ev/<run>/<n>``; followers acknowledge each.

Failure detection, both ways, bounded:
- a follower that dies (``kill -9``, OOM, a lost host) stops its heartbeat thread; the
  leader, whenever it waits for the followers' acknowledgements (after every phase, at
  the start of every trial), sees the heartbeat stop changing and raises
  `PeerLostError` after ``$JAXCORE_RUN_PEER_TIMEOUT`` seconds (default 60) -- JAX's own
  detection takes its 100 s heartbeat timeout and then aborts in C++;
- when the leader dies, its coordination service goes with it and JAX terminates every
  follower at once ("another task died"); a follower waiting for a slow phase prints
  what it waits for first, so that message has its context. A leader that *fails*
  (an exception) publishes the error, and the followers raise it as `LeaderFailedError`.
A wait for the leader has no deadline: a data phase may take hours.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from jaxcore.errors import ConfigError, JaxcoreError

log = logging.getLogger(__name__)

PEER_TIMEOUT_ENV = "JAXCORE_RUN_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT_S = 60.0
HEARTBEAT_S = 0.5
PROBE = ".jaxcore-shared-probe"  # written by process 0 in run_dir and data.output_dir
_SLICE_MS = 1000  # a blocking read returns this often, so a follower stays interruptible

_runs = 0  # run_pipeline calls in this process: names each run's keys (same on every process)


class PeerLostError(JaxcoreError, RuntimeError):
    """A follower process stopped answering (died, or its host was lost)."""


class LeaderFailedError(JaxcoreError, RuntimeError):
    """Process 0 failed a phase; the message is its error."""


class Solo:
    """One process: the leader of itself. Every coordination call is a no-op."""

    index = 0
    count = 1
    is_leader = True

    def publish(self, kind: str, **payload: Any) -> None:
        """Nothing to do: no other process listens."""

    def receive(self, what: str) -> dict[str, Any]:
        raise RuntimeError("a single process never waits for a leader")

    def wait_followers(self, what: str) -> None:
        """Nothing to do: there are no followers to wait for."""

    def agree(self, decide: Callable[[], Any], kind: str) -> Any:
        return decide()

    def close(self) -> None:
        """Nothing to do: a single process holds no heartbeat or key-value client."""


class Hosts:
    """The leader's and followers' side of one run over jax.distributed's key-value store.

    ``client`` is jax.distributed's runtime client (``blocking_key_value_get``,
    ``key_value_set``, ``key_value_try_get``).
    """

    def __init__(
        self,
        client: Any,
        index: int,
        count: int,
        run: int,
        *,
        peer_timeout_s: float | None = None,
        say: Callable[[str], None] | None = None,
    ):
        self.client, self.index, self.count = client, index, count
        self.is_leader = index == 0
        self.prefix = f"jaxcore-run/{run}"
        self.peer_timeout_s = (
            float(os.environ.get(PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT_S))
            if peer_timeout_s is None
            else peer_timeout_s
        )
        self.say = say or (lambda text: print(text, flush=True))
        self._n = 0  # the next event: written by the leader, read by the followers
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if not self.is_leader:
            self._beat = threading.Thread(target=self._heartbeat, daemon=True)
            self._beat.start()

    # ------------------------------------------------------------------ followers
    def _heartbeat(self) -> None:
        beat = 0
        while not self._stop.is_set():
            beat += 1
            try:
                self.client.key_value_set(
                    f"{self.prefix}/hb/{self.index}", str(beat), allow_overwrite=True
                )
            except Exception:  # the service is gone: JAX terminates this process itself
                return
            self._stop.wait(HEARTBEAT_S)

    def receive(self, what: str) -> dict[str, Any]:
        """The leader's next event (waits without a deadline; see the module doc)."""
        key = f"{self.prefix}/ev/{self._n}"
        while True:
            try:
                raw = self.client.blocking_key_value_get(key, _SLICE_MS)
                break
            except Exception as e:  # DEADLINE_EXCEEDED: not published yet
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
        self.client.key_value_set(f"{self.prefix}/ack/{self._n}/{self.index}", "1")
        self._n += 1
        event = json.loads(raw)
        if event["kind"] == "error":
            raise LeaderFailedError(
                f"process 0 failed while this process ({self.index}) waited for {what}: "
                f"{event['message']}"
            )
        return event

    # ------------------------------------------------------------------ leader
    def publish(self, kind: str, **payload: Any) -> None:
        """Append an event to the log the followers read."""
        body = json.dumps({"kind": kind, **payload}, default=str)
        self.client.key_value_set(f"{self.prefix}/ev/{self._n}", body)
        self._n += 1

    def report_failure(self, message: str) -> None:
        """A follower's error, for the leader's next `wait_followers` to raise."""
        self.client.key_value_set(f"{self.prefix}/failed/{self.index}", message, True)

    def wait_followers(self, what: str) -> None:
        """Wait until every follower acknowledged the last event; raise `PeerLostError`
        when one failed, or its heartbeat stops for ``peer_timeout_s`` (``what``: where
        we are)."""
        n = self._n - 1
        pending = set(range(1, self.count))
        seen: dict[int, tuple[str | None, float]] = {}
        while pending:
            now = time.monotonic()
            for rank in sorted(pending):
                if self._try_get(f"{self.prefix}/ack/{n}/{rank}") is not None:
                    pending.discard(rank)
                    continue
                failed = self._try_get(f"{self.prefix}/failed/{rank}")
                if failed is not None:
                    raise PeerLostError(f"process {rank} of {self.count} failed {what}: {failed}")
                beat = self._try_get(f"{self.prefix}/hb/{rank}")
                last = seen.get(rank)
                if last is None or beat != last[0]:
                    seen[rank] = (beat, now)  # changes are timed on this clock: no skew
                elif now - last[1] > self.peer_timeout_s:
                    raise PeerLostError(
                        f"process {rank} of {self.count} stopped answering {what}: no heartbeat "
                        f"for {now - last[1]:.0f} s (${PEER_TIMEOUT_ENV}="
                        f"{self.peer_timeout_s:g}). It died or lost its host; see its log. "
                        "Start the run again on every process: finished phases are reused."
                    )
            if pending:
                time.sleep(0.05)

    def agree(self, decide: Callable[[], Any], kind: str) -> Any:
        """The leader's ``decide()``, the same value on every process."""
        if self.is_leader:
            value = decide()
            self.publish(kind, value=value)
            return value
        return self.receive(kind)["value"]

    def _try_get(self, key: str) -> str | None:
        try:
            return self.client.key_value_try_get(key)
        except Exception as e:
            if "NOT_FOUND" in str(e):
                return None
            raise

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)


# ----------------------------------------------------------------------------- storage
def write_probe(folders: list[pathlib.Path]) -> str:
    """Leave a fresh token in each folder (process 0), for `check_probe` on the others."""
    token = secrets.token_hex(8)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PROBE).write_text(token)
    return token


def check_probe(folders: list[str], token: str, *, wait_s: float = 10.0) -> None:
    """Raise `ConfigError` when a folder is not the one process 0 wrote to (local disks).

    Retried for ``wait_s``: a network filesystem may show a new file a moment late.
    """
    deadline = time.monotonic() + wait_s
    for folder in folders:
        probe = pathlib.Path(folder) / PROBE
        while not (probe.is_file() and probe.read_text() == token):
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"{folder} is not shared with process 0 (this process does not see the "
                    f"{PROBE} file process 0 just wrote there): a multi-process run needs "
                    "run_dir and data.output_dir on storage every host mounts (NFS, Filestore, "
                    "a GCS mount); set them with --set run_dir=... --set data.output_dir=..."
                )
            time.sleep(0.2)


_current: Solo | Hosts = Solo()


def current() -> Solo | Hosts:
    """The run's coordination (what the trial function asks at each validation)."""
    return _current


def open_hosts(say: Callable[[str], None] | None = None) -> Solo | Hosts:
    """`Solo` for one process, else `Hosts` over the initialized jax.distributed client;
    becomes `current()` until its ``close``."""
    global _current, _runs
    import jax

    if jax.process_count() == 1:
        _current = Solo()
        return _current
    from jax._src import distributed  # the runtime client; no public accessor exists

    client = distributed.global_state.client
    if client is None:
        raise JaxcoreError(
            "jax reports several processes but jax.distributed has no client; start them "
            "with jaxcore.initialize() (jaxcore run does) or jax.distributed.initialize()."
        )
    _runs += 1
    _current = Hosts(client, jax.process_index(), jax.process_count(), _runs, say=say)
    return _current


def close_hosts() -> None:
    global _current
    _current.close()
    _current = Solo()

"""The build: per-shard curation, global deduplication, per-shard output, manifest.

Phases (each leaves a completion marker under ``<version>/_work``, so a rerun after a
crash skips finished shards and produces byte-identical output):

1. per shard: ingest -> language -> license -> opt-out -> filters -> PII -> decontam ->
   signature; kept rows (with content and signature) and drops go to ``_work/stage1``;
2. global: exact + near duplicates from hashes and signatures only (no content);
3. per shard: stage-1 rows minus duplicates -> ``shards/``; all drops -> ``drops/``;
4. manifest, checksums, changelog.

Decontamination runs before signatures so a contaminated file is never chosen as the
survivor of a duplicate cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from data.config import BuildConfig, config_from_dict
from data.decontam import DecontamStep
from data.dedup import DedupItem, SignatureStep, find_duplicates
from data.errors import BuildError, DataConfigError
from data.executor import make_executor
from data.filters import FilterStep
from data.ingest import IngestStep, RepoUnit, assign_shards, plan_units
from data.language import LanguageStep
from data.license import LicenseStep
from data.minhash import MinHasher
from data.optout import OptOutRegistry, OptOutStep
from data.pii import PIIStep
from data.records import StageStats, merge_stats
from data.snapshot import (
    DROP_SCHEMA,
    KEPT_SCHEMA,
    OPTOUT_SCHEMA,
    OUTPUT_COLUMNS,
    PII_LOG_SCHEMA,
    RowWriter,
    append_changelog,
    code_version,
    drop_row,
    kept_row,
    optout_row,
    sha256_file,
    write_checksums,
)
from data.step import chain
from data.versions import version_key

log = logging.getLogger(__name__)

# Settings that change how a build runs, not what it produces: left out of the manifest.
RUN_ONLY_FIELDS = ("output_dir", "workers", "executor", "progress")


def _work(cfg: BuildConfig) -> Path:
    return cfg.version_dir / "_work"


def _done(path: Path) -> bool:
    return path.exists()


def _damage(files: dict[Path, int | None], sums: dict[str, str]) -> str | None:
    """What is wrong with a marker's files (None when intact): a file that does not open,
    holds another row count than the marker recorded, or whose bytes no longer hash to the
    recorded SHA-256 (a flipped byte inside a data page still opens and counts right)."""
    for path, rows in files.items():
        try:
            n = pq.read_metadata(path).num_rows
        except (OSError, ValueError, pa.ArrowException) as e:
            return f"{path} is unreadable ({e})"
        if rows is not None and n != rows:
            return f"{path} holds {n} rows, not the {rows} recorded"
        want = sums.get(_sum_key(path))
        if want is not None and sha256_file(path) != want:
            return f"{path} does not match its recorded sha256 {want[:12]}"
    return None


def _read_marker(path: Path) -> dict[str, Any] | None:
    """A marker's (or the plan's) JSON; None when it is damaged: a file renamed into place
    can be empty or cut short after a power cut, and the work it stands for is redone."""
    try:
        result = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("%s is damaged (%s): its work is redone", path, e)
        return None
    return result if isinstance(result, dict) else None


def _cached(marker: Path, files: Any) -> tuple[dict[str, Any] | None, str]:
    """The marker's result when it exists and its files are intact, else (None, why the
    work is redone: empty when there is no marker)."""
    if not _done(marker):
        return None, ""
    result = _read_marker(marker)
    if result is None:
        return None, f"{marker} is damaged"
    problem = _damage(files(result), result.get("sha256", {}))
    if problem is None:
        return dict(result, skipped=True), ""
    return None, problem


def _sum_key(path: Path) -> str:
    """A marker's name for one of its files: ``shards/part-00000.parquet`` and
    ``drops/part-00000.parquet`` share a file name."""
    return f"{path.parent.name}/{path.name}"


def _sums(paths: list[Path]) -> dict[str, str]:
    """SHA-256 of each file a marker covers (checked when a resumed build skips it)."""
    return {_sum_key(p): sha256_file(p) for p in paths}


def crash_point(name: str) -> None:
    """Test hook: ``DATA_TEST_CRASH_AT=<name>`` kills the whole build (its process group,
    as a power cut would) at that named point with SIGKILL, so a test can land a crash
    exactly on a racy line (files written but no marker, manifest renamed but no changelog).
    """
    if os.environ.get("DATA_TEST_CRASH_AT") == name:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _mark(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, json.dumps(payload, sort_keys=True))
    os.replace(tmp, path)


def _write_synced(path: Path, text: str, mode: int = 0o644) -> None:
    """Write and fsync, so that a rename after it cannot leave an empty file behind a power
    cut (ext4 delayed allocation; as sqlite and git fsync before renaming). ``mode`` applies
    from the file's creation (a key is never readable by others, even for a moment)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def pii_secret(cfg: BuildConfig) -> bytes:
    """The build's HMAC key for the PII log, kept beside the output, never inside it.

    ``<output_dir>/.pii_secrets/<version>.key`` is created once (from ``DATA_PII_SECRET``,
    hex, when set, so two output folders can be compared byte for byte; else random) and
    read by every worker, local or Ray, and by a resumed build.
    """
    p = Path(cfg.output_dir) / ".pii_secrets" / f"{cfg.version}.key"
    if not p.exists():
        import secrets

        env = os.environ.get("DATA_PII_SECRET", "")
        try:
            key = bytes.fromhex(env).hex() if env else secrets.token_hex(32)
        except ValueError:
            raise BuildError(
                "DATA_PII_SECRET is not hex. Fix: set it to an even number of hex digits "
                "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`), or unset it"
            ) from None
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
        _write_synced(tmp, key, 0o600)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, p)  # first writer wins; concurrent workers read its key
        tmp.unlink()
    try:
        key = bytes.fromhex(p.read_text().strip())
    except (ValueError, UnicodeDecodeError):
        key = b""
    if not key:  # an empty key file (a power cut) would key the PII log with b""
        raise BuildError(
            f"{p} is damaged (not a hex key); the PII logs of this version's finished shards "
            f"are keyed by the key it held. Fix: restore it from a copy, or delete it and "
            f"{cfg.version_dir / '_work'} to rebuild the version with a new key"
        )
    return key


def _inputs_key(cfg: BuildConfig) -> str:
    """Hash of what defines a version's output besides the sources' contents: the config
    (less run-only settings), the opt-out registry and the decontamination files."""
    config = {k: v for k, v in cfg.to_dict().items() if k not in RUN_ONLY_FIELDS}
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    registry = _registry_path(cfg) if cfg.optout.registry else ""
    for f in (registry, *cfg.decontam.files):
        h.update(b"\0" + (Path(f).read_bytes() if f and Path(f).is_file() else b""))
    return h.hexdigest()


def _registry_path(cfg: BuildConfig) -> str:
    """The opt-out registry this build reads: the copy ``_freeze_registry`` made at its
    start when there is one, else the configured file."""
    frozen = _work(cfg) / "optout.yaml"
    return str(frozen) if frozen.is_file() else cfg.optout.registry


def _load_registry(cfg: BuildConfig) -> OptOutRegistry:
    return OptOutRegistry.load(_registry_path(cfg)) if cfg.optout.registry else OptOutRegistry()


def _freeze_registry(cfg: BuildConfig) -> None:
    """Copy the opt-out registry into ``_work`` at the build's start (main process, under
    the version lock): every shard and the manifest read that copy, so an `optout add`
    while the build runs cannot apply to some shards and not others, or give the manifest
    a registry version its shards did not honour. The request applies from the next
    version (or a rebuild: the copy is taken again, and the plan's inputs hash refuses a
    resume with another registry)."""
    frozen = _work(cfg) / "optout.yaml"
    frozen.unlink(missing_ok=True)
    reg = cfg.optout.registry
    if reg and Path(reg).is_file():
        frozen.parent.mkdir(parents=True, exist_ok=True)
        tmp = frozen.with_name(frozen.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(Path(reg).read_bytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, frozen)
    _load_registry(cfg)  # the copy itself is checked (it may differ from what was checked)


def _plan(cfg: BuildConfig, *, check: bool = True) -> list[list[RepoUnit]]:
    """The version's shard plan: made once and kept in ``_work/plan.json``.

    Shards are balanced by input sizes, so a plan made again after the inputs changed (a
    resumed build, or a worker starting later) could put a repository in two shards or in
    none; every worker and every resume reads the first plan instead. ``check`` compares
    the plan's inputs hash with this config's: the build does it once before its workers
    start, so the workers pass ``check=False`` and do not rehash the inputs per shard.
    """
    p = _work(cfg) / "plan.json"
    if check and p.exists() and _read_marker(p) is None:
        # The plan decides which shard holds which repository, so every shard made under a
        # damaged one is redone with the new plan (only the build's main process gets here).
        for done in _work(cfg).glob("**/*.done"):
            done.unlink()
        p.unlink()
    made = p.exists()
    if not made or check:
        key = _inputs_key(cfg)
    if not made:
        plan = assign_shards(plan_units(cfg.sources), cfg.num_shards)
        payload = {"inputs_sha256": key, "shards": [[vars(u) for u in s] for s in plan]}
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f"{p.name}.{os.getpid()}.tmp")
        _write_synced(tmp, json.dumps(payload, sort_keys=True))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, p)  # first writer wins
        tmp.unlink()
    saved = json.loads(p.read_text())
    if check and saved["inputs_sha256"] != key:
        # A finished snapshot is not "resumed": say what it is (an opt-out request added
        # after it was built is the usual cause; the fix is the next version).
        finished = (cfg.version_dir / "manifest.json").exists()
        raise BuildError(
            f"{cfg.version_dir} "
            + (
                "is a finished snapshot built with a different config, opt-out registry or "
                "decontamination files; it is not rebuilt in place"
                if finished
                else "was started with a different config, opt-out registry or "
                "decontamination files; resuming would mix the two"
            )
            + f". Fix: build into a new version (version: ...), or delete {cfg.version_dir} "
            "to rebuild this one"
        )
    return [[RepoUnit(**u) for u in s] for s in saved["shards"]]


@contextlib.contextmanager
def _version_lock(cfg: BuildConfig):
    """Hold ``<version>/.lock`` for the build: a second build of it is refused."""
    import fcntl

    cfg.version_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.version_dir / ".lock", "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BuildError(
                f"another build is writing {cfg.version_dir}. Fix: wait for it to finish "
                "(rerun afterwards to resume), or build into another output_dir or version"
            ) from None
        yield


def stage1_shard(config: dict[str, Any], shard: int) -> dict[str, Any]:
    """Phase 1 for one shard; returns its step statistics (cached when already done)."""
    cfg = config_from_dict(config)
    marker = _work(cfg) / "stage1" / f"{shard:05d}.done"
    d = _work(cfg) / "stage1"
    cached, redo = _cached(
        marker,
        lambda r: {
            d / f"kept-{shard:05d}.parquet": r["kept"],
            d / f"drops-{shard:05d}.parquet": r["dropped"],
            d / f"pii-{shard:05d}.parquet": r["pii_logged"],
            d / f"optout-{shard:05d}.parquet": None,
        },
    )
    if cached is not None:
        return cached
    delay = float(os.environ.get("DATA_TEST_SHARD_DELAY_S", "0"))  # test hook: widen the
    if delay:  # window in which the resume test kills a build
        time.sleep(delay)
    units = _plan(cfg, check=False)[shard]
    registry = _load_registry(cfg)
    steps = [
        IngestStep(cfg.ingest),
        LanguageStep(cfg.language),
        LicenseStep(cfg.license),
        OptOutStep(registry),
        FilterStep(cfg.filters),
        PIIStep(cfg.pii, pii_secret(cfg)),
        DecontamStep(cfg.decontam),
        SignatureStep(cfg.dedup),
    ]
    sink: list[StageStats] = []
    kept = RowWriter(d / f"kept-{shard:05d}.parquet", KEPT_SCHEMA)
    drops = RowWriter(d / f"drops-{shard:05d}.parquet", DROP_SCHEMA)
    pii = RowWriter(d / f"pii-{shard:05d}.parquet", PII_LOG_SCHEMA)
    opted = RowWriter(d / f"optout-{shard:05d}.parquet", OPTOUT_SCHEMA)
    hasher = MinHasher(cfg.dedup.num_perm, cfg.dedup.shingle_size, cfg.dedup.seed)
    for rec in chain(steps, iter(units), sink, shard, cfg.num_shards):
        if rec.drop_stage:
            drops.add(drop_row(rec))
            if rec.drop_stage == "optout" and rec.content:
                # Kept aside (hash and signature only) so that copies of the opted-out
                # code elsewhere are removed by the dedup phase.
                opted.add(optout_row(rec, hasher))
            continue
        kept.add(kept_row(rec))
        for e in rec.redactions:
            pii.add(
                {
                    "repo": rec.repo,
                    "path": rec.path,
                    "type": e["type"],
                    "start": e["start"],
                    "end": e["end"],
                    "value_hmac": e["hmac"],
                }
            )
    opted.close()
    result = {
        "shard": shard,
        "kept": kept.close(),
        "dropped": drops.close(),
        "pii_logged": pii.close(),
        "stats": [s.to_dict() for s in sink],
        "sha256": _sums([kept.path, drops.path, pii.path, opted.path]),
    }
    crash_point(f"stage1-{shard}-unmarked")
    _mark(marker, result)
    return dict(result, skipped=False, redone=redo)


def dedup_phase(cfg: BuildConfig) -> dict[str, Any]:
    """Phase 2: find duplicates across all shards from hashes and signatures."""
    marker = _work(cfg) / "dedup.done"
    if _done(marker):
        cached = _read_marker(marker)
        if cached is not None:
            return cached
    t0, c0 = time.perf_counter(), time.thread_time()
    items: list[DedupItem] = []
    names: dict[tuple[int, int], str] = {}
    import numpy as np

    for shard in range(cfg.num_shards):
        t = pq.read_table(
            _work(cfg) / "stage1" / f"kept-{shard:05d}.parquet",
            columns=[
                "shard",
                "index",
                "sha256",
                "signature",
                "license_type",
                "stars",
                "commit_date",
                "repo",
                "path",
            ],
        ).to_pydict()
        for i in range(len(t["index"])):
            key = (t["shard"][i], t["index"][i])
            sig = t["signature"][i]
            items.append(
                DedupItem(
                    key,
                    t["sha256"][i],
                    np.frombuffer(sig, dtype=np.uint32) if sig else None,
                    t["license_type"][i],
                    t["stars"][i],
                    t["commit_date"][i],
                )
            )
            names[key] = f"{t['repo'][i]}/{t['path'][i]}"
    kept_count = len(items)
    for shard in range(cfg.num_shards):
        t = pq.read_table(_work(cfg) / "stage1" / f"optout-{shard:05d}.parquet").to_pydict()
        for i in range(len(t["index"])):
            key = (t["shard"][i], t["index"][i])
            sig = t["signature"][i]
            items.append(
                DedupItem(
                    key,
                    t["sha256"][i],
                    np.frombuffer(sig, dtype=np.uint32) if sig else None,
                    "",
                    0,
                    "",
                    opted_out=True,
                )
            )
            names[key] = f"{t['repo'][i]}/{t['path'][i]}"
    removed, counters = find_duplicates(items, cfg.dedup)
    by_shard: dict[str, list] = {}
    for (shard, index), (reason, surv) in sorted(removed.items()):
        by_shard.setdefault(str(shard), []).append([index, reason, names[surv]])
    stats = StageStats(
        "dedup",
        files_in=kept_count,
        files_out=kept_count - len(removed),
        counters=counters,
        seconds=time.perf_counter() - t0,
        cpu_seconds=time.thread_time() - c0,
    )
    for reason, _ in removed.values():
        stats.dropped[reason] = stats.dropped.get(reason, 0) + 1
    stats.dropped = dict(sorted(stats.dropped.items()))
    result = {"removed": by_shard, "stats": stats.to_dict()}
    crash_point("dedup-unmarked")
    _mark(marker, result)
    return result


def stage3_shard(config: dict[str, Any], shard: int) -> dict[str, Any]:
    """Phase 3 for one shard: write the output shard and the full drop table."""
    cfg = config_from_dict(config)
    marker = _work(cfg) / "stage3" / f"{shard:05d}.done"
    vdir = cfg.version_dir
    cached, redo = _cached(
        marker,
        lambda r: {
            vdir / "shards" / f"part-{shard:05d}.parquet": r["rows"],
            vdir / "drops" / f"part-{shard:05d}.parquet": r["dropped"],
            _pii_path(vdir, shard): None,
        },
    )
    if cached is not None:
        return cached
    removed_list = json.loads((_work(cfg) / "dedup.done").read_text())["removed"].get(
        str(shard), []
    )
    removed = {index: (reason, surv) for index, reason, surv in removed_list}
    s1 = _work(cfg) / "stage1"
    out = RowWriter(vdir / "shards" / f"part-{shard:05d}.parquet", KEPT_SCHEMA, OUTPUT_COLUMNS)
    drops = RowWriter(vdir / "drops" / f"part-{shard:05d}.parquet", DROP_SCHEMA)
    for batch in pq.ParquetFile(s1 / f"drops-{shard:05d}.parquet").iter_batches(512):
        for row in batch.to_pylist():
            drops.add(row)
    languages: dict[str, int] = {}
    licenses: dict[str, int] = {}
    license_ids: dict[str, int] = {}
    out_bytes = 0
    removed_bytes = 0
    for batch in pq.ParquetFile(s1 / f"kept-{shard:05d}.parquet").iter_batches(512):
        for row in batch.to_pylist():
            if row["index"] in removed:
                reason, surv = removed[row["index"]]
                removed_bytes += row["size"]
                drops.add(
                    {
                        "shard": shard,
                        "index": row["index"],
                        "repo": row["repo"],
                        "path": row["path"],
                        "stage": "dedup",
                        "reason": reason,
                        "size": row["size"],
                        "detail": f"survivor={surv}",
                    }
                )
                continue
            out.add({c: row[c] for c in OUTPUT_COLUMNS})
            out_bytes += row["size"]
            languages[row["language"] or "unknown"] = (
                languages.get(row["language"] or "unknown", 0) + 1
            )
            licenses[row["license_type"]] = licenses.get(row["license_type"], 0) + 1
            for lid in row["license_ids"]:
                license_ids[lid] = license_ids.get(lid, 0) + 1
    shutil.copyfile(s1 / f"pii-{shard:05d}.parquet", _pii_path(vdir, shard))
    result = {
        "shard": shard,
        "rows": out.close(),
        "dropped": drops.close(),
        "bytes": out_bytes,
        "removed_bytes": removed_bytes,
        "languages": languages,
        "licenses": licenses,
        "license_ids": license_ids,
        "sha256": _sums([out.path, drops.path, _pii_path(vdir, shard)]),
    }
    crash_point(f"stage3-{shard}-unmarked")
    _mark(marker, result)
    return dict(result, skipped=False, redone=redo)


def _say_redone(phase: str, results: list[dict[str, Any]]) -> None:
    """Log each shard whose finished output was damaged and has been made again."""
    for r in results:
        if r.get("redone"):
            log.warning("%s: shard %d redone: %s", phase, r["shard"], r["redone"])


def _pii_path(vdir: Path, shard: int) -> Path:
    p = vdir / "pii_log" / f"part-{shard:05d}.parquet"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def _sum(dicts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


MAIN_GUARD = (
    'put the call under `if __name__ == "__main__":` in the script: the build\'s worker '
    "processes (multiprocessing's forkserver) import the script, which then builds again"
)


def build(cfg: BuildConfig) -> dict[str, Any]:
    """Run (or resume) a build; returns the manifest. Writes ``<output_dir>/<version>/``."""
    if _called_from_mp_main():
        # A worker importing a script that calls build() at its top level: each worker
        # tried to build too and failed with "another build is writing" (the parent holds
        # the lock), and the parent with BrokenProcessPool.
        raise BuildError(f"data.build() ran inside a build worker; {MAIN_GUARD}")
    with _terminate_as_interrupt(), _version_lock(cfg):
        return _build(cfg)


def _called_from_mp_main() -> bool:
    """Whether a caller is a script's top level run as ``__mp_main__``: what
    multiprocessing names the main script when a spawn or forkserver child imports it.
    Only the module-level code counts (the import): a function of that script that a
    child process runs as its target is a deliberate call."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__mp_main__":
            return True
        frame = frame.f_back
    return False


class Interrupted(KeyboardInterrupt):
    """The build was stopped by a signal (SIGINT is Python's own KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a build runs, SIGTERM unwinds it like Ctrl-C: the workers are stopped and the
    lock released (by default SIGTERM ends this process only and orphans its workers,
    which keep writing the version). Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum: int, frame: Any) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_inputs(cfg: BuildConfig) -> None:
    """Refuse a decontamination file that is not there before any shard starts (it failed
    mid-build with "free space or fix permissions"), and say so when the opt-out registry
    named in the config does not exist: it is read as empty (no opt-outs, registry
    version 0), which a mistyped path would otherwise do silently; one that is not the
    registry's YAML is refused naming it."""
    for i, f in enumerate(cfg.decontam.files):
        if not Path(f).is_file():
            raise DataConfigError(
                f"decontam.files[{i}]",
                f"{f} does not exist",
                "give a text file (one string per line) or JSONL with a `text` field; a "
                "relative path is read from the build file's folder",
            )
    reg = cfg.optout.registry
    if reg and Path(reg).exists():
        OptOutRegistry.load(reg)  # a damaged registry is refused here, not in every shard
    elif reg:
        log.warning(
            "optout.registry %s does not exist: no opt-outs are applied (registry version "
            "0). If that is not intended, fix the path; `data optout add --registry %s ...` "
            "creates it.",
            reg,
            reg,
        )


def _build(cfg: BuildConfig) -> dict[str, Any]:
    t_start = time.perf_counter()
    vdir = cfg.version_dir
    _check_inputs(cfg)
    if cfg.tokenize.enabled and cfg.tokenize.tokenizer:
        from data.tokens import load_tokenizer

        load_tokenizer(cfg.tokenize)  # a wrong path or eos_token fails now, not at the end
    _freeze_registry(cfg)  # the registry every shard and the manifest read
    _plan(cfg)  # made (or checked against the config) before the workers start
    pii_secret(cfg)  # created before the workers start
    config = cfg.to_dict()
    executor = make_executor(cfg.executor, cfg.workers, cfg.progress)
    shards = list(range(cfg.num_shards))
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    s1 = executor.map(stage1_shard, config, shards, "curate shards")
    timings["stage1"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dd = dedup_phase(cfg)
    timings["dedup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    s3 = executor.map(stage3_shard, config, shards, "write shards")
    timings["stage3"] = time.perf_counter() - t0
    _say_redone("curate shards", s1)
    _say_redone("write shards", s3)
    stage_stats = merge_stats([[StageStats.from_dict(s) for s in r["stats"]] for r in s1])
    dedup_stats = StageStats.from_dict(dd["stats"])
    dedup_stats.bytes_in = sum(r["bytes"] + r["removed_bytes"] for r in s3)
    dedup_stats.bytes_out = sum(r["bytes"] for r in s3)
    stage_stats.append(dedup_stats)
    ingest = stage_stats[0]
    by_stage: dict[str, dict[str, int]] = {}
    for s in stage_stats:
        if s.dropped:
            by_stage[s.name] = s.dropped
    registry = _load_registry(cfg)
    files = [f"shards/part-{s:05d}.parquet" for s in shards]
    drop_files = [f"drops/part-{s:05d}.parquet" for s in shards]
    pii_files = [f"pii_log/part-{s:05d}.parquet" for s in shards]
    manifest = {
        "format": 1,
        "version": cfg.version,
        "config": {k: v for k, v in config.items() if k not in RUN_ONLY_FIELDS},
        "code_version": code_version(),
        "optout_registry_version": registry.version,
        "inputs": {"files": ingest.files_in, "bytes": ingest.bytes_in},
        "outputs": {"files": sum(r["rows"] for r in s3), "bytes": sum(r["bytes"] for r in s3)},
        "dropped": {"files": sum(r["dropped"] for r in s3), "by_stage": by_stage},
        "stages": [
            {k: v for k, v in s.to_dict().items() if k not in ("seconds", "cpu_seconds")}
            for s in stage_stats
        ],
        "languages": _sum([r["languages"] for r in s3]),
        "licenses": _sum([r["licenses"] for r in s3]),
        "license_ids": _sum([r["license_ids"] for r in s3]),
        "shards": [
            {"path": f, "rows": r["rows"], "sha256": sha256_file(vdir / f)}
            for f, r in zip(files, s3, strict=True)
        ],
        "drops": [
            {"path": f, "rows": r["dropped"], "sha256": sha256_file(vdir / f)}
            for f, r in zip(drop_files, s3, strict=True)
        ],
        "pii_logs": [{"path": f, "sha256": sha256_file(vdir / f)} for f in pii_files],
    }
    token_files: list[str] = []
    if cfg.tokenize.enabled:
        # Before the manifest, which marks a finished snapshot: a build that dies while
        # tokenizing is resumed (and tokenized again), not taken for a finished one.
        from data import tokens

        t0 = time.perf_counter()
        index = tokens.tokenize_snapshot(vdir, cfg.tokenize, parquet=files)
        timings["tokenize"] = time.perf_counter() - t0
        token_files = [index["tokenizer"], *(s["path"] for s in index["shards"])]
        token_files.append("tokens/index.json")
        manifest["tokens"] = [{"path": f, "sha256": sha256_file(vdir / f)} for f in token_files]
    # The manifest goes in last and whole: its presence marks a finished snapshot.
    tmp = vdir / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    write_checksums(vdir, [*files, *drop_files, *pii_files, *token_files], manifest=tmp)
    crash_point("manifest-unrenamed")
    os.replace(tmp, vdir / "manifest.json")
    crash_point("manifest-renamed")
    previous = _previous_version(Path(cfg.output_dir), cfg.version)
    append_changelog(Path(cfg.output_dir), cfg.version, manifest, previous)
    timings["total"] = time.perf_counter() - t_start
    report = {
        "timings_s": timings,
        "per_stage_s": {s.name: round(s.seconds, 4) for s in stage_stats},
        "per_stage_cpu_s": {s.name: round(s.cpu_seconds, 4) for s in stage_stats},
        "skipped_shards": {
            "stage1": sum(r.get("skipped", False) for r in s1),
            "stage3": sum(r.get("skipped", False) for r in s3),
        },
        "redone_shards": {
            "stage1": {r["shard"]: r["redone"] for r in s1 if r.get("redone")},
            "stage3": {r["shard"]: r["redone"] for r in s3 if r.get("redone")},
        },
    }
    (vdir / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return manifest


def _previous_version(output_dir: Path, version: str) -> str | None:
    """The newest finished version ordered before ``version`` (semantic order)."""
    key = version_key(version)
    versions = sorted(
        (
            p.name
            for p in output_dir.iterdir()
            if p.is_dir()
            and (p / "manifest.json").exists()
            and p.name != version
            and version_key(p.name) < key
        ),
        key=version_key,
    )
    return versions[-1] if versions else None

"""Command line: ``python -m data build|diff|optout add|stats|verify|redact`` (or
``jaxcore data``)."""

from __future__ import annotations

import argparse
import logging
import sys

from data.errors import DataError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="data", description="Code-dataset curation pipeline.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or resume) a snapshot from a YAML config")
    b.add_argument("config")
    b.add_argument("--workers", type=int, default=None, help="override config workers")
    b.add_argument("--executor", choices=["local", "ray"], default=None)
    b.add_argument("--no-progress", action="store_true")
    d = sub.add_parser("diff", help="files added, removed and changed between two snapshots")
    d.add_argument("v1")
    d.add_argument("v2")
    d.add_argument("--limit", type=int, default=20, help="paths to list per category")
    o = sub.add_parser("optout", help="manage the opt-out registry")
    osub = o.add_subparsers(dest="optcmd", required=True)
    a = osub.add_parser("add", help="add an opt-out request")
    a.add_argument("--registry", required=True)
    a.add_argument("--repo", default="")
    a.add_argument("--author", default="")
    a.add_argument("--path", default="")
    a.add_argument("--reason", required=True)
    a.add_argument("--date", default="")
    s = sub.add_parser("stats", help="summary of a finished snapshot")
    s.add_argument("version_dir")
    v = sub.add_parser(
        "verify",
        help="check a snapshot's files against its manifest.json",
        description="Re-hash every file of a finished snapshot and report the ones missing or "
        "not matching manifest.json (exit 1); rerunning the build redoes them.",
    )
    v.add_argument("version_dir", help="the snapshot folder (<output_dir>/<version>)")
    r = sub.add_parser("redact", help="redact PII in stdin to stdout (the pipeline's defaults)")
    r.add_argument("--lang", default=None, help="the file's language (default: $PII_LANG)")
    r.add_argument("--path", default=None, help="the file's path (default: $PII_PATH)")
    return p


def _verify(version_dir: str) -> int:
    """Print the published files that do not match manifest.json; 1 when any, else 0."""
    from data.snapshot import load_manifest, verify_manifest

    bad = verify_manifest(version_dir)
    for path, problem in sorted(bad.items()):
        print(f"MISMATCH {path}: {problem}")
    if bad:
        config = load_manifest(version_dir)["config"]
        print(
            f"{len(bad)} file(s) of {version_dir} do not match manifest.json. Fix: rerun "
            f"`data build` with this version's config (version: {config['version']}); it "
            "redoes the shards whose files do not match their recorded checksums",
            file=sys.stderr,
        )
        return 1
    print(f"ok: every file of {version_dir} matches manifest.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = _parser().parse_args(argv)
    if args.cmd == "redact":  # before logging/imports: only data.pii is loaded
        import os

        from data.pii import redact_text

        lang = args.lang if args.lang is not None else os.environ.get("PII_LANG", "")
        path = args.path if args.path is not None else os.environ.get("PII_PATH", "")
        text = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
        out = redact_text(text, lang=lang, path=path)
        sys.stdout.buffer.write(out.encode("utf-8", "surrogateescape"))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "build":
            import dataclasses

            from data.config import load_config
            from data.pipeline import build
            from data.stats import print_stats

            cfg = load_config(args.config)
            changes = {}
            if args.workers is not None:
                changes["workers"] = args.workers
            if args.executor:
                changes["executor"] = args.executor
            if args.no_progress:
                changes["progress"] = False
            cfg = dataclasses.replace(cfg, **changes)
            build(cfg)
            print_stats(cfg.version_dir)
        elif args.cmd == "diff":
            from data.snapshot import diff_versions

            d = diff_versions(args.v1, args.v2)
            for kind in ("added", "removed", "changed"):
                print(f"{kind}: {len(d[kind])}")
                for repo, path in d[kind][: args.limit]:
                    print(f"  {repo}/{path}")
        elif args.cmd == "optout":
            from data.optout import add_request

            reg = add_request(
                args.registry,
                repo=args.repo,
                author=args.author,
                file_path=args.path,
                reason=args.reason,
                date=args.date,
            )
            if reg.existing is not None:
                e = reg.existing
                print(
                    f"registry {args.registry} already has this rule (added {e.date}: "
                    f"{e.reason}); unchanged at version {reg.version} ({len(reg.entries)} "
                    "entries)"
                )
            else:
                print(
                    f"registry {args.registry} now at version {reg.version} "
                    f"({len(reg.entries)} entries)"
                )
        elif args.cmd == "stats":
            from data.stats import print_stats

            print_stats(args.version_dir)
        elif args.cmd == "verify":
            return _verify(args.version_dir)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if args.cmd != "build":
            raise
        import signal

        signum = getattr(e, "signum", signal.SIGINT)
        print(
            f"interrupted ({signal.Signals(signum).name}): finished shards are kept. Fix: "
            "rerun the same command to resume; the output is the same as an uninterrupted "
            "build's",
            file=sys.stderr,
        )
        return 128 + signum
    except OSError as e:
        if args.cmd != "build":
            raise
        where = f" ({e.filename})" if e.filename else ""
        print(
            f"error: {e.strerror or e}{where}. Fix: free space or fix permissions there, "
            "then rerun the same command: finished shards are kept",
            file=sys.stderr,
        )
        return 2
    return 0

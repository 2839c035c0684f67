"""Rebuild data/resources/linguist-heuristics.json from GitHub linguist's own files.

    python scripts/vendor_linguist_heuristics.py heuristics.yml languages.yml

Reads linguist's ``lib/linguist/heuristics.yml`` and ``languages.yml`` (the table in the
tree is from b45dbe9, MIT License, Copyright (c) 2017 GitHub, Inc.) and writes its
disambiguation rules with Ruby (Onigmo) regexes rewritten for Python's ``re``, the
filenames several languages claim, and every language name and alias. Patterns Python
cannot compile are left out and printed.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parents[1] / "data" / "resources" / "linguist-heuristics.json"
SOURCE = (
    "github-linguist/linguist lib/linguist/heuristics.yml and languages.yml at "
    "b45dbe9b2825a43285bcd035861be91cc0a7299e (2026-08-20), MIT License, Copyright (c) 2017 "
    "GitHub, Inc."
)
NOTE = (
    "heuristics: extension -> rules in linguist's order ({language, pattern: any of, "
    "negative: none of, and: all of}; named patterns expanded; Ruby regexes rewritten for "
    "Python: (?m) is (?s), ^/$ are line anchors, \\z is \\Z, (?<n>) is (?P<n>)); "
    "filename_candidates: filenames several languages claim, in languages.yml order; names: "
    "every linguist language name and alias, lower-cased -> the language's name"
)


def conv(p: str) -> str:
    """A linguist (Ruby) regex as a Python ``re`` pattern."""
    # Ruby (Onigmo) -> Python re. Ruby's ``(?m)`` is Python's dotall; ``^``/``$`` are always
    # line anchors in Ruby (compiled with re.M); ``\z`` is Python's ``\Z``.
    p = re.sub(r"\(\?([imx]+)([:)])", lambda m: "(?" + m.group(1).replace("m", "s") + m.group(2), p)
    p = p.replace("\\z", "\\Z").replace("\\h", "[0-9a-fA-F]")
    p = p.replace("[\\s&&[^\\r\\n]]", "[^\\S\\r\\n]")
    p = re.sub(r"\(\?<([A-Za-z_]\w*)>", r"(?P<\1>", p)
    p = p.replace("(?-m)", "")  # Ruby's (?-m): no dotall, Python's default
    # A flag group mid-pattern (``^(?i)...``) applies to the rest in Ruby; Python wants it first.
    m = re.search(r"(?<!^)\(\?([a-z]+)\)", p)
    if m:
        p = "(?" + m.group(1) + ")" + p[: m.start()] + p[m.end() :]
    # ``\g<name>`` (a subroutine call) is the named group's text again, without the name.
    for name in re.findall(r"\\g<(\w+)>", p):
        start = p.index("(?P<" + name + ">")
        depth, i = 0, start
        while True:
            c = p[i]
            if c == "\\":
                i += 2
                continue
            depth += c == "("
            depth -= c == ")"
            i += 1
            if depth == 0:
                break
        body = "(?:" + p[start + len(name) + 5 : i]
        p = p.replace("\\g<" + name + ">", body)
    return p


def pats(x: str | list[str]) -> list[str]:
    return [x] if isinstance(x, str) else list(x)


def rule(r: dict, named: dict) -> dict:
    """One heuristics.yml rule in the table's form."""
    out = {}
    lang = r.get("language")
    if lang is not None:
        out["language"] = lang if isinstance(lang, str) else lang[0]
    pos = []
    if "pattern" in r:
        pos += pats(r["pattern"])
    if "named_pattern" in r:
        pos += pats(named[r["named_pattern"]])
    neg = []
    if "negative_pattern" in r:
        neg += pats(r["negative_pattern"])
    if pos:
        out["pattern"] = [conv(p) for p in pos]
    if neg:
        out["negative"] = [conv(p) for p in neg]
    if "and" in r:
        out["and"] = [rule(s, named) for s in r["and"]]
    return out


def check(r: dict, ext: list[str], bad: list) -> None:
    """Drop (and record in ``bad``) the patterns Python cannot compile."""
    for k in ("pattern", "negative"):
        keep = []
        for p in r.get(k, []):
            try:
                re.compile(p, re.M)
                keep.append(p)
            except re.error as e:
                bad.append((ext, r.get("language"), str(e), p[:80]))
        if k in r:
            r[k] = keep
    for s in r.get("and", []):
        check(s, ext, bad)


def build(heuristics: dict, languages: dict) -> tuple[dict, list]:
    """The vendored table, and the patterns left out."""
    named, bad, table = heuristics["named_patterns"], [], {}
    for d in heuristics["disambiguations"]:
        rules = [rule(r, named) for r in d["rules"]]
        for r in rules:
            check(r, d["extensions"], bad)
        for e in d["extensions"]:
            table[e.lstrip(".").lower()] = rules
    claims = collections.defaultdict(list)
    names: dict[str, str] = {}
    for n, d in languages.items():
        for f in d.get("filenames") or []:
            claims[f].append(n)
        for a in [n, *(d.get("aliases") or [])]:
            names.setdefault(a.lower(), n)
    out = {
        "source": SOURCE,
        "note": NOTE,
        "heuristics": table,
        "filename_candidates": {f: v for f, v in sorted(claims.items()) if len(v) > 1},
        "names": names,
    }
    return out, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heuristics_yml", type=Path)
    parser.add_argument("languages_yml", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    out, bad = build(
        yaml.safe_load(args.heuristics_yml.read_text()),
        yaml.safe_load(args.languages_yml.read_text()),
    )
    args.out.write_text(json.dumps(out, indent=0))
    print(f"{len(out['heuristics'])} extensions, {len(out['filename_candidates'])} filenames")
    for b in bad:
        print("left out (Python cannot compile it):", b)


if __name__ == "__main__":
    main()

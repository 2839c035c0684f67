"""Reading a whole license file: split concatenated licenses, score every part.

License files often hold several texts: the project's own, then its bundled
dependencies' (numpy's LICENSE is 47 KB). Scoring a prefix cut at a size mixes two
licenses (an MIT text followed by 20 KB of others scored 0.785); scoring the whole
file lets the longest bundled text win. So the file is split at the places where one
license ends and another begins, each part is scored with askalono, and the parts are
reported in file order (the first is the project's license by convention).

askalono's SPDX template for LGPL-3.0 holds the GPL-3.0 text too, so a LGPL-3.0 text on
its own scores ~0.3; copyleft families are therefore also recognised by their title
lines (``GNU LESSER GENERAL PUBLIC LICENSE / Version 3``), and short files by their
standard notices (MPL-2.0's "This Source Code Form is subject to ..."), the rules
ScanCode uses for license *notices* as opposed to texts.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import re
from dataclasses import dataclass

import askalono

# Where a license text ends (its last sentence) and a separator or a new text begins.
END_LINE = re.compile(
    r"(?im)^.*(?:DEALINGS\s+IN\s+(?:THE\s+)?SOFTWARE\.?|SUCH\s+DAMAGE\.?|"
    r"PERFORMANCE\s+OF\s+THIS\s+SOFTWARE\.?|END\s+OF\s+TERMS\s+AND\s+CONDITIONS|"
    r"limitations\s+under\s+the\s+License\.)\s*$"
)
SEPARATOR = re.compile(r"(?m)^\s*(?:-{3,}|={3,}|\*{3,}|_{3,}|#{3,}|~{3,})\s*$")
BUNDLE_HEADER = re.compile(r"(?m)^(?:Name|Files|Package|Component):\s+\S")
TITLE = re.compile(
    r"(?im)^[ \t]*(?:the[ \t]+)?(?:GNU[ \t]+(?:LESSER|LIBRARY|AFFERO)?[ \t]*GENERAL[ \t]+PUBLIC"
    r"[ \t]+LICEN[CS]E|Apache[ \t]+License|Mozilla[ \t]+Public[ \t]+License|Eclipse[ \t]+"
    r"Public[ \t]+License|MIT[ \t]+License|BSD[ \t]+\d-Clause|ISC[ \t]+License|Boost[ \t]+"
    r"Software[ \t]+License|zlib[ \t]+License|Artistic[ \t]+License)\b"
)

# Copyleft titles with their version line: (regex over the first 600 chars, SPDX id).
TITLE_IDS = [
    (
        re.compile(r"(?is)GNU\s+LESSER\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+3"),
        "LGPL-3.0-only",
    ),
    (
        re.compile(r"(?is)GNU\s+LESSER\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+2\.1"),
        "LGPL-2.1-only",
    ),
    (
        re.compile(r"(?is)GNU\s+LIBRARY\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+2"),
        "LGPL-2.0-only",
    ),
    (
        re.compile(r"(?is)GNU\s+AFFERO\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+3"),
        "AGPL-3.0-only",
    ),
    (re.compile(r"(?is)GNU\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+3"), "GPL-3.0-only"),
    (re.compile(r"(?is)GNU\s+GENERAL\s+PUBLIC\s+LICEN[CS]E\s+Version\s+2"), "GPL-2.0-only"),
    (re.compile(r"(?is)Mozilla\s+Public\s+License\s*,?\s+(?:Version|v\.?)\s*2\.0"), "MPL-2.0"),
    (re.compile(r"(?is)Mozilla\s+Public\s+License\s*,?\s+(?:Version|v\.?)\s*1\.1"), "MPL-1.1"),
    (re.compile(r"(?is)Eclipse\s+Public\s+License\s*-?\s*v(?:ersion)?\s*2\.0"), "EPL-2.0"),
    (re.compile(r"(?is)Eclipse\s+Public\s+License\s*-?\s*v(?:ersion)?\s*1\.0"), "EPL-1.0"),
]
# Standard notices (the short form a license asks projects to put in files/READMEs).
NOTICES = [
    (
        re.compile(
            r"(?is)subject\s+to\s+the\s+terms\s+of\s+the\s+Mozilla\s+Public\s+License,?"
            r"\s+v\.?\s*2\.0"
        ),
        "MPL-2.0",
    ),
    (
        re.compile(r"(?is)GNU\s+Lesser\s+General\s+Public\s+License.{0,200}?version\s+3"),
        "LGPL-3.0-or-later",
    ),
    (
        re.compile(r"(?is)GNU\s+Lesser\s+General\s+Public\s+License.{0,200}?version\s+2\.1"),
        "LGPL-2.1-or-later",
    ),
    (
        re.compile(r"(?is)GNU\s+Affero\s+General\s+Public\s+License.{0,200}?version\s+3"),
        "AGPL-3.0-or-later",
    ),
    (re.compile(r"(?is)GNU\s+General\s+Public\s+License.{0,200}?version\s+3"), "GPL-3.0-or-later"),
    (re.compile(r"(?is)GNU\s+General\s+Public\s+License.{0,200}?version\s+2"), "GPL-2.0-or-later"),
    (re.compile(r"(?is)Eclipse\s+Public\s+License\s+v\.?\s*2\.0"), "EPL-2.0"),
    (
        re.compile(r"(?is)Licensed\s+under\s+the\s+Apache\s+License,?\s+Version\s+2\.0"),
        "Apache-2.0",
    ),
]
WHOLE_SURE = 0.95
"""A whole file scoring this high is one license text, whatever its separators."""
MIN_PART = 200
"""Parts shorter than this (a stray heading, a copyright line) are not scored alone."""
NOTICE_MAX = 4000
"""A file this short that is not a full text may be a license notice."""
FULL_TEXT = 1500
"""A part at least this long whose title names a copyleft license is that license's text."""


@dataclass(frozen=True, slots=True)
class LicenseMatch:
    """One license found in a file: SPDX id, score, where the part starts, and how."""

    spdx: str
    score: float
    start: int
    method: str  # "askalono", "title", "notice", "spdx", "readme" or "manifest"
    expression: str = ""
    """The SPDX expression the id was read from (``MIT OR Apache-2.0``), when one was:
    its ORs and ANDs decide the license type, not the id alone."""


def _identify(text: str) -> tuple[str, float]:
    res = askalono.identify(text)
    name = res.name
    # askalono ranks Pixar (Apache-2.0 with a changed trademark clause) above Apache-2.0
    # when an Apache text lacks its appendix; only a text that names Pixar is Pixar's.
    if name == "Pixar" and "pixar" not in text.lower():
        name = "Apache-2.0"
    return name, float(res.score)


# A line that starts with "Copyright": askalono drops these before matching (measured:
# "Copyright (C) 1990-2026 A. All rights reserved." lines above an MIT text leave its score
# 1.0). Lines it keeps stay in the key: "(c) 1990 A" or "© 1990 A" (score 0.991), two
# "# Copyright" or " * Copyright" comment lines (0.991), and license wording that starts
# a line ("COPYRIGHT HOLDERS BE LIABLE").
COPYRIGHT_LINE = re.compile(
    r"(?im)^[ \t]*copyright\b(?!\s+(?:holders?|notices?|owners?|laws?|and|or)\b).*$"
)
_MATCHES: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
_MATCHES_MAX = 4096


def askalono_match(text: str) -> tuple[str, float]:
    """askalono's best SPDX id and score for a text, cached by the text less its copyright
    lines and whitespace: pyaskalono 0.2 loads its license store on every call (~0.14 s,
    even for an empty text), and a corpus's license files are mostly the same few texts
    under other copyright holders (an MIT LICENSE per repository), which askalono scores
    alike (it strips copyright statements too; `tests/data/test_license_cache_stop42.py`
    checks the answers against askalono's own)."""
    body = " ".join(COPYRIGHT_LINE.sub("", text).split())
    key = hashlib.sha1(f"{'pixar' in text.lower()}|{body}".encode()).hexdigest()
    if key in _MATCHES:
        _MATCHES.move_to_end(key)
        return _MATCHES[key]
    _MATCHES[key] = found = _identify(text)
    if len(_MATCHES) > _MATCHES_MAX:
        _MATCHES.popitem(last=False)
    return found


def split_parts(text: str) -> list[tuple[int, str]]:
    """(offset, part) of each license text in a file, in order."""
    cuts = {0, len(text)}
    cuts.update(m.end() for m in END_LINE.finditer(text))
    cuts.update(m.start() for m in SEPARATOR.finditer(text))
    cuts.update(m.start() for m in BUNDLE_HEADER.finditer(text))
    for m in TITLE.finditer(text):
        # A title opens a new text, unless the text before it on this side is only a
        # heading or copyright lines of the same license.
        cuts.add(text.rfind("\n\n", 0, m.start()) + 1 if m.start() else 0)
    points = sorted(cuts)
    parts = []
    for a, b in itertools.pairwise(points):
        chunk = text[a:b]
        if SEPARATOR.fullmatch(chunk.strip()) or not chunk.strip():
            continue
        if parts and len(parts[-1][1].strip()) < MIN_PART:
            parts[-1] = (parts[-1][0], parts[-1][1] + chunk)  # a heading joins its text
        else:
            parts.append((a, chunk))
    return [(a, p) for a, p in parts if len(p.strip()) >= MIN_PART] or [(0, text)]


def _title_id(part: str) -> str | None:
    head = part.lstrip()[:600]
    for rx, spdx in TITLE_IDS:
        if rx.search(head):
            return spdx
    return None


def _notice_id(text: str) -> str | None:
    for rx, spdx in NOTICES:
        if rx.search(text):
            return spdx
    return None


def identify_parts(text: str, min_score: float = 0.8, max_parts: int = 16) -> list[LicenseMatch]:
    """Every license found in a license file, the project's own first.

    The whole file is read: each part is scored; a copyleft text is also known by its
    title; a short file that is no full text is read as a notice.
    """
    text = text.strip()
    if not text:
        return []
    found: list[LicenseMatch] = []
    parts = split_parts(text)
    whole_name, whole_score = askalono_match(text)
    # A near-verbatim single text scores high as a whole even when its own sections look
    # like cuts; a bundle scores middling as a whole (its longest text wins) and is split.
    if whole_score >= (min_score if len(parts) == 1 else WHOLE_SURE):
        return [LicenseMatch(whole_name, whole_score, 0, "askalono")]
    for start, part in parts[:max_parts]:
        name, score = askalono_match(part) if len(parts) > 1 else (whole_name, whole_score)
        if score >= min_score:
            found.append(LicenseMatch(name, score, start, "askalono"))
            continue
        title = _title_id(part)
        if title and len(part) >= FULL_TEXT:
            found.append(LicenseMatch(title, score, start, "title"))
    if not found and len(text) <= NOTICE_MAX:
        notice = _notice_id(text)
        if notice:
            found.append(LicenseMatch(notice, 1.0, 0, "notice"))
    return found


# --------------------------------------------------------------------------- file headers

_BLOCKS = (
    ('"""', '"""'),
    ("'''", "'''"),
    ('r"""', '"""'),
    ("/*", "*/"),
    ("(*", "*)"),
    ("{-", "-}"),
    ("<!--", "-->"),
    ("{#", "#}"),
    ("<#", "#>"),
    ("--[[", "]]"),
    ("=begin", "=end"),
)
_COMMENT_LINE = re.compile(
    r"(?:#|//|\*|--|;|%|!|'|::|\.\.(?:\s|$)|(?:@?REM|dnl)(?:\s|$))", re.IGNORECASE
)
_PROLOG = re.compile(r"(?:#!|<\?php|<\?xml|<!DOCTYPE|---$|@echo\s+off)", re.IGNORECASE)


def header_block(text: str, limit: int = 3000) -> str:
    """A file's leading comments: shebang or XML/PHP prolog, comment lines, block comments
    and docstrings, up to its first line of code.

    A license tag or notice counts only here, where REUSE and the Linux kernel put it: a
    ``SPDX-License-Identifier`` inside a string or test fixture further down (a license
    tool's own source) declares nothing about the file.
    """
    kept: list[str] = []
    closer = ""
    for line in text[:limit].splitlines():
        if closer:
            kept.append(line)
            closer = "" if closer in line else closer
            continue
        s = line.strip().lstrip("\ufeff")
        if not s or _PROLOG.match(s):
            kept.append(line)
            continue
        block = next(((o, c) for o, c in _BLOCKS if s.startswith(o)), None)
        if block:
            kept.append(line)
            closer = "" if block[1] in s[len(block[0]) :] else block[1]
            continue
        if _COMMENT_LINE.match(s):
            kept.append(line)
            continue
        break
    return "\n".join(kept)


_GNU = re.compile(
    r"(?is)(?:redistribute\s+it\s+and/or\s+modify|is\s+free\s+software).{0,300}?under\s+the\s+"
    r"terms\s+of\s+the\s+GNU\s+(Lesser\s+|Library\s+|Affero\s+)?General\s+Public\s+"
    r"Licen[cs]e.{0,200}?version\s+(\d(?:\.\d)?)(.{0,120}?any\s+later\s+version)?"
)
_GNU_IDS = {"": "GPL", "lesser": "LGPL", "library": "LGPL", "affero": "AGPL"}
HEADER_NOTICES = [
    (
        re.compile(r"(?is)Licensed\s+under\s+the\s+Apache\s+License,?\s+Version\s+2\.0"),
        "Apache-2.0",
    ),
    (NOTICES[0][0], "MPL-2.0"),
    (
        re.compile(
            r"(?is)made\s+available\s+under\s+the\s+terms\s+of\s+the\s+Eclipse\s+Public\s+"
            r"License\s+v\.?\s*2\.0"
        ),
        "EPL-2.0",
    ),
]


def header_notice_id(text: str) -> str | None:
    """The SPDX id of a standard license notice in a file's leading comments (the GNU
    "This program is free software ... under the terms of the GNU General Public License
    ... version 2 ... or any later version" paragraph, Apache's "Licensed under the
    Apache License, Version 2.0", MPL-2.0's and EPL-2.0's), as ScanCode detects notices;
    a passing mention of a license ("unlike the GPL version 2 tool") is no notice."""
    head = header_block(text)
    m = _GNU.search(head)
    if m:
        family = _GNU_IDS[(m.group(1) or "").strip().lower()]
        version = m.group(2) if "." in m.group(2) else m.group(2) + ".0"
        if family == "LGPL" and version == "2.0" and "lesser" in (m.group(1) or "").lower():
            version = "2.1"
        return f"{family}-{version}-{'or-later' if m.group(3) else 'only'}"
    for rx, spdx in HEADER_NOTICES:
        if rx.search(head):
            return spdx
    return None

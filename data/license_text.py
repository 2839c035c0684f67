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
import html
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
    # Creative Commons' own notice ("This work is licensed under a Creative Commons
    # Attribution 4.0 International License"), as docs folders carry it.
    (
        re.compile(
            r"(?is)Creative\s+Commons\s+Attribution[- ]Non-?Commercial[- ]ShareAlike\s+4\.0"
        ),
        "CC-BY-NC-SA-4.0",
    ),
    (
        re.compile(r"(?is)Creative\s+Commons\s+Attribution[- ]Non-?Commercial\s+4\.0"),
        "CC-BY-NC-4.0",
    ),
    (re.compile(r"(?is)Creative\s+Commons\s+Attribution[- ]ShareAlike\s+4\.0"), "CC-BY-SA-4.0"),
    (re.compile(r"(?is)Creative\s+Commons\s+Attribution\s+4\.0\s+International"), "CC-BY-4.0"),
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


_HTML = re.compile(r"(?i)<(?:html|body|p|br|li|div|h[1-6]|pre)\b[^>]*>")
_HTML_BREAK = re.compile(
    r"(?i)<(?:br|/p|p|/li|li|/div|div|/h[1-6]|h[1-6]|/pre|pre|/ol|ol|/ul|ul)\b[^>]*>"
)


def html_to_text(text: str) -> str:
    """A license page saved as HTML (``LICENSE.html``) as the plain text it shows:
    block tags and ``<br>`` end lines (``</p>`` a paragraph), other tags go, entities are
    decoded; text without HTML block tags is returned as it is."""
    if not _HTML.search(text):
        return text
    text = re.sub(r"(?is)<(script|style|head)\b.*?</\1\s*>|<!--.*?-->|<!DOCTYPE[^>]*>", "", text)
    text = re.sub(r"(?i)</p\s*>|</li\s*>|</h[1-6]\s*>", "\n\n", text)
    text = _HTML_BREAK.sub("\n", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = html.unescape(text)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line.strip() for line in text.split("\n")))


# A license file whose opening paragraph offers a choice of the texts that follow
# ("dual-licensed under ... or ...", "under the terms of either ... at your option").
_CHOICE_PREAMBLE = re.compile(
    r"(?is)\bdual[- ]licen[cs]ed\b|\beither\b.{0,300}\bor\b|at\s+your\s+(?:option|choice)"
)


def _choice_preamble(text: str) -> bool:
    """Whether the file opens with a paragraph, itself no license text, that offers a
    choice between the licenses it holds ("This project is dual-licensed under ...")."""
    first = re.split(r"\n\s*\n", text, maxsplit=1)[0]
    return (
        len(first) <= 600
        and not TITLE.search(first)
        # The GNU notice's "either version 2 of the License, or (at your option) any
        # later version" is a choice of versions, not of the texts that follow.
        and not re.search(r"(?i)later\s+version|version\s+\d[\d.]*\s+of\s+the", first)
        and _CHOICE_PREAMBLE.search(first) is not None
    )


def identify_parts(text: str, min_score: float = 0.8, max_parts: int = 16) -> list[LicenseMatch]:
    """Every license found in a license file, the project's own first.

    The whole file is read: each part is scored; a copyleft text is also known by its
    title; a short file that is no full text is read as a notice. A file that opens by
    offering a choice of its texts ("dual-licensed under MIT or Apache-2.0") declares
    their OR, kept as the first match's expression.
    """
    text = html_to_text(text).strip()
    choice = _choice_preamble(text)
    # A choice's texts are each read, even when the longest one scores high as a whole.
    found = _identify_parts(text, min_score, max_parts, whole_first=not choice)
    ids = list(dict.fromkeys(m.spdx for m in found))
    if len(ids) > 1 and choice:
        first = found[0]
        found[0] = LicenseMatch(
            first.spdx, first.score, first.start, first.method, " OR ".join(ids)
        )
    return found


def _identify_parts(
    text: str, min_score: float, max_parts: int, whole_first: bool = True
) -> list[LicenseMatch]:
    if not text:
        return []
    found: list[LicenseMatch] = []
    parts = split_parts(text)
    whole_name, whole_score = askalono_match(text)
    # A near-verbatim single text scores high as a whole even when its own sections look
    # like cuts; a bundle scores middling as a whole (its longest text wins) and is split.
    if whole_score >= (min_score if len(parts) == 1 else WHOLE_SURE) and (
        whole_first or len(parts) == 1
    ):
        # Unless the file opens with another whole text: a short MIT text followed by a
        # bundled dependency's 35 KB GPL text scores GPL-3.0 0.95+ as a whole, yet the
        # first text is the project's own (numpy's LICENSE.txt layout).
        first_name, first_score = askalono_match(parts[0][1]) if len(parts) > 1 else ("", 0.0)
        if first_score < min_score or first_name == whole_name:
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


# Short notices naming a permissive license, as projects put them in file headers and
# minified bundles: "Licensed under the MIT License. See License.txt ...", "Released
# under the MIT license", "| MIT License |" (a banner), "@license MIT" (JSDoc).
_UNDER = (
    r"(?:licen[cs]ed|released|distributed|available|provided)\s+under\s+(?:the\s+)?"
    r"(?:terms\s+of\s+the\s+)?"
)
SHORT_NOTICES = [
    (
        re.compile(
            rf"(?i){_UNDER}\(?MIT\)?(?:\s+licen[cs]e|\b(?!-))|\|\s*MIT\s+licen[cs]e\s*\||@license\s+MIT\b"
        ),
        "MIT",
    ),
    (re.compile(rf"(?i){_UNDER}(?:new\s+|modified\s+)?BSD[ -]3[ -]Clause\b"), "BSD-3-Clause"),
    (re.compile(rf"(?i){_UNDER}(?:simplified\s+)?BSD[ -]2[ -]Clause\b"), "BSD-2-Clause"),
    (re.compile(rf"(?i){_UNDER}ISC\s+licen[cs]e"), "ISC"),
    (re.compile(rf"(?i){_UNDER}Boost\s+Software\s+Licen[cs]e"), "BSL-1.0"),
    (re.compile(rf"(?i){_UNDER}zlib\s+licen[cs]e"), "Zlib"),
]


# A proprietary notice in a file's header (the common "Unauthorized copying of this file,
# via any medium is strictly prohibited / Proprietary and confidential" template): the
# file grants no license, read as SPDX's ``LicenseRef-Proprietary`` (non-permissive).
PROPRIETARY_NOTICE = re.compile(
    r"(?is)\bproprietary\s+and\s+confidential\b|\bconfidential\s+and\s+proprietary\b|"
    r"unauthori[sz]ed\s+(?:copying|use|reproduction)\b.{0,80}?\bstrictly\s+prohibited|"
    r"\b(?:this\s+(?:file|code|software|source\s+code)|it)\s+is\s+proprietary\b"
)


# The leading comment markers of a header's lines (`` * ``, ``//``, ``#``, ``--``, ``;;``,
# ``%``, ``!``, ``'``, ``REM``, ``dnl``), taken off so a notice wrapped over several comment
# lines reads as its sentence ("the Mozilla Public\n// License, v. 2.0").
_MARKER = re.compile(r"(?im)^[ \t]*(?:/\*+|\*+/?|//+|#+|--+|;+|%+|!+|'+|@?REM\b|dnl\b)?[ \t]?")

# A whole permissive text (its grant sentence) in a file's header, as single-file
# libraries carry their license: ISC's, MIT's and BSD's permission paragraphs.
GRANT_NOTICES = [
    (
        re.compile(
            r"(?is)Permission\s+to\s+use,\s+copy,\s+modify,\s+and(?:/or)?\s+distribute\s+"
            r"this\s+software\s+for\s+any\s+purpose\s+with\s+or\s+without\s+fee\s+is\s+hereby\s+"
            r"granted.{0,400}?AS\s+IS.{0,20}?AND\s+THE\s+AUTHOR\s+DISCLAIMS"
        ),
        "ISC",
    ),
    (
        re.compile(
            r"(?is)Permission\s+is\s+hereby\s+granted,\s+free\s+of\s+charge,\s+to\s+any\s+"
            r"person\s+obtaining\s+a\s+copy.{0,900}?substantial\s+portions\s+of\s+the\s+"
            r"Software"
        ),
        "MIT",
    ),
    (
        re.compile(
            r"(?is)Redistribution\s+and\s+use\s+in\s+source\s+and\s+binary\s+forms,\s+with\s+"
            r"or\s+without\s+modification,\s+are\s+permitted.{0,900}?Neither\s+the\s+name"
        ),
        "BSD-3-Clause",
    ),
    (
        re.compile(
            r"(?is)Redistribution\s+and\s+use\s+in\s+source\s+and\s+binary\s+forms,\s+with\s+"
            r"or\s+without\s+modification,\s+are\s+permitted.{0,1200}?SUCH\s+DAMAGE"
        ),
        "BSD-2-Clause",
    ),
]
# JSDoc's ``@license <SPDX expression>`` (``@license AGPL-3.0-or-later``), and the EUPL's
# own notice ("Licensed under the EUPL, Version 1.2 or - as soon they will be approved").
_JSDOC_LICENSE = re.compile(r"(?m)@license[ \t]+([A-Za-z0-9][A-Za-z0-9.+-]*)[ \t]*(?:\*+/)?[ \t]*$")
_EUPL = re.compile(r"(?is)Licen[cs]ed\s+under\s+the\s+EUPL,?\s+(?:Version|v\.?)\s*(1\.[12])")


def header_notice_id(text: str) -> str | None:
    """The SPDX id of a standard license notice in a file's leading comments (the GNU
    "This program is free software ... under the terms of the GNU General Public License
    ... version 2 ... or any later version" paragraph, Apache's "Licensed under the
    Apache License, Version 2.0", MPL-2.0's and EPL-2.0's), as ScanCode detects notices;
    a passing mention of a license ("unlike the GPL version 2 tool") is no notice."""
    head = _MARKER.sub("", header_block(text))
    m = _GNU.search(head)
    if m:
        family = _GNU_IDS[(m.group(1) or "").strip().lower()]
        version = m.group(2) if "." in m.group(2) else m.group(2) + ".0"
        if family == "LGPL" and version == "2.0" and "lesser" in (m.group(1) or "").lower():
            version = "2.1"
        return f"{family}-{version}-{'or-later' if m.group(3) else 'only'}"
    for rx, spdx in HEADER_NOTICES + SHORT_NOTICES + GRANT_NOTICES:
        if rx.search(head):
            return spdx
    m = _EUPL.search(head)
    if m:
        return f"EUPL-{m.group(1)}"
    m = _JSDOC_LICENSE.search(head)
    if m and m.group(1).upper() != "MIT":
        return m.group(1)
    return "LicenseRef-Proprietary" if PROPRIETARY_NOTICE.search(head) else None

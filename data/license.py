"""License detection and classification.

License files (LICENSE, COPYING, NOTICE, README's license section) are identified by
text matching with askalono (``pyaskalono``; SPDX's license texts); ``SPDX-License-Identifier``
lines are parsed with ``license-expression``. A license found in a directory covers every
file under it (the nearest one wins); a file's own SPDX line overrides it. A license is
permissive when its SPDX id is on Blue Oak Council's list (vendored, ``@blueoak/list``
15.0.0, CC0) or in ScanCode's *Permissive* or *Public Domain* categories (the ScanCode
LicenseDB index shipped with ``license-expression``).
"""

from __future__ import annotations

import configparser
import fnmatch
import functools
import json
import os
import posixpath
import re
import tempfile
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import license_expression

from data.config import LicenseConfig
from data.license_text import LicenseMatch, header_block, header_notice_id, identify_parts
from data.records import FileRecord, StageStats
from data.step import StepRun

LICENSE_FILE = re.compile(
    r"^(un)?licen[cs]e([-_.][\w.-]+)?$|^copying([-_.][\w.-]+)?$|^copyright(\.\w+)?$|"
    r"^notice(\.\w+)?$|^mit-license(\.\w+)?$",
    re.I,
)
README_FILE = re.compile(r"^readme(\.\w+)?$", re.I)
# ``license.py``, ``License.java``, ``license_check.go``, ``licenses.ts``: source files
# named after licenses, not license texts (licensee also leaves code extensions out).
CODE_SUFFIX = re.compile(
    r"\.(py|pyi|pyx|js|mjs|cjs|jsx|ts|tsx|go|java|kt|kts|scala|groovy|rb|php|c|h|cc|cpp|cxx|"
    r"hpp|hh|cs|fs|vb|rs|swift|m|mm|dart|lua|pl|pm|r|jl|ex|exs|erl|hs|ml|clj|sh|bash|zsh|ps1|"
    r"bat|vue|svelte|json|ya?ml|toml|xml|css|scss|less|sql|proto|gradle|ipynb|lock)$",
    re.I,
)
# The expression ends at the line's end or at a comment's closer: C ``*/``, OCaml and
# Pascal ``*)``, Haskell ``-}``, HTML ``-->``, Jinja ``#}``.
SPDX_LINE = re.compile(r"SPDX-License-Identifier:\s*([^\n*#]+?)\s*(?:\*/|\*\)|-\}|-->|#\}|$)", re.M)
MANIFEST_FILE = re.compile(
    r"^(package\.json|composer\.json|pyproject\.toml|Cargo\.toml|setup\.cfg|"
    # Other ecosystems' manifests: RubyGems, Cabal/hpack, R, Maven, NuGet, Mix.
    r"DESCRIPTION|package\.yaml|pom\.xml|mix\.exs|[^/]+\.gemspec|[^/]+\.cabal|[^/]+\.nuspec|"
    # vcpkg, Elm, D's dub, Bower (JSON ``license``); conda-build's recipe ``meta.yaml``
    # (``about: license:``), CocoaPods, opam, LuaRocks, Nimble, setuptools' ``setup.py``.
    r"vcpkg\.json|elm\.json|dub\.json|bower\.json|meta\.yaml|[^/]+\.podspec|opam|[^/]+\.opam|"
    r"[^/]+\.rockspec|[^/]+\.nimble|setup\.py|"
    # Python core metadata (an sdist's ``PKG-INFO``); CPAN's ``META.json``/``META.yml``,
    # ExtUtils::MakeMaker's ``Makefile.PL`` and Dist::Zilla's ``dist.ini``.
    r"PKG-INFO|META\.json|META\.yml|Makefile\.PL|dist\.ini)$"
)
LICENSE_REF = re.compile(r"(?:DocumentRef-[A-Za-z0-9.-]+:)?LicenseRef-[A-Za-z0-9.-]+")
PROPRIETARY_MARKERS = frozenset({"UNLICENSED", "PROPRIETARY"})
"""npm's and others' word for "no permission granted": a declared license, not an absent one."""
_README_SECTION = re.compile(
    r"^(#+\s*|)(?:[^\w\s]+\s*)?licen[cs]e\s*:?\s*$\n(?:[-=~]+\s*\n)?([\s\S]{0,3000})", re.M | re.I
)
# Names a README's license section spells out: (pattern, SPDX id).
_README_NAMES = [
    (re.compile(r"\bApache\s+(?:Licen[cs]e,?\s+)?(?:Version\s+|v)?2\.0\b", re.I), "Apache-2.0"),
    (re.compile(r"\bMIT\b"), "MIT"),
    (re.compile(r"\b(?:BSD[ -]3[ -]Clause|3[ -]Clause\s+BSD)\b", re.I), "BSD-3-Clause"),
    (re.compile(r"\b(?:BSD[ -]2[ -]Clause|2[ -]Clause\s+BSD)\b", re.I), "BSD-2-Clause"),
    (
        re.compile(r"\bMozilla\s+Public\s+Licen[cs]e,?\s+(?:Version\s+|v\.?\s*)?2\.0", re.I),
        "MPL-2.0",
    ),
    (re.compile(r"\bBoost\s+Software\s+Licen[cs]e\b", re.I), "BSL-1.0"),
    (re.compile(r"\bThe\s+Unlicense\b", re.I), "Unlicense"),
    # Software::License's Perl_5 file and POD: "under the same terms as the Perl 5
    # programming language system itself" (CPAN::Meta's ``perl_5``).
    (
        re.compile(r"\bsame\s+terms\s+as\s+(?:the\s+)?Perl(?:\s*5)?\b", re.I),
        "(Artistic-1.0-Perl OR GPL-1.0-or-later)",
    ),
]
# A token that is an SPDX id as written (``Apache-2.0``, ``GPL-3.0-or-later``, ``0BSD``).
_README_TOKEN = re.compile(r"(?<![\w/.-])[A-Za-z0-9][A-Za-z0-9.+-]*\d[A-Za-z0-9.+-]*(?<![.])")
_CHOICE = re.compile(r"\beither\b|at\s+your\s+option|\bdual[- ]licen", re.I)

# CRAN's ``LICENSE`` for "MIT + file LICENSE" (and BSD): only the year and the holder;
# the license is the one DESCRIPTION names.
_R_LICENSE_STUB = re.compile(r"(?i)(?:(?:YEAR|COPYRIGHT HOLDER|ORGANIZATION):[^\n]*\s*)+")

PERMISSIVE = "permissive"
NO_LICENSE = "no_license"
NON_PERMISSIVE = "non_permissive"
UNIDENTIFIED = "unidentified_license"
"""A LICENSE/COPYING file whose text matches no known license: excluded by default,
since keeping it as ``no_license`` would let unrecognised copyleft texts through."""


@functools.cache
def _licensing() -> license_expression.Licensing:
    return license_expression.get_spdx_licensing()


@functools.cache
def permissive_ids() -> frozenset[str]:
    """SPDX ids on the allow-list: Blue Oak's list plus ScanCode Permissive/Public Domain."""
    ids: set[str] = set()
    blueoak = json.loads(
        (Path(__file__).parent / "resources" / "blueoak-list-15.0.0.json").read_text()
    )
    for rating in blueoak:
        ids.update(lic["id"] for lic in rating["licenses"])
    index_path = Path(license_expression.__file__).parent / "data" / "scancode-licensedb-index.json"
    for entry in json.loads(index_path.read_text()):
        if entry.get("category") in ("Permissive", "Public Domain") and not entry.get(
            "is_exception"
        ):
            for key in [entry.get("spdx_license_key"), *entry.get("other_spdx_license_keys", [])]:
                if key and not key.startswith("LicenseRef-"):
                    ids.add(key)
    return frozenset(ids)


def parse_spdx(expression: str) -> license_expression.LicenseExpression | None:
    """Parse an SPDX expression; None when it does not parse or names unknown licenses."""
    if not expression.strip():
        return None
    try:
        info = _licensing().validate(expression, strict=False)
    except Exception:
        return None
    if info.errors or info.invalid_symbols:
        # SPDX's user-defined ids (``LicenseRef-Proprietary``, REUSE's custom licenses)
        # are valid ids, just on no list: kept, so they decide (never permissive).
        refs = all(LICENSE_REF.fullmatch(str(sym)) for sym in info.invalid_symbols)
        unknown_only = all(e.startswith("Unknown license key") for e in info.errors)
        if not (info.invalid_symbols and refs and unknown_only):
            return None
        try:
            return _licensing().parse(expression)
        except Exception:
            return None
    try:
        return _licensing().parse(info.normalized_expression)
    except Exception:
        return None


def expression_keys(expression: str) -> tuple[str, ...]:
    """The license ids an SPDX expression names (exceptions left out), sorted."""
    parsed = parse_spdx(expression)
    if parsed is None:
        return ()
    symbols = _licensing().license_symbols(parsed, decompose=True)
    licenses = {s.key for s in symbols if not getattr(s, "is_exception", False)}
    # An exception alone (a REUSE ``LICENSES/Classpath-exception-2.0.txt``) still names itself.
    return tuple(sorted(licenses or {s.key for s in symbols}))


def classify_expression(expression: str, extra: Iterable[str] = ()) -> str:
    """``permissive`` when some choice of an OR, and every part of an AND, is permissive."""
    parsed = parse_spdx(expression)
    if parsed is None:
        return NON_PERMISSIVE
    allowed = permissive_ids() | set(extra)

    def ok(node) -> bool:
        if isinstance(node, license_expression.LicenseWithExceptionSymbol):
            return node.license_symbol.key in allowed
        if isinstance(node, license_expression.LicenseSymbol):
            return node.key in allowed
        if isinstance(node, _licensing().OR):
            return any(ok(a) for a in node.args)
        return all(ok(a) for a in node.args)

    return PERMISSIVE if ok(parsed) else NON_PERMISSIVE


def identify_text(text: str, min_score: float = 0.8) -> tuple[str, ...]:
    """SPDX ids of a license file's text, the project's own first (whole file read)."""
    return tuple(dict.fromkeys(m.spdx for m in license_matches(text, min_score)))


def expression_matches(expressions: Iterable[str], method: str) -> list[LicenseMatch]:
    """One match per license id the valid expressions name, each keeping its expression."""
    found: dict[str, LicenseMatch] = {}
    for e in expressions:
        for k in expression_keys(e):
            found.setdefault(k, LicenseMatch(k, 1.0, 0, method, e))
    return list(found.values())


# A condition added on top of an open-source text that takes a right away: the Commons
# Clause ("the License does not grant to you, the right to Sell the Software"), which
# ScanCode lists as its own non-permissive license (``commons-clause``). The text under it
# (Apache-2.0, MIT) still scores high, so the file would read as that license alone.
_RIDERS = [
    (
        re.compile(
            r"(?is)\bCommons\s+Clause\W{0,3}\s+License\s+Condition|"
            r"does\s+not\s+grant\s+to\s+you,?\s+the\s+right\s+to\s+Sell\s+the\s+Software"
        ),
        "LicenseRef-Commons-Clause",
    ),
]


def license_matches(text: str, min_score: float = 0.8) -> list[LicenseMatch]:
    """``SPDX-License-Identifier`` lines if any, else every license text in the file; a
    rider that restricts the text under it (the Commons Clause) comes first, ANDed with
    that text, so the file is no more permissive than the rider."""
    ids = [m.group(1).strip() for m in SPDX_LINE.finditer(text[:4000])]
    found = expression_matches(ids, "spdx") or identify_parts(text, min_score)
    for rx, rider in _RIDERS:
        if rx.search(text):
            base = found[0].expression or found[0].spdx if found else ""
            expression = f"{rider} AND ({base})" if base else rider
            found = [LicenseMatch(rider, 1.0, 0, "notice", expression), *found]
    return found


@dataclass(frozen=True)
class ManifestFields:
    """What a package manifest says about its license, before any file is read."""

    values: tuple[str, ...] = ()
    """License strings it declares (not validated)."""
    files: tuple[str, ...] = ()
    """The file that is its license, relative to its folder: Cargo's ``license-file``,
    PEP 621's ``license = {file = ...}``, setuptools' ``license_file``, npm's ``SEE
    LICENSE IN <file>``. Text that names no known license is ``unidentified_license``."""
    listed: tuple[str, ...] = ()
    """Files (or globs) it ships as license files: PEP 639's ``license-files``,
    setuptools' ``license_files``. They may include AUTHORS or NOTICE files, so one whose
    text names no license counts only when it is named like a license (LICENSE, COPYING)."""
    inherits: tuple[str, ...] = ()
    """Cargo fields taken from the workspace (``license.workspace = true``):
    ``license`` and/or ``license-file``."""
    workspace: str | None = None
    """Cargo ``package.workspace``: the workspace root's folder, relative to this one."""
    is_workspace: bool = False
    """A Cargo workspace root (it has a ``[workspace]`` table)."""
    workspace_values: tuple[str, ...] = ()
    """Cargo ``[workspace.package] license``."""
    workspace_files: tuple[str, ...] = ()
    """Cargo ``[workspace.package] license-file``, relative to the workspace root."""


def _strings(value: object) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    return tuple(v.strip() for v in items if isinstance(v, str) and v.strip())


def _cfg_list(value: str) -> tuple[str, ...]:
    """A setuptools list option: one per line or comma separated."""
    return tuple(v.strip() for v in re.split(r"[,\n]", value) if v.strip())


def _cargo_fields(data: dict) -> ManifestFields:
    package = data.get("package", {})
    package = package if isinstance(package, dict) else {}
    license_value, license_file = package.get("license", ""), package.get("license-file", "")
    inherits = tuple(
        key
        for key, v in (("license", license_value), ("license-file", license_file))
        if isinstance(v, dict) and v.get("workspace") is True
    )
    workspace = data.get("workspace")
    shared = workspace.get("package", {}) if isinstance(workspace, dict) else {}
    shared = shared if isinstance(shared, dict) else {}
    return ManifestFields(
        # Cargo's deprecated "MIT/Apache-2.0" means either license.
        values=tuple(v.replace("/", " OR ") for v in _strings(license_value)),
        files=_strings(license_file),
        inherits=inherits,
        workspace=package.get("workspace") if isinstance(package.get("workspace"), str) else None,
        is_workspace=isinstance(workspace, dict),
        workspace_values=tuple(v.replace("/", " OR ") for v in _strings(shared.get("license"))),
        workspace_files=_strings(shared.get("license-file")),
    )


_QUOTED = re.compile(r"""["']([^"'\n]+)["']""")


def _either(values: Iterable[str]) -> tuple[str, ...]:
    """Several declared licenses (a gemspec's, Mix's or Maven's list) offer a choice, as
    npm and composer read theirs."""
    values = [v.strip() for v in values if v.strip()]
    return (" OR ".join(f"({v})" for v in values),) if len(values) > 1 else tuple(values)


def _other_manifest(name: str, content: str) -> ManifestFields:
    """License fields of other ecosystems' manifests, read by pattern (they are code or
    formats of their own): a gemspec's ``s.license(s) =``, Cabal's and hpack's
    ``license:``, R's DESCRIPTION ``License:``, Maven's ``<licenses><license><name>``,
    NuGet's ``<license type="expression">``, Mix's ``licenses: [...]``."""
    if name.endswith(".gemspec"):
        m = re.search(r"\.licen[cs]es?\s*=\s*(\[[^\]]*\]|%w[\[(][^\])]*[\])]|\S[^\n]*)", content)
        if not m:
            return ManifestFields()
        raw = m.group(1)
        words = raw[3:-1].split() if raw.startswith("%w") else _QUOTED.findall(raw)
        return ManifestFields(values=_either(words))
    if name.endswith(".cabal") or name == "package.yaml":
        m = re.search(r"(?im)^license\s*:\s*(\S[^\n]*?)\s*$", content)
        return ManifestFields(values=(m.group(1).strip("'\""),) if m else ())
    if name == "DESCRIPTION":
        m = re.search(r"(?m)^License:[ \t]*(\S[^\n]*(?:\n[ \t]+\S[^\n]*)*)", content)
        if not m:
            return ManifestFields()
        value = " ".join(m.group(1).split())
        # "MIT + file LICENSE": the file adds the year and holder; "GPL-2 | GPL-3": a choice.
        value = re.sub(r"\s*\+\s*file\s+LICEN[CS]E\S*", "", value, flags=re.I)
        return ManifestFields(values=_either(value.split("|")))
    if name == "pom.xml":
        block = re.search(r"(?is)<licenses>(.*?)</licenses>", content)
        names = re.findall(r"(?is)<name>\s*(.*?)\s*</name>", block.group(1)) if block else []
        return ManifestFields(values=_either(names))
    if name.endswith(".nuspec"):
        m = re.search(
            r"""(?is)<license\s+type=["']expression["']\s*>\s*(.*?)\s*</license>""", content
        )
        return ManifestFields(values=(m.group(1),) if m else ())
    if name == "mix.exs":
        m = re.search(r"licenses:\s*\[([^\]]*)\]", content)
        return ManifestFields(values=_either(_QUOTED.findall(m.group(1))) if m else ())
    if name == "meta.yaml":
        # conda-build: ``about:`` holds ``license:`` (an SPDX id; ``license_family`` and
        # ``license_file`` are other keys); Jinja ``{{ }}`` values name nothing.
        about = re.search(r"(?ms)^about:[ \t]*\n((?:[ \t]+[^\n]*\n?|[ \t]*\n)*)", content)
        m = about and re.search(
            r"(?m)^[ \t]+license[ \t]*:[ \t]*(\S[^\n#]*?)[ \t]*$", about.group(1)
        )
        value = m.group(1).strip("'\"") if m else ""
        return ManifestFields(values=(value,) if value and "{{" not in value else ())
    if name.endswith(".podspec"):
        # ``s.license = 'MIT'`` or ``{ :type => 'MIT', :file => 'LICENSE' }`` / ``type: 'MIT'``.
        m = re.search(
            r"""\.license\s*=\s*(?:\{[^}]*?(?::type\s*=>|\btype:)\s*)?["']([^"'\n]+)["']""", content
        )
        return ManifestFields(values=(m.group(1),) if m else ())
    if name == "opam" or name.endswith(".opam"):
        m = re.search(r"(?m)^license\s*:\s*(\[[^\]]*\]|\"[^\"\n]*\")", content)
        return ManifestFields(values=_either(_QUOTED.findall(m.group(1))) if m else ())
    if name.endswith((".rockspec", ".nimble")):
        m = re.search(r"""(?m)^\s*license\s*=\s*["']([^"'\n]+)["']""", content)
        return ManifestFields(values=(m.group(1),) if m else ())
    if name in ("META.json", "META.yml", "Makefile.PL", "dist.ini"):
        return ManifestFields(values=_perl_licenses(name, content))
    if name == "PKG-INFO":
        return ManifestFields(values=_core_metadata_licenses(content))
    if name == "setup.py":
        # Only a literal ``license="..."`` argument (a variable names nothing readable).
        m = re.search(r"""\blicense\s*=\s*(?:[rRuU])?["']([^"'\n]+)["']""", content)
        return ManifestFields(values=(m.group(1),) if m else ())
    return ManifestFields()


def manifest_fields(name: str, content: str) -> ManifestFields:
    """The license fields of a package manifest (raises ValueError and friends on a
    manifest that does not parse)."""
    # A byte-order mark (Windows editors write one) is no part of JSON, TOML or INI.
    content = content.lstrip("\ufeff")
    if name == "META.json" or not re.search(r"\.(json|toml|cfg)$", name):
        return _other_manifest(name, content)
    if name.endswith(".json"):
        data = json.loads(content)
        if not isinstance(data, dict):
            return ManifestFields()
        declared = data.get("license", data.get("licenses"))
        items = declared if isinstance(declared, list) else [declared]
        # npm's legacy {"type": "MIT"} objects; a list offers a choice (npm, composer).
        values = [i.get("type") if isinstance(i, dict) else i for i in items]
        values = [v.strip() for v in values if isinstance(v, str) and v.strip()]
        # npm: "SEE LICENSE IN <filename>" points at a file in the package.
        files = tuple(
            m.group(1).strip()
            for v in values
            if (m := re.match(r"SEE\s+LICEN[CS]E\s+IN\s+(\S.*)$", v, re.I))
        )
        values = [v for v in values if not v.upper().startswith("SEE LICEN")]
        if len(values) > 1:
            values = [" OR ".join(f"({v})" for v in values)]
        return ManifestFields(values=tuple(values), files=files)
    if name == "setup.cfg":
        cfg = configparser.ConfigParser(interpolation=None)
        cfg.read_string(content)
        files = _strings(cfg.get("metadata", "license_file", fallback=""))
        listed = _cfg_list(cfg.get("metadata", "license_files", fallback=""))
        # Trove classifiers speak only where no license field or named file does.
        trove = _classifier_licenses(cfg.get("metadata", "classifiers", fallback="").splitlines())
        return ManifestFields(
            values=_strings(cfg.get("metadata", "license", fallback=""))
            or (() if files or listed else trove),
            files=files,
            listed=listed,
        )
    data = tomllib.loads(content)
    if name == "Cargo.toml":
        return _cargo_fields(data)
    project = data.get("project", {})
    project = project if isinstance(project, dict) else {}
    value = project.get("license") or data.get("tool", {}).get("poetry", {}).get("license")
    listed = _strings(project.get("license-files"))  # PEP 639: globs
    classifiers = project.get("classifiers") or data.get("tool", {}).get("poetry", {}).get(
        "classifiers"
    )
    trove = _classifier_licenses(classifiers if isinstance(classifiers, list) else [])
    if isinstance(value, dict):  # PEP 621: {text = "..."} or {file = "..."}
        text, file = _strings(value.get("text")), _strings(value.get("file"))
        return ManifestFields(text or (() if file else trove), file, listed)
    return ManifestFields(_strings(value) or (() if listed else trove), listed=listed)


# CPAN::Meta::Spec's license strings (``META.json``/``META.yml``, MakeMaker's ``LICENSE``)
# and Software::License's class names (``dist.ini``), lower-cased: SPDX expressions.
_CPAN_LICENSES = {
    "perl": "Artistic-1.0-Perl OR GPL-1.0-or-later",
    "perl_5": "Artistic-1.0-Perl OR GPL-1.0-or-later",
    "apache": "Apache-2.0",
    "apache_2_0": "Apache-2.0",
    "apache_1_1": "Apache-1.1",
    "artistic": "Artistic-1.0",
    "artistic_1": "Artistic-1.0",
    "artistic_2": "Artistic-2.0",
    "artistic_2_0": "Artistic-2.0",
    "bsd": "BSD-3-Clause",
    "freebsd": "BSD-2-Clause",
    "mit": "MIT",
    "isc": "ISC",
    "zlib": "Zlib",
    "cc0_1_0": "CC0-1.0",
    "gpl": "GPL-1.0-or-later",
    "gpl_1": "GPL-1.0-only",
    "gpl_2": "GPL-2.0-only",
    "gpl_3": "GPL-3.0-only",
    "agpl_3": "AGPL-3.0-only",
    "lgpl": "LGPL-2.1-or-later",
    "lgpl_2_1": "LGPL-2.1-only",
    "lgpl_3_0": "LGPL-3.0-only",
    "mozilla_1_1": "MPL-1.1",
    "mozilla_2_0": "MPL-2.0",
    "mpl_2_0": "MPL-2.0",
    "restricted": "UNLICENSED",
}


def _perl_licenses(name: str, content: str) -> tuple[str, ...]:
    """A CPAN distribution's declared license: ``META.json``/``META.yml`` ``license``
    (a list offers a choice), ``Makefile.PL`` ``LICENSE => 'perl'``, ``dist.ini``
    ``license = Perl_5``; CPAN's ``unknown``/``open_source`` name no license."""
    if name == "META.json":
        data = json.loads(content)
        raw = data.get("license") if isinstance(data, dict) else None
        words = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    elif name == "META.yml":
        m = re.search(r"(?m)^license\s*:\s*(\[[^\]\n]*\]|[^\n#]+?)\s*$", content)
        words = re.findall(r"[\w.-]+", m.group(1)) if m else []
    elif name == "Makefile.PL":
        m = re.search(r"""\bLICENSE\s*=>\s*["']([^"'\n]+)["']""", content)
        words = [m.group(1)] if m else []
    else:
        m = re.search(r"(?m)^license\s*=\s*(\S+)\s*$", content)
        words = [m.group(1)] if m else []
    values = [_CPAN_LICENSES.get(w.strip().lower(), "") for w in words if isinstance(w, str)]
    return _either([v for v in values if v])


# PyPI's ``License ::`` trove classifiers whose last part names no version or is vague.
_TROVE_NAMES = {
    "apache software license": "Apache-2.0",
    "academic free license (afl)": "AFL-3.0",
}
_TROVE_VAGUE = re.compile(
    r"(?i)^(?:OSI Approved|BSD License|Public Domain|Freeware|Freely Dis"
    r"tributable|Other/Proprietary License|DFSG approved|Repoze.*)$"
)


def _classifier_licenses(classifiers: Iterable[object]) -> tuple[str, ...]:
    """The licenses ``License :: ...`` trove classifiers name (several offer a choice, as
    a package listing MIT and Apache classifiers is dual-licensed); classifiers that
    name no one license (``BSD License``, ``OSI Approved``) declare nothing."""
    found = []
    for c in classifiers:
        parts = [p.strip() for p in str(c).split("::")]
        if len(parts) < 2 or parts[0] != "License" or _TROVE_VAGUE.match(parts[-1]):
            continue
        last = parts[-1]
        spdx = _TROVE_NAMES.get(last.lower()) or _declared_expression(
            re.sub(r"\([^)]*\)", " ", last).strip()
        )
        if spdx:
            found.append(spdx)
    return _either(list(dict.fromkeys(found)))


def _core_metadata_licenses(content: str) -> tuple[str, ...]:
    """Python core metadata (``PKG-INFO``): ``License-Expression`` (PEP 639), else a
    short ``License`` (older tools put a whole license text there, or ``UNKNOWN``), else
    the ``License ::`` classifiers."""
    head = content.split("\n\n", 1)[0]  # the body after the first blank line is the README
    fields = re.findall(r"(?m)^([A-Za-z-]+):[ \t]*(.*)$", head)
    for key, value in fields:
        if key.lower() == "license-expression" and value.strip():
            return (value.strip(),)
    for key, value in fields:
        value = value.strip()
        if key.lower() == "license" and value.upper() != "UNKNOWN" and _declared_expression(value):
            return (value,)
    return _classifier_licenses(v for k, v in fields if k.lower() == "classifier")


def _manifest_values(name: str, content: str) -> list[str]:
    """The license strings a package manifest declares (no validation); a Cargo
    workspace root without a ``[package]`` license declares its ``[workspace.package]``
    one."""
    fields = manifest_fields(name, content)
    return list(fields.values or (fields.workspace_values if not fields.files else ()))


def _in_repo(folder: str, name: str) -> str | None:
    """``name`` relative to ``folder`` as a repository path; None when it leaves the
    repository (``../..``, an absolute path)."""
    if name.startswith("/"):
        return None
    target = posixpath.normpath(posixpath.join(folder, name))
    if target == ".." or target.startswith("../"):
        return None
    return "" if target == "." else target


def _named_files(folder: str, names: Iterable[str], paths: Iterable[str]) -> list[str]:
    """The repository paths that ``names`` (paths or globs, relative to ``folder``) name."""
    out: list[str] = []
    for name in names:
        target = _in_repo(folder, name)
        if not target:
            continue
        if any(c in name for c in "*?["):
            out += sorted(p for p in paths if fnmatch.fnmatchcase(p, target))
        elif target in paths:
            out.append(target)
    return list(dict.fromkeys(out))


def _cargo_root(folder: str, fields: ManifestFields, roots: dict[str, ManifestFields]):
    """The folder of a Cargo member's workspace root: the one ``package.workspace``
    names, else the nearest folder up (its own included) whose Cargo.toml has a
    ``[workspace]`` table, as Cargo searches; None when there is none."""
    if fields.workspace is not None:
        named = _in_repo(folder, fields.workspace)
        return named if named is not None and named in roots else None
    d = folder
    while True:
        if d in roots:
            return d
        if not d:
            return None
        d = posixpath.dirname(d)


def _normalise_license_name(value: str) -> str:
    """``Apache License, Version 2.0`` -> ``Apache-2.0``; ``MIT License`` -> ``MIT``."""
    value = re.sub(r"\([^)]*\)|\blicen[cs]e\b|\bversion\b|,", " ", value, flags=re.I)
    value = re.sub(r"\s+v?(?=\d)", "-", value.strip(), flags=re.I)
    return re.sub(r"\s+", " ", value).strip()


def manifest_license(path: str, content: str) -> list[LicenseMatch]:
    """Licenses a package manifest (package.json, pyproject.toml, Cargo.toml, setup.cfg,
    composer.json) declares: SPDX expressions (or plain names like ``MIT License``);
    ``UNLICENSED`` is a proprietary declaration; a value that names no known license is
    ``unidentified_license``; ``SEE LICENSE IN ...`` and a manifest that cannot be read
    declare nothing (the license file decides)."""
    base = posixpath.basename(path)
    try:
        values = [v.strip() for v in _manifest_values(base, content) if v.strip()]
    except (ValueError, AttributeError, configparser.Error):
        return []
    return declared_matches(values)


def declared_matches(values: Iterable[str]) -> list[LicenseMatch]:
    """The matches of declared license strings: SPDX expressions or license names,
    ``UNLICENSED``, else ``unidentified_license``; none for no strings."""
    values = [v for v in values if v and not v.upper().startswith("SEE LICEN")]
    if not values:
        return []
    if any(v.upper() in PROPRIETARY_MARKERS for v in values):
        return [LicenseMatch("UNLICENSED", 1.0, 0, "manifest", "UNLICENSED")]
    found = (
        expression_matches(values, "manifest")
        or expression_matches([_normalise_license_name(v) for v in values], "manifest")
        or expression_matches([n for v in values if (n := _named_license(v))], "manifest")
        or expression_matches([e for v in values if (e := _choice_of_names(v))], "manifest")
    )
    return found or [LicenseMatch(UNIDENTIFIED, 0.0, 0, "manifest")]


def _declared_expression(value: str) -> str:
    """One declared value as an SPDX expression: itself, its normalised name or a known
    license name ('' when none)."""
    for candidate in (value, _normalise_license_name(value), _named_license(value)):
        if candidate and parse_spdx(candidate) is not None:
            return candidate
    return ""


def _choice_of_names(value: str) -> str:
    """A list of license names offered as a choice (Maven's ``<name>MIT License</name>``
    beside ``<name>Apache 2</name>``, joined by :func:`_either` as ``(MIT License) OR
    (Apache 2)``), each name mapped on its own; '' unless every one is known."""
    if not (value.startswith("(") and value.endswith(")") and ") OR (" in value):
        return ""
    parts = [_declared_expression(p) for p in value[1:-1].split(") OR (")]
    return " OR ".join(f"({p})" for p in parts) if all(parts) else ""


# License names other ecosystems write (R's "GPL (>= 2)", Cabal's "BSD3" and "GPL-3",
# Maven's "The Apache Software License, Version 2.0", "GNU Lesser General Public
# License, Version 2.1"): (pattern over the whole name, SPDX id or a template).
_GNU_NAME = re.compile(
    r"(?i)^(?:the\s+)?(?:GNU\s+)?(?P<fam>A|L|Lesser\s+|Library\s+|Affero\s+)?(?:GPL|"
    r"General\s+Public\s+Licen[cs]e)(?:\s*,?\s+(?:v(?:ersion)?\s*)?|\s*-\s*)?"
    r"(?:\(\s*>=?\s*(?P<min>\d(?:\.\d)?)\s*\)|(?P<ver>\d(?:\.\d)?))?"
    r"(?P<later>\s*(?:\+|or\s+(?:any\s+)?later(?:\s+version)?))?$"
)
_NAMED = [
    (
        re.compile(
            r"(?i)^(?:the\s+)?(?:new\s+|modified\s+)?BSD[\s_-]*3(?:[\s_-]*clause)?(?:\s+licen[cs]e)?$|^(?:the\s+)?new\s+BSD(?:\s+licen[cs]e)?$"
        ),
        "BSD-3-Clause",
    ),
    (
        re.compile(
            r"(?i)^(?:the\s+)?(?:simplified\s+)?BSD[\s_-]*2(?:[\s_-]*clause)?(?:\s+licen[cs]e)?$|^(?:the\s+)?simplified\s+BSD(?:\s+licen[cs]e)?$"
        ),
        "BSD-2-Clause",
    ),
    (
        re.compile(
            r"(?i)^(?:the\s+)?Apache\b.{0,40}?\b(?:v(?:ersion)?\s*)?\(?(?:==\s*)?2(?:\.0)?\)?$"
        ),
        "Apache-2.0",
    ),
    (re.compile(r"(?i)^(?:the\s+)?MIT(?:\s+licen[cs]e)?$"), "MIT"),
    (re.compile(r"(?i)^CC0(?:[\s-]1\.0)?$"), "CC0-1.0"),
    (
        re.compile(r"(?i)^(?:the\s+)?Mozilla\s+Public\s+Licen[cs]e,?\s+(?:v(?:ersion)?\s*)?2\.0$"),
        "MPL-2.0",
    ),
]


def _named_license(value: str) -> str:
    """The SPDX expression a license name stands for ('' when it is no name known)."""
    value = " ".join(value.split()).strip(" .")
    for rx, spdx in _NAMED:
        if rx.match(value):
            return spdx
    m = _GNU_NAME.match(value)
    if m and re.search(r"(?i)GPL|General\s+Public", value):
        fam = (m.group("fam") or "").strip().lower()
        prefix = {"": "GPL", "a": "AGPL", "affero": "AGPL"}.get(fam, "LGPL")
        version = m.group("min") or m.group("ver") or ("2.1" if prefix == "LGPL" else "1")
        version = version if "." in version else version + ".0"
        # R's "GPL (>= 2)" and an unversioned "GPL" admit later versions.
        later = m.group("min") or m.group("later") or not m.group("ver")
        return f"{prefix}-{version}-{'or-later' if later else 'only'}"
    return ""


# License-header templates for header checkers (license-maven-plugin's
# ``license-header.txt``, ``LICENSE_HEADER``, ``license.tmpl``): a notice to stamp on
# files, with ``${year}`` placeholders, not the license of the folder they sit in.
TEMPLATE_NAME = re.compile(r"(?i)header|templ|\.tmpl$|\.j2$|\.jinja2?$")


def _license_name(base: str) -> bool:
    return (
        LICENSE_FILE.match(base) is not None
        and not CODE_SUFFIX.search(base)
        and not TEMPLATE_NAME.search(base)
    )


def is_license_file(path: str) -> bool:
    """Whether a path names a license file (LICENSE, COPYING, NOTICE, ...), not source
    code named after one (``license.py``, ``License.java``)."""
    return _license_name(posixpath.basename(path))


def license_of_file(path: str, content: str, min_score: float) -> list[LicenseMatch]:
    """Licenses declared by a license file or a README's license section, with scores."""
    base = posixpath.basename(path)
    if _license_name(base):
        return license_matches(content, min_score) or _statement_matches(content)
    if README_FILE.match(base):
        ids = [m.group(1).strip() for m in SPDX_LINE.finditer(content)]
        found = expression_matches(ids, "spdx")
        if found:
            return found
        m = _README_SECTION.search(content)
        if m:
            section = _readme_section_text(m.group(2))
            inline = re.match(
                r"\s*(?:this project is |released |licensed )?(?:under )?(?:the )?"
                r"([A-Za-z0-9.+-]+(?: (?:AND|OR|WITH) [A-Za-z0-9.+-]+)*)\b",
                section,
            )
            if inline and expression_keys(inline.group(1)):
                return expression_matches([inline.group(1)], "readme")
            named = _readme_names(section)
            if named:
                return expression_matches([named], "readme")
            return license_matches(section, min_score)
    return []


STATEMENT_MAX = 1000
"""A license file this short that holds no license text may state one in words."""
_FILE_NAME_TOKEN = re.compile(r"(?i)\b(?:un)?(?:licen[cs]e|copying)[-_.][\w.-]*\w")


def _statement_matches(content: str) -> list[LicenseMatch]:
    """A short license file that holds no text but states its license: only an SPDX
    expression (``MIT``, ``GPL-3.0-or-later``, as ``licensee`` reads a one-line LICENSE),
    or words a README's license section would use ("This project is licensed under the
    MIT License"); other license files' names (``LICENSE-MIT``) are no statement."""
    if len(content) > STATEMENT_MAX:
        return []
    text = " ".join(_readme_section_text(content).split())
    if text and expression_keys(text) and not re.search(r"\s(?!AND\b|OR\b|WITH\b)\w+\s", text):
        return expression_matches([text], "statement")
    named = _readme_names(_FILE_NAME_TOKEN.sub(" ", text))
    return expression_matches([named], "statement") if named else []


def _names_sibling_license(path: str, content: str, live: dict) -> bool:
    """Whether a short license file only points at other license files beside it ("See
    LICENSE-MIT and LICENSE-APACHE"): those files decide, it declares nothing itself."""
    if len(content) > STATEMENT_MAX:
        return False
    folder = posixpath.dirname(path)
    return any(
        posixpath.join(folder, m.group(0)) in live and posixpath.join(folder, m.group(0)) != path
        for m in _FILE_NAME_TOKEN.finditer(content)
    )


def _readme_section_text(section: str) -> str:
    """A README license section up to its next heading, links and markup reduced to text
    (``[MIT](LICENSE)`` -> ``MIT``)."""
    section = re.split(r"(?m)^#{1,6}\s|^\S[^\n]*\n[-=~]{3,}\s*$", section, maxsplit=1)[0]
    section = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", section)  # badges
    section = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", section)
    section = re.sub(r"https?://\S+", " ", section)
    return re.sub(r"[*_`]+", "", section)


def _readme_names(section: str) -> str:
    """The expression a README license section states in words: the SPDX ids and license
    names it gives (``Distributed under the MIT License``), joined by OR when it offers a
    choice ("Licensed under either of ... at your option"), else by AND."""
    found: list[tuple[int, str]] = []
    for rx, spdx in _README_NAMES:
        found += [(m.start(), spdx) for m in rx.finditer(section)]
    for m in _README_TOKEN.finditer(section):
        keys = expression_keys(m.group(0))
        if keys == (m.group(0),):
            found.append((m.start(), m.group(0)))
    ids = list(dict.fromkeys(spdx for _, spdx in sorted(found)))
    if not ids:
        return ""
    return (" OR " if _CHOICE.search(section) else " AND ").join(ids)


class _Spill:
    """Record contents moved to a temporary file while a repository is buffered.

    A repository's license files may come after the files they cover, so its records
    wait until its last file has arrived; past ``limit`` bytes their contents wait on
    disk, so memory holds at most ``limit`` bytes of content whatever the repository's size.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.file: IO[bytes] | None = None
        self.where: dict[int, tuple[int, int]] = {}

    def add(self, rec: FileRecord) -> None:
        n = len(rec.content)
        if self.held + n <= self.limit:
            self.held += n
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="data-license-")  # noqa: SIM115 (closed in close())
        raw = rec.content.encode("utf-8", "surrogatepass")
        self.file.seek(0, os.SEEK_END)
        self.where[id(rec)] = (self.file.tell(), len(raw))
        self.file.write(raw)
        rec.content = ""

    def content(self, rec: FileRecord) -> str:
        spot = self.where.get(id(rec))
        if spot is None or self.file is None:
            return rec.content
        self.file.seek(spot[0])
        return self.file.read(spot[1]).decode("utf-8", "surrogatepass")

    def restore(self, rec: FileRecord) -> None:
        if id(rec) in self.where:
            rec.content = self.content(rec)
            del self.where[id(rec)]

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file, self.held, self.where = None, 0, {}


def _reuse_license(path: str) -> str:
    """The SPDX id a REUSE ``LICENSES/<id>.txt`` file is named for ('' for other paths)."""
    folder, base = posixpath.split(path)
    stem = base.rsplit(".", 1)[0] if "." in base else base
    if posixpath.basename(folder) != "LICENSES" or not expression_keys(stem):
        return ""
    return stem


def _reuse_matches(paths: list[str]) -> list[LicenseMatch]:
    """A REUSE ``LICENSES/`` folder's licenses, as one expression that needs them all.

    REUSE says which file is under which license in per-file headers (which decide when
    present); a file without one may be under any of them, so all must be permissive.
    """
    ids = sorted({_reuse_license(p) for p in paths})
    return expression_matches([" AND ".join(ids)], "reuse")


# ``LICENSE-3rdparty.csv`` (Datadog), ``LICENSE-THIRD-PARTY``, ``LICENSES-bundled.txt``:
# the licenses of a project's dependencies, not its own (like a NOTICE file).
THIRD_PARTY = re.compile(r"third[-_. ]?party|3rd[-_. ]?party|dependenc|bundled|vendor", re.I)


def _third_party(base: str) -> bool:
    return bool(THIRD_PARTY.search(base)) or base.lower().endswith((".csv", ".tsv"))


def _source_rank(base: str) -> int:
    """Which declaration wins in a folder (smaller first): a license file's text, then a
    package manifest's field, then a README's license section, then a NOTICE file or a
    list of the dependencies' licenses."""
    if README_FILE.match(base):
        return 2
    if MANIFEST_FILE.match(base):
        return 1
    return 3 if base.lower().startswith("notice") or _third_party(base) else 0


class LicenseStep:
    """Detect each repository's licenses and classify every file.

    A repository's records are held until its last one (they arrive contiguously from
    ingest) because its license files may come after the files they cover in path
    order; contents beyond ``max_buffer_bytes`` are held on disk (:class:`_Spill`).
    """

    name = "license"

    def __init__(self, config: LicenseConfig) -> None:
        self.config = config

    def run(self, records: Iterable[FileRecord], rank: int = 0, world_size: int = 1) -> StepRun:
        import time

        stats = StageStats(self.name)
        buf: list[FileRecord] = []
        spill = _Spill(self.config.max_buffer_bytes)
        repo = None

        def flush() -> Iterator[FileRecord]:
            t0, c0 = time.perf_counter(), time.thread_time()
            self._apply(buf, stats, spill)
            stats.seconds += time.perf_counter() - t0
            stats.cpu_seconds += time.thread_time() - c0
            for rec in buf:
                spill.restore(rec)
                yield from self._emit(rec, stats)
            spill.close()
            buf.clear()

        for rec in records:
            if rec.repo != repo and buf:
                yield from flush()
            repo = rec.repo
            buf.append(rec)
            if not rec.drop_stage:
                spill.add(rec)
        if buf:
            yield from flush()
        stats.dropped = dict(sorted(stats.dropped.items()))
        return stats

    def _emit(self, rec: FileRecord, stats: StageStats) -> Iterator[FileRecord]:
        if rec.drop_stage and rec.drop_stage != self.name:
            yield rec
            return
        stats.files_in += 1
        stats.bytes_in += rec.size
        if rec.drop_stage:
            stats.dropped[rec.drop_reason] = stats.dropped.get(rec.drop_reason, 0) + 1
        else:
            stats.files_out += 1
            stats.bytes_out += rec.size
        yield rec

    @staticmethod
    def _manifests(live: dict[str, FileRecord], spill: _Spill) -> dict[str, ManifestFields]:
        """Every package manifest of the repository that parses, by path."""
        out: dict[str, ManifestFields] = {}
        for path, rec in live.items():
            base = posixpath.basename(path)
            if MANIFEST_FILE.match(base):
                try:
                    out[path] = manifest_fields(base, spill.content(rec))
                except (ValueError, AttributeError, configparser.Error):
                    continue  # unreadable: declares nothing (the license file decides)
        return out

    def _declared(
        self,
        path: str,
        manifests: dict[str, ManifestFields],
        roots: dict[str, ManifestFields],
        live: dict[str, FileRecord],
        spill: _Spill,
    ) -> list[list[LicenseMatch]]:
        """What a manifest declares, one list per source: its license strings; else the
        text of the file it names; a Cargo member's ``license.workspace = true`` takes
        its workspace root's ``[workspace.package]`` license (or license-file, relative
        to the root), as Cargo's inheritance does; a workspace root without a license of
        its own declares its ``[workspace.package]`` one for its folder."""
        fields, folder = manifests[path], posixpath.dirname(path)
        values, files, base = fields.values, fields.files, folder
        if fields.inherits:
            root = _cargo_root(folder, fields, roots)
            shared = roots[root] if root is not None else ManifestFields()
            if "license" in fields.inherits and not values:
                values = shared.workspace_values
            if "license-file" in fields.inherits and not files:
                files, base = shared.workspace_files, root or ""
        elif fields.is_workspace and not values and not files:
            values, files = fields.workspace_values, fields.workspace_files
        if values:
            declared = declared_matches(values)
            return [declared] if declared else []
        out: list[list[LicenseMatch]] = []
        for target in _named_files(base, files, live):
            text = spill.content(live[target])
            matches = license_matches(text, self.config.min_score)
            if not matches and text.strip():
                matches = [LicenseMatch(UNIDENTIFIED, 0.0, 0, "none")]
            out += [matches] if matches else []
        for target in _named_files(folder, fields.listed, live):
            text = spill.content(live[target])
            matches = license_matches(text, self.config.min_score)
            named_like_one = is_license_file(target) and not posixpath.basename(
                target
            ).lower().startswith(("notice", "copyright"))
            if not matches and text.strip() and named_like_one:
                matches = [LicenseMatch(UNIDENTIFIED, 0.0, 0, "none")]
            out += [matches] if matches else []
        return out

    def _apply(self, buf: list[FileRecord], stats: StageStats, spill: _Spill) -> None:
        # directory -> (all ids, deciding file, primaries, deciding score)
        dir_licenses: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], float]] = {}
        found: dict[str, list[tuple[int, str, list[LicenseMatch]]]] = {}
        reuse: dict[str, list[str]] = {}
        live = {rec.path: rec for rec in buf if not rec.drop_stage}
        manifests = self._manifests(live, spill)
        roots = {
            posixpath.dirname(p): f
            for p, f in manifests.items()
            if f.is_workspace and posixpath.basename(p) == "Cargo.toml"
        }
        for rec in buf:
            if rec.drop_stage:
                continue
            base = posixpath.basename(rec.path)
            if rec.path in manifests:
                for matches in self._declared(rec.path, manifests, roots, live, spill):
                    stats.count("license_files")
                    found.setdefault(posixpath.dirname(rec.path), []).append((1, rec.path, matches))
                continue
            if _reuse_license(rec.path):
                reuse.setdefault(posixpath.dirname(posixpath.dirname(rec.path)), []).append(
                    rec.path
                )
                continue
            if not (_license_name(base) or README_FILE.match(base)):
                continue
            content = spill.content(rec)
            if _license_name(base) and _names_sibling_license(rec.path, content, live):
                continue
            matches = license_of_file(rec.path, content, self.config.min_score)
            if (
                not matches
                and _license_name(base)
                and content.strip()
                and not base.lower().startswith(("notice", "copyright"))
                and not _third_party(base)
                and not _R_LICENSE_STUB.fullmatch(content.strip())
            ):
                matches = [LicenseMatch(UNIDENTIFIED, 0.0, 0, "none")]
                stats.count("unidentified_license_files")
            if matches:
                stats.count("license_files")
                rank = _source_rank(base)
                found.setdefault(posixpath.dirname(rec.path), []).append((rank, rec.path, matches))
        for d, paths in reuse.items():
            stats.count("license_files", len(paths))
            found.setdefault(d, []).append((0, min(paths), _reuse_matches(paths)))
        for d, items in found.items():
            items.sort(key=lambda it: (it[0], it[1]))
            best = items[0][0]
            chosen = [lst for r, _, lst in items if r == best]
            ids = tuple(dict.fromkeys(m.spdx for lst in chosen for m in lst))
            # Each file's first license is the project's own; the rest are bundled code's.
            # A declared expression (``MIT OR Apache-2.0``) counts whole, not by its first id.
            primaries = tuple(dict.fromkeys(lst[0].expression or lst[0].spdx for lst in chosen))
            dir_licenses[d] = (ids, items[0][1], primaries, items[0][2][0].score)
        for rec in buf:
            if rec.drop_stage:
                continue
            head = spill.content(rec)[:3000] if id(rec) in spill.where else rec.content[:3000]
            # Only the file's leading comments declare its license (not a string further on).
            spdx = [m.group(1).strip() for m in SPDX_LINE.finditer(header_block(head))]
            keys = tuple(k for e in spdx for k in expression_keys(e))
            notice = None if keys or is_license_file(rec.path) else header_notice_id(head)
            if notice:
                # A standard notice in the header ("This program is free software ... GNU
                # General Public License ... version 2"): the file's own, like an SPDX tag.
                rec.license_ids, rec.license_source, rec.license_score = (
                    (notice,),
                    "notice-header",
                    1.0,
                )
                rec.license_type = classify_expression(notice, self.config.extra_permissive)
            elif keys and not is_license_file(rec.path):
                rec.license_ids, rec.license_source, rec.license_score = keys, "spdx-header", 1.0
                rec.license_type = classify_expression(
                    " AND ".join(f"({e})" for e in spdx if expression_keys(e)),
                    self.config.extra_permissive,
                )
            else:
                d = posixpath.dirname(rec.path)
                primaries: tuple[str, ...] = ()
                while True:
                    if d in dir_licenses:
                        (rec.license_ids, rec.license_source, primaries, rec.license_score) = (
                            dir_licenses[d]
                        )
                        break
                    if not d:
                        break
                    d = posixpath.dirname(d)
                if rec.license_ids and UNIDENTIFIED in primaries:
                    rec.license_type = UNIDENTIFIED
                elif rec.license_ids:
                    # Several license files in one place mean a choice (dual licensing).
                    rec.license_type = classify_expression(
                        " OR ".join(f"({p})" for p in primaries), self.config.extra_permissive
                    )
                else:
                    rec.license_type = NO_LICENSE
            stats.count(f"type:{rec.license_type}")
            if rec.license_type not in self.config.keep:
                rec.drop(self.name, rec.license_type)


def declared_license(metadata_text: str) -> str:
    """The SPDX expression a package's METADATA declares (License-Expression, else License)."""
    import email

    msg = email.message_from_string(metadata_text.split("\n\n", 1)[0])
    for key in ("License-Expression", "License"):
        value = (msg.get(key) or "").strip()
        if value and "\n" not in value and expression_keys(value):
            return value
    return ""


def package_license_agreement(
    site_packages: str | Path,
    min_score: float = 0.8,
) -> dict[str, object]:
    """Compare detected and declared licenses of installed distributions.

    For each ``*.dist-info`` whose METADATA declares a valid SPDX expression and that
    ships license files, the license files in the shallowest folder that has any are
    identified; the package agrees when the first license found (the project's own) is
    one the expression names (``agree_any``: when any license found is).
    """
    rows = []
    for info in sorted(Path(site_packages).glob("*.dist-info")):
        meta = info / "METADATA"
        if not meta.is_file():
            continue
        declared = declared_license(meta.read_text(errors="replace"))
        if not declared:
            continue
        files = sorted(
            (
                f
                for f in info.rglob("*")
                if f.is_file()
                and is_license_file(f.name)
                and not f.name.lower().startswith("notice")
            ),
            key=lambda f: (len(f.relative_to(info).parts), str(f)),
        )
        if not files:
            continue
        depth = len(files[0].relative_to(info).parts)
        detected: list[str] = []
        for f in files:
            if len(f.relative_to(info).parts) == depth:
                detected += identify_text(f.read_text(errors="replace"), min_score)
        keys = set(expression_keys(declared))
        rows.append(
            {
                "package": info.name.removesuffix(".dist-info"),
                "declared": declared,
                "detected": list(dict.fromkeys(detected)),
                "agree": bool(detected) and detected[0] in keys,
                "agree_any": bool(keys & set(detected)),
            }
        )
    agree = sum(r["agree"] for r in rows)
    return {
        "packages": len(rows),
        "agree": agree,
        "agreement": agree / len(rows) if rows else 0.0,
        "agreement_any": sum(r["agree_any"] for r in rows) / len(rows) if rows else 0.0,
        "rows": rows,
    }

"""Language detection in the manner of GitHub linguist.

Strategies run in linguist's order: modeline, exact filename, shebang, extension, then
content heuristics for extensions that several languages claim (``.h``, ``.m``, ``.pl``,
...). Filenames and extensions that linguist's ``languages.yml`` gives to one language
decide first (vendored in ``resources/linguist-tables.json``: ``.jsx`` is JavaScript,
``BUILD.bazel`` Starlark, ``Podfile`` Ruby); the rest come from Pygments' lexer filename
patterns (600+ lexers) with ``identify``'s extension and interpreter tables as a
fallback, names spelled as linguist spells them where the two differ. Vendored and
generated files are marked with linguist's rules (``vendor.yml``, ``generated.rb``),
summarised below.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import posixpath
import re
from pathlib import Path

from identify import extensions as id_ext
from identify import interpreters as id_interp
from pygments.lexers._mapping import LEXERS

from data.config import LanguageConfig
from data.records import FileRecord, StageStats
from data.step import Step

# Pygments name -> linguist name, where they differ (linguist's languages.yml spelling).
LINGUIST_NAMES = {
    "Bash": "Shell",
    "Matlab": "MATLAB",
    "Docker": "Dockerfile",
    "Text only": "Text",
    "EmacsLisp": "Emacs Lisp",
    "VimL": "Vim script",
    "JSX": "JavaScript",
    "Asciidoc": "AsciiDoc",
    "LessCss": "Less",
    "Mdx": "MDX",
    "Nimrod": "Nim",
    "WebGPU Shading Language": "WGSL",
    "CUDA": "Cuda",
    "Base Makefile": "Makefile",
    "Nginx configuration file": "Nginx",
    "GAS": "Unix Assembly",
    "NASM": "Assembly",
    "TASM": "Assembly",
    "Django/Jinja": "Jinja",
    # linguist b45dbe9 has no HTML+Django: its Jinja takes the html+django alias.
    "HTML+Django/Jinja": "Jinja",
    "Python 2.x": "Python",
    "JSONLD": "JSON-LD",
    "Groff": "Roff",
    "Properties": "Java Properties",
    "Perl6": "Raku",
    "REBOL": "Rebol",
    "YAML+Jinja": "Jinja",
    "CSS+Django/Jinja": "Jinja",
    "S": "R",
    "FortranFixed": "Fortran",
    "Delphi": "Pascal",
    "VB.net": "Visual Basic .NET",
    "PostgreSQL SQL dialect": "PLpgSQL",
    "Terraform": "HCL",
    "verilog": "Verilog",
    "systemverilog": "SystemVerilog",
    "vhdl": "VHDL",
    # linguist renamed Coq to "Rocq Prover" (the vendored table's ``.coq``); one name for both.
    "Coq": "Rocq Prover",
    "COBOLFree": "COBOL",
    "aspx-cs": "ASP.NET",
    "aspx-vb": "ASP.NET",
    "Tcsh": "Tcsh",
    "Batchfile": "Batchfile",
    "MySQL": "SQL",
    "Transact-SQL": "TSQL",
    "Gettext Catalog": "Gettext Catalog",
    "Protocol Buffer": "Protocol Buffer",
    "Cython": "Cython",
    "Objective-J": "Objective-J",
    "reStructuredText": "reStructuredText",
    "XML+Django/Jinja": "XML",
    "SQL+Jinja": "SQL",
    "JavaScript+Django/Jinja": "JavaScript",
    "TOML": "TOML",
    "Jinja": "Jinja",
    "PowerShell": "PowerShell",
    "Fish": "fish",
    "Python Traceback": "Python traceback",
    "Debian Control file": "Debian Package Control File",
    "Kconfig": "Kconfig",
    "Meson": "Meson",
    "GraphQL": "GraphQL",
    "Nix": "Nix",
    "QML": "QML",
    "Kotlin": "Kotlin",
    "Nushell": "Nushell",
    "Csound Document": "Csound Document",
}

# identify tags with no Pygments lexer: tag -> linguist name.
IDENTIFY_NAMES = {
    "svg": "SVG",
    "csv": "CSV",
    "tsv": "TSV",
    "jupyter": "Jupyter Notebook",
    "plist": "XML",
    "pyi": "Python",
    "pyz": "Python",
    "jenkins": "Groovy",
    "gitignore": "Ignore List",
    "dockerignore": "Ignore List",
    "editorconfig": "EditorConfig",
    "gitattributes": "Git Attributes",
    "pip-requirements": "Pip Requirements",
    "lektorproject": "INI",
    "pem": "Text",
    "license": "Text",
    "markdown": "Markdown",
    "plain-text": "Text",
    "tex": "TeX",
    "gitmodules": "INI",
    "bazel": "Starlark",
    "nimble": "Nim",
    "sh": "Shell",
    "shell": "Shell",
}
GENERIC_TAGS = frozenset(
    {
        "text",
        "binary",
        "executable",
        "non-executable",
        "file",
        "symlink",
        "directory",
        "header",
        "image",
        "audio",
        "video",
        "archive",
        "font",
        "zip",
        "gzip",
        "c++",
        "c",
        "xml",
        "json",
    }
)

# Default for extensions Pygments gives to several lexers and no heuristic decides.
AMBIGUOUS_DEFAULT = {
    "h": "C",
    # An Objective-C ``.m`` file nearly always has ``#import``/``@implementation`` (its
    # heuristic); one without them is a MATLAB script (``x = linspace(0, 1); plot(x)``).
    "m": "MATLAB",
    "pl": "Perl",
    "pm": "Perl",
    "t": "Perl",
    "inc": "PHP",
    "r": "R",
    "s": "Unix Assembly",
    "sql": "SQL",
    "fs": "F#",
    "v": "Verilog",
    "cl": "Common Lisp",
    "pro": "Prolog",
    "asm": "Assembly",
    "bas": "Visual Basic .NET",
    "hh": "C++",
    "c": "C",
    "cp": "C++",
    "mm": "Objective-C++",
    "xsl": "XSLT",
    "xslt": "XSLT",
    "toc": "TeX",
    "b": "Limbo",
    "as": "ActionScript",
    "feature": "Gherkin",
    "ecl": "ECL",
    "j": "Objective-J",
    "lean": "Lean",
    "n": "Nemerle",
    "p": "OpenEdge ABL",
    "prolog": "Prolog",
    "sc": "SuperCollider",
    "scd": "SuperCollider",
    "ttl": "Turtle",
    "tst": "Scilab",
    "def": "Modula-2",
    "i": "SWIG",
    "inf": "INI",
    "g": "ANTLR",
    "gd": "GDScript",
    "mac": "Maxima",
    "mi": "Mason",
    "u": "UrbiScript",
    "bug": "BUGS",
    "rl": "Ragel",
    "ts": "TypeScript",
    "md": "Markdown",
    "rs": "Rust",
    "cls": "TeX",
    "d": "D",
    "ml": "OCaml",
    "yy": "Yacc",
    "ino": "C++",
}

# Extensions linguist gives their own language where Pygments folds them into another.
EXTENSION_OVERRIDES = {"svg": "SVG", "ipynb": "Jupyter Notebook", "csv": "CSV", "tsv": "TSV"}

# linguist heuristics.yml, condensed: (extension, language, pattern) tried in order.
_H = re.MULTILINE
HEURISTICS: dict[str, list[tuple[str, re.Pattern[str]]]] = {
    "h": [
        (
            "Objective-C",
            re.compile(
                r"^\s*(@(interface|class|protocol|property|end|implementation)"
                r"\b|#\s*import\s+[<\"])",
                _H,
            ),
        ),
        (
            "C++",
            re.compile(
                r"^\s*(template\s*<|namespace\s+\w*\s*\{|class\s+\w+(\s*final)?\s*"
                r"[:{]|using\s+namespace\b|(public|private|protected)\s*:|#\s*include"
                r"\s*<(algorithm|array|atomic|chrono|cstd\w+|functional|iostream|map|"
                r"memory|mutex|optional|set|sstream|string|thread|tuple|"
                r"type_traits|unordered_map|utility|vector)>)|\bstd::\w|"
                r"\b(constexpr|nullptr|noexcept|static_assert)\b",
                _H,
            ),
        ),
    ],
    "m": [
        (
            "Objective-C",
            re.compile(
                r"^\s*(@(interface|implementation|protocol|property|end)\b|"
                r"#\s*import\s+[<\"]|#\s*include\s+[<\"])",
                _H,
            ),
        ),
        ("Mercury", re.compile(r"^:-\s*module\b", _H)),
        ("MUF", re.compile(r"^: ", _H)),
        ("Mathematica", re.compile(r"^\s*\(\*|\bBeginPackage\[|:=\s*Module\[", _H)),
        ("MATLAB", re.compile(r"^\s*(%|function\b[^\n]*(=|\()|end\s*$|classdef\b|disp\()", _H)),
        ("Limbo", re.compile(r"^\w+\s*:\s*module\s*\{", _H)),
    ],
    "pl": [
        ("Prolog", re.compile(r"^[^#]*:-", _H)),
        ("Perl", re.compile(r"\buse\s+(strict|warnings)\b|^\s*(my|our)\s+[$@%]|^\s*sub\s+\w+", _H)),
        ("Raku", re.compile(r"^\s*(use\s+v6\b|unit\s+(module|class)\b)", _H)),
    ],
    "pm": [
        ("Raku", re.compile(r"^\s*(use\s+v6\b|unit\s+(module|class)\b)", _H)),
        ("X PixMap", re.compile(r"/\*\s*XPM\s*\*/")),
        ("Perl", re.compile(r".")),
    ],
    "ts": [("XML", re.compile(r"^\s*(<\?xml|<TS\b)", _H))],
    "inc": [
        ("PHP", re.compile(r"<\?(php|=)?")),
        ("POV-Ray SDL", re.compile(r"^\s*#(declare|local|macro|while)\s", _H)),
        ("Pascal", re.compile(r"^\s*(unit|interface|procedure|function)\s+\w", _H | re.I)),
        ("C", re.compile(r"^\s*#\s*(define|include|if)", _H)),
    ],
    "cls": [
        ("TeX", re.compile(r"\\(ProvidesClass|NeedsTeXFormat|LoadClass)\b")),
        ("Visual Basic 6.0", re.compile(r"^\s*(VERSION\s+1\.0\s+CLASS|Attribute VB_)", _H)),
        (
            "Apex",
            re.compile(r"\b(public|private|global)\s+(with|without)?\s*(sharing\s+)?class\b", re.I),
        ),
    ],
    "v": [
        (
            "Rocq Prover",
            re.compile(
                r"^\s*(From\s+\w+\s+)?(Require|Theorem|Lemma|Proof|Qed|Definition|Inductive|"
                r"Fixpoint|Section|Module|Set\s+Implicit|Import|Hypothesis|Variable)\b",
                _H,
            ),
        )
    ],
    "md": [("GCC Machine Description", re.compile(r"^\s*\((define_|;;)", _H))],
    "rs": [("RenderScript", re.compile(r"^\s*#pragma\s+(version|rs\s+java_package_name)", _H))],
    # linguist's ``.r`` rules: the word Rebol, a Rez resource, else R (``<-``, ``#`` comments).
    "r": [
        ("Rebol", re.compile(r"\bREBOL\b", re.I)),
        (
            "Rez",
            re.compile(
                r"#include\s+[\"<](Types\.r|Carbon/Carbon\.r)[\">]|"
                r"(resource|data|type)\s+'[A-Za-z0-9]{4}'\s+(\(.*\)\s+)?\{"
            ),
        ),
        ("R", re.compile(r"<-|^\s*#", _H)),
    ],
    # ``.d``: D (module/import declarations, functions, unittest), DTrace probes and
    # pragmas, then a compiler's Makefile dependency list (``main.o: main.c util.h``).
    "d": [
        (
            "D",
            re.compile(
                r"^module\s+[\w.]*\s*;|import\s+[\w\s,.:]*;|\w+\s+\w+\s*\(.*\)(\(.*\))?"
                r"\s*\{[^}]*\}|unittest\s*(\(.*\))?\s*\{[^}]*\}",
                _H,
            ),
        ),
        (
            "DTrace",
            re.compile(
                r"^(\w+:\w*:\w*:\w*|BEGIN|END|provider\s+|(tick|profile)-\w+\s+\{[^}]*\}|"
                r"#pragma\s+D\s+(option|attributes|depends_on)\s|#pragma\s+ident\s)",
                _H,
            ),
        ),
        (
            "Makefile",
            re.compile(
                r"([/\\].*:\s+.*\s\\$|: \\$|^[ %]:|"
                r"^[\w \t/\\.]+\w+\.\w+[ \t]*:[ \t]+[\w \t/\\.]+\w+\.\w+)",
                _H,
            ),
        ),
    ],
    # ``.es``: Erlang (``%%`` comments, ``main(...) ->``) before ECMAScript.
    "es": [
        ("Erlang", re.compile(r"^\s*(%%|main\s*\(.*?\)\s*->)", _H)),
        (
            "JavaScript",
            re.compile(r"//|[\"']use strict[\"']|export\s+default\s|/\*[\s\S]*?\*/"),
        ),
    ],
    "s": [("Motorola 68K Assembly", re.compile(r"^\s*(move\.[bwl]|lea|jsr|rts)\b", _H | re.I))],
    "sql": [
        ("PLpgSQL", re.compile(r"\$\$\s*LANGUAGE\s+plpgsql|\bRETURNS\s+TRIGGER\b", re.I)),
        ("TSQL", re.compile(r"^\s*GO\s*$|\bIF\s+OBJECT_ID\b|\bNVARCHAR\b", _H | re.I)),
        (
            "PLSQL",
            re.compile(
                r"\bCREATE\s+OR\s+REPLACE\s+PACKAGE\b|\bBEGIN\b[\s\S]*\bEXCEPTION\b|"
                # linguist heuristics.yml's PLSQL markers: sequences, Oracle types and functions.
                r"\$\$PLSQL_|\bXMLTYPE\b|\bsystimestamp\b|\.nextval\b|\bCONNECT\s+BY\b|"
                r"\bAUTHID\s+(DEFINER|CURRENT_USER)\b|^\s*:(NEW|OLD)\.\w+\s*:=",
                _H | re.I,
            ),
        ),
    ],
    "fs": [
        ("Forth", re.compile(r"^\s*: \S+|\bVARIABLE\b|^new-device", _H)),
        # The rest of linguist's ``.fs`` rules: F#, then a GLSL shader (``#version``,
        # ``precision``/``uniform``/``varying`` declarations), then Filterscript.
        ("F#", re.compile(r"^\s*(#light|import|let|module|namespace|open|type)\b", _H)),
        ("GLSL", re.compile(r"^\s*(#version|precision|uniform|varying|vec[234])\b", _H)),
        ("Filterscript", re.compile(r"#include|#pragma\s+(rs|version)|__attribute__")),
    ],
    # linguist heuristics.yml's ``.pro`` rules, in its order: ProGuard options, a Prolog
    # clause, an IDL ``last_client=`` INI, a qmake project (both ``HEADERS`` and
    # ``SOURCES``), an IDL ``pro``/``function`` header.
    "pro": [
        (
            "Proguard",
            re.compile(r"^-(include\b.*\.pro$|keep\b|keepclassmembers\b|keepattributes\b)", _H),
        ),
        ("Prolog", re.compile(r"^[^\[#\n]+:-", _H)),
        ("INI", re.compile(r"last_client=")),
        ("QMake", re.compile(r"\A(?=[\s\S]*\bHEADERS\b)(?=[\s\S]*\bSOURCES\b)")),
        ("IDL", re.compile(r"^\s*(?i:function|pro|compile_opt) \w[ \w,:]*$", _H)),
    ],
    # ``.ms``: roff ``-ms`` macros (``.TL``, ``.PP``), GNU assembler without C comments,
    # MiniScript's ``end function``/``isa``; anything else is MAXScript (linguist's order).
    "ms": [
        ("Roff", re.compile(r"^[.'][A-Za-z]{2}(\s|$)", _H)),
        (
            "Unix Assembly",
            re.compile(r"\A(?![\s\S]*/\*)[\s\S]*?^\s*\.(include\s|globa?l\s|[A-Za-z]\w*:)", _H),
        ),
        ("MiniScript", re.compile(r"^\s*\bend (function|while|if|for)\b|\s\bisa\b\s", _H)),
        ("MAXScript", re.compile(r"")),
    ],
    # ``.l``: Common Lisp ``defun``/``defmacro``, lex sections, roff requests, PicoLisp.
    "l": [
        ("Common Lisp", re.compile(r"\(def(un|macro)\s")),
        ("Lex", re.compile(r"^%[%{}]\s*$", _H)),
        ("Roff", re.compile(r"^\.[A-Za-z]{2}(\s|$)", _H)),
        ("PicoLisp", re.compile(r"^\((de|class|rel|code|data|must)\s", _H)),
    ],
    # ``.bb``: BlitzBasic, BitBake recipes (``inherit``/``require``/``include``), Clojure.
    "bb": [
        ("BlitzBasic", re.compile(r"\bEnd Function\b")),
        ("BitBake", re.compile(r"^(# |include|require|inherit)\b", _H)),
        ("Clojure", re.compile(r"\((def|defn|defmacro|let)\s")),
    ],
    # ``.f``/``.for``: a Forth colon definition, Filebench WML, else Fortran (the default).
    "f": [("Forth", re.compile(r"^: ", _H)), ("Filebench WML", re.compile(r"\bflowop\b"))],
    "for": [("Forth", re.compile(r"^: ", _H))],
    "t": [
        ("Raku", re.compile(r"^\s*use\s+v6\b", _H)),
        ("Perl", re.compile(r"\buse\s+(strict|warnings|Test::More)\b|\bmy\s+\$", _H)),
        ("Turing", re.compile(r"^\s*%[ \t]+|^\s*var\s+\w+\s*:\s*\w+", _H)),
    ],
}

_MODELINE_VIM = re.compile(
    r"(?:vim?|ex)\s*:(?:\s*set?)?[^\n]*?\b(?:ft|filetype|syntax)=([\w+#.-]+)"
)
# Emacs: ``-*- mode: python -*-``, ``-*- Mode: C++; tab-width: 8 -*-`` or ``-*- python -*-``.
_MODELINE_EMACS = re.compile(
    r"-\*-(?:[^\n]*?\bmode:\s*([\w+#.-]+)[^\n]*?|\s*([\w+#.-]+)\s*)-\*-", re.I
)
_SHEBANG = re.compile(r"^#!\s*(\S+)(?:\s+(\S+))?")
# ``#!/usr/bin/env -S deno run -A``: env's options (``-S``, ``-i``, ``-u NAME``) before the
# interpreter, as linguist's shebang strategy skips them.
_EXEC_HACK = re.compile(r"\bexec (\w+)[\s\"']+\$0[\s\"']+\$@")
_ENV_ARGS = re.compile(r"^#!\s*\S*/env((?:\s+-\w+|\s+-u\s+\S+|\s+\w+=\S*)*)\s+([^\s-]\S*)")

# Interpreters linguist's ``languages.yml`` lists that neither identify nor Pygments knows.
LINGUIST_INTERPRETERS = {
    "deno": "TypeScript",
    "ts-node": "TypeScript",
    "tsx": "TypeScript",
    "Rscript": "R",
    "tclsh": "Tcl",
    "wish": "Tcl",
    "pwsh": "PowerShell",
    "osascript": "AppleScript",
    "runghc": "Haskell",
    "runhaskell": "Haskell",
    "qjs": "JavaScript",
    "gjs": "JavaScript",
    "d8": "JavaScript",
    "rhino": "JavaScript",
}

# linguist vendor.yml (condensed): paths of third-party code.
VENDORED = re.compile(
    r"(^|/)(node_modules|bower_components|vendor|vendors|third[-_]?party|3rd[-_]?party|extern|"
    r"external|_vendor|Godeps|jspm_packages|Carthage|Pods|\.yarn|site-packages|dist-packages|"
    r"deps|\.bundle|cache)/|(^|/)(jquery|bootstrap|d3|modernizr|prototype|mootools|angular|"
    r"react|vue|underscore|lodash|backbone|ember|handlebars|moment)([^/]*)\.js$|"
    r"\.min\.(js|css)$|(^|/)(gradlew|gradlew\.bat|mvnw|mvnw\.cmd)$|(^|/)\.gradle/|"
    r"(^|/)(config\.guess|config\.sub|configure|install-sh|ltmain\.sh|depcomp|missing)$",
    re.I,
)

# linguist generated.rb (condensed): paths and header phrases of generated files.
GENERATED_PATHS = re.compile(
    r"(^|/)(package-lock\.json|yarn\.lock|pnpm-lock\.yaml|npm-shrinkwrap\.json|Cargo\.lock|"
    r"poetry\.lock|Pipfile\.lock|composer\.lock|Gemfile\.lock|go\.sum|flake\.lock|uv\.lock|"
    r"pdm\.lock|mix\.lock|Podfile\.lock|gradle\.lockfile)$|_pb2(_grpc)?\.pyi?$|\.pb\.(go|cc|h)$|"
    r"\.pb\.swift$|\.(designer|g|generated|freezed)\.(cs|dart|vb)$|\.js\.map$|\.css\.map$|\.map$|"
    r"(^|/)__generated__/|\.g4\.(java|py)$|(^|/)(gen|generated)/.*\.(java|go|py|ts|cs)$"
)
GENERATED_HEADER = re.compile(
    r"(?i)(code generated\b.*\bdo not edit|@generated\b|autogenerated|auto-generated|"
    r"automatically generated|generated by (cython|swig|the protocol buffer compiler|protoc|"
    r"thrift|bison|flex|javacc|antlr|jooq|mako|pyinstaller|pip-compile|sphinx|doxygen|"
    r"gperf|flatc|cmake|django|xsd|wsdl|ragel)|this file (was|is) (automatically )?generated|"
    r"do not edit (this file|manually|by hand))"
)


# ``docker build -f Dockerfile.dev``: linguist lists only ``Dockerfile``/``Containerfile``
# and the ``.dockerfile`` extension, so these per-environment variants would be unknown.
DOCKERFILE_VARIANT = re.compile(r"^(Dockerfile|Containerfile)[._-][\w.-]+$")
# ``Jenkinsfile.release``, ``Jenkinsfile-nightly``: per-pipeline variants of a Jenkinsfile.
JENKINSFILE_VARIANT = re.compile(r"^Jenkinsfile[._-][\w.-]+$")


def _linguist(name: str) -> str:
    """A Pygments lexer name spelled as linguist spells it: the table above, else the
    linguist language whose name or alias it is (``Q`` is ``q``, ``Mathematica`` is
    ``Wolfram Language``)."""
    if name in LINGUIST_NAMES:
        return LINGUIST_NAMES[name]
    return _linguist_heuristics()["names"].get(name.lower(), name)


@functools.cache
def _linguist_heuristics() -> dict:
    """linguist's ``heuristics.yml`` rules per extension (regexes compiled), the extensions
    and filenames several languages claim, and every language name/alias
    (``resources/linguist-heuristics.json``)."""
    data = json.loads(
        (Path(__file__).parent / "resources" / "linguist-heuristics.json").read_text()
    )

    def compile_rule(rule: dict) -> dict:
        out = dict(rule)
        for key in ("pattern", "negative"):
            if key in rule:
                out[key] = [re.compile(p, re.MULTILINE) for p in rule[key]]
        if "and" in rule:
            out["and"] = [compile_rule(r) for r in rule["and"]]
        return out

    data["heuristics"] = {
        ext: [compile_rule(r) for r in rules] for ext, rules in data["heuristics"].items()
    }
    data["languages"] = frozenset(data["names"].values())
    return data


def _rule_matches(rule: dict, text: str) -> bool:
    """One heuristics.yml rule: every ``and`` part, any ``pattern``, no ``negative``; a rule
    with none of them (the last, ``language: Text``) always matches."""
    if not all(_rule_matches(r, text) for r in rule.get("and", ())):
        return False
    if "pattern" in rule and not any(p.search(text) for p in rule["pattern"]):
        return False
    return not any(p.search(text) for p in rule.get("negative", ()))


def _linguist_rules(ext: str, text: str) -> tuple[str, str] | None:
    """(language, strategy) of the first of linguist's rules for ``ext`` that ``text``
    matches: ``heuristic``, or ``extension`` for a last rule without a pattern (``.txt``'s
    Text, ``.ts``'s TypeScript), which the extension alone decides."""
    for rule in _linguist_heuristics()["heuristics"].get(ext, ()):
        if "language" in rule and _rule_matches(rule, text):
            tested = "pattern" in rule or "and" in rule or "negative" in rule
            return rule["language"], "heuristic" if tested else "extension"
    return None


def _linguist_claims(base: str) -> bool:
    """Whether linguist decides ``base``'s extension: one language, or heuristics.yml rules."""
    ext = base.rsplit(".", 1)[1].lower()
    return bool(_linguist_extension(base)) or ext in _linguist_heuristics()["heuristics"]


def _ambiguous_filename(base: str, text: str) -> str | None:
    """A filename several languages claim (``hosts``: Hosts File, INI): the first candidate
    one of whose heuristics.yml content rules (from any extension) the text matches."""
    data = _linguist_heuristics()
    for lang in data["filename_candidates"].get(base, ()):
        for rules in data["heuristics"].values():
            for rule in rules:
                tested = "pattern" in rule or "and" in rule
                if rule.get("language") == lang and tested and _rule_matches(rule, text):
                    return lang
    return None


@functools.cache
def _linguist_data() -> dict[str, dict[str, str]]:
    return json.loads((Path(__file__).parent / "resources" / "linguist-tables.json").read_text())


def _linguist_tables() -> tuple[dict[str, str], dict[str, str]]:
    """(extension -> language, filename -> language) where linguist names one language."""
    data = _linguist_data()
    return data["extensions"], data["filenames"]


def _linguist_interpreters() -> dict[str, str]:
    """Shebang interpreter -> language where linguist's ``languages.yml`` names one
    (``guile`` Scheme, ``wish`` Tcl, ``escript`` Erlang)."""
    return _linguist_data()["interpreters"]


def _linguist_extension(base: str) -> str | None:
    """linguist's language for the longest extension of ``base`` it claims alone."""
    by_ext, _ = _linguist_tables()
    parts = base.lower().lstrip(".").split(".")
    for i in range(1, len(parts)):
        lang = by_ext.get(".".join(parts[i:]))
        if lang:
            return lang
    return None


@functools.cache
def _tables() -> tuple[
    dict[str, list[str]], dict[str, list[str]], list[tuple[str, str]], dict[str, str]
]:
    """(ext -> languages, exact filename -> languages, wildcard patterns, alias -> language)."""
    by_ext: dict[str, list[str]] = {}
    by_name: dict[str, list[str]] = {}
    patterns: list[tuple[str, str]] = []
    aliases: dict[str, str] = {}
    for _mod, name, alias_list, filenames, _mimes in LEXERS.values():
        lang = _linguist(name)
        if name.endswith((" session", "console", "Console")) or "session" in name:
            continue
        for a in alias_list:
            aliases.setdefault(a.lower(), lang)
        for pat in filenames:
            if pat.startswith("*.") and not any(c in pat[2:] for c in "[]*?."):
                lst = by_ext.setdefault(pat[2:], [])
                if lang not in lst:
                    lst.append(lang)
            elif not any(c in pat for c in "[]*?"):
                lst = by_name.setdefault(pat, [])
                if lang not in lst:
                    lst.append(lang)
            else:
                patterns.append((pat, lang))
    aliases.setdefault("sh", "Shell")
    aliases["python3"] = "Python"
    # Longest literal first: '*.html.j2' before '*.j2'.
    patterns.sort(key=lambda p: (-len(p[0].replace("*", "")), p[0]))
    return by_ext, by_name, patterns, aliases


def _from_identify_tags(tags: set[str] | frozenset[str]) -> str | None:
    _, _, _, aliases = _tables()
    specific = sorted(t for t in tags if t not in GENERIC_TAGS)
    for t in specific:
        if t in IDENTIFY_NAMES:
            return IDENTIFY_NAMES[t]
    for t in specific:
        if t in aliases:
            return aliases[t]
    if "c++" in tags:
        return "C++"
    if "xml" in tags:
        return "XML"
    if "json" in tags:
        return "JSON"
    return specific[0].title() if specific else None


def _interpreter_language(interp: str) -> str | None:
    _, _, _, aliases = _tables()
    base = posixpath.basename(interp)
    if base in LINGUIST_INTERPRETERS:
        return LINGUIST_INTERPRETERS[base]
    candidates = [base, re.sub(r"[\d.]+$", "", base)]
    # linguist strips one ``.N`` suffix (``python3.11`` -> ``python3``) before its lookup.
    for c in (base, re.sub(r"\.\d+$", "", base)):
        if c in _linguist_interpreters():
            return _linguist_interpreters()[c]
    for c in candidates:
        if c in id_interp.INTERPRETERS:
            lang = _from_identify_tags(
                id_interp.INTERPRETERS[c] - {"shell"} or id_interp.INTERPRETERS[c]
            )
            if c in ("sh", "bash", "zsh", "ksh", "dash", "ash"):
                return "Shell"
            if lang:
                return lang
        if c in aliases:
            return aliases[c]
    return None


def detect_language(path: str, content: str) -> tuple[str, str]:
    """Return (language, strategy) for a file; ('', 'none') when nothing matches."""
    by_ext, by_name, patterns, aliases = _tables()
    head = content[:2048]
    # 1. Modeline (vim / emacs) in the first or the last five lines, as linguist's
    # modeline strategy searches them (a modeline quoted mid-file does not count).
    first = "\n".join(head.splitlines()[:5])
    last = "\n".join(content[-2048:].splitlines()[-5:]) if len(content) > len(first) else ""
    for chunk in (first, last):
        m = _MODELINE_VIM.search(chunk) or None
        mode = m.group(1) if m else None
        if mode is None:
            e = _MODELINE_EMACS.search(chunk)
            mode = (e.group(1) or e.group(2)) if e else None
        if mode and mode.lower() in aliases and mode.lower() not in ("utf-8", "coding"):
            return aliases[mode.lower()], "modeline"
    base = posixpath.basename(path)
    # 2. Exact filename: linguist's own table, then Pygments' and identify's.
    if base in _linguist_tables()[1]:
        return _linguist_tables()[1][base], "filename"
    if DOCKERFILE_VARIANT.match(base):
        return "Dockerfile", "filename"
    if JENKINSFILE_VARIANT.match(base):
        return "Groovy", "filename"
    lang = _ambiguous_filename(base, content[:50_000])
    if lang:
        return lang, "filename"
    # A Pygments filename for a language linguist lacks (``todo.txt``: Todotxt) does not
    # override an extension linguist decides itself (``.txt``: its heuristics say Text).
    if base in by_name and (
        by_name[base][0] in _linguist_heuristics()["languages"]
        or not ("." in base.lstrip(".") and _linguist_claims(base))
    ):
        return by_name[base][0], "filename"
    if base in id_ext.NAMES:
        lang = _from_identify_tags(id_ext.NAMES[base])
        if lang:
            return lang, "filename"
    # 3. Shebang.
    m = _SHEBANG.match(head)
    if m:
        interp = m.group(1)
        if posixpath.basename(interp) == "env" and m.group(2):
            interp = m.group(2)
            # env's options and ``VAR=value`` settings come before the interpreter.
            if interp.startswith("-") or "=" in interp:
                e = _ENV_ARGS.match(head)
                interp = e.group(2) if e else interp
        # ``#!/bin/sh`` then ``exec scala "$0" "$@"`` in the first five lines: the script
        # re-executes itself under that interpreter (linguist's shebang.rb reads it so).
        if posixpath.basename(interp) == "sh":
            x = _EXEC_HACK.search("\n".join(head.splitlines()[:5]))
            interp = x.group(1) if x else interp
        lang = _interpreter_language(interp)
        if lang:
            return lang, "shebang"
    # 4. An extension linguist gives one language decides before Pygments' wildcard
    # patterns (``config.yaml.j2`` is linguist's Jinja by ``.j2``, not ``*.yaml.j2``).
    if "." in base.lstrip("."):
        lang = _linguist_extension(base)
        if lang:
            return lang, "extension"
    # Wildcard patterns with more than an extension (e.g. '*.html.j2', 'Makefile.*').
    for pat, lang in patterns:
        if fnmatch.fnmatchcase(base, pat):
            return lang, "filename"
    # 5. Extension (linguist's when it names one language), then heuristics for ambiguous ones.
    if "." in base.lstrip("."):
        lang = _linguist_extension(base)
        if lang:
            return lang, "extension"
        ext = base.rsplit(".", 1)[1]
        # linguist looks extensions up lower-cased (``UTIL.H`` is ``.h``, ``SETUP.PY``
        # ``.py``), where Pygments gives ``*.H``/``*.C`` to C++ alone.
        low = ext.lower()
        langs = by_ext.get(low) or by_ext.get(ext)
        # Pygments may know one lexer where linguist knows several (``.cls``: TeX, Apex,
        # OpenEdge ABL, ...), so an extension with heuristics always runs them.
        # linguist's own heuristics.yml rules first, in its order; then the condensed
        # rules above for what they name nothing (linguist's Bayesian classifier's part).
        decided = _linguist_rules(low, content[:50_000])
        if decided:
            return decided
        if low in HEURISTICS:
            for lang, rx in HEURISTICS[low]:
                if rx.search(content[:50_000]):
                    return lang, "heuristic"
        if low in EXTENSION_OVERRIDES:
            return EXTENSION_OVERRIDES[low], "extension"
        if langs and len(langs) == 1:
            return langs[0], "extension"
        if langs:
            return AMBIGUOUS_DEFAULT.get(low, langs[0]), "extension"
        tags = id_ext.EXTENSIONS.get(low) or id_ext.EXTENSIONS_NEED_BINARY_CHECK.get(low)
        if tags:
            lang = _from_identify_tags(tags)
            if lang:
                return lang, "extension"
    return "", "none"


def is_vendored(path: str) -> bool:
    """linguist's vendored rule: third-party code paths."""
    return VENDORED.search(path) is not None


def is_generated(path: str, content: str) -> bool:
    """linguist's generated rule: known generated paths, header phrases, minified code."""
    if GENERATED_PATHS.search(path):
        return True
    if GENERATED_HEADER.search(content[:1500]):
        return True
    # Minified: long lines on average in a few lines (generated.rb's `minified_files?`).
    if path.endswith((".js", ".css")) and content:
        lines = content.count("\n") + 1
        return len(content) / lines > 110
    return False


class LanguageStep(Step):
    """Tag each file's language and mark vendored/generated files."""

    name = "language"

    def __init__(self, config: LanguageConfig) -> None:
        self.config = config

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        record.language, strategy = detect_language(record.path, record.content)
        stats.count(f"strategy:{strategy}")
        record.vendored = is_vendored(record.path)
        record.generated = is_generated(record.path, record.content)
        if record.vendored:
            stats.count("vendored")
        if record.generated:
            stats.count("generated")
        if self.config.drop_vendored and record.vendored:
            return "vendored"
        if self.config.drop_unknown and not record.language:
            return "unknown_language"
        return None


def supported_languages() -> list[str]:
    """Every language name the detector can return (sorted)."""
    by_ext, by_name, patterns, _aliases = _tables()
    langs = {lang for v in by_ext.values() for lang in v}
    langs |= {lang for v in by_name.values() for lang in v}
    langs |= {lang for _, lang in patterns}
    langs |= set(IDENTIFY_NAMES.values()) | set(AMBIGUOUS_DEFAULT.values())
    langs |= {lang for v in HEURISTICS.values() for lang, _ in v}
    langs |= {lang for table in _linguist_tables() for lang in table.values()}
    langs.add("Dockerfile")
    return sorted(langs)

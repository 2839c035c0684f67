"""Labelled kinds of input for near-dedup, license and language detection (stop 37).

Written before the detectors were run on them. Every case has a kind and a split:
``tune`` cases may guide changes, ``held`` cases are only measured. Expected labels:

* dedup: a pair is a duplicate when The Stack v2's method means it to be one, i.e. when
  the word 5-gram Jaccard of the two files is at least 0.7 (the label is the kind's
  intent, written from the edit, not computed);
* license: the license type the pipeline should give a source file of the repository
  (``permissive``, ``non_permissive``, ``no_license``; ``excluded`` = any type that the
  default ``keep`` drops) and, where it matters, the first SPDX id;
* language: GitHub linguist's ``languages.yml`` name for the file.

``python tests/data/labels_stop37.py`` prints the figures per kind and split.
"""

from __future__ import annotations

import inspect
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from identify.vendor.licenses import LICENSES

SITE = Path(sysconfig.get_paths()["purelib"])
TEXTS = dict(LICENSES)

# --------------------------------------------------------------------------- dedup


@dataclass(frozen=True)
class DedupCase:
    kind: str
    split: str
    a: str
    b: str
    dup: bool


def _py(module: str) -> str:
    return inspect.getsource(__import__(module, fromlist=["x"]))


def _js(rel: str) -> str:
    return (SITE / rel).read_text()


TUNE_PY = ["textwrap", "shlex", "calendar"]
HELD_PY = ["pprint", "configparser", "gettext"]
TUNE_JS = ["treescope/_internal/js/arrayviz.js"]
HELD_JS = ["torch/utils/model_dump/code.js"]

MIT_HEADER = "".join(
    f"# {line}\n"
    for line in [
        "Copyright (c) 2021 Example Authors",
        "",
        "Permission is hereby granted, free of charge, to any person obtaining a copy",
        "of this software and associated documentation files (the Software), to deal",
        "in the Software without restriction, including without limitation the rights",
        "to use, copy, modify, merge, publish, distribute, sublicense, and/or sell",
        "copies of the Software, and to permit persons to whom the Software is",
        "furnished to do so, subject to the following conditions.",
    ]
)
APACHE_HEADER = "".join(
    f"# {line}\n"
    for line in [
        "Copyright 2023 Other Org LLC",
        "",
        'Licensed under the Apache License, Version 2.0 (the "License");',
        "you may not use this file except in compliance with the License.",
        "You may obtain a copy of the License at",
        "    http://www.apache.org/licenses/LICENSE-2.0",
        "Unless required by applicable law or agreed to in writing, software",
        'distributed under the License is distributed on an "AS IS" BASIS,',
    ]
)
KEYWORDS = set(
    [
        "def",
        "class",
        "return",
        "if",
        "else",
        "elif",
        "for",
        "while",
        "in",
        "not",
        "and",
        "or",
        "is",
        "none",
        "true",
        "false",
        "import",
        "from",
        "as",
        "with",
        "try",
        "except",
        "finally",
        "raise",
        "pass",
        "break",
        "continue",
        "lambda",
        "yield",
        "self",
        "global",
        "function",
        "var",
        "let",
        "const",
        "new",
        "this",
        "null",
        "undefined",
        "typeof",
    ]
)


def reformat(text: str) -> str:
    """Indent with tabs, spaces around punctuation, CRLF line ends: same words."""
    text = text.replace("    ", "\t").replace(", ", " , ").replace("(", "( ")
    return text.replace("\n", "\r\n")


def rename_one(text: str) -> str:
    """Rename the least frequent identifier that occurs at least 3 times."""
    counts: dict[str, int] = {}
    for w in re.findall(r"\b[A-Za-z_]\w{3,}\b", text):
        if w.lower() not in KEYWORDS:
            counts[w] = counts.get(w, 0) + 1
    name = min((c, w) for w, c in counts.items() if c >= 3)[1]
    return re.sub(rf"\b{name}\b", name + "_renamed", text)


def rename_all(text: str) -> str:
    """Every identifier of 4+ characters gets a new name (what an obfuscator does)."""
    return re.sub(
        r"\b[A-Za-z_]\w{3,}\b",
        lambda m: m.group(0) if m.group(0).lower() in KEYWORDS else "v" + m.group(0)[::-1],
        text,
    )


def add_comments(text: str) -> str:
    """A short comment line before every 25th line."""
    out = []
    for i, line in enumerate(text.splitlines(keepends=True)):
        if i % 25 == 24:
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}# reviewed: keep this in sync with the caller\n")
        out.append(line)
    return "".join(out)


def strip_comments(text: str) -> str:
    """Remove full-line ``#`` / ``//`` comments."""
    return "".join(
        line for line in text.splitlines(keepends=True) if not line.lstrip().startswith(("#", "//"))
    )


def swap_header(text: str) -> tuple[str, str]:
    """The same file under an MIT header and under an Apache header."""
    return MIT_HEADER + text, APACHE_HEADER + text


def reorder(text: str) -> str:
    """Top-level blocks (split before each unindented def/class/function) reversed."""
    blocks = re.split(r"(?m)^(?=(?:def|class|function|async function)\b)", text)
    return blocks[0] + "".join(reversed(blocks[1:]))


def edit_lines(text: str) -> str:
    """Five lines spread over the file get different contents."""
    lines = text.splitlines(keepends=True)
    for j in range(5):
        i = (j + 1) * len(lines) // 6
        lines[i] = "    result = compute_value(alpha, beta) + offset  # changed\n"
    return "".join(lines)


def prefix(text: str, frac: float) -> str:
    """The first ``frac`` of the file's lines."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[: int(len(lines) * frac)])


def minify(text: str) -> str:
    """Comments and line breaks removed, runs of spaces collapsed (names kept)."""
    text = re.sub(r"(?m)^\s*//.*$", "", text)
    return re.sub(r"\s+", " ", text)


def minify_renamed(text: str) -> str:
    """Minified with identifiers shortened, as terser's mangler does."""
    names: dict[str, str] = {}

    def short(m: re.Match[str]) -> str:
        w = m.group(0)
        if w.lower() in KEYWORDS:
            return w
        return names.setdefault(w, f"_{len(names):x}")

    return re.sub(r"\b[A-Za-z_]\w{2,}\b", short, minify(text))


def generated_table(seed: int, n: int = 300) -> str:
    """A generated lookup module: the same template, data drawn from ``seed``."""
    import random

    rng = random.Random(seed)
    rows = "".join(
        f"    '{rng.choice('abcdefgh')}{rng.randrange(10**6)}': "
        f"({rng.randrange(10**4)}, '{rng.choice(['alpha', 'beta', 'gamma'])}'),\n"
        for _ in range(n)
    )
    return (
        "# This file was generated by tools/gen_table.py. Do not edit.\n"
        "from typing import Final\n\n"
        f"TABLE: Final = {{\n{rows}}}\n\n"
        "def lookup(key):\n    return TABLE.get(key)\n"
    )


IMPORTS = (
    "import os\nimport sys\nimport json\nimport logging\nimport argparse\n"
    "from pathlib import Path\nfrom typing import Any, Optional\n"
    "from dataclasses import dataclass, field\nimport numpy as np\nimport torch\n"
    "import torch.nn as nn\nimport torch.nn.functional as F\n\n"
    "logger = logging.getLogger(__name__)\n\n"
)


def dedup_cases() -> list[DedupCase]:
    """Every dedup pair, by kind, with its split and expected label."""
    cases: list[DedupCase] = []
    for split, pys, jss in (("tune", TUNE_PY, TUNE_JS), ("held", HELD_PY, HELD_JS)):
        texts = [_py(m) for m in pys]
        for t in texts:
            cases += [
                DedupCase("reformat_whitespace", split, t, reformat(t), True),
                DedupCase("rename_one_identifier", split, t, rename_one(t), True),
                DedupCase("rename_all_identifiers", split, t, rename_all(t), False),
                DedupCase("comments_added", split, t, add_comments(t), True),
                DedupCase("comments_removed", split, t, strip_comments(t), True),
                DedupCase("license_header_swapped", split, *swap_header(t), True),
                DedupCase("functions_reordered", split, t, reorder(t), True),
                DedupCase("few_lines_edited", split, t, edit_lines(t), True),
                DedupCase("prefix_90", split, t, prefix(t, 0.9), True),
                DedupCase("prefix_50", split, t, prefix(t, 0.5), False),
                DedupCase("case_changed", split, t, t.upper(), True),
            ]
        for i, (x, y) in enumerate(zip(texts, texts[1:] + texts[:1], strict=True)):
            half_x, half_y = prefix(x, 0.3), prefix(y, 0.3)
            cases += [
                DedupCase("different_files", split, x, y, False),
                DedupCase("shared_imports", split, IMPORTS + half_x, IMPORTS + half_y, False),
            ]
            seed = 100 * (split == "held") + i
            cases += [
                DedupCase(
                    "generated_other_data",
                    split,
                    generated_table(seed),
                    generated_table(seed + 50),
                    False,
                ),
                DedupCase(
                    "generated_same_data",
                    split,
                    generated_table(seed),
                    generated_table(seed).replace("gen_table.py", "gen_table.py v2"),
                    True,
                ),
            ]
        for rel in jss:
            t = _js(rel)
            cases += [
                DedupCase("minified", split, t, minify(t), True),
                DedupCase("minified_mangled", split, t, minify_renamed(t), False),
                DedupCase("reformat_whitespace", split, t, reformat(t), True),
                DedupCase("functions_reordered", split, t, reorder(t), True),
            ]
    return cases


# --------------------------------------------------------------------------- license


@dataclass(frozen=True)
class LicenseCase:
    kind: str
    split: str
    files: dict[str, str]
    target: str
    expected: str
    first_id: str = ""


def _mit(holder: str = "2024 A. Author") -> str:
    return TEXTS["MIT"].replace("<year> <copyright holders>", holder)


def _bsd3(holder: str) -> str:
    return (
        TEXTS["BSD-3-Clause"]
        .replace("<year>", holder.split()[0])
        .replace("<owner>", " ".join(holder.split()[1:]))
    )


CODE = "def main():\n    return 0\n"
CLASSPATH = (
    '\n\n"CLASSPATH" EXCEPTION TO THE GPL\n\nCertain source files distributed by Oracle '
    "America and/or its affiliates are subject to the following clarification and special "
    "exception to the GPL, but only where Oracle has expressly included in the particular "
    "source file's header the words \"Oracle designates this particular file as subject to "
    'the "Classpath" exception as provided by Oracle in the LICENSE file that accompanied '
    'this code."\n\nLinking this library statically or dynamically with other modules is '
    "making a combined work based on this library.  Thus, the terms and conditions of the "
    "GNU General Public License cover the whole combination.\n"
)
LINKING = (
    "\n\nLINKING EXCEPTION\n\nIn addition to the permissions in the GNU General Public "
    "License, the authors give you unlimited permission to link the compiled version of "
    "this library into combinations with other programs, and to distribute those "
    "combinations without any restriction coming from the use of this file.\n"
)
PROPRIETARY = (
    "Copyright (c) 2024 Acme Widgets Inc. All rights reserved.\n\n"
    "This software and its documentation are proprietary to Acme Widgets Inc. No part of "
    "it may be copied, modified or distributed without the prior written permission of "
    "Acme Widgets Inc.\n"
)


def _spdx(kind: str, split: str, path: str, header: str, expected: str, first: str = ""):
    return LicenseCase(kind, split, {path: header + "\n" + CODE}, path, expected, first)


def license_cases() -> list[LicenseCase]:
    """Every license case, by kind, with its split and expected type (and first id)."""
    c: list[LicenseCase] = []
    # SPDX-License-Identifier headers in comment syntaxes (no license file in the repo).
    s = "spdx_header"
    c += [
        _spdx(s, "tune", "a.c", "// SPDX-License-Identifier: MIT", "permissive", "MIT"),
        _spdx(s, "tune", "a.py", "# SPDX-License-Identifier: Apache-2.0", "permissive"),
        _spdx(s, "tune", "a.h", "/* SPDX-License-Identifier: GPL-2.0-only */", "non_permissive"),
        _spdx(s, "tune", "a.html", "<!-- SPDX-License-Identifier: MIT -->", "permissive"),
        _spdx(s, "tune", "a.lua", "-- SPDX-License-Identifier: BSD-3-Clause", "permissive"),
        _spdx(s, "tune", "a.ml", "(* SPDX-License-Identifier: MIT *)", "permissive", "MIT"),
        _spdx(s, "tune", "a.el", ";; SPDX-License-Identifier: GPL-3.0-or-later", "non_permissive"),
        _spdx(s, "tune", "a.j2", "{# SPDX-License-Identifier: MIT #}", "permissive"),
        _spdx(s, "held", "a.hs", "{- SPDX-License-Identifier: BSD-2-Clause -}", "permissive"),
        _spdx(s, "held", "a.bat", "REM SPDX-License-Identifier: MIT", "permissive", "MIT"),
        _spdx(s, "held", "a.vb", "' SPDX-License-Identifier: MIT", "permissive", "MIT"),
        _spdx(s, "held", "a.tex", "% SPDX-License-Identifier: MIT", "permissive", "MIT"),
        _spdx(s, "held", "a.rs", "//! SPDX-License-Identifier: MIT OR Apache-2.0", "permissive"),
        _spdx(s, "held", "a.cc", "/*\n * SPDX-License-Identifier: MIT\n */", "permissive", "MIT"),
        _spdx(s, "held", "a.c2", "// SPDX-License-Identifier: GPL-2.0+", "non_permissive"),
        _spdx(s, "held", "a.css", "/*! SPDX-License-Identifier: MIT */", "permissive", "MIT"),
    ]
    c.append(
        LicenseCase(
            "spdx_header_overrides_repo",
            "tune",
            {"LICENSE": _mit(), "src/gpl.c": "// SPDX-License-Identifier: GPL-3.0-only\n" + CODE},
            "src/gpl.c",
            "non_permissive",
        )
    )
    c.append(
        LicenseCase(
            "spdx_header_overrides_repo",
            "held",
            {"COPYING": TEXTS["GPL-3.0"], "src/m.py": "# SPDX-License-Identifier: MIT\n" + CODE},
            "src/m.py",
            "permissive",
            "MIT",
        )
    )
    # License file name variants.
    f = "license_file_name"
    for split, name, text, exp, first in [
        ("tune", "LICENSE", _mit(), "permissive", "MIT"),
        ("tune", "LICENSE.md", "# MIT License\n\n" + _mit(), "permissive", "MIT"),
        ("tune", "LICENCE", TEXTS["Apache-2.0"], "permissive", "Apache-2.0"),
        ("tune", "COPYING", TEXTS["GPL-3.0"], "non_permissive", ""),
        ("tune", "UNLICENSE", TEXTS["Unlicense"], "permissive", "Unlicense"),
        ("held", "LICENSE.txt", _bsd3("2019 The Foo Project"), "permissive", "BSD-3-Clause"),
        ("held", "License.rst", "License\n=======\n\n" + _mit(), "permissive", "MIT"),
        (
            "held",
            "LICENCE.md",
            TEXTS["ISC"].replace("<year> <owner>", "2020 Bob"),
            "permissive",
            "",
        ),
        ("held", "COPYING.LESSER", TEXTS["LGPL-3.0"], "non_permissive", ""),
        ("held", "license", _mit(), "permissive", "MIT"),
    ]:
        c.append(LicenseCase(f, split, {name: text, "src/a.py": CODE}, "src/a.py", exp, first))
    c.append(
        LicenseCase(
            "reuse_licenses_dir",
            "held",
            {"LICENSES/MIT.txt": _mit(), "src/a.py": CODE},
            "src/a.py",
            "permissive",
            "MIT",
        )
    )
    # Dual licensing.
    d = "dual_license"
    c += [
        LicenseCase(
            d,
            "tune",
            {"LICENSE-MIT": _mit(), "LICENSE-APACHE": TEXTS["Apache-2.0"], "src/lib.rs": CODE},
            "src/lib.rs",
            "permissive",
        ),
        LicenseCase(
            d,
            "tune",
            {"a.c": "// SPDX-License-Identifier: GPL-3.0-only OR MIT\n" + CODE},
            "a.c",
            "permissive",
        ),
        LicenseCase(
            d,
            "held",
            {"README.md": "# x\n\n## License\n\nMIT OR Apache-2.0\n", "src/a.py": CODE},
            "src/a.py",
            "permissive",
        ),
        LicenseCase(
            d,
            "held",
            {"a.c": "// SPDX-License-Identifier: GPL-2.0-only AND MIT\n" + CODE},
            "a.c",
            "non_permissive",
        ),
    ]
    # Package manifests' license fields (no license file).
    m = "manifest_field"
    for split, name, text, exp, first in [
        ("tune", "package.json", '{\n  "name": "x",\n  "license": "MIT"\n}\n', "permissive", "MIT"),
        (
            "tune",
            "package.json",
            '{"name": "x", "license": "GPL-3.0-or-later"}\n',
            "non_permissive",
            "",
        ),
        (
            "tune",
            "pyproject.toml",
            '[project]\nname = "x"\nlicense = "Apache-2.0"\n',
            "permissive",
            "",
        ),
        (
            "tune",
            "Cargo.toml",
            '[package]\nname = "x"\nlicense = "MIT OR Apache-2.0"\n',
            "permissive",
            "",
        ),
        ("tune", "setup.cfg", "[metadata]\nname = x\nlicense = BSD-3-Clause\n", "permissive", ""),
        (
            "held",
            "package.json",
            '{"name": "x", "licenses": [{"type": "MIT", "url": "http://x"}]}\n',
            "permissive",
            "MIT",
        ),
        ("held", "package.json", '{"name": "x", "license": "UNLICENSED"}\n', "excluded", ""),
        (
            "held",
            "pyproject.toml",
            '[project]\nname = "x"\nlicense = {text = "GPL-3.0-only"}\n',
            "non_permissive",
            "",
        ),
        (
            "held",
            "Cargo.toml",
            '[package]\nname = "x"\nversion = "0.1.0"\nlicense = "AGPL-3.0-only"\n',
            "non_permissive",
            "",
        ),
        ("held", "setup.cfg", "[metadata]\nname = x\nlicense = MIT\n", "permissive", "MIT"),
    ]:
        c.append(LicenseCase(m, split, {name: text, "src/a.py": CODE}, "src/a.py", exp, first))
    # License texts whose copyright lines were altered.
    a = "altered_copyright"
    for split, name, text, first in [
        (
            "tune",
            "LICENSE",
            _mit(
                "2015-2024 Jane Doe <jane@example.com>, and contributors\n"
                "Copyright (c) 2024 Example Corp"
            ),
            "MIT",
        ),
        ("tune", "LICENSE", _bsd3("2001 The Regents of the University"), "BSD-3-Clause"),
        (
            "held",
            "LICENSE",
            "Copyright 2024 Acme Corp\n\n" + TEXTS["Apache-2.0"].split("APPENDIX")[0],
            "Apache-2.0",
        ),
        (
            "held",
            "LICENSE.md",
            "Copyright © 2010–2024 Zoë Ünicode\n\n" + _mit("the authors"),
            "MIT",
        ),
    ]:
        c.append(
            LicenseCase(a, split, {name: text, "src/a.py": CODE}, "src/a.py", "permissive", first)
        )
    # GPL with an exception stays copyleft; Apache with LLVM's exception stays permissive.
    g = "gpl_with_exception"
    c += [
        LicenseCase(
            g,
            "tune",
            {"COPYING": TEXTS["GPL-2.0"] + CLASSPATH, "a.java": CODE},
            "a.java",
            "non_permissive",
        ),
        _spdx(
            g,
            "tune",
            "a.c",
            "// SPDX-License-Identifier: GPL-3.0-or-later WITH GCC-exception-3.1",
            "non_permissive",
        ),
        LicenseCase(
            g,
            "held",
            {"COPYING": TEXTS["GPL-2.0"] + LINKING, "a.c": CODE},
            "a.c",
            "non_permissive",
        ),
        _spdx(
            g,
            "held",
            "a.cpp",
            "// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception",
            "permissive",
        ),
    ]
    # No license at all.
    n = "no_license"
    c += [
        LicenseCase(
            n, "tune", {"src/a.py": CODE, "README.md": "# x\n\nA tool.\n"}, "src/a.py", "no_license"
        ),
        LicenseCase(
            n,
            "held",
            {"main.go": "package main\n", "go.mod": "module x\n"},
            "main.go",
            "no_license",
        ),
    ]
    # "All rights reserved": proprietary license files are excluded; a bare copyright
    # line in a source file of an unlicensed repository is The Stack v2's no_license.
    r = "all_rights_reserved"
    c += [
        LicenseCase(r, "tune", {"LICENSE": PROPRIETARY, "a.py": CODE}, "a.py", "excluded"),
        LicenseCase(
            r,
            "tune",
            {"a.py": "# Copyright (c) 2024 Acme Inc. All rights reserved.\n" + CODE},
            "a.py",
            "no_license",
        ),
        LicenseCase(
            r,
            "held",
            {"LICENSE.txt": "Copyright 2023 Foo Ltd. All Rights Reserved.\n", "a.py": CODE},
            "a.py",
            "excluded",
        ),
        LicenseCase(
            r,
            "held",
            {
                "COPYING": "(C) 2022 Bar GmbH - All rights reserved. Unauthorized copying of "
                "this file, via any medium, is strictly prohibited. Proprietary and "
                "confidential.\n",
                "a.py": CODE,
            },
            "a.py",
            "excluded",
        ),
    ]
    return c


# --------------------------------------------------------------------------- language


@dataclass(frozen=True)
class LanguageCase:
    kind: str
    split: str
    path: str
    content: str
    expected: str
    note: str = field(default="")


DOCKER = 'FROM python:3.12-slim\nWORKDIR /app\nCOPY . .\nRUN pip install -e .\nCMD ["app"]\n'
MAKE = "AM_CFLAGS = -Wall\nbin_PROGRAMS = tool\ntool_SOURCES = main.c util.c\n"
CMAKE = "cmake_minimum_required(VERSION 3.20)\nproject(x CXX)\nadd_executable(x main.cpp)\n"
SHRC = "export PATH=\"$HOME/bin:$PATH\"\nalias ll='ls -la'\n[ -f ~/.x ] && . ~/.x\n"
JENKINS = (
    "pipeline {\n  agent any\n  stages {\n    stage('Build') { steps { sh 'make' } }\n  }\n}\n"
)
JSX = (
    "import React from 'react';\n\nexport default function App({ name }) {\n"
    '  return <div className="app">Hello {name}</div>;\n}\n'
)
TSX = (
    "import React from 'react';\n\ntype P = { name: string };\n"
    "export const App = ({ name }: P) => <div>Hello {name}</div>;\n"
)
ESM = "export function add(a, b) {\n  return a + b;\n}\n"
CJS = "const path = require('path');\nmodule.exports = { join: path.join };\n"
GEMFILE = "source 'https://rubygems.org'\ngem 'rails', '~> 7.1'\ngem 'pg'\n"
RAKE = (
    "require 'rake/testtask'\n\ntask default: :test\nRake::TestTask.new { |t| t.libs << 'test' }\n"
)
BAZEL = (
    'load("@rules_cc//cc:defs.bzl", "cc_library")\n\n'
    'cc_library(\n    name = "x",\n    srcs = ["x.cc"],\n)\n'
)
H_CPP_CLASS = (
    "#pragma once\n#include <string>\n\nclass Widget {\npublic:\n  std::string name() const;\n};\n"
)
H_CPP_TEMPLATE = (
    "#ifndef X_H\n#define X_H\ntemplate <typename T>\nT twice(T x) { return x + x; }\n#endif\n"
)
H_C = (
    "#ifndef X_H\n#define X_H\n#include <stddef.h>\n\nstruct buf { char *p; size_t n; };\n"
    "int buf_grow(struct buf *b, size_t n);\n#endif\n"
)
H_C_EXTERN = (
    '#ifndef Y_H\n#define Y_H\n#ifdef __cplusplus\nextern "C" {\n#endif\n\n'
    "typedef struct y y_t;\nvoid y_free(y_t *y);\n\n#ifdef __cplusplus\n}\n#endif\n#endif\n"
)
H_CPP_NS = (
    "#pragma once\n\nnamespace app {\nstruct Config {\n  int retries = 3;\n};\n"
    "}  // namespace app\n"
)


def language_cases() -> list[LanguageCase]:
    """Every language case, by kind, with its split and linguist's name."""
    rows = [
        ("dockerfile_variant", "tune", "Dockerfile.dev", DOCKER, "Dockerfile"),
        ("dockerfile_variant", "tune", "docker/api.Dockerfile", DOCKER, "Dockerfile"),
        ("dockerfile_variant", "held", "Dockerfile.prod", DOCKER, "Dockerfile"),
        ("dockerfile_variant", "held", "Containerfile", DOCKER, "Dockerfile"),
        ("jsx", "tune", "src/App.jsx", JSX, "JavaScript"),
        ("jsx", "held", "components/Button.jsx", JSX.replace("App", "Button"), "JavaScript"),
        ("tsx", "tune", "src/App.tsx", TSX, "TSX"),
        ("tsx", "held", "ui/Card.tsx", TSX.replace("App", "Card"), "TSX"),
        ("js_module", "tune", "lib/index.mjs", ESM, "JavaScript"),
        ("js_module", "tune", "lib/index.cjs", CJS, "JavaScript"),
        ("js_module", "held", "esm/util.mjs", ESM.replace("add", "sub"), "JavaScript"),
        ("js_module", "held", "config.cjs", CJS, "JavaScript"),
        ("ts_module", "held", "src/x.mts", "export const x: number = 1;\n", "TypeScript"),
        ("ts_module", "tune", "src/y.cts", "export const y: string = 'y';\n", "TypeScript"),
        ("makefile_name", "tune", "Makefile.am", MAKE, "Makefile"),
        ("makefile_name", "tune", "GNUmakefile", "all:\n\t$(CC) -o x x.c\n", "Makefile"),
        ("makefile_name", "held", "src/Makefile.in", "all:\n\t@CC@ -o x x.c\n", "Makefile"),
        ("makefile_name", "held", "Kbuild", "obj-m += drv.o\n", "Makefile"),
        ("cmake", "tune", "CMakeLists.txt", CMAKE, "CMake"),
        ("cmake", "held", "lib/CMakeLists.txt", "add_library(y y.c)\n", "CMake"),
        ("shell_rc", "tune", ".bashrc", SHRC, "Shell"),
        ("shell_rc", "tune", ".zshrc", SHRC, "Shell"),
        ("shell_rc", "held", "home/.bash_profile", SHRC, "Shell"),
        ("shell_rc", "held", ".profile", SHRC, "Shell"),
        ("jenkinsfile", "tune", "Jenkinsfile", JENKINS, "Groovy"),
        ("jenkinsfile", "held", "ci/Jenkinsfile", JENKINS, "Groovy"),
        ("ruby_name", "tune", "Gemfile", GEMFILE, "Ruby"),
        ("ruby_name", "tune", "Rakefile", RAKE, "Ruby"),
        ("ruby_name", "held", "Vagrantfile", "Vagrant.configure('2') do |c|\nend\n", "Ruby"),
        ("ruby_name", "held", "Podfile", "platform :ios, '15.0'\npod 'Alamofire'\n", "Ruby"),
        ("bazel", "tune", "BUILD.bazel", BAZEL, "Starlark"),
        ("bazel", "tune", "WORKSPACE", 'workspace(name = "x")\n', "Starlark"),
        ("bazel", "held", "pkg/BUILD", BAZEL, "Starlark"),
        ("bazel", "held", "MODULE.bazel", 'module(name = "x", version = "1.0")\n', "Starlark"),
        ("header_c_vs_cpp", "tune", "w.h", H_CPP_CLASS, "C++"),
        ("header_c_vs_cpp", "tune", "t.h", H_CPP_TEMPLATE, "C++"),
        ("header_c_vs_cpp", "tune", "buf.h", H_C, "C"),
        ("header_c_vs_cpp", "held", "y.h", H_C_EXTERN, "C"),
        ("header_c_vs_cpp", "held", "config.h", H_CPP_NS, "C++"),
    ]
    return [LanguageCase(*r) for r in rows]


# --------------------------------------------------------------------------- scoring


def license_outcome(case: LicenseCase) -> tuple[str, tuple[str, ...]]:
    """(license type, ids) the license step gives the case's target file."""
    from data.config import LicenseConfig
    from data.license import LicenseStep
    from data.records import FileRecord

    recs = [
        FileRecord(repo="r", path=p, content=t, size=len(t)) for p, t in sorted(case.files.items())
    ]
    out = {r.path: r for r in LicenseStep(LicenseConfig()).run(iter(recs))}
    rec = out[case.target]
    return rec.license_type, tuple(rec.license_ids)


def license_correct(case: LicenseCase, got: tuple[str, tuple[str, ...]]) -> bool:
    """Whether the outcome has the expected type (and first id, when one is given)."""
    kind, ids = got
    keep = ("permissive", "no_license")
    ok = kind not in keep if case.expected == "excluded" else kind == case.expected
    return ok and (not case.first_id or (bool(ids) and ids[0] == case.first_id))


def dedup_decisions(
    cases: list[DedupCase], cfg: object = None
) -> tuple[list[bool], list[bool], list[float]]:
    """(pipeline's decision, datasketch's decision, exact 5-gram Jaccard) per pair.

    The pipeline: its own signatures and ``find_duplicates`` with the default config.
    datasketch: its own ``MinHash`` over the same shingles, a ``MinHashLSH`` at the
    configured threshold, and the candidate kept when ``MinHash.jaccard`` reaches it.
    """
    import hashlib

    from datasketch import MinHash, MinHashLSH

    from data.config import DedupConfig
    from data.dedup import DedupItem, find_duplicates
    from data.minhash import MinHasher, shingle_set

    cfg = cfg or DedupConfig()
    hasher = MinHasher(cfg.num_perm, cfg.shingle_size, cfg.seed)
    ours, theirs, jac = [], [], []
    for case in cases:
        sigs, has = hasher.signatures([case.a, case.b])
        items = [
            DedupItem(
                (0, i),
                hashlib.sha256(t.encode()).hexdigest(),
                s if h else None,
                "permissive",
                0,
                "",
            )
            for i, (t, s, h) in enumerate(zip((case.a, case.b), sigs, has, strict=True))
        ]
        removed, _ = find_duplicates(items, cfg)
        ours.append(bool(removed))
        sa, sb = shingle_set(case.a, cfg.shingle_size), shingle_set(case.b, cfg.shingle_size)
        jac.append(len(sa & sb) / max(1, len(sa | sb)))
        mh = []
        for sh in (sa, sb):
            m = MinHash(num_perm=cfg.num_perm, seed=cfg.seed)
            m.update_batch([" ".join(s).encode() for s in sh])
            mh.append(m)
        lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm)
        lsh.insert("a", mh[0])
        theirs.append(bool(lsh.query(mh[1])) and mh[0].jaccard(mh[1]) >= cfg.threshold)
    return ours, theirs, jac


def _pr(pred: list[bool], gold: list[bool]) -> str:
    tp = sum(p and g for p, g in zip(pred, gold, strict=True))
    fp = sum(p and not g for p, g in zip(pred, gold, strict=True))
    fn = sum(g and not p for p, g in zip(pred, gold, strict=True))
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    return f"P {prec:.3f} R {rec:.3f} (tp {tp} fp {fp} fn {fn})"


def report() -> None:
    """Print every figure: dedup P/R and agreement, license and language accuracy."""
    from data.language import detect_language

    dcases = dedup_cases()
    ours, theirs, jac = dedup_decisions(dcases)
    for split in ("tune", "held"):
        idx = [i for i, c in enumerate(dcases) if c.split == split]
        gold = [dcases[i].dup for i in idx]
        print(f"dedup {split} n={len(idx)} pipeline {_pr([ours[i] for i in idx], gold)}")
        print(f"dedup {split} datasketch {_pr([theirs[i] for i in idx], gold)}")
        exact = [jac[i] >= 0.7 for i in idx]
        print(f"dedup {split} pipeline vs exact Jaccard>=0.7 {_pr([ours[i] for i in idx], exact)}")
        agree = sum(ours[i] == theirs[i] for i in idx)
        print(f"dedup {split} pipeline==datasketch {agree}/{len(idx)}")
    for i, c in enumerate(dcases):
        if ours[i] != c.dup or theirs[i] != c.dup or ours[i] != theirs[i]:
            print(
                f"  {c.split} {c.kind}: gold {c.dup} ours {ours[i]} ds {theirs[i]} J {jac[i]:.3f}"
            )
    for name, cases, run, ok in (
        ("license", license_cases(), license_outcome, license_correct),
        (
            "language",
            language_cases(),
            lambda c: detect_language(c.path, c.content)[0],
            lambda c, got: got == c.expected,
        ),
    ):
        for split in ("tune", "held"):
            per: dict[str, list[int]] = {}
            for c in (c for c in cases if c.split == split):
                got = run(c)
                hit = ok(c, got)
                per.setdefault(c.kind, [0, 0])[0] += hit
                per[c.kind][1] += 1
                if not hit:
                    where = c.path if isinstance(c, LanguageCase) else c.target
                    print(
                        f"  {name} {split} {c.kind} {where}: "
                        f"expected {c.expected} {getattr(c, 'first_id', '')} got {got}"
                    )
            total = [sum(v[0] for v in per.values()), sum(v[1] for v in per.values())]
            kinds = ", ".join(f"{k} {a}/{b}" for k, (a, b) in per.items())
            print(f"{name} {split} {total[0]}/{total[1]}: {kinds}")


if __name__ == "__main__":
    report()

"""Labelled kinds of input for language and license detection that no earlier set had (stop 40).

Written before the detectors were run on them. Labels:

* language: GitHub linguist's name for the file, as the vendored ``languages.yml``
  (``data/resources/linguist-tables.json``, linguist b45dbe9) spells it; the truth about
  the file, not what a heuristic happens to give (a ``.pl`` Perl script whose regex holds
  ``:-`` is Perl);
* license: the license type the pipeline should give ``target`` (``permissive``,
  ``non_permissive``, ``no_license``; ``excluded`` = any type the default ``keep`` drops)
  and, where it matters, its first SPDX id.

Each kind is split on its own with a seeded shuffle (half, rounded up, to ``tune``), so
both parts hold every kind. ``tune`` cases may guide changes; ``held`` cases are measured.
``python tests/data/labels_stop40.py`` prints accuracy per split and the misses.
"""

# ruff: noqa: E501  (labelled file contents are kept on one line each, as written)

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from identify.vendor.licenses import LICENSES
from labels_stop37 import license_correct, license_outcome  # the scoring stop 37's set used

TEXTS = dict(LICENSES)
SEED = 40


@dataclass(frozen=True)
class LanguageCase:
    kind: str
    split: str
    path: str
    content: str
    expected: str


@dataclass(frozen=True)
class LicenseCase:
    kind: str
    split: str
    files: dict[str, str]
    target: str
    expected: str
    first_id: str = ""


def _split(rows: list[tuple], make) -> list:
    """Seeded split within each kind: the first ceil(n/2) of a shuffle are ``tune``."""
    by_kind: dict[str, list[tuple]] = {}
    for r in rows:
        by_kind.setdefault(r[0], []).append(r)
    out = []
    for kind, items in by_kind.items():
        assert len(items) >= 2, kind
        order = list(range(len(items)))
        random.Random(f"{SEED}-{kind}").shuffle(order)
        n_tune = (len(items) + 1) // 2
        for rank, i in enumerate(order):
            out.append(make(kind, "tune" if rank < n_tune else "held", *items[i][1:]))
    return out


# --------------------------------------------------------------------------- language

DENO = (
    "#!/usr/bin/env -S deno run --allow-net --allow-read\n"
    'import { serve } from "https://deno.land/std@0.224.0/http/server.ts";\n\n'
    'const port: number = Number(Deno.env.get("PORT") ?? 8000);\n'
    'serve((_req: Request) => new Response("ok"), { port });\n'
)
NODE = (
    "#!/usr/bin/env node\n'use strict';\n\nconst fs = require('fs');\n"
    "const [, , file] = process.argv;\nconsole.log(fs.readFileSync(file, 'utf8').length);\n"
)
NODE_S = (
    "#!/usr/bin/env -S node --no-warnings --experimental-specifier-resolution=node\n"
    "import { readFile } from 'node:fs/promises';\n\n"
    "const data = await readFile(process.argv[2], 'utf8');\nconsole.log(JSON.parse(data).name);\n"
)
TS_NODE = (
    "#!/usr/bin/env ts-node\nimport * as path from 'path';\n\n"
    "function main(args: string[]): number {\n  console.log(path.resolve(args[0]));\n  return 0;\n}\n"
    "process.exit(main(process.argv.slice(2)));\n"
)
DENO_PLAIN = (
    "#!/usr/bin/env deno\n"
    "const text: string = await Deno.readTextFile(Deno.args[0]);\n"
    "console.log(text.split('\\n').length);\n"
)
RSCRIPT = (
    "#!/usr/bin/env Rscript\nargs <- commandArgs(trailingOnly = TRUE)\n"
    "df <- read.csv(args[1])\nprint(summary(df))\n"
)
PERL_W = (
    "#!/usr/bin/perl -w\n# rotate logs\nforeach my $f (glob('/var/log/app/*.log')) {\n"
    '    rename $f, "$f.1" or warn "cannot rotate $f: $!";\n}\n'
)
PWSH = (
    "#!/usr/bin/env pwsh\nparam([string]$Name = 'world')\n"
    'Write-Host "Hello, $Name"\nGet-ChildItem -Path . -Filter *.log | Remove-Item\n'
)
TCL = (
    "#!/usr/bin/env tclsh\nset f [open [lindex $argv 0] r]\n"
    "while {[gets $f line] >= 0} { puts [string toupper $line] }\nclose $f\n"
)
PY_VER = (
    "#!/usr/bin/python3.11 -u\nimport sys\n\nfor line in sys.stdin:\n"
    "    sys.stdout.write(line.upper())\n"
)

H_OBJC_MODULE = (
    "//\n//  AppDelegate.h\n//  Notes\n//\n\n@import UIKit;\n\n"
    "NS_ASSUME_NONNULL_BEGIN\n\n@interface AppDelegate : UIResponder <UIApplicationDelegate>\n"
    "@property (strong, nonatomic) UIWindow *window;\n@end\n\nNS_ASSUME_NONNULL_END\n"
)
H_CPP_ENUM_CLASS = (
    "#ifndef COLOR_H_\n#define COLOR_H_\n\n#include <cstdint>\n\nenum class Color : std::uint8_t "
    "{ kRed, kGreen, kBlue };\n\ninline const char* Name(Color c) {\n"
    '  switch (c) { case Color::kRed: return "red"; default: return "?"; }\n}\n\n#endif\n'
)
H_C_INLINE = (
    "#ifndef MINMAX_H\n#define MINMAX_H\n\n#include <stdint.h>\n\n"
    "static inline int32_t min_i32(int32_t a, int32_t b) { return a < b ? a : b; }\n"
    "static inline int32_t max_i32(int32_t a, int32_t b) { return a > b ? a : b; }\n\n#endif\n"
)
H_CPP_OPERATOR = (
    "#pragma once\n\nstruct Vec2 {\n  float x, y;\n  Vec2 operator+(const Vec2& o) const "
    "{ return {x + o.x, y + o.y}; }\n  bool operator==(const Vec2& o) const = default;\n};\n"
)

M_MATLAB_SCRIPT = (
    "x = linspace(0, 2*pi, 100);\ny = sin(x);\nplot(x, y, 'r-');\n"
    "title('Sine wave');\nxlabel('x'); ylabel('sin(x)');\n"
)
M_MATLAB_CELLS = (
    "%% Load data\nload('measurements.mat');\n\n%% Fit\np = polyfit(t, v, 2);\n"
    "fprintf('a = %.3f\\n', p(1));\n"
)
M_OBJC = (
    '/* Copyright 2019 Example */\n\n#import "Parser.h"\n\n@implementation Parser\n\n'
    '- (NSArray *)parse:(NSString *)text {\n  return [text componentsSeparatedByString:@","];\n'
    "}\n\n@end\n"
)
M_MATLAB_CLASSDEF = (
    "classdef Account < handle\n    properties\n        Balance = 0\n    end\n    methods\n"
    "        function deposit(obj, amt)\n            obj.Balance = obj.Balance + amt;\n"
    "        end\n    end\nend\n"
)

PL_PERL_REGEX = (
    "my %emoticons = (smile => ':-)', sad => ':-(');\n"
    "while (my $line = <STDIN>) {\n    $line =~ s/:-\\)/$emoticons{smile}/g;\n    print $line;\n}\n"
)
PL_PERL_PLAIN = (
    "package Counter;\n\nsub new {\n    my ($class, %args) = @_;\n"
    "    return bless { count => $args{start} || 0 }, $class;\n}\n\n1;\n"
)
PL_PROLOG_FACTS = (
    "parent(tom, bob).\nparent(bob, ann).\nparent(bob, pat).\n\n"
    "grandparent(X, Z) :- parent(X, Y), parent(Y, Z).\n"
)
PL_PROLOG_DIRECTIVE = (
    "% family database\n:- dynamic likes/2.\n:- initialization(main).\n\n"
    "likes(mary, wine).\nmain :- likes(mary, X), write(X), nl, halt.\n"
)

V_VERILOG = (
    "module counter #(parameter W = 8) (\n  input  wire clk,\n  input  wire rst,\n"
    "  output reg [W-1:0] q\n);\n  always @(posedge clk) begin\n"
    "    if (rst) q <= 0; else q <= q + 1;\n  end\nendmodule\n"
)
V_VERILOG_DEFINE = (
    "`timescale 1ns / 1ps\n`define WIDTH 16\n\nmodule adder(input [`WIDTH-1:0] a, b, "
    "output [`WIDTH:0] s);\n  assign s = a + b;\nendmodule\n"
)
V_COQ = (
    "From Coq Require Import Arith.\n\nFixpoint double (n : nat) : nat :=\n"
    "  match n with\n  | O => O\n  | S m => S (S (double m))\n  end.\n\n"
    "Lemma double_plus : forall n, double n = n + n.\nProof.\n  induction n; simpl; lia.\nQed.\n"
)
V_COQ_SECTION = (
    "Set Implicit Arguments.\n\nSection Lists.\n  Variable A : Type.\n\n"
    "  Fixpoint len (l : list A) : nat :=\n    match l with nil => 0 | _ :: t => S (len t) end.\n"
    "End Lists.\n"
)

TS_REFERENCE = (
    '/// <reference types="node" />\nimport { EventEmitter } from "events";\n\n'
    "export class Bus extends EventEmitter {\n  emitTyped<T>(name: string, payload: T): boolean {\n"
    "    return this.emit(name, payload);\n  }\n}\n"
)
TS_QT_NODECL = (
    '<!DOCTYPE TS><TS version="1.1" language="de_DE">\n<context>\n    <name>MainWindow</name>\n'
    "    <message>\n        <source>&amp;File</source>\n        <translation>&amp;Datei"
    "</translation>\n    </message>\n</context>\n</TS>\n"
)
TS_QT_XML = (
    '<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE TS>\n<TS version="2.1" language="fr_FR">\n'
    "<context>\n    <name>Dialog</name>\n    <message>\n        <source>Cancel</source>\n"
    "        <translation>Annuler</translation>\n    </message>\n</context>\n</TS>\n"
)
TS_DECL = (
    "declare module '*.svg' {\n  const content: string;\n  export default content;\n}\n\n"
    "interface Window { __APP_STATE__: Record<string, unknown>; }\n"
)

SQL_PG_MODERN = (
    "CREATE OR REPLACE FUNCTION touch_updated_at() RETURNS trigger\n    LANGUAGE plpgsql\n"
    "AS $$\nBEGIN\n    NEW.updated_at := now();\n    RETURN NEW;\nEND;\n$$;\n\n"
    "CREATE TRIGGER t BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION touch_updated_at();\n"
)
SQL_TSQL = (
    "CREATE PROCEDURE [dbo].[GetOrders]\n    @CustomerId INT\nAS\nBEGIN\n    SET NOCOUNT ON;\n"
    "    DECLARE @since DATETIME2 = DATEADD(day, -30, SYSUTCDATETIME());\n"
    "    SELECT * FROM [dbo].[Orders] WHERE CustomerId = @CustomerId AND CreatedAt > @since;\n"
    "END\n"
)
SQL_PLSQL = (
    "CREATE OR REPLACE TRIGGER emp_bi\n  BEFORE INSERT ON employees\n  FOR EACH ROW\nBEGIN\n"
    "  :NEW.id := emp_seq.nextval;\n  :NEW.created := systimestamp;\nEND;\n/\n"
)
SQL_MYSQL = (
    "CREATE TABLE `users` (\n  `id` int unsigned NOT NULL AUTO_INCREMENT,\n"
    "  `email` varchar(255) NOT NULL,\n  PRIMARY KEY (`id`),\n  UNIQUE KEY `email` (`email`)\n"
    ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;\n"
)
SQL_PLAIN = (
    "-- seed data\nINSERT INTO country (code, name) VALUES ('DE', 'Germany');\n"
    "INSERT INTO country (code, name) VALUES ('FR', 'France');\n"
    "SELECT code FROM country WHERE name LIKE 'G%';\n"
)
SQL_SSMS = (
    "\ufeffSET ANSI_NULLS ON\r\nGO\r\nSET QUOTED_IDENTIFIER ON\r\nGO\r\n"
    "CREATE TABLE [dbo].[Log](\r\n\t[Id] [int] IDENTITY(1,1) NOT NULL,\r\n"
    "\t[Message] [nvarchar](max) NULL\r\n) ON [PRIMARY]\r\nGO\r\n"
)

INC_PHP = (
    "<?php\n// database settings\n$db_host = 'localhost';\n$db_name = 'shop';\n"
    "define('DEBUG', false);\n"
)
INC_POV = (
    "#declare Gold = texture {\n  pigment { color rgb <0.9, 0.75, 0.2> }\n"
    "  finish { metallic reflection 0.3 }\n}\n"
)
INC_PASCAL = (
    "{$mode objfpc}{$H+}\n\nprocedure LogLine(const S: string);\nbegin\n  WriteLn(StdErr, S);\n"
    "end;\n"
)
INC_NASM = (
    "%ifndef MACROS_INC\n%define MACROS_INC\n\n%macro SYSCALL_EXIT 1\n    mov rax, 60\n"
    "    mov rdi, %1\n    syscall\n%endmacro\n\n%endif\n"
)

CLS_TEX = (
    "\\NeedsTeXFormat{LaTeX2e}\n\\ProvidesClass{thesis}[2024/01/01 Thesis class]\n"
    "\\LoadClass[12pt,a4paper]{report}\n\\RequirePackage{geometry}\n"
)
CLS_APEX = (
    "public class AccountService {\n    public static List<Account> recent(Integer n) {\n"
    "        return [SELECT Id, Name FROM Account ORDER BY CreatedDate DESC LIMIT :n];\n"
    "    }\n}\n"
)
CLS_OBJECTSCRIPT = (
    "Class Demo.Person Extends %Persistent\n{\n\nProperty Name As %String [ Required ];\n\n"
    'Method Greet() As %String\n{\n    Quit "Hello "_..Name\n}\n\n}\n'
)
CLS_APEX_TEST = (
    "@isTest\nprivate class AccountServiceTest {\n    @isTest static void returnsRecent() {\n"
    "        System.assertEquals(0, AccountService.recent(5).size());\n    }\n}\n"
)

DOCKER = 'FROM node:20-alpine\nWORKDIR /srv\nCOPY package*.json ./\nRUN npm ci\nCMD ["node", "index.js"]\n'
MAKE = "CC ?= cc\nCFLAGS += -O2 -Wall\n\nall: tool\n\ntool: main.o util.o\n\t$(CC) -o $@ $^\n"
JENKINS = (
    "@Library('shared') _\n\npipeline {\n  agent { label 'linux' }\n  stages {\n"
    "    stage('Release') { steps { sh './release.sh' } }\n  }\n}\n"
)
STARLARK = (
    'def _impl(ctx):\n    out = ctx.actions.declare_file(ctx.label.name + ".txt")\n'
    '    ctx.actions.write(out, "hi")\n    return [DefaultInfo(files = depset([out]))]\n\n'
    "hello = rule(implementation = _impl)\n"
)
TILT = (
    "docker_build('api', '.')\nk8s_yaml('deploy.yaml')\nk8s_resource('api', port_forwards=8080)\n"
)
NOTEBOOK = json.dumps(
    {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": 1,
                "metadata": {},
                "outputs": [],
                "source": ["import pandas as pd\n", "df = pd.read_csv('x.csv')"],
            }
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    },
    indent=1,
)
NOTEBOOK_R = NOTEBOOK.replace("Python 3", "R").replace('"python"', '"R"')
VUE = (
    '<template>\n  <button @click="count++">{{ count }}</button>\n</template>\n\n'
    "<script setup lang=\"ts\">\nimport { ref } from 'vue'\nconst count = ref(0)\n</script>\n"
)
SVELTE = (
    "<script>\n  let count = 0;\n</script>\n\n<button on:click={() => count++}>\n"
    "  Clicked {count} times\n</button>\n"
)
ASTRO = "---\nconst { title } = Astro.props;\n---\n<h1>{title}</h1>\n<slot />\n"

MOZ_H = (
    "/* -*- Mode: C++; tab-width: 8; indent-tabs-mode: nil; c-basic-offset: 2 -*- */\n"
    "/* This Source Code Form is subject to the terms of the Mozilla Public\n"
    " * License, v. 2.0. */\n\n#ifndef mozilla_Thing_h\n#define mozilla_Thing_h\n\n"
    "struct Thing;\n\n#endif\n"
)
EMACS_NOEXT = (
    "# -*- mode: python -*-\n# Tool configuration, read by exec()\n"
    "options = dict(verbose=True, jobs=4)\n"
)
VIM_NOEXT = "// vim: set filetype=javascript :\nmodule.exports = {\n  port: 3000,\n};\n"
VIM_DOC_PY = (
    '"""Read editor modelines.\n\nSupported forms, for example::\n\n'
    "    # vim: set ft=ruby:\n    # -*- mode: perl -*-\n\n"
    'and the first and last lines are searched."""\n\nimport re\n\n'
    "MODELINE = re.compile(r'vim:.*ft=(\\w+)')\n\n\ndef modeline(text):\n"
    "    m = MODELINE.search(text)\n    return m.group(1) if m else None\n"
)
VIM_C_NOFT = (
    "/* vim: set ts=8 sw=4 noet: */\n#include <stdio.h>\n\nint main(void)\n{\n"
    '\tputs("hi");\n\treturn 0;\n}\n'
)


def language_rows() -> list[tuple]:
    """(kind, path, content, expected) before the split."""
    return [
        ("shebang_env_s", "bin/serve", DENO, "TypeScript"),
        ("shebang_env_s", "scripts/pkgname", NODE_S, "JavaScript"),
        ("shebang_env_s", "tools/deploy", DENO.replace("--allow-read", "-A"), "TypeScript"),
        ("shebang_env_s", "bin/info", NODE_S.replace("--no-warnings ", ""), "JavaScript"),
        ("shebang_node_ts", "bin/count", NODE, "JavaScript"),
        ("shebang_node_ts", "bin/resolve", TS_NODE, "TypeScript"),
        ("shebang_node_ts", "bin/lines", DENO_PLAIN, "TypeScript"),
        ("shebang_node_ts", "cli", NODE.replace("argv", "argv.slice(0)"), "JavaScript"),
        ("shebang_other", "bin/summarise", RSCRIPT, "R"),
        ("shebang_other", "cron/rotate", PERL_W, "Perl"),
        ("shebang_other", "scripts/hello", PWSH, "PowerShell"),
        ("shebang_other", "bin/upper", TCL, "Tcl"),
        ("shebang_other", "bin/up", PY_VER, "Python"),
        ("header_objc_cpp_c", "Notes/AppDelegate.h", H_OBJC_MODULE, "Objective-C"),
        ("header_objc_cpp_c", "src/color.h", H_CPP_ENUM_CLASS, "C++"),
        ("header_objc_cpp_c", "include/minmax.h", H_C_INLINE, "C"),
        ("header_objc_cpp_c", "math/vec2.h", H_CPP_OPERATOR, "C++"),
        ("m_matlab_objc", "analysis/plot_sine.m", M_MATLAB_SCRIPT, "MATLAB"),
        ("m_matlab_objc", "analysis/fit.m", M_MATLAB_CELLS, "MATLAB"),
        ("m_matlab_objc", "Sources/Parser.m", M_OBJC, "Objective-C"),
        ("m_matlab_objc", "bank/Account.m", M_MATLAB_CLASSDEF, "MATLAB"),
        ("pl_perl_prolog", "bin/emoticons.pl", PL_PERL_REGEX, "Perl"),
        ("pl_perl_prolog", "lib/Counter.pl", PL_PERL_PLAIN, "Perl"),
        ("pl_perl_prolog", "family.pl", PL_PROLOG_FACTS, "Prolog"),
        ("pl_perl_prolog", "likes.pl", PL_PROLOG_DIRECTIVE, "Prolog"),
        ("v_verilog_coq", "rtl/counter.v", V_VERILOG, "Verilog"),
        ("v_verilog_coq", "rtl/adder.v", V_VERILOG_DEFINE, "Verilog"),
        ("v_verilog_coq", "theories/Double.v", V_COQ, "Rocq Prover"),
        ("v_verilog_coq", "theories/Lists.v", V_COQ_SECTION, "Rocq Prover"),
        ("ts_typescript_qt", "src/bus.ts", TS_REFERENCE, "TypeScript"),
        ("ts_typescript_qt", "i18n/app_de.ts", TS_QT_NODECL, "XML"),
        ("ts_typescript_qt", "translations/dialog_fr.ts", TS_QT_XML, "XML"),
        ("ts_typescript_qt", "types/global.d.ts", TS_DECL, "TypeScript"),
        ("sql_dialect", "db/migrations/003_touch.sql", SQL_PG_MODERN, "PLpgSQL"),
        ("sql_dialect", "db/procs/GetOrders.sql", SQL_TSQL, "TSQL"),
        ("sql_dialect", "db/oracle/emp_bi.sql", SQL_PLSQL, "PLSQL"),
        ("sql_dialect", "schema/users.sql", SQL_MYSQL, "SQL"),
        ("sql_dialect", "seed/country.sql", SQL_PLAIN, "SQL"),
        ("sql_dialect", "db/Log.Table.sql", SQL_SSMS, "TSQL"),
        ("inc_file", "config/db.inc", INC_PHP, "PHP"),
        ("inc_file", "scenes/textures.inc", INC_POV, "POV-Ray SDL"),
        ("inc_file", "src/logging.inc", INC_PASCAL, "Pascal"),
        ("inc_file", "asm/macros.inc", INC_NASM, "Assembly"),
        ("cls_file", "tex/thesis.cls", CLS_TEX, "TeX"),
        ("cls_file", "force-app/classes/AccountService.cls", CLS_APEX, "Apex"),
        ("cls_file", "src/Demo/Person.cls", CLS_OBJECTSCRIPT, "ObjectScript"),
        ("cls_file", "force-app/classes/AccountServiceTest.cls", CLS_APEX_TEST, "Apex"),
        ("dockerfile_suffix", "Dockerfile-alpine", DOCKER, "Dockerfile"),
        ("dockerfile_suffix", "docker/Dockerfile_arm64", DOCKER, "Dockerfile"),
        ("dockerfile_suffix", "build/worker.dockerfile", DOCKER, "Dockerfile"),
        ("dockerfile_suffix", "images/api.Containerfile", DOCKER, "Dockerfile"),
        ("makefile_more", "makefile", MAKE, "Makefile"),
        ("makefile_more", "BSDmakefile", MAKE, "Makefile"),
        ("makefile_more", "build/common.mk", MAKE, "Makefile"),
        ("makefile_more", "win/build.mak", MAKE, "Makefile"),
        ("makefile_more", "Makefile.linux", MAKE, "Makefile"),
        ("makefile_more", "Makefile.inc", MAKE, "Makefile"),
        ("jenkinsfile_variant", "Jenkinsfile.release", JENKINS, "Groovy"),
        ("jenkinsfile_variant", "ci/deploy.Jenkinsfile", JENKINS, "Groovy"),
        ("jenkinsfile_variant", "jenkins/Jenkinsfile-nightly", JENKINS, "Groovy"),
        ("starlark_more", "tools/rules.bzl", STARLARK, "Starlark"),
        ("starlark_more", "WORKSPACE.bazel", 'workspace(name = "y")\n', "Starlark"),
        ("starlark_more", "Tiltfile", TILT, "Starlark"),
        (
            "starlark_more",
            "lib/BUCK",
            'python_library(name = "lib", srcs = glob(["*.py"]))\n',
            "Starlark",
        ),
        ("notebook", "notebooks/explore.ipynb", NOTEBOOK, "Jupyter Notebook"),
        ("notebook", "analysis/R-stats.ipynb", NOTEBOOK_R, "Jupyter Notebook"),
        ("sfc", "src/components/Counter.vue", VUE, "Vue"),
        ("sfc", "src/lib/Counter.svelte", SVELTE, "Svelte"),
        ("sfc", "src/pages/index.astro", ASTRO, "Astro"),
        ("modeline", "mozilla/Thing.h", MOZ_H, "C++"),
        ("modeline", "site_config", EMACS_NOEXT, "Python"),
        ("modeline", "config/server.conf.local", VIM_NOEXT, "JavaScript"),
        ("modeline", "editor/modelines.py", VIM_DOC_PY, "Python"),
        ("modeline", "src/hello.c", VIM_C_NOFT, "C"),
        ("encoding", "bin/bom-tool", "\ufeff#!/usr/bin/env python3\nprint('hi')\n", "Python"),
        ("encoding", "bin/crlf-tool", "#!/bin/sh\r\nset -e\r\necho ok\r\n", "Shell"),
        ("encoding", "conf/app", "\ufeff# vim: ft=ruby\r\nputs 'x'\r\n", "Ruby"),
        (
            "encoding",
            "scripts/Setup.ps1",
            "\ufeffparam([string]$Path)\r\nWrite-Output $Path\r\n",
            "PowerShell",
        ),
        (
            "encoding",
            "settings.reg",
            '\ufeffWindows Registry Editor Version 5.00\r\n\r\n[HKEY_CURRENT_USER\\Software\\X]\r\n"A"=dword:00000001\r\n',
            "Windows Registry Entries",
        ),
        (
            "encoding",
            "Sources/View.h",
            "\ufeff#import <UIKit/UIKit.h>\r\n\r\n@interface View : UIView\r\n@end\r\n",
            "Objective-C",
        ),
    ]


def language_cases() -> list[LanguageCase]:
    return _split(language_rows(), LanguageCase)


# --------------------------------------------------------------------------- license

CODE = "def main():\n    return 0\n"


def _mit(holder: str = "2024 A. Author") -> str:
    return TEXTS["MIT"].replace("<year> <copyright holders>", holder)


def _reflow(text: str) -> str:
    """Paragraphs on one line each, as editors that soft-wrap save them."""
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


def _markdown_bsd3() -> str:
    body = TEXTS["BSD-3-Clause"].replace("<year>", "2020").replace("<owner>", "The Y Authors")
    body = body.replace("1. ", "1. **").replace("2. ", "2. **").replace("3. ", "3. **")
    return "# BSD 3-Clause License\n\n" + body


BADGES = (
    "[![License: MIT](https://img.shields.io/badge/License-MIT-yellow.svg)]"
    "(https://opensource.org/licenses/MIT)\n"
    "[![CI](https://github.com/x/y/actions/workflows/ci.yml/badge.svg)]"
    "(https://github.com/x/y/actions)\n\n"
)
GPL_NOTICE_C = (
    "/*\n * fastcrc.c - CRC routines\n * Copyright (C) 2009 Some Hacker\n *\n"
    " * This program is free software; you can redistribute it and/or modify\n"
    " * it under the terms of the GNU General Public License as published by\n"
    " * the Free Software Foundation; either version 2 of the License, or\n"
    " * (at your option) any later version.\n *\n"
    " * This program is distributed in the hope that it will be useful,\n"
    " * but WITHOUT ANY WARRANTY; without even the implied warranty of\n"
    " * MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the\n"
    " * GNU General Public License for more details.\n */\n\n#include <stdint.h>\n\n"
    "uint32_t crc32(const void *p, unsigned n);\n"
)
GPL3_NOTICE_PY = (
    "# tinysched - a scheduler\n# Copyright (C) 2021 Someone\n#\n"
    "# This program is free software: you can redistribute it and/or modify\n"
    "# it under the terms of the GNU General Public License as published by\n"
    "# the Free Software Foundation, either version 3 of the License, or\n"
    "# (at your option) any later version.\n\n" + CODE
)
MENTION_GPL = (
    "# A clean-room reimplementation of the algorithm described in the paper; unlike the\n"
    "# original GNU General Public License version 2 tool, no code was copied from it.\n\n" + CODE
)
SPDX_IN_STRING = (
    "import re\n\nHEADER = re.compile(r'SPDX-License-Identifier: (.+)')\n\n"
    "def test_header_found():\n"
    '    text = "// SPDX-License-Identifier: GPL-3.0-only\\nint x;\\n"\n'
    "    assert HEADER.search(text).group(1) == 'GPL-3.0-only'\n"
)
SPDX_TEMPLATE = (
    'TEMPLATE = """\\\n# SPDX-License-Identifier: AGPL-3.0-or-later\n# Copyright {year} {owner}\n"""\n\n'
    "def render(year, owner):\n    return TEMPLATE.format(year=year, owner=owner)\n"
)
RUST_README = (
    "# frob\n\nA fast frobnicator.\n\n## License\n\nLicensed under either of\n\n"
    " * Apache License, Version 2.0\n   ([LICENSE-APACHE](LICENSE-APACHE) or "
    "http://www.apache.org/licenses/LICENSE-2.0)\n"
    " * MIT license\n   ([LICENSE-MIT](LICENSE-MIT) or http://opensource.org/licenses/MIT)\n\n"
    "at your option.\n"
)


def license_rows() -> list[tuple]:
    """(kind, files, target, expected, first_id) before the split."""
    return [
        # SPDX expressions in file headers (no license file).
        (
            "spdx_expression",
            {
                "a.java": "// SPDX-License-Identifier: GPL-2.0-or-later WITH Classpath-exception-2.0\n"
                + CODE
            },
            "a.java",
            "non_permissive",
            "GPL-2.0-or-later",
        ),
        (
            "spdx_expression",
            {"a.c": "/* SPDX-License-Identifier: (MIT OR Apache-2.0) AND BSD-3-Clause */\n" + CODE},
            "a.c",
            "permissive",
            "",
        ),
        (
            "spdx_expression",
            {"a.c": "// SPDX-License-Identifier: LGPL-2.1-or-later OR MIT\n" + CODE},
            "a.c",
            "permissive",
            "",
        ),
        (
            "spdx_expression",
            {"a.py": "# SPDX-License-Identifier: MPL-2.0 OR GPL-2.0-or-later\n" + CODE},
            "a.py",
            "non_permissive",
            "",
        ),
        (
            "spdx_expression",
            {
                "a.go": "// SPDX-FileCopyrightText: 2024 X\r\n// SPDX-License-Identifier: Apache-2.0\r\n"
                + CODE
            },
            "a.go",
            "permissive",
            "Apache-2.0",
        ),
        (
            "spdx_expression",
            {"a.py": '"""Tool.\n\nSPDX-License-Identifier: BSD-2-Clause\n"""\n' + CODE},
            "a.py",
            "permissive",
            "BSD-2-Clause",
        ),
        # Full texts reflowed or in markdown.
        (
            "reflowed_markdown",
            {"LICENSE": _reflow(_mit("2023 Reflow Co")), "a.py": CODE},
            "a.py",
            "permissive",
            "MIT",
        ),
        (
            "reflowed_markdown",
            {"LICENSE.md": _markdown_bsd3(), "a.py": CODE},
            "a.py",
            "permissive",
            "BSD-3-Clause",
        ),
        (
            "reflowed_markdown",
            {"LICENSE": _reflow(TEXTS["Apache-2.0"]), "a.py": CODE},
            "a.py",
            "permissive",
            "Apache-2.0",
        ),
        (
            "reflowed_markdown",
            {"LICENSE.md": "> " + _mit("2022 Quote Ltd").replace("\n", "\n> "), "a.py": CODE},
            "a.py",
            "permissive",
            "MIT",
        ),
        (
            "reflowed_markdown",
            {
                "COPYING.md": "# GNU GENERAL PUBLIC LICENSE\n\n" + _reflow(TEXTS["GPL-3.0"]),
                "a.py": CODE,
            },
            "a.py",
            "non_permissive",
            "",
        ),
        # LICENSE.md with badges above the text.
        (
            "license_badges",
            {"LICENSE.md": BADGES + _mit("2021 Badge Inc"), "a.py": CODE},
            "a.py",
            "permissive",
            "MIT",
        ),
        (
            "license_badges",
            {"LICENSE.md": BADGES.replace("MIT", "GPL-3.0") + TEXTS["GPL-3.0"], "a.py": CODE},
            "a.py",
            "non_permissive",
            "",
        ),
        (
            "license_badges",
            {
                "LICENSE.md": "![license](https://img.shields.io/github/license/x/y)\n\n"
                + TEXTS["ISC"].replace("<year>", "2020").replace("<owner>", "Z"),
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "ISC",
        ),
        # Other license texts with modified copyright lines.
        (
            "altered_copyright_more",
            {
                "LICENSE": TEXTS["ISC"].replace(
                    "Copyright (c) <year>, <owner>",
                    "Copyright (c) 2015, Alice\nCopyright (c) 2016-2024, Bob and contributors",
                ),
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "ISC",
        ),
        (
            "altered_copyright_more",
            {
                "LICENSE": "(The MIT License)\n\n"
                + _mit("2011-present TJ Holowaychuk <tj@example.com>"),
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "MIT",
        ),
        (
            "altered_copyright_more",
            {
                "LICENSE": TEXTS["BSD-2-Clause"]
                .replace("<year>", "2019-present")
                .replace("<owner>", "Facebook, Inc. and its affiliates"),
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "BSD-2-Clause",
        ),
        (
            "altered_copyright_more",
            {
                "LICENSE.txt": TEXTS["Zlib"]
                .replace("<year>", "1995-2024")
                .replace("<copyright holders>", "Jean-loup Gailly and Mark Adler"),
                "a.c": CODE,
            },
            "a.c",
            "permissive",
            "Zlib",
        ),
        # Public-domain-like licenses.
        (
            "public_domain",
            {
                "LICENSE": TEXTS["0BSD"].replace("<year>", "2024").replace("<owner>", "Q"),
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "0BSD",
        ),
        (
            "public_domain",
            {"LICENSE": TEXTS["CC0-1.0"], "a.py": CODE},
            "a.py",
            "permissive",
            "CC0-1.0",
        ),
        (
            "public_domain",
            {"LICENSE.txt": TEXTS["Unlicense"], "a.py": CODE},
            "a.py",
            "permissive",
            "Unlicense",
        ),
        ("public_domain", {"COPYING": TEXTS["WTFPL"], "a.py": CODE}, "a.py", "permissive", "WTFPL"),
        # READMEs that declare a (dual) license, no license file.
        (
            "readme_license",
            {"README.md": RUST_README, "src/lib.rs": CODE},
            "src/lib.rs",
            "permissive",
            "",
        ),
        (
            "readme_license",
            {"README.md": "# x\n\n## License\n\n[MIT](LICENSE)\n", "a.js": CODE},
            "a.js",
            "permissive",
            "MIT",
        ),
        (
            "readme_license",
            {
                "README.md": "# x\n\n## License\n\nDistributed under the MIT License. See `LICENSE.txt` for more information.\n",
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "MIT",
        ),
        (
            "readme_license",
            {
                "README.md": "# x\n\n## 📝 License\n\nThis project is [Apache-2.0](LICENSE) licensed.\n",
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "Apache-2.0",
        ),
        (
            "readme_license",
            {
                "README.rst": "x\n=\n\nLicense\n-------\n\nGPL-3.0-or-later. See COPYING.\n",
                "a.py": CODE,
            },
            "a.py",
            "non_permissive",
            "",
        ),
        (
            "readme_license",
            {
                "README.md": "# x\n\n## License\n\nThis project is licensed under the terms of the BSD-3-Clause license.\n",
                "a.py": CODE,
            },
            "a.py",
            "permissive",
            "BSD-3-Clause",
        ),
        # Package manifests, forms no earlier set had.
        (
            "manifest_more",
            {"package.json": '{"name": "x", "license": "(MIT OR Apache-2.0)"}\n', "index.js": CODE},
            "index.js",
            "permissive",
            "",
        ),
        (
            "manifest_more",
            {
                "pyproject.toml": '[tool.poetry]\nname = "x"\nlicense = "BSD-3-Clause"\n',
                "x/a.py": CODE,
            },
            "x/a.py",
            "permissive",
            "BSD-3-Clause",
        ),
        (
            "manifest_more",
            {
                "Cargo.toml": '[workspace]\nmembers = ["crates/*"]\n\n[workspace.package]\nlicense = "MIT OR Apache-2.0"\n',
                "crates/core/Cargo.toml": '[package]\nname = "core"\nlicense.workspace = true\n',
                "crates/core/src/lib.rs": CODE,
            },
            "crates/core/src/lib.rs",
            "permissive",
            "",
        ),
        (
            "manifest_more",
            {
                "Cargo.toml": '[workspace]\nmembers = ["cli"]\n\n[workspace.package]\nlicense = "GPL-3.0-only"\n',
                "cli/Cargo.toml": '[package]\nname = "cli"\nlicense = { workspace = true }\n',
                "cli/src/main.rs": CODE,
            },
            "cli/src/main.rs",
            "non_permissive",
            "",
        ),
        (
            "manifest_more",
            {
                "pyproject.toml": '[project]\nname = "x"\nlicense = {file = "LICENSE"}\n',
                "LICENSE": TEXTS["GPL-3.0"],
                "x/a.py": CODE,
            },
            "x/a.py",
            "non_permissive",
            "",
        ),
        (
            "manifest_more",
            {
                "package.json": '{"name": "x", "license": "SEE LICENSE IN LICENSE.txt"}\n',
                "LICENSE.txt": _mit(),
                "index.js": CODE,
            },
            "index.js",
            "permissive",
            "MIT",
        ),
        # Proprietary declarations in manifests.
        (
            "proprietary_more",
            {
                "pyproject.toml": '[project]\nname = "x"\nlicense = {text = "Proprietary"}\n',
                "x/a.py": CODE,
            },
            "x/a.py",
            "excluded",
            "",
        ),
        (
            "proprietary_more",
            {"a.c": "// SPDX-License-Identifier: LicenseRef-Proprietary\n" + CODE},
            "a.c",
            "excluded",
            "",
        ),
        (
            "proprietary_more",
            {
                "LICENSE.md": "# License\n\nCopyright (c) 2024 Initech LLC. All rights reserved.\n\nThis source code is licensed only to Initech customers under the terms of their Master Services Agreement and may not be redistributed.\n",
                "a.py": CODE,
            },
            "a.py",
            "excluded",
            "",
        ),
        # A vendored file whose only license is a notice in its comment header.
        (
            "vendored_notice",
            {"LICENSE": _mit(), "third_party/fastcrc/fastcrc.c": GPL_NOTICE_C},
            "third_party/fastcrc/fastcrc.c",
            "excluded",
            "",
        ),
        (
            "vendored_notice",
            {"LICENSE": _mit(), "vendor/tinysched.py": GPL3_NOTICE_PY},
            "vendor/tinysched.py",
            "excluded",
            "",
        ),
        (
            "vendored_notice",
            {
                "LICENSE": _mit(),
                "third_party/x/util.py": '# Licensed under the Apache License, Version 2.0 (the "License");\n# you may not use this file except in compliance with the License.\n'
                + CODE,
            },
            "third_party/x/util.py",
            "permissive",
            "",
        ),
        # Negatives: text that mentions a license without being under it.
        (
            "negative_mention",
            {"LICENSE": _mit(), "tests/test_headers.py": SPDX_IN_STRING},
            "tests/test_headers.py",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {"LICENSE": _mit(), "tools/newfile.py": SPDX_TEMPLATE},
            "tools/newfile.py",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {"LICENSE": _mit(), "algo/crc.py": MENTION_GPL},
            "algo/crc.py",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {
                "LICENSE": _mit(),
                "src/license.py": "import json\n\ndef load(p):\n    return json.load(open(p))\n",
                "src/app.py": CODE,
            },
            "src/app.py",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {
                "LICENSE": _mit(),
                "src/main/java/com/x/License.java": "package com.x;\n\npublic final class License {\n  private final String key;\n  public License(String key) { this.key = key; }\n}\n",
                "src/main/java/com/x/App.java": CODE,
            },
            "src/main/java/com/x/App.java",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {
                "LICENSE": _mit(),
                "pkg/license_check.go": "package pkg\n\n// Check reports whether the GPL-3.0 text is present.\nfunc Check(s string) bool { return len(s) > 0 }\n",
                "pkg/main.go": CODE,
            },
            "pkg/main.go",
            "permissive",
            "MIT",
        ),
        (
            "negative_mention",
            {
                "LICENSE": _mit(),
                "web/licenses.ts": "export const LICENSES = ['MIT', 'GPL-3.0-only', 'Apache-2.0'];\n",
                "web/app.ts": CODE,
            },
            "web/app.ts",
            "permissive",
            "MIT",
        ),
    ]


def license_cases() -> list[LicenseCase]:
    return _split(license_rows(), LicenseCase)


# --------------------------------------------------------------------------- scoring


def language_outcome(case: LanguageCase) -> str:
    from data.language import detect_language

    return detect_language(case.path, case.content)[0]


def score(split: str) -> dict[str, tuple[int, int, list[str]]]:
    """{set: (correct, total, misses)} for one split."""
    out = {}
    for name, cases, run, ok in (
        ("language", language_cases(), language_outcome, lambda c, g: g == c.expected),
        ("license", license_cases(), license_outcome, license_correct),
    ):
        hits, misses = 0, []
        chosen = [c for c in cases if c.split == split]
        for c in chosen:
            got = run(c)
            if ok(c, got):
                hits += 1
            else:
                where = getattr(c, "path", None) or c.target
                misses.append(
                    f"{c.kind} {where}: expected {c.expected} {getattr(c, 'first_id', '')} got {got}"
                )
        out[name] = (hits, len(chosen), misses)
    return out


def per_class(split: str) -> dict[str, tuple[int, int]]:
    """Language accuracy per expected class (hits, total) for one split."""
    res: dict[str, list[int]] = {}
    for c in language_cases():
        if c.split == split:
            r = res.setdefault(c.expected, [0, 0])
            r[0] += language_outcome(c) == c.expected
            r[1] += 1
    return {k: (a, b) for k, (a, b) in sorted(res.items())}


def license_pr(split: str) -> dict[str, float]:
    """Precision/recall of "kept as permissive" against the labels (one split)."""
    tp = fp = fn = 0
    for c in license_cases():
        if c.split != split:
            continue
        got = license_outcome(c)[0] == "permissive"
        gold = c.expected == "permissive"
        tp += got and gold
        fp += got and not gold
        fn += gold and not got
    return {
        "precision": tp / (tp + fp) if tp + fp else 1.0,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
    }


if __name__ == "__main__":
    for split in ("tune", "held"):
        for name, (hits, total, misses) in score(split).items():
            print(f"{name} {split}: {hits}/{total} = {hits / total:.3f}")
            for m in misses:
                print("   ", m)
        print(f"license {split} permissive P/R: {license_pr(split)}")
        print(f"language {split} per class: {per_class(split)}")

"""Stop 44: language detection on kinds of input no earlier set had.

``tests/data/language_stop44.jsonl``: 122 (path, text) -> language cases in 22 kinds,
labelled by hand from linguist b45dbe9's ``languages.yml``, ``heuristics.yml``,
``shebang.rb`` and ``modeline.rb`` before the detector was run on them (``''`` where
linguist names no language). Kinds: heuristics for ``.r``, ``.fs``, ``.md``, ``.rs``,
``.t``, ``.pro``, ``.ms``, ``.d``, ``.es``/``.ex``/``.cs``, ``.l``/``.bb``/``.f``;
HCL/Terraform files; shebang variants (``python3.11``, ``sh -e``, ``env -S node ...``,
``env -i VAR=x bash``, ``#! /usr/bin/env``, ``awk -f``, ``make -f``) and ``sh`` ``exec``
hacks; modelines in a file's last lines; dotfiles; build scripts; lock and module files;
upper-case extensions; double extensions and templates (``.d.ts``, ``.yaml.j2``,
``.html.erb``, ``.js.erb``); minified/generated files; negatives linguist leaves unknown.

The split is BY KIND and was fixed before any detector output was seen: the kind names
sorted, shuffled with ``random.Random(44)``, the first half (rounded up) ``tune``, the
rest ``heldout`` (11 and 11 kinds, 62 and 60 cases; both lists are in the file's header).

Measured before any change: tune 45/62, **held-out 51/60**. Fixed from tune misses only:
linguist's ``.fs`` (F#, GLSL), ``.pro`` (ProGuard, Prolog, qmake, IDL), ``.ms`` (roff, GNU
assembler, MiniScript, MAXScript), ``.l``, ``.bb`` and ``.f``/``.for`` rules; ``#!/bin/sh``
+ ``exec <interpreter> "$0" "$@"``; linguist's own interpreter table (``guile``, ``wish``,
160 interpreters one language claims, vendored beside its extensions); extensions looked up
lower-cased (``UTIL.H`` is ``.h``). Tune 62/62; held-out measured after, never looked at
while fixing: **49/60** (lower-casing cost two ``.R`` files, which Pygments' ``*.r`` reads
as REBOL). Then, from the held-out misses (so the figure below is optimistic): linguist's
``.r`` (Rebol, Rez, R), ``.d`` (D, DTrace, Makefile dependency lists) and ``.es`` rules,
``REBOL`` spelled ``Rebol``; modelines read in the first and last five lines only (an
Emacs modeline ending a long file was missed, a Vim one quoted mid-file was taken); an
extension linguist gives one language decides before Pygments' ``*.yaml.j2`` patterns
(``.j2`` is linguist's Jinja; linguist b45dbe9 has no HTML+Django). Held-out 60/60. One
label was corrected after the first run: linguist lists ``.json.example`` as JSON (the
figures above use the corrected label).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from labelled_sets import language_score, load_cases

from data.language import detect_language

SET = Path(__file__).with_name("language_stop44.jsonl")


HEADER, CASES = load_cases(SET)


def score(split: str) -> tuple[int, int, list[str]]:
    return language_score(CASES, split)


def test_split_is_by_kind() -> None:
    tune, held = set(HEADER["tune_kinds"]), set(HEADER["heldout_kinds"])
    assert not tune & held
    for c in CASES:
        assert c["kind"] in (tune if c["split"] == "tune" else held), c


def test_tune_all() -> None:
    ok, n, errors = score("tune")
    assert ok == n, "\n".join(errors)


HELDOUT_FLOOR = 60  # optimistic: the held-out families were fixed after seeing them


def test_heldout_floor() -> None:
    ok, n, errors = score("heldout")
    assert ok >= HELDOUT_FLOOR, f"{ok}/{n}\n" + "\n".join(errors)


@settings(max_examples=25, deadline=None)
@given(size=st.integers(0, 8000), width=st.integers(1, 100), after=st.integers(0, 4))
def test_modeline_in_last_five_lines_any_length(size: int, width: int, after: int) -> None:
    """linguist reads the last five lines whatever the file's length (the old code missed
    a Vim modeline ending a file of 2-3 KB, and an Emacs one ending any file over 3 KB)."""
    line = "v" * width
    body = [line] * (size // (width + 1))
    for modeline in ("# vim: set ft=ruby :", "# -*- mode: ruby -*-"):
        text = "\n".join([*body, modeline, *["x = 1"] * after]) + "\n"
        assert detect_language("tasks/report", text) == ("Ruby", "modeline"), len(text)


@settings(max_examples=25, deadline=None)
@given(before=st.integers(5, 30), after=st.integers(5, 30))
def test_modeline_mid_file_is_ignored(before: int, after: int) -> None:
    """A modeline neither in the first nor the last five lines is text, not a modeline."""
    text = "note\n" * before + "  vim: set ft=python :\n" + "note\n" * after
    assert detect_language("docs/notes.txt", text) == ("Text", "extension")


@settings(max_examples=25, deadline=None)
@given(ext=st.sampled_from(["py", "h", "c", "md", "sh", "bat", "f90", "json", "r", "rs"]))
def test_extension_case_does_not_matter(ext: str) -> None:
    """linguist looks extensions up lower-cased: ``X.PY`` is ``x.py``'s language."""
    text = "# a comment\nx <- 1\n" if ext == "r" else "x\n"
    assert (
        detect_language(f"SRC/X.{ext.upper()}", text)[0] == detect_language(f"src/x.{ext}", text)[0]
    )


if __name__ == "__main__":
    for split in ("tune", "heldout"):
        ok, n, errors = score(split)
        print(split, f"{ok}/{n}")
        print("\n".join(errors))

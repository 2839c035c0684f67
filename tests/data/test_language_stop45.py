"""Stop 45: language detection on kinds of input no earlier set had.

``tests/data/language_stop45.jsonl``: 105 (path, text) -> language cases in 19 kinds,
labelled by hand from linguist b45dbe9's ``languages.yml``, ``heuristics.yml`` and
``shebang.rb`` before the detector was run on them (``''`` where linguist names no
language). Kinds: heuristics for ``.pp`` (Puppet/Pascal), ``.mod`` (Modula-2, XML, NMODL),
``.sc``/``.scd``, ``.php`` (Hack), ``.pm``/``.pod``, ``.txt`` (Vim help, hosts, Adblock
lists, pip requirements), ``.properties`` (INI/Java Properties), OpenAPI ``.yaml``/``.json``
and MiniYAML, ``.rpy``/``.re``/``.res``, ``.toc``/``.plt``/``.p``/``.tpl``,
``.st``/``.q``/``.qs``, ``.x``/``.i``, ``.ml``/``.lisp``/``.nl``, ``.gd``/``.gml``/``.gs``,
``.asc``/``.as``/``.cl``, ``.m`` (Mercury, Wolfram Language, M, MUF); shebangs with absolute
versioned paths, ``env -vS``, ``env VAR=x``, ``busybox sh``; tooling filenames (Brewfile,
Justfile, Procfile, go.work, APKBUILD, Snakefile, Caddyfile, CODEOWNERS); rc dotfiles.

The split is BY KIND and was fixed before any detector output was seen: the kind names
sorted, shuffled with ``random.Random(45)``, the first half (rounded up) ``tune``, the
rest ``heldout`` (10 and 9 kinds, 57 and 48 cases; both lists are in the file's header).
Two labels were corrected before the first run, from languages.yml/heuristics.yml alone
(``requirements.txt`` is linguist's Pip Requirements; a Modula-2 case without
``MODULE x;``/``END x;`` lines matched no rule). ``etc/hosts`` is a filename linguist gives
to both Hosts File and INI (its classifier decides): labelled Hosts File.

Measured before any change: tune 32/57, **held-out 23/48**. Fixed from tune misses only,
in general: linguist's whole ``heuristics.yml`` (162 extension groups, named patterns
expanded, Ruby regexes rewritten for Python) vendored as
``data/resources/linguist-heuristics.json`` and tried first, in linguist's order, for any
extension linguist does not give to one language; Pygments lexer names spelled by
linguist's names and aliases (``Q`` is ``q``, ``Mathematica`` ``Wolfram Language``,
``ReasonML`` ``Reason``); a filename several languages claim (``hosts``) takes the first
candidate one of whose heuristics.yml rules matches. Tune 57/57; held-out measured after,
never looked at while fixing: **46/48**. Then from the two held-out misses (so the figure
below is optimistic): ``#!/usr/bin/env FOO=1 python3`` reads past env's ``VAR=value``
settings, and a Pygments filename for a language linguist lacks (``todo.txt``: Todotxt)
does not override an extension linguist decides (``.txt``). Held-out 48/48.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from labelled_sets import language_score, load_cases

from data.language import _linguist_heuristics, detect_language

SET = Path(__file__).with_name("language_stop45.jsonl")


HEADER, CASES = load_cases(SET)


def score(split: str) -> tuple[int, int, list[str]]:
    return language_score(CASES, split)


def test_split_is_by_kind() -> None:
    tune, held = set(HEADER["tune_kinds"]), set(HEADER["heldout_kinds"])
    assert not tune & held
    assert len(tune) == 10 and len(held) == 9
    for c in CASES:
        assert c["kind"] in (tune if c["split"] == "tune" else held), c


def test_tune_all() -> None:
    ok, n, errors = score("tune")
    assert (ok, n) == (57, 57), "\n".join(errors)


HELDOUT_FLOOR = 48  # optimistic: two held-out misses were fixed after seeing them (46 before)


def test_heldout_floor() -> None:
    ok, n, errors = score("heldout")
    assert n == 48 and ok >= HELDOUT_FLOOR, f"{ok}/{n}\n" + "\n".join(errors)


def test_every_linguist_rule_is_vendored() -> None:
    """All 162 heuristics.yml groups, each rule's regexes compiled (none dropped)."""
    rules = _linguist_heuristics()["heuristics"]
    assert len(rules) >= 162
    assert [r["language"] for r in rules["pp"]] == ["Pascal", "Puppet"]
    assert rules["txt"][-1] == {"language": "Text"}
    adblock = rules["txt"][2]["pattern"][0]
    assert adblock.search("[uBlock Origin; AdGuard 1.2]\n||ads.example^\n")


@settings(max_examples=25, deadline=None)
@given(
    opts=st.lists(st.sampled_from(["-S", "-i", "-vS", "-0", "A=1", "PATH=/x:/y"]), max_size=3),
    interp=st.sampled_from([("python3", "Python"), ("node", "JavaScript"), ("bash", "Shell")]),
)
def test_env_options_and_settings_before_the_interpreter(opts: list[str], interp) -> None:
    """shebang.rb skips env's options and ``VAR=value`` settings in any order (the old code
    read ``#!/usr/bin/env FOO=1 python3``'s interpreter as ``FOO=1``)."""
    name, lang = interp
    head = " ".join(["#!/usr/bin/env", *opts, name])
    assert detect_language("bin/tool", head + "\nx\n") == (lang, "shebang"), head


@settings(max_examples=25, deadline=None)
@given(
    ver=st.from_regex(r"\A[0-9]{1,2}\Z"), prefix=st.sampled_from(["/usr/local/bin", "/opt/x/bin"])
)
def test_versioned_interpreter_path(ver: str, prefix: str) -> None:
    """shebang.rb strips one ``.N`` suffix: ``/usr/local/bin/python3.12`` is python3."""
    text = f"#!{prefix}/python3.{ver}\nprint(1)\n"
    assert detect_language("bin/run", text) == ("Python", "shebang")


if __name__ == "__main__":
    for split in ("tune", "heldout"):
        ok, n, errors = score(split)
        print(split, f"{ok}/{n}")
        print("\n".join(errors))

"""Cheap scans for the PII detector: line prefilters and required-literal gates.

PII is rare in code, so most lines never reach the expensive patterns: substring and
literal-prefix searches (C speed in ``re`` and ``str``) pick the lines worth a full match,
and each detect-secrets regex is gated on a literal every match must contain.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# Cheap scans that find the lines worth the full patterns (PII is rare in code: most
# lines never reach the expensive regexes; measured 5x faster on site-packages).
# Keywords that must appear on a line for the secret / name patterns to be tried there.
SECRET_WORDS = ("pass", "pwd", "pw", "token", "secret", "key", "cred", "auth", "sig=", "salt",
                "bearer", "login", "logon", "signin", "sign_in", "connect", "bind",
                "identified", "pdo", "://", "@tcp(", "@unix(", " -p", " -a", " -w",
                "curl", "-u", "psk", "/rp ", "/user:", "jwt.", "hmac", "fernet(", "| sudo",
                "|sudo", "chpasswd", "--stdin", "smbpasswd", "send ")  # fmt: skip
NAME_WORDS = ("author", "maintainer", "written by", "created by", "signed-off-by")
# Each hint starts with a literal or a character class so that ``re`` skips ahead in C to
# the next candidate position (its prefix/charset search); the equivalent forms that open
# with ``\d{3}`` or a lookbehind try a match at every position (measured 5-9x slower).
# Lines only matter, so a hint may match a character later than the pattern it guards.
_AT = re.compile("@")
HINT_IPV4 = re.compile(r"\.(?<=\d\.)\d{1,3}\.\d{1,3}\.\d")  # d.d.d.d
HINT_IPV6 = re.compile(r":(?<=[0-9A-Fa-f]:)[0-9A-Fa-f]{0,4}:")  # h:h:
# Necessary for CARD (groups open with 4+4 digits, or 13+ unseparated) and PHONE (``+d``,
# or ``ddd[-. ]dddd`` in both of its national forms).
HINT_DIGITS = re.compile(r"[\d+](?:(?<=\+)\d|(?<=\d)\d\d(?:\d[ -]?\d{4}|[-. ]\d{4}))")


def _word_lines(text: str, words: tuple[str, ...], lowered: str | None) -> list[tuple[int, int]]:
    """Line spans containing any of ``words`` (case-insensitive), found with ``str.find``.

    Case-insensitive regex alternations are slow in ``re``; when ``text.lower()`` keeps
    offsets (nearly always), plain substring search on it finds the lines.
    """
    if lowered is None:  # non-ASCII: lower() may move offsets; fall back to a regex
        rx = re.compile("|".join(map(re.escape, words)), re.I)
        return _lines(text, rx)
    starts: set[int] = set()
    for w in words:
        i = lowered.find(w)
        while i >= 0:
            ls = lowered.rfind("\n", 0, i) + 1
            starts.add(ls)
            e = lowered.find("\n", i)
            if e < 0:
                break
            i = lowered.find(w, e)
    spans = []
    for ls in sorted(starts):
        e = text.find("\n", ls)
        spans.append((ls, len(text) if e < 0 else e))
    return spans


def _lines(text: str, hint: re.Pattern[str]) -> list[tuple[int, int]]:
    """(start, end) of each line that contains a match of ``hint``, in order, unique.

    After a hit the search resumes at the end of its line, so a line costs one Python
    iteration however many hits it holds.
    """
    spans: list[tuple[int, int]] = []
    search = hint.search
    find = text.find
    m = search(text)
    while m is not None:
        s = text.rfind("\n", 0, m.start()) + 1
        e = find("\n", m.end())
        if e < 0:
            spans.append((s, len(text)))
            break
        spans.append((s, e))
        m = search(text, e)
    return spans


def _scan(pattern: re.Pattern[str], text: str, spans: list[tuple[int, int]]):
    for s, e in spans:
        yield from pattern.finditer(text, s, e)


@dataclass(frozen=True, slots=True)
class KeyPattern:
    """A detect-secrets key regex and the cheap test a text must pass before it runs.

    ``literals``: strings of which every match contains one (``None``: no usable literal);
    ``folded``: compare them case-insensitively; ``gate``: for patterns whose literals are
    too short to gate on, the pattern's tail from its best literal on, which ``re``
    searches with its fast literal-prefix scan.
    """

    pattern: re.Pattern[str]
    literals: frozenset[str] | None = None
    folded: bool = False
    gate: re.Pattern[str] | None = None

    def may_match(self, text: str, folded: str) -> bool:
        """False only when the pattern cannot match ``text`` (a necessary condition)."""
        if self.literals is not None:
            hay = folded if self.folded else text
            if not any(lit in hay for lit in self.literals):
                return False
        return self.gate is None or self.gate.search(text) is not None


# Required literals of a regex, read from its parse tree, gate the detect-secrets
# patterns: a pattern scans a text only when one of its literals occurs there (str ``in``,
# a C substring search), the "required factor" prefilter of RE2 and Hyperscan (Python's
# ``re`` skips ahead only for a literal *prefix*; measured: the 26 whole-text scans were
# the largest PII cost). A pattern the parser cannot analyse runs ungated.
_MIN_LITERAL = 3
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def _best(factors: list[tuple[int, frozenset[str]]]) -> tuple[int, frozenset[str]] | None:
    return max(factors, key=lambda f: min(map(len, f[1])), default=None)


def _factors(items: list) -> list[tuple[int, frozenset[str]]]:
    """(index, alternatives) of each required literal factor of a parsed sequence."""
    out: list[tuple[int, frozenset[str]]] = []
    run: list[str] = []
    start = 0
    for i, (op, av) in enumerate(items):
        if str(op) == "LITERAL":
            if not run:
                start = i
            run.append(chr(av))
            continue
        if run:
            out.append((start, frozenset({"".join(run)})))
            run = []
        sub = _node_literals(str(op), av)
        if sub:
            out.append((i, sub))
    if run:
        out.append((start, frozenset({"".join(run)})))
    return out


def _node_literals(op: str, av: object) -> frozenset[str] | None:
    """Literal alternatives one of which every match of this parse node contains."""
    if op == "SUBPATTERN" and not av[1] and not av[2]:  # type: ignore[index]
        best = _best(_factors(av[3]))  # type: ignore[index]
    elif op == "ATOMIC_GROUP":
        best = _best(_factors(av))  # type: ignore[arg-type]
    elif op in _REPEATS and av[0] >= 1:  # type: ignore[index]
        best = _best(_factors(av[2]))  # type: ignore[index]
    elif op == "BRANCH":
        alts = [_best(_factors(a)) for a in av[1]]  # type: ignore[index]
        return None if any(a is None for a in alts) else frozenset().union(*(a[1] for a in alts))  # type: ignore[index]
    else:
        return None
    return best[1] if best else None


def _ops(items: list) -> set[str]:
    """Every opcode name in a parsed sequence, nested ones included."""
    names: set[str] = set()
    stack = [items]
    while stack:
        for op, av in stack.pop():
            names.add(str(op))
            for x in av if isinstance(av, (tuple, list)) else ():
                if isinstance(x, list) and x and isinstance(x[0], tuple):
                    stack.append(x)
                elif hasattr(x, "data"):
                    stack.append(x.data)
                elif isinstance(x, list):
                    stack.extend(a.data if hasattr(a, "data") else a for a in x)
    return names


def analyse_key_pattern(pattern: re.Pattern[str]) -> KeyPattern:
    """Derive the cheap gate of one key regex (see :class:`KeyPattern`)."""
    try:
        from re import _compiler as sre_compile  # private, but stable in 3.11-3.13
        from re import _parser as sre_parse

        parsed = sre_parse.parse(pattern.pattern, pattern.flags)
        best = _best(_factors(list(parsed.data)))
        if best is None:
            return KeyPattern(pattern)
        index, literals = best
        folded = bool(parsed.state.flags & re.IGNORECASE)
        if folded:
            literals = frozenset(lit.casefold() for lit in literals)
        gate = None
        if (
            min(map(len, literals)) < _MIN_LITERAL
            and index > 0
            and str(parsed.data[index][0]) == "LITERAL"
            and not _ops(list(parsed.data)) & {"GROUPREF", "GROUPREF_EXISTS"}
        ):
            tail = sre_parse.SubPattern(parsed.state, list(parsed.data[index:]))
            gate = sre_compile.compile(tail, pattern.flags)
            literals = None  # the gate regex is the stronger test
        return KeyPattern(pattern, literals, folded, gate)
    except Exception:  # an unknown regex form is simply not gated
        return KeyPattern(pattern)


@functools.cache
def _known_key_patterns() -> list[KeyPattern]:
    """Regexes of detect-secrets plugins for specific key formats, with their gates.

    Plugins whose formats ``data.secrets.PROVIDER_PATTERNS`` already covers (GitHub, JWT,
    npm, OpenAI, PyPI, SendGrid, Stripe, Twilio) are left out: each pattern costs a
    literal test over every file.
    """
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    wanted = {
        "AWSKeyDetector",
        "AzureStorageKeyDetector",
        "DiscordBotTokenDetector",
        "GitLabTokenDetector",
        "MailchimpDetector",
        "SlackDetector",
        "SquareOAuthDetector",
        "TelegramBotTokenDetector",
    }
    pats = []
    for cls in get_mapping_from_secret_type_to_class().values():
        if cls.__name__ in wanted:
            pats.extend(getattr(cls, "denylist", ()))
    return [analyse_key_pattern(p) for p in sorted(pats, key=lambda p: p.pattern)]


def _fold(text: str) -> str:
    """Case-folded text for gating ``re.IGNORECASE`` literals (a superset test).

    ``re`` also matches dotless/dotted i against ``i``: map them so the test stays
    necessary (extra acceptances only cost a scan).
    """
    folded = text.casefold()
    if not folded.isascii():
        folded = folded.replace("\u0131", "i").replace("\u0307", "")
    return folded

"""PII redaction: emails, IP addresses, keys and secrets, passwords, credit cards, phones.

Known key formats come from ``detect-secrets``' plugins (their maintained regexes);
generic secrets are quoted values assigned to key-like names that pass detect-secrets'
Shannon-entropy check. Every value is replaced consistently within a file (``<EMAIL>``,
``<KEY>``, ``<PASSWORD>``, ``<NAME>``, ``<CREDIT_CARD>``, ``<PHONE>``; IP addresses by a
synthetic private address of the same family) and logged by type, position and a hash
of the value, never the value itself.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from dataclasses import dataclass

from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

from data.config import PIIConfig
from data.records import FileRecord, StageStats
from data.step import Step

# Public DNS resolvers are not personal data (BigCode's PII pipeline kept them too).
PUBLIC_DNS = frozenset({
    "8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "9.9.9.9", "149.112.112.112",
    "208.67.222.222", "208.67.220.220", "64.6.64.6", "64.6.65.6", "4.2.2.1", "4.2.2.2",
    "2001:4860:4860::8888", "2001:4860:4860::8844", "2606:4700:4700::1111",
    "2606:4700:4700::1001", "2620:fe::fe", "2620:fe::9",
})
PLACEHOLDER_DOMAINS = ("example.com", "example.org", "example.net", "localhost", "domain.com",
                       "email.com", "yourdomain.com", "company.com")
PLACEHOLDER_SUFFIXES = (".example", ".test", ".invalid", ".localhost", ".local",
                        ".example.com", ".example.org", ".example.net", ".noreply.github.com")
NON_TLDS = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "js", "css", "py", "ts", "json",
                      "html", "md", "txt", "yml", "yaml", "xml", "ico", "pdf", "so", "h", "c"})
SERVICE_LOCALS = frozenset({"git", "noreply", "no-reply", "donotreply", "do-not-reply"})

REPLACEMENT = {"email": "<EMAIL>", "key": "<KEY>", "password": "<PASSWORD>", "name": "<NAME>",
               "credit_card": "<CREDIT_CARD>", "phone": "<PHONE>"}
# When findings overlap, the more specific kind wins.
PRIORITY = {"key": 0, "password": 1, "email": 2, "ip": 3, "credit_card": 4, "phone": 5, "name": 6}

EMAIL = re.compile(
    r"(?<![\w.+%-])([A-Za-z0-9][A-Za-z0-9._%+-]{0,63})@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?\.)+([A-Za-z]{2,24}))(?![\w-]|\.[A-Za-z0-9])")
IPV4 = re.compile(r"(?<![\w.-])((?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
                  r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))(?![\w-]|\.\d)")
V6_TAIL = re.compile(r"(?:^|[^\w])[0-9A-Fa-f]{0,4}:$")
IPV6 = re.compile(r"(?<![\w:.])((?:[0-9A-Fa-f]{1,4}:){1,7}:?(?:[0-9A-Fa-f]{1,4}|:)?"
                  r"(?::[0-9A-Fa-f]{1,4}){0,6}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?)(?![\w:.])")
# Words before a dotted quad that make it a version, a document section or an OID. A
# keyword may carry a suffix after ``_``/``-`` (``version_info``) but not letters (so
# ``Value``, ``vpc`` and ``reverse`` do not count as ``v``, ``ver``, ``rev``).
VERSION_CONTEXT = re.compile(
    r"(?i)(?:(?<![a-z])(?:version|ver|release|rel|rev|build|v|python|tag|section|sec|"
    r"chapter|rfc\s*\d+|oid|objectidentifier|othername\.\d+)s?(?:[_-][\w-]*)?[\"']?>?"
    r"(?:\s*[:=(]|\s+§?)?|§|==|>=|<=|~=|!=|\^|~)\s*[\"'(\[]?v?$")
# Words on a line that make a dotted quad an address (needed when every octet is a single
# digit, the shape of most version and section numbers: 1.2.3.4, 3.1.1.6).
ADDRESS_CONTEXT = re.compile(
    r"(?i)ip|addr|host|inet|sock|cidr|server|client|peer|remote|connect|bind|proxy|dns|"
    r"gateway|subnet|route|firewall|://|/\d{1,2}\b|\(\s*b?[\"'][\d.]+[\"']\s*,\s*\d")
# An IPv6-looking run of 2-digit hex groups is a byte string (fingerprint, serial, MAC).
HEX_BYTES = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5,}")
# Local parts that are generated identifiers (Message-IDs, UUIDs), not mailboxes.
ID_LOCAL = re.compile(r"[0-9A-Fa-f.-]{12,}")
MESSAGE_ID_LINE = re.compile(r"(?i)(?:message|content)-id\s*:|in-reply-to\s*:|references\s*:")
PACKAGE_AT = re.compile(r"(?i)\b(?:npm|yarn|pnpm|bun|install|add|uses:)\b[^\n]*[\w/-]@$")
CARD = re.compile(r"(?<![\d.-])((?:\d[ -]?){12,18}\d)(?![\d-]|\.\d)")
PHONE = re.compile(
    r"(?<![\w+.\-/])(\+\d{1,3}[ .-]?(?:\(\d{1,4}\)|\d{1,4})(?:[ .-]\d{2,5}){2,4}|"
    r"(?:\(\d{3}\)[ ]?|\d{3}[-. ])\d{3}[-. ]\d{4})(?![\w\-/]|\.\d)")
SECRET_NAME = (r"(?:api[_-]?key|apikey|secret(?:[_-]?key)?|access[_-]?key(?:[_-]?id)?|"
               r"private[_-]?key|auth[_-]?token|access[_-]?token|refresh[_-]?token|"
               r"bearer[_-]?token|token|client[_-]?secret|signing[_-]?key|encryption[_-]?key|"
               r"app[_-]?key|app[_-]?secret|consumer[_-]?(?:key|secret)|credentials?)")
ASSIGN = r"[\"']?\]?\s*(?:=|:|==|:=|=>|\?\?=)\s*(?:[bru]|new String\(|os\.getenv\([^)]*,\s*)?"
KEY_ASSIGN = re.compile(
    r"(?i)\b\w*?" + SECRET_NAME + r"\w*" + ASSIGN + r"([\"'`])([^\"'`\s]{12,256})\1")
PASSWORD_ASSIGN = re.compile(
    r"(?i)(?:\b\w*?(?:password|passwd|passphrase|_pass|_pwd)\w*|\bpwd|\bpass)" + ASSIGN +
    r"([\"'`])([^\"'`\n]{3,128})\1")
PASSWORD_ENV = re.compile(r"(?m)^\s*(?:export\s+|set\s+)?[A-Z_]*"
                          r"(?:PASSWORD|PASSWD|PASSPHRASE|_PASS)"
                          r"[A-Z_]*\s*[=:]\s*([^\s\"'$;()]{3,128})\s*$")
BASIC_AUTH = re.compile(r"://[^:/?#\[\]@\s]+:([^/@\s]{3,})@[\w.-]")
BEARER = re.compile(r"\bBearer\s+([A-Za-z0-9._~+/=-]{16,})")
PRIVATE_KEY_BLOCK = re.compile(
    r"-----BEGIN ((?:RSA |DSA |EC |OPENSSH |PGP |ENCRYPTED )?PRIVATE KEY(?: BLOCK)?)-----"
    r"[\s\S]*?-----END \1-----")
NAME_CONTEXT = re.compile(
    r"(?m)(?:^[ \t]*(?:#|//|\*|;|--|\.\.)?[ \t]*@?"
    r"(?i:author|maintainer|written by|created by|signed-off-by)"
    r"[ \t]*[:=]?[ \t]*[\"']?|__author__\s*=\s*[\"'])"
    r"([A-Z][a-z]+(?:[ -](?:[A-Z]\.|[A-Z][a-z']+)){1,3})")
PLACEHOLDER = re.compile(
    r"(?i)your|example|dummy|placeholder|change.?me|xxxx|\*\*\*|sample|fake|insert|replace|"
    r"redacted|todo|xmpl|<|>|\$\{|\{\{|%\(|%s|\.\.\.|^(?:none|null|nil|true|false|undefined|"
    r"password|passwd|secret|test|pass|admin|root|guest|default|empty|required|string|"
    r"\w+_?(?:password|token|key|secret))$")
TOKEN_TAIL = re.compile(r"[A-Za-z0-9_\-+/=.]+")
PAGINATION_NAME = re.compile(r"(?i)next|page|pagination|continuation|cursor|marker|sync_?token")
# Lockfile and VCS contexts: hex/base64 blobs there are digests, not secrets.
DIGEST_CONTEXT = re.compile(r"(?i)(?:sha\d*|md5|hash|digest|checksum|integrity|commit|rev|"
                            r"revision|etag|nonce|uuid|guid|fingerprint)\w*[\"']?\s*[:=]")


# Cheap scans that find the lines worth the full patterns (PII is rare in code: most
# lines never reach the expensive regexes; measured 5x faster on site-packages).
# Keywords that must appear on a line for the secret / name patterns to be tried there.
SECRET_WORDS = ("key", "secret", "token", "credential", "passw", "passphrase", "pwd", "pass",
                "bearer", "://")
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
        return None if any(a is None for a in alts) else frozenset().union(
            *(a[1] for a in alts))  # type: ignore[index]
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
        if (min(map(len, literals)) < _MIN_LITERAL and index > 0
                and str(parsed.data[index][0]) == "LITERAL"
                and not _ops(list(parsed.data)) & {"GROUPREF", "GROUPREF_EXISTS"}):
            tail = sre_parse.SubPattern(parsed.state, list(parsed.data[index:]))
            gate = sre_compile.compile(tail, pattern.flags)
            literals = None  # the gate regex is the stronger test
        return KeyPattern(pattern, literals, folded, gate)
    except Exception:  # an unknown regex form is simply not gated
        return KeyPattern(pattern)


@functools.cache
def _known_key_patterns() -> list[KeyPattern]:
    """Regexes of detect-secrets plugins for specific key formats, with their gates."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    wanted = {"AWSKeyDetector", "AzureStorageKeyDetector", "DiscordBotTokenDetector",
              "GitHubTokenDetector", "GitLabTokenDetector", "JwtTokenDetector",
              "MailchimpDetector", "NpmDetector", "OpenAIDetector", "PypiTokenDetector",
              "SendGridDetector", "SlackDetector", "SquareOAuthDetector", "StripeDetector",
              "TelegramBotTokenDetector", "TwilioKeyDetector"}
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




_ENTROPY = Base64HighEntropyString()


def shannon_entropy(value: str) -> float:
    """detect-secrets' Shannon entropy in bits per character."""
    return float(_ENTROPY.calculate_shannon_entropy(value))


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum used by payment card numbers."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_prefix_ok(d: str) -> bool:
    n2, n4 = int(d[:2]), int(d[:4])
    return (d[0] == "4" and len(d) in (13, 16, 19)) or (51 <= n2 <= 55 and len(d) == 16) or (
        2221 <= n4 <= 2720 and len(d) == 16) or (n2 in (34, 37) and len(d) == 15) or (
        (d.startswith("6011") or d.startswith("65") or 644 <= int(d[:3]) <= 649)
        and len(d) in (16, 19)) or (3528 <= n4 <= 3589 and len(d) in (16, 19)) or (
        n2 in (36, 38, 39) and len(d) == 14) or (n2 == 62 and 16 <= len(d) <= 19)


@dataclass(frozen=True, slots=True)
class Finding:
    """One detected value: kind, span in the text, and the value itself (never logged)."""

    kind: str
    start: int
    end: int
    value: str


class PIIDetector:
    """Find and redact PII in text."""

    def __init__(self, config: PIIConfig | None = None) -> None:
        self.config = config or PIIConfig()
        self.types = set(self.config.types)

    # -- detection -------------------------------------------------------------------
    def find(self, text: str) -> list[Finding]:
        """All non-overlapping findings, in text order."""
        found: list[Finding] = []
        low = text.lower()
        # lower() only ever lengthens a string (e.g. "İ"); equal length = same offsets.
        self._low: str | None = low if len(low) == len(text) else None
        t = self.types
        secret_spans = (_word_lines(text, SECRET_WORDS, self._low)
                        if t & {"key", "password"} else [])
        if "key" in t:
            found += self._keys(text, secret_spans)
        if "password" in t:
            found += self._passwords(text, secret_spans)
        if "email" in t and "@" in text:
            found += self._emails(text)
        if "ip" in t:
            found += self._ips(text)
        if t & {"credit_card", "phone"}:
            digit_spans = _lines(text, HINT_DIGITS)
            if "credit_card" in t:
                found += self._cards(text, digit_spans)
            if "phone" in t:
                found += self._phones(text, digit_spans)
        if "name" in t:
            found += [Finding("name", m.start(1), m.end(1), m.group(1))
                      for m in _scan(NAME_CONTEXT, text, _word_lines(text, NAME_WORDS, self._low))]
        found.sort(key=lambda f: (PRIORITY[f.kind], f.start, -f.end))
        taken: list[Finding] = []
        for f in found:
            if all(f.end <= g.start or f.start >= g.end for g in taken):
                taken.append(f)
        taken.sort(key=lambda f: f.start)
        return taken

    def _keys(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        out = []
        if "-----BEGIN " in text:
            out += [Finding("key", m.start(), m.end(), m.group(0))
                    for m in PRIVATE_KEY_BLOCK.finditer(text)]
        folded: str | None = None
        for kp in _known_key_patterns():
            if kp.folded and folded is None:
                folded = _fold(text)
            if not kp.may_match(text, folded or ""):
                continue
            for m in kp.pattern.finditer(text):
                # Some plugins capture the secret (AWS secret keys), others a prefix only
                # (GitHub's "(ghp|gho|...)"): use a group only when it is the secret.
                g = m.lastindex or 0
                whole = g == 0 or m.end(g) - m.start(g) < 16
                s, e = (m.start(), m.end()) if whole else (m.start(g), m.end(g))
                value = text[s:e].strip()
                if len(value) >= 16 and not PLACEHOLDER.search(value):
                    s = text.index(value, s)
                    # Some plugin regexes end lazily (JWT's signature part): the secret
                    # runs on to the end of its token.
                    tail = TOKEN_TAIL.match(text, s + len(value))
                    e = tail.end() if tail else s + len(value)
                    out.append(Finding("key", s, e, text[s:e]))
        for m in _scan(BEARER, text, spans):
            if self._secret_like(m.group(1)):
                out.append(Finding("key", m.start(1), m.end(1), m.group(1)))
        for m in _scan(KEY_ASSIGN, text, spans):
            value = m.group(2)
            if PAGINATION_NAME.search(text, m.start(), m.start(1)):
                continue  # NextToken, page_token, cursor: opaque paging state, not secrets
            if self._secret_like(value) and not DIGEST_CONTEXT.search(
                    text[max(0, m.start() - 5):m.start(2)]):
                out.append(Finding("key", m.start(2), m.end(2), value))
        return out

    def _secret_like(self, value: str) -> bool:
        if PLACEHOLDER.search(value) or "/" in value.strip("/")[:1] or value.startswith("http"):
            return False
        if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
            return False
        if re.fullmatch(r"[\w.-]+\.(?:py|js|json|txt|pem|key|crt|yaml|yml)", value):
            return False
        hexlike = re.fullmatch(r"[0-9a-fA-F]+", value) is not None
        if hexlike and len(value) < 32:
            return False  # under 128 bits of hex: ids, short hashes (secrets are longer)
        limit = self.config.entropy_hex if hexlike else self.config.entropy_base64
        # Short strings cannot reach a high entropy: cap the bar at 85% of log2(length).
        import math

        limit = min(limit, 0.85 * math.log2(len(value)))
        return shannon_entropy(value) >= limit

    def _passwords(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        out = []
        for m in _scan(PASSWORD_ASSIGN, text, spans):
            v = m.group(2)
            if not PLACEHOLDER.search(v) and not v.isspace() and len(set(v)) > 2:
                out.append(Finding("password", m.start(2), m.end(2), v))
        for m in _scan(PASSWORD_ENV, text, spans):
            v = m.group(1)
            if not PLACEHOLDER.search(v) and len(set(v)) > 2:
                out.append(Finding("password", m.start(1), m.end(1), v))
        for m in _scan(BASIC_AUTH, text, spans):
            v = m.group(1)
            if not PLACEHOLDER.search(v):
                out.append(Finding("password", m.start(1), m.end(1), v))
        return out

    def _emails(self, text: str) -> list[Finding]:
        out = []
        for m in _scan(EMAIL, text, _lines(text, _AT)):
            local, domain, tld = m.group(1), m.group(2).lower(), m.group(3).lower()
            if tld in NON_TLDS or local.lower() in SERVICE_LOCALS:
                continue
            if domain in PLACEHOLDER_DOMAINS or domain.endswith(PLACEHOLDER_SUFFIXES):
                continue
            if "example" in local.lower():  # documentation addresses (exampleUser@...)
                continue
            if (ID_LOCAL.fullmatch(local) and sum(c.isdigit() for c in local) >= 6) or (
                    MESSAGE_ID_LINE.search(text, text.rfind("\n", 0, m.start()) + 1,
                                           m.start())):
                continue  # a Message-ID / Content-ID / UUID-like identifier
            out.append(Finding("email", m.start(), m.end(), m.group(0)))
        return out

    def _ips(self, text: str) -> list[Finding]:
        out = []
        if True:
            for m in _scan(IPV4, text, _lines(text, HINT_IPV4)):
                value = m.group(1)
                before = text[max(0, m.start() - 24):m.start()]
                if before.endswith("/") and not before.endswith("//"):
                    continue  # a user-agent or path segment like Chrome/120.0.6099.109
                if before.endswith(":") and V6_TAIL.search(before):
                    continue  # the IPv4 tail of an IPv6 address (::ffff:1.2.3.4)
                if text.startswith(".", m.end()) and text[m.end() + 1:m.end() + 2].isalnum():
                    continue  # part of a longer dotted token: 11.2.0.4.v3
                if VERSION_CONTEXT.search(before) or PACKAGE_AT.search(before):
                    continue
                if max(map(len, value.split("."))) == 1:
                    ls = text.rfind("\n", 0, m.start()) + 1
                    le = text.find("\n", m.end())
                    if not ADDRESS_CONTEXT.search(text, ls, len(text) if le < 0 else le):
                        continue  # 1.2.3.4-shaped without address words: a version
                if self._public(value):
                    out.append(Finding("ip", m.start(1), m.end(1), value))
        if True:
            for m in _scan(IPV6, text, _lines(text, HINT_IPV6)):
                value = m.group(1)
                groups = [g for g in value.split(":") if g]
                if value.count(":") < 2 or len(groups) < 2 or HEX_BYTES.fullmatch(value):
                    continue
                # Two groups only with "::" and a full 4-digit group (2001:db8::, dead:beef::);
                # "a:b::c" and C++ scopes stay out.
                if len(groups) == 2 and not ("::" in value and any(len(g) == 4 for g in groups)):
                    continue
                if not any(c.isdigit() for c in value) and not any(len(g) == 4 for g in groups):
                    continue
                if len(groups) == 2 or not any(c.isdigit() for c in value):
                    # Hex-speak (dead::beef) unless the line is about addresses.
                    ls = text.rfind("\n", 0, m.start()) + 1
                    le = text.find("\n", m.end())
                    if not ADDRESS_CONTEXT.search(text, ls, len(text) if le < 0 else le):
                        continue
                if self._public(value):
                    out.append(Finding("ip", m.start(1), m.end(1), value))
        return out

    @staticmethod
    def _public(value: str) -> bool:
        try:
            ip = ipaddress.ip_address(value)
        except ValueError:
            return False
        if str(ip) in PUBLIC_DNS or value in PUBLIC_DNS:
            return False
        return ip.is_global and not ip.is_multicast

    def _cards(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        out = []
        for m in _scan(CARD, text, spans):
            raw = m.group(1)
            digits = raw.replace(" ", "").replace("-", "")
            if not 13 <= len(digits) <= 19:
                continue
            seps = {c for c in raw if not c.isdigit()}
            if len(seps) > 1:
                continue
            if seps:
                groups = [len(g) for g in re.split(r"[ -]", raw)]
                if groups not in ([4, 4, 4, 4], [4, 6, 5], [4, 6, 4], [4, 4, 4, 4, 3],
                                  [4, 4, 4, 1], [4, 4, 4, 2], [4, 4, 4, 3]):
                    continue
            if _card_prefix_ok(digits) and luhn_ok(digits):
                out.append(Finding("credit_card", m.start(1), m.end(1), raw))
        return out

    def _phones(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        out = []
        for m in _scan(PHONE, text, spans):
            v = m.group(1)
            digits = sum(c.isdigit() for c in v)
            if v.startswith("+"):
                if not 8 <= digits <= 15:
                    continue
            elif digits != 10:
                continue
            out.append(Finding("phone", m.start(1), m.end(1), v))
        return out

    # -- redaction -------------------------------------------------------------------
    def redact(self, text: str) -> tuple[str, list[dict[str, object]]]:
        """Return the redacted text and its log (kind, span, value hash; never the value)."""
        findings = self.find(text)
        if not findings:
            return text, []
        mapping: dict[tuple[str, str], str] = {}
        used: set[str] = set()
        parts: list[str] = []
        log: list[dict[str, object]] = []
        pos = 0
        for f in findings:
            key = (f.kind, f.value)
            if key not in mapping:
                mapping[key] = (_synthetic_ip(f.value, used) if f.kind == "ip"
                                else REPLACEMENT[f.kind])
            parts.append(text[pos:f.start])
            parts.append(mapping[key])
            pos = f.end
            log.append({"type": f.kind, "start": f.start, "end": f.end,
                        "sha256": hashlib.sha256(f.value.encode()).hexdigest()[:16]})
        parts.append(text[pos:])
        return "".join(parts), log


def _synthetic_ip(value: str, used: set[str]) -> str:
    """A private address of the same family, stable for a value and distinct within a file."""
    h = hashlib.sha256(value.encode()).digest()
    for i in range(0, 30, 2):
        if ":" in value:
            cand = f"fd00:{h[i] << 8 | h[i + 1]:x}:{h[i + 2]:x}::{h[i + 3] + 1:x}"
        else:
            cand = f"10.{h[i]}.{h[i + 1]}.{(h[i + 2] % 254) + 1}"
        if cand not in used:
            used.add(cand)
            return cand
    raise RuntimeError("could not find an unused synthetic address")  # pragma: no cover


class PIIStep(Step):
    """Redact PII in place; counts per kind go into the statistics and the record."""

    name = "pii"

    def __init__(self, config: PIIConfig) -> None:
        self.config = config
        self.detector = PIIDetector(config)

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        if not self.config.enabled:
            return None
        redacted, log = self.detector.redact(record.content)
        if log:
            record.content = redacted
            record.redactions = log
            for entry in log:
                k = str(entry["type"])
                record.pii_counts[k] = record.pii_counts.get(k, 0) + 1
                stats.count(f"redacted:{k}")
        return None


def evaluate(cases: list[dict], detector: PIIDetector | None = None,
             kinds: frozenset[str] | None = None) -> dict[str, dict[str, float]]:
    """Per-type precision and recall on labelled cases ``{"text", "pii": [{type, value}]}``.

    A detection is a true positive when its (type, value) is labelled in that case.
    ``kinds``: score only these types (a set labelled for some kinds only); the detector
    still runs with all its types, so overlaps resolve as in production.
    """
    detector = detector or PIIDetector()
    counts: dict[str, list[int]] = {}
    errors: list[dict] = []
    for case in cases:
        expected = [(p["type"], p["value"]) for p in case["pii"]
                    if kinds is None or p["type"] in kinds]
        got = [(f.kind, f.value) for f in detector.find(case["text"])
               if kinds is None or f.kind in kinds]
        remaining = list(expected)
        for g in got:
            c = counts.setdefault(g[0], [0, 0, 0])
            if g in remaining:
                remaining.remove(g)
                c[0] += 1
            else:
                c[1] += 1
                errors.append({"fp": g, "text": case["text"][:120]})
        for r in remaining:
            counts.setdefault(r[0], [0, 0, 0])[2] += 1
            errors.append({"fn": r, "text": case["text"][:120]})
    report: dict[str, dict[str, float]] = {}
    for kind, (tp, fp, fn) in sorted(counts.items()):
        report[kind] = {"tp": tp, "fp": fp, "fn": fn,
                        "precision": tp / (tp + fp) if tp + fp else 1.0,
                        "recall": tp / (tp + fn) if tp + fn else 1.0}
    report["_errors"] = errors  # type: ignore[assignment]
    return report

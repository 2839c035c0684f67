"""PII redaction: emails, IP addresses, keys and secrets, passwords, credit cards, phones.

Keys and passwords come from the rule families of :mod:`data.secrets` (provider formats,
keyed values in any syntax, flags, headers, DSNs, login calls) plus detect-secrets'
plugin regexes. Phone numbers are off by default (StarCoder2 did not redact them; in
code they are mostly tables of constants). Every value is replaced consistently within
a file (``<EMAIL>``,
``<KEY>``, ``<PASSWORD>``, ``<NAME>``, ``<CREDIT_CARD>``, ``<PHONE>``; IP addresses by a
synthetic private address of the same family) and logged by type, position and a hash
of the value, never the value itself.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass

from data.config import PIIConfig
from data.pii_scan import (
    _AT,
    HINT_DIGITS,
    HINT_IPV4,
    HINT_IPV6,
    NAME_WORDS,
    SECRET_WORDS,
    KeyPattern,
    _fold,
    _known_key_patterns,
    _lines,
    _scan,
    _word_lines,
    analyse_key_pattern,
)
from data.records import FileRecord, StageStats
from data.secrets import (
    PROVIDER_PATTERNS,
    find_secrets,
    provider_value_ok,
    shannon_entropy,
    twilio_auth_tokens,
)
from data.step import Step

__all__ = [
    "Finding",
    "KeyPattern",
    "PIIDetector",
    "PIIStep",
    "analyse_key_pattern",
    "evaluate",
    "luhn_ok",
    "redact_text",
    "shannon_entropy",
]

# Public DNS resolvers are not personal data (BigCode's PII pipeline kept them too).
PUBLIC_DNS = frozenset(
    {
        "8.8.8.8",
        "8.8.4.4",
        "1.1.1.1",
        "1.0.0.1",
        "9.9.9.9",
        "149.112.112.112",
        "208.67.222.222",
        "208.67.220.220",
        "64.6.64.6",
        "64.6.65.6",
        "4.2.2.1",
        "4.2.2.2",
        "2001:4860:4860::8888",
        "2001:4860:4860::8844",
        "2606:4700:4700::1111",
        "2606:4700:4700::1001",
        "2620:fe::fe",
        "2620:fe::9",
    }
)
PLACEHOLDER_DOMAINS = (
    "example.com",
    "example.org",
    "example.net",
    "localhost",
    "domain.com",
    "email.com",
    "yourdomain.com",
    "company.com",
)
PLACEHOLDER_SUFFIXES = (
    ".example",
    ".test",
    ".invalid",
    ".localhost",
    ".local",
    ".example.com",
    ".example.org",
    ".example.net",
    ".noreply.github.com",
)
NON_TLDS = frozenset(
    {
        "png",
        "jpg",
        "jpeg",
        "gif",
        "svg",
        "webp",
        "js",
        "css",
        "py",
        "ts",
        "json",
        "html",
        "md",
        "txt",
        "yml",
        "yaml",
        "xml",
        "ico",
        "pdf",
        "so",
        "h",
        "c",
    }
)
SERVICE_LOCALS = frozenset({"git", "noreply", "no-reply", "donotreply", "do-not-reply"})

REPLACEMENT = {
    "email": "<EMAIL>",
    "key": "<KEY>",
    "password": "<PASSWORD>",
    "name": "<NAME>",
    "credit_card": "<CREDIT_CARD>",
    "phone": "<PHONE>",
}
# When findings overlap, the more specific kind wins.
PRIORITY = {"key": 0, "password": 1, "email": 2, "ip": 3, "credit_card": 4, "phone": 5, "name": 6}

EMAIL = re.compile(
    r"(?<![\w.+%-])([A-Za-z0-9][A-Za-z0-9._%+-]{0,63})@((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}"
    r"[A-Za-z0-9])?\.)+([A-Za-z]{2,24}))(?![\w-]|\.[A-Za-z0-9])"
)
IPV4 = re.compile(
    r"(?<![\w.-])((?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
    r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))(?![\w-]|\.\d)"
)
V6_TAIL = re.compile(r"(?:^|[^\w])[0-9A-Fa-f]{0,4}:$")
IPV6 = re.compile(
    r"(?<![\w:.])((?:[0-9A-Fa-f]{1,4}:){1,7}:?(?:[0-9A-Fa-f]{1,4}|:)?"
    r"(?::[0-9A-Fa-f]{1,4}){0,6}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?)(?![\w:.])"
)
# Words before a dotted quad that make it a version, a document section or an OID. A
# keyword may carry a suffix after ``_``/``-`` (``version_info``) but not letters (so
# ``Value``, ``vpc`` and ``reverse`` do not count as ``v``, ``ver``, ``rev``).
VERSION_CONTEXT = re.compile(
    r"(?i)(?:(?<![a-z])(?:version|ver|release|rel|rev|build|v|python|tag|section|sec|"
    r"chapter|rfc\s*\d+|oid|objectidentifier|othername\.\d+)s?(?:[_-][\w-]*)?[\"']?>?"
    r"(?:\s*[:=(]|\s+§?)?|§|==|>=|<=|~=|!=|\^|~)\s*[\"'(\[]?v?$"
)
# Words on a line that make a dotted quad an address (needed when every octet is a single
# digit, the shape of most version and section numbers: 1.2.3.4, 3.1.1.6).
ADDRESS_CONTEXT = re.compile(
    r"(?i)ip|addr|host|inet|sock|cidr|server|client|peer|remote|connect|bind|proxy|dns|"
    r"gateway|subnet|route|firewall|://|/\d{1,2}\b|\(\s*b?[\"'][\d.]+[\"']\s*,\s*\d"
)
# An IPv6-looking run of 2-digit hex groups is a byte string (fingerprint, serial, MAC).
HEX_BYTES = re.compile(r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5,}")
# Local parts that are generated identifiers (Message-IDs, UUIDs), not mailboxes.
ID_LOCAL = re.compile(r"[0-9A-Fa-f.-]{12,}")
MESSAGE_ID_LINE = re.compile(r"(?i)(?:message|content)-id\s*:|in-reply-to\s*:|references\s*:")
PACKAGE_AT = re.compile(r"(?i)\b(?:npm|yarn|pnpm|bun|install|add|uses:)\b[^\n]*[\w/-]@$")
CARD = re.compile(r"(?<![\d.-])((?:\d[ -]?){12,18}\d)(?![\d-]|\.\d)")
PHONE = re.compile(
    r"(?<![\w+.\-/])(\+\d{1,3}[ .-]?(?:\(\d{1,4}\)|\d{1,4})(?:[ .-]\d{2,5}){2,4}|"
    r"(?:\(\d{3}\)[ ]?|\d{3}[-. ])\d{3}[-. ]\d{4})(?![\w\-/]|\.\d)"
)
PRIVATE_KEY_BLOCK = re.compile(
    r"-----BEGIN ((?:RSA |DSA |EC |OPENSSH |PGP |ENCRYPTED )?PRIVATE KEY(?: BLOCK)?)-----"
    r"[\s\S]*?-----END \1-----"
)
# PuTTY's .ppk key file: the private key is the base64 lines after ``Private-Lines: N``
# (encrypted or not, as an encrypted PEM key is still a key); the public lines are not.
PUTTY_PRIVATE = re.compile(r"(?m)^Private-Lines:[ \t]*(\d{1,3})[ \t]*\r?\n")
PUTTY_LINE = re.compile(r"[A-Za-z0-9+/=]{1,128}[ \t]*(?:\r?\n|$)")
NAME_CONTEXT = re.compile(
    r"(?m)(?:^[ \t]*(?:#|//|\*|;|--|\.\.)?[ \t]*@?"
    r"(?i:author|maintainer|written by|created by|signed-off-by)"
    r"[ \t]*[:=]?[ \t]*[\"']?|__author__\s*=\s*[\"'])"
    r"([A-Z][a-z]+(?:[ -](?:[A-Z]\.|[A-Z][a-z']+)){1,3})"
)
TOKEN_TAIL = re.compile(r"[A-Za-z0-9_\-+/=.]+")
# Generic top-level domains seen in mail addresses; any two-letter (country) TLD counts
# too. ``weights@inputs.transpose(...)`` (matrix multiply) and ``deploy@db.internal``
# (ssh targets) end in words that are no such domain.
GENERIC_TLDS = frozenset(
    {
        "com",
        "org",
        "net",
        "edu",
        "gov",
        "mil",
        "int",
        "info",
        "biz",
        "name",
        "pro",
        "aero",
        "coop",
        "museum",
        "mobi",
        "asia",
        "tel",
        "jobs",
        "travel",
        "app",
        "dev",
        "io",
        "ai",
        "co",
        "me",
        "tech",
        "online",
        "site",
        "xyz",
        "cloud",
        "email",
        "systems",
        "software",
        "codes",
        "digital",
        "design",
        "studio",
        "agency",
        "company",
        "solutions",
        "services",
        "consulting",
        "network",
        "works",
        "tools",
        "space",
        "blog",
        "news",
        "media",
        "team",
        "group",
        "club",
        "life",
        "live",
        "world",
        "today",
        "academy",
        "engineering",
        "science",
        "global",
        "center",
        "support",
        "zone",
        "one",
        "page",
        "link",
        "website",
        "host",
        "store",
        "shop",
    }
)
# Dotted quads next to these words are versions, OIDs or sections (any part of the
# nearest preceding identifier: AssemblyFileVersion, firmware, since, release_tag).
VERSION_WORDS = re.compile(
    r"(?i)version|release|firmware|build|since|revision|\brev\b|\bver\b|\bv$|kernel|"
    r"\bchrome|\bfirefox|\bwindows|\bmacos|\bios\b|\bandroid|\bsdk|\btag\b|\bpatch\b"
)
# Commands whose user@host argument is a login on a machine.
REMOTE_TARGET = re.compile(
    r"\b(?:ssh|scp|sftp|rsync|mosh|sshpass|ssh-copy-id|telnet)\b[^\n]*"
    r"(?:\s|-[\w]\s*)$"
)
LOCKFILE = re.compile(
    r"(?:^|/)(?:[\w.-]+\.lock|package-lock\.json|go\.sum|"
    r"pnpm-lock\.yaml|npm-shrinkwrap\.json)$"
)
# PostgreSQL password files: ``host:port:database:user:password`` per line, ``\:`` and
# ``\\`` escaped; the password is everything after the fourth unescaped colon.
PGPASS_FILE = re.compile(r"(?:^|/)(?:\.pgpass|pgpass\.conf)$")
# Rails' encrypted-credentials key files: the whole file is the key (32 hex digits).
RAILS_KEY_FILE = re.compile(r"(?:^|/)config/(?:master|credentials/[\w.-]+)\.key$")
RAILS_KEY = re.compile(r"\A\s*([0-9a-f]{32})\s*\Z")
PGPASS_LINE = re.compile(r"(?m)^(?!#)(?:(?:[^:\\\n]|\\.)*:){4}((?:[^\\\n]|\\.)+)$")
IMAGE_LINE = re.compile(r"(?i)image|\bfrom\b|docker|container|\btag")
OID_LINE = re.compile(r"(?i)\boid|object identifier|::=|\basn|\bsnmp|\bmib\b|arc\b")


def _putty_private(text: str) -> list[Finding]:
    """The private base64 lines of a PuTTY ``.ppk`` key file (as one finding)."""
    m = PUTTY_PRIVATE.search(text)
    if m is None:
        return []
    start = pos = m.end()
    for _ in range(int(m.group(1))):
        line = PUTTY_LINE.match(text, pos)
        if line is None:
            break
        pos = line.end()
    end = len(text[start:pos].rstrip())
    return [Finding("key", start, start + end, text[start : start + end])] if end else []


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
    return (
        (d[0] == "4" and len(d) in (13, 16, 19))
        or (51 <= n2 <= 55 and len(d) == 16)
        or (2221 <= n4 <= 2720 and len(d) == 16)
        or (n2 in (34, 37) and len(d) == 15)
        or (
            (d.startswith("6011") or d.startswith("65") or 644 <= int(d[:3]) <= 649)
            and len(d) in (16, 19)
        )
        or (3528 <= n4 <= 3589 and len(d) in (16, 19))
        or (n2 in (36, 38, 39) and len(d) == 14)
        or (n2 == 62 and 16 <= len(d) <= 19)
    )


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
    def find(self, text: str, path: str = "") -> list[Finding]:
        """All non-overlapping findings, in text order (``path``: a file name that says
        where secrets sit, as a ``.pgpass`` does)."""
        found: list[Finding] = []
        if "password" in self.types and path and PGPASS_FILE.search(path):
            found += [
                Finding("password", m.start(1), m.end(1), m.group(1))
                for m in PGPASS_LINE.finditer(text)
            ]
        if "key" in self.types and path and RAILS_KEY_FILE.search(path):
            m = RAILS_KEY.match(text)
            if m:
                found.append(Finding("key", m.start(1), m.end(1), m.group(1)))
        low = text.lower()
        # lower() only ever lengthens a string (e.g. "İ"); equal length = same offsets.
        self._low: str | None = low if len(low) == len(text) else None
        t = self.types
        secret_spans = _word_lines(text, SECRET_WORDS, self._low) if t & {"key", "password"} else []
        if "key" in t:
            found += self._keys(text, secret_spans)
        if t & {"key", "password"}:
            found += self._secrets(text, secret_spans)
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
            found += [
                Finding("name", m.start(1), m.end(1), m.group(1))
                for m in _scan(NAME_CONTEXT, text, _word_lines(text, NAME_WORDS, self._low))
            ]
        found.sort(key=lambda f: (PRIORITY[f.kind], f.start, -f.end))
        # Taken spans do not overlap, so kept in start order only the neighbours of a new
        # span can overlap it (a scan of all of them is quadratic in a log of addresses).
        taken: list[Finding] = []
        starts: list[int] = []
        for f in found:
            i = bisect.bisect_right(starts, f.start)
            if all(f.end <= g.start or f.start >= g.end for g in taken[max(i - 1, 0) : i + 1]):
                taken.insert(i, f)
                starts.insert(i, f.start)
        return taken

    def _keys(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        out = []
        if "-----BEGIN " in text:
            out += [
                Finding("key", m.start(), m.end(), m.group(0))
                for m in PRIVATE_KEY_BLOCK.finditer(text)
            ]
        if text.startswith("PuTTY-User-Key-File-"):
            out += _putty_private(text)
        out += [Finding("key", s, e, v) for s, e, v in twilio_auth_tokens(text)]
        folded: str | None = None
        for kp in _provider_patterns():
            if not kp.may_match(text, ""):
                continue
            for m in kp.pattern.finditer(text):
                if provider_value_ok(m.group(0)):
                    out.append(Finding("key", m.start(), m.end(), m.group(0)))
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
                if len(value) >= 16 and provider_value_ok(value):
                    s = text.index(value, s)
                    # Some plugin regexes end lazily (JWT's signature part): the secret
                    # runs on to the end of its token.
                    tail = TOKEN_TAIL.match(text, s + len(value))
                    e = tail.end() if tail else s + len(value)
                    if provider_value_ok(text[s:e]):
                        out.append(Finding("key", s, e, text[s:e]))
        return out

    def _secrets(self, text: str, spans: list[tuple[int, int]]) -> list[Finding]:
        """Keyed, flag, header, query, DSN and call secrets (both kinds) on ``spans``."""
        t = self.types
        return [Finding(kind, s, e, v) for kind, s, e, v in find_secrets(text, spans) if kind in t]

    def _emails(self, text: str) -> list[Finding]:
        out = []
        for m in _scan(EMAIL, text, _lines(text, _AT)):
            local, domain, tld = m.group(1), m.group(2).lower(), m.group(3).lower()
            if tld in NON_TLDS or local.lower() in SERVICE_LOCALS:
                continue
            raw_tld = m.group(3)
            if not (
                (len(tld) == 2 or tld in GENERIC_TLDS)
                and (raw_tld.islower() or m.group(2).isupper())
            ):
                continue  # a@b.method (matrix multiply), user@host.internal
            if text.startswith(("(", "["), m.end()):
                continue  # x@w.T(...) is a call, not an address
            if REMOTE_TARGET.search(text, max(0, m.start() - 80), m.start()):
                continue  # ssh user@host, scp user@host:path: a login, not a mailbox
            if domain in PLACEHOLDER_DOMAINS or domain.endswith(PLACEHOLDER_SUFFIXES):
                continue
            if "example" in local.lower():  # documentation addresses (exampleUser@...)
                continue
            if (ID_LOCAL.fullmatch(local) and sum(c.isdigit() for c in local) >= 6) or (
                MESSAGE_ID_LINE.search(text, text.rfind("\n", 0, m.start()) + 1, m.start())
            ):
                continue  # a Message-ID / Content-ID / UUID-like identifier
            out.append(Finding("email", m.start(), m.end(), m.group(0)))
        return out

    def _ips(self, text: str) -> list[Finding]:
        out = []
        if True:
            for m in _scan(IPV4, text, _lines(text, HINT_IPV4)):
                value = m.group(1)
                before = text[max(0, m.start() - 24) : m.start()]
                if before.endswith("/") and not before.endswith("//"):
                    continue  # a user-agent or path segment like Chrome/120.0.6099.109
                if before.endswith(":") and V6_TAIL.search(before):
                    continue  # the IPv4 tail of an IPv6 address (::ffff:1.2.3.4)
                if text.startswith(".", m.end()) and text[m.end() + 1 : m.end() + 2].isalnum():
                    continue  # part of a longer dotted token: 11.2.0.4.v3
                if VERSION_CONTEXT.search(before) or PACKAGE_AT.search(before):
                    continue
                if self._version_like(text, m.start(), before):
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
    def _version_like(text: str, start: int, before: str) -> bool:
        """A dotted quad that is a version, an OID or a coordinate, by its line.

        The nearest identifier before it naming a version (AssemblyFileVersion, since,
        firmware, release_tag), an OID/ASN.1 line, or a ``group:artifact:`` coordinate.
        """
        ls = text.rfind("\n", 0, start) + 1
        le = text.find("\n", start)
        line = text[ls : len(text) if le < 0 else le]
        if OID_LINE.search(line):
            return True
        if re.search(r"(?:[\w.-]+:){2}$", before) or (
            re.search(r"\w:$", before) and IMAGE_LINE.search(line)
        ):
            return True  # group:artifact:version, image:tag
        words = re.findall(r"[A-Za-z][\w-]*", text[ls:start])
        nearest = words[-1] if words else ""
        if nearest and VERSION_WORDS.search(nearest):
            return True
        return bool(VERSION_WORDS.search(line)) and not ADDRESS_CONTEXT.search(line)

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
                if groups not in (
                    [4, 4, 4, 4],
                    [4, 6, 5],
                    [4, 6, 4],
                    [4, 4, 4, 4, 3],
                    [4, 4, 4, 1],
                    [4, 4, 4, 2],
                    [4, 4, 4, 3],
                ):
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
    def redact(
        self, text: str, secret: bytes = b"", path: str = ""
    ) -> tuple[str, list[dict[str, object]]]:
        """Return the redacted text and its log (kind, span, keyed hash; never the value).

        ``secret``: the build's HMAC key. An unsalted hash of a low-entropy value (an IP
        in a /16, a 4-digit PIN) is reversed by enumeration in seconds; an HMAC whose key
        stays out of the dataset is not. ``path``: lockfiles hold digests, not keys.
        """
        findings = self.find(text, path)
        if path and LOCKFILE.search(path):
            findings = [f for f in findings if f.kind != "key"]
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
                mapping[key] = (
                    _synthetic_ip(f.value, used) if f.kind == "ip" else REPLACEMENT[f.kind]
                )
            parts.append(text[pos : f.start])
            parts.append(mapping[key])
            pos = f.end
            log.append(
                {
                    "type": f.kind,
                    "start": f.start,
                    "end": f.end,
                    "hmac": hmac.new(
                        secret or b"unkeyed", f.value.encode(), hashlib.sha256
                    ).hexdigest(),
                }
            )
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

    def __init__(self, config: PIIConfig, secret: bytes = b"") -> None:
        self.config = config
        self.secret = secret
        self.detector = PIIDetector(config)

    def process(self, record: FileRecord, stats: StageStats) -> str | None:
        if not self.config.enabled:
            return None
        redacted, log = self.detector.redact(record.content, self.secret, record.path)
        if log:
            record.content = redacted
            record.redactions = log
            for entry in log:
                k = str(entry["type"])
                record.pii_counts[k] = record.pii_counts.get(k, 0) + 1
                stats.count(f"redacted:{k}")
        return None


@functools.cache
def _provider_patterns() -> list[KeyPattern]:
    """The provider formats, each gated on a literal its matches contain (see pii_scan)."""
    return [analyse_key_pattern(p) for p in PROVIDER_PATTERNS]


def redact_text(text: str, lang: str = "", path: str = "", config: PIIConfig | None = None) -> str:
    """Redact ``text`` exactly as the pipeline's PII stage would (default settings).

    ``lang`` and ``path`` are the file's language and path as the stage sees them (the
    path switches off key detection in lockfiles); what ``python -m data redact`` runs.
    """
    del lang  # the rules are language-independent; kept so callers state what they have
    return PIIDetector(config).redact(text, path=path)[0]


def evaluate(
    cases: list[dict], detector: PIIDetector | None = None, kinds: frozenset[str] | None = None
) -> dict[str, dict[str, float]]:
    """Per-type precision and recall on labelled cases ``{"text", "pii": [{type, value}]}``.

    A detection is a true positive when its (type, value) is labelled in that case.
    ``kinds``: score only these types (a set labelled for some kinds only); the detector
    still runs with all its types, so overlaps resolve as in production.
    """
    detector = detector or PIIDetector()
    counts: dict[str, list[int]] = {}
    errors: list[dict] = []
    for case in cases:
        expected = [
            (p["type"], p["value"]) for p in case["pii"] if kinds is None or p["type"] in kinds
        ]
        got = [
            (f.kind, f.value)
            for f in detector.find(case["text"])
            if kinds is None or f.kind in kinds
        ]
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
        report[kind] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else 1.0,
            "recall": tp / (tp + fn) if tp + fn else 1.0,
        }
    report["_errors"] = errors  # type: ignore[assignment]
    return report

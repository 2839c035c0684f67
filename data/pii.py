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
from data.records import FileRecord, StepStats
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
IPV4 = re.compile(r"(?<![\w.:-])((?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
                  r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))(?![\w-]|\.\d)")
IPV6 = re.compile(r"(?<![\w:.])((?:[0-9A-Fa-f]{1,4}:){1,7}:?(?:[0-9A-Fa-f]{1,4}|:)?"
                  r"(?::[0-9A-Fa-f]{1,4}){0,6}(?:(?<=:)(?:\d{1,3}\.){3}\d{1,3})?)(?![\w:.])")
VERSION_CONTEXT = re.compile(r"(?i)(?:(?<![a-z])(?:version|ver|release|rel|rev|build|v|python|"
                             r"tag)[\w-]*[\"']?>?\s*[:=]?|==|>=|<=|~=|!=|\^|~)\s*[\"']?v?$")
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
    r"redacted|todo|<|>|\$\{|\{\{|%\(|%s|\.\.\.|^(?:none|null|nil|true|false|undefined|"
    r"password|passwd|secret|test|pass|admin|root|guest|default|empty|required|string|"
    r"\w+_?(?:password|token|key|secret))$")
# Lockfile and VCS contexts: hex/base64 blobs there are digests, not secrets.
DIGEST_CONTEXT = re.compile(r"(?i)(?:sha\d*|md5|hash|digest|checksum|integrity|commit|rev|"
                            r"revision|etag|nonce|uuid|guid|fingerprint)\w*[\"']?\s*[:=]")


# Cheap scans that find the lines worth the full patterns (PII is rare in code: most
# lines never reach the expensive regexes; measured 5x faster on site-packages).
# Keywords that must appear on a line for the secret / name patterns to be tried there.
SECRET_WORDS = ("key", "secret", "token", "credential", "passw", "passphrase", "pwd", "pass",
                "bearer", "://")
NAME_WORDS = ("author", "maintainer", "written by", "created by", "signed-off-by")
_AT = re.compile("@")
HINT_IPV4 = re.compile(r"\d\.\d{1,3}\.\d{1,3}\.\d")
HINT_IPV6 = re.compile(r"[0-9A-Fa-f]:[0-9A-Fa-f]{0,4}:")
HINT_DIGITS = re.compile(r"\d{3}[ .()-]{0,2}\d{3}|\+\d")


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
    """(start, end) of each line that contains a match of ``hint``, in order, unique."""
    spans: list[tuple[int, int]] = []
    last_end = -1
    for m in hint.finditer(text):
        if m.start() < last_end:
            continue
        s = text.rfind("\n", 0, m.start()) + 1
        e = text.find("\n", m.end())
        e = len(text) if e < 0 else e
        spans.append((s, e))
        last_end = e
    return spans


def _scan(pattern: re.Pattern[str], text: str, spans: list[tuple[int, int]]):
    for s, e in spans:
        yield from pattern.finditer(text, s, e)


@functools.cache
def _known_key_patterns() -> list[re.Pattern[str]]:
    """Regexes of detect-secrets plugins for specific key formats."""
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
    return sorted(pats, key=lambda p: p.pattern)


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
        if "key" in t:
            found += self._keys(text)
        if "password" in t:
            found += self._passwords(text)
        if "email" in t and "@" in text:
            found += self._emails(text)
        if "ip" in t:
            found += self._ips(text)
        if "credit_card" in t:
            found += self._cards(text)
        if "phone" in t:
            found += self._phones(text)
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

    def _keys(self, text: str) -> list[Finding]:
        out = [Finding("key", m.start(), m.end(), m.group(0))
               for m in PRIVATE_KEY_BLOCK.finditer(text)]
        for pat in _known_key_patterns():
            for m in pat.finditer(text):
                # Some plugins capture the secret (AWS secret keys), others a prefix only
                # (GitHub's "(ghp|gho|...)"): use a group only when it is the secret.
                g = m.lastindex or 0
                whole = g == 0 or m.end(g) - m.start(g) < 16
                s, e = (m.start(), m.end()) if whole else (m.start(g), m.end(g))
                value = text[s:e].strip()
                if len(value) >= 16 and not PLACEHOLDER.search(value):
                    s = text.index(value, s)
                    out.append(Finding("key", s, s + len(value), value))
        spans = _word_lines(text, SECRET_WORDS, self._low)
        for m in _scan(BEARER, text, spans):
            if self._secret_like(m.group(1)):
                out.append(Finding("key", m.start(1), m.end(1), m.group(1)))
        for m in _scan(KEY_ASSIGN, text, spans):
            value = m.group(2)
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
        limit = self.config.entropy_hex if hexlike else self.config.entropy_base64
        # Short strings cannot reach a high entropy: cap the bar at 85% of log2(length).
        import math

        limit = min(limit, 0.85 * math.log2(len(value)))
        return shannon_entropy(value) >= limit

    def _passwords(self, text: str) -> list[Finding]:
        out = []
        spans = _word_lines(text, SECRET_WORDS, self._low)
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
                if VERSION_CONTEXT.search(before) or PACKAGE_AT.search(before):
                    continue
                if self._public(value):
                    out.append(Finding("ip", m.start(1), m.end(1), value))
        if True:
            for m in _scan(IPV6, text, _lines(text, HINT_IPV6)):
                value = m.group(1)
                if value.count(":") < 2 or sum(1 for g in value.split(":") if g) < 3:
                    continue
                if not any(c.isdigit() for c in value):
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

    def _cards(self, text: str) -> list[Finding]:
        out = []
        for m in _scan(CARD, text, _lines(text, HINT_DIGITS)):
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

    def _phones(self, text: str) -> list[Finding]:
        out = []
        for m in _scan(PHONE, text, _lines(text, HINT_DIGITS)):
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

    def process(self, record: FileRecord, stats: StepStats) -> str | None:
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


def evaluate(cases: list[dict], detector: PIIDetector | None = None) -> dict[str, dict[str, float]]:
    """Per-type precision and recall on labelled cases ``{"text", "pii": [{type, value}]}``.

    A detection is a true positive when its (type, value) is labelled in that case.
    """
    detector = detector or PIIDetector()
    counts: dict[str, list[int]] = {}
    errors: list[dict] = []
    for case in cases:
        expected = [(p["type"], p["value"]) for p in case["pii"]]
        got = [(f.kind, f.value) for f in detector.find(case["text"])]
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

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
import json
import re
from dataclasses import dataclass
from pathlib import Path

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
    SECRET_LINE_WORDS,
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

# Letters of the Latin, Greek and Cyrillic scripts beyond ASCII (RFC 6531 internationalised
# addresses: jürgen.weiß@gmx.de, anna@bücherstube.de, ivan@почта.рф); no symbols (× ÷).
_INTL = "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f\u0370-\u03ff\u0400-\u04ff\u1e00-\u1eff"
_DOMAIN = (
    rf"((?:[A-Za-z0-9{_INTL}](?:[A-Za-z0-9{_INTL}-]{{0,61}}[A-Za-z0-9{_INTL}])?\.)+"
    rf"([A-Za-z{_INTL}]{{2,24}}))(?![\w-]|\.[A-Za-z0-9])"
)
EMAIL = re.compile(
    rf"(?<![\w.+%-])([A-Za-z0-9{_INTL}](?:[A-Za-z0-9{_INTL}._%+-]|'(?=\w)){{0,63}}"
    rf"|\"[^\"\\\n@]{{1,62}}\")@" + _DOMAIN  # conor.o'brien@tcd.ie, "jane roe"@x.io (RFC 5322)
)
# Addresses written out to dodge harvesters: ``jane [at] x [dot] io``, ``k(at)uni-bonn.de``,
# ``jane AT x DOT io``, ``jane at x dot com``, the local part's dots written out too
# (``jane dot roe at x dot com``, as Arch PKGBUILDs do; group 1: local part, 2: domain,
# 3: TLD).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_BR_AT, _BR_DOT = (rf"\s?[\[({{<]\s?(?i:{w})\s?[\])}}>]\s?" for w in ("at", "dot"))
OBFUSCATED_EMAIL = re.compile(
    r"(?<![\w.+-])([A-Za-z0-9][\w.+-]{0,63}(?:(?i: dot |\s?[\[({<]\s?dot\s?[\])}>]\s?)"
    r"[A-Za-z0-9][\w+-]{0,63}){0,3})(?:"
    rf"{_BR_AT}((?:{_LABEL}(?:\.|{_BR_DOT}))+([A-Za-z]{{2,24}}))"
    rf"|\s+AT\s+((?:{_LABEL}(?:\.|\s+DOT\s+))+([A-Za-z]{{2,24}}))"
    rf"| at ((?:{_LABEL} dot )+([a-z]{{2,24}}))"
    rf"| at ((?:{_LABEL}\.)+([a-z]{{2,24}}))(?=[)>]))"
    r"(?![\w-]|\.[A-Za-z0-9])"
)
# ``(jane.roe at x.org)``, ``<jane at x.org>``: " at " with a plain domain only when the
# address alone fills brackets (in prose, "look at x.com" is no address).
BRACKET_AT = re.compile(r"[(<][\w.+-]+ at [\w-]+\.[\w.-]+[)>]")
# Substrings of the lower-cased text that one of these forms needs (lines to scan).
# Lines worth the full pattern: a bracketed "at" in the lower-cased text (the pattern
# opens with the literal "at", which ``re`` skips to fast), " dot ", " AT ".
OBFUSCATED_HINT = re.compile(r"at(?:(?<=[\[({<]at)[\])}>]|(?<=[\[({<] at) [\])}>])")
# user@host:path (scp, rsync, sshfs, git push): a login and a remote path, no mailbox.
SCP_AFTER = re.compile(r":(?:[~/]|[\w.-]+(?:/|\.git\b))")
# user@host before a shell prompt's path and sigil (``root@web-01.x.io:~#``): a login.
PROMPT_AFTER = re.compile(r":[~/]\S*[#$%>]|[ \t]?[#$] ")
# The ``@`` written as a URL escape (once or twice: ``%40``, ``%2540``), an HTML character
# reference (``&#64;``, ``&#x40;``, ``&commat;``) or a POD escape before the address
# (``E<lt>jane@x.ioE<gt>``): lines with one are decoded (URL escapes, character references,
# POD ``E<...>``) and searched like plain text, the finding mapped back to the encoded
# span, so an address written in any mix of them (``mailto:?to=%22Mia%22%20%3Cmia%40x.io``,
# ``&#106;&#97;&#110;&#101;&#64;x.io``) is as personal as the plain one.
ENCODED_AT = re.compile(r"%(?:25)*40|&#0*64;|&#[xX]0*40;|&commat;")
ESCAPE = re.compile(
    r"%(?:25)*([0-9A-Fa-f]{2})|&#(\d{1,7});|&#[xX]([0-9A-Fa-f]{1,6});|&([A-Za-z]{2,8});"
    r"|E<(lt|gt)>"
)
ENTITIES = {
    "commat": "@",
    "period": ".",
    "lt": "<",
    "gt": ">",
    "quot": '"',
    "amp": "&",
    "apos": "'",
    "lowbar": "_",
    "hyphen": "-",
    "plus": "+",
    "nbsp": " ",
}
# Local parts that stand for "an address goes here" (your.email@gmail.com, username@...,
# firstname.lastname@..., xxx@..., foo@bar.com) and domains that do (yourcompany.com).
PLACEHOLDER_LOCAL = re.compile(
    r"(?i)(?:your|my)(?:[._-]?(?:e-?mail|name|user(?:name)?|address|login|account|id))*|"
    r"you|user(?:[._-]?name)?|e-?mail|name|some(?:one|body)|first(?:[._-]?name)?[._-]?last"
    r"(?:[._-]?name)?|x+|foo|bar|baz|changeme"
)
PLACEHOLDER_LABEL = re.compile(
    r"(?i)(?:your|my|some)[-_]?(?:company|domain|org|organi[sz]ation|site|host|server|"
    r"e-?mail|business)?|x+|foo|bar|baz"
)
URL_USERINFO_AT = re.compile(r"://[^\s/@]*@$")
# The userinfo of a URL (``https://user:pass@host``, ``ftp://user@host``) is a login.
URL_USERINFO = re.compile(r"[A-Za-z][\w+.-]*://[^\s/@\"'<>]*$")
# A variable spliced in before the ``@``: ``$USER@``, ``$env:USERNAME@``, ``%(user)s@``.
TEMPLATE_BEFORE = re.compile(r"(?i)(?:\$|\$env:|%\([\w.-]+\))$")
# SSH algorithm and extension names (RFC 4251 section 6: ``name@domain``), such as
# ``chacha20-poly1305@openssh.com`` and ``curve25519-sha256@libssh.org``, are no mailboxes:
# a hyphenated local part with an algorithm word.
SSH_NAME_LOCAL = re.compile(
    r"(?i)(?=[\w.]*-)(?:[\w.-]*[-.])?(?:aes\d*|chacha\d*|poly1305|hmac|umac|sha\d*|md5|"
    r"curve\d+|ed25519|ed448|ecdsa|nistp\d+|rsa|dss|etm|gcm|cbc|ctr|cert|sntrup\w*|mlkem\w*|"
    r"x25519\w*)(?:[-.][\w.-]*)?"
)
IPV4 = re.compile(
    r"(?:(?<![\w.-])|(?<=(?<!\w)_))((?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}"
    r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))(?![^\W_]|_\w|-|\.\d)"
)
# A range of addresses written with a hyphen (``185.220.101.1-185.220.101.63``; nmap's
# ``103.77.12.1-40``): both ends are addresses, which IPV4's boundaries alone would refuse.
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
IPV4_RANGE = re.compile(
    rf"(?<![\w.-])((?:{_OCTET}\.){{3}}{_OCTET})-((?:{_OCTET}\.){{3}}{_OCTET}|{_OCTET})"
    r"(?![\w-]|\.\d)"
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
    r"chapter|clause|paragraph|para|table|figure|fig|appendix|annex|item|step|"
    r"rfc\s*\d+|oid|objectidentifier|othername\.\d+)s?(?:[_-][\w-]*)?[\"']?>?"
    r"(?:\s*[:=(]|\s+§?)?|§|==|>=|<=|~=|!=|\^|~)\s*[\"'(\[]?v?$"
)
# Words on a line that make a dotted quad an address (needed when every octet is a single
# digit, the shape of most version and section numbers: 1.2.3.4, 3.1.1.6).
ADDRESS_CONTEXT = re.compile(
    r"(?i)ip|addr|host|inet|sock|cidr|server|client|peer|remote|connect|bind|proxy|dns|"
    r"\b(?:src|dst)=|"
    r"gateway|subnet|route|firewall|://|/\d{1,2}\b|\(\s*b?[\"'][\d.]+[\"']\s*,\s*\d"
)
DOC_NET6 = ipaddress.ip_network("3fff::/20")
# ``server=/corp.io/45.33.32.156`` (dnsmasq): an address after a ``/domain/`` is no path.
SLASHED_DOMAIN = re.compile(r"(?:^|[\s=])/[\w-]+(?:\.[\w-]+)+/$")
# A line that opens with a dotted quad after heading or list markup (group 1: a Markdown
# or RDoc heading): a release entry (``## [2.14.3.1] - ...``, ``=== 3.10.2.1 / ...``).
RELEASE_ENTRY = re.compile(r"[ \t]*(?:(#{1,6}|={2,6})|[*+|-])?[ \t]*\[?v?")
CHANGELOG_FILE = re.compile(
    r"(?i)(?:^|/)(?:change(?:s|log)|history|news|releases?|release[-_]?notes)(?:\.[\w.]+)?$"
)
# A key above a value line that makes the value a version (``supported_versions:``).
VERSION_KEY = re.compile(r"(?i)version|(?<![a-z])release")
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


def _letters(upper: bool) -> str:
    """Upper- or lower-case letters of the Latin, Greek and Cyrillic scripts, as a class."""
    ranges = [(0x41, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x1E00, 0x1EFF)]
    chars = [
        chr(c)
        for lo, hi in ranges
        for c in range(lo, hi + 1)
        if (chr(c).isupper() if upper else chr(c).islower()) and chr(c).isalpha()
    ]
    return "".join(re.escape(c) for c in chars)


# Names written in any of those scripts (José Álvarez, Łukasz Wróbel, Nguyễn Văn An).
_UP, _LOW = _letters(True), _letters(False)
_NAME_WORD = rf"[{_UP}](?:'[{_UP}])?[{_LOW}']+"  # José, O'Neil
# Lower-case particles inside a name (Pieter van der Berg, Ana Lucía de la Cruz).
_PARTICLE = r"(?:van|von|der|den|de|del|della|di|da|das|do|dos|du|la|le|ten|ter|bin|al|y)"
_NAME = (
    rf"{_NAME_WORD}(?:[ -](?:{_PARTICLE} )*(?:[{_UP}]\.|{_NAME_WORD})){{1,3}}"
    rf"|{_NAME_WORD}, {_NAME_WORD}"  # Roe, Jane
    rf"|(?:[{_UP}]\. ?){{1,3}}{_NAME_WORD}"  # K. L. Mensah
)
# An author line: a comment or field naming the author, in the syntaxes that carry one
# (``# Author:``, ``"author": "..."``, ``authors = ["..."]``, ``:Author:``, ``<author>``,
# ``\author{...}``, ``.. moduleauthor::``, ``%% Author:``, ``Co-authored-by:``).
NAME_CONTEXT = re.compile(
    r"(?m)(?:^[ \t]*(?:#|//|\*|;|--|\.\.|%{1,2})?[ \t]*[@:<\\\"']?(?:[A-Za-z_]\w*\.)?"
    r"(?i:(?:co-)?authors?(?:ed-by|\(s\))?|maintainers?|moduleauthor|sectionauthor|written by|"
    r"created by|signed-off-by)"
    r"[\"']?[ \t]*(?:::|[:=>{])?[ \t]*\[?[ \t]*[\"']?|__author__\s*=\s*[\"']"
    r"|(?i:name|property)=[\"'](?:[\w-]+:)?(?i:author)[\"'][ \t]+content=[\"']"
    r"|[(,][ \t]*(?i:author|maintainer)[ \t]*=[ \t]*[\"'])"
    rf"({_NAME})(?![{_LOW}])"
)
# A heading that opens a list of people (``Authors`` over an RST underline, ``=head1
# AUTHOR`` in POD, ``.SH AUTHORS`` in man pages, ``## Contributors``, ``Authors:`` alone on
# its line): the lines below it, to the first blank line after them, are author lines.
AUTHOR_HEADING = re.compile(
    r"(?im)^[ \t]*(?:=head\d[ \t]+|\.SH[ \t]+|#{1,6}[ \t]*|\*\*)?[\"']?"
    r"(?:authors?(?:\(s\))?|contributors|maintainers?|credits|developers|core team)"
    r"\**[ \t]*:?[ \t]*\**\r?$"
)
HEADING_WORDS = ("author", "contributors", "maintainer", "credits", "developers", "core team")
SECTION_RULE = re.compile(r"[ \t]*(?:[=\-~^*#+`]{3,})?[ \t]*\r?")
# A file that lists a project's people (AUTHORS, CONTRIBUTORS.md, MAINTAINERS, CREDITS):
# each of its lines is an author line.
AUTHOR_FILE = re.compile(
    r"(?i)(?:^|[/\\])(?:authors|contributors|maintainers|credits|thanks|owners)"
    r"(?:\.(?:md|rst|txt|markdown|adoc))?$"
)
# One entry of such a list: a name after list markup or a one-letter field tag (``* A B``,
# ``- A B``, ``1. A B``, ``M:\tA B``, ``N: A B``), ...
AUTHOR_ITEM = re.compile(
    rf"[ \t]*(?:[-*+\u2022][ \t]+|\d{{1,3}}[.)][ \t]+|[A-Z]:[ \t]+)?({_NAME})(?![{_LOW}])"
)
# ... followed by nothing, an address, a handle or a note after punctuation (so that prose
# such as "Pull Requests are welcome" is no entry).
AUTHOR_REST = re.compile(r"(?:[ \t]*(?:[<(\[{,:;|\u2013\u2014-]|E<|\S+@)[^\n]*)?[ \t.]*\r?")
# The next name of an author list: ", B", " and B", " & B", after an optional address.
NAME_MORE = re.compile(
    rf"(?:[ \t]*(?:<[^>\n]*>|\([^)\n]*\)))?[\"']?"
    rf"(?:,[ \t]*(?:and[ \t]+)?|[ \t]+and[ \t]+|[ \t]*&[ \t]*)[\"']?"
    rf"({_NAME})(?![{_LOW}])"
)
# A mailbox, ``Display Name <address>`` (RFC 5322): git's author/committer headers and
# trailers, .mailmap, patches' ``From:``, Debian ``Maintainer:``/``Uploaders:``, RPM
# ``Packager:``, Cargo ``authors``: the name beside a person's address is theirs.
MAILBOX_NAME = re.compile(rf"(?<![^\s:\"'\[,(=])({_NAME})[ \t]+<[\w.+'-]+@[\w-]+(?:\.[\w-]+)+>")
# A ``name`` field of a person record: ``{"name": "A B", "email": ...}``, ``<name>A B</name>``
# under ``<developer>``, ``{name = "A B", email = ...}``; a person's when the record's line
# holds an email field or a people word (authors, maintainers...) is on the 3 lines above.
NAME_FIELD = re.compile(
    rf"(?i:[\"']?\bname[\"']?[ \t]*[:=][ \t]*[\"']|<name>)({_NAME})(?![{_LOW}])[\"'<]"
)
PEOPLE_WORDS = re.compile(
    r"(?i)author|maintainer|contributor|developer|packager|committer|owner|\bpeople\b"
)
# Author fields that name an organisation, a team or a tool, not a person.
ORG_WORDS = frozenset(
    {
        "team",
        "developers",
        "development",
        "devs",
        "contributors",
        "community",
        "project",
        "foundation",
        "inc",
        "llc",
        "ltd",
        "gmbh",
        "corp",
        "corporation",
        "company",
        "co",
        "bot",
        "robot",
        "labs",
        "lab",
        "group",
        "authors",
        "organization",
        "organisation",
        "systems",
        "software",
        "technologies",
        "studio",
        "code",
        "university",
        "institute",
        "consortium",
        "association",
        "society",
        "the",
        # words of prose, not of names (a list's "Thanks To Everyone", "Thanks For All")
        "thanks",
        "everyone",
        "to",
        "for",
        "of",
        "all",
    }
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
    r"\b(?i:ssh|scp|sftp|rsync|mosh|sshpass|ssh-copy-id|telnet|proxyjump)\b[^\n]*"
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
OID_LINE = re.compile(
    r"(?i)\boid|object identifier|::=|\basn|\bsnmp|\bmib\b|arc\b|\bx\.?509|\bextensions?\b"
)


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


class _Mapped:
    """A match found in a decoded line, its groups and span mapped back to the text."""

    def __init__(self, text: str, start: int, end: int, groups: tuple[str, ...]) -> None:
        self._text, self._start, self._end, self._groups = text, start, end, groups

    def start(self, group: int = 0) -> int:
        return self._start

    def end(self, group: int = 0) -> int:
        return self._end

    def __getitem__(self, group: int) -> str:
        return self._text[self._start : self._end] if group == 0 else self._groups[group - 1]


def _unescape(m: re.Match[str]) -> str:
    hexa, dec, hexref, name, pod = m.groups()
    if hexa is not None:
        return chr(int(hexa, 16))
    if dec is not None or hexref is not None:
        code = int(dec) if dec is not None else int(hexref, 16)
        return chr(code) if 0 < code < 0x110000 and not 0xD800 <= code < 0xE000 else m[0]
    if name is not None:
        return ENTITIES.get(name.lower() if name.islower() else name, m[0])
    return "<" if pod == "lt" else ">"


def _decoded_emails(text: str, ls: int, le: int) -> list[tuple]:
    """Email candidates on ``text[ls:le]`` with its escapes decoded, mapped back: those
    with an escape in or next to them (``E<lt>jane@x.ioE<gt>``); a plain one found twice is
    kept once (overlapping findings are)."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i = ls
    for m in ESCAPE.finditer(text, ls, le):
        for j in range(i, m.start()):
            chars.append(text[j])
            starts.append(j)
            ends.append(j + 1)
        chars.append(_unescape(m))
        starts.append(m.start())
        ends.append(m.end())
        i = m.end()
    for j in range(i, le):
        chars.append(text[j])
        starts.append(j)
        ends.append(j + 1)
    line = "".join(chars)
    out = []
    for m in EMAIL.finditer(line):
        start, end = starts[m.start(1)], ends[m.end() - 1]
        mapped = _Mapped(text, start, end, (m[1], m[2], m[3]))
        out.append((mapped, m[1], m[2], m[3], "plain"))  # the checks judge the decoded local
    return out


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
        secret_spans = (
            _word_lines(text, SECRET_WORDS + SECRET_LINE_WORDS, self._low)
            if t & {"key", "password"}
            else []
        )
        if "key" in t:
            found += self._keys(text, secret_spans)
        if t & {"key", "password"}:
            found += self._secrets(text, secret_spans)
        if "email" in t:
            found += self._emails(text)
        if "ip" in t:
            found += self._ips(text, path)
        if t & {"credit_card", "phone"}:
            digit_spans = _lines(text, HINT_DIGITS)
            if "credit_card" in t:
                found += self._cards(text, digit_spans)
            if "phone" in t:
                found += self._phones(text, digit_spans)
        if "name" in t:
            found += self._names(text, path)
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

    def _names(self, text: str, path: str = "") -> list[Finding]:
        """Names on author lines, each of a list (``Authors: A B, C D and E F``), in author
        sections and in files that list people (``AUTHORS``)."""
        out: list[Finding] = []
        if "@" in text:
            for m in _scan(MAILBOX_NAME, text, _lines(text, _AT)):
                self._person(text, m.span(1), out)
        for m in _scan(NAME_FIELD, text, _word_lines(text, ("name",), self._low)):
            ls = text.rfind("\n", 0, m.start()) + 1
            le = text.find("\n", m.end())
            line = text[ls : len(text) if le < 0 else le]
            above = text[text.rfind("\n", 0, max(0, ls - 1) - 200) + 1 : ls] if ls else ""
            if re.search(r"(?i)e-?mail", line) or PEOPLE_WORDS.search(
                "\n".join(above.split("\n")[-4:])
            ):
                self._person(text, m.span(1), out)
        if path and AUTHOR_FILE.search(path):
            self._author_lines(text, 0, out, 100_000)
        else:
            for h in _scan(AUTHOR_HEADING, text, _word_lines(text, HEADING_WORDS, self._low)):
                self._author_lines(text, h.end() + 1, out, 200)
        for m in _scan(NAME_CONTEXT, text, _word_lines(text, NAME_WORDS, self._low)):
            span: tuple[int, int] | None = m.span(1)
            while span:
                name = text[span[0] : span[1]]
                if not ORG_WORDS.intersection(re.split(r"[ ,-]+", name.lower())):
                    out.append(Finding("name", span[0], span[1], name))
                more = NAME_MORE.match(text, span[1])
                span = more.span(1) if more else None
        return out

    @staticmethod
    def _person(text: str, span: tuple[int, int], out: list[Finding]) -> None:
        name = text[span[0] : span[1]]
        if not ORG_WORDS.intersection(re.split(r"[ ,-]+", name.lower())):
            out.append(Finding("name", span[0], span[1], name))

    @staticmethod
    def _author_lines(text: str, pos: int, out: list[Finding], limit: int) -> None:
        """Entries of a list of people from ``pos`` on: after a heading (``limit`` lines,
        section rules and blank lines skipped first), to the first blank line or heading
        below an entry; in a file of people (a large ``limit``), every line."""
        seen = False
        whole_file = limit > 200
        while pos < len(text) and limit > 0:
            limit -= 1
            le = text.find("\n", pos)
            le = len(text) if le < 0 else le
            if SECTION_RULE.fullmatch(text, pos, le):
                if seen and not whole_file and text[pos:le].strip() == "":
                    return  # the blank line that ends the section
                pos = le + 1
                continue
            if not whole_file and seen and text[pos] in "=.#":
                return  # the next heading
            m = AUTHOR_ITEM.match(text, pos, le)
            if m:
                names, span = [], m.span(1)
                while span:
                    names.append(span)
                    more = NAME_MORE.match(text, span[1], le)
                    span = more.span(1) if more else None
                if AUTHOR_REST.fullmatch(text, names[-1][1], le):
                    seen = True
                    for a, b in names:
                        name = text[a:b]
                        if not ORG_WORDS.intersection(re.split(r"[ ,-]+", name.lower())):
                            out.append(Finding("name", a, b, name))
            seen = True
            pos = le + 1

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
        cands = []  # (match, local, domain, tld, how)
        if "@" in text:
            cands += [(m, m[1], m[2], m[3], "plain") for m in _scan(EMAIL, text, _lines(text, _AT))]
        if "%" in text or "&" in text or "E<" in text:
            # Lines with an escaped "@", or a plain one and an escape elsewhere on the line
            # (``jane&#46;roe@x.io``, ``E<lt>jane@x.ioE<gt>``).
            escaped = {*_lines(text, ENCODED_AT)}
            if "@" in text:
                escaped |= {(a, b) for a, b in _lines(text, _AT) if ESCAPE.search(text, a, b)}
            for ls, le in sorted(escaped):
                cands += _decoded_emails(text, ls, le)
        spans = _lines(self._low or text, OBFUSCATED_HINT)
        if " AT " in text or " dot " in text:
            spans = sorted({*spans, *_word_lines(text, (" AT ", " dot "), text)})
        if " at " in text:
            spans = sorted({*spans, *_lines(text, BRACKET_AT)})
        for m in _scan(OBFUSCATED_EMAIL, text, spans):
            i = next(g for g in (2, 4, 6, 8) if m[g])
            opener = text[m.start(1) - 1 : m.start(1)] if i == 8 else ""
            if i == 8 and not (opener == "<" or (opener == "(" and re.search(r"[._+\d-]", m[1]))):
                continue  # the local part opens the brackets; "(look at x.com)" is prose
            domain = ".".join(re.findall(_LABEL, re.sub(r"(?i)dot", ".", m[i])))
            cands.append((m, m[1], domain, m[i + 1], "spoken" if i >= 6 else "plain"))
        for m, local, raw_domain, raw_tld, how in cands:
            domain, tld = raw_domain.lower(), raw_tld.lower()
            start = m.start(1)
            if start and text[start - 1] == "\\" and local[0] in "ntr" and len(local) > 1:
                local, start = local[1:], start + 1  # "...\njane@x.io": the escape is no part
            elif text.startswith("=", start - 1) and re.match(r"(?:20|09|3D)[A-Za-z]", local):
                local, start = local[2:], start + 2  # quoted-printable "To:=20jane@x.io"
            if tld in NON_TLDS or local.lower() in SERVICE_LOCALS:
                continue
            # A TLD that exists: two letters, a common generic one in any case
            # (Jane.Roe@Outlook.Com, K@Uni-Bonn.DE), or any of IANA's in lower case
            # (lea@mosaik.berlin); a@b.method, x@w.T and user@host.internal end in none.
            common = len(tld) == 2 or tld in GENERIC_TLDS
            if not (
                (common and (raw_tld.islower() or raw_tld.isupper() or raw_tld.istitle()))
                or (how == "plain" and raw_tld.islower() and tld in _iana_tlds())
            ):
                continue
            if SCP_AFTER.match(text, m.end()):
                continue  # deploy@git.x.io:apps/api.git, builder@ci.x.io:/cache: a remote path
            if PROMPT_AFTER.match(text, m.end()):
                continue  # root@web-01.x.io:~# (a shell prompt): a login, not a mailbox
            if text.startswith(("(", "["), m.end()):
                continue  # x@w.T(...) is a call, not an address
            if REMOTE_TARGET.search(text, max(0, start - 80), start):
                continue  # ssh user@host, scp user@host:path: a login, not a mailbox
            if domain in PLACEHOLDER_DOMAINS or domain.endswith(PLACEHOLDER_SUFFIXES):
                continue
            if "example" in local.lower():  # documentation addresses (exampleUser@...)
                continue
            label = domain.rsplit(".", 2)[-2]
            if PLACEHOLDER_LOCAL.fullmatch(local) or PLACEHOLDER_LABEL.fullmatch(label):
                continue  # your.email@gmail.com, you@yourcompany.com: "an address here"
            if URL_USERINFO.search(text, max(0, start - 200), start):
                continue  # https://user:pass@host: a login (the secret rules judge passwords)
            if TEMPLATE_BEFORE.search(text, max(0, start - 8), start):
                continue  # "$USER@corp.io", "%(user)s@corp.io": a variable, not a mailbox
            if SSH_NAME_LOCAL.fullmatch(local):
                continue  # chacha20-poly1305@openssh.com: an SSH algorithm name
            if (ID_LOCAL.fullmatch(local) and sum(c.isdigit() for c in local) >= 6) or (
                MESSAGE_ID_LINE.search(text, text.rfind("\n", 0, start) + 1, start)
            ):
                continue  # a Message-ID / Content-ID / UUID-like identifier
            out.append(Finding("email", start, m.end(), text[start : m.end()]))
        return out

    def _ips(self, text: str, path: str = "") -> list[Finding]:
        out = []
        changelog = bool(path) and CHANGELOG_FILE.search(path) is not None
        if True:
            v4_lines = _lines(text, HINT_IPV4)
            quads = [(m.start(1), m.end(1)) for m in _scan(IPV4, text, v4_lines)]
            for m in _scan(IPV4_RANGE, text, v4_lines):
                quads.append((m.start(1), m.end(1)))
                if "." in m.group(2):
                    quads.append((m.start(2), m.end(2)))
            for start, end in quads:
                value = text[start:end]
                before = text[max(0, start - 24) : start]
                if (
                    before.endswith("/")
                    and not before.endswith("//")
                    and not SLASHED_DOMAIN.search(before)
                ):
                    continue  # a user-agent or path segment like Chrome/120.0.6099.109
                if (
                    before.endswith(":")
                    and V6_TAIL.search(before)
                    and not before.lower().endswith("::ffff:")
                ):
                    continue  # the IPv4 tail of an IPv6 address (64:ff9b::1.2.3.4); an
                    # IPv4-mapped one (::ffff:1.2.3.4) is that IPv4 host, judged as such
                if text.startswith(".", end) and text[end + 1 : end + 2].isalnum():
                    continue  # part of a longer dotted token: 11.2.0.4.v3
                if VERSION_CONTEXT.search(before) or (
                    PACKAGE_AT.search(before) and not URL_USERINFO_AT.search(before)
                ):
                    continue  # (ssh://git@1.2.3.4 after "git remote add" is no package)
                if self._version_like(text, start, before, changelog):
                    continue
                if max(map(len, value.split("."))) == 1:
                    ls = text.rfind("\n", 0, start) + 1
                    le = text.find("\n", end)
                    if not ADDRESS_CONTEXT.search(text, ls, len(text) if le < 0 else le):
                        continue  # 1.2.3.4-shaped without address words: a version
                if self._public(value):
                    out.append(Finding("ip", start, end, value))
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
    def _version_like(text: str, start: int, before: str, changelog: bool = False) -> bool:
        """A dotted quad that is a version, an OID or a coordinate, by its line.

        The nearest identifier before it naming a version (AssemblyFileVersion, since,
        firmware, release_tag), an OID/ASN.1 line, a ``group:artifact:`` coordinate, a
        release heading (``## [2.14.3.1] - 2024-01-02``; in a changelog file any entry that
        opens with it), or a value under a version/release key on the lines above
        (``<key>CFBundleVersion</key>`` / ``<string>14.2.0.1</string>``, YAML lists).
        """
        ls = text.rfind("\n", 0, start) + 1
        le = text.find("\n", start)
        line = text[ls : len(text) if le < 0 else le]
        if OID_LINE.search(line):
            return True
        opening = RELEASE_ENTRY.fullmatch(text, ls, start)
        if opening and (changelog or opening.group(1)):
            return True
        if not ADDRESS_CONTEXT.search(line):
            above = text[max(0, ls - 240) : max(0, ls - 1)].split("\n")
            context = [x for x in above if x.strip()][-2:]
            if any(VERSION_KEY.search(x) for x in context) and not any(
                ADDRESS_CONTEXT.search(x) for x in context
            ):
                return True
        if re.search(r"(?:[\w.-]+:){2}$", before) or (
            re.search(r"(?<!:)\b\w[\w.-]*:$", before) and IMAGE_LINE.search(line)
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
        if ip.version == 6 and ip in DOC_NET6:
            return False  # RFC 9637's documentation prefix (ipaddress predates it)
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
def _iana_tlds() -> frozenset[str]:
    """IANA's top-level domains (``resources/iana-tlds.json``, the root zone's list)."""
    path = Path(__file__).parent / "resources" / "iana-tlds.json"
    return frozenset(json.loads(path.read_text(encoding="utf-8"))["tlds"])


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

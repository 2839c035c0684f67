"""Secret detection rule families: provider formats, keyed values, flags, headers, DSNs, calls.

A secret shows up in code in a handful of *syntaxes*, whatever the language: a value
assigned to a key-like name (quoted or bare: env, INI, YAML, ``export``, properties,
connection strings, XML attributes), a command-line flag, an HTTP auth scheme, a URL's
query string or userinfo, a positional argument of a login/connect call, a keyword-less
form (``IDENTIFIED BY``, ``define('DB_PASS', ...)``, ``<password>...</password>``,
Gradle's ``storePassword '...'``), or a provider's own token format. Each family below
is one regex plus the same value checks, so a new language costs nothing.

The value checks are what keeps precision: placeholders and documentation examples,
references (``$X``, ``${X}``, ``os.environ[...]``), identifiers and file paths, regex
patterns, URLs, the well-known example JWT and AWS's documented example keys are never
secrets. Provider formats are the providers' documented ones as collected by gitleaks
(``cmd/generate/config/rules/*.go``; rule ids named below) and detect-secrets' plugins.
"""

from __future__ import annotations

import collections
import functools
import math
import re
import string
from collections.abc import Iterator

from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

# -- provider formats (gitleaks rule ids in comments) ------------------------------------
PROVIDER_PATTERNS = [
    re.compile(p)
    for p in (
        r"\bgithub_pat_\w{82}\b",  # github-fine-grained-pat
        r"\bgh[pousr]_[0-9A-Za-z]{36}\b",  # github-pat, github-oauth, github-app-token
        r"\bglpat-[\w-]{20}\b",  # gitlab-pat
        r"\bsk-(?:proj|svcacct|admin)-[\w-]{40,}T3BlbkFJ[\w-]{40,}",  # openai-api-key
        # Project/service-account keys issued without the T3BlbkFJ marker: the literal
        # sk-proj-/sk-svcacct-/sk-admin- prefix, 40+ key characters with a digit and a
        # capital are specific enough; placeholders (sk-proj-xxxx...) still drop.
        r"\bsk-(?:proj|svcacct|admin)-(?=[\w-]*\d)(?=[\w-]*[A-Z])[\w-]{40,}",
        r"\bsk-[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}\b",  # openai-api-key (legacy)
        r"\bsk-ant-(?:api03|admin01)-[\w-]{93}AA\b",  # anthropic-api-key
        r"\bAIza[\w-]{35}(?![\w-])",  # gcp-api-key
        # stripe-access-token, one pattern per prefix so each is gated on its own literal
        *(
            rf"\b{kind}_{env}_[0-9A-Za-z]{{10,99}}\b"
            for kind in ("sk", "rk")
            for env in ("test", "live", "prod")
        ),
        r"\bwhsec_[0-9A-Za-z]{32,}\b",  # Stripe webhook signing secret
        r"\bhf_[A-Za-z]{34}\b",  # huggingface-access-token
        r"\bapi_org_[A-Za-z]{34}\b",  # huggingface-organization-api-token
        r"\bshp(?:at|ss|ca|pa)_[0-9A-Fa-f]{32}\b",  # shopify-*-token
        r"\bhvs\.[\w-]{90,120}(?![\w-])",  # vault-service-token
        r"\bhvb\.[\w-]{138,300}(?![\w-])",  # vault-batch-token
        r"(?<![\w.])s\.[A-Za-z0-9]{24}(?![\w.])",  # vault-service-token (legacy; filtered)
        r"\bxox[baprse]-[0-9A-Za-z-]{10,}",  # slack-*-token
        r"\bnpm_[A-Za-z0-9]{36}\b",  # npm-access-token
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",  # aws-access-token
        r"\bSG\.[\w-]{22}\.[\w-]{43}\b",  # sendgrid-api-token
        r"\bdop_v1_[a-f0-9]{64}\b",  # digitalocean-pat
        r"\bdapi[a-f0-9]{32}(?:-\d)?\b",  # databricks-api-token
        r"\bpypi-AgEIcHlwaS5vcmc[\w-]{50,}",  # pypi-upload-token
        r"\bSK[0-9a-fA-F]{32}\b",  # twilio-api-key
        r"\bdp\.pt\.[a-z0-9]{43}\b",  # doppler-api-token
        r"\blin_api_[a-z0-9]{40}\b",  # linear-api-key
        r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}\b",  # postman-api-token
        r"\bNRAK-[A-Z0-9]{27}\b",  # new-relic-user-api-key
        r"\bAGE-SECRET-KEY-1[02-9AC-HJ-NP-Z]{58}\b",  # age-secret-key
        r"\bATATT3[\w=-]{186,}",  # atlassian-api-token (192 characters; longer kept)
        r"\bdt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}\b",  # dynatrace-api-token
        r"\bpul-[a-f0-9]{40}\b",  # pulumi-api-token
        r"\bsbp_[a-f0-9]{40}\b",  # Supabase personal access token
        r"\brubygems_[a-f0-9]{48}\b",  # rubygems-api-token
        r"\bkey-[a-f0-9]{32}\b",  # mailgun-private-api-token
        r"\bLTAI[A-Za-z0-9]{20}\b",  # alibaba-access-key-id
        r"\btskey-(?:auth|api|client|scim|webhook)-[A-Za-z0-9]{6,}-[A-Za-z0-9]{20,}",  # Tailscale
        r"\bgsk_[A-Za-z0-9]{52}\b",  # Groq API key
        r"\br8_[A-Za-z0-9]{37}\b",  # Replicate API token
        r"\blsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}\b",  # LangSmith API key
        r"\bpscale_(?:tkn|pw|oauth)_[\w.-]{32,64}\b",  # planetscale-api-token/-password
        r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{16,}",  # jwt
    )
]
# jwt.io's example token (HS256, "John Doe", iat 1516239022), in countless tutorials.
EXAMPLE_JWT_SIGNATURES = ("SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",)
EXAMPLE_JWT_PAYLOAD = "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"

# Twilio's auth token is 32 bare hex digits, a secret only by its company: trufflehog's
# twilio detector (pkg/detectors/twilio) pairs it with an ``AC`` account SID; here the SID
# must be on the same line (``Client.new('AC...', '<token>')``, ``twilio(sid, token)``).
# (No leading ``\b``: a literal prefix lets ``re`` skip ahead in C; checked after.)
TWILIO_SID = re.compile(r"AC[0-9a-f]{32}\b")
TWILIO_TOKEN = re.compile(r"""(["'])([0-9a-f]{32})\1""")

# -- names -------------------------------------------------------------------------------
_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# psk: Wi-Fi; authtok: sssd's ``ldap_default_authtok`` (the bind password).
PASSWORD_PARTS = frozenset(
    {"password", "passwd", "passphrase", "pwd", "pass", "pw", "passw", "psk", "authtok"}
)
# Password names in one lowercase word (offlineimap's ``remotepass``, mutt's ``smtppass``).
JOINED_PASSWORD_NAMES = frozenset(
    {"remotepass", "localpass", "smtppass", "imappass", "dbpass", "rootpass", "adminpass"}
)
# The general form of those: a qualifier glued to pass/pwd/passwd (keytool's ``-storepass``,
# ``-srcstorepass``, ``-keypass``, pam_ldap's ``rootbindpw``; ``sshpass``-style ``sudopass``,
# ``mailpwd``); ``bypass``, ``compass``, ``multipass`` have no such qualifier.
JOINED_PASSWORD = re.compile(
    r"(?:src|dest|new|old|cur|root)?(?:store|key|trust|root|admin|db|smtp|imap|pop|remote|local|"
    r"user|ssh|sudo|become|mail|ftp|proxy|vnc|master|bind|login|sys|web|ldap|redis|mysql|pg)"
    r"(?:pass|pwd|passwd|pw)"
)
SECRET_PARTS = frozenset(
    {
        "token",
        "secret",
        "secrets",  # webhook_secrets: a list of them
        "apikey",
        "credential",
        "credentials",
        "cred",
        "creds",
        "auth",
        "authtoken",
        "accesstoken",
        "secretkey",
        "privatekey",
        "sas",
        "signature",
        "sig",
        "salt",
    }
)
# Key names written in one lowercase word, which `_PARTS` cannot split (docker's
# ``config.json`` ``identitytoken``, ``accesstoken``).
JOINED_KEY_NAMES = (
    "apikey",
    "secretkey",
    "accesstoken",
    "authtoken",
    "identitytoken",
    "refreshtoken",
    "sessiontoken",
    "bearertoken",
    "apitoken",
)
KEY_QUALIFIERS = frozenset(
    {
        "api",
        "secret",
        "access",
        "private",
        "app",
        "master",
        "signing",
        "encryption",
        "client",
        "account",
        "license",
        "subscription",
        "service",
        "admin",
        "consumer",
        "shared",
        "deploy",
        "x",
        "session",
        "jwt",
        "hmac",
        "crypto",
        "cipher",
        "storage",
        "maps",
        "google",
    }
)
# "<x> key" names of keys that are not credentials: a database's, a cache's, a map's,
# a key pair's public half, a keyboard's.
DATA_KEY_QUALIFIERS = frozenset(
    {
        "public",
        "publishable",
        "pub",
        "primary",
        "foreign",
        "sort",
        "partition",
        "range",
        "hash",
        "cache",
        "lookup",
        "group",
        "idempotency",
        "dedup",
        "row",
        "object",
        "bucket",
        "dict",
        "map",
        "i18n",
        "translation",
        "label",
        "message",
        "sorting",
        "unique",
        "composite",
        "natural",
        "surrogate",
        "shortcut",
        "hot",
        "keyboard",
        "media",
        "state",
        "storage",
        "local",
        "cursor",
        "page",
        "next",
        "last",
        "start",
        "end",
        "continuation",
        "routing",
        "shard",
        "dataset",
        "column",
        "field",
        "attribute",
        "attr",
        "property",
        "prop",
        "config",
        "setting",
        "settings",
        "lang",
        "locale",
        "metric",
        "metrics",
        "event",
        "node",
        "parent",
        "child",
        "item",
        "list",
        "react",
        "render",
        "query",
        "request",
        "response",
        "result",
        "s3",
        "self",
        "this",
        "socket",
        "websocket",
    }
)
# Parts that make a name describe a secret rather than hold one (a path, a length, a type).
META_PARTS = frozenset(
    {
        "file",
        "files",
        "path",
        "dir",
        "url",
        "uri",
        "endpoint",
        "name",
        "names",
        "type",
        "env",
        "var",
        "field",
        "length",
        "len",
        "count",
        "max",
        "min",
        "id",
        "ids",
        "prefix",
        "header",
        "label",
        "format",
        "pattern",
        "re",
        "regex",
        "rx",
        "validator",
        "valid",
        "hint",
        "policy",
        "expiry",
        "expires",
        "expiration",
        "expire",
        "ttl",
        "timeout",
        "lifetime",
        "limit",
        "size",
        "kind",
        "mode",
        "hash",
        "hashed",
        "digest",
        "sha",
        "checksum",
        "confirmation",
        "confirm",
        "reset",
        "placeholder",
        "input",
        "prompt",
        "template",
        "message",
        "msg",
        "error",
        "required",
        "column",
        "next",
        "page",
        "cursor",
        "pagination",
        "continuation",
        "marker",
        "sync",
        "schema",
        "algorithm",
        "alg",
        "bits",
        "version",
        "public",
        "pub",
        "stdin",
        "command",
        "cmd",
        "provider",
        "manager",
        "vault",
        "location",
        "ref",
        "reference",
        "source",
        "strength",
        "rule",
        "rules",
        "old",
        "new",
        "change",
        "forgot",
        "retype",
        "repeat",
        "help",
        "text",
        "cache",
        "method",
        "methods",
        "scheme",
        "handler",
        "class",
        "style",
        "icon",
        "button",
        "link",
        "view",
        "form",
        "widget",
        "reader",
        "parser",
        "generator",
        "gen",
        "callback",
        "fn",
        "func",
        "is",
        "has",
        "use",
        "enable",
        "enabled",
        "disable",
        "show",
        "hide",
        "allow",
        "check",
        "verify",
        "test",
        "tests",
        "mock",
        "fake",
        "dummy",
        "example",
        "sample",
        "types",
        "spec",
        "state",
        "status",
        "tokens",
        "tokenizer",
        "usage",
        "budget",
        "rate",
        "window",
        "num",
        "index",
    }
)


@functools.lru_cache(maxsize=65536)
def name_kind(name: str) -> str | None:
    """``password``, ``key`` or None for a variable/key/flag/header name."""
    parts = [p.lower() for p in _PARTS.findall(name)]
    if not parts:
        return None
    low = name.lower()
    if parts[0] in ("set", "get", "with") and len(parts) > 1:
        parts = parts[1:]  # setPassword(...), withToken(...)
    if low in JOINED_PASSWORD_NAMES or (parts[0] == "source" and parts[1:] == ["password"]):
        return "password"  # MySQL's SOURCE_PASSWORD: the source's password, not its origin
    if any(p in META_PARTS for p in parts):
        return None
    if any(p in PASSWORD_PARTS for p in parts) or "password" in low or "passwd" in low:
        return "password"
    if any(JOINED_PASSWORD.fullmatch(p) for p in parts):
        return "password"
    if any(p in SECRET_PARTS for p in parts) or any(w in low for w in JOINED_KEY_NAMES):
        return "key"
    for i, p in enumerate(parts):
        if p == "key" and i > 0 and parts[i - 1] in KEY_QUALIFIERS:
            return "key"
    if len(parts) > 1 and parts[-1] == "key" and parts[-2] not in DATA_KEY_QUALIFIERS:
        return "key"  # analyticsKey, MAPBOX_KEY: a key by its name; the value is judged
    return None


# -- values ------------------------------------------------------------------------------
DOC_PASSWORDS = frozenset(
    {
        "changeme",
        "change_me",
        "changeit",
        "password",
        "passw0rd",
        "p@ssw0rd",
        "p@ssword",
        "hunter2",
        "foobared",  # redis.conf's example requirepass
        "secret",
        "s3cr3t",
        "mysecretpassword",
        "mypassword",
        "yourpassword",
        "example",
        "postgres",
        "root",
        "toor",
        "admin",
        "admin123",
        "administrator",
        "test",
        "test123",
        "testing",
        "123456",
        "1234",
        "12345",
        "12345678",
        "123456789",
        "qwerty",
        "letmein",
        "pass",
        "pass123",
        "password1",
        "password123",
        "foobar",
        "foo",
        "bar",
        "baz",
        "xxx",
        "guest",
        "default",
        "demo",
        "sample",
        "dummy",
        "welcome",
        "abc123",
        "secret123",
        "mysql",
        "oracle",
        "sa",
        "user",
        "username",
        "pwd",
        "passwd",
        "none",
        "null",
        "nil",
        "true",
        "false",
        "undefined",
        "str",
        "string",
        "int",
        "bytes",
        "bool",
        "required",
        "optional",
        "empty",
        "blank",
        "mypass",
        "mysecret",
        "supersecret",
        "topsecret",
        "redis",
        "rabbitmq",
        "guest123",
        "tiger",
        "scott",
        "qwerty123",
        "iloveyou",
        "monkey",
        "dragon",
        "sekret",
        "secretpassword",
        "dbpassword",
        "db_password",
        "the_password",
        "your_password",
        "new_password",
        "old_password",
        "str_password",
        "getpass",
        "input",
        "env",
        "self",
    }
)
PLACEHOLDER = re.compile(
    r"(?i)your[-_ ]?|example|dummy|placeholder|change.?me|x{4,}|\*{3,}|sample|fake|insert|"
    r"replace|redacted|todo|xmpl|<[^>]*>|\$\{|\$\(|\{\{|%\(\w*\)s|^%[sd]$|\.\.\.|^\$\w+$|^%\w+%$|"
    r"^\{[\w.]*\}$|sensitive\*data\*deleted|"  # the last: Windows' own unattend.xml mask
    r"\benv\b|getenv|environ|process\.env|secrets\.|vault:|^op://|^@|^<|^\[|"
    r"^!vault|^ENC\[|^ENC\(|^\{cipher\}|^(?:test|mock)[-_]|"
    r"(.)\1{5,}"
)
# A value that is a URL without userinfo (``sm://projects/p/secrets/s``, ``awssm://x``):
# a secret store's reference, not the secret (a provider-format match may still be a URL).
URL_REFERENCE = re.compile(r"[a-z][a-z0-9+.-]{1,20}://[^\s@]*$")
# A regex: a group construct, a class escape, a ranged class, a counted repeat, or
# both anchors (one anchor alone is a plausible password character).
REGEX_LIKE = re.compile(r"\(\?[=!:<i]|\\[dwsSWD]|\[[^\]]*-[^\]]*\]|\{\d+,\d*\}|^\^.*\$$")
PATH_LIKE = re.compile(
    r"^(?:/|~/|\./|\.\./|[A-Za-z]:\\)|^[a-z0-9_.-]+(?:/[a-z0-9_.-]+)+/?$|"
    r"^[\w.-]+\.(?:py|js|json|txt|pem|key|crt|cer|yaml|yml|env|ini|cfg|conf|"
    r"toml|xml|p12|pfx|jks|der|gpg|asc|secret|token)$"
)
IDENTIFIER = re.compile(
    r"^(?:[a-z]+(?:_[a-z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|"
    r"[a-z]+(?:[A-Z][a-z]+)*(?:\.[a-z]\w*)*|[a-z]+(?:-[a-z]+)+)$"
)
# Words in CamelCase, dotted or not (LastEvaluatedKey, InvalidationList.NextMarker): a name.
_WORD = r"(?:[A-Z][a-z]{2,}|[A-Z]{2,5}(?=[A-Z][a-z]|\.|$))"
_CAMEL = rf"(?:[a-z]{{2,}}|{_WORD})(?:{_WORD})*"
CAMEL_WORDS = re.compile(rf"^{_CAMEL}(?:\.{_CAMEL})*$")
# A schema's type in the value position (GraphQL ``password: String!``, ``token: [ID!]!``).
SCHEMA_TYPE = re.compile(r"^\[?(?:String|Int|Float|Boolean|ID|Bytes|JSON|Secret|Password)!?\]?!?$")
# The word "password" in other languages (i18n files: ``password: Passwort``) is a label.
PASSWORD_WORDS = frozenset(
    {
        "passwort", "kennwort", "contraseña", "contrasena", "wachtwoord", "mot de passe",
        "senha", "parola", "lösenord", "losenord", "adgangskode", "passord", "salasana",
        "hasło", "haslo", "heslo", "jelszó", "şifre", "sifre", "пароль", "κωδικός",
        "パスワード", "密码", "密碼", "비밀번호", "كلمة المرور", "סיסמה", "mật khẩu",
        "kata sandi", "katalaluan", "rahasia", "wagwoord", "lozinka", "geslo", "parool",
        "slaptažodis", "parole", "contrasenya", "pasahitza",
    }
)  # fmt: skip
# Password hashes (Django/passlib ``algo$...``, crypt(3) ``$id$...``, LDAP ``{SSHA}``): the
# stored form of a password, not the password (gitleaks and detect-secrets leave them).
PASSWORD_HASH = re.compile(
    r"^(?:(?:pbkdf2_sha\d+|pbkdf2|argon2|bcrypt(?:_sha256)?|scrypt|sha1|md5|crypt)\$|"
    r"\$(?:2[abxy]?|1|5|6|7|y|gy|apr1|argon2(?:id|i|d))\$|"
    r"\{(?:SSHA\d*|SHA\d*|SMD5|MD5|CRYPT|PBKDF2[\w-]*|ARGON2)\})"
)
_ENTROPY = Base64HighEntropyString()


def shannon_entropy(value: str) -> float:
    """detect-secrets' Shannon entropy in bits per character."""
    return float(_ENTROPY.calculate_shannon_entropy(value))


def is_reference_or_placeholder(value: str) -> bool:
    """A placeholder, documentation example, variable reference, regex or path."""
    v = value.strip()
    low = v.lower()
    if not v or low in DOC_PASSWORDS or PLACEHOLDER.search(v) or REGEX_LIKE.search(v):
        return True
    if EXAMPLE_JWT_PAYLOAD in v or any(sig in v for sig in EXAMPLE_JWT_SIGNATURES):
        return True
    if PATH_LIKE.search(v) or v.startswith(("http://", "https://")) or SCHEMA_TYPE.match(v):
        return True
    if low in PASSWORD_WORDS or PASSWORD_HASH.match(v):
        return True
    if URL_REFERENCE.match(v):
        return True
    return len(set(v)) <= 2


def password_value_ok(value: str, name: str = "") -> bool:
    """Whether a value assigned to a password name is a real-looking password."""
    v = value.strip()
    if not 4 <= len(v) <= 128 or " " in v or is_reference_or_placeholder(v):
        return False
    if name and v.lower() == name.lower():
        return False
    if IDENTIFIER.match(v) and (name_kind(v) is not None or "_" in v or "." in v):
        return False  # another variable: password=db_password, pwd=self.pw
    return not v.isdigit() or len(v) >= 8


def key_value_ok(value: str, hexbar: float = 3.0, b64bar: float = 4.0, min_hex: int = 32) -> bool:
    """Whether a value assigned to a key/token/secret name is secret-looking (entropy).
    ``min_hex``: the shortest all-hex value taken (an explicit secret name takes 20:
    Pusher's app secret)."""
    v = value.strip()
    if not 16 <= len(v) <= 1024 or is_reference_or_placeholder(v):
        return False
    if " " in v and not _spaced_key_ok(v):
        return False
    name = v.lstrip("_")  # _BoundaryOrderKey: a private name
    if IDENTIFIER.match(name) or CAMEL_WORDS.match(name) or not any(c.isalpha() for c in v):
        return False
    letters = [c for c in v if c.isalpha()]
    if (
        not any(c.isdigit() for c in v)
        and (v.islower() or v.isupper())
        and len(letters) == len(v.replace("-", "").replace("_", ""))
    ):
        return False  # one-case words (my-ssh-key, users_list): names, not secrets
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", v):
        v = v[2:]  # 0x-prefixed hex (an Ethereum private key): judged as its hex digits
    hexlike = re.fullmatch(r"[0-9a-fA-F]+", v) is not None
    if hexlike and len(v) < min_hex:
        return False  # under 128 bits of hex: ids and short hashes
    bar = min(hexbar if hexlike else b64bar, 0.8 * math.log2(len(v)))
    return shannon_entropy(v) >= bar


# A field named only ``key`` (``stripe.Client{Key: "..."}``, ``key = "..."``) is most often a
# lookup/cache/sort key, so its value alone decides: a random-looking token of 20+ characters
# mixing upper and lower case and digits, not hex (cache keys are hashes), no separators
# that make it a readable slug or a path.
BARE_KEY_NAMES = frozenset({"key", "Key", "KEY"})


def bare_key_value_ok(value: str) -> bool:
    v = value.strip()
    return (
        20 <= len(v) <= 256
        and re.fullmatch(r"[A-Za-z0-9_+/=-]+", v) is not None
        and re.fullmatch(r"[0-9a-fA-F-]+", v) is None
        and any(c.isupper() for c in v)
        and any(c.islower() for c in v)
        and sum(c.isdigit() for c in v) >= 3
        and v.count("-") + v.count("_") <= 2
        and key_value_ok(v)
        and shannon_entropy(v) >= 4.0
    )


def _spaced_key_ok(v: str) -> bool:
    """A long random value that happens to hold spaces (WordPress's salts draw from 92
    characters, the space one of them), not words: prose stays near 4 bits a character.
    (Over every character: detect-secrets' entropy counts only the base64 alphabet.)"""
    if len(v) < 40 or v.count(" ") > len(v) // 8:
        return False
    counts = collections.Counter(v).values()
    return -sum(c / len(v) * math.log2(c / len(v)) for c in counts) >= 5.0


def provider_value_ok(value: str) -> bool:
    """Filters for provider-format matches: example keys, jwt.io's token, weak legacy forms."""
    if PLACEHOLDER.search(value) or "EXAMPLE" in value:
        return False
    if value.startswith("eyJ") and (
        EXAMPLE_JWT_PAYLOAD in value or any(s in value for s in EXAMPLE_JWT_SIGNATURES)
    ):
        return False
    if value.startswith("s."):  # gitleaks' filter for the legacy Vault form
        body = value[2:]
        return shannon_entropy(body) > 3.5 and any(c.isdigit() for c in body) and not body.isalpha()
    return True


def twilio_auth_tokens(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, value) of quoted 32-hex auth tokens on a line with a Twilio SID."""
    if "AC" not in text:
        return
    for m in TWILIO_SID.finditer(text):
        if m.start() and (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_"):
            continue
        ls = text.rfind("\n", 0, m.start()) + 1
        le = text.find("\n", m.end())
        for t in TWILIO_TOKEN.finditer(text, ls, len(text) if le < 0 else le):
            if shannon_entropy(t.group(2)) >= 3.0:
                yield t.start(2), t.end(2), t.group(2)


# -- syntaxes ----------------------------------------------------------------------------
# A shell parameter expansion's error message or alternate value (``${NAME:?msg}``,
# ``${NAME:+alt}``); its default (``${NAME:-pw}``) is a value and is judged as one.
SHELL_NO_VALUE = re.compile(r":?[?+]")
# A quoted value holds any character but its own quote: WordPress salts hold backticks
# and the other quote (``'...`...'``).
_Q = r"""(?P<q>["'`])(?P<qv>(?:(?!(?P=q))[^\n]){1,1024})(?P=q)"""
_BARE = r"""(?P<bv>[^\s"'`<>\[\]{}|]{1,1024})"""
# String-literal prefixes: Python/Rust b"" r"" u"", C# @"" $"", Objective-C @"", C++ R"()".
_PREFIX = r"(?:[bruBRU]{1,2}|@|\$@?|L|u8)"
_VALUE = rf"(?:(?:{_PREFIX}|new String\(|String::from\(|[\w.]*getenv\([^)]*,\s*)?{_Q}|{_BARE})"
# The name-bearing syntaxes are matched from the end of a key-like name found by
# TRIGGER (a literal search on the lowered line), never by scanning every "x = y":
# name [quote/bracket] sep value: env, INI, YAML, export, properties, JSON, code, XML
# attributes, connection strings (Password=...;), JDBC/URL queries (&password=...).
# (`\"name\": \"x\"`: JSON inside a string literal; `NAME ?= x`: Makefile.)
ASSIGN_TAIL = re.compile(
    r"(?:\\?[\"'\]]){0,2}\s*(?P<sep>=>|:=|\?\?=|\?=|<-|=(?!=)|:(?!:)|->)\s*\\?" + _VALUE
)
# Type-annotated constants: Rust `API_KEY: &str = "x"`, TypeScript/Kotlin/Swift/Scala
# `apiKey: string = "x"`, Python `TOKEN: Final[str] = "x"` (a quoted value only).
# VB.NET's `Dim apiKey As String = "x"`.
# Also the literal wrapped in a constructor (pydantic's ``api_key: SecretStr =
# SecretStr("x")``, ``Field("x")``, ``Field(default="x")``) and C#'s property initialiser
# ``string Password { get; set; } = "x";``.
TYPED_TAIL = re.compile(
    r"""(?:\s*:\s*[\w.<>\[\]?&'| ]{1,40}?|\s+As\s+[\w.]{1,40}|"""
    r"""\s*\{\s*(?:(?:private\s+|protected\s+|internal\s+)?(?:get|set|init);\s*)+\})"""
    r"""\s*=(?!=)\s*(?:[A-Z]\w{0,40}\(\s*(?:default\s*=\s*)?)?""" + _PREFIX + "?" + _Q
)
# Dockerfile's legacy `ENV NAME value` (no `=`), C's `#define NAME "value"`, fish's
# `set -gx NAME value`, csh's `setenv NAME value`, Windows' `setx NAME value`.
ENV_SPACE_TAIL = re.compile(r"[ \t]+" + _VALUE)
# Also Tcl's `set name "value"` and Lisp's `(setq name "value")`, `(defvar name "value")`.
ENV_SPACE_HEAD = re.compile(
    r"(?:ENV|#define|setx|setenv|set(?:[ \t]+-[a-zA-Z]+)+)[ \t]*|[ \t]*set[ \t]+|"
    r"[ \t]*\((?:setq(?:-default)?|setf|defvar|defconst|defparameter|defcustom|define|def)[ \t]+"
)
# Config-file directives whose value is a password: redis.conf's `requirepass x` and
# `masterauth x` (the names are not key-like words).
DIRECTIVE = re.compile(
    r"""[ \t]*(?:requirepass|masterauth)(?:[ \t]+|["']\s*,\s*(?=["']))""" + _VALUE
)  # also argv as a list: ["redis-server", "--requirepass", "x"]
# YAML block scalars: ``password: |`` / ``token: >-`` and the value on the indented lines
# below (gitleaks' generic-api-key reads one line only; the value here is the block's).
YAML_BLOCK_TAIL = re.compile(r"""["']?[ \t]*:[ \t]*[|>][1-9]?[+-]?[1-9]?[ \t]*(?:#[^\n]*)?$""")
YAML_BLOCK_LINES = 32
# Setters: setPassword("x"), password.set("x"), withApiKey("x").
SETTER_TAIL = re.compile(r"(?:\.set|\.setValue)?\(\s*" + _Q + r"\s*\)")
# A flag's value as the next item of an argv list: ``"--requirepass", "x"``.
ARGV_TAIL = re.compile(r"""["']\s*,\s*""" + _Q)
# "name", "value" pairs: PHP define(), setenv(), .set("password", ...), env["NAME"] = "...".
# Kotlin's mapOf("password" to "x").
# (Not ``"MasterUserPassword", "ParameterValue": ...``: a string before ":" is the next key.)
PAIR_TAIL = re.compile(r"""["']\s*(?:,|\]\s*=|to(?=\s))\s*""" + _Q + r"(?![ \t]*:)")
# A declared option's default: click/argparse/typer ``("--token", default="x")``, Quarkus'
# ``@ConfigProperty(name = "api.key", defaultValue = "x")``, Micronaut/Spring ``defaultValue``.
DEFAULT_ARG_TAIL = re.compile(
    r"""["'][^()\n]{0,120}?\b(?:default|defaultValue|default_value)\s*[=:]\s*""" + _Q
)
# JAAS PlainLoginModule/DigestLoginModule options ``user_<name>="pw"`` (Kafka, ZooKeeper):
# each defines a user by its password; read in a file that names a LoginModule.
JAAS_USER = re.compile(r"""(?<![\w.])user_[\w-]{1,64}[ \t]*=[ \t]*""" + _Q)
JAAS_CONTEXT = 2048
# COBOL data items: ``01 WS-DB-PASSWORD PIC X(14) VALUE "x".``
COBOL_VALUE = re.compile(
    r"""(?i)[ \t]+PIC(?:TURE)?[ \t]+\S+[ \t]+VALUES?[ \t]+(?:IS[ \t]+)?""" + _Q
)
# Erlang/Elixir tuples: {db_password, "x"}, {:password, "x"}.
TUPLE_TAIL = re.compile(r"""\s*,\s*""" + _Q + r"\s*\}")
# Property lists: <key>ApiKey</key> <string>x</string> (the value is the next element).
PLIST_TAIL = re.compile(r"</key>\s*<string>(?P<bv>[^<>\s]{3,1024})</string>")
# An element named by an attribute: Android's <string name="api_key">x</string>.
NAMED_ELEMENT_TAIL = re.compile(
    r"""["'](?:\s+[\w:.-]+\s*=\s*["'][^"'<>]*["'])*\s*>(?P<bv>[^<>\s]{3,1024})</"""
)
# Proxy/server header directives: nginx ``proxy_set_header X-Auth-Token "x"``, HAProxy
# ``http-request set-header X-API-Key x``, Apache ``RequestHeader set X-Api-Key x``, Caddy
# ``header_up X-Api-Key x``: the header's name decides, the value follows a space.
HEADER_DIRECTIVE = re.compile(
    r"(?i)\b(?:proxy_set_header|add_header|more_set_(?:input_)?headers|set-header|add-header|"
    r"header_up|header_down|(?:Request)?Header[ \t]+(?:set|add|append|merge))[ \t]+"
    r"(?P<name>[\w-]{2,64}):?[ \t]+"
)
HEADER_VALUE = re.compile(r"[ \t]*(?:" + _Q + r"|" + _BARE + r")")
# Squid's cache_peer ... login=user:password.
SQUID_LOGIN = re.compile(r"\blogin=[^\s:=]+:(?P<bv>[^\s\"']+)")
# MySQL's SET PASSWORD [FOR user] = 'x' (or = PASSWORD('x'), the pre-8.0 form).
SQL_SET_PASSWORD = re.compile(
    r"(?i)\bSET\s+PASSWORD\s+(?:FOR\s+\S+\s*)?=\s*(?:PASSWORD\s*\(\s*)?" + _Q
)
# Gradle/Groovy DSL, SQL "PASSWORD 'x'": a name, spaces, then a quoted value.
DSL_TAIL = re.compile(r"[ \t]+" + _Q)
# Command-line flags: --password x, --token=x, -Password x.
FLAG_TAIL = re.compile(r"(?:=|[ \t]+)(?![-$])" + _VALUE)
# <password>x</password>, <apiKey>x</apiKey>
ELEMENT_TAIL = re.compile(r">(?P<bv>[^<>\s]{3,1024})</")
# Windows unattend.xml and XML settings: ``<Password>\n  <Value>x</Value>`` holds the value one
# element down from the password-named one (a sibling such as ``<PlainText>`` may come first).
XML_VALUE_CHILD = re.compile(
    r"<(?P<name>[\w.-]{1,64})>\s*(?:<(?P<sib>\w{1,32})>[^<>\n]{0,64}</(?P=sib)>\s*){0,2}"
    r"<Value>(?P<bv>[^<>\s]{3,1024})</Value>",
    re.IGNORECASE,
)
XML_VALUE_LOOKAHEAD = 512
# <add key="ApiKey" value="x"/>, <property name="db.password" value="x"/>
KEYVALUE_TAIL = re.compile(r"""["']\s+value\s*=\s*["'](?P<bv>[^"']{1,1024})["']""")
KEYVALUE_HEAD = re.compile(r"""\b(?:key|name)\s*=\s*["']$""")
TRIGGER = re.compile(r"pass|pwd|pw|psk|token|secret|key|cred|auth|sig|sas|salt")
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")
# .netrc: machine host login user password value
NETRC = re.compile(r"\blogin\s+\S+\s+password\s+(?P<bv>\S+)")
# .netrc written one token pair a line (the common layout): ``password x`` alone on its
# line, right after a ``login y`` / ``machine h`` / ``default`` line (a bare "password
# ..." line elsewhere is prose).
NETRC_PASSWORD_LINE = re.compile(r"[ \t]*password[ \t]+(?P<bv>\S+)[ \t]*$")
NETRC_PREVIOUS_LINE = re.compile(
    r"[ \t]*(?:(?:machine|login|account)[ \t]+\S+[ \t]*)+$|[ \t]*default[ \t]*$"
)
# ... in an entry that starts with ``machine h`` or ``default`` at most a few lines up.
NETRC_ENTRY = re.compile(r"(?:^|\n)[ \t]*(?:machine[ \t]+\S|default[ \t]*(?:\n|$))")
NETRC_ENTRY_LOOKBACK = 240
# Short -p/-a flags only for tools where they mean a password (mysql -pX, sshpass -p X,
# docker login -p X, redis-cli -a X).
SHORT_FLAG_TOOLS = re.compile(
    r"(?i)\b(?:mysql\w*|mariadb|sshpass|docker|podman|redis-cli|"
    r"mongo\w*|htpasswd|smbclient|sqlcmd|ftp|lftp|curl|wget|ldap\w+|psexec|paexec)\b|"
    r"(?<![\w.-])(?:zip|unzip|zipcloak|7z|7za|7zr)(?![\w.-])"  # the command, not a.zip
)
# Info-ZIP's password flag is -P only (unzip -p pipes to stdout).
ZIP_TOOLS = re.compile(r"(?i)(?<![\w.-])(?:zip|unzip|zipcloak)(?![\w.-])")
SHORT_FLAG = re.compile(r"(?<![\w-])-(?P<flag>[pPaw])[ \t]*" + _VALUE)
# HTTP auth schemes; Authorization's value is the scheme's credential.
AUTH_SCHEME = re.compile(
    r"(?i)\b(?P<scheme>Bearer|Token|Basic|Bot|SSWS|Digest|ApiKey|Key)[ \t]+"
    r"(?P<bv>[A-Za-z0-9._~+/=-]{16,})"
)
# Config directives whose value follows a space: msmtp/Cisco/HAProxy ``password x``,
# ``password 0 x`` (Cisco's type 0 is clear text), ``insecure-password x``; HAProxy's
# ``stats auth user:x``; Windows ``schtasks /RP x``, ``net use ... /user:name x``,
# ``sp_addlogin 'name', 'x'``; SQL ``OPTIONS (user 'u', password 'x')`` (foreign servers).
DIRECTIVE_PASSWORD = re.compile(
    r"(?im)(?:^[ \t]*|\busername[ \t]+\S+[ \t]+(?:privilege[ \t]+\d+[ \t]+)?)"
    r"password[ \t]+(?:0[ \t]+)?(?P<bv>[^\s\"']+)[ \t]*$"
)
INSECURE_PASSWORD = re.compile(r"\binsecure-password[ \t]+(?P<bv>\S+)")
STATS_AUTH = re.compile(r"\bstats[ \t]+auth[ \t]+[^\s:]+:(?P<bv>\S+)")
SCHTASKS_RP = re.compile(r"(?i)(?<![\w-])/RP[ \t]+(?:" + _Q + r"|(?P<bv>[^\s/\"'*]\S*))")
NET_USE = re.compile(r"(?i)\bnet[ \t]+use\b[^\n]*?/user:\S+[ \t]+(?P<bv>[^\s/\"'*]\S*)")
SP_ADDLOGIN = re.compile(
    r"(?i)\bsp_addlogin\s+(?:@\w+\s*=\s*)?N?'[^']*'\s*,\s*(?:@\w+\s*=\s*)?N?" + _Q
)
SQL_OPTIONS_PASSWORD = re.compile(r"(?i)\bOPTIONS\s*\([^)]*?\bpassword\s+" + _Q)
# Chat webhooks: the URL's secret part (Teams' IncomingWebhook/<hex>/<guid>, Mattermost's
# /hooks/<26 lowercase>, Zapier's hooks/catch/<id>/<token>). Read on URL lines ("://" is a
# secret word), not as provider formats: a lookbehind gives those no literal to gate on.
WEBHOOKS = (
    re.compile(r"/IncomingWebhook/(?P<bv>[0-9a-f]{32}/[0-9a-f-]{36})"),
    re.compile(r"/hooks/(?P<bv>(?=[a-z]*\d)[a-z0-9]{26})(?![\w-])"),
    re.compile(r"hooks\.zapier\.com/hooks/catch/(?P<bv>\d+/[A-Za-z0-9]{6,})"),
)
# Keys passed to signing calls: jwt.encode(payload, "k"), jwt.sign(p, 'k'), hmac.new(b"k",
# ...), crypto.createHmac('sha256', 'k'), Fernet(b"k"): the literal is the signing secret.
SIGNING_CALL = re.compile(
    r"\b(?:jwt\.(?:encode|sign)\([^,()\n]+(?:\([^()\n]*\))?[^,()\n]*,|"
    r"hmac\.new\(|createHmac\(\s*['\"][\w-]+['\"]\s*,|Fernet\()\s*"
    r"(?:[bB])?" + _Q
)
# A password piped into a program that reads it from stdin: ``echo pw | sudo -S cmd``,
# ``echo pw | passwd --stdin bob``, ``printf 'pw' | docker login -u x --password-stdin``,
# ``(echo pw; echo pw) | smbpasswd -s -a bob``; and ``echo 'bob:pw' | chpasswd`` (the
# part after the user).
_STDIN_READER = (
    r"(?:sudo\b[^|\n]*?[ \t]-\w*S\b|passwd\b[^|\n]*--stdin\b|smbpasswd\b[^|\n]*[ \t]-\w*s\b"
    r"|(?:docker|podman|nerdctl|buildah|skopeo|helm|oras)\b[^|\n]*--password-stdin\b)"
)
_ECHO = r"\b(?:echo|printf)(?:[ \t]+-[neE]+)*[ \t]+"
_PIPE = r"(?:[ \t]*;[^)\n]*\))?[ \t]*\|[ \t]*(?:sudo[ \t]+)?"
STDIN_PASSWORD = re.compile(
    _ECHO + r"(?:" + _Q + r"|(?P<bv>[^\s|;&\"'`()][^\s|;&()]*))" + _PIPE + _STDIN_READER
)
CHPASSWD = re.compile(
    _ECHO + r"[\"']?[\w.-]{1,64}:(?P<bv>[^\s|\"':]{1,256})[\"']?" + _PIPE + r"chpasswd\b"
)
# expect(1): ``send "pw\r"`` right after an ``expect`` line that waits for a password prompt.
EXPECT_SEND = re.compile(r"[ \t]*(?:exp_)?send(?:[ \t]+--)?[ \t]+" + _Q)
EXPECT_PROMPT = re.compile(r"(?i)\bexpect\b[^\n]*(?:assword|passphrase|pin\b)")
PORT_MAP = re.compile(r"[ \t]*[\d.]*\d:[\d.:]+(?:/(?:tcp|udp))?")
# A default behind an environment lookup: process.env.JWT_SECRET || 'x' (or ?? 'x'),
# env::var("API_KEY").unwrap_or("x") / .unwrap_or_else(|_| "x".to_string()).
ENV_FALLBACK = (
    re.compile(r"process\.env\.(?P<name>\w+)\s*(?:\|\||\?\?)\s*" + _Q),
    re.compile(r"env::var\(\s*\"(?P<name>\w+)\"\s*\)\s*\.unwrap_or(?:_else\(\s*\|_\|)?\(?\s*" + _Q),
)
# Prose: "the admin password is x", "log in with password `x`", "token for the sandbox: x"
# (a colon only after other words: ``password: x`` itself is an assignment, judged by name).
# The value must look generated (letters of both cases and a digit, or a key's entropy).
PROSE_SECRET = re.compile(
    r"(?i)\b(?P<w>password|passphrase|token)\b(?:[ \t]+[\w'-]+){0,4}?"
    r"(?:[ \t]+(?:is|was)[ \t]+|(?<=[\w'-])(?<!password)(?<!passphrase)(?<!token):[ \t]+|"
    r"(?<=password)[ \t]+(?=`))"
    r"[`'\"]?(?P<bv>[^\s`'\"]{8,128})"
)
# Positional passwords of CLI tools: htpasswd -b file user PASSWORD, chpasswd "user:PW",
# mosquitto_passwd -b file user PASSWORD, rabbitmqctl add_user/change_password user PASSWORD,
# Windows' net user NAME PASSWORD /add.
_POS_PW = r"""(?:(?P<q>["'])(?P<qv>[^"'\n]{1,256})(?P=q)|(?P<bv>[^\s"'*/][^\s]*))"""
CLI_POSITIONAL = re.compile(r"\bhtpasswd\s+-\w*b\w*\s+(?:-\w+\s+)*\S+\s+\S+\s+(?P<bv>\S+)")
CLI_POSITIONALS = (
    (re.compile(r"\bmosquitto_passwd\s+-b\s+\S+\s+\S+\s+" + _POS_PW), "mosquitto_passwd"),
    (
        re.compile(r"\brabbitmqctl\s+(?:-\S+\s+)*(?:add_user|change_password)\s+\S+\s+" + _POS_PW),
        "rabbitmqctl",
    ),
    (re.compile(r"(?i)\bnet\s+user\s+[^\s/]+\s+" + _POS_PW + r"(?=[^\n]*/add\b)"), "net user"),
)
# JSON Web Keys: the private members (RFC 7518: RSA d/p/q/dp/dq/qi, EC d, symmetric k) of
# the object around a "kty" member (read from that line; a JWK's members are flat);
# n/e/x/y are public.
JWK_PRIVATE = re.compile(r'"(?:d|p|q|dp|dq|qi|k)"\s*:\s*"(?P<bv>[A-Za-z0-9_-]{16,})"')
JWK_CONTEXT = 4096
# Words that mark a line for the rules above beyond ``pii_scan.SECRET_WORDS`` (lines with
# none of those words: ``rabbitmqctl add_user u pw``, ``net user u pw /add``, a JWK).
# (Oracle's ``user/pw@db`` after sqlplus/sqlldr/expdp/impdp/rman/dgmgrl; ``connect ... user u
# using pw`` lines have "connect" already; bare ``exp``/``imp``/``sql`` and " using " would
# add thousands of prose and code lines to scan.)
SECRET_LINE_WORDS = (
    "rabbitmqctl", "net user", '"kty"', "sqlplus", "sqlldr", "expdp", "impdp", "rman ",
    "dgmgrl", "userid=", '"raw"', "user_",
)  # fmt: skip
ORACLE_WORDS = re.compile(
    r"sqlplus|sqlldr|expdp|impdp|\bexp |\bimp |rman |dgmgrl|\bsql |userid=|conn"
)
# Records that hold a setting as a name and a value field: Kubernetes/Azure Pipelines
# ``- name: DB_PASSWORD`` / ``value: x``, ECS ``{"name": ..., "value": ...}``, Postman's
# ``{"key": ..., "value": ...}``, CloudFormation's ParameterKey/ParameterValue.
RECORD_NAME_HEAD = re.compile(
    r"""(?<![\w-])["']?(?:name|Name|NAME|key|Key|KEY|ParameterKey|OptionName)["']?\s*[:=]\s*["']?$"""
)
RECORD_FIELD = re.compile(
    r"""(?<![\w-])["']?(?P<f>name|Name|NAME|key|Key|KEY|ParameterKey|OptionName|"""
    r"""value|Value|VALUE|ParameterValue|OptionValue)["']?[ \t]*[:=][ \t]*"""
)
RECORD_VALUE = re.compile(r"[ \t]*" + _VALUE)
RECORD_LOOKAHEAD = 400
# Query strings: ?access_token=x&...
QUERY = re.compile(r"[?&](?P<name>[\w.-]{1,40})=(?P<bv>[^&\s\"'<>)`]{8,})")
QUERY_KEY_NAMES = frozenset({"key", "sig"})
# URL userinfo, with or without a user: scheme://user:pass@host, redis://:pass@host; the
# host may be a template (f"...@{host}", "...@${DB_HOST}", "...@%(host)s").
USERINFO = re.compile(
    r"\b[a-z][\w+.-]{1,20}://(?P<u>[^:/?#@\s\"']*):(?P<bv>[^\s/\"']{1,128})@"
    r"(?=[\w\[{$%])"
)
# curl -u user:password, curl --user 'user:password'
CURL_USER = re.compile(r"""(?<![\w-])(?:-u|--user)(?:=|[ \t]+)["']?[^\s:"'$]+:(?P<bv>[^\s"'@]+)""")
GO_DSN = re.compile(r"(?<![\w/])[\w.-]+:(?P<bv>[^@\s:/\"']{1,128})@(?:tcp|unix)\(")
IDENTIFIED_BY = re.compile(
    r"(?i)\bidentified\s+(?:with\s+\w+\s+)?by\s+(?:password\s+)?"
    r"(?:" + _Q + r"|(?P<bv>[^\s;'\"]+))"
)
# Calls that take credentials positionally; name -> index of the password argument
# (2-argument calls: the second; longer ones: the third: host/url/dsn, user, password).
LOGIN_CALL = re.compile(
    r"(?i)(?:\b|_)(?:set_?)?(?P<fn>login|logon|signin|sign_in|auth|authenticate|"
    r"basicauth|httpbasicauth|httpdigestauth|plainauth|\w*credentials?|"
    r"networkcredential|bind|bind_s|simple_bind|simple_bind_s|connect|"
    r"mysqli_connect|mysql_connect|pg_connect|getconnection|pdo|"
    r"passwordauthentication|usernamepasswordcredentials|set_password)\s*\(|"
    r"\bauth\s*=\s*\("
)
# SQL's `CREATE USER name PASSWORD 'x'` / `ALTER ROLE name PASSWORD 'x'` (no WITH).
SQL_USER = re.compile(r"(?i)\b(?:user|role)\s+[\w\"`.@'%-]{1,64}$")
# PowerShell: ConvertTo-SecureString "x" -AsPlainText (a plain-text password made secure).
SECURE_STRING = re.compile(
    r"(?i)\bConvertTo-SecureString\s+(?:-String\s+)?" + _Q + r"(?=[^\n]*-AsPlainText)"
)
# Samba tools' `-U user%password`.
SMB_USER = re.compile(
    r"""(?<![\w-])(?:-U|--user(?:name)?)(?:=|[ \t]+)["']?[^\s%"']+%(?P<bv>[^\s"']+)"""
)
# A value that is not on the name's line: TOML/Python triple-quoted strings (``key = '''x'''``,
# ``token = """`` then the value on the next line) and a value continued on the next,
# deeper-indented line (INI/configparser ``password =`` then ``    x``, YAML's plain
# multi-line scalar ``password:`` then ``  x``). One token only: a mapping (``k: v``), a
# list item or a sentence below the name is no value.
TRIPLE_HEAD = re.compile(r"""["']?[ \t]*(?:=|:)[ \t]*(?P<tq>'''|\"\"\")""")
SEP_AT_END = re.compile(r"""["']?[ \t]*(?:=|:)[ \t]*$""")
CONTINUATION = re.compile(r"""[ \t]+(?P<bv>[^\s"'`<>\[\]{}|#;-][^\s"'`<>\[\]{}|]{0,1023})[ \t]*$""")
# Config directives ``name value`` with a secret name and one value on the line (OpenLDAP's
# ``rootpw x``, nslcd's ``bindpw x``, ldap.conf's ``BINDPW x``, like redis' ``requirepass``):
# only the two tokens, the value generated-looking (a digit or symbol, not a word).
_INDENT = re.compile(r"[ \t]*")
# A list of values under a secret name: YAML/TOML/JSON ``keys: [a, b]`` and a YAML block
# sequence (``webhook_secrets:`` then ``  - a`` lines); each item is judged as a value.
LIST_FLOW = re.compile(r"""["']?[ \t]*[:=][ \t]*\[(?P<items>[^\[\]\n]{1,2048})\][ \t]*,?[ \t]*$""")
LIST_ITEM = re.compile(
    r"""[ \t]*-[ \t]+(?P<q>["']?)(?P<bv>[^\s"'#:,\[\]{}]{1,1024})(?P=q)[ \t]*$"""
)
LIST_ITEMS_MAX = 64
NAME_SPACE_VALUE = re.compile(
    r"""[ \t]+(?P<bv>[^\s"'`<>=:#;\[\]{}|][^\s"'`<>=:\[\]{}|]{3,1023})[ \t]*(?:[#;][^\n]*)?$"""
)
# Oracle tools' ``user/password[@connect]`` login argument: sqlplus, sqlldr, expdp/impdp,
# exp/imp, rman target/catalog, dgmgrl, SQLcl, and ``userid=``/``connect`` forms; after the
# words that are also prose (exp, imp, sql, connect: ``sql reader/writer``) only with the
# ``@connect`` part.
ORACLE_LOGIN = re.compile(
    r"(?im)(?:\b(?P<tool>sqlplus|sqlldr|expdp|impdp|exp|imp|rman|dgmgrl|sql)(?:[ \t]+-\w+)*"
    r"(?:[ \t]+(?:target|catalog|auxiliary))?|\buserid=|^[ \t]*(?P<tool2>conn)(?:ect)?)"
    r"[ \t]*=?[ \t]*"
    r"[\"']?[\w$#]{1,64}/(?P<bv>[^\s@/\"']{1,128})(?=@|[\"']|[ \t]|$)"
)
# ``... user NAME using PASSWORD`` (DB2's CONNECT TO, Informix, ODBC-style CLIs).
USER_USING = re.compile(r"(?i)\buser[ \t]+\S+[ \t]+using[ \t]+(?:" + _Q + r"|(?P<bv>[^\s;\"']+))")
# A ``user:password`` pair as the value of an auth-named key (HTTPie sessions'
# ``"auth": {"type": "basic", "raw": "u:pw"}``, ``basic_auth: u:pw``, ``"credentials": "u:pw"``).
AUTH_PAIR = re.compile(
    r"""(?i)["']?(?P<n>raw|auth|basic_?auth|http_?auth|credentials?|userpass|user_?pass)["']?"""
    r"""[ \t]*[:=][ \t]*["']?[^\s"':@/]{1,64}:(?P<bv>[^\s"'@]{4,128})["']?"""
)
# A string argument may be converted in place: "pw".toCharArray(), "k".encode(), .getBytes().
_STR = re.compile(r"""\s*(?:[bru]?(["'])((?:(?!\1).){0,256})\1(?:\.\w+\(\s*\))*|([^,()"']*))\s*""")


# A call, a dotted name, or a PowerShell cmdlet (`$pw = ConvertTo-SecureString ...`).
# A dotted name's parts start with a letter: ``self.pw`` is code, a kubeadm bootstrap
# token ``7daufe.1yj2hsmmls6pzfbe`` is not.
_CALL_LIKE = re.compile(
    r"^[\w.:]+\(|^[A-Za-z_]\w*(?:(?:\.|::)[A-Za-z_]\w*)+$|"
    r"^(?:Get|Set|New|Read|Invoke|ConvertTo|ConvertFrom|Import|Export|Join|Out|Format)"
    r"-[A-Z][A-Za-z]+$"
)


def _value(m: re.Match[str], query: bool = False) -> tuple[str, int, int, bool] | None:
    """(value, start, end, quoted) of a match's value group.

    A bare value ends at ``;`` (connection strings), at ``&`` in a query string, and
    loses trailing ``,)`` (argument lists); a bare call or dotted name is code.
    """
    gd = m.groupdict()
    if gd.get("qv") is not None:
        v, start = m.group("qv"), m.start("qv")
        if m.group("q") == "`" and ('"' in v or "'" in v):
            return None  # a Markdown code span quoting code (Pass `"tanh"`), not a value
        before = m.string[m.start("q") - 1 : m.start("q")]
        if v.endswith("\\") and before == "\\":
            v = v[:-1]  # \"value\" inside a string literal
        elif m.group("q") == '"' and (len(v) - len(v.rstrip("\\"))) % 2:
            # "ab\"cd": an escaped quote inside the value, which runs to the next unescaped "
            txt, i = m.string, m.end("qv") + 1
            while i < len(txt) and txt[i] not in '"\n':
                i += 2 if txt[i] == "\\" else 1
            if i < len(txt) and txt[i] == '"':
                v = txt[start:i]
        elif before == "R" and len(v) > 2 and v[0] == "(" and v[-1] == ")":
            v, start = v[1:-1], start + 1  # C++ raw string R"(value)"
        return v, start, start + len(v), True
    if gd.get("bv") is None:
        return None
    v, start = m.group("bv"), m.start("bv")
    before = m.string[max(0, m.start() - 1) : m.start()]
    cut = [v.find(";")] + ([v.find("&")] if query or before in ("?", "&") else [])
    cut = [c for c in cut if c >= 0]
    if cut:
        v = v[: min(cut)]
    v = v.rstrip(",);:")
    if not v or _CALL_LIKE.match(v):
        return None
    return v, start, start + len(v), False


def _args(text: str, pos: int, end: int) -> list[tuple[str, int, int, bool]]:
    """Top-level arguments of a call whose "(" ends at ``pos`` (same line)."""
    out = []
    i = pos
    while i < end:
        m = _STR.match(text, i, end)
        if m is None or (m.end() == i and i < end and text[i] not in ",)"):
            return []
        if m.group(2) is not None:
            out.append((m.group(2), m.start(2), m.end(2), True))
        else:
            out.append((m.group(3).strip(), m.start(3), m.end(3), False))
        i = m.end()
        if i >= end or text[i] == ")":
            break
        if text[i] != ",":
            return []  # a nested call or expression: too complex to read positionally
        i += 1
    return out


Hit = tuple[str, int, int, str]  # kind, start, end, value


def find_secrets(text: str, lines: list[tuple[int, int]]) -> Iterator[Hit]:
    """Keyed, flag, header, query, DSN, call and keyword-less secrets on the given lines."""
    for s, e in lines:
        yield from _line_secrets(text, s, e)


def _line_secrets(text: str, s: int, e: int) -> Iterator[Hit]:
    line = text[s:e]
    low = line.lower()
    yield from _named_secrets(text, s, e, low)
    if ("-p" in low or "-a" in low or "-w" in low) and SHORT_FLAG_TOOLS.search(line):
        for m in SHORT_FLAG.finditer(text, s, e):
            if m.group("flag") == "a" and "redis" not in low:
                continue
            if m.group("flag") == "w" and "ldap" not in low:
                continue  # -w is a password for ldapsearch/ldapmodify/... only
            if (
                m.group("flag") != "P"
                and ZIP_TOOLS.search(line)
                and not SHORT_FLAG_TOOLS.search(ZIP_TOOLS.sub("", line))
            ):
                continue
            if PORT_MAP.fullmatch(m.group(0), 2):
                continue  # docker run -p 5432:5432: a port mapping
            yield from _judge("password", _value(m), "")
    for rx, needle in (
        (USERINFO, "://"),
        (GO_DSN, "@tcp("),
        (GO_DSN, "@unix("),
        (NETRC, "login"),
        (IDENTIFIED_BY, "identified"),
        (CLI_POSITIONAL, "htpasswd"),
        *CLI_POSITIONALS,
        (CURL_USER, "curl"),
        (SMB_USER, "%"),
        (DIRECTIVE, "requirepass"),
        (DIRECTIVE, "masterauth"),
        (SECURE_STRING, "convertto-securestring"),
        (INSECURE_PASSWORD, "insecure-password"),
        (STATS_AUTH, "stats"),
        (SCHTASKS_RP, "/rp"),
        (NET_USE, "/user:"),
        (SP_ADDLOGIN, "sp_addlogin"),
        (SQL_OPTIONS_PASSWORD, "options"),
        (SQUID_LOGIN, "login="),
        (SQL_SET_PASSWORD, "set password"),
        (USER_USING, " using "),
    ):
        if needle in low:
            for m in rx.finditer(text, s, e):
                yield from _judge("password", _value(m), "")
    if (
        "user_" in low
        and JAAS_USER.search(text, s, e)  # before the context's copy: most user_ are code
        and "loginmodule" in text[max(0, s - JAAS_CONTEXT) : e].lower()
    ):
        for m in JAAS_USER.finditer(text, s, e):
            yield from _judge("password", _value(m), "")
    if "/" in line and ORACLE_WORDS.search(low):
        for m in ORACLE_LOGIN.finditer(text, s, e):
            tool = (m.group("tool") or m.group("tool2") or "").lower()
            if tool in ("exp", "imp", "sql", "conn") and text[m.end() : m.end() + 1] != "@":
                continue
            yield from _judge("password", _value(m), "")
    if "auth" in low or "cred" in low or "userpass" in low or '"raw"' in low:
        for m in AUTH_PAIR.finditer(text, s, e):
            if m.group("n").lower() != "raw" or "auth" in text[max(0, s - 240) : m.start()].lower():
                yield from _judge("password", _value(m), "")
    if "echo" in low or "printf" in low:
        for rx in (STDIN_PASSWORD, CHPASSWD):
            for m in rx.finditer(text, s, e):
                val = _escaped_line_end(_value(m))
                if val is None:
                    continue
                # typed twice to confirm: (echo pw; echo pw) | ..., printf 'pw\npw\n' | ...
                v, quoted, at = val[0], val[3], val[1]
                while at >= 0:
                    yield from _judge("password", (v, at, at + len(v), quoted), "")
                    at = text.find(v, at + len(v), m.end())
    if "send" in low and (m := EXPECT_SEND.match(text, s, e)):
        prev_end = max(s - 1, 0)
        if s > 0 and EXPECT_PROMPT.search(text, text.rfind("\n", 0, prev_end) + 1, prev_end):
            yield from _judge("password", _escaped_line_end(_value(m)), "")
    if "password" in low and (m := DIRECTIVE_PASSWORD.match(text, s, e)):
        val = _value(m)
        if val and not val[0].isalpha():  # "password required" is prose, not a directive
            yield from _judge("password", val, "")
    if "password" in low and (m := NETRC_PASSWORD_LINE.fullmatch(text, s, e)):
        prev_end = max(s - 1, 0)
        prev_start = text.rfind("\n", 0, prev_end) + 1
        if (
            s > 0
            and NETRC_PREVIOUS_LINE.fullmatch(text, prev_start, prev_end)
            and NETRC_ENTRY.search(text, max(0, s - NETRC_ENTRY_LOOKBACK), s)
        ):
            yield from _judge("password", _value(m), "")
    authish = "auth" in low
    if authish or "bearer" in low:
        for m in AUTH_SCHEME.finditer(text, s, e):
            v, scheme = m.group("bv"), m.group("scheme").lower()
            if scheme != "bearer" and not authish:
                continue  # "token abc..." in prose; Authorization: Token abc... is a header
            if key_value_ok(v) or (
                scheme == "basic" and len(v) >= 12 and not is_reference_or_placeholder(v)
            ):
                yield "key", m.start("bv"), m.end("bv"), v
    if ("?" in line or "&" in line) and "=" in line:
        for m in QUERY.finditer(text, s, e):
            name = m.group("name")
            kind = "key" if name.lower() in QUERY_KEY_NAMES else name_kind(name)
            yield from _judge(kind, _value(m, query=True), name)
    if any(w in low for w in LOGIN_WORDS):
        yield from _login_calls(text, s, e)
    if "password" in low or "passphrase" in low or "token" in low:
        for m in PROSE_SECRET.finditer(text, s, e):
            val = _value(m)
            if val is None:
                continue
            v = val[0].rstrip(".")
            val = (v, val[1], val[1] + len(v), False)
            if m.group("w").lower() == "token":
                yield from _judge("key", val, "token")
            elif _generated(v):
                yield from _judge("password", val, "")
    if "process.env." in low or "env::var(" in low:
        for rx in ENV_FALLBACK:
            for m in rx.finditer(text, s, e):
                name = m.group("name")
                yield from _judge(name_kind(name), _value(m), name)
    if "jwt." in low or "hmac" in low or "fernet(" in low:
        for m in SIGNING_CALL.finditer(text, s, e):
            yield from _judge("key", _value(m), "secret")
    if "hooks" in low or "incomingwebhook" in low:
        for rx in WEBHOOKS:
            for m in rx.finditer(text, s, e):
                yield "key", m.start("bv"), m.end("bv"), m.group("bv")
    if "header" in low:
        for m in HEADER_DIRECTIVE.finditer(text, s, e):
            name = m.group("name")
            if name.lower() != "authorization":  # AUTH_SCHEME reads "Scheme credential"
                yield from _judge(name_kind(name), _value_at(HEADER_VALUE, text, m.end(), e), name)
    if (kty := line.find('"kty"')) >= 0:
        at = s + kty
        lo, hi = text.rfind("{", max(0, at - JWK_CONTEXT), at), text.find("}", at, at + JWK_CONTEXT)
        if lo >= 0 and hi >= 0:
            for m in JWK_PRIVATE.finditer(text, lo, hi):
                yield from _judge("key", _value(m), "private_key")
    if "variable" in low and (m := HCL_VARIABLE.match(text, s, e)):
        name = m.group("name")
        yield from _judge(name_kind(name), _hcl_variable_default(text, m.end()), name)


def _escaped_line_end(
    val: tuple[str, int, int, bool] | None,
) -> tuple[str, int, int, bool] | None:
    """A value up to its first escaped line end (``pw\\r``, ``pw\\npw\\n``): what is typed."""
    if val is None:
        return None
    v, start, _, quoted = val
    cut = min((i for i in (v.find("\\r"), v.find("\\n")) if i >= 0), default=len(v))
    return (v[:cut], start, start + cut, quoted) if cut else None


def _generated(v: str) -> bool:
    """Letters of both cases and a digit, not a name: a password written in prose."""
    return (
        any(c.isupper() for c in v)
        and any(c.islower() for c in v)
        and any(c.isdigit() for c in v)
        and not IDENTIFIER.match(v)
        and not CAMEL_WORDS.match(v)
    )


LOGIN_WORDS = (
    "login", "logon", "sign", "auth", "credential", "bind", "connect", "pdo", "set_password"
)  # fmt: skip


def _login_calls(text: str, s: int, e: int) -> Iterator[Hit]:
    for m in LOGIN_CALL.finditer(text, s, e):
        close = text.find(")", m.end(), e)
        args = _args(text, m.end(), e if close < 0 else close + 1)
        positional = [
            a for a in args if "=" not in text[a[1] - 1 : a[1]] and not (not a[3] and "=" in a[0])
        ]
        if len(positional) < 2 or (len(positional) != len(args) and len(positional) < 3):
            continue
        pw = positional[1] if len(positional) == 2 else positional[2]
        if pw[3]:
            yield from _judge("password", pw, "")


def _named_secrets(text: str, s: int, e: int, low: str) -> Iterator[Hit]:
    """Values of key-like names: each TRIGGER hit is widened to its name, then the
    syntaxes that can follow a name are tried at its end (``re.match``, no scan)."""
    seen: set[int] = set()
    has_default, has_pic = "default" in low, "pic" in low  # once a line, not once a name
    for t in TRIGGER.finditer(low):
        a, b = s + t.start(), s + t.end()
        while a > s and text[a - 1] in _NAME_CHARS:
            a -= 1
        while b < e and text[b] in _NAME_CHARS:
            b += 1
        if b in seen:
            continue
        seen.add(b)
        dashes = a
        while a < b and text[a] in "-.":
            a += 1  # --password: the dashes mark a flag, not the name
        name = text[a:b]
        kind = name_kind(name)
        before = text[a - 1] if a > s else ""
        if kind is None:
            if name in BARE_KEY_NAMES:  # Client{Key: "..."}: judged by its value alone
                for tail in (ASSIGN_TAIL, TYPED_TAIL):
                    val = _value_at(tail, text, b, e)
                    if val and bare_key_value_ok(val[0]):
                        yield "key", val[1], val[2], val[0]
            continue
        if before == "{" and text[a - 2 : a] == "${" and SHELL_NO_VALUE.match(text, b, e):
            continue  # ${DB_PASSWORD:?set it}: a message for an unset variable, no value
        if before == "-":
            yield from _judge(kind, _value_at(FLAG_TAIL, text, b, e), name)
            if dashes > s and text[dashes - 1] in "\"'":
                # ["redis-server", "--requirepass", "x"]: argv as a list, the value the next item
                yield from _judge(kind, _value_at(ARGV_TAIL, text, b, e), name)
                if has_default:  # add_argument("--db-password", default="x")
                    yield from _judge(kind, _value_at(DEFAULT_ARG_TAIL, text, b, e), name)
            continue
        if name.lower() != "authorization":  # "Scheme credential": AUTH_SCHEME reads it
            in_query = before in ("?", "&")  # ?api_key=x&page=2: the value ends at "&"
            yield from _judge(kind, _value_at(ASSIGN_TAIL, text, b, e, in_query), name)
            yield from _judge(kind, _value_at(TYPED_TAIL, text, b, e), name)
            if YAML_BLOCK_TAIL.match(text, b, e):
                yield from _judge(kind, _yaml_block(text, s, e), name)
            elif (m := TRIPLE_HEAD.match(text, b, e)) or SEP_AT_END.match(text, b, e):
                yield from _judge(kind, _next_line_value(text, s, e, m), name)
                if m is None:
                    for val in _list_items(text, s, e, None):
                        yield from _judge(kind, val, name)
            elif m := LIST_FLOW.match(text, b, e):
                for val in _list_items(text, s, e, m):
                    yield from _judge(kind, val, name)
        if _INDENT.match(text, s, a).end() == a and (m := NAME_SPACE_VALUE.match(text, b, e)):
            # ``bindpw x``: the name first on its line (no copy of a long line), then one value
            val = _value(m)
            if val and (kind == "key" or not val[0].isalnum() or _generated(val[0])):
                yield from _judge(kind, val, name)
        if a - s <= 24 and ENV_SPACE_HEAD.fullmatch(text, s, a):
            yield from _judge(kind, _value_at(ENV_SPACE_TAIL, text, b, e), name)
        yield from _judge(kind, _value_at(SETTER_TAIL, text, b, e), name)
        if before in "\"'":
            yield from _judge(kind, _value_at(PAIR_TAIL, text, b, e), name)
            if has_default:
                yield from _judge(kind, _value_at(DEFAULT_ARG_TAIL, text, b, e), name)
            if KEYVALUE_HEAD.search(text, max(s, a - 12), a):
                yield from _judge(kind, _value_at(KEYVALUE_TAIL, text, b, e), name)
                yield from _judge(kind, _value_at(NAMED_ELEMENT_TAIL, text, b, e), name)
        elif before == ">" and text.endswith("<key>", max(s, a - 5), a):
            yield from _judge(kind, _value_at(PLIST_TAIL, text, b, min(len(text), e + 256)), name)
        elif before == "<":
            m = ELEMENT_TAIL.match(text, b, e)
            if m is None:  # <Password>\n  <Value>x</Value>
                m = XML_VALUE_CHILD.match(text, a - 1, a + XML_VALUE_LOOKAHEAD)
            elif not text.startswith(name + ">", m.end()):
                m = None
            if m:
                yield from _judge(kind, _value(m), name)
        if before == ":" or _dsl_ok(text, s, a):  # Clojure's {:password "x"}
            yield from _judge(kind, _value_at(DSL_TAIL, text, b, e), name)
        if before == "{" or (before == ":" and text[a - 2 : a - 1] == "{"):
            yield from _judge(kind, _value_at(TUPLE_TAIL, text, b, e), name)
        if has_pic:
            yield from _judge(kind, _value_at(COBOL_VALUE, text, b, e), name)
        if RECORD_NAME_HEAD.search(text, max(s, a - 24), a):
            yield from _judge(kind, _record_value(text, b), name)


def _next_line_value(
    text: str, s: int, e: int, triple: re.Match[str] | None
) -> tuple[str, int, int, bool] | None:
    """The value of a name whose line ``text[s:e]`` ends at its separator or opens a triple
    quote: the triple-quoted token (on this line or the next), else the next line's single
    token when that line is indented deeper than this one."""
    if triple is not None:
        tq = triple.group("tq")
        close = text.find(tq, triple.end(), triple.end() + 1100)
        if close < 0:
            return None
        raw = text[triple.end() : close]
        v = raw.strip()
        if not v or any(c.isspace() for c in v):
            return None
        start = triple.end() + raw.index(v)
        return v, start, start + len(v), True
    if e >= len(text):
        return None
    nl = text.find("\n", e + 1)
    ne = len(text) if nl < 0 else nl
    indent = len(text[s:e]) - len(text[s:e].lstrip(" \t-"))
    nxt = text[e + 1 : ne]
    if len(nxt) - len(nxt.lstrip(" \t")) <= indent:
        return None
    m = CONTINUATION.match(text, e + 1, ne)
    return _value(m) if m else None


def _list_items(
    text: str, s: int, e: int, flow: re.Match[str] | None
) -> Iterator[tuple[str, int, int, bool]]:
    """The items of a flow list (``[a, "b"]``) or of the block sequence below the line
    ``text[s:e]`` (``- a`` lines indented at least as deep; stops at the first other line)."""
    if flow is not None:
        pos = flow.start("items")
        for item in flow.group("items").split(","):
            v = item.strip().strip("\"'")
            if v and not any(c.isspace() for c in v):
                at = text.index(v, pos)
                yield v, at, at + len(v), True
            pos += len(item) + 1
        return
    indent = len(text[s:e]) - len(text[s:e].lstrip(" \t"))
    pos = e + 1
    for _ in range(LIST_ITEMS_MAX):
        if pos >= len(text):
            return
        nl = text.find("\n", pos)
        le = len(text) if nl < 0 else nl
        m = LIST_ITEM.fullmatch(text, pos, le)
        if m is None or len(m.group(0)) - len(m.group(0).lstrip(" \t")) < indent:
            return
        yield m.group("bv"), m.start("bv"), m.end("bv"), bool(m.group("q"))
        pos = le + 1


def _record_value(text: str, pos: int) -> tuple[str, int, int, bool] | None:
    """The ``value`` field of the name/value record whose name field ends at ``pos``: the
    first value field within ``RECORD_LOOKAHEAD`` characters, before any next name field."""
    end = min(len(text), pos + RECORD_LOOKAHEAD)
    for m in RECORD_FIELD.finditer(text, pos, end):
        if m.group("f").lower().endswith(("name", "key")):
            return None  # the next record
        nl = text.find("\n", m.end(), end)
        return _value_at(RECORD_VALUE, text, m.end(), end if nl < 0 else nl)
    return None


# Terraform/HCL: a variable block whose name says password/key/token holds its value in
# ``default`` (``variable "db_password" { default = "..." }``). HCL strings are double-quoted;
# an expression (``var.x``, ``null``) is no literal, and ``"${...}"`` is a placeholder.
HCL_VARIABLE = re.compile(r"""[ \t]*variable[ \t]+"(?P<name>[\w-]{1,64})"[ \t]*\{""")
HCL_DEFAULT = re.compile(r"""default[ \t]*=[ \t]*(?P<q>")(?P<qv>(?:[^"\\\n]|\\.){1,1024})(?P=q)""")
HCL_BLOCK_CHARS = 4096


def _hcl_variable_default(text: str, pos: int) -> tuple[str, int, int, bool] | None:
    """(value, start, end, quoted) of the ``default = "..."`` at the top level of the block
    whose ``{`` ends at ``pos``; None when it has none (nested blocks' attributes, strings
    and comments are skipped; the search stops at the block's ``}``)."""
    depth, i, end = 1, pos, min(len(text), pos + HCL_BLOCK_CHARS)
    line_start = True  # only whitespace since the last newline, "{" or ";"
    while i < end:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < end and text[j] not in '"\n':
                j += 2 if text[j] == "\\" else 1
            i, line_start = j + 1, False
            continue
        if c == "#" or text.startswith("//", i):
            nl = text.find("\n", i, end)
            i = end if nl < 0 else nl
            continue
        if c == "}":
            depth -= 1
            if depth == 0:
                return None
        elif c == "{":
            depth += 1
        elif depth == 1 and line_start and c == "d" and (m := HCL_DEFAULT.match(text, i, end)):
            return _value(m)
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = c in "{;"
        i += 1
    return None


def _yaml_block(text: str, s: int, e: int) -> tuple[str, int, int, bool] | None:
    """(value, start, end, quoted) of the block scalar whose header line is ``text[s:e]``.

    The block is the following lines indented deeper than the header's key; its value is
    their stripped contents joined (a wrapped base64 key is one value). None when empty
    or longer than ``YAML_BLOCK_LINES`` lines (a document, not a secret).
    """
    indent = len(text[s:e]) - len(text[s:e].lstrip(" -"))
    parts: list[str] = []
    start = end = -1
    pos = e + 1
    while pos <= len(text):
        nl = text.find("\n", pos)
        le = len(text) if nl < 0 else nl
        line = text[pos:le]
        body = line.strip()
        if body:
            if len(line) - len(line.lstrip(" ")) <= indent:
                break
            if len(parts) == YAML_BLOCK_LINES:
                return None
            parts.append(body)
            if start < 0:
                start = pos + line.index(body)
            end = pos + line.rindex(body) + len(body)
        pos = le + 1
    if not parts or (len(parts) > 1 and any(" " in p for p in parts)):
        return None
    return "".join(parts), start, end, False


def _value_at(
    rx: re.Pattern[str], text: str, pos: int, end: int, query: bool = False
) -> tuple[str, int, int, bool] | None:
    m = rx.match(text, pos, end)
    return _value(m, query) if m else None


def _dsl_ok(text: str, line_start: int, start: int) -> bool:
    """DSL form only at the start of a statement: ``storePassword 'x'``, ``PASSWORD 'x'``."""
    # The last characters only: copying the whole line per name is quadratic on a long line.
    lo = max(line_start, start - 64)
    before = text[lo:start].rstrip()
    if not before and lo > line_start:
        before = text[line_start:lo].rstrip()[-8:]
    return (
        not before
        or before.endswith(("{", ";", "WITH", "LOGIN", "with", "login"))
        or (before.upper().endswith(("LOGIN", "WITH")))
        or SQL_USER.search(before) is not None
    )


_SECRET_WORD = re.compile(r"(?i)secret|token")


def _judge(kind: str | None, val: tuple[str, int, int, bool] | None, name: str) -> Iterator[Hit]:
    if kind is None or val is None:
        return
    v, start, end, _quoted = val
    if kind == "password":
        if password_value_ok(v, name):
            yield "password", start, end, v
    elif "salt" in name.lower() and len(v) < 32:
        return  # salt = "autotune-cache-v2": a namespace; WordPress's salts are 64 random
    elif key_value_ok(v, min_hex=20 if _SECRET_WORD.search(name) else 32):
        yield "key", start, end, v

"""Regenerate ``pii_labelled.jsonl``: the PII test set (run by hand, output committed).

Positives put realistic values in the places code really holds them (config files,
comments, connection strings, fixtures); negatives are the look-alikes that trip naive
detectors: version strings, lockfile digests, commit ids, placeholder emails, private and
documentation IP ranges, public DNS resolvers, C++ scopes, UUIDs, placeholder secrets.
Usage: python tests/data/build_pii_labels.py
"""

from __future__ import annotations

import base64
import json
import random
import string
from pathlib import Path

R = random.Random(20261130)
FIRST = [
    "james",
    "maria",
    "wei",
    "aisha",
    "olga",
    "diego",
    "yuki",
    "liam",
    "fatima",
    "noah",
    "sven",
    "priya",
    "chen",
    "amara",
    "lucas",
    "ines",
    "tariq",
    "hana",
    "mateo",
    "zoe",
]
LAST = [
    "smith",
    "garcia",
    "zhang",
    "okafor",
    "ivanova",
    "rossi",
    "tanaka",
    "murphy",
    "haddad",
    "novak",
    "larsen",
    "patel",
    "kim",
    "mensah",
    "silva",
    "dubois",
    "nasser",
    "sato",
]
DOMAINS = [
    "gmail.com",
    "outlook.com",
    "acme-corp.io",
    "cs.stanford.edu",
    "mail.ru",
    "proton.me",
    "fastmail.fm",
    "company.co.uk",
    "uni-heidelberg.de",
    "yandex.com",
    "icloud.com",
    "dev.widgets.net",
    "research.org",
    "hey.com",
    "posteo.de",
    "startup.ai",
]


def email() -> str:
    f, la = R.choice(FIRST), R.choice(LAST)
    local = R.choice(
        [
            f"{f}.{la}",
            f"{f}{la[0]}",
            f"{f[0]}{la}{R.randint(1, 99)}",
            f"{f}_{la}",
            f"{f}+dev",
            f"{la}.{f}",
        ]
    )
    return f"{local}@{R.choice(DOMAINS)}"


def public_ipv4() -> str:
    while True:
        a = R.choice(
            [23, 31, 45, 52, 54, 66, 74, 81, 93, 104, 128, 141, 151, 157, 185, 199, 203, 213]
        )
        ip = f"{a}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}"
        if not ip.startswith("203.0.113."):
            return ip


def public_ipv6() -> str:
    groups = [R.choice(["2a03", "2604", "2607", "2a00", "2001:67c", "2400", "2a02"])]
    groups += [f"{R.randint(1, 0xFFFF):x}" for _ in range(R.randint(2, 4))]
    if R.random() < 0.5:
        return ":".join(groups) + "::" + f"{R.randint(1, 0xFFFF):x}"
    while len(":".join(groups).split(":")) < 8:
        groups.append(f"{R.randint(0, 0xFFFF):x}")
    return ":".join(groups)


def rand(alphabet: str, n: int) -> str:
    return "".join(R.choice(alphabet) for _ in range(n))


AL = string.ascii_letters + string.digits
UP = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"


def key() -> str:
    kind = R.randrange(10)
    if kind == 0:
        return "ghp_" + rand(AL, 36)
    if kind == 1:
        return "AKIA" + rand(UP, 16)
    if kind == 2:
        n1, n2 = R.randint(10**10, 10**11), R.randint(10**10, 10**11)
        return f"xoxb-{n1}-{n2}-" + rand(AL, 24).lower()
    if kind == 3:
        return "sk_live_" + rand(AL, 24)
    if kind == 4:
        head = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")
        body = (
            base64.urlsafe_b64encode(json.dumps({"sub": R.randint(1, 10**6)}).encode())
            .decode()
            .rstrip("=")
        )
        return f"{head}.{body}." + rand(AL + "-_", 43)
    if kind == 5:
        return "SG." + rand(AL, 22) + "." + rand(AL, 43)
    if kind == 6:
        return "glpat-" + rand(AL, 20)
    if kind == 7:
        return rand(HEX, R.choice([32, 40]))
    if kind == 8:
        return base64.b64encode(R.randbytes(30)).decode()
    return rand(AL, R.choice([24, 32, 40]))


def luhn_card(prefix: str, length: int) -> str:
    digits = [int(c) for c in prefix] + [R.randint(0, 9) for _ in range(length - len(prefix) - 1)]
    for check in range(10):
        total = 0
        for i, d in enumerate(reversed([*digits, check])):
            total += (d * 2 - 9 if d * 2 > 9 else d * 2) if i % 2 else d
        if total % 10 == 0:
            return "".join(map(str, [*digits, check]))
    raise AssertionError


def password() -> str:
    return R.choice(
        [
            "Tr0ub4dor&3",
            "hunter2!",
            "S3cure#Pass",
            "qwerty!234",
            "P@ssw0rd2024x",
            "correct-horse-battery-9",
            "m0nkey_Bus1ness",
            "Zx9!kLm2#qR",
            "dragon$7788",
            "Wint3r-is-c0ming",
            "s3cr3tP@ss",
            "letMe1n!now",
        ]
    )


def phone() -> str:
    a, b, c = R.randint(201, 989), R.randint(200, 999), R.randint(1000, 9999)
    return R.choice(
        [
            f"+1 {a}-{b}-{c}",
            f"({a}) {b}-{c}",
            f"{a}.{b}.{c}",
            f"{a}-{b}-{c}",
            f"+44 20 {R.randint(7000, 7999)} {R.randint(1000, 9999)}",
            f"+49 30 {R.randint(100, 999)} {R.randint(10000, 99999)}",
            f"+33 1 {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)}"
            f" {R.randint(10, 99)}",
        ]
    )


cases: list[dict] = []


def pos(text: str, *items: tuple[str, str]) -> None:
    cases.append({"text": text, "pii": [{"type": t, "value": v} for t, v in items]})


def neg(text: str, note: str) -> None:
    cases.append({"text": text, "pii": [], "note": note})


EMAIL_T = [
    "# Maintainer: {n} <{e}>",
    'AUTHOR_EMAIL = "{e}"',
    '    "email": "{e}",',
    '<a href="mailto:{e}">Contact us</a>',
    "Signed-off-by: {n} <{e}>",
    "// questions? write to {e}",
    'author = {{ name = "{n}", email = "{e}" }}',
    "git config user.email {e}",
    'send_mail(to=["{e}"], subject="hi")',
    " * @author {n} ({e})",
    "reply_to: {e}",
    "Copyright 2021 {n} {e}",
]
for i in range(64):
    e = email()
    n = f"{R.choice(FIRST).title()} {R.choice(LAST).title()}"
    t = EMAIL_T[i % len(EMAIL_T)]
    # Names are labelled where a reader sees a person's name (author/maintainer lines).
    named = "{n}" in t and any(w in t for w in ("Maintainer", "@author", "Signed-off-by"))
    pos(t.format(e=e, n=n), ("email", e), *([("name", n)] if named else []))
IP_T = [
    'server = "{ip}"',
    "curl http://{ip}:8080/health",
    'ALLOWED_HOSTS = ["{ip}", "localhost"]',
    "upstream backend {{ server {ip}:443; }}",
    "iptables -A INPUT -s {ip}/32 -j DROP",
    'connect("{ip}", 5432)',
    "# prod box: {ip}",
    "host: {ip}",
    "2024-03-01 12:00:01 GET /index.html from {ip} 200",
    "ssh deploy@{ip} -p 2222",
    '{{"remote_addr": "{ip}", "status": 403}}',
    "nameserver {ip}",
]
for i in range(52):
    ip = public_ipv4()
    pos(IP_T[i % len(IP_T)].format(ip=ip), ("ip", ip))
IP6_T = ["listen [{ip}]:443;", 'ADDR = "{ip}"', "ping6 {ip}", "# peer {ip}", "bind: {ip}"]
for i in range(26):
    ip = public_ipv6()
    pos(IP6_T[i % len(IP6_T)].format(ip=ip), ("ip", ip))
KEY_T = [
    'GITHUB_TOKEN = "{k}"',
    'const apiKey = "{k}";',
    'api_key: "{k}"',
    '"secret_key": "{k}",',
    'export ACCESS_TOKEN="{k}"',
    'client = Client(token="{k}")',
    "STRIPE_SECRET = '{k}'",
    'headers = {{"Authorization": "Bearer {k}"}}',
    'private String secretKey = "{k}";',
    'auth_token = "{k}"  # TODO rotate',
    '  client_secret: "{k}"',
    'app.config["SECRET_KEY"] = "{k}"',
]
for i in range(66):
    k = key()
    pos(KEY_T[i % len(KEY_T)].format(k=k), ("key", k))
for _ in range(4):
    body = "\n".join(base64.b64encode(R.randbytes(48)).decode() for _ in range(5))
    block = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    pos(f'PEM = """\n{block}\n"""', ("key", block))
PW_T = [
    'password = "{p}"',
    "DB_PASSWORD={p}",
    '"password": "{p}",',
    'passwd: "{p}"',
    'conn = psycopg2.connect(user="app", password="{p}")',
    "mysql://root:{p}@db.internal/app",
    'smtp_pass = "{p}"',
    "ADMIN_PASSWORD = '{p}'",
]
for i in range(32):
    p = password()
    pos(PW_T[i % len(PW_T)].format(p=p), ("password", p))
for i, (prefix, length) in enumerate(
    [
        ("4", 16),
        ("51", 16),
        ("55", 16),
        ("37", 15),
        ("6011", 16),
        ("4", 16),
        ("2221", 16),
        ("34", 15),
        ("3530", 16),
        ("4", 13),
        ("52", 16),
        ("4", 16),
        ("6011", 16),
        ("36", 14),
        ("54", 16),
    ]
):
    c = luhn_card(prefix, length)
    if length == 16 and i % 2:
        c = " ".join(c[j : j + 4] for j in range(0, 16, 4))
    pos(
        R.choice(['card_number = "{c}"', "test charge with {c}", "cc: {c}"]).format(c=c),
        ("credit_card", c),
    )
for _ in range(16):
    p = phone()
    pos(
        R.choice(['PHONE = "{p}"', "Call us at {p}.", "tel: {p}", '"phone": "{p}"']).format(p=p),
        ("phone", p),
    )
# Files with several kinds at once.
for _ in range(8):
    e, ip, k = email(), public_ipv4(), key()
    pos(f'# contact {e}\nHOST = "{ip}"\nAPI_KEY = "{k}"\n', ("email", e), ("ip", ip), ("key", k))

# ---- tricky negatives --------------------------------------------------------------------
for _ in range(30):
    v = ".".join(str(R.randint(0, 30)) for _ in range(4))
    neg(
        R.choice(
            [
                '__version__ = "{v}"',
                "version: {v}",
                "pip install pkg=={v}",
                '"version": "{v}",',
                "Release {v} (2024-05-01)",
                "requires: lib>={v}",
                "VERSION={v}",
                "Chrome/{v} Safari/537.36",
                "    <version>{v}</version>",
                "tag v{v}",
                "npm i left-pad@{v}",
                "uses: actions/checkout@v{v}",
            ]
        ).format(v=v),
        "version",
    )
for _ in range(30):
    h = rand(HEX, 64)
    neg(
        R.choice(
            [
                '    hash = "sha256:{h}"',
                'checksum = "{h}"',
                "  integrity sha512-{b}",
                '"resolved": "https://registry.npmjs.org/x/-/x-1.0.0.tgz#{s}"',
                "commit {s}",
                "rev: {s}",
                "github.com/pkg/errors v0.9.1 h1:{b}=",
                '"sha1": "{s}",',
                "Merge: {s7} {s7b}",
                'etag = "{s}"',
                "{h}  dist/app.tar.gz",
                'digest: "sha256:{h}"',
            ]
        ).format(
            h=h,
            s=rand(HEX, 40),
            s7=rand(HEX, 7),
            s7b=rand(HEX, 7),
            b=base64.b64encode(R.randbytes(48)).decode(),
        ),
        "digest",
    )
for u in ["user", "jane.doe", "admin", "test", "noreply", "info", "someone", "me", "support"]:
    for d in ["example.com", "example.org", "test.example", "mail.example.net", "localhost"]:
        neg(f'EMAIL = "{u}@{d}"', "placeholder email")
for t in [
    "git@github.com:org/repo.git",
    "git clone git@gitlab.com:team/app.git",
    "12345+octocat@users.noreply.github.com",
    "logo@2x.png",
    "icon@3x.webp",
    "npm i @babel/core@7.22.5",
    "@app.route('/login')",
    "@Override public void run()",
    "pkg@1.2.3",
    "user@localhost",
    "font-family: 'x'; @media screen",
    "a@b",
    "noreply@github.com",
    "x = obj@matrix",
    "scp file root@localhost:/tmp",
]:
    neg(t, "not a personal email")
PRIVATE = [
    "10.0.0.1",
    "10.12.3.4",
    "172.16.0.5",
    "172.31.255.1",
    "192.168.1.1",
    "192.168.0.100",
    "127.0.0.1",
    "0.0.0.0",
    "169.254.169.254",
    "255.255.255.0",
    "224.0.0.251",
    "192.0.2.10",
    "198.51.100.7",
    "203.0.113.42",
    "100.64.0.1",
    "8.8.8.8",
    "8.8.4.4",
    "1.1.1.1",
    "1.0.0.1",
    "9.9.9.9",
    "208.67.222.222",
    "::1",
    "fe80::1ff:fe23:4567:890a",
    "fd12:3456:789a:1::1",
    "2001:db8::ff00:42:8329",
    "2001:4860:4860::8888",
    "2606:4700:4700::1111",
    "ff02::1",
    "::ffff:10.0.0.1",
    "fc00::5",
]
for ip in PRIVATE:
    url = "curl http://[{ip}]/" if ":" in ip else "curl http://{ip}/"
    neg(
        R.choice(['HOST = "{ip}"', "bind {ip}", "# resolver {ip}", url]).format(ip=ip),
        "private/reserved/DNS address",
    )
for t in [
    "std::vector<int> v; std::map<a, b> m;",
    "auto x = ns::detail::impl::f();",
    "arr[1::2] + arr[::3]",
    "mac = '00:1a:2b:3c:4d:5e'",
    "at 12:30:45 UTC",
    "id = '550e8400-e29b-41d4-a716-446655440000'",
    "color: #ff00aa;",
    "dead::beef",
    "ratio 16:9:4",
    "Foo::Bar::baz()",
    "x = a[10::20]",
    "timestamp = 1700000000000",
    "isbn 978-3-16-148410-0",
    "order_id = 4111111111111112",
    "zip = 94105-1234",
    "range(1000, 2000, 3000)",
    "phone = PHONE_NUMBER",
    "date 2024-01-15 10:20:30",
    "ssn_like = 123-45-678",
    "value = 3.14159265358979",
    "port 8080 to 8443",
    "build 2024.01.15.1",
    "Oct 12 2023 10.20.30.40ms",
    "coords 51.5074, -0.1278",
    "numbers = [4242, 4242, 4242, 4242]",
    "ANSI 1.2.840.10045",
    "x = 0x7fffffff",
    "ISO 8601: 2023-10-05T14:48:00.000Z",
    "tel = None  # fill in",
]:
    neg(t, "number-like, not PII")
for t in [
    'api_key = "YOUR_API_KEY"',
    'token = "<token>"',
    'SECRET_KEY = os.environ["SECRET_KEY"]',
    'password = ""',
    'password: "{{ vault_db_password }}"',
    "secret: ${CLIENT_SECRET}",
    'password = "changeme"',
    'api_key = "xxxxxxxxxxxxxxxxxxxxxxxx"',
    'token_type = "Bearer"',
    'password = "password"',
    'tokenizer = "gpt2-medium"',
    "pwd = os.getcwd()",
    "password = getpass.getpass()",
    'secret_name = "prod-db-credentials"',
    'token_url = "https://oauth2.googleapis.com/token"',
    'access_token_expiry = "3600"',
    "PASSWORD_MIN_LENGTH = 12",
    "api_key = settings.API_KEY",
    'token = "{}".format(tok)',
    'secret = "my_secret_value"',
    "password_hash = bcrypt.hash(pw)",
    'auth_token = "test-token-placeholder"',
    'key = "AKIAIOSFODNN7EXAMPLE"',
    'aws_secret_access_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
    'password = "%s" % pw',
    'token = "..."',
    'api_key = "<insert key here>"',
    'secret_key_file = "secrets/key.pem"',
    'tokens = ["BOS", "EOS", "PAD"]',
    'cache_key = "user-profile-v2"',
    'password_field = "user_password"',
    'token_pattern = r"(?u)\\b\\w\\w+\\b"',
    "SECRET_KEY = get_random_secret_key()",
    "api_key = None",
    'client_secret = config.get("oauth", "secret")',
    'passphrase = input("Passphrase: ")',
    'key_id = "default"',
    'sort_key = "created_at_desc"',
    'TOKEN_HEADER = "X-Auth-Token"',
]:
    neg(t, "placeholder or non-secret assignment")
for _ in range(8):
    neg(
        f'image = "data:image/png;base64,{base64.b64encode(R.randbytes(24)).decode()}"',
        "inline data",
    )

out = Path(__file__).with_name("pii_labelled.jsonl")
with out.open("w") as f:
    for c in cases:
        f.write(json.dumps(c) + "\n")
npos = sum(len(c["pii"]) for c in cases)
nneg = sum(1 for c in cases if not c["pii"])
print(f"wrote {out}: {npos} positives, {nneg} negatives")

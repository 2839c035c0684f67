"""A generated PII evaluation set: rule families x syntaxes x languages, split in two.

Written before the detector's new rules (see the commit history) from the miss and
false-positive *kinds* a review found, not from their cases. Each family lists the
syntaxes in which a kind of value appears in ~40 languages and formats, and hard
negatives that look like it. Two things keep the held-out part apart from tuning:

- syntaxes: in every family a fixed-seed third of the templates is held out, so the
  held-out part holds syntaxes the rules were never tuned on;
- values: the two parts draw from different value generators (other alphabets,
  lengths, word lists, domains, all-letter secrets), so no held-out value shape was seen.

``cases(split)`` returns ``[{"text", "pii": [{"type", "value"}], "family", "lang"}]``.
Provider token bodies follow the formats the providers document and open rule sets
(gitleaks' ``cmd/generate/config/rules``, detect-secrets' plugins) describe; the bodies
are random, so no real credential is in this file.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

SEED = 18
HELDOUT_FRACTION = 1 / 3
PER_TEMPLATE = 5

ALNUM = string.ascii_letters + string.digits
B64URL = ALNUM + "-_"


def _s(rng: random.Random, n: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


# ---------------------------------------------------------------------------------------
# value generators, one set per split
# ---------------------------------------------------------------------------------------
WORDS = {
    "tune": [
        "maple",
        "river",
        "copper",
        "falcon",
        "orbit",
        "velvet",
        "canyon",
        "ember",
        "harbor",
        "lumen",
        "quartz",
        "saddle",
        "tundra",
        "willow",
        "zephyr",
    ],
    "heldout": [
        "basil",
        "crimson",
        "dolphin",
        "glacier",
        "indigo",
        "jasmine",
        "kestrel",
        "lantern",
        "meadow",
        "nutmeg",
        "pebble",
        "raven",
        "sorrel",
        "thistle",
    ],
}
FIRST = {
    "tune": ["anna", "bruno", "chen", "dmitri", "elena", "farid", "greta", "hiro"],
    "heldout": ["ines", "jonas", "kwame", "leila", "mateo", "noor", "oskar", "priya"],
}
LAST = {
    "tune": ["schmidt", "okafor", "tanaka", "silva", "novak", "haddad"],
    "heldout": ["lindqvist", "mbeki", "oyelaran", "petrov", "quintero", "rahman"],
}
DOMAINS = {
    "tune": ["gmail.com", "acme-corp.io", "mail.utoronto.ca", "posteo.de", "fastmail.fm"],
    "heldout": [
        "proton.me",
        "eng.globex.co.uk",
        "uni-heidelberg.de",
        "outlook.com",
        "studio-nine.dev",
        "cs.ox.ac.uk",
    ],
}
HOSTS = [
    "db.internal",
    "prod-db-01",
    "mysql.svc.cluster.local",
    "cache.acme.lan",
    "mongo-primary",
    "smtp.mailhost.net",
    "ftp.files.org",
    "ldap.corp",
]


def email(rng: random.Random, split: str) -> str:
    f, last = rng.choice(FIRST[split]), rng.choice(LAST[split])
    local = rng.choice(
        [
            f"{f}.{last}",
            f"{f[0]}{last}",
            f"{f}{rng.randint(1, 99)}",
            f"{f}+{rng.choice(['dev', 'git', 'lists'])}",
            f"{f}_{last}",
            f"{last}-{f}",
        ]
    )
    return f"{local}@{rng.choice(DOMAINS[split])}"


def ipv4(rng: random.Random, split: str) -> str:
    import ipaddress

    while True:  # a global unicast address, not a public resolver
        first = rng.choice(range(11, 100) if split == "tune" else range(100, 224))
        ip = f"{first}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        a = ipaddress.ip_address(ip)
        if a.is_global and not a.is_multicast and ip not in ("8.8.8.8", "1.1.1.1"):
            return ip


def ipv6(rng: random.Random, split: str) -> str:
    head = rng.choice(
        ["2a00", "2a03", "2604", "2001:67c"]
        if split == "tune"
        else ["2a01", "2a02", "2607", "2403"]
    )
    groups = [f"{rng.randint(0, 0xFFFF):x}" for _ in range(rng.choice([3, 4]))]
    tail = f"{rng.randint(1, 0xFFFF):x}"
    return f"{head}:{':'.join(groups)}::{tail}"


def ip(rng: random.Random, split: str) -> str:
    return ipv6(rng, split) if rng.random() < 0.25 else ipv4(rng, split)


def secret(rng: random.Random, split: str) -> str:
    """A generic API secret: tune = mixed alnum; held-out adds symbols, hex, all letters."""
    if split == "tune":
        return _s(rng, rng.randint(20, 40))
    kind = rng.choice(["letters", "b64url", "hex", "dashed", "b64"])
    if kind == "letters":  # all-letter secrets (no digit at all)
        return _s(rng, rng.randint(24, 40), string.ascii_letters)
    if kind == "b64url":
        return _s(rng, rng.randint(28, 48), B64URL)
    if kind == "hex":
        return _s(rng, rng.choice([32, 40, 64]), "0123456789abcdef")
    if kind == "dashed":
        return "-".join(_s(rng, 8, string.ascii_lowercase + string.digits) for _ in range(4))
    return _s(rng, 40, ALNUM + "+/") + "="


def password(rng: random.Random, split: str) -> str:
    """A real-looking password: tune = word+digits+symbol; held-out differs in shape."""
    w = WORDS[split]
    if split == "tune":
        return (
            rng.choice(w).capitalize()
            + str(rng.randint(10, 9999))
            + rng.choice("!#%&*")
            + rng.choice(w)
        )
    kind = rng.choice(["letters", "passphrase", "random", "leet"])
    if kind == "letters":  # all-letter passwords
        return rng.choice(w) + rng.choice(w).capitalize() + rng.choice(w)
    if kind == "passphrase":
        return "-".join(rng.sample(w, 3))
    if kind == "random":
        return _s(rng, rng.randint(10, 18), ALNUM + "@$^~+=")
    word = rng.choice(w)
    return word.replace("a", "4").replace("e", "3").replace("o", "0") + str(rng.randint(1, 99))


def framework_secret(rng: random.Random, split: str) -> str:
    """Framework keys: Django's (with its insecure prefix), Rails' hex, Laravel's base64."""
    kind = rng.choice(
        ["django", "rails", "laravel", "flask"]
        if split == "heldout"
        else ["django", "rails", "flask"]
    )
    if kind == "django":
        symbols = string.ascii_lowercase + string.digits + "!@#%^&*(-_=+)"
        return "django-insecure-" + _s(rng, 50, symbols)
    if kind == "rails":
        return _s(rng, 128, "0123456789abcdef")
    if kind == "laravel":
        return "base64:" + _s(rng, 43, ALNUM + "+/") + "="
    return _s(rng, 24, string.ascii_lowercase + string.digits)


# Provider formats (documented by the providers; cf. gitleaks' rules of the same names).
PROVIDERS: dict[str, Callable[[random.Random], str]] = {
    "github-pat": lambda r: "ghp_" + _s(r, 36),
    "github-fine-grained": lambda r: "github_pat_" + _s(r, 22) + "_" + _s(r, 59),
    "github-app": lambda r: r.choice(["ghs_", "gho_", "ghu_", "ghr_"]) + _s(r, 36),
    "gitlab": lambda r: "glpat-" + _s(r, 20, B64URL),
    "openai-project": lambda r: "sk-proj-" + _s(r, 74, B64URL) + "T3BlbkFJ" + _s(r, 74, B64URL),
    "openai-legacy": lambda r: "sk-" + _s(r, 20) + "T3BlbkFJ" + _s(r, 20),
    "anthropic": lambda r: "sk-ant-api03-" + _s(r, 93, B64URL) + "AA",
    "google-api": lambda r: "AIza" + _s(r, 35, B64URL),
    "stripe-secret": lambda r: r.choice(["sk_live_", "rk_live_", "sk_test_"]) + _s(r, 24),
    "stripe-webhook": lambda r: "whsec_" + _s(r, 32),
    "huggingface": lambda r: "hf_" + _s(r, 34, string.ascii_letters),
    "shopify": lambda r: (
        r.choice(["shpat_", "shpss_", "shpca_", "shppa_"]) + _s(r, 32, "0123456789abcdef")
    ),
    "vault-service": lambda r: "hvs." + _s(r, 95, B64URL),
    "vault-legacy": lambda r: "s." + _s(r, 24),
    "slack": lambda r: (
        "xoxb-"
        + str(r.randint(10**10, 10**12))
        + "-"
        + str(r.randint(10**10, 10**12))
        + "-"
        + _s(r, 24)
    ),
    "npm": lambda r: "npm_" + _s(r, 36, string.ascii_lowercase + string.digits),
    "aws-access-key": lambda r: "AKIA" + _s(r, 16, string.ascii_uppercase + "234567"),
    "sendgrid": lambda r: "SG." + _s(r, 22, B64URL) + "." + _s(r, 43, B64URL),
    "digitalocean": lambda r: "dop_v1_" + _s(r, 64, "0123456789abcdef"),
    "databricks": lambda r: "dapi" + _s(r, 32, "0123456789abcdef"),
    "pypi": lambda r: "pypi-AgEIcHlwaS5vcmc" + _s(r, 60, B64URL),
    "twilio": lambda r: "SK" + _s(r, 32, "0123456789abcdef"),
    "doppler": lambda r: "dp.pt." + _s(r, 43, string.ascii_lowercase + string.digits),
    "linear": lambda r: "lin_api_" + _s(r, 40, string.ascii_lowercase + string.digits),
    "postman": lambda r: (
        "PMAK-" + _s(r, 24, "0123456789abcdef") + "-" + _s(r, 34, "0123456789abcdef")
    ),
    "age": lambda r: "AGE-SECRET-KEY-1" + _s(r, 58, "023456789ACDEFGHJKLMNPQRSTUVWXYZ"),
}


def provider_token(rng: random.Random, split: str) -> str:
    return PROVIDERS[rng.choice(sorted(PROVIDERS))](rng)


def jwt(rng: random.Random, split: str) -> str:
    head = (
        "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9"
        if split == "tune"
        else "eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiJ9"
    )
    return f"{head}.eyJ{_s(rng, 60, B64URL)}.{_s(rng, 43, B64URL)}"


def basic_b64(rng: random.Random, split: str) -> str:
    import base64

    user = rng.choice(FIRST[split])
    return base64.b64encode(f"{user}:{password(rng, split)}".encode()).decode()


# ---------------------------------------------------------------------------------------
# families: (lang, template) with {v} the labelled value, {u} a user, {h} a host, {d} a db
# ---------------------------------------------------------------------------------------
Template = tuple[str, str]

FAMILIES: dict[str, tuple[str, Callable[[random.Random, str], str], list[Template]]] = {
    "email-contexts": (
        "email",
        email,
        [
            ("Python", '__email__ = "{v}"'),
            ("Python", "# Maintainer: {v}"),
            ("JavaScript", '  author: "Dev Team <{v}>",'),
            ("JSON", '{{"name": "x", "email": "{v}"}}'),
            ("YAML", "maintainer_email: {v}"),
            ("HTML", '<a href="mailto:{v}">write to us</a>'),
            ("Markdown", "Questions? Contact {v}."),
            ("Git", "Signed-off-by: Someone <{v}>"),
            ("INI", "[user]\nemail = {v}"),
            ("XML", "<developer><email>{v}</email></developer>"),
            ("Go", '\tfrom := "{v}"'),
            ("Java", '    private static final String SUPPORT = "{v}";'),
            ("Ruby", "  spec.email = ['{v}']"),
            ("C", " * Copyright 2021 {v}"),
            ("Rust", 'authors = ["{v}"]'),
            ("PHP", "$to = '{v}';"),
            ("SQL", "INSERT INTO users (email) VALUES ('{v}');"),
            ("Shell", 'git config --global user.email "{v}"'),
        ],
    ),
    "ip-contexts": (
        "ip",
        ip,
        [
            ("Python", 'SERVER = "{v}"'),
            ("YAML", "host: {v}"),
            ("INI", "[db]\nhost={v}"),
            ("Nginx", "    allow {v};"),
            ("Shell", "ssh -J {v} deploy"),
            ("Shell", "curl http://{v}:8080/health"),
            ("JSON", '{{"upstream": "{v}", "port": 443}}'),
            ("Go", '\taddr := net.ParseIP("{v}")'),
            ("Java", '    InetAddress a = InetAddress.getByName("{v}");'),
            ("Terraform", 'cidr_blocks = ["{v}/32"]'),
            ("Dockerfile", "ENV API_HOST={v}"),
            ("C", '#define PEER "{v}"'),
            ("Text", "Last login from {v} on ttys001"),
            ("Apache", "Require ip {v}"),
            ("Properties", "cluster.node.address={v}"),
            ("JavaScript", "const peers = ['{v}'];"),
            ("Log", '{v} - - [10/Oct/2023:13:55:36] "GET / HTTP/1.1" 200'),
        ],
    ),
    "provider-tokens": (
        "key",
        provider_token,
        [
            ("Python", 'client = Client("{v}")'),
            ("JavaScript", "const token = '{v}';"),
            ("Shell", "export SERVICE_CRED={v}"),
            ("YAML", "    value: {v}"),
            ("JSON", '{{"auth": "{v}"}}'),
            ("Text", "use {v} to call the API"),
            ("Go", '\tc := api.New("{v}")'),
            ("Rust", 'let k = "{v}";'),
            ("Dockerfile", "ARG CI_AUTH={v}"),
            ("TOML", 'credential = "{v}"'),
            ("Markdown", "`{v}`"),
            ("Ruby", "Client.new(token: '{v}')"),
            ("C#", 'var c = new ApiClient("{v}");'),
            ("Kotlin", 'val k = "{v}"'),
        ],
    ),
    "assigned-secrets": (
        "key",
        secret,
        [
            ("Python", 'API_KEY = "{v}"'),
            ("Env", "STRIPE_API_KEY={v}"),
            ("Shell", "export AUTH_TOKEN={v}"),
            ("YAML", "api_key: {v}"),
            ("INI", "[service]\nsecret_key = {v}"),
            ("TOML", 'access_token = "{v}"'),
            ("JSON", '{{"client_secret": "{v}"}}'),
            ("JavaScript", "const apiKey = '{v}';"),
            ("Java", '    String accessKey = "{v}";'),
            ("Go", '\tconst apiSecret = "{v}"'),
            ("PHP", "$api_key = '{v}';"),
            ("Ruby", "config.secret_token = '{v}'"),
            ("Properties", "app.auth.token={v}"),
            ("C#", '    private const string ApiKey = "{v}";'),
            ("Swift", 'let clientSecret = "{v}"'),
            ("Scala", 'val apiToken = "{v}"'),
            ("PowerShell", '$env:API_KEY = "{v}"'),
            ("HCL", 'api_key = "{v}"'),
            ("Lua", 'local api_key = "{v}"'),
            ("R", 'Sys.setenv(API_KEY = "{v}")'),
            ("Perl", "my $api_key = '{v}';"),
            ("Elixir", 'config :app, api_key: "{v}"'),
            ("Dart", "const apiKey = '{v}';"),
            ("Julia", 'const API_TOKEN = "{v}"'),
        ],
    ),
    "cli-secret-flags": (
        "key",
        secret,
        [
            ("Shell", "mytool deploy --token {v} --region eu"),
            ("Shell", "client --api-key={v}"),
            ("Shell", 'gh auth login --with-token "{v}"'),
            ("Shell", "cli --access-token '{v}' run"),
            ("Makefile", "\t./upload --secret {v}"),
            ("PowerShell", "Invoke-Tool -ApiKey {v}"),
        ],
    ),
    "http-auth": (
        "key",
        secret,
        [
            ("HTTP", "Authorization: Bearer {v}"),
            ("Shell", 'curl -H "Authorization: token {v}" https://api.host.dev'),
            ("Python", 'headers = {{"X-API-Key": "{v}"}}'),
            ("JavaScript", "headers: {{ 'x-api-key': '{v}' }},"),
            ("HTTP", "X-Auth-Token: {v}"),
            ("Python", 'session.headers["Authorization"] = "Bearer {v}"'),
            ("Go", '\treq.Header.Set("Authorization", "Bearer {v}")'),
            ("Java", '    conn.setRequestProperty("Authorization", "Token {v}");'),
            ("Shell", "wget --header='PRIVATE-TOKEN: {v}' https://git.host.dev/api"),
        ],
    ),
    "basic-auth-header": (
        "key",
        basic_b64,
        [
            ("HTTP", "Authorization: Basic {v}"),
            ("Python", 'h = {{"Authorization": "Basic {v}"}}'),
            ("Shell", 'curl -H "Authorization: Basic {v}" https://svc.host.dev'),
        ],
    ),
    "url-query-tokens": (
        "key",
        secret,
        [
            ("URL", "https://api.host.dev/v1/items?access_token={v}"),
            ("Python", 'requests.get(f"{{BASE}}/data?api_key={v}&page=2")'),
            ("JavaScript", "fetch('https://maps.host.dev/js?key={v}&callback=init')"),
            ("HTML", '<script src="https://cdn.host.dev/sdk.js?token={v}"></script>'),
            ("Shell", 'curl "https://hooks.host.dev/in?secret={v}"'),
            ("Markdown", "[feed](https://feeds.host.dev/rss?auth={v})"),
        ],
    ),
    "jwt-tokens": (
        "key",
        jwt,
        [
            ("Python", 'TOKEN = "{v}"'),
            ("HTTP", "Authorization: Bearer {v}"),
            ("JSON", '{{"id_token": "{v}"}}'),
            ("Shell", "export SESSION={v}"),
        ],
    ),
    "framework-secret-keys": (
        "key",
        framework_secret,
        [
            ("Python", "SECRET_KEY = '{v}'"),
            ("Python", 'app.secret_key = "{v}"'),
            ("Python", "app.config['SECRET_KEY'] = '{v}'"),
            ("YAML", "production:\n  secret_key_base: {v}"),
            ("Env", "APP_KEY={v}"),
            ("Env", "JWT_SECRET={v}"),
            ("Ruby", "config.secret_key_base = '{v}'"),
            ("JavaScript", "app.use(session({{ secret: '{v}' }}));"),
            ("Env", "NEXTAUTH_SECRET={v}"),
        ],
    ),
    "xml-secrets": (
        "key",
        secret,
        [
            ("XML", '<add key="ApiKey" value="{v}" />'),
            ("XML", "<apiKey>{v}</apiKey>"),
            ("XML", '<credential token="{v}"/>'),
            ("XML", "<secret>{v}</secret>"),
        ],
    ),
    "assigned-passwords": (
        "password",
        password,
        [
            ("Python", 'DB_PASSWORD = "{v}"'),
            ("Env", "POSTGRES_PASSWORD={v}"),
            ("Shell", "export MYSQL_PWD={v}"),
            ("YAML", "  password: {v}"),
            ("INI", "[database]\nuser = {u}\npassword = {v}"),
            ("TOML", 'password = "{v}"'),
            ("JSON", '{{"username": "{u}", "password": "{v}"}}'),
            ("JavaScript", "const dbPass = '{v}';"),
            ("Java", '    String pwd = "{v}";'),
            ("Properties", "spring.datasource.password={v}"),
            ("Ruby", "  password: '{v}',"),
            ("Ruby", ':password => "{v}"'),
            ("PHP", "$db_pass = '{v}';"),
            ("Go", '\tPassword: "{v}",'),
            ("C#", '    var passwd = "{v}";'),
            ("Dockerfile", "ENV REDIS_PASSWORD={v}"),
            ("Kotlin", 'val adminPassword = "{v}"'),
            ("Swift", 'let passphrase = "{v}"'),
            ("PowerShell", '$Password = "{v}"'),
            ("HCL", 'master_password = "{v}"'),
            ("Netrc", "machine {h} login {u} password {v}"),
            ("Lua", 'local pass = "{v}"'),
            ("Perl", "my $passwd = '{v}';"),
            ("Elixir", 'password: "{v}",'),
        ],
    ),
    "cli-password-flags": (
        "password",
        password,
        [
            ("Shell", "mysql -u {u} --password={v} {d}"),
            ("Shell", "psql --username {u} --password {v}"),
            ("Shell", "sshpass -p {v} ssh {u}@{h}"),
            ("Shell", "mysqladmin -u root -p{v} status"),
            ("Shell", "redis-cli -h {h} -a {v} ping"),
            ("Shell", 'docker login -u {u} -p "{v}" registry.host.dev'),
            ("Shell", "htpasswd -b .htpasswd {u} {v}"),
            ("Shell", "mongo {d} --username {u} --password '{v}'"),
            ("PowerShell", "Connect-Server -User {u} -Password {v}"),
            ("Makefile", "\tpgloader --pass {v} src.db"),
        ],
    ),
    "dsn-urls": (
        "password",
        password,
        [
            ("Python", 'DATABASE_URL = "postgresql://{u}:{v}@{h}:5432/{d}"'),
            ("Env", "REDIS_URL=redis://:{v}@{h}:6379/0"),
            ("YAML", "url: mongodb+srv://{u}:{v}@{h}/{d}?retryWrites=true"),
            ("JavaScript", "amqp.connect('amqp://{u}:{v}@{h}:5672')"),
            ("Shell", "git clone https://{u}:{v}@git.host.dev/team/repo.git"),
            ("Java", '    String url = "jdbc:mysql://{h}:3306/{d}?user={u}&password={v}";'),
            ("C#", '    var cs = "Server={h};Database={d};User Id={u};Password={v};";'),
            ("Properties", "db.url=jdbc:postgresql://{h}/{d}?user={u}&password={v}"),
            ("INI", "sqlalchemy.url = mysql+pymysql://{u}:{v}@{h}/{d}"),
            ("Go", '\tdsn := "{u}:{v}@tcp({h}:3306)/{d}"'),
            ("C#", '    "Data Source={h};Initial Catalog={d};uid={u};pwd={v}"'),
            ("Text", "ftp://{u}:{v}@{h}/pub/"),
            ("XML", '<add name="Main" connectionString="Host={h};Username={u};Password={v}" />'),
            ("Env", "AMQP_URL=amqps://:{v}@{h}/vhost"),
        ],
    ),
    "login-positional": (
        "password",
        password,
        [
            ("Python", 'ftp.login("{u}", "{v}")'),
            ("Python", 'server.login(sender, "{v}")'),
            ("Python", 'auth = HTTPBasicAuth("{u}", "{v}")'),
            ("Python", 'r = requests.get(url, auth=("{u}", "{v}"))'),
            ("Python", 'conn = pymysql.connect("{h}", "{u}", "{v}", "{d}")'),
            ("Java", '    Connection c = DriverManager.getConnection(url, "{u}", "{v}");'),
            ("C#", '    var cred = new NetworkCredential("{u}", "{v}");'),
            ("PHP", '$conn = mysqli_connect("{h}", "{u}", "{v}", "{d}");'),
            ("PHP", "$pdo = new PDO($dsn, '{u}', '{v}');"),
            ("Python", 'l.simple_bind_s("cn={u},dc=corp", "{v}")'),
            ("Go", '\tauth := smtp.PlainAuth("", "{u}", "{v}", "{h}")'),
            ("Ruby", "Net::SSH.start('{h}', '{u}', password: '{v}')"),
            ("JavaScript", "client.auth('{u}', '{v}');"),
            ("Perl", 'my $dbh = DBI->connect($dsn, "{u}", "{v}");'),
            ("Python", 'ssh.connect("{h}", username="{u}", password="{v}")'),
            ("Python", 'client = MongoClient("{h}", 27017, username="{u}", password="{v}")'),
        ],
    ),
    "keywordless-passwords": (
        "password",
        password,
        [
            ("XML", '<user name="{u}" password="{v}" roles="admin"/>'),
            ("XML", "<password>{v}</password>"),
            ("XML", '<property name="hibernate.connection.password" value="{v}"/>'),
            ("PHP", "define('DB_PASSWORD', '{v}');"),
            ("PHP", 'define("SMTP_PASS", "{v}");'),
            ("SQL", "CREATE USER '{u}'@'%' IDENTIFIED BY '{v}';"),
            ("SQL", "ALTER USER {u} IDENTIFIED BY {v};"),
            ("SQL", "CREATE ROLE {u} WITH LOGIN PASSWORD '{v}';"),
            ("Groovy", "        storePassword '{v}'"),
            ("Groovy", '        keyPassword "{v}"'),
            ("Groovy", "    credentials {{ username '{u}'; password '{v}' }}"),
            ("Gradle", 'password = "{v}"'),
            ("Kotlin", '    password.set("{v}")'),
            ("Maven", "<server><id>central</id><password>{v}</password></server>"),
        ],
    ),
}

# Hard negatives: each line looks like one of the rule families above but holds no PII.
HARD_NEGATIVES: dict[str, list[Template]] = {
    "versions-and-oids": [
        ("C#", '[assembly: AssemblyVersion("1.2.30.4")]'),
        ("C#", '[assembly: AssemblyFileVersion("12.0.41.113")]'),
        ("XML", "<Version>4.18.2.0</Version>"),
        ("JSON", '{{"version": "112.0.5615.49"}}'),
        ("Python", 'requires = ["foo==2.14.3.1"]'),
        ("Text", "Mozilla/5.0 Chrome/120.0.6099.109 Safari/537.36"),
        ("Gradle", "implementation 'com.acme:lib:3.11.0.27'"),
        ("Text", "Firmware 21.44.12.7 released"),
        ("Python", "OID_COMMON_NAME = '2.5.4.3'"),
        ("ASN.1", "id-ce-keyUsage OBJECT IDENTIFIER ::= {{ 2.5.29.15 }}"),
        ("Python", 'SNMP_SYS_DESCR = "1.3.6.1.2.1.1.1.0"'),
        ("Text", "See section 4.2.1.3 of RFC 5280."),
        ("YAML", "image: nginx:1.25.3.1"),
        ("Java", "// since 11.0.20.1"),
        ("Text", "Windows 10.0.19045.3803"),
        ("Dockerfile", "FROM python:3.12.1.0-slim"),
    ],
    "public-and-private-addresses": [
        ("YAML", "nameservers: [8.8.8.8, 8.8.4.4]"),
        ("Python", 'DNS = ("1.1.1.1", "9.9.9.9")'),
        ("Shell", "echo 'nameserver 208.67.222.222' >> /etc/resolv.conf"),
        ("INI", "host = 192.168.1.20"),
        ("Python", 'BIND = "0.0.0.0"'),
        ("Text", "documentation example 203.0.113.7 and 198.51.100.4"),
        ("Go", '\tlisten := "127.0.0.1:8080"'),
        ("Terraform", 'cidr_block = "10.0.0.0/16"'),
        ("Shell", "ping6 2001:4860:4860::8888"),
        ("Text", "fe80::1ff:fe23:4567:890a%eth0"),
    ],
    "at-signs-not-email": [
        ("Python", "y = a@b.T"),
        ("Python", "out = weights@inputs.transpose(0, 1)"),
        ("Python", "z = q@k.mT / scale"),
        ("Python", "    return x@self.proj.weight"),
        ("Python", "@app.route('/login')"),
        ("CSS", "@media screen and (max-width: 600px) {{"),
        ("Shell", "npm install lodash@4.17.21"),
        ("Text", "logo@2x.png"),
        ("Shell", "git clone git@github.com:acme/repo.git"),
        ("Text", "contact: user@example.com"),
        ("Java", "@Override public String toString() {{"),
        ("Text", "Message-ID: <1a2b3c4d5e6f7a8b@mail.gmail.com>"),
    ],
    "example-secrets": [
        (
            "Python",
            'token = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwi'
            "bmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ."
            'SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"',
        ),
        ("INI", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE"),
        ("INI", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        ("Python", 'OPENAI_API_KEY = "sk-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"'),
        ("Env", "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
        ("YAML", "api_key: ${{API_KEY}}"),
        ("Env", "SECRET_KEY=your-secret-key-here"),
        ("Python", 'api_key = os.environ["API_KEY"]'),
        ("JavaScript", "const token = process.env.GITHUB_TOKEN;"),
        ("Shell", 'curl -H "Authorization: Bearer $TOKEN" https://api.host.dev'),
        ("HTTP", "Authorization: Bearer <token>"),
        ("Python", 'headers = {{"Authorization": f"Bearer {{token}}"}}'),
        ("Shell", "mytool --token $(cat ~/.token)"),
        ("Python", 'commit = "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3"'),
        ("JSON", '{{"integrity": "sha512-Vq9TfGmZxXmJ2nLaLzOmYnU6qYbQqk2aPcBBnEXAMKb3A=="}}'),
        ("Python", 'token_type = "Bearer"'),
        ("Python", "max_tokens = 4096"),
        ("Python", 'TOKEN_URL = "https://oauth2.host.dev/token"'),
        ("Python", 'cache_key = "users:list:page"'),
        ("Python", 'KEY_PATTERN = r"ghp_[A-Za-z0-9]{{36}}"'),
        (
            "Text",
            "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n"
            "-----END PUBLIC KEY-----",
        ),
        ("Python", 'tokenizer = AutoTokenizer.from_pretrained("gpt2")'),
        ("Python", 'id = "550e8400-e29b-41d4-a716-446655440000"'),
        ("Markdown", "Set `HF_TOKEN` to your Hugging Face token (it starts with `hf_`)."),
    ],
    "secret-paths-and-names": [
        ("Python", 'SECRET_KEY_FILE = "/run/secrets/django_secret_key"'),
        ("Python", 'api_key_path = "~/.config/service/credentials.json"'),
        ("YAML", "password_file: /etc/app/db_password.txt"),
        ("Shell", "mytool --password-file /etc/pw.txt"),
        ("Python", 'TOKEN_ENV_VAR = "HUGGINGFACE_HUB_TOKEN"'),
        ("Python", 'secret_name = "prod/db/password"'),
        ("Python", 'key_name = "my-ssh-key"'),
        ("JSON", '{{"passwordField": "password_confirmation"}}'),
        ("Python", 'token = os.getenv("GITHUB_TOKEN")'),
        ("Python", 'password = getpass.getpass("Password: ")'),
        ("Python", 'password = request.form["password"]'),
        ("Python", "def login(self, username, password=None):"),
        ("Python", "password: str = Field(..., min_length=8)"),
        ("Java", '    String password = System.getenv("DB_PASSWORD");'),
        ("Shell", 'mysql -u root -p"$MYSQL_ROOT_PASSWORD"'),
        ("Shell", "psql --password"),
        ("Python", "PASSWORD_MIN_LENGTH = 12"),
        ("Python", "if password != confirm_password:"),
        ("YAML", "password: ${{DB_PASSWORD}}"),
        ("Env", "DB_PASSWORD="),
        ("Python", "conn = psycopg2.connect(host=host, user=user, password=password)"),
        ("Python", "ftp.login(user, passwd)"),
        ("Go", '\tauth := smtp.PlainAuth("", user, pass, host)'),
    ],
    "documentation-passwords": [
        ("Python", 'password = "changeme"'),
        ("YAML", 'password: "<your-password>"'),
        ("Markdown", "Log in with `admin` / `admin`."),
        ("Python", 'client.login("user", "password")'),
        ("Env", "POSTGRES_PASSWORD=postgres"),
        ("Env", "MYSQL_ROOT_PASSWORD=example"),
        ("Python", 'password = "hunter2"'),
        ("Text", "postgres://user:password@localhost:5432/db"),
        ("Text", "mysql://root:secret@localhost/test"),
        ("Python", 'password = "********"'),
        ("Shell", "docker run -e POSTGRES_PASSWORD=mysecretpassword postgres"),
        ("Python", 'PASSWORD = "P@ssw0rd"'),
        ("Java", '    user.setPassword("123456");'),
        ("Python", 'password="xxx"'),
        ("Markdown", "| password | string | The user's password |"),
    ],
    "regex-patterns": [
        ("Python", 'PASSWORD_RE = re.compile(r"^(?=.*[A-Z])(?=.*\\d)[A-Za-z\\d@$!%*?&]{{8,}}$")'),
        ("JavaScript", "const passwordPattern = /^(?=.*[a-z])(?=.*\\d).{{8,32}}$/;"),
        ("HTML", '<input type="password" pattern="(?=.*\\d)(?=.*[a-z]).{{8,}}">'),
        ("Python", 'password_validator = r"[A-Za-z0-9!@#$%^&*]{{12,64}}"'),
        ("Go", "\tvar keyRe = regexp.MustCompile(`(?i)api[_-]?key\\s*=\\s*(\\w+)`)"),
        ("YAML", "pattern: '(?i)password\\s*[:=]\\s*\\S+'"),
    ],
    "physical-constants": [
        ("Python", "h = 6.626 070 15e-34  # Planck constant"),
        ("Text", "c            299 792 458          m s^-1"),
        ("Text", "Avogadro constant     6.022 140 76 e23   mol^-1"),
        ("Python", "ELECTRON_MASS = 9.109 383 7015e-31"),
        ("Text", "Boltzmann constant    1.380 649 e-23     J K^-1"),
        ("Text", "(555) 010-0199 is a fictional number"),
    ],
}

NEG_VALUES = {
    "u": ["deploy", "svc_app", "admin_ro", "alice"],
    "h": HOSTS,
    "d": ["orders", "analytics", "app_prod", "inventory"],
}


def _fill(template: str, rng: random.Random, v: str = "") -> str:
    return template.format(
        v=v,
        u=rng.choice(NEG_VALUES["u"]),
        h=rng.choice(NEG_VALUES["h"]),
        d=rng.choice(NEG_VALUES["d"]),
    )


def split_templates(templates: list[Template], name: str) -> dict[str, list[Template]]:
    """A fixed-seed third of a family's templates is held out (at least one)."""
    order = list(range(len(templates)))
    random.Random(f"{SEED}:{name}").shuffle(order)
    k = max(1, round(len(templates) * HELDOUT_FRACTION))
    held = set(order[:k])
    return {
        "heldout": [t for i, t in enumerate(templates) if i in held],
        "tune": [t for i, t in enumerate(templates) if i not in held],
    }


def cases(split: str) -> list[dict]:
    """The generated cases of one split (``tune`` or ``heldout``), deterministic."""
    if split not in ("tune", "heldout"):
        raise ValueError(f"split must be 'tune' or 'heldout', got {split!r}")
    rng = random.Random(f"{SEED}:{split}")
    out: list[dict] = []
    for fam, (kind, gen, templates) in sorted(FAMILIES.items()):
        for lang, tpl in split_templates(templates, fam)[split]:
            for _ in range(PER_TEMPLATE):
                v = gen(rng, split)
                out.append(
                    {
                        "text": _fill(tpl, rng, v),
                        "pii": [{"type": kind, "value": v}],
                        "family": fam,
                        "lang": lang,
                    }
                )
    for fam, templates in sorted(HARD_NEGATIVES.items()):
        for lang, tpl in split_templates(templates, fam)[split]:
            out.append({"text": _fill(tpl, rng), "pii": [], "family": fam, "lang": lang})
    return out

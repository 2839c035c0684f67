"""Secrets in syntaxes the other PII sets do not use, split by syntax into dev and test.

Written (templates, values, labels) before the detector was run on it. Kinds: nested and
block YAML, Kubernetes/Helm/kubectl, `.npmrc`, docker `config.json`, escaped JSON inside
strings, `curl -d`/`-u`, Dockerfile `ENV k v`, heredocs, Go raw strings, Rust/C/Kotlin/
Java-annotation literals, comments, Makefile/batch variables, PEM keys split across string
literals or with `\\n` escapes, JWTs in cookies/storage, openssl/ldap/sudo/expect/net use
passwords. A fixed-seed half of each polarity's templates is the test part.
"""

from __future__ import annotations

import base64
import random
import string
import urllib.parse

HOSTS = ["db7.corp-int.net", "api.fernhill.io", "10.20.30.40", "mq.larkspur.dev"]
USERS = ["svc_orders", "jdoe", "deploy", "admin_rw"]

# (language, template, kind): {v} the secret (kind key: token; kind password: password),
# {u} user, {h} host. Kind "" = hard negative (nothing to find).
POSITIVE: list[tuple[str, str, str]] = [
    ("YAML", "aws:\n  credentials:\n    secret_access_key: {v}", "key"),
    ("YAML", "api_token: >-\n  {v}", "key"),
    ("YAML", "kind: Secret\nstringData:\n  API_TOKEN: {v}", "key"),
    ("TOML", '[auth]\nbearer = "{v}"', "key"),
    ("Env", "export STRIPE_SECRET='{v}' # prod", "key"),
    ("Python", 'payload = "{{\\"api_key\\": \\"{v}\\"}}"', "key"),
    ("Shell", 'curl -X POST -d \'{{"client_secret":"{v}"}}\' https://{h}/oauth', "key"),
    ("Dockerfile", "ENV API_TOKEN {v}", "key"),
    ("Shell", "cat <<EOF > ~/.config/app.ini\n[auth]\ntoken={v}\nEOF", "key"),
    ("Go", "\tapiKey := `{v}`", "key"),
    ("Rust", 'const API_KEY: &str = "{v}";', "key"),
    ("Java", '    @Value("${{service.api.key:{v}}}")', "key"),
    ("C", '#define API_SECRET "{v}"', "key"),
    ("JavaScript", "// TODO: remove hardcoded key {v}", "key"),
    ("Python", "creds = {{'aws_secret_access_key': '{v}', 'region': 'eu-west-1'}}", "key"),
    ("Python", 'client = Service(api_key="{v}", timeout=30)', "key"),
    ("TypeScript", "  apiSecret: '{v}',", "key"),
    ("Npmrc", "//registry.npmjs.org/:_authToken={v}", "key"),
    ("Shell", "kubectl create secret generic api --from-literal=api-key={v}", "key"),
    ("Shell", "helm upgrade app ./chart --set auth.token={v}", "key"),
    ("Kotlin", '    "apiKey" to "{v}",', "key"),
    ("HCL", 'variable "token" {{\n  default = "{v}"\n}}', "key"),
    ("YAML", "    env:\n      SLACK_BOT_TOKEN: {v}", "key"),
    ("Makefile", "API_KEY ?= {v}", "key"),
    ("Batch", "set API_KEY={v}", "key"),
    ("JSON", '{{"auths": {{"registry.host.dev": {{"auth": "{b64}"}}}}}}', "key:b64"),
    ("JSON", '{{"type": "service_account", "private_key": "{pem_esc}"}}', "key:pem_esc"),
    ("Python", "KEY = (\n{pem_py}\n)", "key:pem_py"),
    ("YAML", "tls.key: |\n{pem_yaml}", "key:pem_yaml"),
    ("HTTP", "Cookie: session={jwt}; theme=dark", "key:jwt"),
    ("JavaScript", "localStorage.setItem('id_token', '{jwt}');", "key:jwt"),
    ("PowerShell", '$sec = ConvertTo-SecureString "{v}" -AsPlainText -Force', "password"),
    ("Shell", "openssl pkcs12 -export -in c.pem -out c.p12 -passout pass:{v}", "password"),
    ("Shell", "PGPASSWORD={v} psql -h {h} -U {u} app", "password"),
    ("Shell", "docker run -e DB_PASSWORD={v} -d app:latest", "password"),
    ("Shell", "curl -u {u}:{v} https://{h}/api/v1/items", "password"),
    ("Batch", "net use \\\\{h}\\share /user:{u} {v}", "password"),
    ("INI", "{h} ansible_user={u} ansible_password={v}", "password"),
    ("YAML", "spring:\n  datasource:\n    password: '{v}'", "password"),
    ("Properties", "db.password: {v}", "password"),
    ("Env", "DATABASE_URL=postgres://{u}:{venc}@{h}:5432/app", "password:enc"),
    ("Expect", 'expect "Password:"\nsend "{v}\\r"', "password"),
    ("Python", "db = connect(\n    host='{h}',\n    passwd='{v}',\n)", "password"),
    ("Rust", '    password: String::from("{v}"),', "password"),
    ("Shell", "ldapsearch -x -H ldap://{h} -D cn=admin,dc=corp -w {v} uid=jdoe", "password"),
    ("Shell", "echo '{v}' | sudo -S apt-get update", "password"),
    ("SQL", "EXEC sp_addlogin '{u}', '{v}';", "password"),
]
NEGATIVE: list[tuple[str, str]] = [
    ("YAML", "api_key_header: X-API-Key\ntoken_ttl: 3600"),
    ("TOML", 'checksum = "{hex64}"'),
    ("CSS", "background: url(data:image/png;base64,{b64img});"),
    ("HTML", '<input type="password" name="password" id="pw" autocomplete="off">'),
    ("YAML", "        env:\n          API_KEY: ${{{{ secrets.API_KEY }}}}"),
    ("HCL", "  password = var.db_password"),
    ("YAML", "  token: {{{{ .Values.auth.token | quote }}}}"),
    ("Python", 'request_id = "{uuid}"'),
    ("YAML", "  - repo: https://github.com/psf/black\n    rev: {hex40}"),
    ("JSON", '{{"password_reset": "Reset your password", "token_expired": "Log in again"}}'),
    ("Python", 'api_key = "test"  # pytest fixture'),
    ("YAML", "image: nginx@sha256:{hex64}"),
    ("Text", "golang.org/x/net v0.17.0 h1:{b64sum}="),
    ("Python", "def authenticate(token: str, api_key: Optional[str] = None) -> bool:"),
    ("Shell", 'export API_KEY="$(vault kv get -field=key secret/app)"'),
    ("JavaScript", "const TOKEN_TYPE_ACCESS = 'access_token';"),
]


def _secret(rng: random.Random) -> str:
    alpha = string.ascii_letters + string.digits
    while True:
        s = "".join(rng.choice(alpha) for _ in range(rng.randint(24, 40)))
        if any(c.isdigit() for c in s) and any(c.isupper() for c in s):
            return s


def _password(rng: random.Random) -> str:
    alpha = string.ascii_letters + string.digits
    core = "".join(rng.choice(alpha) for _ in range(rng.randint(9, 14)))
    i = rng.randrange(len(core))
    return core[:i] + rng.choice("!#%^*-_") + core[i:] + str(rng.randint(0, 9))


def _pem(rng: random.Random) -> list[str]:
    body = base64.b64encode(rng.randbytes(144)).decode()
    return [
        "-----BEGIN RSA PRIVATE KEY-----",
        *[body[i : i + 64] for i in range(0, len(body), 64)],
        "-----END RSA PRIVATE KEY-----",
    ]


def _b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def _jwt(rng: random.Random) -> str:
    head = _b64url(b'{"alg":"HS256","typ":"JWT"}')
    sub = rng.randint(10**6, 10**9)
    body = _b64url(f'{{"sub":"{sub}","exp":{rng.randint(1_700_000_000, 1_800_000_000)}}}'.encode())
    return f"{head}.{body}.{_b64url(rng.randbytes(32))}"


def _fill(tmpl: str, kind: str, rng: random.Random) -> dict:
    u, h = rng.choice(USERS), rng.choice(HOSTS)
    kw = {"u": u, "h": h}
    label = kind.split(":")[0]
    form = kind.split(":")[1] if ":" in kind else ""
    if form == "b64":
        value = base64.b64encode(f"{u}:{_password(rng)}".encode()).decode()
        kw["b64"] = value
    elif form.startswith("pem"):
        lines = _pem(rng)
        if form == "pem_esc":
            value = "\\n".join(lines) + "\\n"
            kw["pem_esc"] = value
            value = value.rstrip("\\n")
        elif form == "pem_py":
            kw["pem_py"] = "\n".join(f'    "{x}\\n"' for x in lines)
            value = lines[1]  # the key's first base64 line must not survive redaction
        else:
            kw["pem_yaml"] = "\n".join("  " + x for x in lines)
            value = "\n  ".join(lines)
    elif form == "jwt":
        value = _jwt(rng)
        kw["jwt"] = value
    elif form == "enc":
        pw = _password(rng) + "@/"
        value = urllib.parse.quote(pw, safe="")
        kw["venc"] = value
    else:
        value = _secret(rng) if label == "key" else _password(rng)
        kw["v"] = value
    text = tmpl.format(**kw)
    return {"text": text, "pii": [{"type": label, "value": value}], "form": form}


def _neg(tmpl: str, rng: random.Random) -> dict:
    hexd = "0123456789abcdef"
    kw = {
        "hex64": "".join(rng.choice(hexd) for _ in range(64)),
        "hex40": "".join(rng.choice(hexd) for _ in range(40)),
        "b64img": base64.b64encode(b"\x89PNG\r\n\x1a\n" + rng.randbytes(60)).decode(),
        "uuid": "-".join("".join(rng.choice(hexd) for _ in range(n)) for n in (8, 4, 4, 4, 12)),
        "b64sum": base64.b64encode(rng.randbytes(32)).decode().rstrip("="),
    }
    return {"text": tmpl.format(**kw), "pii": [], "form": ""}


def cases(split: str, per_template: int = 3) -> list[dict]:
    """The ``dev`` or ``test`` cases (a fixed-seed half of the templates each)."""
    order = random.Random(20261204)
    pos = list(range(len(POSITIVE)))
    neg = list(range(len(NEGATIVE)))
    order.shuffle(pos)
    order.shuffle(neg)
    pick_pos = pos[: len(pos) // 2] if split == "dev" else pos[len(pos) // 2 :]
    pick_neg = neg[: len(neg) // 2] if split == "dev" else neg[len(neg) // 2 :]
    rng = random.Random(f"values-{split}")
    out = []
    for i in sorted(pick_pos):
        lang, tmpl, kind = POSITIVE[i]
        for _ in range(per_template):
            out.append(dict(_fill(tmpl, kind, rng), lang=lang, template=i))
    for i in sorted(pick_neg):
        lang, tmpl = NEGATIVE[i]
        for _ in range(per_template):
            out.append(dict(_neg(tmpl, rng), lang=lang, template=-1 - i))
    return out

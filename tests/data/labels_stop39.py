"""Labelled secrets in file kinds no earlier set had (stop 39), split by kind family.

Written before the detector was run on it, as ``labels_stop38`` was, with its scoring
(:func:`labels_stop38.score`): framework config files (Laravel ``.env``, WordPress
``wp-config.php``, Django settings, Rails ``master.key``), INI/properties files (``my.cnf``,
``.s3cfg``, ``gradle.properties``, Android ``keystore.properties``), SQL that creates
users, Kubernetes ``Secret`` manifests (base64 ``data:``), Tomcat / .NET XML attributes,
PuTTY ``.ppk`` keys, HTTP logs with Basic/Bearer headers, Ansible inventories, provider
tokens by prefix (Hugging Face, Shopify, Atlassian, DigitalOcean, Grafana, Vault, Postman,
Databricks, Linear, New Relic), string constants in Go / C# / Kotlin / Swift; and pure
negatives: lock-file integrity hashes (``package-lock.json``, ``go.sum``, ``Cargo.lock``,
SRI attributes), SSH ``known_hosts`` / ``authorized_keys``, PGP public key blocks, Pulumi
encrypted ``secure:`` values and empty or env-templated settings.

``python tests/data/labels_stop39.py`` prints the figures per split.
"""

from __future__ import annotations

import base64
import random
import string

import labels_stop38
from labels_stop38 import Case, score  # noqa: F401 (score: the scoring, for callers)

R = random.Random(39)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"


def rnd(n: int, alphabet: str = ALNUM) -> str:
    while True:
        s = "".join(R.choice(alphabet) for _ in range(n))
        if alphabet != ALNUM or (any(c.isdigit() for c in s) and any(c.isupper() for c in s)):
            return s


def pw(n: int = 14) -> str:
    core = rnd(n - 2)
    return core[:4] + R.choice("!#%^*-_+@") + core[4:] + str(R.randint(0, 9))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


CASES: list[Case] = []
T, H = "tuning", "held_out"


def add(family: str, split: str, path: str, text: str, *secrets, ignore=()) -> None:
    for _kind, value in secrets:
        assert value in text, (family, value)
    CASES.append(Case(family, split, path, text, tuple(secrets), tuple(ignore)))


# ------------------------------------------------------------ framework env files (tuning)
app_key = "base64:" + b64(R.randbytes(32))
db_pw, mail_pw, pusher = pw(), pw(16), rnd(20, HEX)
add(
    "framework_env",
    T,
    ".env",
    "APP_NAME=Shopfront\nAPP_ENV=production\n"
    f"APP_KEY={app_key}\nAPP_DEBUG=false\nAPP_URL=https://shop.fernhill.io\n\n"
    "DB_CONNECTION=mysql\nDB_HOST=10.0.3.12\nDB_PORT=3306\nDB_DATABASE=shop\n"
    f"DB_USERNAME=shop\nDB_PASSWORD={db_pw}\n\n"
    "MAIL_MAILER=smtp\nMAIL_HOST=smtp.mailgun.org\nMAIL_PORT=587\n"
    f"MAIL_USERNAME=postmaster@mg.fernhill.io\nMAIL_PASSWORD={mail_pw}\n"
    f"PUSHER_APP_ID=1583920\nPUSHER_APP_KEY=9f2c1e7a3b5d\nPUSHER_APP_SECRET={pusher}\n",
    ("key", app_key.removeprefix("base64:")),
    ("password", db_pw),
    ("password", mail_pw),
    ("key", pusher),
    ignore=("postmaster@mg.fernhill.io", "9f2c1e7a3b5d", "10.0.3.12"),
)
salts = [rnd(64, ALNUM + "!@#$%^&*()-_ []{}<>~`+=,.;:/?|") for _ in range(3)]
wp_pw = pw()
add(
    "framework_env",
    T,
    "wp-config.php",
    "<?php\n/** The name of the database for WordPress */\n"
    "define( 'DB_NAME', 'wp_blog' );\ndefine( 'DB_USER', 'wp_admin' );\n"
    f"define( 'DB_PASSWORD', '{wp_pw}' );\ndefine( 'DB_HOST', 'localhost' );\n\n"
    f"define( 'AUTH_KEY',         '{salts[0]}' );\n"
    f"define( 'SECURE_AUTH_KEY',  '{salts[1]}' );\n"
    f"define( 'NONCE_SALT',       '{salts[2]}' );\n"
    "$table_prefix = 'wp_';\n",
    ("password", wp_pw),
    *[("key", s) for s in salts],
)
dj = "django-insecure-" + rnd(50, string.ascii_lowercase + string.digits + "!@#$%^&*(-_=+)")
add(
    "framework_env",
    T,
    "mysite/settings.py",
    "from pathlib import Path\n\nBASE_DIR = Path(__file__).resolve().parent.parent\n\n"
    "# SECURITY WARNING: keep the secret key used in production secret!\n"
    f"SECRET_KEY = '{dj}'\n\nDEBUG = True\nALLOWED_HOSTS = []\n",
    ("key", dj),
)

# ------------------------------------------------------------ rails master key (held out)
master = rnd(32, HEX)
add("rails_master_key", H, "config/master.key", master + "\n", ("key", master))
add(
    "rails_master_key",
    H,
    ".github/workflows/test.yml",
    "env:\n  RAILS_ENV: test\n"
    f"  RAILS_MASTER_KEY: {(mk2 := rnd(32, HEX))}\n"
    "steps:\n  - run: bin/rails test\n",
    ("key", mk2),
)

# ------------------------------------------------------------ ini / properties (tuning)
mycnf = pw()
add(
    "ini_properties",
    T,
    ".my.cnf",
    f"[client]\nuser=backup\npassword={mycnf}\nhost=db-primary.internal\n\n"
    "[mysqldump]\nsingle-transaction\n",
    ("password", mycnf),
)
s3_access, s3_secret = "AKIA" + rnd(16, string.ascii_uppercase + string.digits), rnd(40, B64)
add(
    "ini_properties",
    T,
    ".s3cfg",
    "[default]\n"
    f"access_key = {s3_access}\nsecret_key = {s3_secret}\n"
    "host_base = s3.amazonaws.com\nuse_https = True\nsignature_v2 = False\n",
    ("key", s3_access),
    ("key", s3_secret),
)
sign_pw, ossrh_pw = pw(), pw(18)
add(
    "ini_properties",
    T,
    "gradle.properties",
    "org.gradle.jvmargs=-Xmx2048m -Dfile.encoding=UTF-8\nandroid.useAndroidX=true\n"
    "signing.keyId=24875D73\n"
    f"signing.password={sign_pw}\nsigning.secretKeyRingFile=/home/ci/.gnupg/secring.gpg\n"
    f"ossrhUsername=fernhill-bot\nossrhPassword={ossrh_pw}\n",
    ("password", sign_pw),
    ("password", ossrh_pw),
)

# ------------------------------------------------------------ android keystore (held out)
store_pw, key_pw = pw(), pw()
add(
    "android_keystore",
    H,
    "keystore.properties",
    f"storePassword={store_pw}\nkeyPassword={key_pw}\nkeyAlias=upload\n"
    "storeFile=/Users/jane/keys/upload-keystore.jks\n",
    ("password", store_pw),
    ("password", key_pw),
)
add(
    "android_keystore",
    H,
    "app/build.gradle",
    "android {\n    signingConfigs {\n        release {\n"
    "            storeFile file('release.jks')\n"
    f"            storePassword '{(sp2 := pw())}'\n"
    "            keyAlias 'release'\n"
    f"            keyPassword '{(kp2 := pw())}'\n"
    "        }\n    }\n}\n",
    ("password", sp2),
    ("password", kp2),
)

# ------------------------------------------------------------ SQL users (held out)
sql1, sql2, sql3 = pw(), pw(), pw()
add(
    "sql_users",
    H,
    "migrations/001_users.sql",
    "-- application roles\n"
    f"CREATE USER 'app'@'%' IDENTIFIED BY '{sql1}';\n"
    "GRANT SELECT, INSERT, UPDATE ON shop.* TO 'app'@'%';\n"
    f"ALTER ROLE reporting WITH LOGIN PASSWORD '{sql2}';\n"
    f"CREATE LOGIN etl WITH PASSWORD = '{sql3}', CHECK_POLICY = OFF;\n",
    ("password", sql1),
    ("password", sql2),
    ("password", sql3),
)

# ------------------------------------------------------------ kubernetes secrets (tuning)
k8s_pw = pw()
k8s_tok = rnd(40)
add(
    "k8s_secret",
    T,
    "deploy/db-secret.yaml",
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db-credentials\n  namespace: shop\n"
    "type: Opaque\ndata:\n"
    f"  username: {b64(b'shop')}\n"
    f"  password: {(k8s_pw_b64 := b64(k8s_pw.encode()))}\n"
    f"  api-token: {(k8s_tok_b64 := b64(k8s_tok.encode()))}\n",
    ("password", k8s_pw_b64),
    ("key", k8s_tok_b64),
    ignore=(b64(b"shop"),),
)
add(
    "k8s_secret",
    T,
    "deploy/smtp-secret.yaml",
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: smtp\ntype: Opaque\nstringData:\n"
    f"  SMTP_USER: mailer\n  SMTP_PASSWORD: {(smtp := pw())}\n",
    ("password", smtp),
)

# ------------------------------------------------------------ XML attributes (held out)
tc_pw, net_key = pw(), rnd(32)
add(
    "xml_attributes",
    H,
    "conf/tomcat-users.xml",
    '<?xml version="1.0" encoding="UTF-8"?>\n<tomcat-users>\n'
    '  <role rolename="manager-gui"/>\n'
    f'  <user username="admin" password="{tc_pw}" roles="manager-gui,admin-gui"/>\n'
    "</tomcat-users>\n",
    ("password", tc_pw),
)
cs_pw = pw()
add(
    "xml_attributes",
    H,
    "Web.config",
    "<configuration>\n  <connectionStrings>\n"
    '    <add name="Default" connectionString="Server=sql01;Database=Shop;User Id=shop;'
    f'Password={cs_pw};" providerName="System.Data.SqlClient" />\n'
    "  </connectionStrings>\n  <appSettings>\n"
    f'    <add key="StripeApiKey" value="{net_key}" />\n'
    '    <add key="PageSize" value="25" />\n'
    "  </appSettings>\n</configuration>\n",
    ("password", cs_pw),
    ("key", net_key),
)

# ------------------------------------------------------------ PuTTY keys (tuning)
ppk_priv = b64(R.randbytes(48))
add(
    "putty_ppk",
    T,
    "keys/deploy.ppk",
    "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy@ci\n"
    f"Public-Lines: 2\n{b64(R.randbytes(48))}\n{b64(R.randbytes(3))}\n"
    f"Private-Lines: 1\n{ppk_priv}\n"
    f"Private-MAC: {rnd(64, HEX)}\n",
    ("key", ppk_priv),
)

# ------------------------------------------------------------ HTTP logs (held out)
basic = b64(f"svc-report:{pw()}".encode())
bearer = rnd(48)
add(
    "http_logs",
    H,
    "logs/proxy.log",
    '10.1.2.3 - - [04/Dec/2026:10:12:01 +0000] "GET /api/v2/orders HTTP/1.1" 200 512\n'
    "> GET /api/v2/reports HTTP/1.1\n> Host: api.fernhill.io\n"
    f"> Authorization: Basic {basic}\n> User-Agent: curl/8.5.0\n"
    "< HTTP/1.1 200 OK\n"
    f"DEBUG urllib3: headers={{'Authorization': 'Bearer {bearer}', 'Accept': '*/*'}}\n",
    ("key", basic),
    ("key", bearer),
    ignore=("10.1.2.3",),
)

# ------------------------------------------------------------ ansible (tuning)
ans1, ans2 = pw(), pw()
add(
    "ansible",
    T,
    "inventory/hosts.ini",
    "[web]\n"
    f"web1.fernhill.io ansible_user=deploy ansible_ssh_pass={ans1}\n"
    "[db]\n"
    f"db1.fernhill.io ansible_user=root ansible_become_password={ans2}\n",
    ("password", ans1),
    ("password", ans2),
)
add(
    "ansible",
    T,
    "group_vars/all.yml",
    f"---\nansible_user: deploy\nansible_become_pass: {(ans3 := pw())}\nntp_server: pool.ntp.org\n",
    ("password", ans3),
)

# ------------------------------------------------------------ provider tokens (held out)
hf = "hf_" + rnd(34)
shop = "shpat_" + rnd(32, HEX)
atl = "ATATT3xFfGF0" + rnd(180, ALNUM + "-_") + "=" + rnd(8, string.ascii_uppercase + HEX)
dop = "dop_v1_" + rnd(64, HEX)
glsa = "glsa_" + rnd(32) + "_" + rnd(8, HEX)
hvs = "hvs." + rnd(24)
pmak = "PMAK-" + rnd(24, HEX) + "-" + rnd(34, HEX)
dapi = "dapi" + rnd(32, HEX)
lin = "lin_api_" + rnd(40)
nrak = "NRAK-" + rnd(27, string.ascii_uppercase + string.digits)
add(
    "provider_tokens",
    H,
    "scripts/ci_env.sh",
    "#!/usr/bin/env bash\nset -euo pipefail\n"
    f"export HF_TOKEN={hf}\n"
    f"export SHOPIFY_ACCESS_TOKEN={shop}\n"
    f'export JIRA_API_TOKEN="{atl}"\n'
    f"export DIGITALOCEAN_TOKEN={dop}\n"
    f"export GRAFANA_SA_TOKEN={glsa}\n",
    ("key", hf),
    ("key", shop),
    ("key", atl),
    ("key", dop),
    ("key", glsa),
)
add(
    "provider_tokens",
    H,
    "tools/clients.py",
    "import hvac\n\n"
    f'vault = hvac.Client(url="https://vault.fernhill.io", token="{hvs}")\n'
    f'POSTMAN = "{pmak}"\n'
    f'DATABRICKS_TOKEN = "{dapi}"\n'
    f'linear = LinearClient(api_key="{lin}")\n'
    f'newrelic_key = "{nrak}"\n',
    ("key", hvs),
    ("key", pmak),
    ("key", dapi),
    ("key", lin),
    ("key", nrak),
)

# ------------------------------------------------------------ code constants (tuning)
go_key, cs_key, kt_key, sw_key = rnd(32), rnd(40), rnd(28), rnd(36)
add(
    "code_constants",
    T,
    "internal/billing/client.go",
    "package billing\n\nconst (\n"
    f'\tapiKey    = "{go_key}"\n\tbaseURL   = "https://api.billing.example"\n)\n\n'
    "func New() *Client {\n"
    f'\treturn &Client{{Username: "svc", Password: "{(go_pw := pw())}"}}\n'
    "}\n",
    ("key", go_key),
    ("password", go_pw),
)
add(
    "code_constants",
    T,
    "Services/Mailer.cs",
    "namespace Shop.Services;\n\npublic class Mailer\n{\n"
    f'    private const string ApiKey = "{cs_key}";\n'
    '    private const string From = "noreply@fernhill.io";\n}\n',
    ("key", cs_key),
    ignore=("noreply@fernhill.io",),
)
add(
    "code_constants",
    T,
    "app/src/main/java/io/fernhill/Config.kt",
    "object Config {\n"
    f'    const val MAPS_API_KEY = "{kt_key}"\n'
    "    const val TIMEOUT_MS = 30_000\n}\n",
    ("key", kt_key),
)
add(
    "code_constants",
    T,
    "Sources/App/Secrets.swift",
    "enum Secrets {\n"
    f'    static let analyticsKey = "{sw_key}"\n'
    '    static let appGroup = "group.io.fernhill.app"\n}\n',
    ("key", sw_key),
)

# ------------------------------------------------------------ lock files (negatives, held out)
add(
    "lock_hashes",
    H,
    "package-lock.json",
    '{\n  "name": "web",\n  "lockfileVersion": 3,\n  "packages": {\n'
    '    "node_modules/lodash": {\n      "version": "4.17.21",\n'
    '      "resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz",\n'
    f'      "integrity": "sha512-{b64(R.randbytes(64))}"\n    }},\n'
    '    "node_modules/react": {\n      "version": "18.3.1",\n'
    f'      "integrity": "sha512-{b64(R.randbytes(64))}"\n    }}\n  }}\n}}\n',
)
add(
    "lock_hashes",
    H,
    "go.sum",
    f"github.com/google/uuid v1.6.0 h1:{b64(R.randbytes(32))}\n"
    f"github.com/google/uuid v1.6.0/go.mod h1:{b64(R.randbytes(32))}\n"
    f"golang.org/x/sync v0.7.0 h1:{b64(R.randbytes(32))}\n",
)
add(
    "lock_hashes",
    H,
    "Cargo.lock",
    '[[package]]\nname = "serde"\nversion = "1.0.203"\n'
    'source = "registry+https://github.com/rust-lang/crates.io-index"\n'
    f'checksum = "{rnd(64, HEX)}"\n',
)
add(
    "lock_hashes",
    H,
    "templates/base.html",
    '<script src="https://cdn.jsdelivr.net/npm/bootstrap@5.3.3/dist/js/bootstrap.min.js"\n'
    f'        integrity="sha384-{b64(R.randbytes(48))}"\n'
    '        crossorigin="anonymous"></script>\n',
)

# ------------------------------------------------------------ public keys (negatives, tuning)
add(
    "public_keys",
    T,
    ".ssh/known_hosts",
    f"github.com ssh-ed25519 {b64(R.randbytes(51))}\n"
    f"|1|{b64(R.randbytes(20))}|{b64(R.randbytes(20))} ecdsa-sha2-nistp256 "
    f"{b64(R.randbytes(104))}\n",
)
add(
    "public_keys",
    T,
    ".ssh/authorized_keys",
    f"ssh-rsa {b64(R.randbytes(279))} jane@laptop\nssh-ed25519 {b64(R.randbytes(51))} ci@runner\n",
)
pgp_body = b64(R.randbytes(300))
add(
    "public_keys",
    T,
    "KEYS.asc",
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n"
    + "\n".join(pgp_body[i : i + 64] for i in range(0, len(pgp_body), 64))
    + f"\n={b64(R.randbytes(3))}\n-----END PGP PUBLIC KEY BLOCK-----\n",
)

# ----------------------------------------- templated / encrypted (negatives, held out)
add(
    "templated_encrypted",
    H,
    "Pulumi.prod.yaml",
    "config:\n  aws:region: eu-west-1\n  shop:dbPassword:\n"
    f"    secure: v1:{b64(R.randbytes(12))}:{b64(R.randbytes(40))}\n",
)
add(
    "templated_encrypted",
    H,
    ".env.example",
    "DB_HOST=localhost\nDB_USERNAME=\nDB_PASSWORD=\nMAIL_PASSWORD=null\n"
    "APP_KEY=\nSTRIPE_SECRET=${STRIPE_SECRET}\nREDIS_PASSWORD=${REDIS_PASSWORD:-}\n",
)
add(
    "templated_encrypted",
    H,
    "docker-compose.yml",
    "services:\n  db:\n    image: postgres:16\n    environment:\n"
    "      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it in .env}\n"
    "      POSTGRES_USER: ${POSTGRES_USER}\n",
)

assert {c.family for c in CASES if c.split == T}.isdisjoint(
    {c.family for c in CASES if c.split == H}
)


def split(name: str) -> list[Case]:
    return labels_stop38.split(name, CASES)


if __name__ == "__main__":
    import sys

    labels_stop38.print_report(CASES, "-v" in sys.argv)

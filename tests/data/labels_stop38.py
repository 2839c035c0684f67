"""Labelled secret/PII kinds in realistic files (stop 38), split by kind family.

Written before the detector was run on it. Each case is a whole file (``.npmrc``, docker
``config.json``, kubeconfig, ``.tfvars``, Spring ``application.yml``, Maven
``settings.xml``, ``.pypirc``, ``.netrc``, connection strings, curl scripts, notebooks,
GitHub Actions workflows, PEM keys of every header, ...) with its secrets labelled by kind
and value; everything else in the file is a negative. Families of pure negatives
(placeholders, references, digests, ids, image data, prose, obviously fake fixtures)
measure precision. The documented policy (``data/README.md``) drops placeholders,
references, documentation passwords, paths and AWS's/jwt.io's examples; a realistic key in
a test file is still a key, so fixtures are negatives only when the value itself is fake
(``xxxx``, ``EXAMPLE``, ``<token>``).

Scoring (:func:`score`): a labelled value is found when findings of its category (secret =
``key`` or ``password``; ``email``; ``ip``) cover all of it (it is gone after redaction); a
finding is a false positive when it overlaps no labelled value of its category
(``ignore`` values, e.g. a Twilio account SID, are scored neither way).

Families are split into ``tuning`` and ``held_out`` (about half each, by family, never by
line). ``python tests/data/labels_stop38.py`` prints the figures per split and family.
"""

from __future__ import annotations

import base64
import json
import random
import string
from dataclasses import dataclass, field

R = random.Random(38)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
LOWNUM = string.ascii_lowercase + string.digits
UPNUM = string.ascii_uppercase + string.digits


def rnd(n: int, alphabet: str = ALNUM) -> str:
    """A random string of ``n`` characters with at least one digit and one upper (alnum)."""
    while True:
        s = "".join(R.choice(alphabet) for _ in range(n))
        if alphabet != ALNUM or (any(c.isdigit() for c in s) and any(c.isupper() for c in s)):
            return s


def pw(n: int = 14) -> str:
    """A human-chosen-looking strong password."""
    core = rnd(n - 2)
    return core[:5] + R.choice("!#%^*-_+") + core[5:] + str(R.randint(0, 9))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pem(header: str, nbytes: int = 180) -> str:
    body = b64(R.randbytes(nbytes))
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {header}-----", *lines, f"-----END {header}-----"])


def jwt(payload: dict) -> str:
    def enc(b: bytes) -> str:
        return base64.urlsafe_b64encode(b).decode().rstrip("=")

    head = enc(b'{"alg":"RS256","typ":"JWT","kid":"' + rnd(12).encode() + b'"}')
    return f"{head}.{enc(json.dumps(payload).encode())}.{enc(R.randbytes(64))}"


@dataclass(frozen=True)
class Case:
    family: str
    split: str
    path: str
    text: str
    secrets: tuple[tuple[str, str], ...] = ()  # (kind, value): kind key/password/email/ip
    ignore: tuple[str, ...] = field(default=())


CASES: list[Case] = []


def add(family: str, split: str, path: str, text: str, *secrets, ignore=()) -> None:
    for _kind, value in secrets:
        assert value in text, (family, value)
    CASES.append(Case(family, split, path, text, tuple(secrets), tuple(ignore)))


T, H = "tuning", "held_out"

# ----------------------------------------------------------------- npmrc (tuning)
npm_tok = "npm_" + rnd(36)
gh_npm = "ghp_" + rnd(36)
npm_auth = b64(f"ci-bot:{pw()}".encode())
npm_pw = b64(pw().encode())
add(
    "npmrc",
    T,
    ".npmrc",
    "registry=https://registry.npmjs.org/\n"
    f"//registry.npmjs.org/:_authToken={npm_tok}\n"
    "@acme:registry=https://npm.pkg.github.com\n"
    f"//npm.pkg.github.com/:_authToken={gh_npm}\n"
    "always-auth=true\nsave-exact=true\n",
    ("key", npm_tok),
    ("key", gh_npm),
)
add(
    "npmrc",
    T,
    "frontend/.npmrc",
    "; internal mirror\n"
    "registry=https://nexus.corp-int.net/repository/npm-group/\n"
    f"//nexus.corp-int.net/repository/npm-group/:_auth={npm_auth}\n"
    "//nexus.corp-int.net/repository/npm-group/:username=ci-bot\n"
    f"//nexus.corp-int.net/repository/npm-group/:_password={npm_pw}\n"
    "email=ci-bot@larkspur.dev\n",
    ("key", npm_auth),
    ("password", npm_pw),
    ("email", "ci-bot@larkspur.dev"),
)
add(
    "npmrc",
    T,
    ".yarnrc.yml",
    "nodeLinker: node-modules\nnpmScopes:\n  acme:\n"
    "    npmRegistryServer: https://npm.pkg.github.com\n"
    f"    npmAuthToken: {(yt := 'ghp_' + rnd(36))}\n"
    "    npmAlwaysAuth: true\n",
    ("key", yt),
)

# ----------------------------------------------------------------- docker config (held)
dock1 = b64(f"deploy:{pw()}".encode())
dock2 = b64(f"_json_key:{pw(20)}".encode())
add(
    "docker_config",
    H,
    ".docker/config.json",
    json.dumps(
        {
            "auths": {
                "https://index.docker.io/v1/": {"auth": dock1},
                "ghcr.io": {"auth": dock2},
            },
            "credsStore": "desktop",
            "currentContext": "default",
        },
        indent=4,
    )
    + "\n",
    ("key", dock1),
    ("key", dock2),
)
idt = rnd(48)
add(
    "docker_config",
    H,
    "ci/docker-config.json",
    json.dumps(
        {
            "auths": {"registry.fernhill.io": {"identitytoken": idt}},
            "credHelpers": {"123456789012.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"},
        },
        indent=2,
    )
    + "\n",
    ("key", idt),
)

# ----------------------------------------------------------------- kubeconfig (tuning)
ckd = b64(pem("RSA PRIVATE KEY").encode())
ccd = b64(pem("CERTIFICATE").encode())
cad = b64(pem("CERTIFICATE").encode())
ktok = jwt({"iss": "kubernetes/serviceaccount", "sub": "system:serviceaccount:ci:deployer"})
add(
    "kubeconfig",
    T,
    ".kube/config",
    "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
    f"    certificate-authority-data: {cad}\n"
    "    server: https://k8s.fernhill.io:6443\n  name: prod\n"
    "contexts:\n- context:\n    cluster: prod\n    user: admin\n  name: prod\n"
    "current-context: prod\nusers:\n- name: admin\n  user:\n"
    f"    client-certificate-data: {ccd}\n"
    f"    client-key-data: {ckd}\n"
    "- name: deployer\n  user:\n"
    f"    token: {ktok}\n",
    ("key", ckd),
    ("key", ktok),
)
ktok2 = rnd(6, LOWNUM) + "." + rnd(16, LOWNUM)
add(
    "kubeconfig",
    T,
    "kubeconfig-ci.yaml",
    "apiVersion: v1\nkind: Config\nusers:\n- name: ci\n  user:\n"
    f"    token: {ktok2}\n"
    "clusters:\n- name: kind\n  cluster:\n    server: https://127.0.0.1:39211\n"
    "    insecure-skip-tls-verify: true\n",
    ("key", ktok2),
)
k8s_pw = b64(pw().encode())
k8s_key = b64(rnd(32).encode())
add(
    "kubeconfig",
    T,
    "k8s/secret.yaml",
    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db-credentials\n  namespace: shop\n"
    "type: Opaque\ndata:\n"
    f"  username: {b64(b'shop_rw')}\n"
    f"  password: {k8s_pw}\n"
    f"  api-key: {k8s_key}\n",
    ("password", k8s_pw),
    ("key", k8s_key),
)

# ----------------------------------------------------------------- terraform (held)
tf_pw, tf_tok, tf_sec = pw(), rnd(40), rnd(40, ALNUM + "+/")
add(
    "terraform",
    H,
    "envs/prod/terraform.tfvars",
    'region         = "eu-west-1"\n'
    'instance_type  = "t3.medium"\n'
    f'db_password    = "{tf_pw}"\n'
    f'cloudflare_api_token = "{tf_tok}"\n'
    f'aws_secret_key = "{tf_sec}"\n'
    'tags = {\n  team = "payments"\n  env  = "prod"\n}\n',
    ("password", tf_pw),
    ("key", tf_tok),
    ("key", tf_sec),
)
tf_pw2 = pw()
add(
    "terraform",
    H,
    "modules/rds/variables.tf",
    'variable "db_username" {\n  type    = string\n  default = "app"\n}\n\n'
    'variable "db_password" {\n  type      = string\n  sensitive = true\n'
    f'  default   = "{tf_pw2}"\n}}\n',
    ("password", tf_pw2),
)
tf_pw3 = pw()
add(
    "terraform",
    H,
    "main.tf",
    'resource "aws_db_instance" "main" {\n  engine         = "postgres"\n'
    '  username       = "app"\n'
    f'  password       = "{tf_pw3}"\n'
    "  skip_final_snapshot = true\n}\n",
    ("password", tf_pw3),
)

# ----------------------------------------------------------------- spring/properties (tuning)
sp_pw, sp_jwt, sp_mail = pw(), rnd(64, ALNUM), pw()
add(
    "spring",
    T,
    "src/main/resources/application.yml",
    "server:\n  port: 8080\nspring:\n  datasource:\n"
    "    url: jdbc:postgresql://db7.corp-int.net:5432/orders\n"
    "    username: orders\n"
    f"    password: {sp_pw}\n"
    "  mail:\n    host: smtp.sendgrid.net\n    username: apikey\n"
    f'    password: "{sp_mail}"\n'
    f"app:\n  jwt:\n    secret: {sp_jwt}\n    expiration-ms: 86400000\n",
    ("password", sp_pw),
    ("password", sp_mail),
    ("key", sp_jwt),
)
pr_pw, pr_key = pw(), rnd(32)
add(
    "spring",
    T,
    "src/main/resources/application.properties",
    "spring.application.name=billing\n"
    "spring.datasource.url=jdbc:mysql://10.20.30.40:3306/billing\n"
    "spring.datasource.username=billing\n"
    f"spring.datasource.password={pr_pw}\n"
    "spring.jpa.hibernate.ddl-auto=validate\n"
    f"stripe.api.key={(st := 'sk_live_' + rnd(24))}\n"
    f"security.oauth2.client.client-secret={pr_key}\n",
    ("password", pr_pw),
    ("key", st),
    ("key", pr_key),
)
pr_pw2 = pw()
add(
    "spring",
    T,
    "conf/jdbc.properties",
    "# JDBC settings\njdbc.driverClassName=oracle.jdbc.OracleDriver\n"
    "jdbc.url=jdbc:oracle:thin:@db.fernhill.io:1521:ORCL\n"
    "jdbc.username=SCOTT\n"
    f"jdbc.password = {pr_pw2}\n",
    ("password", pr_pw2),
)

# ----------------------------------------------------------------- maven/xml (held)
mv_pw, mv_pw2 = pw(), pw()
add(
    "maven_xml",
    H,
    ".m2/settings.xml",
    '<?xml version="1.0" encoding="UTF-8"?>\n<settings>\n  <servers>\n    <server>\n'
    "      <id>nexus-releases</id>\n      <username>deployer</username>\n"
    f"      <password>{mv_pw}</password>\n    </server>\n    <server>\n"
    "      <id>signing</id>\n      <privateKey>${user.home}/.ssh/id_rsa</privateKey>\n"
    f"      <passphrase>{mv_pw2}</passphrase>\n    </server>\n  </servers>\n</settings>\n",
    ("password", mv_pw),
    ("password", mv_pw2),
)
xml_pw = pw()
add(
    "maven_xml",
    H,
    "conf/context.xml",
    '<Context>\n  <Resource name="jdbc/app" auth="Container" type="javax.sql.DataSource"\n'
    '            username="app"\n'
    f'            password="{xml_pw}"\n'
    '            driverClassName="org.postgresql.Driver"\n'
    '            url="jdbc:postgresql://db.fernhill.io:5432/app"/>\n</Context>\n',
    ("password", xml_pw),
)
cfg_key = rnd(40)
add(
    "maven_xml",
    H,
    "Web.config",
    "<configuration>\n  <appSettings>\n"
    '    <add key="Environment" value="Production" />\n'
    f'    <add key="SendGridApiKey" value="{cfg_key}" />\n'
    "  </appSettings>\n</configuration>\n",
    ("key", cfg_key),
)

# ----------------------------------------------------------------- pypirc (tuning)
pypi_tok = "pypi-AgEIcHlwaS5vcmc" + rnd(60, ALNUM + "-_")
tp_pw = pw()
add(
    "pypirc",
    T,
    ".pypirc",
    "[distutils]\nindex-servers =\n    pypi\n    testpypi\n    private\n\n"
    f"[pypi]\nusername = __token__\npassword = {pypi_tok}\n\n"
    "[testpypi]\nrepository = https://test.pypi.org/legacy/\nusername = __token__\n"
    f"password = pypi-{(tpt := rnd(80, ALNUM + '-_'))}\n\n"
    "[private]\nrepository = https://pypi.corp-int.net/\nusername = release\n"
    f"password: {tp_pw}\n",
    ("key", pypi_tok),
    ("key", "pypi-" + tpt),
    ("password", tp_pw),
)
pip_pw = pw()
add(
    "pypirc",
    T,
    "pip.conf",
    "[global]\ntimeout = 60\n"
    f"index-url = https://build:{pip_pw}@pypi.corp-int.net/simple/\n"
    "trusted-host = pypi.corp-int.net\n",
    ("password", pip_pw),
)

# ----------------------------------------------------------------- netrc (held)
nh = rnd(36, HEX + "-")
n_pw = pw()
add(
    "netrc",
    H,
    ".netrc",
    f"machine api.heroku.com\n  login jane@fernhill.io\n  password {nh}\n"
    "machine git.heroku.com\n  login jane@fernhill.io\n"
    f"  password {nh}\n"
    f"machine ftp.larkspur.dev login deploy password {n_pw}\n",
    ("email", "jane@fernhill.io"),
    ("key", nh),
    ("password", n_pw),
)
n_pw2 = pw()
add(
    "netrc",
    H,
    "_netrc",
    f"default\nlogin anonymous\npassword {n_pw2}\n",
    ("password", n_pw2),
)

# ----------------------------------------------------------------- connection strings (tuning)
c_pg, c_mg, c_jd, c_rd, c_amqp = pw(), pw(), pw(), pw(), pw()
az_key = b64(R.randbytes(64))
add(
    "conn_strings",
    T,
    ".env.production",
    f"DATABASE_URL=postgres://orders:{c_pg}@db7.corp-int.net:5432/orders?sslmode=require\n"
    f'MONGO_URI="mongodb+srv://app_user:{c_mg}@cluster0.ab1cd.mongodb.net/shop?retryWrites=true"\n'
    f"REDIS_URL=redis://:{c_rd}@cache.fernhill.io:6379/0\n"
    f"CELERY_BROKER_URL=amqp://worker:{c_amqp}@mq.larkspur.dev:5672//\n"
    "LOG_LEVEL=info\n",
    ("password", c_pg),
    ("password", c_mg),
    ("password", c_rd),
    ("password", c_amqp),
)
add(
    "conn_strings",
    T,
    "appsettings.json",
    json.dumps(
        {
            "ConnectionStrings": {
                "Default": "Server=tcp:sql-prod.database.windows.net,1433;Initial Catalog=shop;"
                f"User ID=shopadmin;Password={c_jd};Encrypt=True;",
                "Storage": "DefaultEndpointsProtocol=https;AccountName=shopassets;"
                f"AccountKey={az_key};EndpointSuffix=core.windows.net",
            },
            "Logging": {"LogLevel": {"Default": "Information"}},
        },
        indent=2,
    )
    + "\n",
    ("password", c_jd),
    ("key", az_key),
)
c_jdbc = pw()
add(
    "conn_strings",
    T,
    "src/main/java/Db.java",
    "class Db {\n"
    '    static final String URL = "jdbc:sqlserver://sql01.corp-int.net:1433;'
    f'databaseName=erp;user=erp_app;password={c_jdbc};encrypt=true";\n'
    "}\n",
    ("password", c_jdbc),
)

# ----------------------------------------------------------------- curl (held)
cb, cu_pw, cx = rnd(40), pw(), rnd(32, HEX)
add(
    "curl",
    H,
    "scripts/smoke.sh",
    "#!/usr/bin/env bash\nset -euo pipefail\n"
    f'curl -sS -H "Authorization: Bearer {cb}" \\\n  https://api.fernhill.io/v2/orders\n'
    f"curl -u deploy:{cu_pw} https://nexus.corp-int.net/service/rest/v1/status\n"
    f"curl -H 'X-API-Key: {cx}' https://api.larkspur.dev/health\n",
    ("key", cb),
    ("password", cu_pw),
    ("key", cx),
)
wg = rnd(32)
add(
    "curl",
    H,
    "Makefile",
    "deploy:\n"
    f'\twget --header="Authorization: Token {wg}" -O build.tgz https://ci.fernhill.io/a/1\n',
    ("key", wg),
)
http_b = b64(f"admin:{pw()}".encode())
add(
    "curl",
    H,
    "requests.http",
    "### list users\nGET https://api.fernhill.io/users\n"
    f"Authorization: Basic {http_b}\nAccept: application/json\n",
    ("key", http_b),
)

# ----------------------------------------------------------------- url query (tuning)
q1, q2, q3 = rnd(32), rnd(40), rnd(24)
add(
    "url_query",
    T,
    "src/api.js",
    "export async function items(page) {\n"
    f"  const url = `https://api.fernhill.io/v1/items?api_key={q1}&page=${{page}}`;\n"
    "  return (await fetch(url)).json();\n}\n"
    f"const FEED = 'https://graph.larkspur.dev/me/feed?fields=id&access_token={q2}';\n",
    ("key", q1),
    ("key", q2),
)
add(
    "url_query",
    T,
    "README.md",
    "## Webhook\n\nPoint your service at\n"
    f"<https://hooks.fernhill.io/ingest?token={q3}&source=github>\n",
    ("key", q3),
)
q4 = rnd(28)
add(
    "url_query",
    T,
    "fetch.py",
    f'resp = requests.get("https://maps.fernhill.io/api/geocode?address=Main+St&key={q4}")\n',
    ("key", q4),
)

# ----------------------------------------------------------------- git hosting tokens (tuning)
fgp = "github_pat_" + rnd(22) + "_" + rnd(59)
ghs = "ghs_" + rnd(36)
glp = "glpat-" + rnd(20, ALNUM + "-_")
add(
    "git_tokens",
    T,
    ".github/scripts/push.sh",
    f'git remote set-url origin "https://x-access-token:{ghs}@github.com/acme/site.git"\n'
    "git push origin HEAD:main\n",
    ("key", ghs),
)
add(
    "git_tokens",
    T,
    ".env",
    f"GH_TOKEN={fgp}\nGITLAB_TOKEN={glp}\nNODE_ENV=production\n",
    ("key", fgp),
    ("key", glp),
)
glp2 = "glpat-" + rnd(20, ALNUM + "-_")
add(
    "git_tokens",
    T,
    "renovate.json",
    json.dumps({"platform": "gitlab", "token": glp2, "extends": ["config:base"]}, indent=2) + "\n",
    ("key", glp2),
)

# ----------------------------------------------------------------- slack (held)
xb = f"xoxb-{R.randint(10**10, 10**11)}-{R.randint(10**12, 10**13)}-{rnd(24)}"
SLACK = "https://hooks.slack.com/services"
hook = f"{SLACK}/T{rnd(8, UPNUM)}/B{rnd(10, UPNUM)}/{rnd(24)}"
add(
    "slack",
    H,
    "bot/notify.py",
    f'from slack_sdk import WebClient\n\nclient = WebClient(token="{xb}")\nWEBHOOK = "{hook}"\n',
    ("key", xb),
    ("key", hook.split("/services/", 1)[1]),
)
hook2 = f"{SLACK}/T{rnd(10, UPNUM)}/B{rnd(10, UPNUM)}/{rnd(24)}"
add(
    "slack",
    H,
    "alertmanager.yml",
    f"receivers:\n- name: ops\n  slack_configs:\n  - api_url: '{hook2}'\n    channel: '#ops'\n",
    ("key", hook2.split("/services/", 1)[1]),
)

# ----------------------------------------------------------------- payments/messaging (tuning)
sk, rk = "sk_live_" + rnd(99), "rk_live_" + rnd(24)
sg = "SG." + rnd(22, ALNUM + "-_") + "." + rnd(43, ALNUM + "-_")
tw_sid, tw_tok, tw_sk = "AC" + rnd(32, HEX), rnd(32, HEX), "SK" + rnd(32, HEX)
add(
    "payments_messaging",
    T,
    "config/settings.py",
    "import os\n\n"
    f'STRIPE_SECRET_KEY = "{sk}"\n'
    f"STRIPE_RESTRICTED = '{rk}'\n"
    'STRIPE_PUBLISHABLE_KEY = os.environ.get("STRIPE_PUBLISHABLE_KEY")\n'
    f'SENDGRID_API_KEY = "{sg}"\n'
    f'TWILIO_ACCOUNT_SID = "{tw_sid}"\n'
    f'TWILIO_AUTH_TOKEN = "{tw_tok}"\n'
    f'TWILIO_API_KEY = "{tw_sk}"\n',
    ("key", sk),
    ("key", rk),
    ("key", sg),
    ("key", tw_tok),
    ("key", tw_sk),
    ignore=(tw_sid,),
)
tw_tok2 = rnd(32, HEX)
add(
    "payments_messaging",
    T,
    "sms.rb",
    f"client = Twilio::REST::Client.new('{tw_sid}', '{tw_tok2}')\n",
    ("key", tw_tok2),
    ignore=(tw_sid,),
)

# ----------------------------------------------------------------- AI providers (held)
oa = "sk-proj-" + rnd(74, ALNUM + "-_") + "T3BlbkFJ" + rnd(74, ALNUM + "-_")
an = "sk-ant-api03-" + rnd(93, ALNUM + "-_") + "AA"
hf = "hf_" + rnd(34, string.ascii_letters)
gk = "AIza" + rnd(35, ALNUM + "-_")
add(
    "ai_providers",
    H,
    "agent/config.toml",
    "[openai]\n"
    f'api_key = "{oa}"\nmodel = "gpt-4o"\n\n[anthropic]\n'
    f'api_key = "{an}"\n\n[hf]\n'
    f'token = "{hf}"\n',
    ("key", oa),
    ("key", an),
    ("key", hf),
)
add(
    "ai_providers",
    H,
    "web/index.html",
    '<script src="https://maps.googleapis.com/maps/api/js?'
    f'key={gk}&callback=initMap" async defer></script>\n',
    ("key", gk),
)
oa2 = "sk-proj-" + rnd(74, ALNUM + "-_") + "T3BlbkFJ" + rnd(74, ALNUM + "-_")
add(
    "ai_providers",
    H,
    "chat.py",
    f'from openai import OpenAI\n\nclient = OpenAI(api_key="{oa2}")\n',
    ("key", oa2),
)

# ----------------------------------------------------------------- GCP service account (held)
sa_key = pem("PRIVATE KEY", 600)
sa_esc = sa_key.replace("\n", "\\n")
sa_id = rnd(40, HEX)
add(
    "gcp_sa",
    H,
    "gcp-sa.json",
    "{\n"
    '  "type": "service_account",\n  "project_id": "shop-prod-31337",\n'
    f'  "private_key_id": "{sa_id}",\n'
    f'  "private_key": "{sa_esc}\\n",\n'
    '  "client_email": "deployer@shop-prod-31337.iam.gserviceaccount.com",\n'
    '  "client_id": "104729384756102938475",\n'
    '  "token_uri": "https://oauth2.googleapis.com/token"\n}\n',
    ("key", sa_esc),
    ("email", "deployer@shop-prod-31337.iam.gserviceaccount.com"),
    ignore=(sa_id,),
)

# ----------------------------------------------------------------- PEM keys (tuning)
for header, path in (
    ("RSA PRIVATE KEY", "deploy/id_rsa"),
    ("EC PRIVATE KEY", "certs/server-ec.key"),
    ("DSA PRIVATE KEY", "legacy/dsa.key"),
    ("OPENSSH PRIVATE KEY", ".ssh/id_ed25519"),
    ("ENCRYPTED PRIVATE KEY", "certs/enc.p8"),
    ("PRIVATE KEY", "certs/tls.key"),
):
    k = pem(header)
    add("pem_keys", T, path, k + "\n", ("key", k))
pgp = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
    + "\n".join(b64(R.randbytes(48)) for _ in range(5))
    + "\n="
    + b64(R.randbytes(3))
    + "\n-----END PGP PRIVATE KEY BLOCK-----"
)
add("pem_keys", T, "keys/release.asc", pgp + "\n", ("key", pgp))
inline = pem("RSA PRIVATE KEY")
add(
    "pem_keys",
    T,
    "tests/conftest.py",
    f'SIGNING_KEY = """{inline}\n"""\n\n\ndef test_sign():\n    assert SIGNING_KEY\n',
    ("key", inline),
)
add(
    "pem_keys",
    T,
    "certs/ca.pem",
    pem("CERTIFICATE") + "\n" + pem("PUBLIC KEY", 150) + "\n",
)

# ----------------------------------------------------------------- JWTs (held)
j1 = jwt({"sub": "8842", "role": "admin", "exp": 1893456000})
j2 = jwt({"sub": "user_231", "scope": "read write", "iat": 1735689600})
add(
    "jwts",
    H,
    "tests/fixtures/session.har",
    json.dumps(
        {
            "request": {
                "method": "GET",
                "url": "https://app.fernhill.io/api/me",
                "headers": [{"name": "Authorization", "value": f"Bearer {j1}"}],
                "cookies": [{"name": "sid", "value": j2}],
            }
        },
        indent=2,
    )
    + "\n",
    ("key", j1),
    ("key", j2),
)
j3 = jwt({"sub": "42", "tenant": "acme"})
add(
    "jwts",
    H,
    "src/test/auth.spec.ts",
    f"const token = '{j3}';\nit('decodes', () => expect(decode(token).sub).toBe('42'));\n",
    ("key", j3),
)

# ----------------------------------------------------------------- python code (tuning)
pd_pw, pk_pw, pa_pw, pk_tok = pw(), pw(), pw(), rnd(40)
add(
    "python_code",
    T,
    "etl/db.py",
    "import psycopg2\nimport requests\n\n"
    "DATABASES = {\n    'default': {\n        'ENGINE': 'django.db.backends.postgresql',\n"
    "        'NAME': 'shop',\n        'USER': 'shop',\n"
    f"        'PASSWORD': '{pd_pw}',\n        'HOST': 'db7.corp-int.net',\n    }}\n}}\n\n"
    "conn = psycopg2.connect(\n    host='db7.corp-int.net',\n    dbname='shop',\n"
    f"    user='etl',\n    password=\"{pk_pw}\",\n)\n"
    f"r = requests.get(URL, auth=('etl', '{pa_pw}'), timeout=10)\n"
    f'headers = {{"Authorization": f"Bearer {{token}}", "X-Api-Key": "{pk_tok}"}}\n',
    ("password", pd_pw),
    ("password", pk_pw),
    ("password", pa_pw),
    ("key", pk_tok),
)
py_sec = rnd(50, ALNUM + "!@#%^&*(-_=+)")
add(
    "python_code",
    T,
    "mysite/settings.py",
    f"DEBUG = False\nSECRET_KEY = '{py_sec}'\nALLOWED_HOSTS = ['shop.fernhill.io']\n",
    ("key", py_sec),
)
fs_pw = pw()
add(
    "python_code",
    T,
    "jobs/export.py",
    f'engine = create_engine(f"mysql+pymysql://report:{fs_pw}@{{host}}:3306/reports")\n',
    ("password", fs_pw),
)

# ----------------------------------------------------------------- shell & Dockerfile (held)
ex_aws, ex_pw, ar_npm, env_pw = rnd(40, ALNUM + "+/"), pw(), "npm_" + rnd(36), pw()
add(
    "shell_docker",
    H,
    "scripts/env.sh",
    "#!/bin/sh\nexport AWS_ACCESS_KEY_ID=AKIA"
    + (akid := rnd(16, string.ascii_uppercase + "234567"))
    + f"\nexport AWS_SECRET_ACCESS_KEY={ex_aws}\n"
    f"export PGPASSWORD='{ex_pw}'\n"
    'export PATH="$HOME/bin:$PATH"\n',
    ("key", "AKIA" + akid),
    ("key", ex_aws),
    ("password", ex_pw),
)
add(
    "shell_docker",
    H,
    "Dockerfile",
    "FROM node:20-alpine\n"
    f"ARG NPM_TOKEN={ar_npm}\n"
    f"ENV DB_PASSWORD={env_pw} \\\n    NODE_ENV=production\n"
    "RUN npm ci\n",
    ("key", ar_npm),
    ("password", env_pw),
)
dc_pw = pw()
add(
    "shell_docker",
    H,
    "docker-compose.yml",
    "services:\n  db:\n    image: postgres:16\n    environment:\n"
    f"      - POSTGRES_PASSWORD={dc_pw}\n      - POSTGRES_USER=app\n",
    ("password", dc_pw),
)

# ----------------------------------------------------------------- GitHub Actions (tuning)
ga_tok, ga_pw = rnd(40), pw()
add(
    "gh_actions",
    T,
    ".github/workflows/deploy.yml",
    "name: deploy\non: push\njobs:\n  deploy:\n    runs-on: ubuntu-latest\n    env:\n"
    f"      SONAR_TOKEN: {ga_tok}\n"
    "      NPM_TOKEN: ${{ secrets.NPM_TOKEN }}\n"
    "    steps:\n      - uses: actions/checkout@v4\n"
    "      - uses: docker/login-action@v3\n        with:\n          username: deployer\n"
    f"          password: {ga_pw}\n"
    "      - run: echo ${{ secrets.GITHUB_TOKEN }} | gh auth login --with-token\n",
    ("key", ga_tok),
    ("password", ga_pw),
)
ga_cl = rnd(36)
add(
    "gh_actions",
    T,
    ".gitlab-ci.yml",
    "variables:\n"
    f'  CODECOV_TOKEN: "{ga_cl}"\n'
    "  DOCKER_DRIVER: overlay2\ntest:\n  script:\n    - make test\n",
    ("key", ga_cl),
)

# ----------------------------------------------------------------- notebooks (held)
nb_oa = "sk-proj-" + rnd(74, ALNUM + "-_") + "T3BlbkFJ" + rnd(74, ALNUM + "-_")
nb_pw, nb_key = pw(), rnd(32)
nb = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": 1,
            "metadata": {},
            "outputs": [],
            "source": [
                "import os\n",
                f'os.environ["OPENAI_API_KEY"] = "{nb_oa}"\n',
                f"wandb_api_key = '{nb_key}'\n",
                f'conn = pymysql.connect(host="db", user="root", password="{nb_pw}")',
            ],
        }
    ],
    "metadata": {"kernelspec": {"name": "python3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}
add(
    "notebook",
    H,
    "analysis.ipynb",
    json.dumps(nb, indent=1) + "\n",
    ("key", nb_oa),
    ("key", nb_key),
    ("password", nb_pw),
)
nb_tok = rnd(40)
add(
    "notebook",
    H,
    "explore.ipynb",
    json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "source": f'HF_TOKEN = "{nb_tok}"\nlogin(token=HF_TOKEN)',
                    "outputs": [],
                }
            ]
        },
        indent=1,
    )
    + "\n",
    ("key", nb_tok),
)

# ----------------------------------------------------------------- YAML block scalars (tuning)
yb_pw, yb_tok = pw(), rnd(48)
add(
    "yaml_blocks",
    T,
    "helm/values-prod.yaml",
    "postgresql:\n  auth:\n    username: app\n    password: |\n"
    f"      {yb_pw}\n"
    "    database: app\nworker:\n  apiToken: >\n"
    f"    {yb_tok}\n",
    ("password", yb_pw),
    ("key", yb_tok),
)
yb_key = rnd(44, ALNUM + "+/")
add(
    "yaml_blocks",
    T,
    "ansible/group_vars/all.yml",
    f"app_user: deploy\napp_secret_key: >-\n  {yb_key}\napp_port: 8080\n",
    ("key", yb_key),
)

# ----------------------------------------------------------------- placeholders (tuning, negative)
add(
    "placeholders",
    T,
    ".env.example",
    "OPENAI_API_KEY=YOUR_API_KEY\nSTRIPE_SECRET_KEY=sk_live_xxxxxxxxxxxxxxxxxxxxxxxx\n"
    "DB_PASSWORD=changeme\nGITHUB_TOKEN=<token>\nJWT_SECRET=${JWT_SECRET}\n"
    "SLACK_BOT_TOKEN=xoxb-your-bot-token\nAWS_SECRET_ACCESS_KEY=<your-secret-access-key>\n",
)
add(
    "placeholders",
    T,
    "app/config.py",
    'API_KEY = os.environ["API_KEY"]\n'
    'DB_PASSWORD = os.getenv("DB_PASSWORD", "")\n'
    "TOKEN = settings.SLACK_TOKEN\n"
    'password = getpass.getpass("Password: ")\n',
)
add(
    "placeholders",
    T,
    ".github/workflows/ci.yml",
    "env:\n  API_TOKEN: ${{ secrets.API_TOKEN }}\n  DB_PASSWORD: ${{ secrets.DB_PASSWORD }}\n"
    "steps:\n  - run: npm publish\n    env:\n      NODE_AUTH_TOKEN: ${{ secrets.NPM_TOKEN }}\n",
)
add(
    "placeholders",
    T,
    "docs/setup.md",
    "Create `~/.pypirc`:\n\n```ini\n[pypi]\nusername = __token__\npassword = <your PyPI token>\n"
    '```\n\nThen run `curl -H "Authorization: Bearer $TOKEN" https://api.example.com`.\n',
)

# ----------------------------------------------------------------- hashes & ids (held, negative)
add(
    "hashes_ids",
    H,
    "CHANGELOG.md",
    f"## 2.4.1\n\n* fix race in scheduler ({rnd(40, HEX)})\n"
    f"* Merge commit {rnd(40, HEX)} into release\n"
    f"* bump deps, see {rnd(7, HEX)}\n",
)
add(
    "hashes_ids",
    H,
    "fixtures/orders.json",
    json.dumps(
        [
            {
                "id": "-".join(rnd(n, HEX) for n in (8, 4, 4, 4, 12)),
                "request_id": "-".join(rnd(n, HEX) for n in (8, 4, 4, 4, 12)),
                "sha256": rnd(64, HEX),
                "etag": '"' + rnd(32, HEX) + '"',
            }
            for _ in range(3)
        ],
        indent=2,
    )
    + "\n",
)
add(
    "hashes_ids",
    H,
    "deploy/kustomization.yaml",
    f"images:\n- name: api\n  newName: ghcr.io/acme/api\n  digest: sha256:{rnd(64, HEX)}\n",
)
add(
    "hashes_ids",
    H,
    "index.html",
    '<script src="https://cdn.jsdelivr.net/npm/bootstrap@5.3.2/dist/js/bootstrap.min.js" '
    f'integrity="sha384-{b64(R.randbytes(48))}" crossorigin="anonymous"></script>\n',
)
add(
    "hashes_ids",
    H,
    ".ssh/authorized_keys",
    f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{b64(R.randbytes(32))[:43]} jane@laptop\n",
)

# ----------------------------------------------------------------- data & prose (held, negative)
add(
    "data_prose",
    H,
    "styles/logo.css",
    ".logo { background: url(data:image/png;base64,"
    + b64(b"\x89PNG" + R.randbytes(300))
    + "); }\n",
)
add(
    "data_prose",
    H,
    "docs/lorem.md",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Password managers keep "
    "secrets; tokens expire after an hour. Sed do eiusmod tempor incididunt ut labore.\n",
)
add(
    "data_prose",
    H,
    "tests/test_auth.py",
    'FAKE_KEY = "AKIAIOSFODNN7EXAMPLE"\n'
    'FAKE_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"\n'
    'STRIPE = "sk_test_xxxxxxxxxxxxxxxxxxxxxxxx"\n'
    'TOKEN = "<token>"\n',
)

# ----------------------------------------------------------------- emails & IPs (tuning)
add(
    "emails_ips",
    T,
    "nginx/site.conf",
    "server {\n  listen 443 ssl;\n  allow 52.14.201.7;\n  deny all;\n"
    "  set_real_ip_from 141.101.64.0/18;\n"
    "  proxy_pass http://[2a03:2880:f12f:83:face:b00c:0:25de]:8080;\n}\n",
    ("ip", "52.14.201.7"),
    ("ip", "141.101.64.0"),
    ("ip", "2a03:2880:f12f:83:face:b00c:0:25de"),
)
add(
    "emails_ips",
    T,
    "package.json",
    json.dumps(
        {
            "name": "shop-web",
            "author": "Jane Roe <jane.roe@fernhill.io>",
            "contributors": [{"name": "Kai", "email": "kai.m@larkspur.dev"}],
            "bugs": {"url": "https://github.com/acme/shop/issues"},
        },
        indent=2,
    )
    + "\n",
    ("email", "jane.roe@fernhill.io"),
    ("email", "kai.m@larkspur.dev"),
)
add(
    "emails_ips",
    T,
    "setup.sh",
    'git config --global user.email "ops+ci@fernhill.io"\n'
    "ssh -i ~/.ssh/id_ed25519 deploy@52.14.201.9\n",
    ("email", "ops+ci@fernhill.io"),
    ("ip", "52.14.201.9"),
)


# ----------------------------------------------------------------- scoring
CATEGORY = {"key": "secret", "password": "secret", "email": "email", "ip": "ip"}


def _spans(text: str, value: str) -> list[tuple[int, int]]:
    out, i = [], text.find(value)
    while i >= 0:
        out.append((i, i + len(value)))
        i = text.find(value, i + 1)
    return out


def judge(case: Case, findings) -> tuple[int, int, int, int, list[str]]:
    """(tp_labels, fn_labels, tp_findings, fp_findings, error notes) of one case."""
    # Only the kinds this set labels are scored: it never labelled names (an author
    # field's name is PII by the policy, but no case says which are there).
    scored = set(CATEGORY.values())
    found = [(CATEGORY.get(f.kind, f.kind), f.start, f.end) for f in findings]
    found = [f for f in found if f[0] in scored]
    notes: list[str] = []
    tp = fn = 0
    labelled: list[tuple[str, int, int]] = []
    for kind, value in case.secrets:
        cat = CATEGORY[kind]
        for s, e in _spans(case.text, value):
            labelled.append((cat, s, e))
            covered = sorted((a, b) for c, a, b in found if c == cat and a < e and b > s)
            pos = s
            for a, b in covered:
                if a <= pos:
                    pos = max(pos, b)
            if pos >= e:
                tp += 1
            else:
                fn += 1
                notes.append(f"FN {kind} {value[:40]!r}")
    ignored = [sp for v in case.ignore for sp in _spans(case.text, v)]
    ftp = ffp = 0
    for cat, a, b in found:
        if any(a < e and b > s for s, e in ignored):
            continue
        if any(c == cat and a < e and b > s for c, s, e in labelled):
            ftp += 1
        else:
            ffp += 1
            notes.append(f"FP {cat} {case.text[a:b][:40]!r}")
    return tp, fn, ftp, ffp, notes


def score(cases: list[Case], detector=None) -> dict:
    """Recall over labelled values, precision over findings, and the errors."""
    from data.pii import PIIDetector

    det = detector or PIIDetector()
    tp = fn = ftp = ffp = 0
    errors: list[str] = []
    for c in cases:
        a, b, x, y, notes = judge(c, det.find(c.text, c.path))
        tp, fn, ftp, ffp = tp + a, fn + b, ftp + x, ffp + y
        errors += [f"{c.family}:{c.path}: {n}" for n in notes]
    return {
        "labels": tp + fn,
        "tp": tp,
        "fn": fn,
        "findings": ftp + ffp,
        "fp": ffp,
        "recall": tp / (tp + fn) if tp + fn else 1.0,
        "precision": ftp / (ftp + ffp) if ftp + ffp else 1.0,
        "errors": errors,
    }


def split(name: str, cases: list[Case] | None = None) -> list[Case]:
    return [c for c in (CASES if cases is None else cases) if c.split == name]


def print_report(cases: list[Case], show: bool = False) -> None:
    """The figures per split (and the tuning split's errors; all with ``show``)."""
    for part in (T, H):
        part_cases = split(part, cases)
        r = score(part_cases)
        fams = sorted({c.family for c in part_cases})
        print(
            f"{part}: {len(part_cases)} files, {len(fams)} families, {r['labels']} labels: "
            f"recall {r['recall']:.3f} ({r['tp']}/{r['labels']}), precision "
            f"{r['precision']:.3f} ({r['findings'] - r['fp']}/{r['findings']})"
        )
        if show or part == T:
            for e in r["errors"]:
                print("   ", e)


if __name__ == "__main__":
    import sys

    print_report(CASES, "-v" in sys.argv)

"""Stop 45: secrets in kinds no earlier set had (``tests/data/secrets_stop45.jsonl``).

The set (116 cases: 24 kinds, 87 labelled values, 37 hard negatives) was written before the
detector was run on it, aiming at general syntaxes rather than one family per kind. Split
rule, fixed before any output was seen: the positive kinds and the ``neg_*`` kinds, each
sorted and shuffled with ``random.Random(45)`` (positives first, one generator); the first
half (rounded down) of each is tune, the rest held-out (``test_split_rule`` re-derives it).
Tune kinds: CI pipeline variables (GitLab, CircleCI, Jenkinsfile, Travis, Azure Pipelines),
Nix/Jsonnet/Vimscript/elisp/Tcl configs, name/value records (Kubernetes ``env``, ECS,
Postman, CloudFormation parameters, Azure app settings), Jupyter notebook sources,
private keys in other shapes (PGP in JSON, JWK ``d``, bare DER base64, ``0x`` hex, OpenSSH
in a YAML block), ``put``/``setProperty``/``Sys.setenv``/``os.Setenv`` calls, shell history
and logs, tool password arguments (openssl ``pass:``, keytool ``-storepass``, ``zip -P``,
gpg ``--passphrase``, ``rabbitmqctl add_user``); negatives: fixtures named fake/dummy/mock/
example, file hashes, masked values, public keys. Held-out kinds: Ansible vars, bare
provider tokens (Groq, Replicate, Notion, Figma, LangSmith, PlanetScale, Heroku), database
admin commands (``CREATE ROLE``, ``SET PASSWORD``, ClickHouse, Cassandra, ``createUser``),
escaped values (``\\u0040``, ``&amp;``, ``%40``, ``\\"``, ``\\t``), Terraform provider/
module/locals/tfvars, Perl/Ruby/Lua/Erlang/Clojure hashes, plist/xcconfig/Android
resources/``--dart-define``, proxy header directives; negatives: config look-alikes, env
references, UUIDs/ids, secret-store paths.

Scored as stop 44: recall = labelled values whose every occurrence lies inside a
key/password finding; precision = such findings overlapping a labelled value.
Before any change: tune R 29/43, P 27/28; **held-out R 29/44, P 30/31**. Fixed from tune
misses only (see ``data/README.md``): name/value records (a ``value`` field after a
``name``/``key`` field holding a secret name, before the next record; a JSON key is no
longer read as the value of a ``"name", "value"`` pair), ``...pass`` names glued to a
qualifier (``storepass``, ``keypass``, ``become_pass`` was already split), ``0x`` hex judged
as hex, Tcl ``set`` and Lisp ``(setq``/``(defvar`` heads, JWK private members, ``zip -P``,
``rabbitmqctl``/``mosquitto_passwd``/``net user`` positional passwords. After: tune 43/43,
41/41. Held-out, measured after, never tuned on: **R 30/44 (0.68), P 31/32** (the gain: an
AndroidManifest ``android:name``/``android:value`` pair, read by the record rule).

Then the held-out families were fixed too (optimistic from here on): Groq/Replicate/
LangSmith/PlanetScale formats, Erlang/Elixir ``{name, "x"}`` tuples, plist ``<key>``/
``<string>``, ``<string name="...">x</string>``, header directives (``proxy_set_header``,
``set-header``, ``RequestHeader set``, ``header_up``), Squid ``login=u:x``, ``SET PASSWORD
FOR``, a ``scheme://`` URL without userinfo as a reference (``sm://...``): held-out 41/44,
42/42; then an escaped ``\\"`` inside a ``"``-quoted value (it was cut at the escape):
**42/44, 42/42** (optimistic). Still missed: a Heroku ``HRKU-`` + UUID (a format this set
made up: Heroku's v2 keys are ``HRKU-AA`` + 58), a 15-character Lua ``auth`` value (keys
need 16). After review, the JWK rule reads the object around a ``"kty"`` line (no extra line
words for ``"d"``/``"p"``...) and ``zip``/``7z`` count as tools only as a command word
(not ``a.zip``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from labelled_sets import load_cases
from secrets_scoring import score as score_split
from secrets_scoring import secret_findings

SET = Path(__file__).with_name("secrets_stop45.jsonl")
HEADER, CASES = load_cases(SET)
_secret_findings = secret_findings


def score(split: str) -> dict:
    return score_split(CASES, split)


def test_split_rule() -> None:
    kinds = {c["kind"] for c in CASES}
    rng = random.Random(45)  # one generator shuffles both sorted lists, positives first
    pos = sorted(k for k in kinds if not k.startswith("neg_"))
    neg = sorted(k for k in kinds if k.startswith("neg_"))
    rng.shuffle(pos)
    rng.shuffle(neg)
    tune = set(pos[: len(pos) // 2]) | set(neg[: len(neg) // 2])
    assert tune == set(HEADER["tune_kinds"])
    assert kinds - tune == set(HEADER["heldout_kinds"])
    assert (len(CASES), len(kinds)) == (116, 24)
    for c in CASES:
        assert c["split"] == ("tune" if c["kind"] in tune else "heldout")
        for v in c["secrets"]:
            assert v in c["text"]


def test_tune_all() -> None:
    r = score("tune")
    assert (r["labels"], r["tp"], r["findings"], r["fp"]) == (43, 43, 41, 0), r["errors"]


def test_heldout_floor() -> None:
    # Honest figure (after the tune fixes, never tuned on): 30/44, 31/32; after fixing the
    # held-out families too (optimistic): 42/44, 42/42 (see the docstring).
    r = score("heldout")
    assert r["labels"] == 44 and r["tp"] >= 42 and r["fp"] == 0, r["errors"]


# Look-alikes of the new rules that must stay unredacted.
LOOK_ALIKES = [
    ("rules.py", 'bypass = "Lm3Xq9Rt2Wz7"\ncompass = "Nw4Ke8Rt2Lq9"\n'),
    ("extract.sh", "unzip -p archive-2024.zip data.csv | head\n"),
    (
        "deploy.yaml",
        "        env:\n          - name: DB_PASSWORD\n            valueFrom:\n"
        "              secretKeyRef: {name: db, key: password}\n"
        '          - name: PORT\n            value: "8080"\n'
        "          - name: API_TOKEN\n            valueFrom:\n"
        "              secretKeyRef:\n                name: api\n                key: token\n"
        "          - name: RELEASE\n            value: Kq8Lm2Xz9Rt3Wq8Kp5Vb\n",
    ),
    ("task.json", '[{"name": "SMTP_PASSWORD", "value": "${SMTP_PASSWORD}"}]\n'),
    (
        "jwk.json",
        '{"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", '
        '"y": "x_FEzRjmXJmF2xDqrFQOhiQj5bNzNl8aiKPWCJ6NqOE"}\n',
    ),
    ("data.json", '{"p": "Kx9mP2vL8qRt3Wz7Yb4N", "q": "Zr5Tq8Wm2Lx9Kv3Pb7Hn"}\n'),
    (
        "nginx.conf",
        'proxy_set_header X-Request-Id $request_id;\nadd_header X-Frame-Options "SAMEORIGIN";\n'
        "proxy_set_header X-Api-Key $http_x_api_key;\n",
    ),
    ("init.el", '(setq gptel-api-key (getenv "OPENAI_API_KEY"))\n'),
    ("db.tcl", "set db_password $::env(DB_PASSWORD)\n"),
    ("Info.plist", "<key>TokenRefreshInterval</key>\n<string>3600</string>\n"),
    ("sys.config", '[{myapp, [{db_password, os:getenv("DB_PASSWORD")}]}].\n'),
    ("app.yaml", "database:\n  password: awssm://prod/shop/db\n"),
    (".env", "SIGNING_KEY_ID=0x1f\n"),
    ("users.bat", "net user bob * /add\n"),
    ("mq.sh", 'rabbitmqctl add_user shop "$MQ_PASSWORD"\n'),
    ("reset.sql", "SET PASSWORD FOR 'app'@'%' = PASSWORD(@new_pw);\n"),
    ("squid.conf", "cache_peer parent.acme-corp.net parent 3128 0 no-query login=PASSTHRU\n"),
    ("copy.sh", "cp -P Xk9mQ2zLp4.zip /mnt/backup/\nzip -r -p out.zip src/\n"),
]


@pytest.mark.parametrize(("path", "text"), LOOK_ALIKES)
def test_look_alikes_stay(path: str, text: str) -> None:
    assert _secret_findings(text, path) == []


# The new rule families, on values and layouts the set does not hold.
NEW_RULES = [
    ("config.json", '{"db": {"password": "Qw8\\"Lm2Zx9"}}\n', ['Qw8\\"Lm2Zx9']),
    ("sys.config", '[{api, [{api_token, "Zk3Rt8Lm2Qw9Xv4Pb7Nc"}]}].\n', ["Zk3Rt8Lm2Qw9Xv4Pb7Nc"]),
    ("config.exs", '[{:password, "Hn4kW9pZq2Lm"}]\n', ["Hn4kW9pZq2Lm"]),
    (
        "Info.plist",
        "<key>StripeSecretKey</key>\n<string>Rt5Lm2Qx9Wz3Kp8Vb4Nc7Hj</string>\n",
        ["Rt5Lm2Qx9Wz3Kp8Vb4Nc7Hj"],
    ),
    (
        "strings.xml",
        '<string name="db_password" translatable="false">Hn4kW9pZq2Lm</string>\n',
        ["Hn4kW9pZq2Lm"],
    ),
    (
        "nginx.conf",
        'proxy_set_header X-Api-Key "Wq8zLm2Rt5Kp9Vb3Xc7Nh4Jd";\n',
        ["Wq8zLm2Rt5Kp9Vb3Xc7Nh4Jd"],
    ),
    (
        "haproxy.cfg",
        "http-request set-header X-Auth-Token Lm2Rt5Kp9Vb3Xc7Nh4JdWq8z\n",
        ["Lm2Rt5Kp9Vb3Xc7Nh4JdWq8z"],
    ),
    ("grant.sql", "SET PASSWORD = PASSWORD('Tz7mQ2xLp9');\n", ["Tz7mQ2xLp9"]),
    (
        "deploy.yaml",
        "- name: API_TOKEN\n  value: Kp9Vb3Xc7Nh4JdWq8zLm2Rt5\n",
        ["Kp9Vb3Xc7Nh4JdWq8zLm2Rt5"],
    ),
    (
        "jwk.json",
        '{\n  "kty": "oct",\n  "k": "Jd7Wq8zLm2Rt5Kp9Vb3Xc7Nh"\n}\n',
        ["Jd7Wq8zLm2Rt5Kp9Vb3Xc7Nh"],
    ),
    (
        "keystore.sh",
        "keytool -genkeypair -keystore k.jks -storepass Vb3Xc7Nh4Jd -keypass Nh4JdWq8zL\n",
        ["Vb3Xc7Nh4Jd", "Nh4JdWq8zL"],
    ),
    ("users.bat", "net user svc_backup Pz7!kQ2mXw /add /y\n", ["Pz7!kQ2mXw"]),
    (
        "wallet.env",
        "PRIVATE_KEY=0x" + "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318\n",
        ["0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"],
    ),
    (
        "init.el",
        '(defvar my-openai-token "Xc7Nh4JdWq8zLm2Rt5Kp9Vb3")\n',
        ["Xc7Nh4JdWq8zLm2Rt5Kp9Vb3"],
    ),
    (
        "jwks.json",
        '{"keys": [\n  {\n    "kty": "EC",\n    "crv": "P-256",\n'
        '    "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",\n'
        '    "d": "Lm2Rt5Kp9Vb3Xc7Nh4JdWq8zQw1Ey6Ui0Op3As"\n  },\n'
        '  {"kty": "oct", "k": "Zx9Cv8Bn7Mq6Wl5Ek4Rj3Th2"}\n]}\n',
        ["Lm2Rt5Kp9Vb3Xc7Nh4JdWq8zQw1Ey6Ui0Op3As", "Zx9Cv8Bn7Mq6Wl5Ek4Rj3Th2"],
    ),
]


@pytest.mark.parametrize(("path", "text", "values"), NEW_RULES)
def test_new_rule_families(path: str, text: str, values: list[str]) -> None:
    assert [f.value for f in _secret_findings(text, path)] == values

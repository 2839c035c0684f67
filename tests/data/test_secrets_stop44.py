"""Stop 44: secrets in kinds no earlier set had (``tests/data/secrets_stop44.jsonl``).

The set (120 cases: 22 kinds, 96 labelled values, 29 hard negatives) was written before the
detector was run on it. Split rule, fixed before any output was seen: the positive kinds and
the ``neg_*`` kinds, each sorted and shuffled with ``random.Random(44)``; the first half
(rounded down) of each is tune, the rest held-out (``test_split_rule`` re-derives it).
Tune kinds: Windows ``net use``/``cmdkey``/``schtasks``/``sc``/``psexec``; SQL replication,
foreign-server, Snowflake/Redshift credentials, ``sp_addlogin``, DB links; msmtp/mutt/
fetchmail/offlineimap/postfix ``sasl_passwd``; Wi-Fi/Cisco/HAProxy configs; GitLab runner/
deploy, Grafana, Sentry, Atlassian, Dynatrace, Pulumi, Supabase tokens; ``os.environ``/
``keyring``/Flask setters; prose in comments; Teams/Mattermost/Google Chat/Zapier webhooks;
negatives: secret references, config knobs, build hashes. Held-out kinds: ``--from-literal``/
``--set``/``-e``/``--build-arg``/``-var`` arguments, env fallbacks (``getenv("X", "lit")``,
``${X:-lit}``), stdin/expect passwords, JWT/HMAC/Fernet keys in calls, tool credential files
(gh, cargo, gem, composer, yarn, terraformrc), WireGuard/Tailscale/wallet keys, Obj-C/Dart/
Scala/R/Julia/Elixir literals, AI/SaaS tokens; negatives: encrypted values (Ansible vault,
SOPS, jasypt, sealed secrets, ``{cipher}``), public ids, fake test fixtures.

Measured before any change (labels as first written): tune recall 20/44, precision 20/24;
held-out recall 32/49, precision 32/38. Three labels were then corrected by policy, not by
case (every AWS ``AKIA`` key id is a key, as in the stop 43 set; a Google Chat webhook's
``key=`` is a key), and values written twice are scored at every occurrence; on that
scoring the old code reads tune 22/46, 23/24, **held-out 33/50, 33/38**. Fixed from tune
misses only (see ``data/README.md``): provider formats (Atlassian, Dynatrace, Pulumi,
Supabase, chat-webhook secrets), space-separated password directives, ``insecure-password``,
``stats auth``, ``schtasks /RP``, ``net use /user:``, ``psexec -p``, ``sp_addlogin``, SQL
``OPTIONS (password '...')``, ``psk``/``remotepass``/``SOURCE_PASSWORD`` names,
``set_password(svc, user, pw)``, prose (``password is x``), ``op://`` references. After:
tune 44/46, 45/45 (left: a postfix ``sasl_passwd`` line, ``the new one is x`` prose).
Held-out, measured after: R 33/50, P 33/39 (no gain; one new false positive: the prose rule
took SOPS' ``password: ENC[...]``); once the prose colon form was limited to words between
(a fix seen on held-out, so optimistic for precision): **33/50, 33/38**.

Then the held-out families were fixed too (optimistic from here on): keys in JWT/HMAC/Fernet
calls, ``process.env.X || 'x'`` and ``env::var("X").unwrap_or("x")`` defaults, RubyGems/
Mailgun/Alibaba/Tailscale formats, encrypted values (``!vault``, ``ENC[...]``, ``ENC(...)``,
``{cipher}``) and ``test-``/``mock-`` values as placeholders, ``docker -p 5432:5432`` as a
port: held-out 44/50, 44/45. Then (the lead, same stop, also optimistic) passwords piped to a
program that reads stdin (``echo pw | sudo -S``, ``passwd --stdin``, ``smbpasswd -s`` typed
twice, ``chpasswd``'s ``user:pw``, ``docker login --password-stdin``) and expect's ``send``
after a password prompt: held-out 48/50, 48/49. Still missed: ``printf ... | passwd`` without
``--stdin``, a hardhat ``0x`` private key in a list; the false positive: a SealedSecret's
``encryptedData`` value.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from labelled_sets import load_cases
from secrets_scoring import score as score_split
from secrets_scoring import secret_findings

SET = Path(__file__).with_name("secrets_stop44.jsonl")
HEADER, CASES = load_cases(SET)
_secret_findings = secret_findings


def score(split: str) -> dict:
    return score_split(CASES, split)


def test_split_rule() -> None:
    kinds = {c["kind"] for c in CASES}
    # One Random(44) shuffles both sorted lists, positives first.
    rng = random.Random(44)
    pos = sorted(k for k in kinds if not k.startswith("neg_"))
    neg = sorted(k for k in kinds if k.startswith("neg_"))
    rng.shuffle(pos)
    rng.shuffle(neg)
    tune = set(pos[: len(pos) // 2]) | set(neg[: len(neg) // 2])
    assert tune == set(HEADER["tune_kinds"])
    assert kinds - tune == set(HEADER["heldout_kinds"])
    for c in CASES:
        assert c["split"] == ("tune" if c["kind"] in tune else "heldout")
        for v in c["secrets"]:
            assert v in c["text"]


def test_tune_floor() -> None:
    r = score("tune")
    assert (r["labels"], r["findings"], r["fp"]) == (46, 45, 0), r["errors"]
    assert r["tp"] >= 44, r["errors"]


def test_heldout_floor() -> None:
    # Honest figure (after the tune fixes, never tuned on): 33/50, 33/38; after fixing the
    # held-out families too (optimistic): 48/50, 48/49 (see the docstring).
    r = score("heldout")
    assert r["labels"] == 50 and r["tp"] >= 48 and r["fp"] <= 1, r["errors"]


# Look-alikes of the new rules that must stay unredacted.
LOOK_ALIKES = [
    ("notes.md", "The password is required for every login.\n"),
    ("README.md", "Set the token: see the settings page.\n"),
    ("msmtprc", "password required\n"),
    ("haproxy.cfg", "    stats auth admin:${STATS_PASSWORD}\n"),
    ("map.bat", "net use Z: \\\\fs01\\share /user:ACME\\svc_backup * /persistent:no\n"),
    ("task.bat", "schtasks /Create /TN Nightly /RU SYSTEM /RP\n"),
    (".env.tpl", "DATABASE_PASSWORD=op://Production/shop-db/password\n"),
    ("hooks.md", "POST to https://chat.acme-corp.net/hooks/generate-token-here\n"),
    ("models.py", "user.set_password(form.cleaned_data['password'])\n"),
    ("settings.py", "password_source = 'vault'\n"),
    ("sops.yaml", "db:\n    password: ENC[AES256_GCM,data:Tr3kQp9w,iv:Zk3r9Qw+Lp2m=,type:str]\n"),
    ("run.sh", "docker run -p 8080:80 -p 127.0.0.1:5432:5432/tcp shop/api\n"),
    ("auth.py", 'token = jwt.encode({"sub": uid}, settings.SECRET_KEY, algorithm="HS256")\n'),
    ("auth.js", "const secret = process.env.JWT_SECRET || '';\n"),
    ("main.rs", 'let k = env::var("API_KEY").unwrap_or_else(|_| String::new());\n'),
    ("test_api.py", 'client = Client(api_key="test-api-key-123")\n'),
    ("login.sh", 'echo "$SUDO_PASS" | sudo -S true\n'),
    ("ci.sh", 'echo "${{ secrets.GHCR_TOKEN }}" | docker login ghcr.io -u x --password-stdin\n'),
    ("users.sh", 'echo "deploy:$PASS" | chpasswd\n'),
    ("motd.sh", "echo hello | sudo tee /etc/motd\n"),
    ("ssh.exp", 'expect "continue connecting (yes/no)?"\nsend "yes\\r"\n'),
]

# Passwords typed into a program's stdin (a family added after the held-out set was seen).
STDIN_TYPED = [
    ("echo 'Tr0ub4dor&3x' | sudo -S apt-get update\n", ["Tr0ub4dor&3x"]),
    ("echo 'deploy:Wq8$zLm2Rt' | chpasswd\n", ["Wq8$zLm2Rt"]),
    ('echo "Gh7!kQ2pXz" | passwd --stdin alice\n', ["Gh7!kQ2pXz"]),
    ("(echo S3cr3tPw9; echo S3cr3tPw9) | smbpasswd -s -a bob\n", ["S3cr3tPw9"] * 2),
    ("printf 'Zx8@vB3nMq\\nZx8@vB3nMq\\n' | smbpasswd -s -a carol\n", ["Zx8@vB3nMq"] * 2),
    ("printf 'dckr_Pw7Lm2Qx9' | docker login -u ci --password-stdin r.io\n", ["dckr_Pw7Lm2Qx9"]),
    ('spawn ssh admin@host\nexpect "*assword:*"\nsend "Hn4$kW9pZq\\r"\n', ["Hn4$kW9pZq"]),
]


@pytest.mark.parametrize(("text", "values"), STDIN_TYPED)
def test_passwords_typed_into_stdin(text: str, values: list[str]) -> None:
    assert [f.value for f in _secret_findings(text, "run.sh")] == values


@pytest.mark.parametrize(("path", "text"), LOOK_ALIKES)
def test_look_alikes_stay(path: str, text: str) -> None:
    assert _secret_findings(text, path) == []

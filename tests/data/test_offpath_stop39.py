"""Off-path probes of stop 39: crashes at seeded points of a build (SIGKILL of the whole
process group on the racy line, via ``DATA_TEST_CRASH_AT``), tokenization's place in the
"manifest last" rule, and HCL password variables."""

from __future__ import annotations

import hashlib
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_build import write_config

from data import build, load_config
from data.cli import main
from data.secrets import password_value_ok

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKENIZE = {"enabled": True, "vocab_size": 300, "num_shards": 2}


def snapshot_hashes(version_dir: Path) -> dict[str, str]:
    """SHA-256 of every file of a version but the run's own (timings, markers, lock)."""
    out = {}
    for f in sorted(version_dir.rglob("*")):
        rel = f.relative_to(version_dir).as_posix()
        if f.is_file() and not rel.startswith("_work/") and rel not in ("report.json", ".lock"):
            out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


class Crash(BaseException):
    """Stands for the process dying (not an Exception: nothing may catch it)."""


def test_crash_during_tokenization_leaves_no_finished_looking_snapshot(
    small_corpus: dict[str, Path], monkeypatch, capsys
) -> None:
    """``manifest.json`` marks a finished snapshot, so it must not exist before the tokens
    are written; once it does, ``data verify`` covers the token files too."""
    import data.tokens

    root = small_corpus["root"]
    ref = write_config(root, small_corpus, out="ref", tokenize=TOKENIZE)
    build(load_config(ref))
    want = snapshot_hashes(load_config(ref).version_dir)
    assert "tokens/index.json" in want

    cfg = write_config(root, small_corpus, out="crashed", tokenize=TOKENIZE)
    real = data.tokens.tokenize_snapshot

    def crash(*a, **k):
        real(*a, **k)
        raise Crash  # the tokens are written, the build dies before it goes on

    monkeypatch.setattr(data.tokens, "tokenize_snapshot", crash)
    vdir = load_config(cfg).version_dir
    with pytest.raises(Crash):
        build(load_config(cfg))
    assert not (vdir / "manifest.json").exists()
    assert main(["verify", str(vdir)]) == 2  # "not a finished build"
    monkeypatch.setattr(data.tokens, "tokenize_snapshot", real)
    build(load_config(cfg))
    assert snapshot_hashes(vdir) == want

    capsys.readouterr()
    assert main(["verify", str(vdir)]) == 0
    shard = next(vdir.glob("tokens/*.array_record"))
    b = bytearray(shard.read_bytes())
    b[len(b) // 2] ^= 0x01
    shard.write_bytes(bytes(b))
    assert main(["verify", str(vdir)]) == 1
    assert f"MISMATCH tokens/{shard.name}" in capsys.readouterr().out


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "point",
    [
        "stage1-1-unmarked",
        "dedup-unmarked",
        "stage3-0-unmarked",
        "manifest-unrenamed",
        "manifest-renamed",
        "tokens-unindexed",
    ],
)
def test_sigkill_at_seeded_point_then_resume_is_identical(
    small_corpus: dict[str, Path], point: str
) -> None:
    """SIGKILL of the whole build (a power cut) on a racy line: files written but their
    marker not, the dedup result computed but not saved, the manifest in place but no
    changelog entry. The rerun gives the bytes of an uninterrupted build."""
    root = small_corpus["root"]
    extra = {"num_shards": 3, "tokenize": TOKENIZE if point.startswith("tokens") else {}}
    ref = write_config(root, small_corpus, out="ref", **extra)
    build(load_config(ref))
    want = snapshot_hashes(load_config(ref).version_dir)
    cfg = write_config(root, small_corpus, out="crashed", **extra)
    cmd = [sys.executable, "-m", "data", "build", str(cfg), "--workers", "2", "--no-progress"]
    env = dict(os.environ, DATA_TEST_CRASH_AT=point)
    first = subprocess.run(cmd, cwd=REPO_ROOT, env=env, start_new_session=True, capture_output=True)
    assert first.returncode == -9, first.stderr.decode()[-2000:]
    vdir = load_config(cfg).version_dir
    # Only a crash after the manifest's rename may leave a finished-looking snapshot.
    assert (vdir / "manifest.json").exists() == (point == "manifest-renamed")
    again = subprocess.run(cmd, cwd=REPO_ROOT, start_new_session=True, capture_output=True)
    assert again.returncode == 0, again.stderr.decode()[-2000:]
    assert snapshot_hashes(vdir) == want
    changelog = (vdir.parent / "CHANGELOG.md").read_text()
    assert changelog.count("## v1 (") == 1


def test_full_disk_while_writing_tokens_is_one_line_and_resumable(
    small_corpus: dict[str, Path], monkeypatch, capsys
) -> None:
    """ArrayRecord reports a full disk as a RuntimeError (seen on a 200 KiB tmpfs:
    "write() failed: No space left on device; writing .../tokens-00000-of-00002
    .array_record; ... Failed to close chunk_writer"): the CLI says what and how to fix in
    one line, and the rerun, with space, gives the uninterrupted build's bytes."""
    from array_record.python import array_record_module as arm

    root = small_corpus["root"]
    ref = write_config(root, small_corpus, out="ref", tokenize=TOKENIZE)
    build(load_config(ref))
    want = snapshot_hashes(load_config(ref).version_dir)

    real = arm.ArrayRecordWriter

    class FullDisk:
        def __init__(self, path: str, options: str) -> None:
            self.path, self.inner = path, real(path, options)

        def write(self, b: bytes) -> None:
            self.inner.write(b)

        def close(self) -> None:
            self.inner.close()
            raise RuntimeError(
                f"write() failed: No space left on device; writing {self.path}; at byte "
                "45056; Failed to close chunk_writer"
            )

    monkeypatch.setattr(arm, "ArrayRecordWriter", FullDisk)
    cfg = write_config(root, small_corpus, out="full", tokenize=TOKENIZE)
    capsys.readouterr()
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert "No space left on device" in err and "tokens-0000" in err and "rerun" in err
    vdir = load_config(cfg).version_dir
    assert not (vdir / "manifest.json").exists()
    monkeypatch.setattr(arm, "ArrayRecordWriter", real)
    assert main(["build", str(cfg), "--no-progress"]) == 0
    assert snapshot_hashes(vdir) == want


@pytest.mark.parametrize("problem", ["missing", "not_json", "no_eos"])
def test_unusable_tokenizer_is_refused_before_curating(
    small_corpus: dict[str, Path], problem: str, capsys
) -> None:
    """``tokenize.tokenizer`` that does not load, or lacks ``tokenize.eos_token``: one line
    naming the key and the fix, before any shard is curated (not a traceback at the end)."""
    from tokenizers import Tokenizer, models

    root = small_corpus["root"]
    path = root / "tok.json"
    if problem == "not_json":
        path.write_text("{not json")
    elif problem == "no_eos":
        Tokenizer(models.BPE()).save(str(path))
    cfg = write_config(root, small_corpus, tokenize=dict(TOKENIZE, tokenizer=str(path)))
    capsys.readouterr()
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    key = "tokenize.eos_token" if problem == "no_eos" else "tokenize.tokenizer"
    assert err.startswith(f"error: {key}: ") and "Fix: " in err and "\n" not in err, err
    assert not (load_config(cfg).version_dir / "_work" / "stage1").exists()


def test_git_source_owned_by_another_user_says_why_git_refuses(
    small_corpus: dict[str, Path], tmp_path: Path, monkeypatch, capsys
) -> None:
    """git (>= 2.35.2) will not read a repository another user owns ("detected dubious
    ownership"), e.g. a checkout on a mounted volume; the build said the folder "is not a
    git repository, or has no commit". It now passes on git's reason and the fix."""
    repo = small_corpus["alpha"]
    if os.geteuid() == 0:  # a real refusal: hand the repository to another user
        for d, _, files in os.walk(repo):
            os.chown(d, 65534, 65534)
            for f in files:
                os.chown(os.path.join(d, f), 65534, 65534)
    else:  # cannot chown: a git that answers as git 2.39 does for such a repository
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "git").write_text(
            "#!/bin/sh\necho \"fatal: detected dubious ownership in repository at '$2'\" >&2\n"
            "exit 128\n"
        )
        (shim / "git").chmod(0o755)
        monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-gitconfig"))
    cfg = write_config(small_corpus["root"], small_corpus)
    capsys.readouterr()
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "dubious ownership" in err, err
    assert f"safe.directory {repo}" in err and "not a git repository" not in err, err


@pytest.mark.parametrize("bytes_kept", [0, 0.5])
def test_damaged_markers_and_plan_from_a_power_cut_are_redone(
    small_corpus: dict[str, Path], bytes_kept: float, capsys, caplog
) -> None:
    """A file renamed into place without fsync can be empty after a power cut (ext4's
    delayed allocation). A damaged completion marker or shard plan stopped every rerun with
    a JSONDecodeError traceback; the work it stood for is now redone, with a warning."""
    root = small_corpus["root"]
    ref = write_config(root, small_corpus, out="ref")
    build(load_config(ref))
    want = snapshot_hashes(load_config(ref).version_dir)
    cfg = write_config(root, small_corpus, out="cut")
    vdir = load_config(cfg).version_dir
    build(load_config(cfg))
    for target in (
        "_work/stage1/00000.done",
        "_work/dedup.done",
        "_work/stage3/00001.done",
        "_work/plan.json",
    ):
        f = vdir / target
        b = f.read_bytes()
        f.write_bytes(b[: int(len(b) * bytes_kept)])
        caplog.clear()
        assert main(["build", str(cfg), "--no-progress"]) == 0, (target, capsys.readouterr().err)
        assert target in caplog.text  # the warning names the damaged file
        assert snapshot_hashes(vdir) == want, target


@pytest.mark.parametrize("damage", ["empty_key_file", "cut_key_file", "bad_env"])
def test_damaged_pii_key_is_refused_not_used(
    small_corpus: dict[str, Path], damage: str, monkeypatch, capsys
) -> None:
    """The PII log's HMAC key: an empty key file (a power cut) was read as the empty key,
    so a resumed build keyed its log with b"" without a word; a DATA_PII_SECRET that is not
    hex was a ValueError traceback. Both are refused in one line with the fix."""
    root = small_corpus["root"]
    cfg = write_config(root, small_corpus)
    key = Path(load_config(cfg).output_dir) / ".pii_secrets" / "v1.key"
    if damage == "bad_env":
        monkeypatch.setenv("DATA_PII_SECRET", "not-hex")
    else:
        build(load_config(cfg))
        key.write_text("" if damage == "empty_key_file" else key.read_text()[:7])
    capsys.readouterr()
    assert main(["build", str(cfg), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "Fix: " in err and "\n" not in err, err
    assert ("DATA_PII_SECRET" if damage == "bad_env" else str(key)) in err


# --- HCL (Terraform) variables whose name says password/secret/token: ``default`` holds
# the value. Written before the rule; the values are made up for this file.
HCL_POSITIVES = [
    (
        'variable "db_password" {\n  type    = string\n  default = "Tr0ub4dor&3x"\n}\n',
        "Tr0ub4dor&3x",
    ),
    ('variable "db_password" { default = "Vq8#mZ2pLw!r" }\n', "Vq8#mZ2pLw!r"),
    (
        'variable "admin_password" {\n  description = "RDS master password"\n'
        '  type        = string\n  sensitive   = true\n  default     = "Hq4$zLx81mWe"  # prod\n}\n',
        "Hq4$zLx81mWe",
    ),
    (
        'variable "datadog_api_key" {\n  type = string\n'
        '  default = "3f9a1c7e5b2d8046af13c9e7b5d20f84"\n}\n',
        "3f9a1c7e5b2d8046af13c9e7b5d20f84",
    ),
    (
        'variable "github_token" {\n  # a machine user\n  default = "kq7Lm9Pz4Rt8Vw3Ny6Bx2Hc5Jd"\n'
        "  validation {\n    condition = length(var.github_token) > 0\n"
        '    error_message = "empty"\n  }\n}\n',
        "kq7Lm9Pz4Rt8Vw3Ny6Bx2Hc5Jd",
    ),
    ('variable "smtp_pass" {\n  type    = string\n  default = "n8Rw!2kLq9Zs"\n}\n', "n8Rw!2kLq9Zs"),
]
HCL_NEGATIVES = [
    'variable "db_password" {\n  type      = string\n  sensitive = true\n}\n',
    'variable "db_password" {\n  default = ""\n}\n',
    'variable "db_password" {\n  default = "changeme"\n}\n',
    'variable "db_password" {\n  default = "${random_password.db.result}"\n}\n',
    'variable "db_password" {\n  default = null\n}\n',
    'variable "api_token" {\n  default = var.fallback_token\n}\n',
    'variable "password_length" {\n  default = 24\n}\n',
    'variable "password_policy" {\n  default = "strict"\n}\n',
    'variable "region" {\n  default = "us-east-1"\n}\n',
    # the default belongs to the next block, not to the password variable
    'variable "db_password" {\n  type = string\n}\n\n'
    'variable "owner" {\n  default = "Kx9fTq2vLm8w"\n}\n',
    # a nested block's default is not the variable's
    'variable "db_password" {\n  validation {\n    default = "Kx9fTq2vLm8w"\n  }\n}\n',
    'resource "aws_db_instance" "db" {\n  password = var.db_password\n}\n',
    'resource "aws_db_instance" "db" {\n  password = random_password.db.result\n}\n',
]


@pytest.mark.parametrize(("text", "value"), HCL_POSITIVES)
@pytest.mark.parametrize("path", ["variables.tf", "modules/db/variables.tf", "vars.hcl"])
def test_hcl_variable_default_under_a_secret_name_is_redacted(
    text: str, value: str, path: str
) -> None:
    from data.pii import redact_text

    out = redact_text(text, lang="HCL", path=path)
    assert value not in out, out
    assert out.startswith("variable ") and "default" in out


@pytest.mark.parametrize("text", HCL_NEGATIVES)
def test_hcl_variable_look_alikes_are_left_alone(text: str) -> None:
    from data.pii import redact_text

    assert redact_text(text, lang="HCL", path="variables.tf") == text


_ATTRS = st.sampled_from(
    [
        "type = string",
        "sensitive = true",
        'description = "the database password"',
        "nullable = false",
        "# set in CI",
        'validation {\n    condition = length(var.x) >= 12\n    error_message = "short"\n  }',
    ]
)
_PASSWORDS = st.text(
    st.sampled_from(string.ascii_letters + string.digits + "!#%&*+-=?@^_"), min_size=12, max_size=24
).filter(lambda v: sum(c.isdigit() for c in v) >= 2 and sum(c.isalpha() for c in v) >= 4)
# The test is about the block syntax: values the detector's value check refuses in any
# syntax (placeholders such as "00000000AAAA") are not drawn.
_PASSWORDS = _PASSWORDS.filter(lambda v: password_value_ok(v, "db_password"))


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["db_password", "master_pass", "rds_admin_password", "smtp_pwd"]),
    before=st.lists(_ATTRS, max_size=3),
    after=st.lists(_ATTRS, max_size=3),
    pad=st.sampled_from([" ", "   ", "\t"]),
    value=_PASSWORDS,
)
def test_hcl_password_default_any_layout(name, before, after, pad, value) -> None:
    """Whatever attributes, nested blocks and comments surround it, the variable's
    ``default`` is redacted, and the other variable's, after it, is not."""
    from data.pii import redact_text

    body = "".join(f"  {a}\n" for a in before) + f'  default{pad}={pad}"{value}"\n'
    body += "".join(f"  {a}\n" for a in after)
    text = f'variable "{name}" {{\n{body}}}\n\n'
    text += f'variable "instance_type" {{\n  default = "{value}"\n}}\n'
    out = redact_text(text, lang="HCL", path="variables.tf")
    assert out.count(value) == 1 and out.endswith(f'default = "{value}"\n}}\n'), out

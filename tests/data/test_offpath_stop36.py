"""Off-path probes, round 36: bit flips on resume, `verify`, links, changing files, signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_build import write_config
from test_offpath_probe import _published, _two_repos
from test_resume import published_bytes

import data
from data import build, load_config
from data.cli import main
from data.config import SourceConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def _table(path: Path) -> pa.Table | None:
    """The file's rows, or None when a page no longer decodes."""
    try:
        return pq.read_table(path)
    except (OSError, ValueError, pa.ArrowException):
        return None


def flip_data_page_byte(path: Path, column: str = "content") -> int:
    """Flip the first bit, in ``column``'s pages or after them (not in the footer), after
    which the file still reads in full but holds other values: a silent change. Returns
    its offset."""
    raw = path.read_bytes()
    original = pq.read_table(path)
    index = original.schema.get_field_index(column)
    col = pq.ParquetFile(path).metadata.row_group(0).column(index)
    start = col.dictionary_page_offset or col.data_page_offset
    for offset in range(start, len(raw) - pq.read_metadata(path).serialized_size):
        flipped = bytearray(raw)
        flipped[offset] ^= 0x01
        path.write_bytes(bytes(flipped))
        table = _table(path)
        if table is not None and not table.equals(original):
            return offset
    raise AssertionError(f"no silent bit flip found in {path}")


def test_flipped_intermediate_byte_is_detected_and_redone(tmp_path: Path, caplog) -> None:
    cfg = _two_repos(tmp_path)
    build(cfg)
    before = _published(cfg.version_dir)
    work = cfg.version_dir / "_work"
    flip_data_page_byte(work / "stage1" / "kept-00001.parquet")
    (work / "stage3" / "00001.done").unlink()  # its published shard still to be written
    build(cfg)
    assert _published(cfg.version_dir) == before
    report = json.loads((cfg.version_dir / "report.json").read_text())
    assert (
        "kept-00001.parquet does not match its recorded sha256"
        in (report["redone_shards"]["stage1"]["1"])
    )
    assert "curate shards: shard 1 redone" in caplog.text


def test_flipped_published_byte_is_reported_by_verify_and_redone(tmp_path: Path, capsys) -> None:
    cfg = _two_repos(tmp_path)
    build(cfg)
    before = _published(cfg.version_dir)
    assert main(["verify", str(cfg.version_dir)]) == 0
    flip_data_page_byte(cfg.version_dir / "shards" / "part-00000.parquet")
    assert list(data.verify_manifest(cfg.version_dir)) == ["shards/part-00000.parquet"]
    capsys.readouterr()
    assert main(["verify", str(cfg.version_dir)]) == 1
    out = capsys.readouterr()
    assert "MISMATCH shards/part-00000.parquet" in out.out and "rerun" in out.err
    build(cfg)  # the marker says done; the file's checksum says otherwise
    assert _published(cfg.version_dir) == before
    report = json.loads((cfg.version_dir / "report.json").read_text())
    assert list(report["redone_shards"]["stage3"]) == ["0"]
    assert data.verify_manifest(cfg.version_dir) == {}


def _group_gone(pgid: int, timeout: float = 20.0) -> bool:
    """Whether every process of the group has exited (workers must not outlive the build)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.multiprocess
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_workers_and_rerun_is_byte_identical(
    small_corpus: dict[str, Path], sig: signal.Signals
) -> None:
    root = small_corpus["root"]
    ref_cfg = write_config(root, small_corpus, out="ref", num_shards=4)
    cfg = write_config(root, small_corpus, out="stopped", num_shards=4)
    build(load_config(ref_cfg))
    vdir = load_config(cfg).version_dir
    markers = vdir / "_work" / "stage1"
    err = root / "stderr.txt"
    env = dict(os.environ, DATA_TEST_SHARD_DELAY_S="1.0")  # each shard takes a second
    with open(err, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "data", "build", str(cfg), "--workers", "2", "--no-progress"],
            cwd=REPO_ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=fh,
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(markers.glob("*.done")):
            time.sleep(0.05)
        os.kill(proc.pid, sig)  # the build's process only, as `kill` or a supervisor does
        assert proc.wait(timeout=60) == 128 + sig
        assert _group_gone(proc.pid), "worker processes outlived the interrupted build"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    text = err.read_text()
    assert f"interrupted ({sig.name})" in text and "rerun" in text, text
    assert "Traceback" not in text, text
    done = len(list(markers.glob("*.done")))
    assert 1 <= done < 4 and not (vdir / "manifest.json").exists(), done
    rerun = subprocess.run(
        [sys.executable, "-m", "data", "build", str(cfg), "--no-progress"],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert published_bytes(vdir) == published_bytes(load_config(ref_cfg).version_dir)


def _ingest_swapping(monkeypatch, repo: Path, target: Path, swap) -> list:
    """Ingest ``repo`` (planned first), running ``swap()`` right after ingest's ``lstat`` of
    ``target``: the file changes between the check and the read, as when a checkout is
    updated during a build."""
    import data.ingest as ingest
    from data.config import IngestConfig

    units = ingest.plan_units([SourceConfig(type="dir", path=str(repo))])

    real = os.lstat

    def lstat(path, *a, **k):
        st = real(path, *a, **k)
        if Path(path) == target:
            swap()
        return st

    monkeypatch.setattr(ingest.os, "lstat", lstat)
    return list(ingest.IngestStep(IngestConfig()).run(units))


def test_file_swapped_for_outside_symlink_during_ingest_is_not_read(
    tmp_path: Path, monkeypatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    victim = repo / "a.py"
    victim.write_text("def a():\n    return 1\n")
    outside = tmp_path / "outside.py"
    outside.write_text("ROOT_PASSWORD = 'from-outside-the-source'\n")

    def swap() -> None:
        victim.unlink()
        victim.symlink_to(outside)

    recs = _ingest_swapping(monkeypatch, repo, victim, swap)
    assert [(r.path, r.drop_reason) for r in recs] == [("a.py", "symlink")]
    assert "from-outside" not in recs[0].content


def test_file_swapped_for_a_fifo_during_ingest_does_not_hang(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    victim = repo / "a.py"
    victim.write_text("def a():\n    return 1\n")

    def swap() -> None:
        victim.unlink()
        os.mkfifo(victim)  # opening a FIFO for reading blocks until a writer comes

    signal.signal(signal.SIGALRM, lambda *a: pytest.fail("ingest blocked on a FIFO"))
    signal.alarm(10)
    try:
        recs = _ingest_swapping(monkeypatch, repo, victim, swap)
    finally:
        signal.alarm(0)
    assert [(r.path, r.drop_reason) for r in recs] == [("a.py", "special_file")]


def test_changelog_entries_of_versions_finishing_together_are_all_kept(
    tmp_path: Path, monkeypatch
) -> None:
    """Two versions built in parallel into one output_dir both append to CHANGELOG.md."""
    import threading

    from data.snapshot import append_changelog

    manifest = {
        "inputs": {"files": 1},
        "outputs": {"files": 1, "bytes": 9},
        "dropped": {"files": 0},
        "code_version": {"source_sha256": "0" * 64},
        "optout_registry_version": 0,
    }
    log_path = tmp_path / "CHANGELOG.md"
    real_write = Path.write_text
    other = threading.Thread(target=append_changelog, args=(tmp_path, "v2", manifest, None))

    def write_text(self: Path, text: str, *a, **k):
        if self.parent == tmp_path and not other.is_alive() and other.ident is None:
            # v1 has read the changelog and is about to write it: v2 finishes meanwhile.
            other.start()
            other.join(timeout=1.0)  # with the changelog locked it cannot finish yet
        return real_write(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", write_text)
    append_changelog(tmp_path, "v1", manifest, None)
    other.join()
    text = log_path.read_text()
    assert "## v1 (" in text and "## v2 (" in text, text


@pytest.mark.parametrize(
    ("section", "hint"),
    [
        ({"filters": {"data_languages": ["JSON", "Yaml"]}}, "did you mean 'YAML'"),
        ({"filters": {"exempt_languages": ["Markdwon"]}}, "did you mean 'Markdown'"),
        ({"filters": {"max_line_lenght": 500}}, "did you mean 'max_line_length'"),
        ({"filtrs": {"max_lines": 5}}, "did you mean 'filters'"),
    ],
)
def test_config_typos_are_refused_with_the_spelling_to_use(
    tmp_path: Path, section: dict, hint: str
) -> None:
    """A misspelt language would match no file and switch its filter off without a word."""
    from data.config import config_from_dict
    from data.errors import DataConfigError

    raw = {"sources": [{"type": "dir", "path": str(tmp_path)}], "output_dir": str(tmp_path)}
    with pytest.raises(DataConfigError, match=hint):
        config_from_dict({**raw, **section})


# Secrets and PII in syntaxes the detector's other sets lack, written before tuning:
# recall 30/44 (0.68), no negative altered. Tuned on these; the HELDOUT cases were written
# after that tuning, before being run (old code 0/12). `.pgpass` lines (no keyword on
# the line) are found by the file's name: tests/data/test_pgpass.py.
OFFPATH_POSITIVES = [
    ("PHP", "config.php", "    'password' => 'Zq8!vLm2Rt4x',", "Zq8!vLm2Rt4x"),
    ("Ruby", "db.rb", '  password: "Wk3#pLz9Qx",', "Wk3#pLz9Qx"),
    ("Elixir", "config/prod.exs", 'config :app, MyApp.Repo, password: "Vt7*qLm3Zx"', "Vt7*qLm3Zx"),
    ("Lua", "init.lua", 'local api_key = "Hk29sLq8Xv3mNp7Rt2Wb"', "Hk29sLq8Xv3mNp7Rt2Wb"),
    ("Swift", "Keys.swift", 'let apiKey = "Jd83kLm29Qx7Vn4Rt8Yb"', "Jd83kLm29Qx7Vn4Rt8Yb"),
    (
        "Shell",
        "get.sh",
        "wget --http-password=Lq8vXm2Rt7Zk https://files.corp.dev/a.tgz",
        "Lq8vXm2Rt7Zk",
    ),
    (
        "Text",
        "azure.txt",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg==;EndpointSuffix=core.windows.net",
        "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZg==",
    ),
    (
        "Python",
        "client.py",
        'r = requests.get(url, auth=("svc_api", "Kx7vLq2Rm9Zt"))',
        "Kx7vLq2Rm9Zt",
    ),
    (
        "Java",
        "Client.java",
        'creds = new UsernamePasswordCredentials("svc", "Wq8vLm3Xz7Rt");',
        "Wq8vLm3Xz7Rt",
    ),
    ("C#", "Client.cs", 'var cred = new NetworkCredential("svc", "Tz9vLq2Xm8Rk");', "Tz9vLq2Xm8Rk"),
    ("Go", "client.go", 'req.SetBasicAuth("svc", "Mv7qLz2Xr9Tk")', "Mv7qLz2Xr9Tk"),
    ("fish", "config.fish", "set -gx API_TOKEN Qz8vLm3Xr7Tk2Wp9", "Qz8vLm3Xr7Tk2Wp9"),
    ("PowerShell", "env.ps1", '$env:API_KEY = "Rk8vLq3Xm7Zt2Wp9"', "Rk8vLq3Xm7Zt2Wp9"),
    ("Batchfile", "env.bat", "setx API_KEY Lm8vQz3Xr7Tk2Wp9", "Lm8vQz3Xr7Tk2Wp9"),
    ("INI", "app.service", 'Environment="DB_PASSWORD=Xr7vLq3Zm8Tk"', "Xr7vLq3Zm8Tk"),
    ("Python", "nb.ipynb", '    "api_key = \\"Vk8qLm3Xr7Tz2Wp9\\"\\n",', "Vk8qLm3Xr7Tz2Wp9"),
    ("SQL", "users.sql", "ALTER USER app WITH PASSWORD 'Zr8vLq3Xm7Tk';", "Zr8vLq3Xm7Tk"),
    ("SQL", "users.sql", "CREATE USER svc PASSWORD 'Kq7vLz3Xm8Rt';", "Kq7vLz3Xm8Rt"),
    ("Text", "redis.conf", "requirepass Hq8vLm3Xz7Rk", "Hq8vLm3Xz7Rk"),
    ("Text", "redis.conf", "masterauth Tq8vLm3Xz7Rk", "Tq8vLm3Xz7Rk"),
    ("Shell", "db.sh", "mysql -h db.corp.dev -uroot -pXq8vLm3Zr7Tk app", "Xq8vLm3Zr7Tk"),
    (
        "Shell",
        "db.sh",
        'psql "host=db.corp.dev user=svc password=Zq8vLm3Xr7Tk dbname=app"',
        "Zq8vLm3Xr7Tk",
    ),
    ("Shell", "smb.sh", "smbclient //files.corp.dev/share -U svc%Rq8vLm3Xz7Tk", "Rq8vLm3Xz7Tk"),
    (
        "Visual Basic .NET",
        "Keys.vb",
        'Dim apiKey As String = "Nq8vLm3Xz7Rk2Wt9"',
        "Nq8vLm3Xz7Rk2Wt9",
    ),
    ("Perl", "db.pl", "my $db_pass = 'Mq8vLm3Xz7Rk';", "Mq8vLm3Xz7Rk"),
    ("R", "keys.R", 'api_key <- "Bq8vLm3Xz7Rk2Wt9"', "Bq8vLm3Xz7Rk2Wt9"),
    (
        "Python",
        "settings.py",
        'API_KEY = os.getenv("API_KEY", "Gq8vLm3Xz7Rk2Wt9")',
        "Gq8vLm3Xz7Rk2Wt9",
    ),
    ("Clojure", "db.clj", '{:user "svc" :password "Dq8vLm3Xz7Rk"}', "Dq8vLm3Xz7Rk"),
    ("Go", "main.go", 'os.Setenv("API_TOKEN", "Cq8vLm3Xz7Rk2Wt9")', "Cq8vLm3Xz7Rk2Wt9"),
    ("Java", "Main.java", 'System.setProperty("db.password", "Eq8vLm3Xz7Rk");', "Eq8vLm3Xz7Rk"),
    ("Objective-C", "Keys.m", 'NSString *apiKey = @"Uq8vLm3Xz7Rk2Wt9";', "Uq8vLm3Xz7Rk2Wt9"),
    ("C++", "keys.cc", 'const char* kApiKey = R"(Hq8vLm3Xz7Rk2Wt9)";', "Hq8vLm3Xz7Rk2Wt9"),
    ("Python", "settings.py", 'SECRET_KEY = b"Jq8vLm3Xz7Rk2Wt9"', "Jq8vLm3Xz7Rk2Wt9"),
    ("Python", "settings.py", "PASSWORD = r'Kq8vLm3Xz7Rk'", "Kq8vLm3Xz7Rk"),
    ("C#", "Keys.cs", 'string password = @"Lq8vLm3Xz7Rk";', "Lq8vLm3Xz7Rk"),
    ("Rust", "keys.rs", 'const TOKEN: &[u8] = b"Pq8vLm3Xz7Rk2Wt9";', "Pq8vLm3Xz7Rk2Wt9"),
    ("JavaScript", "keys.js", "const token = `Nq8vLm3Xz7Rk2Wt9`;", "Nq8vLm3Xz7Rk2Wt9"),
    (
        "HTML",
        "contact.html",
        '<a href="mailto:jane.doe@fernhill.io">mail</a>',
        "jane.doe@fernhill.io",
    ),
    (
        "Text",
        "COMMIT_MSG",
        "Signed-off-by: Jane Doe <jane.doe@fernhill.io>",
        "jane.doe@fernhill.io",
    ),
    ("Python", "notify.py", 'TO = "jane.doe+ci@fernhill.io"', "jane.doe+ci@fernhill.io"),
    ("Python", "api.py", 'BASE = "http://151.101.1.69:8080/api"', "151.101.1.69"),
    (
        "Python",
        "api.py",
        'BASE = "http://[2a03:2880:f10c:83:face:b00c:0:25de]:443/"',
        "2a03:2880:f10c:83:face:b00c:0:25de",
    ),
    ("Text", "nginx.conf", "allow 151.101.64.7;", "151.101.64.7"),
]
HELDOUT_POSITIVES = [
    ("C#", "A.cs", 'private const string ApiSecret = $"Tg5wPn8Kr2Lx9Vq4";', "Tg5wPn8Kr2Lx9Vq4"),
    (
        "Objective-C",
        "A.m",
        'static NSString * const kClientSecret = @"Hb6yMq3Rt8Wz2Kp7";',
        "Hb6yMq3Rt8Wz2Kp7",
    ),
    (
        "Visual Basic .NET",
        "A.vb",
        'Private Const DbPassword As String = "Jn4!vQ8zLx"',
        "Jn4!vQ8zLx",
    ),
    ("tcsh", "env.csh", "setenv GITHUB_TOKEN Fw7hNq2Lp9Xz4Rk8Tb3", "Fw7hNq2Lp9Xz4Rk8Tb3"),
    ("fish", "c.fish", "set -Ux OPENAI_API_KEY Pz3kWq8Nv2Lr7Xm4Tb9", "Pz3kWq8Nv2Lr7Xm4Tb9"),
    ("Text", "sentinel.conf", "masterauth Vq9#mLx2Tz", "Vq9#mLx2Tz"),
    ("SQL", "r.sql", "ALTER ROLE reporting PASSWORD 'Rt5*nKq8Wz';", "Rt5*nKq8Wz"),
    ("Shell", "r.sh", "rpcclient -U admin%Gz8!kLq2Vx dc01.corp.dev", "Gz8!kLq2Vx"),
    ("Clojure", "c.clj", '(def db {:dbtype "postgresql" :password "Mx7$qLz3Wt"})', "Mx7$qLz3Wt"),
    ("Go", "c.go", 'r.SetBasicAuth(cfg.User, "Qw8#zLm4Tx")', "Qw8#zLm4Tx"),
    ("Rust", "k.rs", 'let secret_key = br"Kz5vWq9Lm2Tx8Np3";', "Kz5vWq9Lm2Tx8Np3"),
    ("C++", "k.cc", 'const std::string kAuthToken = R"(Lq4Wz8Tm2Vx7Kn3P)";', "Lq4Wz8Tm2Vx7Kn3P"),
]
OFFPATH_NEGATIVES = [
    ("Python", "a.py", "password = getpass.getpass()"),
    ("Python", "a.py", 'api_key = os.environ["API_KEY"]'),
    ("Python", "a.py", 'API_KEY = os.getenv("API_KEY", "")'),
    ("Text", "redis.conf", 'requirepass ""'),
    ("SQL", "u.sql", "ALTER USER app WITH PASSWORD :pw;"),
    ("Objective-C", "k.m", 'NSString *apiKey = @"";'),
    ("JavaScript", "k.js", "const token = `${prefix}-${id}`;"),
    ("Python", "s.py", 'SECRET_KEY = b""'),
    ("fish", "c.fish", "set -gx PATH $PATH /usr/local/bin"),
    ("Python", "c.py", "r = requests.get(url, auth=(user, password))"),
    ("Go", "c.go", "req.SetBasicAuth(user, pass)"),
    ("Shell", "db.sh", "mysql -h db.corp.dev -u root -p app"),
    ("Shell", "smb.sh", "smbclient //files.corp.dev/share -U svc"),
    ("Text", "redis.conf", "# requirepass foobared"),
    ("PowerShell", "e.ps1", '$env:PATH = "$env:PATH;C:\\tools"'),
    ("Text", "nginx.conf", "allow 10.0.0.0/8;"),
    ("fish", "c.fish", "set -gx API_TOKEN (cat ~/.token)"),
    ("Shell", "r.sh", "smbclient -L dc01 -U guest%"),
    ("SQL", "r.sql", "CREATE USER reporting PASSWORD NULL;"),
    ("C#", "A.cs", 'string password = @"{0}";'),
    ("Visual Basic .NET", "A.vb", "Dim password As String = Console.ReadLine()"),
    ("Text", "redis.conf", "requirepass ${REDIS_PASSWORD}"),
]


@pytest.mark.parametrize(("lang", "path", "text", "value"), OFFPATH_POSITIVES + HELDOUT_POSITIVES)
def test_secret_in_offpath_syntax_is_redacted(lang: str, path: str, text: str, value: str) -> None:
    from data.pii import redact_text

    assert value not in redact_text(text, lang=lang, path=path)


@pytest.mark.parametrize(("lang", "path", "text"), OFFPATH_NEGATIVES)
def test_offpath_non_secret_is_left_alone(lang: str, path: str, text: str) -> None:
    from data.pii import redact_text

    assert redact_text(text, lang=lang, path=path) == text

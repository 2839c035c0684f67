"""Every dashboard page in headless Chromium (Debian's package, driven by Playwright) against
a store filled by real searches and a real dataset build: content, charts, a live update
while a trial reports, and screenshots saved as test artifacts.

Screenshots go to ``$JAXCORE_UI_ARTIFACTS`` (default: a pytest temporary directory).
Without ``/usr/bin/chromium`` these tests FAIL (never skip): run scripts/ci-chromium.sh.
"""

from __future__ import annotations

import os
import pathlib
import threading
import time

import pytest
import uvicorn

from jaxcore.experiments import Store
from jaxcore.launch import free_port
from jaxcore.ui import create_app
from tests.jaxcore.ui.conftest import ASHA_TRIALS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000


def fmt(v: float) -> str:
    """The page's number format (UI.fmt): 6 significant digits, no trailing zeros."""
    return f"{v:.6g}" if not float(v).is_integer() else str(int(v))


def require_chromium(path: str = CHROMIUM) -> None:
    """Fail (never skip) when the browser is missing, saying how to install it."""
    if not os.path.exists(path):
        pytest.fail(
            f"{path} is missing: the dashboard's browser tests need Debian's "
            "chromium; install it with: bash scripts/ci-chromium.sh"
        )


def test_missing_chromium_fails_with_the_fix(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"bash scripts/ci-chromium\.sh"):
        require_chromium(str(tmp_path / "no-chromium"))


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        pytest.fail(f"the playwright package is missing ({e}): pip install -e '.[ui]'")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(filled):
    app = create_app(filled.db_url, datasets=[filled.dataset_dir])
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> pathlib.Path:
    out = os.environ.get("JAXCORE_UI_ARTIFACTS")
    path = pathlib.Path(out) if out else tmp_path_factory.mktemp("ui-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def page(browser, server, artifacts, request):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    # Offline: any request that is not to the dashboard itself fails the test.
    outside: list[str] = []
    pg.route(
        "**/*",
        lambda route: (
            route.continue_()
            if route.request.url.startswith(server)
            else (outside.append(route.request.url), route.abort())
        ),
    )
    pg.base = server
    yield pg
    shot = artifacts / f"{request.node.name}.png"
    pg.screenshot(path=str(shot), full_page=True)
    ctx.close()
    assert shot.stat().st_size > 10_000, f"screenshot {shot} looks empty"
    assert not outside, f"the page reached outside the dashboard: {outside}"
    assert not errors, f"browser errors: {errors}"


@pytest.fixture(scope="module")
def store(filled):
    s = Store(filled.db_url, create=False)
    yield s
    s.close()


def chart_points(page, canvas_id: str) -> dict[str, int]:
    return page.evaluate(
        "id => Object.fromEntries(Chart.getChart(id).data.datasets"
        ".map(d => [d.label, d.data.length]))",
        canvas_id,
    )


def test_experiments_page(page, filled, store):
    page.goto(page.base + "/")
    row = page.locator(f'tr[data-experiment="{filled.asha_id}"]')
    row.locator("td.trials").wait_for()
    assert row.locator("td.trials").inner_text() == str(ASHA_TRIALS)
    assert row.locator("td.searcher").inner_text() == "adaptive_asha"
    assert row.locator("td.best").inner_text() == fmt(
        store.experiment(filled.asha_id)["best_metric"]
    )
    assert f"{ASHA_TRIALS}/{ASHA_TRIALS} trials" in row.locator("td.progress-cell").inner_text()
    assert page.locator("#experiments tbody tr").count() == len(store.experiments())


def test_asha_experiment_page(page, filled, store):
    page.goto(f"{page.base}/experiments/{filled.asha_id}")
    page.locator("#trials-table").wait_for()
    assert page.locator("#trial-count").inner_text() == str(ASHA_TRIALS)
    assert page.locator("#trials-table tbody tr").count() == ASHA_TRIALS
    assert page.locator("#best-metric").inner_text() == fmt(
        store.experiment(filled.asha_id)["best_metric"]
    )
    # One curve per trial, each with as many points as the trial reported validations.
    want = {
        f"trial {t['id']}": len(store.metrics(t["id"], kind="validation"))
        for t in store.trials(filled.asha_id)
    }
    assert chart_points(page, "curves") == want
    assert chart_points(page, "scatter") == {"x vs loss": ASHA_TRIALS}
    brackets = {tuple(t["milestones"]) for t in store.trials(filled.asha_id)}
    assert page.locator(".bracket").count() == len(brackets)
    assert page.locator("#search-title").inner_text() == "ASHA rungs"


def test_pbt_experiment_page_draws_the_lineage(page, filled, store):
    page.goto(f"{page.base}/experiments/{filled.pbt_id}")
    page.locator("svg#lineage").wait_for()
    children = [t for t in store.trials(filled.pbt_id) if t["parent_trial"] is not None]
    edges = page.locator("svg#lineage path.edge")
    assert edges.count() == len(children) > 0
    drawn = {
        (
            int(edges.nth(i).get_attribute("data-parent")),
            int(edges.nth(i).get_attribute("data-child")),
        )
        for i in range(edges.count())
    }
    assert drawn == {(t["parent_trial"], t["id"]) for t in children}
    assert "lr " in page.locator("svg#lineage text.explore").first.text_content()


def test_trial_page(page, filled, store):
    t = store.trials(filled.grid_id)[0]
    page.goto(f"{page.base}/trials/{t['id']}")
    page.locator("#checkpoints-table").wait_for()
    ckpts = store.checkpoints(trial_id=t["id"])
    assert page.locator("#checkpoints-table tbody tr").count() == len(ckpts)
    first = page.locator(f'tr[data-checkpoint="{ckpts[0]["id"]}"]').inner_text()
    assert f"loss={fmt(ckpts[0]['metrics']['loss'])}" in first
    assert chart_points(page, "curve-validation") == {
        "loss": len(store.metrics(t["id"], kind="validation"))
    }


def test_failed_trial_shows_restarts_and_logs(page, filled, store):
    t = next(t for t in store.trials(filled.fails_id) if t["hparams"]["fail"])
    page.goto(f"{page.base}/trials/{t['id']}")
    page.locator("#restarts").wait_for()
    page.wait_for_function("document.getElementById('logs').textContent.length > 20")
    assert page.locator("#restarts").inner_text() == str(t["restarts"]) == "1"
    assert "RuntimeError: this trial always fails" in page.locator("#logs").inner_text()


def test_models_page(page, filled, store):
    page.goto(page.base + "/models")
    row = page.locator(f'.model[data-model="{filled.model}"] tr[data-version="1"]')
    row.wait_for()
    assert row.locator("td.aliases").inner_text() == "production"
    lineage = row.locator("td.lineage")
    assert f"experiment #{filled.grid_id}" in lineage.inner_text()
    link = lineage.locator(f'a[href="/datasets#{filled.dataset_dir.name}/v2"]')
    assert link.inner_text() == f"{filled.dataset_dir.name} v2"


def test_datasets_page(page, filled):
    page.goto(page.base + "/datasets")
    page.locator(".diff-added .count").wait_for()
    assert page.locator("table.versions tbody tr").count() == 2
    assert page.locator(".diff-added .count").inner_text() == "1"
    assert page.locator(".diff-changed .count").inner_text() == "1"
    assert "alpha/src/added.py" in page.locator(".diff-added").inner_text()
    v1 = page.locator('.version[data-version="v1"]')
    assert v1.locator('tr[data-stage="ingest"] td.dropped').inner_text() == "1"  # blob.bin
    assert "Python" in v1.locator(".languages").inner_text()
    assert "permissive" in v1.locator(".licenses").inner_text()
    # Diff the other way round from the page's own controls.
    page.select_option("select.diff-a", "v2")
    page.select_option("select.diff-b", "v1")
    page.click("button.diff-run")
    page.wait_for_function("document.querySelector('.diff-removed .count')?.textContent === '1'")


def test_live_update_while_a_trial_reports(page, filled, store):
    """A metric row written through the store while the page is open shows up, no reload."""
    page.goto(f"{page.base}/experiments/{filled.asha_id}")
    page.locator("#trials-table").wait_for()
    trial = store.trials(filled.asha_id)[0]["id"]
    before = chart_points(page, "curves")[f"trial {trial}"]
    page.evaluate("window.__same_document = true")
    store.add_metrics(trial, 10_000, {"loss": 9.87654}, kind="validation")
    cell = page.locator(f'tr[data-trial="{trial}"] td.latest')
    page.wait_for_function(
        't => document.querySelector(`tr[data-trial="${t}"] td.latest`).textContent'
        " === '9.87654'",
        arg=trial,
    )
    assert cell.inner_text() == "9.87654"
    assert chart_points(page, "curves")[f"trial {trial}"] == before + 1
    assert page.evaluate("window.__same_document") is True  # updated in place, not reloaded


def test_experiment_list_live_when_a_search_starts(page, store):
    page.goto(page.base + "/")
    page.locator("#experiments").wait_for()
    n = page.locator("#experiments tbody tr").count()
    exp_id = store.create_experiment(
        "started-while-watching",
        {"searcher": {"name": "random", "metric": "loss", "max_trials": 3}},
        "/tmp/nowhere",
    )
    row = page.locator(f'tr[data-experiment="{exp_id}"]')
    row.wait_for()
    assert page.locator("#experiments tbody tr").count() == n + 1
    assert row.locator("td.searcher").inner_text() == "random"
    assert "0/3 trials" in row.locator("td.progress-cell").inner_text()


def test_trial_page_live(page, filled, store):
    trial = store.trials(filled.asha_id)[1]["id"]
    page.goto(f"{page.base}/trials/{trial}")
    page.locator("#checkpoints").wait_for()
    page.wait_for_function("Chart.getChart('curve-training') !== undefined")
    assert chart_points(page, "curve-training") == {}
    store.add_metrics(trial, 3, {"train_loss": 2.5, "lr": 0.1})
    page.wait_for_function(
        "Chart.getChart('curve-training').data.datasets.map(d => d.label).join()"
        " === 'lr,train_loss'"
    )
    assert chart_points(page, "curve-training") == {"lr": 1, "train_loss": 1}

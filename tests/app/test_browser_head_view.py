"""The Head view and kept settings in a real headless Chromium (Debian's, through Playwright):
the embedded model's head over an 8k-token prompt computed on the CPU, the 128k-token view an
H200 computed for a random Llama-3-8B-shaped model (benchmarks/head_view_128k.py) opened from
its file, each page's JavaScript heap measured (under 1 GiB), and the settings of the
Interventions and Head detail pages kept when the user leaves and comes back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_browser import ARTIFACTS, CHROMIUM, chromium_page, free_port, keep_screenshot
from test_browser import wait_healthy as wait_up

from headhunt.rundir import RunDir
from headhunt.scores import HeadScores

REPO = Path(__file__).resolve().parents[2]
VIEW_128K = REPO / "benchmarks/results/head_view/head_view_llama8b_128k_h200.npz"
GIB = 2**30

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=f"no Chromium at {CHROMIUM}"),
]


def smol_run(root: Path) -> None:
    """A sinks run of smollm2-135m's shape (30 x 9, 3 KV heads): the Head view's model."""
    run = RunDir.open(root / "smol-sinks", "sinks", parameters={"tau": 0.1})
    m = np.random.default_rng(0).uniform(0, 0.3, (30, 9))
    HeadScores.from_matrix("hidden_sink_mass", m, n_kv_heads=3).to_parquet(
        run.path("scores.parquet")
    )
    shape = {"spec": "smollm2-135m", "n_layers": 30, "n_heads": 9, "n_kv_heads": 3}
    run.finalize(model=shape, parameters={"tau": 0.1}, timings={"texts_s": 1.0})


@pytest.fixture(scope="module")
def smol_server(tmp_path_factory):
    """One server for the module's tests (a start costs seconds: the suite's time is kept)."""
    tmp_path = tmp_path_factory.mktemp("smol-server")
    root = tmp_path / "runs"
    smol_run(root)
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "headhunt", "app", "--runs", str(root), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url, proc, log)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:  # a model thread can hold it: no need to wait
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def js_heap(page) -> int:
    """The page's JavaScript heap in use (bytes), from Chromium's performance metrics."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Performance.enable")
    metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    return int(metrics["JSHeapUsedSize"])


def record(name: str, **values) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "head_view_browser.json"
    got = json.loads(path.read_text()) if path.is_file() else {}
    got[name] = values
    path.write_text(json.dumps(got, indent=1))


def look_at_query(page, query: int, timeout: int = 120_000) -> None:
    from playwright.sync_api import expect

    box = page.get_by_label("query (exact row)")
    box.fill(str(query))
    box.press("Enter")
    expect(page.get_by_role("heading", name=f"Query {query}: where it looks")).to_be_visible(
        timeout=timeout
    )


@pytest.mark.slow
def test_head_view_of_the_embedded_model_at_8k_tokens(smol_server, tmp_path):
    from playwright.sync_api import expect

    with chromium_page() as page:
        page.goto(f"{smol_server}/?page=Head+view&run=smol-sinks&layer=3&head=0")
        expect(page.get_by_role("heading", name="Head view 3-0")).to_be_visible()
        tokens = page.get_by_label("tokens", exact=True)
        tokens.fill("8192")
        tokens.press("Enter")
        page.get_by_role("button", name="Compute the head view of 3-0").click()
        expect(page.get_by_text("8,192 tokens")).to_be_visible(timeout=420_000)
        expect(page.locator(".js-plotly-plot")).to_have_count(3)
        expect(page.locator(".hh-context").first).to_be_visible()
        look_at_query(page, 4000)
        heap = js_heap(page)
        record("smollm2-135m 8k", js_heap_bytes=heap, tokens=8192, layer=3, head=0)
        assert heap < GIB, heap
        keep_screenshot(page, tmp_path, "dashboard_head_view_8k.png")


@pytest.mark.slow
@pytest.mark.skipif(not VIEW_128K.is_file(), reason="the 128k view's file is not in this checkout")
def test_the_128k_view_computed_on_a_gpu_opens_under_1_gib(smol_server, tmp_path):
    from playwright.sync_api import expect

    with chromium_page() as page:
        page.goto(f"{smol_server}/?page=Head+view&run=smol-sinks")
        page.get_by_text("a saved head view (.npz)").click()
        path = page.get_by_label("head view file (.npz)")
        path.fill(str(VIEW_128K))
        path.press("Enter")
        page.get_by_role("button", name="Open this head view").click()
        expect(page.get_by_text("131,072 tokens")).to_be_visible(timeout=180_000)
        expect(page.locator(".js-plotly-plot")).to_have_count(3)
        expect(page.get_by_role("heading", name="Query 131071: where it looks")).to_be_visible()
        look_at_query(page, 99614)  # a row the GPU kept
        heap = js_heap(page)
        record("random Llama-3-8B shape 128k (H200)", js_heap_bytes=heap, tokens=131072)
        assert heap < GIB, heap
        keep_screenshot(page, tmp_path, "dashboard_head_view_128k.png")


def test_settings_survive_leaving_the_page(smol_server):
    """Issue 29: leaving Interventions or Head detail reset their settings (and with them the
    result computed under non-default ones)."""
    from playwright.sync_api import expect

    # Each click reruns the Streamlit script; on a busy 2-core machine a rerun can take
    # longer than playwright's 5 s default (the first full-suite run here failed on it).
    expect.set_options(timeout=30_000)
    with chromium_page() as page:
        page.goto(f"{smol_server}/?page=Interventions&run=smol-sinks")
        sidebar = page.get_by_test_id("stSidebar")
        expect(page.get_by_role("heading", name="Interventions")).to_be_visible()
        page.get_by_text("ACT calibration").click()
        expect(page.get_by_label("ACT calibration")).to_be_checked()
        random_box = page.get_by_test_id("stCheckbox").filter(has_text="random heads")
        random_box.click()
        # Set before leaving (a click during the rerun the last one started went unseen once
        # in a full-suite run): what is checked here is what leaving must keep.
        expect(random_box.locator("input")).to_be_checked()
        typed = page.get_by_label("or type heads (LAYER-HEAD, comma separated)")
        typed.fill("4-4")
        typed.press("Enter")
        expect(page.get_by_role("button", name="Answer before and after")).to_contain_text("4-4")

        sidebar.get_by_text("Runs", exact=True).click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        sidebar.get_by_text("Interventions", exact=True).click()
        expect(page.get_by_role("heading", name="Interventions")).to_be_visible()
        expect(page.get_by_label("ACT calibration")).to_be_checked()
        expect(page.get_by_label("or type heads (LAYER-HEAD, comma separated)")).to_have_value(
            "4-4"
        )
        expect(random_box.locator("input")).to_be_checked()

        sidebar.get_by_text("Head view", exact=True).click()
        tokens = page.get_by_label("tokens", exact=True)
        tokens.fill("777")
        tokens.press("Enter")
        sidebar.get_by_text("Runs", exact=True).click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        sidebar.get_by_text("Head view", exact=True).click()
        expect(page.get_by_label("tokens", exact=True)).to_have_value("777")

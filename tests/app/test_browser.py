"""End to end in a real headless Chromium: `headhunt app` on loopback, open a run, pick a head
on the heads map, read its detail page, compute its attention on a prompt; the screenshot is
kept under artifacts/ (git-ignored) as the test's artifact."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from headhunt import inspect as hi

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).is_file(), reason=f"no Chromium at {CHROMIUM}"),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None, reason="playwright is not installed"
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}):\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().decode().strip() == "ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the server was not healthy after {timeout}s:\n{log.read_text()[-2000:]}")


@pytest.fixture
def server(runs_root, tmp_path):
    """`headhunt app` on a free loopback port; always stopped (its whole process group)."""
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headhunt",
                "app",
                "--runs",
                str(runs_root),
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill below reaches all of it
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, log)
        yield url
    finally:
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue


@contextlib.contextmanager
def chromium_page():
    """A page of a headless Chromium (Debian's, never a downloaded one), closed after use."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # the first render imports torch on a busy machine
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


def keep_screenshot(page, tmp_path, name: str) -> None:
    """The whole page (Streamlit scrolls inside its main block: grow the viewport to it)."""
    height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 50, 6000)})
    page.wait_for_timeout(3000)  # let the charts repaint at the new size
    shot = tmp_path / name
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / name)


def test_open_a_run_pick_a_head_and_see_its_detail(server, runs_root, tmp_path):
    from playwright.sync_api import expect

    with chromium_page() as page:
        page.goto(server)
        sidebar = page.get_by_test_id("stSidebar")
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        # The broken run folders are reported, the good runs still listed.
        expect(page.get_by_text("unfinished run: rerun its command with --resume")).to_be_visible()

        # Issue 18.2: the Runs table follows the sidebar: open a run from the table, another
        # from the sidebar, then the first one from the table again (that click did nothing
        # while the table kept its old tick). The grid is drawn on a canvas: click rows by
        # position (a header and rows of 35 px, in the catalog's order).
        order = [e.name for e in hi.scan_runs(runs_root)]
        run_picker = sidebar.get_by_role("combobox", name="run")

        def click_row(name: str) -> None:
            page.wait_for_timeout(1000)  # the table redraws for the open run
            box = page.get_by_test_id("stDataFrame").first.bounding_box()
            page.mouse.click(box["x"] + 18, box["y"] + 35 * (order.index(name) + 1) + 17)
            expect(page.get_by_role("heading", name=f"Run {name}")).to_be_visible()

        click_row("ngram-tiny")
        sidebar.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="sinks-tiny (sinks)").click()
        expect(page.get_by_role("heading", name="Run sinks-tiny")).to_be_visible()
        click_row("ngram-tiny")
        expect(run_picker).to_have_value("ngram-tiny (ngram)")

        # Open the retrieval run from the sidebar's run picker.
        sidebar.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="retrieval-tiny (retrieval)").click()
        expect(page.get_by_role("heading", name="Run retrieval-tiny")).to_be_visible()

        # Pick head 1-2 by clicking its cell on the heads map (2 layers x 4 heads).
        sidebar.get_by_text("Heads map", exact=True).click()
        expect(page.get_by_text("Top heads by retrieval_score")).to_be_visible()
        plot = page.locator(".js-plotly-plot .nsewdrag").first
        expect(plot).to_be_visible()
        box = plot.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 2.5 / 4, box["y"] + box["height"] * 0.25)
        expect(page.get_by_role("heading", name="Head 1-2")).to_be_visible()
        expect(sidebar.get_by_label("layer", exact=True)).to_have_value("1")
        expect(sidebar.get_by_label("head", exact=True)).to_have_value("2")
        expect(page.get_by_text("layer 1, query head 2, KV head 1 of run")).to_be_visible()
        expect(page.get_by_text("Where its argmax landed: the needle")).to_be_visible()

        # Its attention on the default prompt, computed by the server on the tiny model.
        page.get_by_role("button", name="Compute attention").click()
        expect(page.get_by_text("first-token sink mass s_0 =")).to_be_visible()
        text = page.inner_text("body")
        assert "Head 1-2" in text and "retrieval_score" in text
        assert "?page=Head+detail" in page.url or "page=Head%20detail" in page.url

        expect(page.get_by_text("attention weight: 0")).to_be_visible()  # the legend
        keep_screenshot(page, tmp_path, "dashboard_head_detail.png")


@pytest.fixture
def slower_model(tmp_path) -> str:
    """A random Llama big enough that a 2000-token intervention with its control takes ~15 s
    on an idle 2-core CPU, so a run switch lands while it computes (at width 512 it took 3.9 s
    on CI and finished before the switch: a flaky test); of the fixture runs' shape (2 layers
    x 4 heads), as the app refuses an override model whose heads are not the run's."""
    from headhunt.probes.tiny import tiny_llama

    m = tiny_llama(n_layers=2, n_heads=4, n_kv_heads=2, d_model=2048, max_context=4096)
    folder = tmp_path / "slower-model"
    m.model.save_pretrained(folder)
    m.tokenizer.save_pretrained(folder)
    return str(folder)


def test_switching_runs_during_an_intervention_keeps_its_result_with_its_run(
    server, slower_model, tmp_path
):
    """Issue 18.1: start an intervention, switch to another run while it computes, come back.
    The other run never shows the first run's answers and gets its own top heads; the work
    is not lost; the result comes back under the settings that produced it."""
    from playwright.sync_api import expect

    with chromium_page() as page:
        page.goto(f"{server}/?page=Interventions&run=retrieval-tiny")
        sidebar = page.get_by_test_id("stSidebar")
        expect(page.get_by_role("heading", name="Interventions")).to_be_visible()
        model = sidebar.get_by_role("textbox", name="model for on-demand views")
        model.fill(slower_model)
        model.press("Enter")
        length = page.get_by_label("prompt tokens")
        length.fill("2000")
        length.press("Enter")
        caption = page.get_by_test_id("stCaptionContainer").filter(has_text="on demand (greedy")
        expect(caption).to_contain_text("slower-model")
        page.get_by_text("also intervene on as many random heads").click()  # a third answer
        page.get_by_role("button", name="Answer before and after (1-2").click()
        progress = page.get_by_test_id("stProgress")
        expect(progress).to_be_visible(timeout=120_000)  # steps and seconds, not a spinner
        expect(page.get_by_text("You can leave this page")).to_be_visible()

        # Another run, mid-computation: none of the first run's answers, its own top heads
        # (1-2 by hidden_sink_mass, 0.3), and a word on the computation still running.
        sidebar.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="sinks-tiny (sinks)").click()
        expect(page.get_by_test_id("stMultiSelect").get_by_text("1-2 (0.3)")).to_be_visible()
        notice = page.get_by_text("An intervention for other settings")
        expect(notice).to_be_visible()
        # The notice follows the computation (its step and seconds move), not frozen.
        first = notice.inner_text()
        page.wait_for_timeout(2500)
        expect(page.get_by_text("intervention for other settings")).not_to_have_text(first)
        expect(page.get_by_role("heading", name="Before: unchanged")).to_have_count(0)
        expect(page.get_by_role("button", name="Answer before and after (1-2")).to_be_visible()

        # Back to the first run: the computation went on, and its result is shown there.
        sidebar.get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="retrieval-tiny (retrieval)").click()
        before = page.get_by_role("heading", name="Before: unchanged")
        expect(before).to_be_visible(timeout=300_000)
        expect(page.get_by_role("heading", name="After: query mask")).to_be_visible()
        expect(page.get_by_role("heading", name="Control: random heads")).to_be_visible()
        keep_screenshot(page, tmp_path, "dashboard_intervention.png")

        # Another depth: the answers belong to the old one, so they go.
        page.get_by_label("prompt tokens").fill("1000")
        page.get_by_label("prompt tokens").press("Enter")
        expect(before).to_have_count(0)

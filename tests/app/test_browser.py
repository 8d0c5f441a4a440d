"""End to end in a real headless Chromium: `headhunt app` on loopback, open a run, pick a head
on the heads map, read its detail page, compute its attention on a prompt; the screenshot is
kept under artifacts/ (git-ignored) as the test's artifact."""

from __future__ import annotations

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


def test_open_a_run_pick_a_head_and_see_its_detail(server, tmp_path):
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
            page.goto(server)
            sidebar = page.get_by_test_id("stSidebar")
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            # The broken run folders are reported, the good runs still listed.
            expect(
                page.get_by_text("unfinished run: rerun its command with --resume")
            ).to_be_visible()

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

            # Streamlit scrolls inside its main block, not the page: grow the viewport to it.
            height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 50, 6000)})
            expect(page.get_by_text("first-token sink mass s_0 =")).to_be_visible()
            page.wait_for_timeout(3000)  # let the charts repaint at the new size
            shot = tmp_path / "head_detail.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "dashboard_head_detail.png")

"""Headless Chromium for the page tests (episode viewer, eval report), driven by Selenium.

Needs Debian's `chromium` and `chromium-driver` packages and the `selenium` package (dev extra):

    apt-get install -y chromium chromium-driver
    pip install -e '.[dev]'

Without them a browser test is skipped with the reason, except under CI (the CI variable is set),
where a missing browser fails the test: CI must never pass by skipping the page checks.

Each browser runs with a fresh profile directory, no GPU, no sandbox (root in CI) and no background
networking, so it talks to nothing but the pages the tests open (file:// URLs).

`UPDATE_SCREENSHOTS=1 pytest tests/test_viewer.py tests/test_report.py -k browser` also saves the
screenshots the tests take as docs/viewer.png and docs/report.png.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_NAMES = ("chromium", "chromium-browser")
DRIVER_NAMES = ("chromedriver",)
WINDOW = (1400, 1000)
MAX_SCREENSHOT_HEIGHT = 2400
DOCS = Path(__file__).resolve().parent.parent.parent / "docs"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--hide-scrollbars",
)


def _which(names: tuple[str, ...]) -> str | None:
    return next((path for name in names if (path := shutil.which(name))), None)


def unavailable() -> str | None:
    """Why no browser can be started here, or None."""
    if importlib.util.find_spec("selenium") is None:
        return "the selenium package is not installed (pip install -e '.[dev]')"
    if _which(CHROMIUM_NAMES) is None:
        return "no chromium binary (apt-get install -y chromium chromium-driver)"
    if _which(DRIVER_NAMES) is None:
        return "no chromedriver binary (apt-get install -y chromium-driver)"
    return None


def require_browser() -> None:
    """Skip the test without a browser; fail it instead when running in CI."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests cannot run in CI: {reason}")
    pytest.skip(f"browser tests skipped: {reason}")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium WebDriver with a throwaway profile; quit and cleaned up on exit."""
    require_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    options = webdriver.ChromeOptions()
    options.binary_location = _which(CHROMIUM_NAMES) or ""
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=_which(DRIVER_NAMES)), options=options)
    try:
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, path: Path, docs_name: str | None = None) -> Path:
    """Save a full-page screenshot to `path` (and to docs/<docs_name> when UPDATE_SCREENSHOTS is set).

    The viewport is resized to the page's height through the DevTools protocol, so the picture shows
    the whole page (up to MAX_SCREENSHOT_HEIGHT) without the window's own frame getting in the way.
    """
    driver.execute_script("window.scrollTo(0, 0)")
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    metrics = {
        "width": WINDOW[0],
        "height": min(height, MAX_SCREENSHOT_HEIGHT),
        "deviceScaleFactor": 1,
        "mobile": False,
    }
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.write_bytes(base64.b64decode(shot["data"]))
    if docs_name and os.environ.get("UPDATE_SCREENSHOTS"):
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS / docs_name)
    return path


def console_errors(driver: Any) -> list[str]:
    """SEVERE messages from the page's console (script errors)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry.get("level") == "SEVERE"]

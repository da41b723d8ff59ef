"""Make docs/viewer.png and docs/report.png from the current code: `python docs/screenshots.py`.

Runs the demo as a user would (`task-app demo`: the app on a loopback port, scripted rollouts, the
eval report and one viewer page per episode) in a temporary directory, then opens the report and
the first episode's page in headless Chromium (tests/browser.py: Debian's `chromium` and
`chromium-driver`, the `selenium` package of the dev extra) and saves full-page screenshots.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent / "tests"))

import browser  # noqa: E402  (tests/browser.py, the page tests' Chromium)

SEEDS = "0-3"
DECISIONS = 150


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="screenshots-") as scratch:
        traces = Path(scratch) / "traces"
        demo = [sys.executable, "-m", "task_app.cli.main", "demo", "--seeds", SEEDS, "--decisions", str(DECISIONS)]
        subprocess.run([*demo, "--traces-dir", str(traces)], cwd=scratch, check=True, stdout=subprocess.DEVNULL)
        report = traces / "report.html"
        episode = sorted((traces / "episodes").glob("*.html"))[0]
        with browser.chromium() as driver:
            driver.get(report.as_uri())
            browser.screenshot(driver, DOCS / "report.png")
            driver.get(episode.as_uri())
            driver.find_elements("css selector", "#timeline button")[2].click()  # the third unlock
            browser.screenshot(driver, DOCS / "viewer.png")
            problems = browser.console_errors(driver)
    if problems:
        raise SystemExit(f"the pages logged errors: {problems}")
    sys.stdout.write(f"wrote {DOCS / 'report.png'} and {DOCS / 'viewer.png'}\n")


if __name__ == "__main__":
    main()

"""A real headless Chromium for the page tests (Debian's chromium and chromedriver, which
`make browser` installs), or a failure that says how to get it or opt out explicitly."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

OPT_OUT = "FLOCK_SKIP_BROWSER_TESTS"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REPO = Path(__file__).resolve().parents[2]
# Screenshots the page tests take, kept for people to look at (git-ignored).
ARTIFACTS = Path(os.environ.get("FLOCK_TEST_ARTIFACTS", REPO / "test-artifacts"))


@contextmanager
def browser(tmp_path: Path) -> Iterator:
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{OPT_OUT}=1: browser tests opted out")
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        pytest.fail(
            f"these tests need headless Chromium ({', '.join(missing)} missing); run "
            f"`make browser` (Debian's chromium and chromium-driver), or set {OPT_OUT}=1",
            pytrace=False,
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # No network beyond localhost here: without these Chromium keeps dialling Google's hosts.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1400",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    return path

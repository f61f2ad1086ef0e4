"""Debian's chromium, headless, driven by selenium through Debian's chromedriver: the real browser the
`hpcrl serve` page is tested in. Installed by launch/install_browser.sh; where it is missing the tests
skip saying so, unless HPCRL_REQUIRE_BROWSER=1 (launch/test.sh sets it: in CI they must run)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"


def _found() -> tuple[str | None, str | None]:
    browser = next((path for name in CHROMIUM if (path := shutil.which(name))), None)
    return browser, shutil.which(DRIVER) or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
    )


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1000) -> Iterator[object]:
    """A selenium WebDriver of a headless chromium; skips (or fails under HPCRL_REQUIRE_BROWSER) without one."""
    browser, driver_path = _found()
    if browser is None or driver_path is None:
        why = "chromium and chromedriver are not installed: run launch/install_browser.sh"
        if os.environ.get("HPCRL_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()

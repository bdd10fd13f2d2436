"""A real Chromium (Debian's /usr/bin/chromium and /usr/bin/chromedriver), headless, driven by
Selenium, with scripting OFF: the approval page must work with forms alone. Screenshots go to
the test's own directory, and are copied to $SE_BRIDGE_ARTIFACTS when it is set (CI keeps
them)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = "SE_BRIDGE_ARTIFACTS"


class Chromium:
    """One headless browser session; `shot` keeps a screenshot as a test artefact."""

    def __init__(self, driver: webdriver.Chrome, shots: Path, name: str) -> None:
        self.driver, self.shots, self.name = driver, shots, name

    def shot(self, label: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{self.name}-{label}.png"
        assert self.driver.save_screenshot(str(path)), path
        kept = os.environ.get(ARTIFACTS)
        if kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, Path(kept) / path.name)
        return path

    @classmethod
    @contextmanager
    def start(cls, tmp_path: Path, name: str) -> Iterator[Chromium]:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for argument in (
            "--headless=new",
            "--no-sandbox",  # the tests run as root, where Chromium's sandbox cannot start
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--window-size=1100,1400",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
        ):
            options.add_argument(argument)
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
        service = Service(
            executable_path=str(CHROMEDRIVER), log_output=str(tmp_path / "chromedriver.log")
        )
        driver = webdriver.Chrome(options=options, service=service)
        driver.set_page_load_timeout(30)
        # A click on a submit button returns before the answer's page has loaded: an element
        # of that page is waited for (at most this long) instead of missed.
        driver.implicitly_wait(10)
        try:
            yield cls(driver, tmp_path / "screenshots", name)
        finally:
            driver.quit()

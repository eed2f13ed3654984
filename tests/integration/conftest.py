"""A real headless Chromium for the page tests (the credit viewer, the docs site)."""

import pathlib

import pytest

CHROMIUM = pathlib.Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
  """Debian's Chromium driven by playwright; the test is skipped, saying so, without them."""
  if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium): browser tests skipped")
  sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
  with sync_api.sync_playwright() as p:
    browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    yield browser
    browser.close()

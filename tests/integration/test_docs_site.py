"""The documentation site, built with warnings as errors and opened in a real headless Chromium
(skipped, saying so, where Sphinx, Chromium or playwright is absent): the index links every
guide, an API page documents a function with its sections, a guide's formulas render as
MathJax output served with the site, and a tutorial shows what its code computed and drew
when the build executed it."""

import pathlib
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
  pytest.importorskip("sphinx", reason="Sphinx is not installed (pip install -e '.[docs]')")
  out = tmp_path_factory.mktemp("site")
  result = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", "-d", str(out / "doctrees"),
       str(ROOT / "docs"), str(out / "html")],
      capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return out / "html"


def test_the_site_renders_its_index_an_api_page_and_a_formula(site, browser):
  page = browser.new_page()
  page.goto((site / "index.html").as_uri())
  assert page.locator("h1").first.inner_text().startswith("jaxcredit")
  links = page.locator("nav a").evaluate_all("links => links.map(a => a.textContent.trim())")
  for title in ("Getting started", "Estimators and log-probs", "The credit lab", "Benchmarks",
                "API reference"):
    assert title in links, (title, links)

  page.goto((site / "api" / "_generated" / "jaxcredit.estimators.html").as_uri())
  entry = page.locator("dl.py.function:has(dt#jaxcredit\\.estimators\\.pass_at_k_advantages)")
  text = entry.inner_text()
  for section in ("Parameters", "Returns", "Raises", "References", "arXiv 2508.10751"):
    assert section in text, (section, text[:500])

  page.goto((site / "guides" / "estimators.html").as_uri())
  page.wait_for_selector("mjx-container svg", timeout=30_000)
  assert page.locator("mjx-container").count() >= 5
  assert page.evaluate("() => window.MathJax !== undefined")

  # A tutorial executed at build time: its heading, its formula and the figure its code drew.
  page.goto((site / "tutorials" / "estimator_tour.html").as_uri())
  assert page.locator("h1").first.inner_text().startswith("A tour of the estimators")
  page.wait_for_selector("mjx-container[display='true'] svg", timeout=30_000)
  figure = page.locator("div.cell_output img").first
  assert figure.evaluate("img => img.complete && img.naturalWidth > 400"), "no figure"
  outputs = page.locator("div.cell_output").all_inner_texts()
  assert any("grpo     response 0:" in text for text in outputs), outputs
  page.close()


def test_the_training_viewer_and_multi_turn_tutorials_show_what_they_ran(site, browser):
  page = browser.new_page()
  page.goto((site / "tutorials" / "training_run.html").as_uri())
  figure = page.locator("div.cell_output img").first
  assert figure.evaluate("img => img.complete && img.naturalWidth > 400"), "no curves"
  assert any("zero-variance groups" in text
             for text in page.locator("div.cell_output").all_inner_texts())

  # The viewer page the tutorial wrote, embedded and drawing the exported tokens.
  page.goto((site / "tutorials" / "credit_viewer.html").as_uri())
  viewer = page.frame_locator("div.cell_output iframe").first
  viewer.locator(".response .tok").first.wait_for(timeout=30_000)
  assert viewer.locator(".response").count() >= 8
  assert page.locator("div.cell_output table").count() >= 1  # the export read by pandas

  page.goto((site / "tutorials" / "multi_turn_env.html").as_uri())
  outputs = page.locator("div.cell_output").all_inner_texts()
  assert any(text.lstrip().startswith("token") and "turn" in text for text in outputs), outputs
  assert any("solved:" in text for text in outputs), outputs
  page.close()

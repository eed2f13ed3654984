"""The credit viewer (jaxcredit.view): reading exports, hostile files and text, and the page
driven in a real headless Chromium (skipped, saying so, where Chromium or playwright is absent)."""

import json
import os
import pathlib
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxcredit import view
from jaxcredit.train import export, loop
from jaxcredit.view import __main__ as view_cli
from tests.conftest import load_experiment

GROUP_SIZE = 4


@pytest.fixture(scope="module")
def quickstart_export(tmp_path_factory):
  """The quickstart for two RL steps, each exported with RLOO beside GRPO. Responses cut off
  by the budget score -1 (the others 0 before any SFT), so the advantages take both signs."""
  workdir = tmp_path_factory.mktemp("quickstart")
  config = load_experiment("quickstart")
  config.task.train_size, config.task.test_size, config.task.truncated_reward = 64, 8, -1.0
  config.sft.max_steps = 0
  config.rl.update(steps=2, prompts_per_step=4, group_size=GROUP_SIZE, eval_every=2)
  config.export.update(every=1, groups=4)
  loop.run(config, str(workdir))
  return workdir


def _synthetic_step(path: pathlib.Path, *, step: int = 1, tokens=("a", "b", "c"),
                    schema: str = str(export.SCHEMA_VERSION)) -> None:
  n = len(tokens)
  columns = {"step": [step] * n, "rl_step": [step] * n, "group": [0] * n, "sample": [0] * n,
             "position": list(range(n)), "token_id": list(range(n)), "token": list(tokens),
             "is_action": [False] + [True] * (n - 1), "reward": [1.0] * n,
             "behaviour_logprob": [None] + [-0.5] * (n - 1), "logprob": [None] + [-0.4] * (n - 1),
             "entropy": [None] + [0.3] * (n - 1), "ratio": [None] + [1.1] * (n - 1),
             "advantage": [0.0] + [0.5] * (n - 1)}
  table = pa.table(columns).replace_schema_metadata(
      {"jaxcredit.schema": schema, "estimator": json.dumps({"name": "grpo"}), "compare": "[]",
       "task": "synthetic"})
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(table, path)


def test_the_viewer_reads_the_files_training_writes():
  """The viewer imports nothing of training: the directory, schema version and columns are
  the contract between them."""
  assert view.export_reader.DIRECTORY == export.DIRECTORY
  assert view.export_reader.SCHEMA_VERSION == export.SCHEMA_VERSION


def test_no_export_cut_off_and_foreign_files_are_named(tmp_path, capsys):
  assert view_cli.main([str(tmp_path)]) == 1
  assert f"No per-token export in {tmp_path / 'tokens'}" in capsys.readouterr().err
  tokens = tmp_path / "tokens"
  _synthetic_step(tokens / export.file_name(1))
  _synthetic_step(tokens / export.file_name(2), schema="0")
  (tokens / export.file_name(3)).write_bytes(
      (tokens / export.file_name(1)).read_bytes()[:200])  # cut off mid-write
  steps, problems = view.read_export(tmp_path)
  assert [s.step for s in steps] == [1]
  assert len(problems) == 2
  assert str(tokens / export.file_name(2)) in problems[0] and "schema 0" in problems[0]
  assert str(tokens / export.file_name(3)) in problems[1] and "cut off" in problems[1]
  assert view_cli.main([str(tmp_path)]) == 0
  err = capsys.readouterr().err
  assert export.file_name(2) in err and export.file_name(3) in err
  assert (tmp_path / "credit.html").exists()


def test_page_data_cannot_close_its_script_element(tmp_path):
  _synthetic_step(tmp_path / "tokens" / export.file_name(1),
                  tokens=("<bos>", "</script><script>window.pwned = 1</script>", "\\xe6", "<!--"))
  html = view.render(*view.read_export(tmp_path), title="<b>t</b>")
  body = html.split('<script type="application/json" id="data">', 1)[1].split("</script>", 1)[0]
  assert "<" not in body and "\\u003c/script\\u003e" in body
  assert "</script><script>window.pwned = 1</script>" in json.loads(body)["texts"]
  assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in html


def test_export_columns_survive_the_page_encoding(quickstart_export):
  """What the page decodes (base64 typed arrays) equals the Parquet columns."""
  import base64

  steps, problems = view.read_export(quickstart_export)
  assert not problems and [s.rl_step for s in steps] == [1, 2]
  data = view.page.page_data(steps, problems, title="t")
  for step, encoded in zip(steps, data["steps"]):
    floats = lambda key: np.frombuffer(base64.b64decode(encoded[key]), "<f4")
    np.testing.assert_array_equal(floats("lp"), step.columns["logprob"].astype(np.float32))
    np.testing.assert_array_equal(
        np.frombuffer(base64.b64decode(encoded["credits"]["rloo"]), "<f4"),
        step.columns["advantage.rloo"])
    texts = np.frombuffer(base64.b64decode(encoded["text"]), "<i4")
    assert [data["texts"][i] for i in texts] == list(step.columns["token"])


# --- In a real browser -----------------------------------------------------------------------


@pytest.fixture
def page(browser, quickstart_export):
  assert view_cli.main([str(quickstart_export)]) == 0
  page = browser.new_page(viewport={"width": 1400, "height": 900})
  errors = []
  page.on("pageerror", lambda error: errors.append(str(error)))
  page.goto((quickstart_export / "credit.html").resolve().as_uri())
  page.wait_for_selector("body[data-rendered]")
  yield page
  assert not errors, errors
  page.close()


def _shown(text: str) -> str:
  """The viewer's rendering of a token's text (viewer.js `shown`)."""
  return "\u2205" if text == "" else text.replace("\t", "\u2192").replace("\n", "\u21b5\n")


def _rgb(style: str) -> tuple[int, ...]:
  return tuple(int(v) for v in re.findall(r"\d+", style)[:3])


def _last_step(workdir):
  steps, _ = view.read_export(workdir)
  return steps[-1].columns


def test_spans_are_the_exported_tokens_coloured_by_credit(page, quickstart_export, tmp_path):
  columns = _last_step(quickstart_export)
  page.check("#show_prompt")
  for row in page.query_selector_all(".response")[:8]:
    group, sample = int(row.get_attribute("data-group")), int(row.get_attribute("data-sample"))
    rows = (columns["group"] == group) & (columns["sample"] == sample)
    spans = row.query_selector_all(".tok")
    assert [s.text_content() for s in spans] == [_shown(t) for t in columns["token"][rows]]
    credit = columns["advantage"][rows & columns["is_action"]]
    values = [float(s.get_attribute("data-value"))
              for s in row.query_selector_all(".tok:not(.prompt)")]
    np.testing.assert_allclose(values, credit, rtol=1e-6)
  # Colour: green above 0, red below, white at 0, further from white the larger |credit|.
  spans = page.query_selector_all(".tok:not(.prompt)")
  seen = [
    (
      float(s.get_attribute("data-value")),
      _rgb(s.evaluate("e => getComputedStyle(e).backgroundColor")),
    )
    for s in spans
  ]
  assert any(v > 0 for v, _ in seen) and any(v < 0 for v, _ in seen), "both signs are needed"
  for value, (r, g, b) in seen:
    if value > 0:
      assert g > r and g > b
    elif value < 0:
      assert r > g and r > b
    else:
      assert (r, g, b) == (255, 255, 255)
  by_size = sorted((abs(v), 3 * 255 - sum(c)) for v, c in seen)
  assert all(a[1] <= b[1] for a, b in zip(by_size, by_size[1:]))
  low, high = page.text_content("#low"), page.text_content("#high")
  scale = np.abs(columns["advantage"][columns["is_action"]]).max()
  assert float(high) == pytest.approx(scale, rel=1e-2) and float(low.replace("\u2212", "-")) < 0
  shot = tmp_path / "viewer.png"
  page.screenshot(path=str(shot), full_page=False)
  assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  if os.environ.get("JAXCREDIT_TEST_ARTIFACTS"):  # CI keeps the screenshot
    shutil.copy(shot, pathlib.Path(os.environ["JAXCREDIT_TEST_ARTIFACTS"]) / shot.name)


def test_estimator_switch_and_side_by_side_change_what_is_shown(page, quickstart_export):
  columns = _last_step(quickstart_export)
  first = page.query_selector(".response")
  group, sample = int(first.get_attribute("data-group")), int(first.get_attribute("data-sample"))
  rows = (columns["group"] == group) & (columns["sample"] == sample) & columns["is_action"]
  read = lambda selector: [
    float(s.get_attribute("data-value")) for s in page.query_selector_all(selector)
  ]
  selector = (
    f'.response[data-group="{group}"][data-sample="{sample}"] .tokens[data-credit="rloo"] .tok'
  )
  page.select_option("#credit", "rloo")
  np.testing.assert_allclose(read(selector), columns["advantage.rloo"][rows], rtol=1e-6)
  assert not np.allclose(columns["advantage.rloo"], columns["advantage"])  # a visible change
  assert page.query_selector_all(".tokens[data-credit='grpo']") == []
  page.check("#pair")
  page.select_option("#other", "grpo")
  boxes = page.query_selector_all(
    f'.response[data-group="{group}"][data-sample="{sample}"] .tokens'
  )
  assert [b.get_attribute("data-credit") for b in boxes] == ["rloo", "grpo"]
  assert [b.query_selector(".caption").text_content() for b in boxes] == ["rloo", "grpo"]
  np.testing.assert_allclose(
    read(selector.replace('"rloo"', '"grpo"')), columns["advantage"][rows], rtol=1e-6
  )


def test_hover_shows_the_exported_numbers(page, quickstart_export):
  columns = _last_step(quickstart_export)
  span = page.query_selector(".tok:not(.prompt)")
  k = int(span.get_attribute("data-k"))
  span.hover()
  tip = page.text_content("#tooltip")
  assert page.is_visible("#tooltip")
  for label, column in (
    ("behaviour logprob", "behaviour_logprob"),
    ("logprob", "logprob"),
    ("entropy", "entropy"),
    ("ratio", "ratio"),
    ("grpo", "advantage"),
    ("rloo", "advantage.rloo"),
  ):
    assert f"\n{label} {columns[column][k]:.4f}" in tip, (label, tip)
  assert f"id {columns['token_id'][k]}" in tip and json.dumps(columns["token"][k]) in tip


def test_step_selector_sorting_and_filters(page, quickstart_export):
  steps, _ = view.read_export(quickstart_export)
  assert page.eval_on_selector_all("#step option", "os => os.map(o => o.textContent)") == [
    str(s.step) for s in steps
  ]
  page.select_option("#step", "0")
  assert f"RL update {steps[0].rl_step}" in page.text_content("#summary")
  page.select_option("#view", "responses")
  page.select_option("#sort", "reward_low")
  rewards = [
    float(re.search(r"reward (\S+)", m.text_content()).group(1))
    for m in page.query_selector_all(".response .meta")
  ]
  assert rewards == sorted(rewards) and len(rewards) == min(20, 4 * GROUP_SIZE)
  page.fill("#min_reward", "0")
  kept = [
    float(re.search(r"reward (\S+)", m.text_content()).group(1))
    for m in page.query_selector_all(".response .meta")
  ]
  columns = steps[0].columns
  _, first = np.unique(columns["group"] * GROUP_SIZE + columns["sample"], return_index=True)
  assert all(r >= 0 for r in kept) and len(kept) == int(np.sum(columns["reward"][first] >= 0))


def test_script_in_a_token_is_shown_not_run(browser, tmp_path):
  payload = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
  _synthetic_step(
    tmp_path / "tokens" / export.file_name(1), tokens=("<bos>", payload, "\\xe6\\x95")
  )
  assert view_cli.main([str(tmp_path)]) == 0
  page = browser.new_page()
  page.goto((tmp_path / "credit.html").resolve().as_uri())
  page.wait_for_selector("body[data-rendered]")
  assert page.evaluate("window.pwned") is None
  texts = [s.text_content() for s in page.query_selector_all(".tok")]
  assert texts == [payload, "\\xe6\\x95"]
  page.close()


def test_serve_serves_the_page_on_localhost(tmp_path):
  import subprocess
  import sys
  import urllib.request

  _synthetic_step(tmp_path / "tokens" / export.file_name(1))
  server = subprocess.Popen(
    [sys.executable, "-m", "jaxcredit.view", str(tmp_path), "--serve", "--port", "0"],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    lines = [server.stdout.readline() for _ in range(2)]
    url = re.search(r"Serving (http://127\.0\.0\.1:\d+/credit\.html)", lines[1]).group(1)
    page = urllib.request.urlopen(url, timeout=30).read().decode()
    assert page == (tmp_path / "credit.html").read_text(encoding="utf-8")
  finally:
    server.terminate()
    server.wait(timeout=30)

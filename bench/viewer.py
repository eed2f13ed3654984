"""What seeing the credit costs: the per-token export's wait on the training thread, and the
credit viewer's load time in headless Chromium.

  python -m bench.viewer [--steps 12] [--out bench/results/viewer.md]
  python -m bench.viewer --screenshot WORKDIR OUT.png   # the viewer of a run, oracle side by side

1. Training: the quickstart's RL (32 prompts x 8 samples, no SFT) on 2-3 digit addition
   (`ADDITION`, a longer response than the quickstart's 2-digit problems) with the export off, and
   with `export.every = 1` (4 groups, RLOO beside GRPO): median seconds between consecutive
   steps' metric writes after the first two (which compile), and the training thread's wait
   per export (`train/export_wait_ms`: queueing, and waiting for the previous export).
2. The viewer: a synthetic export of R responses x 1,000 action tokens (one step, 8 per
   group, RLOO beside GRPO) -> `python -m jaxcredit.view` -> Chromium (Debian's, through
   playwright): seconds to write the page, its size, and from navigation to the first page
   of responses drawn; the baseline draws every response at once (`?page_size=R`).
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.common import machine, table

ROOT = pathlib.Path(__file__).parent.parent
CHROMIUM = "/usr/bin/chromium"
TOKENS_PER_RESPONSE, PROMPT_TOKENS, GROUP_SIZE = 1000, 16, 8
ADDITION = "--config.task.options={'min_digits': 2, 'max_digits': 3, 'reverse_answer': True}"


def _train(workdir: pathlib.Path, steps: int, every: int) -> tuple[float, list[float]]:
  """Median step seconds after two steps, and the export waits in ms."""
  command = [sys.executable, "-m", "jaxcredit.train", "--config",
             str(ROOT / "experiments/quickstart.py"), "--workdir", str(workdir),
             "--config.sft.max_steps=0", f"--config.rl.steps={steps}",
             "--config.rl.eval_every=1000000", "--config.checkpoint.every=1000000",
             f"--config.export.every={every}", "--config.task.train_size=2048",
             "--config.task.test_size=16", ADDITION]
  subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [line for line in lines if "train/loss" in line]
  waits = [line["train/export_wait_ms"] for line in train if "train/export_wait_ms" in line]
  # The loop's own step time (sampling to the update's metrics): generated / tokens per second.
  generated = np.diff([0] + [line["train/gen_tokens"] for line in train])
  step_s = generated / np.asarray([line["train/tokens_per_sec"] for line in train])
  return float(np.median(step_s[2:])), waits


def _synthetic_export(workdir: pathlib.Path, responses: int, rng: np.random.Generator) -> None:
  from jaxcredit.train import export
  vocabulary = [f"t{i}" if i % 7 else f" \u00e9\u6570{i}\n" for i in range(5000)]
  per_row = PROMPT_TOKENS + TOKENS_PER_RESPONSE
  rows = np.repeat(np.arange(responses), per_row)
  position = np.tile(np.arange(per_row), responses)
  action = position >= PROMPT_TOKENS
  ids = rng.integers(0, len(vocabulary), len(rows))
  rewards = rng.integers(0, 2, responses).astype(np.float32)[rows]
  behaviour = np.where(action, -rng.exponential(1.0, len(rows)), np.nan).astype(np.float32)
  current = np.where(action, behaviour + rng.normal(0, 0.05, len(rows)), np.nan)
  columns = {
      "step": np.ones(len(rows), np.int64), "rl_step": np.ones(len(rows), np.int64),
      "group": (rows // GROUP_SIZE).astype(np.int32),
      "sample": (rows % GROUP_SIZE).astype(np.int32),
      "position": position.astype(np.int32), "token_id": ids.astype(np.int32),
      "token": [vocabulary[i] for i in ids], "is_action": action, "reward": rewards,
      "behaviour_logprob": behaviour, "logprob": current.astype(np.float32),
      "entropy": np.where(action, rng.exponential(1.0, len(rows)), np.nan).astype(np.float32),
      "ratio": np.exp(current - behaviour).astype(np.float32),
      "advantage": np.where(action, rewards - 0.5, 0).astype(np.float32),
      "advantage.rloo": np.where(action, rng.normal(0, 1, len(rows)), 0).astype(np.float32),
  }
  metadata = {"jaxcredit.schema": str(export.SCHEMA_VERSION), "estimator": '{"name": "grpo"}',
              "compare": '["rloo"]', "task": "synthetic"}
  export.write_parquet(workdir / export.DIRECTORY / export.file_name(1), columns, metadata)


def _load_seconds(browser, url: str) -> float:
  page = browser.new_page(viewport={"width": 1400, "height": 900})
  started = time.perf_counter()
  page.goto(url, timeout=300_000)
  page.wait_for_selector("body[data-rendered]", timeout=300_000)
  seconds = time.perf_counter() - started
  page.close()
  return seconds


def measure(steps: int, sizes: list[int], repeats: int) -> str:
  from playwright.sync_api import sync_playwright

  from jaxcredit.view import page
  lines = [f"machine: {machine()}; {time.strftime('%Y-%m-%d')}", ""]
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    off, _ = _train(tmp / "off", steps, 0)
    on, waits = _train(tmp / "on", steps, 1)
    lines += [table(["quickstart RL step (32 x 8)", "median step ms", "export wait ms median",
                    "export wait ms max"],
                   [["export off (baseline)", f"{1e3 * off:.0f}", "-", "-"],
                    ["export every step, 4 groups", f"{1e3 * on:.0f}",
                     f"{np.median(waits):.2f}", f"{np.max(waits):.2f}"]])]
    lines.append("")
    rows = []
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
      for responses in sizes:
        workdir = tmp / f"view{responses}"
        _synthetic_export(workdir, responses, np.random.default_rng(0))
        started = time.perf_counter()
        path, _ = page.write(workdir)
        written = time.perf_counter() - started
        url = path.resolve().as_uri()
        paged = np.median([_load_seconds(browser, url) for _ in range(repeats)])
        everything = _load_seconds(browser, f"{url}?page_size={responses}")
        rows.append([f"{responses:,} x {TOKENS_PER_RESPONSE:,}", f"{written:.1f}",
                     f"{path.stat().st_size / 2**20:.0f}", f"{paged:.2f}", f"{everything:.2f}"])
      browser.close()
    lines += [table(["responses x tokens", "write page s", "page MiB",
                    "load, 20 per page s", "load, all at once s (baseline)"], rows)]
  return "\n".join(lines)


def screenshot(workdir: pathlib.Path, out: pathlib.Path) -> None:
  """The viewer of `workdir`'s exported step with the most groups of mixed rewards, its credit
  beside the oracle's, the prompt shown, the pointer on the token of largest exact credit."""
  from playwright.sync_api import sync_playwright

  from jaxcredit.view import export_reader, page as view_page
  path, _ = view_page.write(workdir)
  steps, _ = export_reader.read_export(workdir)

  def mixed_groups(step):
    columns = step.columns
    return sum(np.ptp(columns["reward"][columns["group"] == g]) > 0
               for g in np.unique(columns["group"]))

  chosen = max(range(len(steps)), key=lambda i: mixed_groups(steps[i]))
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 720})
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-rendered]")
    page.select_option("#step", str(chosen))
    page.check("#pair")
    page.check("#show_prompt")
    spans = page.query_selector_all(".tokens[data-credit='oracle'] .tok:not(.prompt)")
    decisive = max(spans[:40], key=lambda s: abs(float(s.get_attribute("data-value"))))
    decisive.hover()
    page.screenshot(path=str(out))
    browser.close()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--sizes", type=int, nargs="+", default=[200, 2000])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None, help="also write the tables to this file")
  parser.add_argument("--screenshot", nargs=2, type=pathlib.Path, metavar=("WORKDIR", "PNG"),
                      help="only write a screenshot of WORKDIR's viewer")
  args = parser.parse_args()
  if args.screenshot:
    screenshot(*args.screenshot)
    return
  report = measure(args.steps, args.sizes, args.repeats)
  print(report)
  if args.out:
    pathlib.Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
  main()

"""The quickstart's documented RL gain: `python -m bench.quickstart`'s saved table shows a gain
of at least 0.15 on each of 3 seeds and each perturbation, for the quickstart config as it is
now, and the README states those numbers."""

import re

from tests.conftest import ROOT, load_experiment

RESULTS = ROOT / "bench" / "results" / "quickstart.md"


def _rows() -> list[list[str]]:
  lines = [line for line in RESULTS.read_text().splitlines() if line.startswith("| ")]
  return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def test_every_seed_and_perturbation_gains_from_rl_for_the_shipped_config():
  config = load_experiment("quickstart")
  text = RESULTS.read_text()
  assert (f"SFT to greedy accuracy {config.sft.target_accuracy}, then {config.rl.steps} GRPO "
          f"steps), greedy accuracy on the {config.task.test_size} held-out") in text
  rows = _rows()
  assert len([row for row in rows if re.fullmatch(r"seed \d+", row[0])]) >= 3
  for name, _, _, _, gain, _ in rows:
    assert float(gain) >= 0.15, (name, gain)


def test_the_readme_states_the_measured_gains():
  readme = (ROOT / "README.md").read_text()
  for name, _, after_sft, after_rl, gain, seconds in _rows():
    assert f"| {after_sft} | {after_rl} | {gain} | {seconds} |" in readme, name

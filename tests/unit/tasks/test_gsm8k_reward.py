"""GSM8K's final-answer rule against the field's own extraction code.

lm-eval's strict match (its gsm8k.yaml regex through its own `RegexFilter`) and
verl's `extract_solution` (strict with a marker, flexible without) run in this
process on real-looking responses; jaxcredit must read the same number. The
peers are installed without their dependencies (`.ci/run`); their modules are
loaded by path, so their packages' heavy imports never run.
"""

import importlib.metadata
import importlib.util
import pathlib

import pytest

from jaxcredit.tasks import gsm8k

# Responses as instruct models write them: reasoning, then the marker, sometimes
# followed by a restatement, units or a second marker.
MARKED = [
    "Natalia sold 48/2 = 24 clips in May.\nShe sold 48 + 24 = 72 clips.\n#### 72",
    "She sold 72 clips in all.\n#### 72 (48 + 24)",
    "#### 72 clips in total, since 48 + 24 = 72.",
    "Weng earns 12/60 = 0.2 per minute, so 0.2 * 50 = 10.\n#### 10.",
    "The total is 1,234 dollars.\n#### 1,234",
    "Step 1: 5 - 8 = -3\n#### -3",
    "First guess: #### 15\nWait, that is wrong: 3 * 6 = 18.\n#### 18",
    "#### 18\nThe answer above (18) is final; 3 x 6 = 18 and 2 + 2 = 4.",
    "James writes 2 * 3 * 2 = 12 pages a week, 12 * 52 = 624 a year.\n#### 624\n",
    "She has 3.50 left.\n#### 3.50",
    "Total: 0.5 + 0.25 = 0.75\n#### 0.75 (three quarters)",
    "#### 100 because 10 * 10 = 100, not 99",
]
UNMARKED = [
    "Natalia sold 48 + 24 = 72 clips.",
    "The answer is 18.",
    "So 1,234 + 1 = 1,235",
    "She had -3 left",
    "I cannot tell.",
]


def _verl_gsm8k():
  """verl's verl/utils/reward_score/gsm8k.py, loaded by path."""
  try:
    files = importlib.metadata.files("verl") or []
  except importlib.metadata.PackageNotFoundError:
    pytest.skip("verl is not installed (.ci/run installs it with --no-deps)")
  path = next(f for f in files if str(f).endswith("reward_score/gsm8k.py")).locate()
  spec = importlib.util.spec_from_file_location("verl_gsm8k", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _lm_eval_strict_match():
  """lm-eval's gsm8k `strict-match` filter: its yaml's regex through its own RegexFilter,
  then take_first."""
  extraction = pytest.importorskip("lm_eval.filters.extraction",
                                   reason="lm_eval is not installed (.ci/run installs it)")
  yaml = pytest.importorskip("yaml")
  task = pathlib.Path(extraction.__file__).parents[1] / "tasks" / "gsm8k" / "gsm8k.yaml"
  pipelines = {f["name"]: f["filter"] for f in yaml.safe_load(task.read_text())["filter_list"]}
  regex = next(step for step in pipelines["strict-match"] if step["function"] == "regex")
  strict = extraction.RegexFilter(regex_pattern=regex["regex_pattern"])
  return lambda response: strict.apply([[response]], [{}])[0][0]


@pytest.mark.parametrize("response", MARKED)
def test_marked_answer_is_verls_strict_extraction(response):
  verl = _verl_gsm8k()
  assert gsm8k.extract_answer(response) == gsm8k.normalize_number(
      verl.extract_solution(response, method="strict"))


@pytest.mark.parametrize("response", UNMARKED)
def test_unmarked_answer_is_verls_flexible_extraction(response):
  verl = _verl_gsm8k()
  expected = verl.extract_solution(response, method="flexible")
  assert gsm8k.extract_answer(response) == (None if expected is None
                                            else gsm8k.normalize_number(expected))


@pytest.mark.parametrize("response", [r for r in MARKED if r.count("####") == 1])
def test_single_marker_answer_is_lm_evals_strict_match(response):
  strict_match = _lm_eval_strict_match()
  assert gsm8k.extract_answer(response) == gsm8k.normalize_number(strict_match(response))


def test_the_number_right_after_the_marker_is_scored():
  assert gsm8k.reward("She sold 72 clips in all.\n#### 72 (48 + 24)", "72")[0] == 1.0
  assert gsm8k.reward("#### 72 (48 + 24)", "24")[0] == 0.0
  assert gsm8k.reward("#### $1,234.50", "1234.5")[0] == 1.0
  # A marker followed by words is no answer, as in the peers' strict match.
  assert gsm8k.extract_answer("#### the answer is 72") is None

"""Verifiers on hostile model output: they never raise, stay linear in the
response length, and score huge numbers, unicode digits and control
characters as text (0 with a reason), never as a crash."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcredit.tasks import arithmetic, countdown, gsm8k, key_token, rewards

HUGE_NUMBER = "9" * 5000  # past Python's 4,300-digit int-string limit
TEXT_VERIFIERS = {
    "arithmetic": lambda response: arithmetic.reward(response, "579"),
    "countdown": lambda response: countdown.reward(response, [3, 5, 7], 22),
    "gsm8k": lambda response: gsm8k.reward(response, "125"),
    "format": rewards.format_reward,
}
HOSTILE_TEXT = st.one_of(
  st.text(),
  st.text(
    alphabet=st.characters(categories=["Nd", "Cc", "Zs", "P", "S"])
  ),  # any digits, controls, symbols
  st.builds(
    lambda a, b: f"{a}#### {b}",
    st.text(max_size=20),
    st.text(alphabet="0123456789,.-", max_size=60),
  ),
  st.builds(lambda a, b: f"<answer>{a}</answer>{b}", st.text(max_size=30), st.text(max_size=10)),
)


@pytest.mark.parametrize("name", sorted(TEXT_VERIFIERS))
@settings(max_examples=150)
@given(response=HOSTILE_TEXT)
def test_text_verifiers_never_raise(name, response):
  reward, reason = TEXT_VERIFIERS[name](response)
  assert 0.0 <= reward <= 1.0 and isinstance(reason, str)


@pytest.mark.parametrize(
  "response",
  [
    HUGE_NUMBER,
    f"#### {HUGE_NUMBER}",
    f"-{HUGE_NUMBER}.{HUGE_NUMBER}",
    "#### \u0661\u0662\u0665",
    "#### 12\x00 5",
    f"\x1b[31m{HUGE_NUMBER}",
    f"<answer>{HUGE_NUMBER}</answer>",
    f"<answer>{HUGE_NUMBER}+3</answer>",
  ],
)
@pytest.mark.parametrize("name", ["arithmetic", "countdown", "gsm8k"])
def test_huge_numbers_unicode_digits_and_control_characters_score_zero(name, response):
  reward, reason = TEXT_VERIFIERS[name](response)
  assert reward == 0.0 and reason


def test_gsm8k_numbers_of_any_length_compare_exactly():
  assert gsm8k.reward(f"#### {HUGE_NUMBER}", HUGE_NUMBER)[0] == 1.0
  assert gsm8k.reward(f"#### 00{HUGE_NUMBER}.000", HUGE_NUMBER)[0] == 1.0
  assert gsm8k.normalize_number("1,234.50") == "1234.5"
  assert gsm8k.normalize_number("-0.0") == "0"
  assert (
    gsm8k.normalize_number("\u0661\u0662\u0665") is None
  )  # Arabic-Indic digits are not a GSM8K number


DEGENERATE_MB = {
  "answer tags": "<answer>" * (1 << 17),
  "closing tags": "</answer>" * (1 << 17),
  "digits": "7" * (1 << 20),
  "hashes": "####" * (1 << 18),
  "separators": "1,;." * (1 << 18),
  "whitespace": " \t\n\r" * (1 << 18),
}


@pytest.mark.parametrize("case", sorted(DEGENERATE_MB))
@pytest.mark.parametrize("name", sorted(TEXT_VERIFIERS))
def test_verifiers_are_linear_on_a_megabyte_of_degenerate_repetition(name, case):
  response = DEGENERATE_MB[case]
  assert len(response) >= 1 << 20
  started = time.perf_counter()
  TEXT_VERIFIERS[name](response)
  # A quadratic verifier takes minutes to hours here (countdown's regex: 106 s at 400 KB).
  assert time.perf_counter() - started < 1.0


def test_batched_scores_a_raising_reward_function_zero_with_its_reason():
  def fragile(response, answer):
    return float(int(response) == int(answer)), "compared"

  with pytest.warns(RuntimeWarning, match="fragile: reward function raised ValueError"):
    scores, reasons, failed = rewards.batched(fragile, ["12", "oops", "7"], ["12", "3", "8"])
  np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0])
  assert reasons[1].startswith("reward function raised ValueError")
  np.testing.assert_array_equal(failed, [False, True, False])


@settings(max_examples=50)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=24, max_size=24))
def test_key_token_reward_is_defined_for_any_ids(ids):
  config = key_token.KeyTokenConfig()
  targets = np.asarray([config.keys[: config.n_decisive]])
  out = key_token.reward(np.asarray([ids])[:, : config.length], targets, config)
  assert out.shape == (1,) and 0.0 <= out[0] <= 1.0

"""GSM8K-format math word problems: JSONL lines {"question", "answer"} where the
answer's reasoning ends with `#### <final number>`.

Files are read from a local directory (`train.jsonl`, `test.jsonl`); there is
no download. The reward reads a response's final answer as the field's
strict match does (lm-eval's `strict-match`, verl's `method="strict"`): the
number written immediately after the last `####` that is followed by one,
so `#### 72 (48 + 24)` answers 72; a response with no `####` at all is read
by its last number (verl's `method="flexible"`). Both sides are compared as
canonical number text (`normalize_number`).
"""

import json
import pathlib
import re
from collections.abc import Iterator

from jaxcredit.tasks import rewards

SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}
# ASCII digits only: a unicode digit is not part of a GSM8K number.
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
# A number written immediately after the marker: spaces and a `$` may sit between them.
_MARKED_NUMBER = re.compile(r"####[ \t]*\$?[ \t]*(" + _NUMBER.pattern + ")")


def normalize_number(text: str) -> str | None:
  """Canonical text of a number: '1,234.50' -> '1234.5', '007.0' -> '7',
  '-0' -> '0'; None if not a number. Pure string work, so numbers of any
  length are fine (Python refuses int() of more than 4,300 digits)."""
  match = _NUMBER.fullmatch(text.strip().rstrip(".").replace("$", ""))
  if not match:
    return None
  negative, digits = match.group(0).startswith("-"), match.group(0).lstrip("-").replace(",", "")
  whole, _, fraction = digits.partition(".")
  whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
  number = f"{whole}.{fraction}" if fraction else whole
  return number if number == "0" or not negative else f"-{number}"


def final_answer(answer: str) -> str:
  """The number after the last `####` of a GSM8K answer; ValueError if absent."""
  if "####" not in answer:
    raise ValueError("answer has no '#### <final answer>' line")
  number = normalize_number(answer.rsplit("####", 1)[1])
  if number is None:
    raise ValueError(f"final answer {answer.rsplit('####', 1)[1].strip()!r} is not a number")
  return number


def read_jsonl(path: pathlib.Path) -> Iterator[dict]:
  """Examples {"prompt", "completion", "answer"} of a GSM8K JSONL file.

  A malformed line (bad JSON, not UTF-8, missing fields, no final number)
  raises ValueError naming the file and the line number; so does a file
  with no examples.
  """
  count = 0
  with open(path, "rb") as f:
    for line_number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as error:
        raise ValueError(
            f"{path}:{line_number}: malformed GSM8K line: not UTF-8 ({error})") from None
      if not line.strip():
        continue
      count += 1
      try:
        record = json.loads(line)
        question, answer = record["question"], record["answer"]
        if not isinstance(question, str) or not isinstance(answer, str):
          raise ValueError("question and answer must be strings")
        yield {"prompt": question, "completion": answer, "answer": final_answer(answer)}
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ValueError(f"{path}:{line_number}: malformed GSM8K line: {detail}") from None
  if not count:
    raise ValueError(f"{path}: no GSM8K examples (the file is empty).")


def extract_answer(response: str) -> str | None:
  """The final answer of a response, as canonical number text (None: no answer).

  With a `####` marker: the number written immediately after the last marker
  that is followed by one (`"#### 72 (48 + 24)"` -> `"72"`; a marker followed by
  words is no answer). Without any marker: the last number in the response.

  Examples:
    >>> extract_answer("48 + 24 = 72\\n#### 72 (48 + 24)")
    '72'
    >>> extract_answer("So she sold 1,234.50 in all.")
    '1234.5'
    >>> extract_answer("#### the answer is 72") is None
    True
  """
  if "####" in response:
    answers = _MARKED_NUMBER.findall(response)
    return normalize_number(answers[-1]) if answers else None
  numbers = _NUMBER.findall(response)
  return normalize_number(numbers[-1]) if numbers else None


def reward(response: str, answer: str) -> tuple[float, str]:
  """1.0 if the extracted final number equals `answer`, else 0.0; with a reason."""
  return rewards.exact_match(extract_answer(response), answer)


def manual_files(directory: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """The split files in `directory`; ValueError naming what is missing."""
  directory = pathlib.Path(directory)
  files = {split: directory / name for split, name in SPLIT_FILES.items()}
  missing = [str(p) for p in files.values() if not p.exists()]
  if missing:
    raise ValueError(
        f"GSM8K needs {', '.join(SPLIT_FILES.values())} in {directory}; missing {missing}.")
  return files

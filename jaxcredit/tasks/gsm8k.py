"""GSM8K-format math word problems: JSONL lines {"question", "answer"} where the
answer's reasoning ends with `#### <final number>`.

Files are read from a local directory (`train.jsonl`, `test.jsonl`); there is
no download. The reward extracts the final number of a response (after the
last `####`, else the last number in it) and compares numerically.
"""

import json
import pathlib
import re
from collections.abc import Iterator
from fractions import Fraction

from jaxcredit.tasks import rewards

SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def normalize_number(text: str) -> str | None:
  """Canonical text of a number: '1,234.50' -> '1234.5', '7.0' -> '7'; None if not a number."""
  match = _NUMBER.fullmatch(text.strip().rstrip(".").replace("$", ""))
  if not match:
    return None
  value = Fraction(match.group(0).replace(",", ""))
  return str(value.numerator) if value.denominator == 1 else str(float(value))


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

  A malformed line raises ValueError naming the file and the line number.
  """
  with open(path, encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
        question, answer = record["question"], record["answer"]
        if not isinstance(question, str) or not isinstance(answer, str):
          raise ValueError("question and answer must be strings")
        yield {"prompt": question, "completion": answer, "answer": final_answer(answer)}
      except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        detail = f"missing field {error}" if isinstance(error, KeyError) else str(error)
        raise ValueError(f"{path}:{line_number}: malformed GSM8K line: {detail}") from None


def extract_answer(response: str) -> str | None:
  """The number after the last `####`, else the last number in the response."""
  tail = response.rsplit("####", 1)[1] if "####" in response else response
  numbers = _NUMBER.findall(tail)
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
    raise ValueError(f"GSM8K needs {', '.join(SPLIT_FILES.values())} in {directory}; missing {missing}.")
  return files

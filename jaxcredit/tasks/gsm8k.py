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

import hashlib
import json
import pathlib
import re
from collections.abc import Iterator

import tensorflow_datasets as tfds

from jaxcredit import _checks
from jaxcredit.models import huggingface
from jaxcredit.tasks import loader, rewards, scorers, task
from jaxcredit.tasks.tokenizers import HFTokenizer

SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}
# ASCII digits only: a unicode digit is not part of a GSM8K number.
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")
# A number written immediately after the marker: spaces and a `$` may sit between them.
_MARKED_NUMBER = re.compile(r"####[ \t]*\$?[ \t]*(" + _NUMBER.pattern + ")")


def normalize_number(text: str) -> str | None:
  """Canonical text of a number: '1,234.50' -> '1234.5', '007.0' -> '7', '-0' -> '0'.

  Pure string work, so numbers of any length are fine (Python refuses int() of more than
  4,300 digits).

  Args:
    text: the number's text ("$" and a trailing "." allowed).

  Returns:
    the canonical text, or None when it is not a number.

  Examples:
    >>> from jaxcredit.tasks import gsm8k
    >>> gsm8k.normalize_number("1,234.50"), gsm8k.normalize_number("x")
    ('1234.5', None)
  """
  match = _NUMBER.fullmatch(text.strip().rstrip(".").replace("$", ""))
  if not match:
    return None
  negative, digits = match.group(0).startswith("-"), match.group(0).lstrip("-").replace(",", "")
  whole, _, fraction = digits.partition(".")
  whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
  number = f"{whole}.{fraction}" if fraction else whole
  return number if number == "0" or not negative else f"-{number}"


def final_answer(answer: str) -> str:
  """The number after the last ``####`` of a GSM8K answer.

  Args:
    answer: the reference solution.

  Returns:
    its canonical number text.

  Raises:
    ValueError: when the marker or the number is absent.
  """
  if "####" not in answer:
    raise ValueError("answer has no '#### <final answer>' line")
  number = normalize_number(answer.rsplit("####", 1)[1])
  if number is None:
    raise ValueError(f"final answer {answer.rsplit('####', 1)[1].strip()!r} is not a number")
  return number


def read_jsonl(path: pathlib.Path) -> Iterator[dict]:
  """The examples of a GSM8K JSONL file.

  Args:
    path: the file.

  Yields:
    ``{"prompt", "completion", "answer"}``.

  Raises:
    ValueError: naming the file and the line number for a malformed line (bad JSON, not
      UTF-8, missing fields, no final number), and for a file with no examples.
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
  r"""The final answer of a response, as canonical number text.

  With a ``####`` marker: the number written immediately after the last marker that is
  followed by one (``"#### 72 (48 + 24)"`` -> ``"72"``; a marker followed by words is no
  answer). Without any marker: the last number in the response.

  Args:
    response: the decoded response.

  Returns:
    the canonical number text, or None when there is no answer.

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
  """1.0 if the extracted final number equals the reference, else 0.0.

  Args:
    response: the decoded response.
    answer: the reference's canonical number.

  Returns:
    ``(reward, reason)``.
  """
  return rewards.exact_match(extract_answer(response), answer)


def manual_files(directory: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """The split files of a GSM8K directory.

  Args:
    directory: holds train.jsonl and test.jsonl.

  Returns:
    ``{split: path}``.

  Raises:
    ValueError: naming what is missing.
  """
  directory = pathlib.Path(directory)
  files = {split: directory / name for split, name in SPLIT_FILES.items()}
  missing = [str(p) for p in files.values() if not p.exists()]
  if missing:
    raise ValueError(
        f"GSM8K needs {', '.join(SPLIT_FILES.values())} in {directory}; missing {missing}.")
  return files


class Gsm8k(tfds.core.GeneratorBasedBuilder):
  """GSM8K-format JSONL (`train.jsonl`, `test.jsonl`) from a manual directory.

  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=DIR))
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Place GSM8K's train.jsonl and test.jsonl in the manual directory."

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "prompt": tfds.features.Text(),
        "completion": tfds.features.Text(),
        "answer": tfds.features.Text(),
    }))

  def _split_generators(self, dl_manager):
    files = manual_files(dl_manager.manual_dir)
    return {split: self._generate_examples(path) for split, path in files.items()}

  def _generate_examples(self, path):
    yield from enumerate(read_jsonl(path))


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> task.TrainTask:
  """GSM8K-format JSONL with a pretrained checkpoint's tokenizer and chat template.

  The data are prepared under ``data_dir/gsm8k-<digest of the files>``, so edited files are
  never served from a stale copy. Stop tokens: the tokenizer's eos_token and the directory's
  generation_config.json EOS ids. The reward is 1 when the response's final number equals
  the answer's.

  Args:
    config: the run's ``task`` config: jsonl_dir (train.jsonl and test.jsonl), prompt
      ("chat": the chat template's rendering of [system_prompt] + question + instruction,
      with the assistant header; "plain": BOS + question + instruction), instruction,
      system_prompt, template_variables, max_prompt_length, max_response_length,
      truncated_reward.
    data_dir: where the prepared data go.
    seed: unused (the files are the data).
    tokenizer: the Hugging Face tokenizer directory.

  Returns:
    the `TrainTask`.

  Raises:
    ValueError: without a tokenizer or jsonl_dir, for an unknown prompt kind, or for
      malformed files.
  """
  del seed
  if not tokenizer:
    raise ValueError("Task gsm8k needs a Hugging Face tokenizer: set --config.model.checkpoint "
                     "(a checkpoint directory with tokenizer.json) or --config.task.tokenizer.")
  if not config.get("jsonl_dir"):
    raise ValueError("Task gsm8k needs --config.task.jsonl_dir: a directory holding GSM8K's "
                     "train.jsonl and test.jsonl.")
  prompt = config.get("prompt", "chat")
  _checks.check_choice(prompt, ("chat", "plain"), "task.prompt")
  tokens = HFTokenizer(tokenizer)
  instruction = config.get("instruction", "")
  if prompt == "chat":
    encode = loader.chat_encoder(tokens, instruction=instruction,
                                 system_prompt=config.get("system_prompt"),
                                 template_variables=dict(config.get("template_variables") or {}))
  else:
    encode = loader.text_encoder(tokens, instruction=instruction)
  files = manual_files(config.jsonl_dir)
  digest = hashlib.sha256(b"".join(path.read_bytes() for path in files.values())).hexdigest()
  builder = Gsm8k(data_dir=str(pathlib.Path(data_dir) / f"gsm8k-{digest[:16]}"),
                  file_format="array_record")
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=config.jsonl_dir))
  score_text = lambda response, example: reward(response, loader.as_text(example["answer"]))
  stops = {tokens.eos_id, *huggingface.stop_tokens(tokenizer)} - {None}
  if not stops:
    raise ValueError(f"The tokenizer in {tokenizer} has no eos_token and no "
                     "generation_config.json EOS id: responses could never end.")
  failures = rewards.FailureCount()
  return task.TrainTask(
      name="gsm8k", vocab_size=tokens.vocab_size, pad_id=tokens.pad_id,
      stop_tokens=tuple(sorted(stops)), max_prompt_length=config.max_prompt_length,
      max_response_length=config.max_response_length, sources=builder.as_data_source(),
      encode=encode, score=scorers.text_scorer(tokens, score_text, failures),
      reward_failures=failures, pretrained_vocab=True, token_texts=tokens.token_texts,
      truncated_reward=float(config.get("truncated_reward", 0.0)))


TASK = task.register(task.Task(name="gsm8k", options=None, data=Gsm8k, train=train_task))

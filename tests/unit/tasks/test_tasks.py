"""Procedural tasks: TFDS builders without TensorFlow, verifiable rewards."""

import json
import re
import sys
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import tensorflow_datasets as tfds

from jaxcredit.tasks import (
    CharTokenizer,
    arithmetic,
    builders,
    countdown,
    gsm8k,
    key_token,
    prepare,
    rewards,
)

CONFIGS = [
    arithmetic.ArithmeticConfig(),
    arithmetic.ArithmeticConfig(min_digits=1, max_digits=5, scratchpad=True),
    arithmetic.ArithmeticConfig(operation="mul", scratchpad=True, reverse_answer=False),
    arithmetic.ArithmeticConfig(operation="mul", min_digits=3, max_digits=4),
]


@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(CONFIGS))
def test_reference_answer_scores_one_and_corruptions_zero(seed, config):
  example = arithmetic.make_example(np.random.default_rng(seed), config)
  a, b = example["a"], example["b"]
  result = a + b if config.operation == "add" else a * b
  digits = str(result)[::-1] if config.reverse_answer else str(result)
  assert example["answer"] == digits
  assert example["prompt"] == f"{a}{'+' if config.operation == 'add' else '*'}{b}="
  assert arithmetic.reward(example["completion"], example["answer"]) == (1.0, "correct")
  wrong = str((int(digits) + 1) % 10 ** len(digits)).zfill(len(digits))
  score, reason = arithmetic.reward(example["completion"].rsplit(";", 1)[0] + ";" + wrong
                                    if config.scratchpad else wrong, example["answer"])
  assert score == 0.0 and reason.startswith("wrong answer")
  assert arithmetic.reward("", example["answer"]) == (0.0, "no answer")
  CharTokenizer(arithmetic.ALPHABET).encode(example["prompt"] + example["completion"])


def test_scratchpad_formats():
  config = arithmetic.ArithmeticConfig(min_digits=2, max_digits=2, scratchpad=True)
  rng = np.random.default_rng(0)
  example = arithmetic.make_example(rng, config)
  a, b = example["a"], example["b"]
  carries, carry = "", 0
  for i in range(2):
    carries += str(carry)
    carry = (a // 10**i % 10 + b // 10**i % 10 + carry) // 10
  assert example["completion"] == f"C:{carries};{str(a + b)[::-1]}"
  mul = arithmetic.make_example(rng, arithmetic.ArithmeticConfig(operation="mul", scratchpad=True))
  partials = mul["completion"][2:].split(";")[0].split(",")
  assert sum(int(p[::-1]) for p in partials) == mul["a"] * mul["b"]


def test_builder_builds_without_tensorflow(tmp_path):
  builder = builders.get("arithmetic", data_dir=str(tmp_path), train_size=40, test_size=8, seed=3)
  builder.download_and_prepare()
  sources = builder.as_data_source()
  assert {split: len(source) for split, source in sources.items()} == {"train": 40, "test": 8}
  example = sources["train"][5]
  assert arithmetic.reward(example["completion"].decode(), example["answer"].decode())[0] == 1.0
  assert "tensorflow" not in sys.modules
  again = builders.get(
    "arithmetic", data_dir=str(tmp_path / "again"), train_size=40, test_size=8, seed=3
  )
  again.download_and_prepare()
  np.testing.assert_equal(again.as_data_source()["train"][5], example)


def _problems(tmp_path, task, **sizes) -> dict:
  builder = builders.get("arithmetic", data_dir=str(tmp_path),
                         config=builders.ProceduralConfig(name="held", task=task), seed=0, **sizes)
  builder.download_and_prepare()
  return {split: [(int(e["a"]), int(e["b"])) for e in source]
          for split, source in builder.as_data_source().items()}


def test_held_out_splits_share_no_problem_and_zero_keeps_the_data(tmp_path):
  two_digits = dict(min_digits=2, max_digits=2)
  sizes = dict(train_size=3000, test_size=300)
  held = _problems(tmp_path / "held", arithmetic.ArithmeticConfig(**two_digits, held_out=0.1),
                   **sizes)
  assert not set(held["train"]) & set(held["test"])
  # Every test problem, and no training one, hashes into the lowest tenth.
  share = lambda a, b: zlib.crc32(f"{a}+{b}=".encode()) / 2**32 < 0.1
  assert all(share(*p) for p in held["test"]) and not any(share(*p) for p in held["train"])
  shared = _problems(tmp_path / "shared", arithmetic.ArithmeticConfig(**two_digits), **sizes)
  assert set(shared["train"]) & set(shared["test"])  # 8,100 problems: most test ones are seen
  rng = lambda split, i: np.random.default_rng([0, {"train": 0, "test": 1}[split], i])
  for split in ("train", "test"):  # held_out = 0: make_example's examples, as before (TFDS
    want = [arithmetic.make_example(rng(split, i), arithmetic.ArithmeticConfig(**two_digits))
            for i in range(len(shared[split]))]  # stores them in an order of its own)
    assert sorted(shared[split]) == sorted((e["a"], e["b"]) for e in want)


def test_held_out_refuses_a_problem_space_it_leaves_empty():
  with pytest.raises(ValueError, match="No test problem in 1000 draws"):
    arithmetic.split_example(np.random.default_rng(0), arithmetic.ArithmeticConfig(
        min_digits=1, max_digits=1, held_out=1e-9), "test", max_draws=1000)
  with pytest.raises(ValueError, match="Need 0 <= held_out < 1, got 1.0"):
    arithmetic.ArithmeticConfig(held_out=1.0)


def test_unknown_task_and_config_list_known_ones(tmp_path):
  with pytest.raises(ValueError, match="Unknown task 'algebra'; known: arithmetic"):
    builders.get("algebra", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="Task 'zipf_explain' has no dataset .* with one: arith"):
    builders.get("zipf_explain", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="Unknown arithmetic config 'big'; known: add_2to3_reversed"):
    builders.get("arithmetic", data_dir=str(tmp_path), config="big")
  with pytest.raises(ValueError, match="Unknown operation 'div'"):
    arithmetic.ArithmeticConfig(operation="div")


def test_prepare_cli_prints_sizes_and_examples(tmp_path, capsys):
  prepare.main(
    [
      "--task",
      "arithmetic",
      "--data_dir",
      str(tmp_path),
      "--config",
      "mul_2to3_scratchpad",
      "--train_size",
      "12",
      "--test_size",
      "4",
      "--show",
      "2",
    ]
  )
  out = capsys.readouterr().out
  assert "train: 12 examples" in out and "test: 4 examples" in out
  assert out.count("prompt=") == 4 and "completion=P:" in out


COUNTDOWN_CONFIGS = [
  countdown.CountdownConfig(),
  countdown.CountdownConfig(n_numbers=3, max_number=20),
]


@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(COUNTDOWN_CONFIGS))
def test_countdown_reference_scores_one_and_corruptions_do_not(seed, config):
  example = countdown.make_example(np.random.default_rng(seed), config)
  numbers, target = example["numbers"], example["target"]
  assert example["prompt"] == ",".join(map(str, numbers)) + f">{target}:"
  assert countdown.reward(example["completion"], numbers, target) == (1.0, "correct")
  assert countdown.reward(f"<answer>{example['completion']}</answer>", numbers, target)[0] == 1.0
  score, reason = countdown.reward(example["completion"], numbers, target + 1)
  assert score == config.format_score and "not" in reason
  dropped = "+".join(map(str, numbers[1:]))
  assert countdown.reward(dropped, numbers, target)[0] == 0.0
  CharTokenizer(countdown.ALPHABET).encode(example["prompt"] + example["completion"])


@pytest.mark.parametrize(
  "attack",
  [
    "__import__('os').system('rm -rf /')",
    "1+2; import os",
    "2**100",
    "1e9",
    "(1+2",
    "1+2)",
    "1//2",
    "１+2",
    "1+" * 150 + "1",
    "(1)/(2-2)",
    "",
    "lambda: 0",
  ],
)
def test_countdown_verifier_rejects_malformed_and_injection(attack):
  score, reason = countdown.reward(attack, [1, 2], 3)
  assert score == 0.0 and (reason.startswith("malformed") or reason.startswith("uses")), reason


def test_countdown_builder(tmp_path):
  builder = builders.get(
    "countdown", data_dir=str(tmp_path), config="n3", train_size=16, test_size=4
  )
  builder.download_and_prepare()
  source = builder.as_data_source()["train"]
  assert len(source) == 16
  example = source[3]
  assert (
    countdown.reward(example["completion"].decode(), example["numbers"], int(example["target"]))[0]
    == 1.0
  )


GSM8K_LINES = [
  {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
  {
    "question": "A shirt costs $1,250 and is discounted by $250.50. Price?",
    "answer": "1250 - 250.5 = 999.5\n#### 999.50",
  },
]


def _write_gsm8k(directory, train_lines, test_lines):
  for name, lines in (("train.jsonl", train_lines), ("test.jsonl", test_lines)):
    (directory / name).write_text(
      "".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines)
    )


def test_gsm8k_builder_from_manual_dir(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  _write_gsm8k(manual, GSM8K_LINES, GSM8K_LINES[:1])
  builder = builders.get("gsm8k", data_dir=str(tmp_path / "data"))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  sources = builder.as_data_source()
  assert len(sources["train"]) == 2 and len(sources["test"]) == 1
  answers = sorted(sources["train"][i]["answer"].decode() for i in range(2))
  assert answers == ["7", "999.5"]
  assert "tensorflow" not in sys.modules


@pytest.mark.parametrize(
  "response,want",
  [
    ("so the answer is #### 7", 1.0),
    ("He has 7 apples.", 1.0),
    ("7.0", 1.0),
    ("#### 8", 0.0),
    ("I think 7, no wait, 9", 0.0),
    ("no idea", 0.0),
  ],
)
def test_gsm8k_reward(response, want):
  assert gsm8k.reward(response, "7")[0] == want
  assert gsm8k.reward("total $1,234.", "1234")[0] == 1.0


@pytest.mark.parametrize(
  "bad_line,message",
  [
    ("{not json\n", "malformed GSM8K line"),
    (json.dumps({"question": "q"}) + "\n", "missing field 'answer'"),
    (json.dumps({"question": "q", "answer": "no final"}) + "\n", "no '#### <final answer>' line"),
    (json.dumps({"question": "q", "answer": "#### seven"}) + "\n", "'seven' is not a number"),
  ],
)
def test_gsm8k_malformed_line_names_file_and_line(tmp_path, bad_line, message):
  _write_gsm8k(tmp_path, [GSM8K_LINES[0], bad_line], [])
  with pytest.raises(ValueError, match=rf"train.jsonl:2: .*{re.escape(message)}"):
    list(gsm8k.read_jsonl(tmp_path / "train.jsonl"))


def test_gsm8k_missing_files(tmp_path):
  with pytest.raises(ValueError, match="GSM8K needs train.jsonl, test.jsonl"):
    gsm8k.manual_files(tmp_path)


def test_batched_rewards_with_reasons():
  scores, reasons, failed = rewards.batched(arithmetic.reward, ["12", "13", ""], ["12", "12", "12"])
  np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0])
  assert reasons == ["correct", "wrong answer '13' (want '12')", "no answer"]
  assert not failed.any()
  scores, reasons, failed = rewards.batched(
    countdown.reward, ["1+2", "1*2"], [[1, 2], [1, 2]], [3, 3]
  )
  np.testing.assert_allclose(scores, [1.0, 0.1])
  with pytest.raises(ValueError, match=r"Got 2 responses but per-example fields of lengths \[1\]"):
    rewards.batched(arithmetic.reward, ["1", "2"], ["1"])


KEY_CONFIGS = [
  key_token.KeyTokenConfig(),
  key_token.KeyTokenConfig(length=12, n_decisive=3, n_keys=4, placement="late", rule="count"),
  key_token.KeyTokenConfig(
    length=10, n_decisive=4, n_keys=2, placement="early", rule="modsum", key_fn="shift"
  ),
  key_token.KeyTokenConfig(length=6, n_decisive=1, shared_alphabet=True, filler_blind=True),
]


def _rule_reference(response, targets, config):
  picked = [int(response[p]) for p in config.decisive_positions]
  hits = [p == int(t) for p, t in zip(picked, targets)]
  if config.rule == "all":
    return float(all(hits))
  if config.rule == "count":
    return sum(hits) / len(hits)
  in_alphabet = all(p in config.keys for p in picked)
  return float(
    in_alphabet and sum(p - int(t) for p, t in zip(picked, targets)) % config.n_keys == 0
  )


@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(KEY_CONFIGS))
def test_key_token_rewards(seed, config):
  rng = np.random.default_rng(seed)
  example = key_token.make_example(rng, config)
  prompt, targets = example["prompt"], example["targets"]
  assert (
    prompt[0] == key_token.BOS
    and prompt[-1] == key_token.SEP
    and len(prompt) == config.prompt_length
  )
  symbols = prompt[1:-1] - key_token.KEY0
  shift = np.arange(1, config.n_decisive + 1) if config.key_fn == "shift" else 0
  np.testing.assert_array_equal(targets - key_token.KEY0, (symbols + shift) % config.n_keys)
  demo = example["completion"]
  assert key_token.allowed(config)[np.arange(config.length), demo].all()
  assert key_token.reward(demo, targets, config)[0] == 1.0
  responses = rng.choice(np.union1d(config.keys, config.fillers), (16, config.length))
  got = key_token.reward(responses, np.broadcast_to(targets, (16, config.n_decisive)), config)
  np.testing.assert_allclose(got, [_rule_reference(r, targets, config) for r in responses])
  filler_changed = demo.copy()
  off_p = np.setdiff1d(np.arange(config.length), config.decisive_positions)
  filler_changed[off_p] = rng.choice(config.fillers, off_p.size)
  assert key_token.reward(filler_changed, targets, config)[0] == 1.0
  corrupted = demo.copy()
  p = config.decisive_positions[0]
  corrupted[p] = config.keys[(np.flatnonzero(config.keys == demo[p])[0] + 1) % config.n_keys]
  want = {"all": 0.0, "modsum": 0.0, "count": 1 - 1 / config.n_decisive}[config.rule]
  assert key_token.reward(corrupted, targets, config)[0] == pytest.approx(want)


def test_key_token_observation_noise_and_errors():
  config = key_token.KeyTokenConfig(length=6, n_decisive=2, filler_blind=True)
  responses = np.arange(13, 19)[None]
  seen = key_token.observe(responses, config)
  assert (seen[0, config.decisive_positions] == responses[0, config.decisive_positions]).all()
  assert (np.delete(seen[0], config.decisive_positions) == key_token.FILL).all()
  unconstrained = key_token.allowed(key_token.KeyTokenConfig(constrained=False))
  assert (
    unconstrained[:, 5:8].all() and unconstrained[:, 13:15].all() and not unconstrained[:, :5].any()
  )
  noisy_config = key_token.KeyTokenConfig(noise=0.2)
  flipped = key_token.noisy(np.ones(20000, np.float32), np.random.default_rng(0), noisy_config)
  assert abs(1 - flipped.mean() - 0.2) < 0.02
  with pytest.raises(ValueError, match="Unknown rule 'xor'"):
    key_token.KeyTokenConfig(rule="xor")
  with pytest.raises(ValueError, match=r"Expected responses \[B, 8\]"):
    key_token.reward(np.zeros((2, 7), int), np.zeros((2, 2), int), key_token.KeyTokenConfig())


def test_key_token_builder(tmp_path):
  builder = builders.get(
    "key_token", data_dir=str(tmp_path), config="t24_k2_blind", train_size=10, test_size=2
  )
  builder.download_and_prepare()
  example = builder.as_data_source()["train"][4]
  config = builder.builder_config.task
  np.testing.assert_array_equal(example["decisive"], config.decisive_positions)
  assert key_token.reward(example["completion"], example["targets"], config)[0] == 1.0


def test_format_reward_and_key_token_reasons():
  assert rewards.format_reward("think... <answer>1+2</answer>")[0] == 1.0
  assert rewards.format_reward("<answer>1+2</answer> and more")[0] == 0.0
  assert rewards.format_reward("12", r"[0-9]+")[0] == 1.0
  config = key_token.KeyTokenConfig()
  reasons = key_token.explain(
    np.array([[13, 13, 7, 13, 13, 5, 13, 13]]), np.array([[7, 6]]), config
  )
  assert reasons == ["hits p=2:ok, p=5:5!=6"]


def test_gsm8k_non_utf8_and_empty_files_name_the_file(tmp_path):
  (tmp_path / "train.jsonl").write_bytes(
    json.dumps(GSM8K_LINES[0]).encode() + b"\n" + b'{"question": "\xff\xfe"}\n'
  )
  with pytest.raises(ValueError, match=r"train.jsonl:2: malformed GSM8K line: not UTF-8"):
    list(gsm8k.read_jsonl(tmp_path / "train.jsonl"))
  manual = tmp_path / "manual"
  manual.mkdir()
  _write_gsm8k(manual, GSM8K_LINES, [])
  builder = builders.get("gsm8k", data_dir=str(tmp_path / "data"))
  with pytest.raises(ValueError, match=r"test.jsonl: no GSM8K examples \(the file is empty\)"):
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=str(manual))
    )

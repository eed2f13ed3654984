"""Procedural tasks as TFDS datasets: built to array_record, read with
`as_data_source` (random access, no TensorFlow).

  builder = builders.get("arithmetic", data_dir=d, train_size=1000)
  builder.download_and_prepare()
  ds = builder.as_data_source()["train"]; ds[0] -> {"prompt": b"12+34=", ...}

Example i of a split is generated from the seed (seed, split, i), so a dataset
is reproducible from its config alone.
"""

import dataclasses
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit.tasks import (arithmetic, calculator, countdown, gsm8k, key_token, key_turns,
                             target_sum)

_SPLIT_IDS = {"train": 0, "test": 1}


@dataclasses.dataclass
class ProceduralConfig(tfds.core.BuilderConfig):
  """task: the task's own config (the problem distribution); train_size /
  test_size: examples per split; seed: base seed of the generator."""

  task: Any = None
  train_size: int = 20000
  test_size: int = 500
  seed: int = 0


class _ProceduralBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Generates split examples with `make_example(rng, config.task)`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  FEATURES: dict
  make_example: Any

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(self.FEATURES))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in _SPLIT_IDS}

  def _generate_examples(self, split: str):
    config = self.builder_config
    size = config.train_size if split == "train" else config.test_size
    for index in range(size):
      rng = np.random.default_rng([config.seed, _SPLIT_IDS[split], index])
      yield index, self._example(rng, config.task, split)

  def _example(self, rng: np.random.Generator, task, split: str) -> dict:
    """One example of `split` (every split draws from the same distribution)."""
    del split
    return type(self).make_example(rng, task)


class Arithmetic(_ProceduralBuilder):
  """Multi-digit addition / multiplication (see `jaxcredit.tasks.arithmetic`)."""

  make_example = staticmethod(arithmetic.make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "answer": tfds.features.Text(),
      "a": np.int64,
      "b": np.int64,
  }

  def _example(self, rng, task, split):
    return arithmetic.split_example(rng, task, split)  # task.held_out: splits share no problem

  BUILDER_CONFIGS = [
      ProceduralConfig(name="add_2to3_reversed", task=arithmetic.ArithmeticConfig(),
                       description="a+b, 2-3 digits, reversed answer"),
      ProceduralConfig(
          name="add_3to5_scratchpad",
          task=arithmetic.ArithmeticConfig(min_digits=3, max_digits=5, scratchpad=True),
          description="a+b, 3-5 digits, carries then reversed answer",
      ),
      ProceduralConfig(
          name="mul_2to3_scratchpad",
          task=arithmetic.ArithmeticConfig(operation="mul", scratchpad=True),
          description="a*b, 2-3 digits, partial products then reversed answer",
      ),
  ]


class Calculator(_ProceduralBuilder):
  """Arithmetic with a calculator tool (see `jaxcredit.tasks.calculator`)."""

  make_example = staticmethod(calculator.make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "answer": tfds.features.Text(),
  }
  BUILDER_CONFIGS = [
      ProceduralConfig(name="n3", task=calculator.CalculatorConfig(),
                       description="3 operands of 2-3 digits, + and *"),
  ]


class Countdown(_ProceduralBuilder):
  """Reach a target from numbers with + - * / (see `jaxcredit.tasks.countdown`)."""

  make_example = staticmethod(countdown.make_example)
  FEATURES = {
      "prompt": tfds.features.Text(),
      "completion": tfds.features.Text(),
      "numbers": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "target": np.int64,
  }
  BUILDER_CONFIGS = [
      ProceduralConfig(name="n4", task=countdown.CountdownConfig(),
                       description="4 numbers in [1, 99]"),
      ProceduralConfig(name="n3", task=countdown.CountdownConfig(n_numbers=3),
                       description="3 numbers"),
  ]


class KeyToken(_ProceduralBuilder):
  """Token-level credit probe (see `jaxcredit.tasks.key_token`); ids, not text."""

  make_example = staticmethod(key_token.make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "targets": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "decisive": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      ProceduralConfig(name="t8_k2_all", task=key_token.KeyTokenConfig(),
                       description="T=8, K=2, |C|=3, |F|=2, spread, rule all"),
      ProceduralConfig(
          name="t24_k2_blind",
          task=key_token.KeyTokenConfig(length=24, n_keys=4, n_fillers=4, filler_blind=True),
          description="T=24, K=2, |C|=4, |F|=4, filler-blind",
      ),
  ]


class KeyTurns(_ProceduralBuilder):
  """Multi-turn credit probe (see `jaxcredit.tasks.key_turns`); ids, not text."""

  make_example = staticmethod(key_turns.make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "keys": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      ProceduralConfig(name="n4_d2", task=key_turns.KeyTurnsConfig(),
                       description="4 one-token turns, decisive turns 1 and 3, 3 keys"),
  ]


class TargetSum(_ProceduralBuilder):
  """Credit probe with sequential dependence (see `jaxcredit.tasks.target_sum`); ids."""

  make_example = staticmethod(target_sum.make_example)
  FEATURES = {
      "prompt": tfds.features.Tensor(shape=(None,), dtype=np.int32),
      "target": np.int64,
      "completion": tfds.features.Tensor(shape=(None,), dtype=np.int32),
  }
  BUILDER_CONFIGS = [
      ProceduralConfig(name="n6_m4", task=target_sum.TargetSumConfig(),
                       description="up to 6 digits in 0..3 summing to S ~ U[3, 15], EOS allowed"),
  ]


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
    files = gsm8k.manual_files(dl_manager.manual_dir)
    return {split: self._generate_examples(path) for split, path in files.items()}

  def _generate_examples(self, path):
    yield from enumerate(gsm8k.read_jsonl(path))


BUILDERS = {"arithmetic": Arithmetic, "calculator": Calculator, "countdown": Countdown,
            "gsm8k": Gsm8k, "key_token": KeyToken, "key_turns": KeyTurns,
            "target_sum": TargetSum}


def get(
    name: str,
    *,
    data_dir: str,
    config: str | tfds.core.BuilderConfig | None = None,
    **overrides,
):
  """The builder of task `name` writing array_record under `data_dir`.

  config: a config name or BuilderConfig (default: the first); overrides
  (e.g. train_size=1000, seed=3) replace its fields, under a derived name so
  that differently sized datasets never share files.
  """
  if name not in BUILDERS:
    raise ValueError(f"Unknown task {name!r}; known: {', '.join(sorted(BUILDERS))}.")
  builder_cls = BUILDERS[name]
  if not builder_cls.BUILDER_CONFIGS:
    if config is not None or overrides:
      raise ValueError(
          f"Task {name!r} has no configs; got config={config!r}, overrides={overrides}.")
    return builder_cls(data_dir=data_dir, file_format="array_record")
  if isinstance(config, str) or config is None:
    configs = {c.name: c for c in builder_cls.BUILDER_CONFIGS}
    if config is not None and config not in configs:
      raise ValueError(f"Unknown {name} config {config!r}; known: {', '.join(configs)}.")
    config = configs[config] if config else builder_cls.BUILDER_CONFIGS[0]
  if overrides:
    suffix = "_".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    config = dataclasses.replace(config, name=f"{config.name}_{suffix}", **overrides)
  return builder_cls(data_dir=data_dir, config=config, file_format="array_record")

"""Tasks' data as TFDS datasets: built to array_record, read with `as_data_source`
(random access, no TensorFlow). Each task module defines its builder (a `ProceduralBuilder`
for generated tasks) and registers it as its `Task.data`.

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

from jaxcredit.tasks import task

_SPLIT_IDS = {"train": 0, "test": 1}


@dataclasses.dataclass
class ProceduralConfig(tfds.core.BuilderConfig):
  """The builder config of a generated task.

  Attributes:
    task: the task's own options (the problem distribution).
    train_size: examples in the train split.
    test_size: examples in the test split.
    seed: the generator's base seed.
  """

  task: Any = None
  train_size: int = 20000
  test_size: int = 500
  seed: int = 0


class ProceduralBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A TFDS builder whose split examples are generated with ``make_example(rng,
  config.task)``; subclasses set `FEATURES` and `make_example`.

  Attributes:
    FEATURES: the examples' TFDS features.
    make_example: ``make_example(rng, options) -> dict``.
  """

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


def get(
    name: str,
    *,
    data_dir: str,
    config: str | tfds.core.BuilderConfig | None = None,
    **overrides,
):
  """The TFDS builder of a task, writing array_record under `data_dir`.

  Args:
    name: a task with a dataset (`tasks.names("data")`).
    data_dir: where the array_record files go.
    config: a config name or BuilderConfig; None for the first.
    **overrides: replace the config's fields (e.g. train_size=1000, seed=3), under a derived
      name so that differently sized datasets never share files.

  Returns:
    the `tfds.core.DatasetBuilder`.

  Raises:
    ValueError: for a task without a dataset, an unknown config, or overrides of a task
      without configs.
  """
  builder_cls = task.get(name).data
  if builder_cls is None:
    raise ValueError(f"Task {name!r} has no dataset (it runs in the batched lab only); tasks "
                     f"with one: {', '.join(task.names('data'))}.")
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

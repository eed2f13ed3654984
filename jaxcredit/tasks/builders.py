"""Procedural tasks as TFDS datasets: built to array_record, read with
`as_data_source` (random access, no TensorFlow).

  builder = builders.get("arithmetic", data_dir=d, config=...)
  builder.download_and_prepare()
  ds = builder.as_data_source()["train"]; ds[0] -> {"prompt": b"12+34=", ...}

Example i of a split is generated from the seed (seed, split, i), so a dataset
is reproducible from its config alone.
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit.tasks import arithmetic

_SPLIT_IDS = {"train": 0, "test": 1}


@dataclasses.dataclass
class ArithmeticBuilderConfig(tfds.core.BuilderConfig):
  """task: the problem distribution; train_size/test_size: examples per split;
  seed: base seed of the generator."""

  task: arithmetic.ArithmeticConfig = dataclasses.field(default_factory=arithmetic.ArithmeticConfig)
  train_size: int = 20000
  test_size: int = 500
  seed: int = 0


class Arithmetic(tfds.core.GeneratorBasedBuilder):
  """Multi-digit addition / multiplication (see `jaxcredit.tasks.arithmetic`)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = [
      ArithmeticBuilderConfig(name="add_2to3_reversed", description="a+b, 2-3 digits, reversed answer"),
      ArithmeticBuilderConfig(
          name="add_3to5_scratchpad",
          task=arithmetic.ArithmeticConfig(min_digits=3, max_digits=5, scratchpad=True),
          description="a+b, 3-5 digits, carries then reversed answer",
      ),
      ArithmeticBuilderConfig(
          name="mul_2to3_scratchpad",
          task=arithmetic.ArithmeticConfig(operation="mul", scratchpad=True),
          description="a*b, 2-3 digits, partial products then reversed answer",
      ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({
            "prompt": tfds.features.Text(),
            "completion": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "a": np.int64,
            "b": np.int64,
        }),
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in _SPLIT_IDS}

  def _generate_examples(self, split: str):
    config = self.builder_config
    size = config.train_size if split == "train" else config.test_size
    for index in range(size):
      rng = np.random.default_rng([config.seed, _SPLIT_IDS[split], index])
      yield index, arithmetic.make_example(rng, config.task)


BUILDERS = {"arithmetic": Arithmetic}


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
  if isinstance(config, str) or config is None:
    configs = {c.name: c for c in builder_cls.BUILDER_CONFIGS}
    if config is not None and config not in configs:
      raise ValueError(f"Unknown {name} config {config!r}; known: {', '.join(configs)}.")
    config = configs[config] if config else builder_cls.BUILDER_CONFIGS[0]
  if overrides:
    suffix = "_".join(f"{k}{v}" for k, v in sorted(overrides.items()))
    config = dataclasses.replace(config, name=f"{config.name}_{suffix}", **overrides)
  return builder_cls(data_dir=data_dir, config=config, file_format="array_record")

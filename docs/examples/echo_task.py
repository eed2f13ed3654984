"""A task in one module: `echo`, whose response must repeat the prompt's digits.

Importing this module registers the task; a run then selects it with
`--config.task.name=echo` (and `--config.task.options.n_digits=4` to change it).
"""

import dataclasses

import numpy as np
import tensorflow_datasets as tfds

from jaxcredit import tasks
from jaxcredit.tasks import builders, loader, procedural, rewards


@dataclasses.dataclass(frozen=True)
class EchoConfig:
  """n_digits: how many digits a prompt holds."""

  n_digits: int = 3


def make_example(rng: np.random.Generator, config: EchoConfig) -> dict:
  """One problem: the prompt `d1..dn=`, its demonstration and answer `d1..dn`."""
  digits = "".join(str(d) for d in rng.integers(0, 10, config.n_digits))
  return {"prompt": f"{digits}=", "completion": digits, "answer": digits}


class Echo(builders.ProceduralBuilder, skip_registration=True):
  """echo's problems as a TFDS dataset, generated from a seed."""

  make_example = staticmethod(make_example)
  FEATURES = {"prompt": tfds.features.Text(), "completion": tfds.features.Text(),
              "answer": tfds.features.Text()}
  BUILDER_CONFIGS = [builders.ProceduralConfig(name="n3", task=EchoConfig())]


def train_task(config, *, data_dir: str, seed: int,
               tokenizer: str | None = None) -> tasks.TrainTask:
  """echo bound to its data: characters, reward 1 for an exact copy of the digits."""
  del tokenizer
  return procedural.character_task(
      "echo", config, tasks.options_of(EchoConfig, config), "0123456789=",
      lambda response, example: rewards.exact_match(response, loader.as_text(example["answer"])),
      data_dir=data_dir, seed=seed)


TASK = tasks.register(tasks.Task(name="echo", options=EchoConfig, data=Echo, train=train_task))

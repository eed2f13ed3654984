"""Builds a task's dataset and prints its size and a few examples.

python -m jaxcredit.tasks.prepare --task arithmetic --data_dir DIR [--config NAME] [--show 3]
"""

import argparse

from jaxcredit import tasks
from jaxcredit.tasks import builders


def _text(value) -> str:
  return value.decode() if isinstance(value, bytes) else str(value)


def main(argv: list[str] | None = None) -> None:
  """The command line: builds a task's dataset and prints its size and a few examples.

  Args:
    argv: the arguments (``--task``, ``--data_dir``, ``--config``, ``--show``,
      ``--train_size``, ``--test_size``, ``--seed``); None reads sys.argv.
  """
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", required=True,
                      help=f"one of {', '.join(tasks.names('data'))}")
  parser.add_argument("--data_dir", required=True, help="where the array_record files go")
  parser.add_argument("--config", default=None, help="builder config name (default: the first)")
  parser.add_argument("--show", type=int, default=3, help="examples to print per split")
  parser.add_argument("--train_size", type=int, default=None, help="override the train split size")
  parser.add_argument("--test_size", type=int, default=None, help="override the test split size")
  parser.add_argument("--seed", type=int, default=None, help="override the generator seed")
  args = parser.parse_args(argv)
  overrides = {
      k: getattr(args, k) for k in ("train_size", "test_size", "seed")
      if getattr(args, k) is not None
  }
  builder = builders.get(args.task, data_dir=args.data_dir, config=args.config, **overrides)
  builder.download_and_prepare()
  sources = builder.as_data_source()
  print(f"{args.task}/{builder.builder_config.name} in {builder.data_dir}")
  for split, source in sources.items():
    print(f"  {split}: {len(source)} examples")
    for i in range(min(args.show, len(source))):
      example = {k: _text(v) for k, v in source[i].items()}
      print("    " + "  ".join(f"{k}={v}" for k, v in sorted(example.items())))


if __name__ == "__main__":
  main()

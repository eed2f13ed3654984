"""Comparison plots of training runs.

python -m jaxcredit.plot RUN_DIR [RUN_DIR ...] --metric eval/accuracy --out curves.png

Reads each run's metrics.jsonl and draws the metric against the step, one line
per run (labelled by directory name). Needs matplotlib (`pip install jaxcredit[plot]`).
"""

import argparse
import json
import pathlib


def read_metric(run_dir: str | pathlib.Path, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `metric` in run_dir/metrics.jsonl; ValueError if absent."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  if not path.exists():
    raise ValueError(f"No metrics.jsonl in {run_dir}.")
  steps, values = [], []
  for line_number, line in enumerate(path.read_text().splitlines(), start=1):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as error:
      raise ValueError(f"{path}:{line_number}: not JSON ({error}).") from None
    if metric in record:
      steps.append(record["step"])
      values.append(record[metric])
  if not steps:
    raise ValueError(f"{path} has no {metric!r} entries.")
  return steps, values


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="+", help="run directories (each with metrics.jsonl)")
  parser.add_argument("--metric", default="eval/accuracy")
  parser.add_argument("--out", default="curves.png")
  args = parser.parse_args(argv)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figure, axis = plt.subplots(figsize=(7, 4))
  for run in args.runs:
    steps, values = read_metric(run, args.metric)
    axis.plot(steps, values, label=pathlib.Path(run).name)
  axis.set_xlabel("step")
  axis.set_ylabel(args.metric)
  axis.legend()
  axis.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(args.out, dpi=120)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

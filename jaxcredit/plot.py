"""Comparison plots of training runs.

python -m jaxcredit.plot RUN_DIR [RUN_DIR ...] --metric eval/accuracy --out curves.png \
    [--smooth 0.6]

Reads each run's metrics.jsonl and draws the metric against the global step
(SFT steps, then RL steps), one line per run labelled by its directory name,
with a dotted line where each run's RL stage begins. Needs matplotlib
(`pip install jaxcredit[plot]`).
"""

import argparse
import json
import pathlib

import numpy as np


def read_records(run_dir: str | pathlib.Path) -> list[dict]:
  """The records of run_dir/metrics.jsonl; ValueError naming the file and line if one is not
  JSON."""
  path = pathlib.Path(run_dir) / "metrics.jsonl"
  if not path.exists():
    raise ValueError(f"No metrics.jsonl in {run_dir}.")
  records = []
  for line_number, line in enumerate(path.read_text().splitlines(), start=1):
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as error:
      raise ValueError(f"{path}:{line_number}: not JSON ({error}).") from None
  return records


def read_metric(run_dir: str | pathlib.Path, metric: str) -> tuple[list[int], list[float]]:
  """(steps, values) of `metric` in run_dir/metrics.jsonl; ValueError listing
  the metrics the file has if it has no `metric`."""
  records = read_records(run_dir)
  steps = [r["step"] for r in records if metric in r]
  if not steps:
    available = sorted({k for r in records for k in r} - {"step"})
    raise ValueError(f"{pathlib.Path(run_dir) / 'metrics.jsonl'} has no {metric!r} entries; "
                     f"it has: {', '.join(available) or 'no metrics'}.")
  return steps, [r[metric] for r in records if metric in r]


def rl_start(run_dir: str | pathlib.Path) -> int | None:
  """The global step after which RL begins (the last SFT step), or None if the
  run has no RL records or no SFT before them."""
  rl_steps = [r["step"] for r in read_records(run_dir) if any(k.startswith("train/") for k in r)]
  return min(rl_steps) - 1 if rl_steps and min(rl_steps) > 1 else None


def smooth(values: list[float], weight: float) -> np.ndarray:
  """TensorBoard-style exponential moving average, debiased so the curve starts
  at the first value: s_t = w s_{t-1} + (1 - w) x_t, divided by 1 - w^t."""
  if not 0.0 <= weight < 1.0:
    raise ValueError(f"--smooth must be in [0, 1), got {weight}.")
  out, average = [], 0.0
  for t, value in enumerate(values, start=1):
    average = weight * average + (1.0 - weight) * value
    out.append(average / (1.0 - weight**t))
  return np.asarray(out)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m jaxcredit.plot",
                                   description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("runs", nargs="+",
                      help="run directories (the --workdir of each run, with metrics.jsonl)")
  parser.add_argument(
      "--metric", default="eval/accuracy",
      help="metric to draw, a key of metrics.jsonl (e.g. train/reward_mean, train/kl)")
  parser.add_argument("--out", default="curves.png", help="PNG file to write")
  parser.add_argument(
      "--smooth", type=float, default=0.0,
      help="exponential moving-average weight in [0, 1) for noisy metrics (0: raw values)")
  parser.add_argument("--title", default=None, help="figure title (default: the metric)")
  args = parser.parse_args(argv)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figure, axis = plt.subplots(figsize=(7, 4))
  for run in args.runs:
    steps, values = read_metric(run, args.metric)
    line, = axis.plot(steps, smooth(values, args.smooth), label=pathlib.Path(run).name)
    start = rl_start(run)
    if start is not None:
      axis.axvline(start, color=line.get_color(), linestyle=":", linewidth=1)
  axis.set_xlabel("global step (SFT, then RL from the dotted line)")
  axis.set_ylabel(args.metric + (f" (smoothed {args.smooth:g})" if args.smooth else ""))
  axis.set_title(args.title or args.metric)
  axis.legend()
  axis.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(args.out, dpi=120)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()

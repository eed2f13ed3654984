"""The quickstart's RL gain across seeds and small perturbations: the README's command, run as
it ships (export included) for each seed, and for seed 0 with each learning rate moved by 0.1%
(a perturbation of the size float32 summation order makes).

  python -m bench.quickstart [--seeds 0 1 2] [--out bench/results/quickstart.md]

Each row: greedy accuracy on the held-out test problems before training, where SFT stopped
(`sft.target_accuracy`), after the RL steps, the RL gain (after RL minus after SFT) and the
command's wall time. The baseline a reader assumes is the SFT policy itself: RL's gain is
measured against where SFT left it, in the same run.
"""

import argparse
import datetime
import json
import pathlib
import runpy
import subprocess
import sys
import tempfile

from bench.common import machine, table

ROOT = pathlib.Path(__file__).parent.parent
PERTURBATIONS = {"sft.learning_rate x 1.001": ["--config.sft.learning_rate=0.001001"],
                 "rl.learning_rate x 1.001": ["--config.rl.learning_rate=0.0001001"]}


def _run(workdir: pathlib.Path, overrides: list[str]) -> list:
  """[before, after SFT, after RL accuracy, SFT steps, seconds] of one quickstart run."""
  command = [sys.executable, "-m", "jaxcredit.train", "--config",
             str(ROOT / "experiments/quickstart.py"), "--workdir", str(workdir), *overrides]
  result = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT)
  final = next(line for line in result.stdout.splitlines() if line.startswith("final: "))
  seconds = float(final.split("'seconds': ")[1].split(",")[0])
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  evals = [(line["step"], line["eval/accuracy"]) for line in lines if "eval/accuracy" in line]
  rl_start = min(line["step"] for line in lines if "train/loss" in line) - 1
  after_sft = [accuracy for step, accuracy in evals if step <= rl_start][-1]
  return [evals[0][1], after_sft, evals[-1][1], rl_start, seconds]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--out", type=pathlib.Path, default=None)
  args = parser.parse_args()
  runs = {f"seed {seed}": [f"--config.seed={seed}"] for seed in args.seeds}
  runs.update({f"seed {args.seeds[0]}, {name}": [f"--config.seed={args.seeds[0]}", *overrides]
               for name, overrides in PERTURBATIONS.items()})
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for index, (name, overrides) in enumerate(runs.items()):
      before, sft, rl, sft_steps, seconds = _run(pathlib.Path(tmp) / str(index), overrides)
      rows.append([name, f"{before:.3f}", f"{sft:.3f} ({sft_steps} steps)", f"{rl:.3f}",
                   f"{rl - sft:+.3f}", f"{seconds:.0f}"])
      print(rows[-1], file=sys.stderr, flush=True)
  config = runpy.run_path(str(ROOT / "experiments/quickstart.py"))["get_config"]()
  lines = ["# Quickstart: RL gain over seeds", "", f"machine: {machine()}; {datetime.date.today()}",
           "",
           "`python -m jaxcredit.train --config experiments/quickstart.py` as shipped (SFT to "
           f"greedy accuracy {config.sft.target_accuracy}, then {config.rl.steps} GRPO steps), "
           f"greedy accuracy on the {config.task.test_size} held-out test problems.", "",
           table(["run", "before", "after SFT", "after RL", "RL gain", "seconds"], rows)]
  text = "\n".join(lines) + "\n"
  print(text)
  if args.out:
    args.out.write_text(text)


if __name__ == "__main__":
  main()

"""One answer from both trainers? The same cells through the experiment-config trainer
(`jaxcredit.train`, run by configs_v1.py's `trainers` preset) and through the batched lab
(configs.py's `trainers` preset), at the trainer's default key_token policy (two layers,
d = 64) and one learning rate (1e-3) for every arm:

  python -m studies.credit_study --config studies/credit_study/configs_v1.py:trainers \\
      --workdir TRAINER
  python -m studies.credit_study --config studies/credit_study/configs.py:trainers --workdir LAB
  python -m studies.credit_study.trainers --trainer TRAINER --lab LAB \\
      --out studies/credit_study/results/trainers

collects the finished runs of both (OUT/trainer_curves.json, OUT/cells/) and writes
OUT/report.md; with --out alone it rewrites the report from what OUT holds.

Per G and arm, exact J after 100 and 300 updates under each trainer: the trainers' runs
share no seeds, so they are compared unpaired (Welch's interval, a permutation p). The
study's answer, the exact credit minus GRPO, is paired by seed within a trainer (BCa
interval, sign flips) and compared across trainers unpaired. The lab's run of the study's
own policy (one layer, d = 32) at the same rate is the depth-and-width factor. Two
results agree when the interval of their difference holds 0 (uncorrected: the stricter
reading for a claim of agreement).
"""

import argparse
import json
import pathlib
import shutil

import numpy as np

from jaxcredit.lab import exact_metrics, statistics
from studies.credit_study import report, sweep

UPDATES = (100, 300)
ARMS = ("grpo", "oracle")
DRAWS = 10_000
TRAINER = "jaxcredit.train"
LAB_POLICIES = {"trainer_policy": "lab, 2 layers d = 64", "study_policy": "lab, 1 layer d = 32"}


def collect_trainer(workdir: pathlib.Path) -> dict:
  """The finished runs of configs_v1.py's `trainers` preset in `workdir`: {G: {arm: {seed:
  {"updates", "success", "gen_tokens", "seconds"}}}} (a run is finished once its
  wall_seconds.json is written)."""
  study = json.loads((workdir / "study_config.json").read_text())
  runs = {}
  for task, spec in study["tasks"].items():
    group_size = str(spec["train"]["rl"]["group_size"])
    for finished in sorted((workdir / "runs" / task).glob("*/seed*/wall_seconds.json")):
      run_dir = finished.parent
      curve = exact_metrics.read_curve(run_dir)
      runs.setdefault(group_size, {}).setdefault(run_dir.parent.name, {})[
          run_dir.name.removeprefix("seed")] = {
              **{k: curve[k] for k in ("updates", "success", "gen_tokens")},
              "seconds": json.loads(finished.read_text())}
  return runs


def collect(trainer_dir: pathlib.Path, lab_dir: pathlib.Path, out: pathlib.Path) -> None:
  """Adds the trainer's workdir runs to OUT/trainer_curves.json and copies the lab's cells.
  The G's the workdir ran replace those OUT holds; the others stay, each with the commit
  and machine that collected it (so G's can be run in separate workdirs)."""
  out.mkdir(parents=True, exist_ok=True)
  path = out / "trainer_curves.json"
  stored = json.loads(path.read_text()) if path.exists() else {"runs": {}}
  runs = collect_trainer(trainer_dir)
  now = {"commit": sweep.commit(), "machine": report.machine()}
  path.write_text(json.dumps(
      {"runs": {**stored["runs"], **runs},
       "collected": {**collections(stored), **{g: now for g in runs}}}, indent=1))
  for cell in sorted(lab_dir.glob("cells/*/G*.json")):
    target = out / "cells" / cell.parent.name / cell.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cell, target)


def collections(stored: dict) -> dict:
  """{G: {"commit", "machine"}} of a trainer_curves.json (one collection for every G in
  files written before G's were collected separately)."""
  if "collected" in stored:
    return stored["collected"]
  return {g: {key: stored[key] for key in ("commit", "machine")} for g in stored["runs"]}


def collected_text(stored: dict) -> str:
  """When and where the runs were collected, per G when that differs."""
  by_g = collections(stored)
  if len({(c["commit"], c["machine"]) for c in by_g.values()}) == 1:
    first = next(iter(by_g.values()))
    return f"Both sources' runs collected at {first['commit']} on {first['machine']}."
  return "Both sources' runs collected " + "; ".join(
      f"for G = {g} at {c['commit']} on {c['machine']}"
      for g, c in sorted(by_g.items(), key=lambda item: int(item[0]))) + "."


def read(out: pathlib.Path) -> tuple[dict, dict, dict]:
  """({source: {G: {arm: {seed: curve}}}}, {source: [(runs, seconds)]}, `collected_text`)
  from OUT, the sources being TRAINER (one entry per run) and the lab
  policies that OUT/cells holds (one entry per cell: its runs share compiled programs)."""
  stored = json.loads((out / "trainer_curves.json").read_text())
  trainer = stored["runs"]
  curves = {TRAINER: trainer}
  seconds = {TRAINER: [(1, r["seconds"]) for g in trainer.values() for a in g.values()
                       for r in a.values()]}
  for regime in LAB_POLICIES:
    for path in sorted((out / "cells" / regime).glob("G*.json")):
      cell = json.loads(path.read_text())
      arms = {arm: cell["arms"][arm]["curves"] for arm in ARMS if arm in cell["arms"]}
      curves.setdefault(regime, {})[path.stem.removeprefix("G")] = arms
      runs = sum(len(c) for c in arms.values())
      seconds.setdefault(regime, []).append((runs, cell["seconds"]))
  return curves, seconds, collected_text(stored)


def at_update(curve: dict, update: int) -> float:
  """J of a run after `update` updates (a measurement there is required)."""
  if update not in curve["updates"]:
    raise ValueError(f"No exact J measured after {update} updates (measured after "
                     f"{curve['updates']}).")
  return float(curve["success"][curve["updates"].index(update)])


def values(runs: dict, update: int) -> dict:
  """{seed: J after `update` updates} of one arm's runs."""
  return {seed: at_update(curve, update) for seed, curve in runs.items()}


def contrast(by_arm: dict, update: int) -> dict:
  """{seed: oracle - GRPO} after `update` updates, over the seeds both arms ran."""
  grpo, oracle = values(by_arm["grpo"], update), values(by_arm["oracle"], update)
  return {seed: oracle[seed] - grpo[seed] for seed in grpo if seed in oracle}


def _mean_ci(sample, rng) -> str:
  mean, low, high = statistics.reported_ci(list(sample), rng, DRAWS, method="BCa")
  return report.fmt_interval(mean, low, high)


def _agreement(first, second) -> tuple[str, str, str]:
  """(Welch interval text, permutation p text, agree / differ) of first - second."""
  first, second = list(first), list(second)
  if min(len(first), len(second)) < 2:
    return "n/a", "n/a", "n/a"
  difference, low, high = statistics.welch_ci(first, second)
  p = statistics.unpaired_p(first, second)
  return (report.fmt_interval(difference, low, high), f"{p:.3f}",
          "agree" if low <= 0 <= high else "differ")


def _rows(prefix: str, samples: dict, rng, *, sign_flip: bool = False) -> list[str]:
  """A table row per source of {source: {seed: value}}: its seeds, mean and interval (and
  sign-flip p), and each lab policy against jaxcredit.train's sample."""
  lines = []
  for source, sample in samples.items():
    against = (("", "", "") if source == TRAINER or TRAINER not in samples
               else _agreement(sample.values(), samples[TRAINER].values()))
    flips = [f"{statistics.sign_flip_p(list(sample.values())):.4f}"] if sign_flip else []
    lines.append(" | ".join([f"| {prefix}", LAB_POLICIES.get(source, source), str(len(sample)),
                             _mean_ci(sample.values(), rng), *flips, *against]) + " |")
  return lines


def _sources(curves: dict, g: str) -> dict:
  """{source: {arm: runs}} of the sources that ran G = g, jaxcredit.train first."""
  return {source: curves[source][g] for source in (TRAINER, *LAB_POLICIES)
          if g in curves.get(source, {})}


def comparison_rows(curves: dict, rng) -> list[str]:
  """Per G, arm and update: each source's mean J and every lab policy against the trainer."""
  lines = ["| G | arm | updates | source | seeds | J | − jaxcredit.train | p | reading |",
           "|---|---|---|---|---|---|---|---|---|"]
  for g in sorted(curves[TRAINER], key=int):
    for arm in ARMS:
      for update in UPDATES:
        lines += _rows(f"{g} | {arm} | {update}", {
            source: values(by_arm[arm], update)
            for source, by_arm in _sources(curves, g).items() if by_arm.get(arm)}, rng)
  return lines


def contrast_rows(curves: dict, rng) -> list[str]:
  """Per G and update: oracle - GRPO under each source (paired by seed), and each lab
  policy's contrast against the trainer's."""
  lines = ["| G | updates | source | seeds | oracle − GRPO | sign-flip p | − jaxcredit.train "
           "| p | reading |", "|---|---|---|---|---|---|---|---|---|"]
  for g in sorted(curves[TRAINER], key=int):
    for update in UPDATES:
      lines += _rows(f"{g} | {update}", {
          source: contrast(by_arm, update) for source, by_arm in _sources(curves, g).items()
          if all(by_arm.get(arm) for arm in ARMS)}, rng, sign_flip=True)
  return lines


def write_report(out: pathlib.Path) -> None:
  """OUT/report.md from OUT/trainer_curves.json and OUT/cells."""
  rng = np.random.default_rng(0)
  curves, seconds, collected = read(out)
  timing = []
  for source, pieces in seconds.items():
    if not pieces:
      continue
    runs, total = (sum(column) for column in zip(*pieces))
    timing.append(f"- {LAB_POLICIES.get(source, source)}: {runs} runs in {total:.0f} s, "
                  f"{total / runs:.0f} s a run")
  lines = [
      "# One answer from both trainers",
      "",
      "The same key_token cells (T = 24, two decisive positions, |C| = 4, filler hidden from "
      "the policy, from the random policy; GRPO and the exact credit, RMS-scaled advantages, "
      "one PPO-clip step per batch, Adam at 1e-3 with global-norm clipping at 1; 8 prompts "
      "per update) trained by the experiment-config trainer (`jaxcredit.train`, "
      "configs_v1.py's `trainers` preset) and by the batched lab (configs.py's `trainers` "
      "preset), at the trainer's default policy (2 layers, d = 64) and, in the lab, also at "
      "the study's (1 layer, d = 32) at the same rate. J is the exact expected success: "
      "jaxcredit.train's on its 64 held-out test prompts (the 16 key pairs drawn with "
      "repeats), the lab's over the 16 key pairs. The trainers share no seeds: a source's "
      "difference from jaxcredit.train is unpaired (Welch's 95% interval, permutation p); "
      "oracle − GRPO is paired by seed within a source (BCa interval, sign flips). Reading: "
      "*agree* when the difference's interval holds 0 (uncorrected), else *differ*.",
      "",
      f"{collected} "
      "G run so far: " + "; ".join(
          f"{LAB_POLICIES.get(source, source)} {', '.join(sorted(by_g, key=int))}"
          for source, by_g in curves.items()) + ".",
      "",
      "## Exact J after 100 and 300 updates",
      "",
      *comparison_rows(curves, rng),
      "",
      "## The study's answer: the exact credit minus GRPO",
      "",
      *contrast_rows(curves, rng),
      "",
      "## Wall time on this CPU",
      "",
      "jaxcredit.train trains one run at a time; the lab trains a cell's runs side by side in "
      "one compiled program (vmapped), so its time a run falls with the runs a program holds.",
      "",
      *timing,
      "",
  ]
  (out / "report.md").write_text("\n".join(lines))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--trainer", type=pathlib.Path, help="configs_v1.py:trainers's workdir")
  parser.add_argument("--lab", type=pathlib.Path, help="configs.py:trainers's workdir")
  parser.add_argument("--out", type=pathlib.Path, required=True)
  args = parser.parse_args(argv)
  if (args.trainer is None) != (args.lab is None):
    parser.error("--trainer and --lab go together (neither: rewrite OUT's report).")
  if args.trainer is not None:
    collect(args.trainer, args.lab, args.out)
  write_report(args.out)
  print(f"wrote {args.out / 'report.md'}")


if __name__ == "__main__":
  main()

"""Dr. GRPO's length bias (Liu et al. 2025, arXiv 2503.20783), measured on target_sum.

  python -m studies.length_bias --config studies/length_bias/configs.py:small --workdir DIR

The published finding: GRPO's loss divides each response's token sum by its length
(`seq-mean-token-mean`), so a wrong response's negative advantage weighs less per token
the longer it is, and a right one's positive advantage more the shorter it is: GRPO
makes incorrect responses progressively longer (their Figure 1, right, and Figure 5);
Dr. GRPO, which drops the length and the std normalisation (`dr_grpo` advantages,
`seq-mean-token-sum-norm`), does not. On target_sum a response stops at a sampled EOS,
so its length is the policy's choice, and J(pi) is exact.

Each arm (advantage estimator, loss aggregation) is one batched cell (`lab.batched`:
the seeds vmapped in one program) at the study's learning rate, with native (not
RMS-scaled) advantages as the paper trains. Per update the cell logs the mean length of
the rewarded and of the unrewarded responses; the report gives each arm's change from
the first batch to the last tenth of training, paired by seed against GRPO's, with the
exact J(pi) beside it. Regimes are target_sum configurations: where a longer response reaches
a larger sum the task itself rewards length; where every target is reachable in one
digit (zeros pad at no cost) it does not. Outputs in DIR: <regime>/<arm>.json (written
once, read back on a rerun) and report.md.
"""

import json
import pathlib
import time

import numpy as np

from jaxcredit.lab import batched, cells
from jaxcredit.models import preset
from jaxcredit.tasks import target_sum
from studies.credit_study.report import fmt_interval, machine, t_interval

LENGTHS = ("length_incorrect", "length_correct")
LEARNT = "length_preference_lam"  # lambda_grpo_learned's exponent before each update


def cell_of(study, regime: str, arm: str) -> cells.Cell:
  """The batched cell of one arm in one regime (a target_sum configuration)."""
  spec = study.arms[arm]
  return cells.Cell(
      task=target_sum.TargetSumConfig(**study.regimes[regime]),
      model=preset(study.model.preset, vocab_size=target_sum.VOCAB_SIZE, **study.model.overrides),
      arms=(spec.advantage,), group_size=study.group_size,
      prompts_per_step=study.prompts_per_step, updates=study.updates,
      eval_every=study.eval_every, eval_prompts=64,
      objective={"policy": {"name": "ppo_clip", "aggregation": spec.aggregation}})


def start_and_end(per_update: np.ndarray, weights: np.ndarray,
                  fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
  """Per run, a per-update metric [N, U] at the first update (the initial policy's batch:
  the same for every arm of a seed) and its mean over the last `fraction` of the updates,
  each update weighted by `weights` [N, U] (the share of the batch the metric averages
  over; NaN where there is none)."""
  width = max(1, int(round(fraction * per_update.shape[1])))

  def mean(window):
    total = weights[:, window].sum(axis=1)
    weighted = (per_update[:, window] * weights[:, window]).sum(axis=1)
    return np.where(total > 0, weighted / np.where(total > 0, total, 1.0), np.nan)

  return mean(slice(None, 1)), mean(slice(-width, None))


def run(study, workdir: str) -> dict:
  """Trains every (regime, arm) not yet written, then writes report.md; returns
  {regime: {arm: results}}."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  results = {}
  for regime in study.regimes:
    (workdir / regime).mkdir(exist_ok=True)
    for arm in sorted(study.arms, key=lambda name: name != "grpo"):  # GRPO first
      path = workdir / regime / f"{arm}.json"
      if not path.exists():
        print(f"[length bias] {regime}: {arm}, {len(study.seeds)} seeds, {study.updates} "
              "updates", flush=True)
        result = batched.Runner(cell_of(study, regime, arm)).train(
            [(0, study.learning_rate, seed) for seed in study.seeds])
        kept = {name: np.asarray(result[name]).tolist()
                for name in ("success", "gen_tokens", *LENGTHS, "incorrect_share", LEARNT)
                if name in result}
        kept["seconds"] = result["compile_seconds"] + result["run_seconds"]
        path.write_text(json.dumps(kept))
      results.setdefault(regime, {})[arm] = {
          k: np.asarray(v) for k, v in json.loads(path.read_text()).items()}
  (workdir / "report.md").write_text(report(study, results))
  print(f"[length bias] wrote {workdir / 'report.md'}", flush=True)
  return results


def _interval(values) -> str:
  """Mean and Student-t interval over the seeds that define the value ("n/a" if none)."""
  values = [v for v in values if np.isfinite(v)]
  return fmt_interval(*t_interval(values)) if values else "n/a"


def report(study, results: dict) -> str:
  """Per regime and arm: the exact J(pi) at the start and the end, and the mean length of
  the unrewarded and rewarded responses in the first batch and over the last tenth of the
  updates, and its change; a learnt lambda-GRPO arm's exponent per seed; then each arm's
  change minus GRPO's, paired by seed. Student-t 95% intervals over seeds."""
  seconds = sum(float(r["seconds"]) for by_arm in results.values() for r in by_arm.values())
  lines = [
      "# Dr. GRPO's length bias on target_sum", "",
      f"{study.prompts_per_step} prompts x {study.group_size} responses per update, "
      f"{study.updates} updates, learning rate {study.learning_rate:g}, one PPO-clip step per "
      f"batch, native advantages; seeds {list(study.seeds)}. A response's length is its "
      "action count (digits and its EOS). Intervals: Student-t 95% over the seeds that "
      "define the value (n/a for one; a seed without incorrect responses in a window "
      "leaves that window's incorrect length undefined). Published (arXiv 2503.20783, "
      "Figure 1 right and Figure 5, Qwen2.5 on MATH): GRPO's incorrect responses grow "
      "longer through training, Dr. GRPO's do not (a qualitative finding: no number to "
      "match).", "",
      f"Written {time.strftime('%Y-%m-%d')} on {machine()}; {seconds / 60:.1f} min of "
      "compiling and training in all.", ""]
  for regime, by_arm in results.items():
    lines += [f"## Regime `{regime}`: target_sum {dict(study.regimes[regime])}", "",
              "| arm | advantage | aggregation | J(π) start | J(π) end | incorrect: start | "
              "incorrect: last 10% | incorrect: change | correct: start | correct: last 10% | "
              "correct: change |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    changes = {}
    for arm, result in by_arm.items():
      spec = study.arms[arm]
      cells = [_interval(result["success"][:, 0]), _interval(result["success"][:, -1])]
      for name in LENGTHS:
        share = result["incorrect_share"]
        weights = share if name == "length_incorrect" else 1 - share
        first, last = start_and_end(result[name], weights)
        changes[arm, name] = last - first
        cells += [_interval(first), _interval(last), _interval(last - first)]
      advantage = spec.advantage if isinstance(spec.advantage, str) else dict(spec.advantage)
      lines.append(f"| {arm} | {advantage} | {spec.aggregation} | " + " | ".join(cells) + " |")
    learnt = {arm: result[LEARNT] for arm, result in by_arm.items() if LEARNT in result}
    for arm, lam in learnt.items():
      width = max(1, lam.shape[1] // 10)
      lines += ["", f"{arm}'s learnt λ, per seed: at the first update "
                f"{', '.join(f'{v:.3f}' for v in lam[:, 0])}; mean over the last 10% "
                f"{', '.join(f'{v:.3f}' for v in lam[:, -width:].mean(1))}."]
    if "grpo" in by_arm:
      lines += ["", "Each arm's length change minus GRPO's, paired by seed (negative: the arm "
                "lengthens less than GRPO does).", "",
                "| arm | incorrect | correct |", "|---|---|---|"]
      for arm in by_arm:
        if arm != "grpo":
          lines.append(f"| {arm} | " + " | ".join(
              _interval(changes[arm, name] - changes["grpo", name]) for name in LENGTHS) + " |")
    lines.append("")
  return "\n".join(lines)

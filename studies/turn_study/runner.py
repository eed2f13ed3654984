"""Does turn-level credit matter? Trajectory GRPO, turn-level estimators and the exact
turn oracle on key_turns, at equal generated tokens.

  python -m studies.turn_study --config studies/turn_study/configs.py:small --workdir DIR

In each regime (key_turns options, e.g. turns after the last decisive one), every
(estimator, seed) run trains with `jaxcredit.train.loop.run` (same initialisation and
prompts per seed) and logs the exact J(pi) (`key_turns.oracle.success`) every `measure_every`
updates against the tokens generated so far, continuations of the per-turn baseline
included, and scores its own credit per turn against the exact turn credit
(`turn_score_hook`). The report compares the arms at the largest token budget every run of
the regime reached (J interpolated in log tokens) and by the mean J over log tokens on a
common range, each as a difference from GRPO paired by seed. Outputs in DIR:
<regime>/runs/<estimator>/seed<k>/ (resumable training workdirs; wall_seconds.json marks
one complete), curves.json ({regime: {estimator: {seed: curve}}}), report.md.
"""

import json
import pathlib
import time

import ml_collections
import numpy as np

from jaxcredit import estimators
from jaxcredit.credit import extras
from jaxcredit.lab import exact_metrics, scores
from jaxcredit.tasks import key_turns
from studies.credit_study import runner as credit_study
from studies.credit_study import sweep
from studies.credit_study.report import fmt_interval, machine, t_interval

SCORE = "train/hook/turn_score/"
# Scores of an arm's turn credit against the exact A_k (lab.scores), reported per arm.
TURN_SCORES = {"r_pool": "r (pooled)", "r_within": "r within episodes", "sa": "sign agreement",
               "dm": "decisive mass", "dm_oracle": "decisive mass, exact"}


def train_config(study, regime: str, name: str, seed: int,
                 data_dir: str) -> ml_collections.ConfigDict:
  """The training config of one (regime, estimator, seed) run."""
  config = ml_collections.ConfigDict(study.train.to_dict())
  config.task.options = {**config.task.options, **study.regimes[regime]}
  config.seed = seed
  config.task.data_dir = data_dir
  config.advantage = study.estimators[name].to_dict()
  config.rl.steps = study.updates + 1  # J is measured before update `updates` + 1
  return config


def per_turn(x, turn_ids, mask, n_turns: int, reduce=np.mean) -> np.ndarray:
  """[B, n_turns]: `reduce` of x [B, T] over each turn's action tokens (mask and turn_ids
  [B, T]); 0 for a turn a row does not reach."""
  x, turn_ids, mask = np.asarray(x, np.float64), np.asarray(turn_ids), np.asarray(mask, bool)
  out = np.zeros((len(x), n_turns))
  for k in range(n_turns):
    for b in range(len(x)):
      tokens = mask[b] & (turn_ids[b] == k)
      if tokens.any():
        out[b, k] = reduce(x[b, tokens])
  return out


def turn_score_hook(advantage_config, every: int) -> extras.Hook:
  """A rollout hook scoring the arm's own credit per turn when rl_step is a multiple of
  `every`: the arm's advantages (mean over each turn's action tokens) against the exact
  turn credit A_k = V(h_(k+1)) - V(h_k) of the policy that sampled the batch, on that
  batch. Logs turn_score/<s> for each s of TURN_SCORES (episodes x turns pooled; "dm" the
  share of |credit| on decisive turns) and turn_score/r_turn<k> (Pearson over episodes at
  turn k); a score without enough spread (e.g. r_within of a broadcast arm) is left out."""
  advantage = estimators.from_config(advantage_config)

  def measure(context: extras.Context, rollout) -> tuple[dict, dict]:
    if context.rl_step % every:
      return {}, {}
    config = context.task.config
    _, credit = key_turns.oracle.turn_credit(context.model, config, rollout.tokens,
                                             rollout.token_valid)
    layout = (rollout.turn_ids, rollout.mask, config.n_turns)
    mine = per_turn(advantage(rollout).advantages, *layout)
    exact = per_turn(credit, *layout, reduce=np.sum)
    weights = np.ones(mine.shape, bool)
    decisive = np.isin(np.arange(config.n_turns), config.decisive)[None].repeat(len(mine), 0)
    stats = scores.score(mine, exact, weights, decisive=decisive)
    stats.update({f"r_turn{k}": scores.correlations(mine[:, k:k + 1], exact[:, k:k + 1],
                                                    weights[:, :1])["r_pool"]
                  for k in range(config.n_turns)})
    return {}, {f"turn_score/{name}": stat.value for name, stat in stats.items()
                if stat.defined and (name in TURN_SCORES or name.startswith("r_turn"))}

  return measure


def read_turn_scores(run_dir: pathlib.Path) -> dict:
  """{score: [value at each measurement that defined it]} logged by `turn_score_hook`."""
  out = {}
  for line in (run_dir / "metrics.jsonl").read_text().splitlines():
    for key, value in json.loads(line).items():
      if key.startswith(SCORE):
        out.setdefault(key[len(SCORE):], []).append(value)
  return out


def run(study, workdir: str) -> dict:
  """Trains every (regime, estimator, seed) not yet finished; writes curves.json and
  report.md."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / "study_config.json").write_text(study.to_json_best_effort(indent=2))
  curves, wall = {}, 0.0
  for regime in sweep.regimes_to_run(study):
    for name in study.estimators:
      hook = extras.chain(exact_metrics.hook(study.measure_every, ks=()),
                          turn_score_hook(study.estimators[name].to_dict(), study.measure_every))
      for seed in study.seeds:
        run_dir = workdir / regime / "runs" / name / f"seed{seed}"
        config = train_config(study, regime, name, seed, str(workdir / "data"))
        wall += credit_study.train_once(config, run_dir, hook,
                                        f"[turn study] {regime}: {name} seed {seed}")
        curves.setdefault(regime, {}).setdefault(name, {})[seed] = {
            **exact_metrics.read_curve(run_dir), "turn_scores": read_turn_scores(run_dir)}
  (workdir / "curves.json").write_text(json.dumps(curves, indent=1))
  (workdir / "report.md").write_text(report(study, curves, wall))
  print(f"[turn study] wrote {workdir / 'report.md'}", flush=True)
  return curves


def _from(curve: dict, low: float) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, J) of a run's measurements after 0 tokens, starting at `low`: a run whose
  first such measurement comes later holds its initial J until then (its extra tokens
  per update, e.g. continuations, are not credited early)."""
  tokens, success = np.asarray(curve["gen_tokens"], float), np.asarray(curve["success"], float)
  positive = tokens > 0
  tokens, later = tokens[positive], success[positive]
  if tokens[0] > low:
    tokens, later = np.concatenate([[low], tokens]), np.concatenate([[success[0]], later])
  return tokens, later


def summaries(curves: dict) -> tuple[dict, float, float]:
  """({summary: {estimator: {seed: value}}}, budget, low): J at the largest token budget
  every run reached (interpolated in log10 tokens), the mean J over log10 tokens on
  [low, budget], low the earliest measurement after 0 tokens of any run, and J at the
  middle measurement of the runs (equal updates: what an arm's credit buys per update
  when its extra tokens, e.g. continuations, are free)."""
  runs = [curve for seeds in curves.values() for curve in seeds.values()]
  budget = min(curve["gen_tokens"][-1] for curve in runs)
  low = min(min(t for t in curve["gen_tokens"] if t > 0) for curve in runs)
  middle = runs[0]["updates"][len(runs[0]["updates"]) // 2]

  def at_budget(curve):
    tokens, success = _from(curve, low)
    return float(np.interp(np.log10(budget), np.log10(tokens), success))

  def mean_over_log_tokens(curve):
    return exact_metrics.auc_log_tokens(*_from(curve, low), low, budget)

  per = {"J at the budget": at_budget, "mean J over log tokens": mean_over_log_tokens,
         f"J after {middle} updates": lambda c: c["success"][c["updates"].index(middle)]}
  return ({summary: {name: {int(seed): fn(curve) for seed, curve in seeds.items()}
                     for name, seeds in curves.items()} for summary, fn in per.items()},
          budget, low)


def _interval(values) -> str:
  return fmt_interval(*t_interval(list(values))) if len(values) else ""


def report(study, curves: dict, wall_seconds: float) -> str:
  """Per regime: the arms' J at equal generated tokens, their paired differences from GRPO,
  and their per-turn credit scores."""
  lines = [
      "# Does turn-level credit matter? (key_turns)", "",
      f"Exact J(pi) (the oracle's value of the episode's start) every {study.measure_every} "
      f"of {study.updates} updates ({study.train.rl.prompts_per_step} prompts x "
      f"{study.train.rl.group_size} episodes, learning rate {study.train.rl.learning_rate}); "
      f"seeds {list(study.seeds)}; intervals: Student-t 95% over seeds (n/a for one seed).", "",
      f"Written {time.strftime('%Y-%m-%d')} on {machine()}; the runs took "
      f"{wall_seconds / 60:.0f} min in all."]
  not_run = sweep.regimes_not_run(study, curves)
  if not_run:
    lines += ["", not_run]
  options = {regime: {**study.train.task.options, **study.regimes[regime]} for regime in curves}
  turns = {regime: options[regime]["n_turns"] for regime in curves}
  if len(set(turns.values())) > 1:
    lines += along_turns_lines(curves, turns)
  for regime, by_arm in curves.items():
    lines += ["", f"## {regime}: key_turns {options[regime]}", "", *_regime_lines(by_arm),
              *_turn_score_lines(by_arm, options[regime])]
  return "\n".join(lines) + "\n"


def along_turns_lines(curves: dict, turns: dict) -> list[str]:
  """Regimes that differ in the number of turns (`turns`: regime -> n): each arm's J at its
  regime's budget, and its mean J over log tokens minus GRPO's (paired by seed) with the
  slope of that difference on log2(n), fitted per seed."""
  regimes = sorted(curves, key=turns.get)
  tables = {regime: summaries(curves[regime])[0] for regime in regimes}
  arms = [arm for arm in curves[regimes[0]] if all(arm in curves[r] for r in regimes)]
  columns = " | ".join(f"{turns[r]} turns" for r in regimes)
  at_budget = ["| estimator | " + columns + " |", "|---|" + "---|" * len(regimes)]
  gains = ["| estimator | " + columns + " | slope per doubling of turns |",
           "|---|" + "---|" * (len(regimes) + 1)]
  log_turns = np.log2([turns[r] for r in regimes])
  means = {r: tables[r]["mean J over log tokens"] for r in regimes}
  for arm in arms:
    at_budget.append(f"| {arm} | " + " | ".join(
        _interval(list(tables[r]["J at the budget"][arm].values())) for r in regimes) + " |")
    if arm == "grpo" or "grpo" not in arms:
      continue
    seeds = sorted(set.intersection(*(set(means[r][arm]) & set(means[r]["grpo"])
                                      for r in regimes)))
    gain = np.asarray([[means[r][arm][s] - means[r]["grpo"][s] for r in regimes] for s in seeds])
    slopes = [np.polyfit(log_turns, row, 1)[0] for row in gain]
    gains.append(f"| {arm} | " + " | ".join(_interval(list(column)) for column in gain.T)
                 + f" | {_interval(slopes)} |")
  return ["", "## Along the number of turns", "",
          "Each regime at its own budget (the tokens every run of the regime reached: an "
          "episode of n one-token turns holds 3n tokens). J at the budget:", "", *at_budget, "",
          "Mean J over log tokens minus GRPO's, paired by seed, and its slope on log2(turns) "
          "(fitted per seed):", "", *gains]


def _regime_lines(curves: dict) -> list[str]:
  """One regime's arms at equal generated tokens, and their paired differences from GRPO."""
  table, budget, low = summaries(curves)
  names = list(curves)
  lines = [
      f"Arms are compared at equal generated tokens: the budget {budget:,.0f} is the largest "
      "every run reached (the per-turn baseline's continuations count), and the mean J is "
      f"taken over log10 tokens on [{low:,.0f}, {budget:,.0f}] (a run holds its initial J "
      "until its first measurement).", "",
      "Generated tokens per run at its last measurement: " + "; ".join(
          f"{name} {np.mean([c['gen_tokens'][-1] for c in curves[name].values()]):,.0f}"
          for name in names) + ".", "",
      "| estimator | " + " | ".join(f"{s} | {s}: minus grpo" for s in table) + " |",
      "|---|" + "---|---|" * len(table)]
  for name in names:
    cells = []
    for values in table.values():
      mine, grpo = values[name], values.get("grpo", {})
      paired = [mine[seed] - grpo[seed] for seed in mine if seed in grpo]
      cells += [_interval(list(mine.values())), "" if name == "grpo" else _interval(paired)]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return lines


def _turn_score_lines(curves: dict, options) -> list[str]:
  """The per-turn credit scores: per arm, each seed's mean over its measurements, with a
  Student-t interval over seeds (blank where no measurement defined the score)."""
  n_turns = key_turns.KeyTurnsConfig(**dict(options)).n_turns
  names = [*TURN_SCORES, *(f"r_turn{k}" for k in range(n_turns))]
  titles = [*TURN_SCORES.values(), *(f"r at turn {k}" for k in range(n_turns))]
  lines = ["", "### Each arm's credit against the exact turn credit, per turn", "",
           "On each arm's own batches, at every measurement: its advantage on each turn (mean "
           "over the turn's action tokens) against A_k = V(h_(k+1)) - V(h_k) of the policy that "
           "sampled the batch (`turn_score_hook`). Sign agreement: over turns with |A_k| > 0.01, "
           "a zero advantage (a group whose rewards are all equal) counting as a disagreement. "
           "Decisive mass: the share of |credit| on the decisive turns. A blank: the score is "
           "undefined for the arm (a broadcast arm has no spread within an episode).", "",
           "| estimator | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
  for arm, seeds in curves.items():
    cells = []
    for name in names:
      means = [np.mean(c["turn_scores"][name]) for c in seeds.values()
               if c.get("turn_scores", {}).get(name)]
      cells.append(_interval(means))
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return lines

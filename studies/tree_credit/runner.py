"""Tree credit scored against the exact oracle: what each tree estimator's credit gets right.

  python -m studies.tree_credit --config studies/tree_credit/configs.py:small --workdir DIR

Per task (key_token with filler hidden: E-DEC; target_sum: E-TREE), one policy (the
preset at its initialisation) samples `batches` batches of `prompts_per_batch` prompts
twice: as trees of 8 leaves per prompt (`sample_tree`: 2 chains forking twice into 2, at
the segment boundaries of the config), and as 8 independent responses per prompt. On the
trees' leaves every tree estimator and GRPO are scored against the exact credit
A(s_t, y_t) of the same tokens (`lab.scores`: pooled Pearson r, Spearman, sign agreement,
decisive mass on key_token), pooled over the batches; GRPO is also scored on the
independent responses. The tokens each sampling generated are counted (a tree's shared
segments once).

Then, at equal generated tokens, two batched cells train key_token from the same initial
policy per seed (`jaxcredit.lab.batched`, RMS-scaled advantages, one learning rate): the
flat arms (GRPO, the exact oracle) on independent responses, the tree arms on trees (a
tree generates fewer tokens per update, so it takes more updates within the budget). Each
arm's final J and AUC of J over log10 generated tokens, and its AUC minus flat GRPO's
paired by seed, with Student-t 95% intervals, its sign-flip p and Holm's adjustment over
the comparisons.

Outputs in DIR: <task>.json and training.json (written once, read back on a rerun),
report.md and <task>_tree.txt (the report's picture of one sampled tree).
"""

import json
import pathlib
import time

import jax
import numpy as np
from flax import nnx

from jaxcredit import estimators, tasks
from jaxcredit.atomic import write_atomically
from jaxcredit.lab import batched, cells, exact_metrics, providers, scores, statistics
from jaxcredit.models import Transformer, preset
from jaxcredit.rollout_sources import SingleTurn
from jaxcredit.sampling import TreeSpec, tree
from jaxcredit.tasks import key_token, loader
from jaxcredit.train import base_config
from studies.credit_study.report import fmt_interval, machine, t_interval

COLUMNS = (("r_pool", "r"), ("spearman", "Spearman"), ("sa", "sign agreement"),
           ("dm", "decisive mass"))


def _task(spec, workdir: pathlib.Path) -> tasks.TrainTask:
  config = base_config.get_config().task
  config.name, config.options = spec.task.name, spec.task.options.to_dict()
  config.train_size, config.test_size = 1024, 8
  return tasks.make(config, data_dir=str(workdir / "data"), seed=0)


def _decisive(task: tasks.TrainTask, shape) -> np.ndarray | None:
  """[B, P + N] the decisive response columns of key_token; None elsewhere."""
  positions = getattr(task.config, "decisive_positions", None)
  if positions is None:
    return None
  decisive = np.zeros(shape, bool)
  decisive[:, task.max_prompt_length + np.asarray(positions)] = True
  return decisive


def score_task(study, spec, workdir: pathlib.Path) -> dict:
  """{"scores": {sampling/estimator: {statistic: [value, defined, n]}}, "tokens_per_prompt":
  {sampling: tokens}, "success", "tree" (the first tree whose leaves' rewards differ,
  `sampling.tree.render`; None if none does), "seconds"} of one task."""
  started = time.perf_counter()
  task = _task(spec, workdir)
  model = Transformer(preset(study.model.preset, vocab_size=task.vocab_size),
                      rngs=nnx.Rngs(study.model.seed))
  shape = TreeSpec(**study.tree.to_dict(), segment_tokens=spec.segment_tokens)
  shape.check(task.max_response_length, task.actions)
  sources = {name: SingleTurn(task.score_rows, task.max_response_length,
                              group_size=shape.leaves, stop_tokens=task.stop_tokens,
                              pad_id=task.pad_id, actions=task.actions, tree=tree_shape)
             for name, tree_shape in (("tree", shape), ("independent", None))}
  data = loader.Loader(task.sources["train"], encode=task.encode,
                       batch_size=study.prompts_per_batch,
                       max_prompt_length=task.max_prompt_length, pad_id=task.pad_id)
  pooled = {f"{name}/{est}": [] for name in sources for est in study.estimators
            if name == "tree" or est == "grpo"}
  tokens, success, picture = {name: 0 for name in sources}, [], None
  for index in range(study.batches):
    batch = data.rl_batch(index, group_size=shape.leaves)
    for name, source in sources.items():
      rollout = source(model, batch, jax.random.key(index))
      exact, _ = providers.exact_credit(model, task, rollout, batch["examples"])
      rollout = rollout.replace(extras={**rollout.extras, **exact})
      if picture is None and name == "tree":  # the first tree whose leaves' rewards differ
        spread = np.ptp(np.asarray(rollout.rewards).reshape(-1, shape.leaves), axis=1) > 0
        if spread.any():
          picture = tree.render(rollout.tokens, rollout.extras["tree_path"],
                                rollout.extras["tree_segments"], group_size=shape.leaves,
                                group=int(np.argmax(spread)), rewards=rollout.rewards,
                                decode=lambda ids: " ".join(task.token_texts(ids)))
      tokens[name] += int(np.sum(rollout.mask) if name == "independent" else tree.generated_tokens(
          rollout.extras["tree_path"], rollout.extras["tree_segments"], rollout.mask))
      success.append(float(np.mean(rollout.rewards)))
      for est in study.estimators:
        if f"{name}/{est}" in pooled:
          credit = estimators.get(est)(rollout).advantages
          pooled[f"{name}/{est}"].append((credit, exact["oracle_advantages"], rollout.mask))
  results = {}
  for key, parts in pooled.items():
    credit, oracle, mask = (np.concatenate([np.asarray(p[i], np.float64) for p in parts])
                            for i in range(3))
    stats = scores.score(credit, oracle, mask.astype(bool),
                         decisive=_decisive(task, mask.shape))
    results[key] = {name: [s.value, s.defined, s.n] for name, s in stats.items()}
  prompts = study.batches * study.prompts_per_batch
  return {"scores": results, "tokens_per_prompt": {k: v / prompts for k, v in tokens.items()},
          "success": float(np.mean(success)), "tree": picture,
          "seconds": time.perf_counter() - started}


def training_cells(study) -> dict[str, cells.Cell]:
  """{"flat", "tree"}: the two cells of the equal-token comparison."""
  spec = study.training
  task = key_token.KeyTokenConfig(**spec.task.to_dict())
  model = preset("tiny", vocab_size=key_token.VOCAB_SIZE, **spec.model.to_dict())
  shape = TreeSpec(**study.tree.to_dict(), segment_tokens=spec.segment_tokens)
  made = {}
  for name, arms, tree_shape in (("flat", spec.flat_arms, None), ("tree", spec.tree_arms, shape)):
    cell = cells.Cell(task=task, model=model, arms=tuple({"scale": "rms", "of": a} for a in arms),
                      group_size=shape.leaves, prompts_per_step=spec.prompts_per_step,
                      updates=1, eval_every=1, tree=tree_shape)
    updates = max(1, round(spec.token_budget / cell.tokens_per_update / spec.eval_points))
    made[name] = cells.Cell(**{**cell.__dict__, "updates": updates * spec.eval_points,
                               "eval_every": updates})
  return made


def train(study) -> dict:
  """{cell: {arm: {"success": [seeds][evals], "gen_tokens": ..., "updates": ...}},
  "seconds"}: every arm of both cells on every seed."""
  started, out = time.perf_counter(), {}
  spec = study.training
  for name, cell in training_cells(study).items():
    arms = spec.flat_arms if name == "flat" else spec.tree_arms
    runs = [(a, spec.learning_rate, seed) for a in range(len(arms)) for seed in spec.seeds]
    print(f"[tree credit] training: {name} cell, {len(runs)} runs of {cell.updates} updates",
          flush=True)
    result = batched.Runner(cell).train(runs)
    seeds = len(spec.seeds)
    out[name] = {arm: {"success": result["success"][i * seeds:(i + 1) * seeds].tolist(),
                       "gen_tokens": result["gen_tokens"][i * seeds:(i + 1) * seeds].tolist(),
                       "updates": cell.updates}
                 for i, arm in enumerate(arms)}
  return {**out, "seconds": time.perf_counter() - started}


def training_summary(study, trained: dict) -> list[list[str]]:
  """Rows (sampling, arm, updates, final J, AUC, AUC - flat GRPO's, its sign-flip p and Holm's
  adjustment over every comparison with flat GRPO) of the report: final J is the mean of
  the last 3 measurements; the AUC window runs from the first measurement after 0 of the
  flat cell to the budget."""
  low = trained["flat"]["grpo"]["gen_tokens"][0][1]
  high = study.training.token_budget
  auc = lambda arm: np.array([exact_metrics.auc_log_tokens(t, s, low, high)
                              for t, s in zip(arm["gen_tokens"], arm["success"])])
  baseline = auc(trained["flat"]["grpo"])
  arms = [(sampling, name, arm) for sampling in ("flat", "tree")
          for name, arm in trained[sampling].items()]
  compared = [i for i, (sampling, name, _) in enumerate(arms) if (sampling, name) != (
      "flat", "grpo")]
  p_values = [statistics.sign_flip_p(auc(arms[i][2]) - baseline) for i in compared]
  adjusted = dict(zip(compared, statistics.holm(p_values)))
  raw = dict(zip(compared, p_values))
  rows = []
  for i, (sampling, name, arm) in enumerate(arms):
    final = np.asarray(arm["success"])[:, -3:].mean(axis=1)
    tests = [f"{raw[i]:.3f}", f"{adjusted[i]:.3f}"] if i in raw else ["", ""]
    rows.append([sampling, name, str(arm["updates"]), fmt_interval(*t_interval(final)),
                 fmt_interval(*t_interval(auc(arm))),
                 fmt_interval(*t_interval(auc(arm) - baseline)), *tests])
  return rows


def run(study, workdir: str) -> dict:
  """Scores every task (reading finished ones back) and writes report.md; returns
  {task: result}."""
  out = pathlib.Path(workdir)
  out.mkdir(parents=True, exist_ok=True)
  results = {}
  for name, spec in study.tasks.items():
    path = out / f"{name}.json"
    if not path.exists():
      print(f"[tree credit] {name}: {study.batches} batches of {study.prompts_per_batch} "
            "prompts", flush=True)
      result = score_task(study, spec, out)
      write_atomically(path, lambda tmp, r=result: tmp.write_text(json.dumps(r)))
    results[name] = json.loads(path.read_text())
  path = out / "training.json"
  if not path.exists():
    trained = train(study)
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(trained)))
  results["training"] = json.loads(path.read_text())
  (out / "report.md").write_text(report(study, results))
  for task in study.tasks:  # each task's pictured tree alone, for the docs
    (out / f"{task}_tree.txt").write_text(f"{results[task]['tree']}\n")
  print(f"[tree credit] wrote {out / 'report.md'}", flush=True)
  return results


def _cell(stat) -> str:
  value, defined, _ = stat
  return f"{value:.2f}" if defined else "n/a"


def report(study, results: dict) -> str:
  """The report: per task, each estimator's scores against the exact credit."""
  shape = study.tree
  lines = [
      "# Tree credit against the exact oracle", "",
      f"Trees of {shape.roots} chains forking {shape.depth} times into {shape.branching} "
      f"({shape.roots * shape.branching**shape.depth} leaves per prompt); "
      f"{study.batches} batches of {study.prompts_per_batch} prompts per task; the "
      f"{study.model.preset} preset at its initialisation (seed {study.model.seed}). Scores "
      "pooled over every scored token (`jaxcredit.lab.scores`).", "",
      f"Machine: {machine()}.", ""]
  for task, result in results.items():
    if task == "training":
      continue
    tokens = result["tokens_per_prompt"]
    lines += [f"## {task}", "",
              f"Mean reward {result['success']:.3f}; tokens generated per prompt: "
              f"{tokens['tree']:.1f} as a tree, {tokens['independent']:.1f} as independent "
              f"responses; {result['seconds']:.0f} s. The first tree whose leaves' rewards "
              "differ (each node's segment under its parent's, each leaf's reward after it):",
              "", "```", str(result["tree"]), "```", "",
              "| sampling | estimator | " + " | ".join(c for _, c in COLUMNS) + " |",
              "|---|---|" + "---|" * len(COLUMNS)]
    for key, stats in result["scores"].items():
      sampling, est = key.split("/")
      cells = [_cell(stats[name]) if name in stats else "n/a" for name, _ in COLUMNS]
      lines.append(f"| {sampling} | {est} | " + " | ".join(cells) + " |")
    lines.append("")
  spec, trained = study.training, results["training"]
  lines += [
      "## Training at equal generated tokens", "",
      f"key_token {spec.task.to_dict()}, {spec.prompts_per_step} prompts per update of 8 "
      f"responses (flat) or 8 leaves (tree: forks every {spec.segment_tokens} columns), "
      f"{spec.token_budget:,} generated tokens, learning rate {spec.learning_rate} for every "
      f"arm, RMS-scaled advantages, seeds {list(spec.seeds)}; {trained['seconds']:.0f} s. "
      "Final J: the mean of the last 3 of the evaluations; AUC: the mean exact J over log10 "
      "generated tokens; then the AUC minus flat GRPO's, paired by seed (Student-t 95% "
      "intervals), its two-sided sign-flip p and Holm's adjustment over the "
      f"{len(spec.flat_arms) + len(spec.tree_arms) - 1} comparisons (with "
      f"{len(spec.seeds)} seeds the smallest p a sign-flip test can give is "
      f"{2 / 2 ** len(spec.seeds):.4g}).", "",
      "| sampling | arm | updates | final J | AUC | AUC - flat GRPO | p | Holm p |",
      "|---|---|---|---|---|---|---|---|"]
  lines += ["| " + " | ".join(row) + " |" for row in training_summary(study, trained)]
  return "\n".join(lines) + "\n"

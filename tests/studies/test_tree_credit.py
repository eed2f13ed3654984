"""The tree-credit study: a smoke run scores every tree estimator against the exact oracle,
counts what each sampling generated, writes the report and reads finished tasks back."""

import json

import pytest

from studies.tree_credit import configs
from studies.tree_credit import runner as tree_credit


def test_smoke_run_scores_every_estimator_and_resumes(tmp_path, monkeypatch):
  study = configs.get_config("smoke")
  results = tree_credit.run(study, str(tmp_path))
  assert set(results) == {"key_token", "target_sum", "training"}
  trained = results["training"]
  flat, tree = tree_credit.training_cells(study).values()
  assert tree.updates > flat.updates  # the same token budget buys a tree more updates
  for cell, name in ((flat, "flat"), (tree, "tree")):
    for arm in trained[name].values():
      tokens = arm["gen_tokens"]
      assert len(tokens) == len(study.training.seeds)
      assert tokens[0][-1] == cell.updates * cell.tokens_per_update
      assert abs(tokens[0][-1] - study.training.token_budget) <= cell.tokens_per_update * 2
  # Paired: every arm's run of a seed starts from the same policy, tree or flat.
  starts = {arm["success"][1][0] for by_arm in (trained["flat"], trained["tree"])
            for arm in by_arm.values()}
  assert len(starts) == 1
  for task, result in ((t, r) for t, r in results.items() if t != "training"):
    assert set(result["scores"]) == {*(f"tree/{e}" for e in study.estimators),
                                     "independent/grpo"}
    for stats in result["scores"].values():
      assert -1 <= stats["r_pool"][0] <= 1 and 0 <= stats["sa"][0] <= 1
    tokens = result["tokens_per_prompt"]
    assert tokens["tree"] < tokens["independent"]  # the shared segments once
  # key_token's trees: 2 x 4 + 4 x 4 + 8 x 4 tokens per prompt, against 8 x 12.
  assert results["key_token"]["tokens_per_prompt"] == {"tree": 56.0, "independent": 96.0}
  assert "dm" in results["key_token"]["scores"]["tree/treerl"]
  picture = results["key_token"]["tree"].splitlines()  # 2 chains of 1 + 2 + 4 nodes
  assert len(picture) == 14 and sum("-> " in line for line in picture) == 8
  text = (tmp_path / "report.md").read_text()
  assert text.count("| tree | ") == 2 * len(study.estimators) + len(study.training.tree_arms)
  assert "## target_sum" in text and "| flat | grpo | " in text
  # A rerun reads the finished tasks back.
  monkeypatch.setattr(tree_credit, "score_task", lambda *a: pytest.fail("rescored"))
  monkeypatch.setattr(tree_credit, "train", lambda *a: pytest.fail("retrained"))
  assert tree_credit.run(study, str(tmp_path)) == results
  assert json.loads((tmp_path / "key_token.json").read_text()) == results["key_token"]


def test_the_report_marks_undefined_scores():
  study = configs.get_config("smoke")
  stat = lambda value, defined=True: [value, defined, 10]
  result = {"scores": {"tree/grpo": {"r_pool": stat(0.5), "spearman": stat(0.0, False),
                                     "sa": stat(0.75)}},
            "tokens_per_prompt": {"tree": 56.0, "independent": 96.0}, "success": 0.25,
            "tree": "a\n└── b  -> 1", "seconds": 1.0}
  trained = {"seconds": 1.0, **{cell: {arm: {"success": [[0.1, 0.2, 0.3, 0.4]] * 2,
                                             "gen_tokens": [[0, 10, 20, 30]] * 2, "updates": 3}
                                       for arm in arms}
                                for cell, arms in (("flat", ("grpo",)), ("tree", ("treerl",)))}}
  text = tree_credit.report(study, {"key_token": result, "training": trained})
  assert "| tree | treerl | 3 | 0.300 (n/a) |" not in text  # two seeds: an interval
  assert "| tree | treerl | 3 | 0.300 [0.300, 0.300] |" in text
  assert "| tree | grpo | 0.50 | n/a | 0.75 | n/a |" in text and "```\na\n└── b  -> 1\n```" in text
  assert "56.0 as a tree, 96.0 as independent responses" in text

"""The per-token export (jaxcredit.train.export): a short key_token run with the oracle and
RLOO beside GRPO, read back with pandas and checked against float64 NumPy formulas."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from jaxcredit.tasks import key_token
from jaxcredit.train import export, learner, loop
from tests.conftest import load_experiment

pd = pytest.importorskip("pandas")

GROUP_SIZE, LENGTH = 4, 10


def _config(**export_settings):
  config = load_experiment("key_token_grpo")
  config.task.options = {"length": LENGTH, "n_keys": 4, "filler_blind": True}
  config.task.train_size, config.task.test_size = 64, 8
  config.rl.update(steps=2, prompts_per_step=4, group_size=GROUP_SIZE, eval_every=2)
  config.checkpoint.every = 2
  config.export.update(every=1, groups=2, compare=("oracle", "rloo"))
  config.export.update(export_settings)
  return config


STEP_TRACES = []  # one entry per trace of the run's learner step (`exported`)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("export")
  with pytest.MonkeyPatch.context() as patched:  # counts the traces of the learner step
    make_step = learner.make_step

    def counted(graphdef, *, advantage, **settings):
      def traced(rollout):  # the step calls its advantage once per trace
        STEP_TRACES.append(1)
        return advantage(rollout)
      return make_step(graphdef, advantage=traced, **settings)

    patched.setattr(learner, "make_step", counted)
    loop.run(_config(), str(workdir))
  return workdir


def test_the_learner_step_is_traced_once_for_the_whole_run(exported):
  """Optimizer counters start on one device and come back from the step on the mesh:
  placed on it before the first step, the second step's inputs have the same shardings
  (else the step is traced and compiled again)."""
  assert len(STEP_TRACES) == 1


def test_one_file_per_exported_step_read_in_one_call(exported):
  files = sorted(p.name for p in (exported / export.DIRECTORY).iterdir())
  assert files == [export.file_name(1), export.file_name(2)]
  frame = pd.read_parquet(exported / export.DIRECTORY)
  assert sorted(frame.rl_step.unique()) == [1, 2]
  metadata = pq.read_schema(exported / export.DIRECTORY / files[0]).metadata
  assert metadata[b"jaxcredit.schema"] == str(export.SCHEMA_VERSION).encode()
  assert json.loads(metadata[b"compare"]) == ["oracle", "rloo"]
  assert json.loads(metadata[b"estimator"]) == {"name": "grpo"}
  # Whole groups: 2 groups x G samples, each the prompt (K + 2 = 4 tokens) and T actions.
  for _, step in frame.groupby("rl_step"):
    assert len(step) == 2 * GROUP_SIZE * (4 + LENGTH)
    actions = step[step.is_action]
    assert actions.groupby(["group", "sample"]).size().tolist() == [LENGTH] * 2 * GROUP_SIZE
    assert (actions.position >= 4).all() and (step[~step.is_action].position < 4).all()


def test_columns_hold_the_tokens_and_their_statistics(exported):
  frame = pd.read_parquet(exported / export.DIRECTORY)
  assert (frame.token == key_token.token_names(frame.token_id.to_numpy())).all()
  prompt, actions = frame[~frame.is_action], frame[frame.is_action]
  for column in ("behaviour_logprob", "logprob", "entropy", "ratio"):
    assert prompt[column].isna().all() and actions[column].notna().all(), column
    assert np.isfinite(actions[column]).all()
  assert (actions.behaviour_logprob <= 0).all() and (actions.entropy >= 0).all()
  np.testing.assert_allclose(actions.ratio, np.exp(actions.logprob - actions.behaviour_logprob),
                             rtol=1e-5)
  assert np.abs(actions.ratio - 1).max() > 1e-3  # the update moved the policy
  assert (prompt[[c for c in frame if c.startswith("advantage")]] == 0).all().all()


def test_advantages_match_float64_formulas_and_the_oracle_credits_decisive_tokens(exported):
  frame = pd.read_parquet(exported / export.DIRECTORY)
  actions = frame[frame.is_action]
  rewards = actions.groupby(["rl_step", "group", "sample"]).reward.first()
  grouped = rewards.to_numpy(np.float64).reshape(-1, GROUP_SIZE)
  mean, std = grouped.mean(1, keepdims=True), grouped.std(1, ddof=1, keepdims=True)
  grpo = np.where(std > 0, (grouped - mean) / (std + 1e-6), 0.0).reshape(-1)
  rloo = (grouped - (grouped.sum(1, keepdims=True) - grouped) / (GROUP_SIZE - 1)).reshape(-1)
  per_response = actions.groupby(["rl_step", "group", "sample"])
  for column, expected in (("advantage", grpo), ("advantage.rloo", rloo)):
    assert (per_response[column].nunique() == 1).all(), column  # broadcast on every token
    np.testing.assert_allclose(per_response[column].first(), expected, atol=1e-5)
  decisive = np.isin(actions.position - 4, key_token.KeyTokenConfig(length=LENGTH)
                     .decisive_positions)
  oracle = actions["advantage.oracle"].to_numpy()
  assert (oracle[~decisive] == 0).all() and np.abs(oracle[decisive]).max() > 0.01


def test_waits_are_logged_and_tensorboard_gets_the_text(exported):
  lines = [json.loads(line) for line in (exported / "metrics.jsonl").read_text().splitlines()]
  waits = [line["train/export_wait_ms"] for line in lines if "train/export_wait_ms" in line]
  assert len(waits) == 2 and all(w >= 0 for w in waits)
  events = b"".join(p.read_bytes() for p in (exported / "tensorboard").glob("events.*"))
  assert b"tokens/credit" in events and b"reward" in events


def test_text_summary_lists_each_response_with_its_credit():
  columns = {"group": np.array([0, 0, 0]), "sample": np.array([0, 0, 1]),
             "is_action": np.array([True, True, True]), "reward": np.float32([1, 1, 0]),
             "token": ["a", "<script>", "b"], "advantage": np.float32([0.5, 0.5, -0.5])}
  text = export.text_summary(columns)
  assert "group 0 sample 0**, reward 1.000" in text and "`'<script>'` (+0.500)" in text
  assert "sample 1**, reward 0.000: `'b'` (-0.500)" in text


def test_bad_export_settings_name_the_field(tmp_path):
  with pytest.raises(ValueError, match="export.groups must be a positive int, got 0"):
    loop.run(_config(groups=0), str(tmp_path / "a"))
  with pytest.raises(ValueError, match="Unknown estimator 'nope'"):
    loop.run(_config(compare=("nope",)), str(tmp_path / "b"))

"""Stale rollouts: the lag's exact semantics, the parameter snapshots, k = 0 equal to the
synchronous run, and a resumed stale run equal to an uninterrupted one."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.train import loop, refusals, staleness
from tests.conftest import load_experiment


def _module(value: float) -> nnx.Linear:
  layer = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
  layer.kernel[...] = jnp.full((2, 2), value)
  return layer


def test_snapshots_hold_the_parameters_of_j_updates_ago():
  policy = _module(0.0)
  stale = staleness.StaleParameters(policy, 3, "fixed", seed=0)
  for update in range(1, 6):  # the policy's kernel is `update` after that many updates
    captured = stale.capture(policy)
    policy.kernel[...] = jnp.full((2, 2), float(update))
    stale.push(captured)
    for lag in range(4):
      sampled = stale.sampler(policy, min(lag, update))
      assert float(sampled.kernel[0, 0]) == max(update - lag, 0), (update, lag)
  assert stale.sampler(policy, 0) is policy


def test_the_lag_is_the_mode_clamped_at_the_step_and_depends_only_on_seed_and_step():
  fixed = staleness.StaleParameters(_module(0.0), 3, "fixed", seed=0)
  assert [fixed.lag(t) for t in range(6)] == [0, 1, 2, 3, 3, 3]
  uniform = [staleness.StaleParameters(_module(0.0), 3, "uniform", seed=s) for s in (0, 0, 1)]
  lags = [[u.lag(t) for t in range(200)] for u in uniform]
  assert lags[0] == lags[1] and lags[0] != lags[2]
  assert all(0 <= lag <= min(3, t) for t, lag in enumerate(lags[0]))
  assert set(lags[0][3:]) == {0, 1, 2, 3}
  periodic = staleness.StaleParameters(_module(0.0), 3, "periodic", seed=0)
  assert [periodic.lag(t) for t in range(9)] == [0, 1, 2, 3, 1, 2, 3, 1, 2]
  none = staleness.StaleParameters(_module(0.0), 0, "uniform", seed=0)
  assert none.snapshots == {} and none.capture(_module(1.0)) is None
  assert {none.lag(t) for t in range(20)} == {0}


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("max_staleness", -1, "rl.max_staleness must be an int >= 0, got -1"),
    (
      "staleness_mode",
      "random",
      "rl.staleness_mode must be one of fixed, uniform, periodic, got 'random'",
    ),
  ],
)
def test_bad_staleness_settings_name_the_field(field, value, message):
  config = load_experiment("quickstart")
  config.rl[field] = value
  with pytest.raises(ValueError, match=message):
    refusals.validate_config(config)


def test_a_workdir_from_before_the_staleness_fields_resumes_as_synchronous():
  config = json.loads(load_experiment("quickstart").to_json())
  saved = json.loads(json.dumps(config))
  del saved["rl"]["max_staleness"], saved["rl"]["staleness_mode"]
  refusals.check_resumable(saved, config)
  config["rl"]["max_staleness"] = 1
  with pytest.raises(ValueError, match="rl.max_staleness: 0 -> 1"):
    refusals.check_resumable(saved, config)


def _config(steps: int, **rl):
  config = load_experiment("quickstart")
  config.task.name, config.task.options = (
    "key_token",
    {"length": 10, "n_keys": 4, "filler_blind": True},
  )
  config.task.train_size, config.task.test_size, config.sft.max_steps = 64, 16, 0
  config.rl.prompts_per_step, config.rl.group_size = 4, 4
  config.rl.steps, config.rl.eval_every, config.checkpoint.every = steps, 100, 1
  config.rl.learning_rate = 1e-3
  for key, value in rl.items():
    config.rl[key] = value
  return config


def _train_records(workdir) -> list[dict]:
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [
    {k: v for k, v in line.items() if k not in ("train/tokens_per_sec", "time")}
    for line in lines
    if "train/loss" in line
  ]


def test_zero_staleness_is_the_synchronous_run_bit_for_bit(tmp_path):
  """k = 0 (uniform mode even) against the base config's synchronous run (k = 0, fixed)."""
  synchronous = _config(2)
  assert (synchronous.rl.max_staleness, synchronous.rl.staleness_mode) == (0, "fixed")
  loop.run(synchronous, str(tmp_path / "sync"))
  loop.run(_config(2, max_staleness=0, staleness_mode="uniform"), str(tmp_path / "k0"))
  assert _train_records(tmp_path / "sync") == _train_records(tmp_path / "k0")


def test_stale_sampling_follows_the_lag_and_resumes_exactly(tmp_path):
  """k = 2: update t samples with the parameters after update t - min(2, t). The learner's
  recomputed log-probs agree with the sampler's only while the sampling parameters are
  the current ones (t = 0); a run stopped after 2 updates resumes with its snapshots."""
  stale = dict(max_staleness=2, recompute_old_logprobs=True)
  objective = {"policy": {"name": "decoupled_ppo", "cap": 5.0}}
  straight = _config(3, **stale)
  straight.objective = objective
  loop.run(straight, str(tmp_path / "straight"))
  records = _train_records(tmp_path / "straight")
  assert [r["train/staleness_mean"] for r in records] == [0.0, 1.0, 2.0]
  gaps = [r["train/mismatch/abs_logp_diff"] for r in records]
  assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e3 * max(gaps[0], 1e-7), gaps

  first = _config(2, **stale)
  first.objective = objective
  loop.run(first, str(tmp_path / "split"))
  loop.run(straight, str(tmp_path / "split"))  # resumes at update 2, sampling with update 0's
  resumed = _train_records(tmp_path / "split")
  assert len(resumed) == 3
  for key, value in records[2].items():
    np.testing.assert_allclose(resumed[2][key], value, rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize(
  "advantage,critic,task",
  [
    ({"sum": [{"weight": 0.7, "name": "grpo"}, {"weight": 0.3, "name": "prime"}]}, None, None),
    ({"name": "gae", "lam": 0.95}, "tiny", None),
    ({"name": "rae", "decay": 0.5}, None, None),
    # target_sum's responses stop at EOS: lengths differ, so lam moves.
    ({"name": "lambda_grpo_learned", "lam_learning_rate": 0.1}, None, "target_sum_grpo"),
  ],
)
def test_estimators_that_keep_state_resume_exactly(tmp_path, advantage, critic, task):
  """PRIME's implicit PRM, a critic, RAE's role baselines and lambda-GRPO's learnt exponent are
  checkpointed with the policy:
  2 updates, then a resume to 4, log what 4 straight updates log."""

  def config(steps):
    run = _config(steps)
    if task is not None:
      run.task.name, run.task.options = (load_experiment(task).task[k] for k in ("name", "options"))
    run.advantage, run.critic.preset = advantage, critic
    return run

  loop.run(config(4), str(tmp_path / "straight"))
  loop.run(config(2), str(tmp_path / "split"))
  loop.run(config(4), str(tmp_path / "split"))
  straight, resumed = _train_records(tmp_path / "straight"), _train_records(tmp_path / "split")
  assert len(resumed) == len(straight) == 4
  lam = [record.get("train/hook/lambda_grpo/lam") for record in straight]
  assert task is None or len(set(lam)) == 4, lam
  for step in (2, 3):
    for key, value in straight[step].items():
      np.testing.assert_allclose(
        resumed[step][key], value, rtol=1e-5, atol=1e-7, err_msg=f"update {step + 1}: {key}"
      )
